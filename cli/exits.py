"""The exit-code rule of every command, kept in one place so that pipes and signals cannot bend it.

- A reader that goes away (`cudasnap compare a b | head -1`) never changes the verdict: stdout
  and stderr swallow EPIPE, everything after it goes to /dev/null, and the command finishes
  with the exit code it would have had (1 stays 1). Nothing is printed about the closed pipe,
  and no "Exception ignored ... BrokenPipeError" at interpreter exit.
- Ctrl-C (SIGINT) is 130 in every command, with one line on stderr saying what it left.
"""
from __future__ import annotations

import os
import sys
from typing import Optional

from cudasnap.formats.console import pipe_safe_text


def _wrap(stream, fd: int, write_through: bool):
    try:
        if stream is None or stream.fileno() != fd:
            return stream
        stream.flush()
    except (AttributeError, OSError, ValueError):
        return stream                   # closed at start (>&-), or not a file: left as it is
    return pipe_safe_text(fd, encoding=stream.encoding, errors=stream.errors,
                          line_buffering=stream.line_buffering,
                          write_through=write_through or getattr(stream, "write_through", False))


def install() -> None:
    """Make stdout and stderr pipe-safe; called once by the `cudasnap` entry point."""
    sys.stdout = _wrap(sys.stdout, 1, False)
    sys.stderr = _wrap(sys.stderr, 2, True)


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
