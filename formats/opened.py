"""The one reader of each snapshot per process.

Replay's preflight, architecture check, engine and end-state check, a group's ranks and a
campaign's replay server share it: the file is opened and its frames checked once per version
(identity: path, device, inode, size, modification and change times; a file rewritten in place,
even to the same size and modification time as with cp -p or rsync -t, is opened again)."""
from __future__ import annotations

import os
from typing import Dict, Tuple

from .container import SnapshotError
from .reader import SnapshotReader

_opened: Dict[Tuple, SnapshotReader] = {}


def version(st: os.stat_result) -> Tuple[int, int, int, int, int]:
    """What tells one version of a file from another: a rewrite changes the change time (and a
    replacing file the inode), even where size and modification time were kept."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def identity(path) -> Tuple:
    """The file version at path now: (real path, *version); (real path,) when it cannot be read."""
    p = os.path.realpath(os.fspath(path))
    try:
        return (p,) + version(os.stat(p))
    except OSError:
        return (p,)


def opened(path) -> SnapshotReader:
    """This process's reader of path: opened on first use, never closed by `with` or close()."""
    p = os.path.realpath(os.fspath(path))
    try:
        st = os.stat(p)
    except OSError as e:
        raise SnapshotError(f"{os.fspath(path)}: cannot open ({e.strerror or e})") from None
    key = (p,) + version(st)
    r = _opened.get(key)
    if r is None:
        for k in [k for k in _opened if k[0] == p]:      # an older version of the file
            old = _opened.pop(k)
            old.shared = False
            old.close()
        r = SnapshotReader(path)
        r.shared = True
        r.checked = None          # check_integrity's answer once run: "" (sound) or the problem
        r.identity = key          # the version it reads (replay/keep.py keys what it keeps by it)
        _opened[key] = r
    return r
