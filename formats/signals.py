"""One termination rule for SIGINT, SIGTERM and SIGHUP (installed by the command line).

Each raises KeyboardInterrupt in the main thread, so the cleanup Ctrl-C already runs (temporary
files, subprocess.run's children, temporary directories, a campaign run marked interrupted)
runs for all three; the exit code is 128 + the signal. What is still running at the end (a
Popen child, a simulator worker, processes Ray started) is ended by end_children.

A main thread inside a driver call (a long kernel, a hung driver) runs no Python until the
call returns: a watchdog thread, woken through the signal wakeup fd, gives it GRACE_S; past
that it removes the temporary files, ends the children and exits with the same code and a
line saying the driver call was abandoned.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Callable, List, Optional

GRACE_S = 1.0
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_received: List[int] = []
_handled = threading.Event()           # the main thread ran the handler: it is back in Python
_done = threading.Event()              # the command is ending on its own
_cleanups: List[Callable[[], None]] = []
_installed: List[bool] = []


def received() -> Optional[int]:
    """The first termination signal this process received, or None."""
    return _received[0] if _received else None


def exit_code() -> int:
    """128 + the signal received (130 for SIGINT, also when none was seen: a KeyboardInterrupt)."""
    return 128 + (received() or int(signal.SIGINT))


def on_signal(signum, frame):
    if not _received:
        _received.append(int(signum))
    _handled.set()
    if not _acknowledged:       # once the command reports it, a second signal does not break its cleanup
        raise KeyboardInterrupt


_acknowledged: List[bool] = []


def acknowledge() -> None:
    """The interrupt reached the command line, which reports it: further signals are noted only."""
    _acknowledged.append(True)


def acknowledged() -> bool:
    return bool(_acknowledged)


_patient: List[bool] = []


class patient:
    """A stretch whose main thread answers a signal itself (its waits return to Python, and
    its cleanup must run there: a campaign marks its run interrupted): no abandoning."""

    def __enter__(self):
        _patient.append(True)
        return self

    def __exit__(self, *exc):
        _patient.pop()
        return False


def on_abandon(fn: Callable[[], None]) -> None:
    """fn runs if the watchdog must exit while the main thread is held in a driver call."""
    _cleanups.append(fn)


def descendants(pid: Optional[int] = None) -> List[int]:
    """Every live descendant of pid (this process), children first, from /proc."""
    root = os.getpid() if pid is None else pid
    parent = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for n in names:
        if not n.isdigit():
            continue
        try:
            with open(f"/proc/{n}/stat", "rb") as f:
                st = f.read().decode("ascii", "replace")
            parent[int(n)] = int(st[st.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    out, todo = [], [root]
    while todo:
        p = todo.pop(0)
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def end_children(grace: float = 0.5) -> int:
    """SIGTERM every descendant still running, SIGKILL those alive after grace; reaps direct
    children. Returns how many there were."""
    kids = descendants()
    for k in kids:
        try:
            os.kill(k, signal.SIGTERM)
        except OSError:
            pass
    t0 = time.monotonic()
    while kids and time.monotonic() - t0 < grace:
        _reap()
        kids_alive = [k for k in kids if _alive(k)]
        if not kids_alive:
            break
        time.sleep(0.02)
    for k in kids:
        if _alive(k):
            try:
                os.kill(k, signal.SIGKILL)
            except OSError:
                pass
    _reap()
    return len(kids)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            st = f.read()
        return st[st.rindex(b")") + 2:st.rindex(b")") + 3] != b"Z"
    except (OSError, ValueError):
        return False


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        except OSError:
            return
        if pid == 0:
            return


def _watchdog(rfd: int) -> None:
    # every signal stays with the main thread (capture waits for the ones it forwards there)
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    while True:
        try:
            data = os.read(rfd, 64)
        except InterruptedError:
            continue
        except OSError:
            return
        if not data:
            return
        sigs = [b for b in data if b in {int(s) for s in SIGNALS}]
        if not sigs or _done.is_set():
            continue
        if not _received:
            _received.append(sigs[0])
        if _handled.wait(GRACE_S) or _done.is_set() or _patient:
            continue
        _abandon()


def _abandon() -> None:
    """The main thread is held in native code past the grace: clean up from here and exit."""
    from .outputs import remove_temporaries
    remove_temporaries()
    for fn in list(_cleanups):
        try:
            fn()
        except Exception:
            pass
    end_children()
    from .outputs import written
    sig = exit_code() - 128
    by = "" if sig == signal.SIGINT else f" by {signal.Signals(sig).name}"
    done = written()
    left = (f"wrote {', '.join(done[-3:])} (whole); nothing else was written" if done else "no output was written")
    try:
        os.write(2, (f"cudasnap: interrupted{by}: a driver call still running after {GRACE_S:g} s was "
                     f"abandoned, not waited for; {left}\n").encode())
    except OSError:
        pass
    os._exit(exit_code())


def install() -> None:
    """SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt (one left ignored, as under nohup,
    stays ignored) and wake the watchdog."""
    if threading.current_thread() is not threading.main_thread() or _installed:
        return
    _installed.append(True)
    for s in SIGNALS:
        if signal.getsignal(s) is not signal.SIG_IGN:
            signal.signal(s, on_signal)
    try:
        r, w = os.pipe()
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (OSError, ValueError):
        return
    threading.Thread(target=_watchdog, args=(r,), name="cudasnap-signals", daemon=True).start()


def finished() -> None:
    """The command is ending on its own: the watchdog stands down."""
    _done.set()

