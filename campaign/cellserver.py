"""A replay server per GPU and environment that stays up between a campaign's replays.

A fresh `python -m cudasnap replay` per replay paid, before its first kernel, for the
interpreter (0.2 s), cudasnap's and cupti-python's imports (0.55 s) and checking the snapshot
again (measured on an H200: bench/RESULTS.md). The server pays those once: it is started with
the environment's variables, driver and GPU (what cuInit reads), imports the replayer, checks
each snapshot once per file version (formats/opened.py version: a rewrite is checked again, even
one that kept the size and mtime), and forks one child per replay. The child does
everything that touches the driver (cuInit, contexts, modules, the replay, the profile), so
every replay still starts from a clean driver state and nothing of one replay can leak into the
next; the server itself never initializes CUDA, which is what makes the fork safe.

With `"kept": true` in a request ([rules] workers = "kept") the replay runs in the server's one
kept child instead, which replays request after request in its own process: the driver stays
initialized, and each replay gives back its memory, reserved ranges and contexts when it ends
(Replayer.close), so the next one places its memory at the recorded addresses again. A replay
that fails (exit 2), dies or runs past its timeout ends the kept child, as does the last of
CUDASNAP_KEPT_MAX_REPLAYS (200); the next request starts a new one.

A forked child takes its snapshot's pass (the plan, the index, the decoded module images) from
the server, which makes it once per file version and options before the first fork
(engine.plan_ahead: no driver work, so the fork stays safe). A kept child also keeps, between
its replays of one snapshot, what never touches the GPU
(replay/keep.py): the prescan (the plan of batches with its decoded records, the replay index,
the handles' slot numbering, the D2H results read ahead) and the decoded module images with what
the preflight read from them; its later replays of that snapshot decode and plan nothing. It
keeps no GPU state: each replay creates its contexts, loads its modules (their globals start
from the recorded image; eager or lazy loading, an environment's variable, applies to every
load) and allocates its memory again, all given back by Replayer.close, so every replay starts
from the recorded state. Loaded modules cannot outlive the contexts close() destroys or resets.
What is kept, by the server for its forks and by a kept child, is bounded (replay/keep.py), the
least recently used dropped first: CUDASNAP_KEEP_PLANS prescans (4), each of at most
plan.PLAN_MAX_RECORDS records; CUDASNAP_KEEP_MB MiB (1024) of decoded payloads and the prescans'
D2H results read ahead together; 4096 module images' findings. Everything is kept per file
version: the first replay of a rewritten snapshot drops what was kept for the version before,
and the server keeps one check and one planned pass per snapshot path and options.

Requests and replies are JSON lines on the server's stdin and stdout. A request is the typed
invocation (replay/invocation.py: the options a replay runs with), never an argv, plus a timeout:

    {"snapshot": PATH, "replay": {ReplayOptions fields}, "profile": {ProfileConfig fields},
     "timeout": SECONDS}
    -> {"exit_code": N, "stderr_tail": TEXT, "proc_s": SECONDS, "fork_s": SECONDS}
       (kept: also "closed", what the replay gave back, and "close_s", how long that took)

The server ends with its parent (PDEATHSIG), at end of input, or after IDLE_S seconds without
a request; each child ends with the server. `python -m cudasnap.campaign.cellserver`."""
from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from ..replay.keep import env_number

IDLE_S = env_number("CUDASNAP_CELLSERVER_IDLE_S", 600.0, float)
# a kept child leaves after this many replays (open snapshot readers and driver caches grow
# with the snapshots it saw); the next request starts a new one
KEPT_MAX_REPLAYS = env_number("CUDASNAP_KEPT_MAX_REPLAYS", 200)
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


# ---------------------------------------------------------------------------------- server side
class _Server:
    def __init__(self):
        self.kept: Optional[Tuple[int, int, int]] = None   # the kept child: pid, its request and reply pipes
        self.checked: Dict[Tuple, Optional[str]] = {}     # (path, file version) -> problem
        # (path, options) -> (file version, keep.py key): the passes made ahead of the forks
        self.planned: Dict[Tuple[str, str], Tuple[Tuple, Any]] = {}
        # what every replay needs, imported once; cupti-python only when a profile times with it
        import cudasnap.replay.engine  # noqa: F401
        import cudasnap.replay.profile  # noqa: F401
        from cudasnap.replay.profile.report import static_facts
        static_facts()                # what every profile says of the tools, read once for the forks
        try:                          # the bindings' module (25-60 ms a fork otherwise); no cuInit
            from cuda.bindings import driver  # noqa: F401
        except Exception:
            pass                      # the child reports a missing or broken one
        self.cupti_tried = False

    def _check(self, snap: str) -> Optional[str]:
        """The snapshot's problem (preflight), found once per file version in this server."""
        from cudasnap.formats.opened import version
        from cudasnap.replay.preflight import snapshot_problem
        try:
            st = os.stat(snap)
        except OSError as e:
            return f"{snap}: {e.strerror}"
        k = (snap, version(st))
        if k not in self.checked:
            for old in [o for o in self.checked if o[0] == snap]:     # an older version's answer
                del self.checked[old]
            self.checked[k] = snapshot_problem(snap)
        return self.checked[k]

    def _plan_ahead(self, req: Dict[str, Any]) -> None:
        """A forked replay's pass over its snapshot, made here once per file version and
        options (engine.plan_ahead: no driver work) and taken by every child forked after."""
        from cudasnap.formats.opened import version
        from cudasnap.replay import keep
        from cudasnap.replay.engine import plan_ahead
        from cudasnap.replay.invocation import request
        try:
            ver = version(os.stat(req["snapshot"]))
            k = (req["snapshot"], json.dumps(req.get("replay"), sort_keys=True))
            was = self.planned.get(k)
            # made for this version and still kept (keep.py drops the least recently used)
            if was is not None and was[0] == ver and (was[1] is None or keep.kept(was[1])):
                return
            self.planned[k] = (ver, None)              # tried once per version, even if it fails
            self.planned[k] = (ver, plan_ahead(req["snapshot"], request(req, checked=True).options))
        except Exception:
            pass                      # the forked replay makes its own pass and reports what failed

    def _want_cupti(self, mode: Optional[str]) -> None:
        from cudasnap.replay.profile.modes import names
        if self.cupti_tried or mode not in names(cupti=True):
            return
        self.cupti_tried = True
        try:
            from cupti import cupti  # noqa: F401   (loads libcupti; never touches the driver)
        except Exception:
            pass                      # the child reports it as the CLI does

    def handle(self, req: Dict[str, Any]) -> Dict[str, Any]:
        t0 = time.monotonic()
        snap = req["snapshot"]
        problem = self._check(snap)
        if problem:
            return {"exit_code": 2, "stderr_tail": f"cudasnap: error: {problem}", "proc_s": 0.0, "fork_s": 0.0}
        self._want_cupti((req.get("profile") or {}).get("mode"))
        if req.get("kept"):
            return self._kept_run(req, t0)
        self._plan_ahead(req)
        err = tempfile.TemporaryFile(mode="w+b")
        sys.stdout.flush()
        sys.stderr.flush()
        t_fork = time.monotonic()
        # a process of its own: each replay forked from the environment's warm server: its GPU state and crashes stay its own
        pid = os.fork()
        if pid == 0:                                        # the child: one replay, then _exit
            code = 2
            try:
                _child_start()
                os.dup2(err.fileno(), 2)
                code = _replay_logged(req)
            finally:
                os._exit(code)
        fork_s = time.monotonic() - t_fork
        rc = _wait(pid, float(req.get("timeout") or 1800))
        err.seek(0)
        text = err.read().decode(errors="replace")
        err.close()
        lines = [ln for ln in text.splitlines() if ln.strip()]
        tail = "\n".join(lines[-5:])
        if rc == 124:
            tail = f"the replay ran past {float(req.get('timeout') or 1800):g} s"
        return {"exit_code": rc, "stderr_tail": tail, "proc_s": time.monotonic() - t0, "fork_s": fork_s}

    # ---------------------------------------------------------------- the kept child
    def _kept_child(self) -> Tuple[int, int, int]:
        """The child that runs replay after replay in its own process ([rules] workers = "kept"),
        started on first use or after the last one ended."""
        if self.kept is not None:
            return self.kept
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        # a process of its own: the kept replay process forked from the environment's server: a crash ends it, not the server
        pid = os.fork()
        if pid == 0:
            code = 2
            try:
                os.close(req_w)
                os.close(rep_r)
                _child_start()
                code = _kept_loop(req_r, rep_w)
            finally:
                os._exit(code)
        os.close(req_r)
        os.close(rep_w)
        self.kept = (pid, req_w, rep_r)
        return self.kept

    def _kept_end(self, kill: bool) -> Optional[int]:
        """End the kept child; its exit code."""
        if self.kept is None:
            return None
        pid, req_w, rep_r = self.kept
        self.kept = None
        for fd in (req_w, rep_r):
            try:
                os.close(fd)
            except OSError:
                pass
        if kill:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status)

    def _kept_run(self, req: Dict[str, Any], t0: float) -> Dict[str, Any]:
        """One replay in the kept child: its stderr to a file of this request; a reply line back.
        A replay that fails (exit 2, a signal) or runs past its timeout ends the child: the next
        request starts a new one from a clean driver."""
        fresh = self.kept is None
        t_fork = time.monotonic()
        pid, req_w, rep_r = self._kept_child()
        fork_s = time.monotonic() - t_fork if fresh else 0.0
        timeout = float(req.get("timeout") or 1800)
        closed = None
        with tempfile.NamedTemporaryFile(mode="w+b", prefix="cudasnap-kept-", suffix=".err") as err:
            try:
                os.write(req_w, (json.dumps({"req": req, "stderr": err.name}) + "\n").encode())
            except OSError:                      # the child died since the last reply
                rc = self._kept_end(kill=True)
                return {"exit_code": rc if rc else 2, "stderr_tail": "cudasnap: error: the kept replay worker ended",
                        "proc_s": time.monotonic() - t0, "fork_s": fork_s}
            r, _, _ = select.select([rep_r], [], [], timeout)
            line = b""
            if r:
                while not line.endswith(b"\n"):
                    chunk = os.read(rep_r, 4096)
                    if not chunk:
                        break
                    line += chunk
            if not r:
                self._kept_end(kill=True)
                rc, tail = 124, f"the replay ran past {timeout:g} s"
            else:
                rep = {}
                try:
                    rep = json.loads(line)
                    rc = int(rep["exit_code"])
                    closed = rep.get("closed")
                except (ValueError, KeyError, TypeError):
                    code = self._kept_end(kill=True)    # died mid-replay: its exit code (a signal: negative)
                    rc, closed = (code if code else 2), None
                if (rc == 2 or (closed or {}).get("failed") or rep.get("leaving")) and self.kept is not None:
                    self._kept_end(kill=False)       # the child leaves after a failed replay, or its last
                err.seek(0)
                lines = [ln for ln in err.read().decode(errors="replace").splitlines() if ln.strip()]
                tail = "\n".join(lines[-5:])
        out = {"exit_code": rc, "stderr_tail": tail, "proc_s": time.monotonic() - t0, "fork_s": fork_s,
               "kept_pid": pid}
        if closed is not None:
            out["closed"] = closed
            out["close_s"] = rep.get("close_s")
        return out


def _kept_loop(req_r: int, rep_w: int) -> int:
    """The kept child: replay after replay, each given back (Replayer.close) before the next.
    Leaves after a replay that failed (exit 2): its driver state may be damaged."""
    from cudasnap.replay.engine import close_replays, track_replays
    track_replays()
    buf = b""
    done = 0
    while True:
        while b"\n" not in buf:
            chunk = os.read(req_r, 1 << 16)
            if not chunk:
                return 0                                  # the server ended
            buf += chunk
        line, buf = buf.split(b"\n", 1)
        msg = json.loads(line)
        fd = os.open(msg["stderr"], os.O_WRONLY | os.O_TRUNC)
        os.dup2(fd, 2)
        os.close(fd)
        code = _replay_logged(msg["req"])
        t_close = time.monotonic()
        closed = close_replays()
        close_s = round(time.monotonic() - t_close, 4)
        done += 1
        leaving = done >= KEPT_MAX_REPLAYS
        os.write(rep_w, (json.dumps({"exit_code": code, "closed": closed, "leaving": leaving, "close_s": close_s})
                         + "\n").encode())
        if code == 2 or closed.get("failed") or leaving:
            return code


def _child_start() -> None:
    """A forked child: dies with the server, takes Ctrl-C by default, reads and prints nothing
    on the server's pipes."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)


def _replay_logged(req: Dict[str, Any]) -> int:
    """One replay in a child; any exception is written to stderr (exit 2), never raised back
    into the server's code."""
    code = 2
    try:
        from cudasnap.replay.invocation import run
        code = run(req, checked=True)
    except BaseException as e:
        try:
            os.write(2, f"cudasnap: error: {type(e).__name__}: {e}\n".encode())
        except OSError:
            pass
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    return code


def _wait(pid: int, timeout: float) -> int:
    """The child's exit code (killed by a signal: minus its number, as subprocess says); 124
    after killing it at the timeout."""
    deadline = time.monotonic() + timeout
    delay = 0.0005
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return 124
        time.sleep(delay)
        delay = min(0.002, delay * 2)      # a replay of 0.1 s should not wait 10 ms more


def serve() -> int:
    _die_with_parent()
    os.setpgrp()                  # the client kills the server and its child as one group
    server = _Server()
    out = sys.stdout
    out.write(json.dumps({"ready": os.getpid()}) + "\n")
    out.flush()
    fd = sys.stdin.fileno()
    buf = b""
    while True:
        r, _, _ = select.select([fd], [], [], IDLE_S)
        if not r:
            return 0                                  # idle: the next request starts another
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return 0
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if not line.strip():
                continue
            try:
                rep = server.handle(json.loads(line))
            except Exception as e:
                rep = {"exit_code": 2, "stderr_tail": f"cudasnap: error: the replay server: {type(e).__name__}: {e}",
                       "proc_s": 0.0, "fork_s": 0.0}
            out.write(json.dumps(rep) + "\n")
            out.flush()


# ---------------------------------------------------------------------------------- client side
class ServerGone(Exception):
    """The server died or answered nonsense (one line)."""


class Client:
    """A server started for one environment on one GPU, owned by the process that started it."""

    def __init__(self, env: Dict[str, str]):
        # a process of its own: one server per environment and GPU: its variables and driver apply from a process's start
        self.p = subprocess.Popen([sys.executable, "-m", "cudasnap.campaign.cellserver"], env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  preexec_fn=_die_with_parent)
        self.lock = threading.Lock()
        hello = self._line(120.0)
        if "ready" not in hello:
            self.kill()
            raise ServerGone(f"the replay server did not start: {hello}")

    def _line(self, timeout: float) -> Dict[str, Any]:
        fd = self.p.stdout.fileno()
        r, _, _ = select.select([fd], [], [], timeout)
        if not r:
            raise ServerGone(f"the replay server did not answer in {timeout:g} s")
        line = self.p.stdout.readline()
        if not line:
            raise ServerGone(f"the replay server ended (exit {self.p.poll()})")
        try:
            return json.loads(line)
        except ValueError:
            raise ServerGone(f"the replay server answered {line[:80]!r}")

    def alive(self) -> bool:
        return self.p.poll() is None

    def run(self, req: Dict[str, Any]) -> Dict[str, Any]:
        with self.lock:
            try:
                self.p.stdin.write((json.dumps(req) + "\n").encode())
                self.p.stdin.flush()
            except OSError as e:
                raise ServerGone(f"the replay server is gone ({e.strerror})")
            # the server kills a child at the timeout; a margin for the kill and the reply
            return self._line(float(req.get("timeout") or 1800) + 60.0)

    def kill(self) -> None:
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.p.kill()
            self.p.wait(timeout=10)
        except Exception:
            pass


_clients: Dict[Tuple, Client] = {}


def client_for(key: Tuple, env: Dict[str, str]) -> Tuple[Client, bool]:
    """This process's server for key (GPU, driver, variables), started on first use or again
    after it ended; and whether it was started now."""
    c = _clients.get(key)
    if c is not None and c.alive():
        return c, False
    c = _clients[key] = Client(env)
    return c, True


def drop(key: Tuple) -> None:
    c = _clients.pop(key, None)
    if c is not None:
        c.kill()


def close_all() -> None:
    for k in list(_clients):
        drop(k)


if __name__ == "__main__":
    sys.exit(serve())
