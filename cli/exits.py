"""The exit-code rule of every command, kept in one place so that pipes and signals cannot bend it.

- A reader that goes away (`cudasnap compare a b | head -1`) never changes the verdict: stdout
  and stderr swallow EPIPE, everything after it goes to /dev/null, and the command finishes
  with the exit code it would have had (1 stays 1). Nothing is printed about the closed pipe,
  and no "Exception ignored ... BrokenPipeError" at interpreter exit.
- A write to stdout that fails otherwise (ENOSPC on >/dev/full, EIO, a stdout closed at start
  with >&-) is a verdict lost: one line on stderr, and the exit code keeps the verdict (1 stays
  1; a clean run whose report could not be written exits 2, never 0).
- Ctrl-C (SIGINT), SIGTERM and SIGHUP end every command the same way (formats/signals.py):
  128 + the signal, with one line on stderr saying what it left.
"""
from __future__ import annotations

import os
import signal
import sys
from typing import Optional

from cudasnap.formats.console import hold_closed_fd, pipe_safe_text, write_failure


def _wrap(stream, fd: int, write_through: bool):
    if stream is None:                  # closed at start (>&-): /dev/null holds the fd, writes fail
        return pipe_safe_text(fd, encoding="utf-8", errors="backslashreplace", write_through=write_through)
    try:
        if stream.fileno() != fd:
            return stream
        stream.flush()
    except (AttributeError, OSError, ValueError):
        return stream                   # not a file: left as it is
    errors = stream.errors
    if errors == "strict":              # a name the locale cannot encode (PYTHONIOENCODING=ascii) is escaped
        errors = "backslashreplace"
    return pipe_safe_text(fd, encoding=stream.encoding, errors=errors,
                          line_buffering=stream.line_buffering,
                          write_through=write_through or getattr(stream, "write_through", False))


def install() -> None:
    """Make stdout and stderr pipe-safe and their failures visible, hold fds closed at start,
    and apply the termination rule; called once by the `cudasnap` entry point."""
    from cudasnap.formats import signals
    hold_std_fds()
    sys.stdout = _wrap(sys.stdout, 1, False)
    sys.stderr = _wrap(sys.stderr, 2, True)
    signals.install()


def hold_std_fds() -> None:
    """stdin, stdout and stderr closed at start get /dev/null before any file (or the signal
    pipe) is opened, so that none takes their numbers."""
    hold_closed_fd(0, os.O_RDONLY)
    for fd in (1, 2):
        hold_closed_fd(fd, os.O_WRONLY)


def finish(code: int) -> int:
    """The exit code once everything is written: a failed write to stdout keeps a verdict of 1
    (or more) and turns 0 into 2, with one line saying so; what a signal left running is ended."""
    from cudasnap.formats import signals
    if signals.received() is not None and not reported():
        # the signal's exception was swallowed where it landed (a finalizer): the command ran on
        # to its end, but it was told to stop: still reported as interrupted
        code = report_interrupt(None)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    if signals.received() is not None:
        signals.end_children()
    signals.finished()
    why = write_failure(1)
    if why is not None:
        try:
            sys.stderr.write(f"cudasnap: error: the output to stdout could not be written ({why})"
                             f"{'; exit 2' if code == 0 else f'; the exit code {code} stands'}\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        if code == 0:
            code = 2
    return code


def interrupted_line(e: Optional[BaseException]) -> str:
    """The one line Ctrl-C prints: what the command left (said by the command itself when it
    raised Interrupted, else the outputs it completed, each written whole)."""
    from cudasnap.formats.outputs import Interrupted, written
    if isinstance(e, Interrupted) and e.left:
        left = e.left
    else:
        done = written()
        if not done:
            left = "no output was written"
        elif len(done) <= 3:
            left = f"wrote {', '.join(done)} (whole); nothing else was written"
        else:
            left = f"wrote {len(done)} whole files under {os.path.commonpath(done)}; nothing else was written"
    from cudasnap.formats import signals
    sig = signals.received()
    by = f" by {signal.Signals(sig).name}" if sig not in (None, signal.SIGINT) else ""
    return f"cudasnap: interrupted{by}: {left}"


def reported() -> bool:
    """Whether the interrupt's line was printed already (here or by the command itself)."""
    from cudasnap.formats import signals
    return signals.acknowledged()


def report_interrupt(e: Optional[BaseException]) -> int:
    from cudasnap.formats import signals
    signals.acknowledge()
    signals.end_children()
    try:
        sys.stderr.write(interrupted_line(e) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    return signals.exit_code()


def leave(code: int) -> None:
    """Exit with code. After a termination signal the command's own cleanup has run: exit at
    once after the exit handlers (temporary directories' finalizers), without the interpreter's
    teardown, which a late signal or a thread still in a driver call could turn into another exit."""
    from cudasnap.formats import signals
    if signals.received() is None:
        sys.exit(code)
    import atexit
    try:
        atexit._run_exitfuncs()
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    os._exit(code)
