"""Checks before any GPU work (so without a GPU or cuda-python too): can this snapshot be
replayed at all. Below the engine and the group coordinator, which both ask it."""
from __future__ import annotations

import os
from typing import Optional

from cudasnap.formats import SnapshotError
from cudasnap.formats.opened import opened
from cudasnap.formats.readahead import first_record
from cudasnap.formats.vocab import is_query


def snapshot_problem(snapshot) -> Optional[str]:
    """Why `snapshot` cannot be replayed, found before any GPU work (so without a GPU or
    cuda-python too): missing, unreadable, a frame whose checksum fails (every frame is checked),
    or holding no call to replay. None when replay may start."""
    if not os.path.exists(snapshot):
        return f"{snapshot}: no such file"
    try:
        r = opened(snapshot)          # the process's one reader: the replay reads this one
    except SnapshotError as e:            # not a snapshot, or its start is gone: nothing to repair
        return str(e)
    with r:
        from cudasnap.formats.integrity import check_integrity
        bad = check_integrity(r)
        if bad:
            return bad
        try:                             # the index's count by name: a name no call has is damage
            sm = r.summary()
            odd = [k for k in ((sm or {}).get("calls") or {}) if not isinstance(k, str) or k == "?"]
        except (SnapshotError, AttributeError, TypeError):
            odd = []
        if odd:
            return damaged(SnapshotError(f"{os.fspath(snapshot)}: a call whose name is not a driver entry point"))
        try:                             # the frames read here stay decoded for the replay's pass
            if first_record(r, _replayable) is not None:
                return None
        except SnapshotError as e:
            return damaged(e)
        lost = f" (truncated: {r.lost_bytes} bytes lost)" if r.truncated and r.lost_bytes else ""
    return f"no replayable call in {os.fspath(snapshot)}{lost}"


def _replayable(rec) -> bool:
    f = rec.get("f")
    return isinstance(f, str) and "r" in rec and not rec.get("incomplete") and not is_query(f)


def damaged(e: Exception) -> str:
    return f"{e} (a damaged snapshot: `cudasnap repair` keeps every frame that still reads)"
