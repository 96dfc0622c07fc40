"""The tool's version and its console: what every layer (capture, replay, export, compare, the
command line) may import; standard library here, rich on first use.

Output that reads well at a terminal and stays whole in logs and pipes: at a terminal, rich
styles and tables; anywhere else (a pipe, a file, a test runner) plain lines that never wrap
or truncate, so `cudasnap api | grep NAME` and log scrapers see every value on one line.
"""
from __future__ import annotations

import io
import os
import shlex
import sys
from typing import IO, Iterable, Optional, Sequence, Tuple, Union

__version__ = "0.1.0"

Column = Union[str, Tuple[str, str]]        # a header, or (header, "left" | "right")


def tool_version() -> str:
    """The installed package's version (what snapshots record as tool_version)."""
    try:
        from importlib.metadata import version
        return version("cudasnap")
    except Exception:
        return __version__


def invoked_command(argv: Optional[Sequence[str]] = None) -> Optional[str]:
    """The cudasnap command line this process runs, as typed ("cudasnap replay ..."), for
    reports that say how to run again; None when cudasnap was not started as a command (the
    Python API). The `cudasnap` script and `python -m cudasnap` count, from an installed package
    or an editable checkout (whose package directory is not named cudasnap)."""
    argv = list(sys.argv if argv is None else argv)
    if not argv:
        return None
    a0 = argv[0]
    pkg = sys.modules.get("cudasnap")
    pkg_main = (os.path.join(os.path.dirname(os.path.abspath(pkg.__file__)), "__main__.py")
                if pkg is not None and getattr(pkg, "__file__", None) else None)
    if not (os.path.basename(a0) == "cudasnap" or a0.endswith("cudasnap/__main__.py")
            or (pkg_main is not None and os.path.abspath(a0) == pkg_main)):
        return None
    return "cudasnap " + " ".join(shlex.quote(a) for a in argv[1:])


class _PipeSafe(io.RawIOBase):
    """A file descriptor as a raw stream that, on EPIPE (its reader went away), points the fd at
    /dev/null for good and reports the bytes as written: a closed pipe never ends a command
    early nor changes its exit code (the command line's rule, cli/exits.py)."""

    def __init__(self, fd: int, report_as: Optional[int] = None):
        super().__init__()
        self._fd = fd
        self._key = fd if report_as is None else report_as     # a dup of stdout fails as stdout

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, b) -> int:
        if self._key in _CLOSED_AT_START:
            _WRITE_FAILED.setdefault(self._key, "it was closed when cudasnap started")
            return len(b)
        try:
            return os.write(self._fd, b)
        except BrokenPipeError:
            pass
        except OSError as e:    # ENOSPC (>/dev/full), EIO, EBADF: a verdict the caller never saw
            _WRITE_FAILED.setdefault(self._key, e.strerror or str(e))
        nul = os.open(os.devnull, os.O_WRONLY)
        os.dup2(nul, self._fd)
        os.close(nul)
        return len(b)


# fds whose writes failed (other than a closed pipe), and why; fds closed at start (>&-), now
# held by /dev/null so that no file the command opens takes their number
_WRITE_FAILED: dict = {}
_CLOSED_AT_START: set = set()


def write_failure(fd: int) -> Optional[str]:
    """Why a write to fd failed (ENOSPC, EIO, closed at start), or None: the command line turns
    it into one line and an exit code that keeps the verdict (cli/exits.py)."""
    return _WRITE_FAILED.get(fd)


def note_write_failure(fd: int, why: str) -> None:
    """A failed write to this process's fd made by a child on its behalf (the simulator's
    worker writes replay's report to the stdout it inherited)."""
    _WRITE_FAILED.setdefault(fd, why)


def hold_closed_fd(fd: int, flags: int) -> bool:
    """fd closed at start (`>&-`, `<&-`): put /dev/null there; True if it was closed."""
    try:
        os.fstat(fd)
        return False
    except OSError:
        pass
    nul = os.open(os.devnull, flags)
    if nul != fd:
        os.dup2(nul, fd)
        os.close(nul)
    os.set_inheritable(fd, True)        # a child (the simulator's worker) finds it as we do
    _CLOSED_AT_START.add(fd)
    return True


def closed_at_start(fd: int) -> bool:
    return fd in _CLOSED_AT_START


def pipe_safe_text(fd: int, encoding: Optional[str] = None, errors: Optional[str] = None,
                   line_buffering: bool = False, write_through: bool = False,
                   report_as: Optional[int] = None) -> IO[str]:
    """A text stream on fd that a closed pipe cannot break (the fd is not closed with it);
    report_as: the fd its failed writes count for (1 for a dup of stdout)."""
    return io.TextIOWrapper(io.BufferedWriter(_PipeSafe(fd, report_as)), encoding=encoding, errors=errors,
                            line_buffering=line_buffering, write_through=write_through)


def is_tty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):     # closed or not a real stream
        return False


def console(stderr: bool = False, file: Optional[IO[str]] = None):
    """A rich Console on stdout, stderr or file whose lines never wrap (soft_wrap)."""
    from rich.console import Console

    return Console(file=file if file is not None else (sys.stderr if stderr else sys.stdout),
                   highlight=False, soft_wrap=True)


def print_table(con, columns: Sequence[Column], rows: Iterable[Sequence[object]],
                title: Optional[str] = None, markup: bool = False) -> None:
    """A rich table at a terminal; elsewhere plain aligned rows: no box drawing, no wrapping,
    no truncation. Cells are plain text (kernel names hold brackets) unless markup is True."""
    from rich.text import Text

    cols = [(c, "left") if isinstance(c, str) else c for c in columns]
    text = Text.from_markup if markup else Text
    cells = [[text(str(v)) for v in r] for r in rows]
    if is_tty(con.file):
        from rich.table import Table

        t = Table(title=title, show_edge=False)
        for name, justify in cols:
            t.add_column(name, justify=justify, overflow="fold")
        for r in cells:
            t.add_row(*r)
        con.print(t)
        return
    plain = [[h for h, _ in cols]] + [[c.plain for c in r] for r in cells]
    widths = [max(len(r[i]) for r in plain) for i in range(len(cols))]
    out = [title] if title else []
    for r in plain:
        cells = [v.rjust(w) if j == "right" else v.ljust(w) for v, w, (_, j) in zip(r, widths, cols)]
        out.append("  ".join(cells).rstrip())
    con.file.write("\n".join(out) + "\n")
