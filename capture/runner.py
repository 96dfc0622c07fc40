"""`cudasnap capture [-o OUT] -- COMMAND ARGS...`: like `nsys profile`, the program runs
unmodified with the shim preloaded; its stdout, stderr and exit code pass through.

The program is started through a gate: a /bin/sh (or, without one, a Python interpreter)
spawned with posix_spawn that waits on a pipe, then execs the program under the same pid. So
the pid is known before the program runs (for `%p` in -o and for the recorder) and no Python
code runs between fork and exec. Signals sent to cudasnap (INT, TERM, HUP, QUIT, USR1, USR2)
are forwarded to the program, as nsys does: they are blocked in every thread of cudasnap and
taken by one forwarding thread (sigtimedwait); one the program got itself (a terminal's ^C,
sent by the kernel to the whole foreground process group) is not sent twice."""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Union

from cudasnap.formats import SnapshotError, SnapshotReader

from .jitptx import with_xla_dump, xla_flags_dump_dir
from .recorder import Recorder

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
_SI_KERNEL = 0x80           # si_code of a signal the kernel sent (a terminal's ^C or ^\, a hangup)
_GATE_ABORTED = 125


@dataclass
class CaptureResult:
    """What one capture did. `returncode` is the program's status as subprocess reports it
    (its exit code, or -N when signal N killed it; None when it never ran); `exit_code` is
    what `cudasnap capture` exits with (the program's status, 128+N for signal N, 2 when the
    snapshot could not be written or, the program having succeeded, was not saved
    completely, 127 when the program could not be run)."""
    exit_code: int
    returncode: Optional[int] = None
    path: Optional[Path] = None                             # the first process's snapshot path
    snapshots: List[Path] = field(default_factory=list)     # the first process's first
    unsaved: Dict[Path, str] = field(default_factory=dict)  # snapshot -> why it is not whole
    error: Optional[str] = None                             # why the program was not run
    group: Optional[Path] = None                            # the group manifest (several processes)

    @property
    def signal(self) -> Optional[int]:
        return -self.returncode if self.returncode is not None and self.returncode < 0 else None

    @property
    def snapshot(self) -> Optional[Path]:
        """The snapshot of the process cudasnap started (None when it made no CUDA call or its
        snapshot was not saved)."""
        return self.path if self.path is not None and self.path in self.snapshots else None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


# ------------------------------------------------------------------ output names

_TOKEN = re.compile(r"%(?:q\{([^}]*)\}|(.?))", re.S)


def expand_output(template: str, pid: Optional[int] = None, env: Optional[Mapping[str, str]] = None,
                  host: Optional[str] = None) -> str:
    """-o's expansion, as nsys does it: %p the program's pid, %h the host name, %q{VAR} the
    value of environment variable VAR, %% a '%'. ValueError for an unknown %-sequence or an
    unset variable; with pid None a %p is left as it is."""
    env = os.environ if env is None else env

    def sub(m: "re.Match[str]") -> str:
        var, ch = m.group(1), m.group(2)
        if var is not None:
            if not var:
                raise ValueError("%q{} names no environment variable")
            if var not in env:
                raise ValueError(f"%q{{{var}}}: environment variable {var} is not set")
            return env[var]
        if ch == "%":
            return "%"
        if ch == "p":
            return "%p" if pid is None else str(pid)
        if ch == "h":
            return host if host is not None else socket.gethostname()
        if ch == "q":
            raise ValueError("%q needs a variable name: %q{VAR}")
        what = f"%{ch}" if ch else "a trailing %"
        raise ValueError(f"{what} is not known in an output name (%p, %h, %q{{VAR}}, %%)")

    return _TOKEN.sub(sub, template)


def uses_pid(template: str) -> bool:
    return any(m.group(2) == "p" for m in _TOKEN.finditer(template))


def shim_path() -> str:
    """Path of the preloadable library (the cffi extension module itself)."""
    from importlib.util import find_spec

    spec = find_spec("cudasnap.shim._shim")
    if spec is None or not spec.origin:
        raise RuntimeError("the cudasnap shim is not built: reinstall with `pip install .` (needs a C compiler)")
    return spec.origin


def _free_bytes(path: str) -> int:
    try:
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize
    except OSError:
        return 0


def _session_dir(ring_mb: int = 256) -> Path:
    """Where the rings live: /dev/shm (RAM) when it has room for a few of them, else the
    temporary directory. A ring that does not fit is not made (its process is not recorded)."""
    need = 2 * ring_mb << 20
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK) and _free_bytes(shm) >= need:
        return Path(tempfile.mkdtemp(prefix="cudasnap-", dir=shm))
    d = Path(tempfile.mkdtemp(prefix="cudasnap-"))
    if _free_bytes(str(d)) < need:
        print(f"cudasnap: warning: neither /dev/shm nor {d.parent} has room for two {ring_mb} MiB rings: "
              f"processes whose ring does not fit are not recorded (use a smaller --ring-mb)", file=sys.stderr)
    return d


# ------------------------------------------------------------------ display driver

def display_driver_version() -> Optional[str]:
    """The NVIDIA display driver's version ("580.159.04"): NVML's nvmlSystemGetDriverVersion
    through ctypes, else /proc/driver/nvidia/version; None without an NVIDIA driver."""
    v = _nvml_driver_version()
    return v if v else _proc_driver_version()


def _nvml_driver_version() -> Optional[str]:
    import ctypes

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    try:
        init = getattr(nvml, "nvmlInit_v2", None) or nvml.nvmlInit
        if init() != 0:
            return None
        try:
            buf = ctypes.create_string_buffer(96)
            if nvml.nvmlSystemGetDriverVersion(buf, ctypes.c_uint(len(buf))) != 0:
                return None
            return buf.value.decode("ascii", "replace").strip() or None
        finally:
            nvml.nvmlShutdown()
    except (AttributeError, OSError):
        return None


def _proc_driver_version(path: str = "/proc/driver/nvidia/version") -> Optional[str]:
    """'NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Thu ...' (or the open
    kernel module's 'NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build ...')."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            first = f.readline()
    except OSError:
        return None
    m = re.search(r"Kernel Module\b.*?\s(\d+\.\d+(?:\.\d+)*)(?:\s|$)", first)
    return m.group(1) if m else None


# ------------------------------------------------------------------ signals

class _Forwarder:
    """Forwards FORWARDED_SIGNALS sent to cudasnap to the program. Made before any thread of
    the capture starts: it blocks the signals in the calling thread, which every thread made
    after inherits, and one thread takes them with sigtimedwait. A signal whose disposition is
    SIG_IGN (nohup's SIGHUP, a background job's SIGINT) is left alone: the program inherits
    that it is ignored. After the program ended a signal is not forwarded: the first says the
    snapshot is being finished, a second ends cudasnap at once (the snapshot is then left for
    `cudasnap repair`)."""

    def __init__(self, enabled: bool):
        self.sigs = set()
        if enabled:
            for s in FORWARDED_SIGNALS:
                try:
                    if signal.getsignal(s) is not signal.SIG_IGN:
                        self.sigs.add(s)
                except (OSError, ValueError):
                    pass
        self.old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, self.sigs)
        self.pid: Optional[int] = None
        self.lock = threading.Lock()
        self.ended = False
        self.after_end = 0
        self.stop = threading.Event()
        self.thread: Optional[threading.Thread] = None

    def attach(self, pid: int) -> None:
        self.pid = pid
        if self.sigs:
            self.thread = threading.Thread(target=self._run, name="cudasnap-signals", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            info = signal.sigtimedwait(self.sigs, 0.05)
            if info is not None:
                self._handle(info)

    def _handle(self, info) -> None:
        sig, pid = info.si_signo, self.pid
        take = getattr(self, "intercept", {}).get(sig)
        if take is not None:            # a signal cudasnap acts on itself (windows, flight recorder)
            take()
            return
        with self.lock:
            if not self.ended and pid is not None:
                if info.si_pid == pid:
                    return                      # the program signalling its parent
                if info.si_code == _SI_KERNEL and self._same_group(pid):
                    return                      # a terminal's signal: the program got its own
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
                return
        if sig in (signal.SIGUSR1, signal.SIGUSR2):
            return
        self.after_end += 1
        name = signal.Signals(sig).name
        if self.after_end == 1:
            print(f"cudasnap: {name}: the program has ended; finishing the snapshot (send it again to stop now)",
                  file=sys.stderr, flush=True)
            return
        print(f"cudasnap: {name}: stopped before the snapshot was finished (`cudasnap repair` recovers it)",
              file=sys.stderr, flush=True)
        os._exit(128 + sig)

    @staticmethod
    def _same_group(pid: int) -> bool:
        try:
            return os.getpgid(pid) == os.getpgrp()
        except OSError:
            return False

    def program_ended(self) -> None:
        with self.lock:          # no kill() after this: the pid is about to be reaped
            self.ended = True

    def close(self) -> None:
        """Stop forwarding; drop signals still pending for the ended program; unblock."""
        self.stop.set()
        if self.thread is not None:
            self.thread.join()
        if self.sigs:
            while signal.sigtimedwait(self.sigs, 0) is not None:
                pass
        signal.pthread_sigmask(signal.SIG_SETMASK, self.old_mask)


# ------------------------------------------------------------------ starting the program

# Waits for one line on fd 3, then runs the program under the shim (same pid). EOF instead
# of the line: the program is not run.
_GATE_SH = ('IFS= read -r _ <&3 || exit %d; exec 3<&-; LD_PRELOAD=$_CUDASNAP_LD_PRELOAD; export LD_PRELOAD; '
            'unset _CUDASNAP_LD_PRELOAD; exec "$@"' % _GATE_ABORTED)
_GATE_PY = ("import os, signal, sys\n"
            "for s in ('SIGPIPE', 'SIGXFSZ'):\n"
            "    signal.signal(getattr(signal, s), signal.SIG_DFL)\n"
            "if os.read(3, 1) != b'\\n':\n"
            "    os._exit(%d)\n"
            "os.close(3)\n"
            "env = dict(os.environ)\n"
            "env['LD_PRELOAD'] = env.pop('_CUDASNAP_LD_PRELOAD')\n"
            "try:\n"
            "    os.execvpe(sys.argv[1], sys.argv[1:], env)\n"
            "except OSError as e:\n"
            "    sys.stderr.write(f'cudasnap: error: cannot run {sys.argv[1]}: {e.strerror or e}\\n')\n"
            "    os._exit(127 if e.errno == 2 else 126)\n" % _GATE_ABORTED)      # as a shell: 126 found, not run


def _not_a_program(path: str) -> bool:
    """An executable file the kernel will not run: no ELF header and no #! line (a shell would
    try it as a script; exec fails with ENOEXEC)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return bool(head) and not head.startswith((b"\x7fELF", b"#!"))


def _spawn_gated(command: Sequence[str], env: Dict[str, str], mask) -> "tuple[int, int]":
    """Start the gate for `command`; returns (pid, the pipe's write end)."""
    gate_env = dict(env)
    gate_env["_CUDASNAP_LD_PRELOAD"] = gate_env.pop("LD_PRELOAD")
    sh = "/bin/sh" if os.access("/bin/sh", os.X_OK) else shutil.which("sh")
    if sh:
        path, argv = sh, ["sh", "-c", _GATE_SH, "sh", *command]
    else:
        path, argv = sys.executable, [sys.executable, "-I", "-S", "-c", _GATE_PY, *command]
    r, w = os.pipe()
    try:
        actions = []
        if r != 3:
            actions = [(os.POSIX_SPAWN_DUP2, r, 3), (os.POSIX_SPAWN_CLOSE, r)]
        else:
            os.set_inheritable(r, True)
        # dispositions Python set to SIG_IGN go back to SIG_DFL, as subprocess's restore_signals
        # does; the program starts with the signal mask cudasnap had before forwarding
        pid = os.posix_spawn(path, argv, gate_env, file_actions=actions, setsigmask=mask,
                             setsigdef=[s for s in (signal.SIGPIPE, getattr(signal, "SIGXFSZ", None)) if s])
    except BaseException:
        os.close(w)
        raise
    finally:
        os.close(r)
    return pid, w


def _release(w: int, go: bool) -> None:
    try:
        if go:
            os.write(w, b"\n")
    except OSError:
        pass
    finally:
        os.close(w)


def _wait(pid: int, fwd: _Forwarder) -> int:
    """Wait for the program to end; returns its status as subprocess reports it."""
    while True:
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            break
        except InterruptedError:
            continue
        except ChildProcessError:
            break
    fwd.program_ended()
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status)
        except InterruptedError:
            continue


# ------------------------------------------------------------------ capture

def capture(command: Union[Sequence[str], str], out: Union[str, os.PathLike, None] = None, *, force: bool = False,
            ring_mb: int = 256, level: int = 3, threads: Optional[int] = None, quiet: bool = True,
            placement: str = "region", all_queries: bool = False, copy_threads: Optional[int] = None,
            drain: str = "lazy", segments: int = 8, forward_signals: bool = False,
            window: Optional[dict] = None, keep_ptx: Optional[Dict[str, Optional[str]]] = None) -> CaptureResult:
    """Run `command` under the shim and record one snapshot per process that uses CUDA.

    out: the first process's snapshot (default ./PROGRAM.cusnap), with -o's %-sequences
    (expand_output); others get OUT-STEM.PID.cusnap beside it. An existing file is refused
    unless force. forward_signals: forward INT, TERM, HUP, QUIT, USR1, USR2 sent to this
    process to the program (the command line does; it blocks them in the calling thread,
    so it belongs to a program's main thread). window: a capture window (window.parse_window_spec,
    plus "context") or the flight recorder ({"mode": "flight", "period", "trigger",
    "hang_timeout"}): snapshots are then written per window. keep_ptx: {"xla": DIR or None} asks
    XLA to dump its PTX (into DIR, else a directory removed after) and keeps each loaded cubin's
    (keep_ptx_env). Nothing is raised for the program's or the recording's failures: see CaptureResult."""
    if isinstance(command, (str, os.PathLike)):
        command = [os.fspath(command)]
    command = [os.fspath(c) for c in command]
    if not command:
        return CaptureResult(2, error="no command given: use `cudasnap capture [-o OUT] -- COMMAND ARGS...`")
    exe = shutil.which(command[0]) or (command[0] if os.path.exists(command[0]) else None)
    if exe is None:
        return CaptureResult(127, error=f"command not found: {command[0]}")
    # as a shell does: 126 for a program found but not runnable, naming why
    if os.path.isdir(exe):
        return CaptureResult(126, error=f"cannot run {command[0]}: it is a directory; give a program")
    if not os.access(exe, os.X_OK):
        return CaptureResult(126, error=f"cannot run {command[0]}: not executable (chmod +x it, or give its "
                                        f"interpreter first: cudasnap capture -- sh {command[0]})")
    if _not_a_program(exe):
        return CaptureResult(126, error=f"cannot run {command[0]}: not a program (neither an executable binary nor "
                                        f"a script starting with #!); give its interpreter first")
    try:
        lib = shim_path()
    except RuntimeError as e:
        return CaptureResult(2, error=str(e))
    # the shim's variables in the environment change what is recorded: said now, kept in the snapshot
    from .window import env_settings, env_window
    if window is None:
        try:
            window = env_window(os.environ)
        except ValueError as e:
            return CaptureResult(2, error=str(e))
        if window is not None:
            print(f"cudasnap: window from {window['from']} (as --window {window['spec']})", file=sys.stderr)
    settings = env_settings(os.environ)
    if settings:
        print("cudasnap: recording set by the environment: " + ", ".join(f"{k}={v}" for k, v in settings.items()),
              file=sys.stderr)
    if out is None:
        raw, per_pid = None, False
        probe = str(Path.cwd() / f"{Path(command[0]).name}.cusnap")
    else:
        raw = os.fspath(out)
        try:
            probe = expand_output(raw, pid=0)       # checks the template
        except ValueError as e:
            return CaptureResult(2, error=f"-o {raw}: {e}")
        per_pid = uses_pid(raw)
    # found before the program runs: a run whose recording is lost helps nobody. With %p the
    # name is known once the program's pid is (still before it runs); its directory now.
    problem = _dir_problem(Path(probe).resolve()) if per_pid else output_problem(Path(probe).resolve(), force)
    if problem:
        return CaptureResult(2, error=problem)

    session = _session_dir(ring_mb)
    env = dict(os.environ)
    env["LD_PRELOAD"] = lib + (":" + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
    env["CUDASNAP_SESSION"] = str(session)
    env["CUDASNAP_RING_MB"] = str(ring_mb)
    env["CUDASNAP_PLACEMENT"] = placement
    # NVTX v3 loads the library this names at its first call: the shim records the ranges. A
    # tool already named (nsys, ncu) keeps its place, and NVTX then goes to it alone.
    nvtx_tool = env.get("NVTX_INJECTION64_PATH")
    if not nvtx_tool:
        env["NVTX_INJECTION64_PATH"] = lib
    if all_queries:
        env["CUDASNAP_ALL_QUERIES"] = "1"
    if copy_threads is not None:
        env["CUDASNAP_COPY_THREADS"] = str(copy_threads)
    if window:
        from .window import window_env
        env.update(window_env(window, window.get("context", 0)))
    xla_tmp = None
    if keep_ptx:
        try:
            xla_tmp = keep_ptx_env(env, keep_ptx)
        except ValueError as e:
            shutil.rmtree(session, ignore_errors=True)
            return CaptureResult(2, error=str(e))
    options = {"ring_mb": ring_mb, "level": level, "command": list(command), "placement": placement,
               "all_queries": all_queries, "drain": drain, "segments": segments,
               "nvtx": "recorded" if not nvtx_tool else f"not recorded: NVTX_INJECTION64_PATH={nvtx_tool}"}
    if window:
        options["window"] = dict(window)
    if keep_ptx:
        options["keep_ptx"] = {"xla": xla_flags_dump_dir(env.get("XLA_FLAGS") or "")} if "xla" in keep_ptx else {}
    if settings:
        options["environment"] = settings
    fwd = _Forwarder(forward_signals)        # before any thread starts: they inherit the mask
    rec = gate = pid = None
    reaped = False
    try:
        dd = display_driver_version()
        if dd:
            options["display_driver"] = dd
        try:
            pid, gate = _spawn_gated(command, env, fwd.old_mask)
        except OSError as e:
            return CaptureResult(127, error=f"cannot run {command[0]}: {e.strerror or e}")
        fwd.attach(pid)
        path = Path(expand_output(raw, pid=pid)).resolve() if per_pid else Path(probe).resolve()
        problem = output_problem(path, force) if per_pid else None
        if problem:
            return CaptureResult(2, error=problem)
        rec = Recorder(session, path, lambda: pid, options, level=level, threads=threads, drain=drain,
                       segments=segments, force=force)
        if window and window["mode"] == "signal":
            fwd.intercept = {signal.SIGUSR1: rec.request_window}
        elif window and window["mode"] == "flight":
            fwd.intercept = {signal.SIGUSR2: lambda: rec.trigger("SIGUSR2 sent to cudasnap")}
        rec.start()
        _release(gate, go=True)
        gate = None
        code = _wait(pid, fwd)
        reaped = True
        rec.set_root_exit(code if code >= 0 else None, -code if code < 0 else None)
        procs = rec.finish()
        rec = None
    finally:
        if gate is not None:      # the program never started: the gate ends without running it
            _release(gate, go=False)
        if pid is not None and not reaped:
            _wait(pid, fwd)
        if rec is not None:       # an exception (KeyboardInterrupt in a caller's thread...)
            rec.stop.set()
        fwd.close()
        shutil.rmtree(session, ignore_errors=True)
        if xla_tmp:
            shutil.rmtree(xla_tmp, ignore_errors=True)
    unsaved = {}
    for pc in procs:
        for p in _outputs(pc):
            why = _not_saved(pc, p)
            if why:
                unsaved[p] = why
    if not quiet:
        _summary(procs, path, unsaved)
        if keep_ptx and "xla" in keep_ptx:
            _xla_note(procs, options["keep_ptx"]["xla"], xla_tmp)
    ordered = sorted(procs, key=lambda pc: (pc.ring.pid != pid, pc.ring.pid))
    snaps = [p for pc in ordered for p in _outputs(pc) if os.path.exists(p) and p not in unsaved]
    group = None
    from .group import job_sets, write_manifest
    # a job: one manifest for the processes' whole snapshots, or one per window index (and
    # one for the flight recorder's snapshots) across the processes
    for where, members, note in job_sets(path, ordered, snaps, window):
        if note and not quiet:
            print(f"cudasnap: note: {note}", file=sys.stderr)
        m = write_manifest(where, members, list(command), exact=where != path)
        if m is not None and not quiet:
            print(f"cudasnap: group manifest {m}: {len(members)} processes (replay it with "
                  f"`cudasnap replay {m}`)", file=sys.stderr)
        group = group or m
    exit_code = code if code >= 0 else 128 - code
    if unsaved and code == 0:
        exit_code = 2          # the program succeeded, its recording did not: never report success
    return CaptureResult(exit_code, returncode=code, path=path, snapshots=snaps, unsaved=unsaved, group=group)


def keep_ptx_env(env: Dict[str, str], keep_ptx: Dict[str, Optional[str]]) -> Optional[str]:
    """Adds XLA's dump flag to env's XLA_FLAGS (after the program's own); returns the temporary
    directory to remove after the run, if one was made. A dump the program's XLA_FLAGS already
    asks for is used as it is. ValueError when the two name different directories."""
    if "xla" not in keep_ptx:
        return None
    want, have = keep_ptx.get("xla"), xla_flags_dump_dir(env.get("XLA_FLAGS") or "")
    if have is not None:
        if want and os.path.abspath(want) != os.path.abspath(have):
            raise ValueError(f"--keep-ptx xla={want}: XLA_FLAGS already dumps to {have}; give that directory "
                             f"or drop the flag")
        if have in ("", "-") or have.lower() in ("sponge", "test_undeclared_outputs_dir"):
            raise ValueError(f"--keep-ptx xla: XLA_FLAGS dumps to {have!r}, not a directory cudasnap can read")
        return None
    made = None
    try:
        if want:
            os.makedirs(want, exist_ok=True)
        else:
            want = made = tempfile.mkdtemp(prefix="cudasnap-xla-")
    except OSError as e:
        raise ValueError(f"--keep-ptx xla{'=' + want if want else ''}: cannot make the dump directory: "
                         f"{e.strerror or e}") from None
    env["XLA_FLAGS"] = with_xla_dump(env.get("XLA_FLAGS") or "", os.path.abspath(want))
    return made


def _xla_note(procs, where: Optional[str], tmp: Optional[str]) -> None:
    """What XLA's dump gave, when it gave nothing to keep."""
    if any(pc.ptx_kept.get("xla dump") for pc in procs):
        return
    n = sum(1 for _ in Path(where).glob("*.ptx")) if where and not tmp and Path(where).is_dir() else None
    print(f"cudasnap: --keep-ptx xla: no loaded cubin matched a PTX file of XLA's dump"
          + (f" ({n} PTX files in {where})" if n is not None else "")
          + ": not an XLA program, its executables came from a compilation cache, or XLA split a module",
          file=sys.stderr)


def run_capture(command: List[str], out: Optional[Path], ring_mb: int = 256, level: int = 3,
                threads: Optional[int] = None, quiet: bool = False, placement: str = "region",
                all_queries: bool = False, copy_threads: Optional[int] = None, drain: str = "lazy",
                segments: int = 8, force: bool = False, window: Optional[dict] = None,
                keep_ptx: Optional[Dict[str, Optional[str]]] = None) -> int:
    """The `cudasnap capture` command: capture, print errors, return the exit code; a
    program killed by a signal makes cudasnap die of the same signal."""
    res = capture(command, out, force=force, ring_mb=ring_mb, level=level, threads=threads, quiet=quiet,
                  placement=placement, all_queries=all_queries, copy_threads=copy_threads, drain=drain,
                  segments=segments, forward_signals=threading.current_thread() is threading.main_thread(),
                  window=window, keep_ptx=keep_ptx)
    if res.error:
        print(f"cudasnap: error: {res.error}", file=sys.stderr)
        return res.exit_code
    for path, why in res.unsaved.items():
        print(f"cudasnap: error: {path}: the snapshot was not saved completely ({why})", file=sys.stderr)
    sig = res.signal
    if sig:
        # die the way the program died, so callers see the same status
        sys.stdout.flush(); sys.stderr.flush()
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    return res.exit_code

def output_problem(out: Path, force: bool = False) -> Optional[str]:
    """Why a snapshot cannot be written at `out` (None when it can): an existing regular file
    (unless force), a directory, a missing directory; else by opening it as the writer will,
    without truncating an existing file and removing one made for the test. Device files and
    FIFOs are written to as they are."""
    if out.is_dir():
        return f"{out}: is a directory; give a file path with -o"
    if not out.parent.is_dir():
        return f"{out.parent}: no such directory"
    if not force and out.is_file():
        return f"{out} exists: use -f (--force-overwrite) to replace it"
    flags = os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)   # a FIFO must not block
    existed = os.path.lexists(out)
    try:
        os.close(os.open(out, flags if existed else flags | os.O_CREAT | os.O_EXCL, 0o666))
    except OSError as e:
        return f"cannot write {out} ({e.strerror or e})"
    if not existed:
        os.unlink(out)
    return None

def _dir_problem(out: Path) -> Optional[str]:
    if not out.parent.is_dir():
        return f"{out.parent}: no such directory"
    if not os.access(out.parent, os.W_OK | os.X_OK):
        return f"cannot write in {out.parent} (Permission denied)"
    return None


def _outputs(pc) -> List[Path]:
    """The snapshots a process's capture wrote: its one file, or one per window."""
    outs = getattr(pc.writer, "outputs", None)
    return [Path(p) for p in outs] if outs is not None else [pc.path]


def _not_saved(pc, path: Optional[Path] = None) -> str | None:
    """Why this process's snapshot is not whole on disk: a write failed, or it has no index."""
    if pc.disk_error:
        return f"writing failed: {pc.disk_error}"
    try:
        with SnapshotReader(path or pc.path) as r:
            if r.truncated:
                return "it was not closed: run `cudasnap repair` on it"
    except SnapshotError as e:
        return str(e)
    return None


def _summary(procs, out: Path, unsaved: dict) -> None:
    from rich.markup import escape

    from cudasnap.formats.console import console

    con = console(stderr=True)
    if not procs:
        con.print(f"[bold]cudasnap:[/] the program made no CUDA driver calls; no snapshot written "
                  f"({escape(out.name)} not created)")
        return
    for pc in sorted(procs, key=lambda p: p.ring.pid):
        c = pc.decoder.counts
        if hasattr(pc.writer, "summary"):           # windows / flight recorder
            for line in pc.writer.summary():
                con.print(f"[bold]cudasnap:[/] pid {pc.ring.pid}: {escape(line)}")
            continue
        size = pc.path.stat().st_size if pc.path.exists() and pc.path.is_file() else 0
        flags = []
        if pc.path in unsaved:
            flags.append("[red]NOT SAVED completely[/]")
        elif pc.partial:
            flags.append("[red]partial[/]")
        if pc.signal:
            flags.append(f"killed by signal {pc.signal}")
        if c.get("host_visible_allocs"):
            flags.append(f"[yellow]{c['host_visible_allocs']} host-visible allocations: direct kernel reads of them not captured[/]")
        if c.get("notes"):
            flags.append(f"{c['notes']} notes")
        if getattr(pc, "tap", None) is not None:      # --keep-ptx
            flags.append(f"PTX kept for {pc.cubins_kept} of {pc.cubins} cubin modules"
                         + (" (" + ", ".join(f"{w}: {n}" for w, n in sorted(pc.ptx_kept.items())) + ")"
                            if pc.ptx_kept else ""))
        elif getattr(pc, "ptx_kept", None):
            flags.append("PTX kept for " + ", ".join(f"{n} module(s) from the {w}" for w, n in sorted(pc.ptx_kept.items())))
        con.print(
            f"[bold]cudasnap:[/] {escape(str(pc.path))}  pid {pc.ring.pid}: {c['calls']:,} calls, "
            f"{c['launches']:,} launches, {_mb(c['h2d_bytes'])} H2D, {_mb(c['d2h_bytes'])} D2H captured, "
            f"file {_mb(size)}" + (f"  ({', '.join(flags)})" if flags else "")
        )


def _mb(n: int) -> str:
    if n >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    if n >= 1 << 10:
        return f"{n / (1 << 10):.1f} KiB"
    return f"{n} B"
