"""`cudasnap capture [-o OUT] -- COMMAND ARGS...`: like `nsys profile`, the program runs
unmodified with the shim preloaded; its stdout, stderr and exit code pass through."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from cudasnap.formats import SnapshotError, SnapshotReader

from .recorder import Recorder


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


def run_capture(command: list[str], out: Path | None, ring_mb: int = 256, level: int = 3, threads: int | None = None,
                quiet: bool = False, placement: str = "region", all_queries: bool = False,
                copy_threads: int | None = None, drain: str = "lazy", segments: int = 8) -> int:
    if not command:
        print("cudasnap: error: no command given: use `cudasnap capture [-o OUT] -- COMMAND ARGS...`", file=sys.stderr)
        return 2
    exe = shutil.which(command[0]) or (command[0] if os.path.exists(command[0]) else None)
    if exe is None:
        print(f"cudasnap: error: command not found: {command[0]}", file=sys.stderr)
        return 127
    try:
        lib = shim_path()
    except RuntimeError as e:
        print(f"cudasnap: error: {e}", file=sys.stderr)
        return 2
    if out is None:
        out = Path.cwd() / f"{Path(command[0]).name}.cusnap"
    out = out.resolve()
    problem = output_problem(out)
    if problem:          # found before the program runs: a run whose recording is lost helps nobody
        print(f"cudasnap: error: {problem}", file=sys.stderr)
        return 2
    session = _session_dir(ring_mb)
    env = dict(os.environ)
    env["LD_PRELOAD"] = lib + (":" + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
    env["CUDASNAP_SESSION"] = str(session)
    env["CUDASNAP_RING_MB"] = str(ring_mb)
    env["CUDASNAP_PLACEMENT"] = placement
    if all_queries:
        env["CUDASNAP_ALL_QUERIES"] = "1"
    if copy_threads is not None:
        env["CUDASNAP_COPY_THREADS"] = str(copy_threads)
    options = {"ring_mb": ring_mb, "level": level, "command": command, "placement": placement,
               "all_queries": all_queries, "drain": drain, "segments": segments}
    root = {"pid": -1}
    rec = Recorder(session, out, lambda: root["pid"], options, level=level, threads=threads, drain=drain,
                   segments=segments)
    rec.start()
    # Signals meant for the program go to it; we stay to finish the snapshot.
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT)}
    try:
        proc = subprocess.Popen(command, env=env, restore_signals=True,
                                preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL) for s in old])
    except OSError as e:
        for s, h in old.items():
            signal.signal(s, h)
        print(f"cudasnap: error: cannot run {command[0]}: {e}", file=sys.stderr)
        return 127
    root["pid"] = proc.pid
    code = proc.wait()
    for s, h in old.items():
        signal.signal(s, h)
    sig = -code if code < 0 else None
    rec.set_root_exit(code if code >= 0 else None, sig)
    procs = rec.finish()
    shutil.rmtree(session, ignore_errors=True)
    unsaved = {}
    for pc in procs:
        why = _not_saved(pc)
        if why:
            unsaved[pc.ring.pid] = why
    if not quiet:
        _summary(procs, out, unsaved)
    for pc in procs:
        if pc.ring.pid in unsaved:
            print(f"cudasnap: error: {pc.path}: the snapshot was not saved completely "
                  f"({unsaved[pc.ring.pid]})", file=sys.stderr)
    if unsaved and code == 0:
        return 2          # the program succeeded, its recording did not: never report success
    if sig:
        # die the way the program died, so callers see the same status
        sys.stdout.flush(); sys.stderr.flush()
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    return code if code >= 0 else 128 + (-code)


def output_problem(out: Path) -> str | None:
    """Why a snapshot cannot be written at `out` (None when it can), by opening it as the
    writer will, without truncating an existing file and removing one made for the test."""
    if out.is_dir():
        return f"{out}: is a directory; give a file path with -o"
    if not out.parent.is_dir():
        return f"{out.parent}: no such directory"
    flags = os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)   # a FIFO must not block
    existed = os.path.lexists(out)
    try:
        os.close(os.open(out, flags if existed else flags | os.O_CREAT | os.O_EXCL, 0o666))
    except OSError as e:
        return f"cannot write {out} ({e.strerror or e})"
    if not existed:
        os.unlink(out)
    return None


def _not_saved(pc) -> str | None:
    """Why this process's snapshot is not whole on disk: a write failed, or it has no index."""
    if pc.disk_error:
        return f"writing failed: {pc.disk_error}"
    try:
        with SnapshotReader(pc.path) as r:
            if r.truncated:
                return "it was not closed: run `cudasnap repair` on it"
    except SnapshotError as e:
        return str(e)
    return None


def _summary(procs, out: Path, unsaved: dict) -> None:
    from rich.markup import escape

    from cudasnap.console import console

    con = console(stderr=True)
    if not procs:
        con.print(f"[bold]cudasnap:[/] the program made no CUDA driver calls; no snapshot written "
                  f"({escape(out.name)} not created)")
        return
    for pc in sorted(procs, key=lambda p: p.ring.pid):
        c = pc.decoder.counts
        size = pc.path.stat().st_size if pc.path.exists() and pc.path.is_file() else 0
        flags = []
        if pc.ring.pid in unsaved:
            flags.append("[red]NOT SAVED completely[/]")
        elif pc.partial:
            flags.append("[red]partial[/]")
        if pc.signal:
            flags.append(f"killed by signal {pc.signal}")
        if c.get("host_visible_allocs"):
            flags.append(f"[yellow]{c['host_visible_allocs']} host-visible allocations: direct kernel reads of them not captured[/]")
        if c.get("notes"):
            flags.append(f"{c['notes']} notes")
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
