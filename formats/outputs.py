"""The one rule for every file a command writes.

Checked before any work starts (check_output): an existing file is replaced only with
-f/--force-overwrite, the input itself never; a missing parent directory is an error, not
created; a directory where a file goes (or the reverse) and a place that cannot be written
are refused. Written atomically (atomic_file, atomic_path): into a temporary file in the same
directory, renamed over the target when complete, removed on any failure, so a reader never
sees half a file and a failed command leaves nothing behind.
"""
from __future__ import annotations

import os
import stat
import tempfile
from contextlib import contextmanager
from typing import IO, Iterable, Iterator, Optional, Union

PathLike = Union[str, "os.PathLike[str]"]
FORCE = "-f (--force-overwrite)"


class OutputError(Exception):
    """An output that must not or cannot be written (one line, exit 2)."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM where a command maps it), with what the command left behind in words
    ("3 of 12 cells are in st.sqlite"); the command line prints it in one line and exits 130."""

    def __init__(self, left: str):
        super().__init__(left)
        self.left = left


_WRITTEN: list = []         # outputs this process completed, oldest first: what an interrupt left


def written() -> list:
    """The outputs completed so far (atomic_path's renames), for the line an interrupt prints."""
    return list(_WRITTEN)


def _same(a: str, b: PathLike) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(os.fspath(b))


def _identity(p: PathLike):
    """(st_dev, st_ino) of p after links, or None."""
    try:
        st = os.stat(p)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _inside(d: str, i: PathLike) -> bool:
    """Whether the input i lies in directory d, at any depth, by identity: a link to it or a
    directory reached by a link counts."""
    want = _identity(d)
    if want is None:
        return False
    cur = os.path.dirname(os.path.realpath(os.fspath(i)))
    while True:
        if _identity(cur) == want:
            return True
        up = os.path.dirname(cur)
        if up == cur:
            return False
        cur = up


# the longest suffix a write adds to an output's name: the temporary (".NAME.XXXXXXXX.tmp"), a
# writer's own temporary of that (".tmp") and SQLite's journal ("-journal")
TMP_EXTRA = len(".") + len(".00000000.tmp") + len(".tmp") + len("-journal")


def _name_fits(a: str, label: str) -> None:
    d, base = os.path.split(a)
    try:
        name_max = os.pathconf(d if os.path.isdir(d) else "/", "PC_NAME_MAX")
        path_max = os.pathconf(d if os.path.isdir(d) else "/", "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    if len(os.fsencode(base)) + TMP_EXTRA > name_max:
        raise OutputError(f"{label}: the name is too long ({len(os.fsencode(base))} bytes; at most "
                          f"{name_max - TMP_EXTRA}, as the temporary files beside it add {TMP_EXTRA})")
    if len(os.fsencode(a)) + TMP_EXTRA >= path_max:
        raise OutputError(f"{label}: the path is too long ({len(os.fsencode(a))} bytes; at most "
                          f"{path_max - TMP_EXTRA - 1} with the temporary files' names)")


# outputs checked, by absolute path: whether the target may be replaced (-f) and the identities
# of the inputs no write may replace; atomic_path reads it at the rename
_CHECKED: dict = {}
_INPUTS: set = set()


def reset() -> None:
    """A new command starts (several may run in one process: the tests, the Python API)."""
    _CHECKED.clear()
    _INPUTS.clear()


def _probe(d: str, label: str) -> None:
    """Create and remove a file in d: the only test that root, read-only mounts and ACLs agree
    on; then the free space, where the filesystem tells it (a full disk is named now, not after
    the work)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".cudasnap-probe-", dir=d)
    except OSError as e:
        raise OutputError(f"{label}: cannot write in {d} ({e.strerror or e})") from None
    os.close(fd)
    try:
        os.unlink(name)
    except OSError:
        pass
    try:
        st = os.statvfs(d)
    except OSError:
        return
    if st.f_blocks and st.f_bavail * st.f_frsize < MIN_FREE:
        raise OutputError(f"{label}: no space left on the device that holds {d} "
                          f"({st.f_bavail * st.f_frsize} bytes free)")


MIN_FREE = 64 << 10         # below this no output of any command fits


def check_output(path: PathLike, force: bool = False, kind: str = "file",
                 inputs: Iterable[Optional[PathLike]] = (), what: str = "") -> str:
    """Refuse an output before any work: raises OutputError with one line, else returns the
    absolute path. kind "file": a file that is replaced only with force; kind "dir": a
    directory created if missing (its parent must exist), written into when not empty only
    with force. inputs: the files the command reads, never overwritten, force or not."""
    if kind not in ("file", "dir"):
        raise ValueError(f"kind must be file or dir, not {kind!r}")
    p = os.fspath(path)
    label = f"{what} {p}" if what else p
    if not p:
        raise OutputError(f"{what or 'output'}: an empty path")
    a = os.path.abspath(p)
    inputs = [i for i in inputs if i is not None]
    for i in inputs:
        if _same(a, i):
            same = "" if os.fspath(i) == p else f" {os.fspath(i)}"
            raise OutputError(f"{label} is the input{same}: write the output elsewhere")
        if kind == "dir" and os.path.isdir(a) and _inside(a, i):
            raise OutputError(f"{label} holds the input {os.fspath(i)}: write the output elsewhere")
        ident = _identity(i)
        if ident is not None:
            _INPUTS.add(ident)
    if kind == "file":
        _name_fits(a, label)
    if os.path.islink(a) and not os.path.exists(a):
        raise OutputError(f"{label} is a symbolic link to a missing {os.readlink(a)}: remove it or give another name")
    _CHECKED[a] = force
    if os.path.lexists(a):
        if kind == "file":
            if os.path.isdir(a):
                raise OutputError(f"{label} is a directory: give a file name")
            if os.path.exists(a) and not os.path.isfile(a):
                raise OutputError(f"{label} exists and is not a regular file")
            if not force:
                raise OutputError(f"{label} exists: use {FORCE} to replace it")
        else:
            if not os.path.isdir(a):
                raise OutputError(f"{label} exists and is not a directory")
            try:
                full = any(True for _ in os.scandir(a))
            except OSError as e:
                raise OutputError(f"{label}: cannot read it ({e.strerror or e})") from None
            if full and not force:
                raise OutputError(f"{label} is not empty: use {FORCE} to write into it "
                                  f"(files this command does not write are kept)")
            _probe(a, label)
            return a
    parent = os.path.dirname(a)
    if not os.path.isdir(parent):
        if os.path.lexists(parent):
            raise OutputError(f"{label}: {parent} is not a directory")
        raise OutputError(f"{label}: no such directory {parent} (create it first)")
    _probe(parent, label)
    return a


def _tmp_name(path: str) -> str:
    d, base = os.path.split(os.path.abspath(path))
    return os.path.join(d, f".{base}.{os.urandom(4).hex()}.tmp")


def _reserve(path: str) -> str:
    """A new, empty temporary file beside path, with the mode a plain create would give (or
    the replaced file's mode)."""
    for _ in range(16):
        tmp = _tmp_name(path)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        except FileExistsError:
            continue
        try:
            st = os.stat(path)
            if stat.S_ISREG(st.st_mode):
                os.fchmod(fd, stat.S_IMODE(st.st_mode))
        except OSError:
            pass
        os.close(fd)
        return tmp
    raise OSError(f"cannot create a temporary file beside {path}")


def _unlink_quiet(p: str) -> None:
    try:
        os.unlink(p)
    except OSError:
        pass


# temporary files of writes in progress: removed by remove_temporaries when the process must
# exit at once (the replay watchdog's os._exit skips every finally)
_TEMPORARIES: set = set()


@contextmanager
def temporary(path: PathLike) -> Iterator[str]:
    """A temporary file this process writes at path, removed by remove_temporaries until the
    block ends (the block itself renames or removes it)."""
    p = os.fspath(path)
    _TEMPORARIES.add(p)
    try:
        yield p
    finally:
        _TEMPORARIES.discard(p)


def remove_temporaries() -> None:
    for p in list(_TEMPORARIES):
        _unlink_quiet(p)


class Taken(OutputError, FileExistsError):
    """The output appeared while the command ran (another writer): not replaced. An OSError
    too, so that every writer's handler of failed writes reports it in its one line."""


class IsInput(OutputError, PermissionError):
    """A write would replace an input of the command (reached through a directory output)."""


def put_output(tmp: str, p: str) -> None:
    """Rename the finished temporary to p. An output checked without -f is created exclusively
    (a hard link fails if another writer made it meanwhile); an input is never replaced."""
    a = os.path.abspath(p)
    ident = _identity(a)
    if ident is not None and ident in _INPUTS:
        raise IsInput(f"{p} is an input of this command: not replaced")
    if _CHECKED.get(a) is False:
        try:
            os.link(tmp, a)
        except FileExistsError:
            raise Taken(f"{p} was created by another writer while this command ran: not replaced") from None
        except OSError:
            pass                    # no hard links here (some filesystems): the rename below
        else:
            os.unlink(tmp)
            _CHECKED[a] = True      # ours now: this command may write it again (extract --check widens)
            return
    os.replace(tmp, a)


@contextmanager
def atomic_path(path: PathLike) -> Iterator[str]:
    """Yield a temporary path beside `path` (an empty file) for a writer that takes a name
    (SQLite, gzip, a snapshot writer); on success it replaces `path`, on failure it is removed."""
    p = os.fspath(path)
    tmp = _reserve(p)
    try:
        with temporary(tmp):
            yield tmp
            put_output(tmp, p)
        _WRITTEN.append(p)
    except BaseException:
        _unlink_quiet(tmp)
        raise


@contextmanager
def atomic_file(path: PathLike, mode: str = "w", **open_kw) -> Iterator[IO]:
    """open(path, mode) that writes a temporary file and renames it over path once closed."""
    if not mode.startswith("w"):
        raise ValueError("atomic_file writes: mode must start with 'w'")
    with atomic_path(path) as tmp:
        with open(tmp, mode, **open_kw) as f:
            yield f


def write_atomic(path: PathLike, data: Union[bytes, str], encoding: str = "utf-8") -> None:
    if isinstance(data, str):
        with atomic_file(path, "w", encoding=encoding) as f:
            f.write(data)
    else:
        with atomic_file(path, "wb") as f:
            f.write(data)


def claim_fd(path: str, claim: Optional[str]) -> int:
    """The writer's fd on path; with a claim, held under an exclusive lock for the writer's life."""
    flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
    if claim is None:
        return os.open(path, flags | os.O_TRUNC, 0o666)
    fd = os.open(path, flags | (os.O_EXCL if claim == "new" else 0), 0o666)
    try:
        import fcntl
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        import errno
        raise FileExistsError(errno.EEXIST, "another process is writing it", path) from None
    except OSError:
        pass                            # no locks on this filesystem: as before
    os.ftruncate(fd, 0)
    return fd
