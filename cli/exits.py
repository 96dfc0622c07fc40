"""The exit-code rule of every command, kept in one place so that pipes and signals cannot bend it.

- A reader that goes away (`cudasnap compare a b | head -1`) never changes the verdict: stdout
  and stderr swallow EPIPE, everything after it goes to /dev/null, and the command finishes
  with the exit code it would have had (1 stays 1). Nothing is printed about the closed pipe,
  and no "Exception ignored ... BrokenPipeError" at interpreter exit.
- Ctrl-C (SIGINT) is 130 in every command, with one line on stderr saying what it left.
"""
from __future__ import annotations

import io
import os
import sys
from typing import List, Optional

_closed: List[str] = []           # the streams whose reader went away


class _PipeSafe(io.RawIOBase):
    """fd 1 or 2 as a raw stream that, on EPIPE, points the fd at /dev/null for good (children
    and C code writing the fd included) and reports the bytes as written."""

    def __init__(self, fd: int, name: str):
        super().__init__()
        self._fd, self._name = fd, name

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, b) -> int:
        try:
            return os.write(self._fd, b)
        except BrokenPipeError:
            if self._name not in _closed:
                _closed.append(self._name)
            nul = os.open(os.devnull, os.O_WRONLY)
            os.dup2(nul, self._fd)
            os.close(nul)
            return len(b)

    def close(self) -> None:        # the fd is the process's, not this object's
        super().close()


def _wrap(stream, fd: int, name: str, write_through: bool):
    try:
        if stream is None or stream.fileno() != fd:
            return stream
        stream.flush()
    except (AttributeError, OSError, ValueError):
        return stream                   # closed at start (>&-), or not a file: left as it is
    raw = _PipeSafe(fd, name)
    buf = io.BufferedWriter(raw)
    return io.TextIOWrapper(buf, encoding=stream.encoding, errors=stream.errors, newline=None,
                            line_buffering=stream.line_buffering, write_through=write_through)


def install() -> None:
    """Make stdout and stderr pipe-safe; called once by the `cudasnap` entry point."""
    sys.stdout = _wrap(sys.stdout, 1, "stdout", False)
    sys.stderr = _wrap(sys.stderr, 2, "stderr", True)


def stdout_closed() -> bool:
    """Has stdout's reader gone away? (A command may then skip formatting what no one reads.)"""
    return "stdout" in _closed


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
    return f"cudasnap: interrupted: {left}"


def report_interrupt(e: Optional[BaseException]) -> int:
    try:
        sys.stderr.write(interrupted_line(e) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    return 130
