"""The one reader of each snapshot per process.

Replay's preflight, architecture check, engine and end-state check, a group's ranks and a
campaign's replay server share it: the file is opened and its frames checked once (by path,
size and modification time: a file rewritten in place is opened again)."""
from __future__ import annotations

import os
from typing import Dict, Tuple

from .container import SnapshotError
from .reader import SnapshotReader

_opened: Dict[Tuple[str, int, int], SnapshotReader] = {}


def opened(path) -> SnapshotReader:
    """This process's reader of path: opened on first use, never closed by `with` or close()."""
    p = os.path.realpath(os.fspath(path))
    try:
        st = os.stat(p)
    except OSError as e:
        raise SnapshotError(f"{os.fspath(path)}: cannot open ({e.strerror or e})") from None
    key = (p, st.st_size, st.st_mtime_ns)
    r = _opened.get(key)
    if r is None:
        for k in [k for k in _opened if k[0] == p]:      # an older version of the file
            old = _opened.pop(k)
            old.shared = False
            old.close()
        r = SnapshotReader(path)
        r.shared = True
        r.checked = None          # check_integrity's answer once run: "" (sound) or the problem
        _opened[key] = r
    return r
