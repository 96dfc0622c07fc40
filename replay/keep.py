"""What a kept campaign worker keeps between its replays of a snapshot (campaign/cellserver.py:
one process replaying request after request). Only what never touches the GPU: the prescan
(the plan of batches, the replay index, the handles' slot numbering, the functions, contexts and
code loads it found, the D2H results read ahead), decoded module images and what was read from
them, and the decoded sources of small H2D copies (the bytes the copies send, never the memory
they fill). Each replay still runs every driver call of the snapshot from a fresh driver state
(contexts, modules, memory given back by Replayer.close).

Off unless enabled (engine.track_replays, which a kept worker calls): a process that replays once
keeps nothing. A kept prescan serves one replay at a time (taken, then given back by release(),
which close_replays calls); a replay that finds it taken builds its own."""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, Optional, Tuple

# decoded payloads kept at most (module images, small H2D sources), MiB
KEEP_BYTES = int(os.environ.get("CUDASNAP_KEEP_MB") or 1024) << 20
SMALL_BLOB = 1 << 20             # an H2D source kept when at most this big (bigger ones stream)
# prescans kept at most, the least recently taken dropped first (a campaign's task replays one
# snapshot's rounds before the next: a few suffice)
KEEP_PLANS = int(os.environ.get("CUDASNAP_KEEP_PLANS") or 4)

_on = False
_prescans: Dict[Tuple, Dict[str, Any]] = {}
_data: Dict[Tuple[int, str], bytes] = {}
_data_bytes = 0
_facts: Dict[Tuple, Any] = {}
_readers: Dict[int, Any] = {}     # the readers keyed by id here, held so that no id is reused
# what was built and what was reused (tests and bench/bench_kept.py read them)
stats = {"prescans_built": 0, "prescans_reused": 0, "images_read": 0, "images_reused": 0, "blobs_read": 0,
         "blobs_reused": 0}


def enable() -> None:
    global _on
    _on = True


def enabled() -> bool:
    return _on


def take(key: Optional[Tuple]) -> Optional[Dict[str, Any]]:
    """The prescan kept under key, now in use by the caller; None: build one."""
    if not _on or key is None:
        return None
    got = _prescans.get(key)
    if got is None or got["in_use"]:
        return None
    _prescans[key] = _prescans.pop(key)          # the most recently taken last
    got["in_use"] = True
    stats["prescans_reused"] += 1
    return got


def put(key: Optional[Tuple], kept: Dict[str, Any]) -> None:
    """A prescan just built (in use by the replay that built it)."""
    stats["prescans_built"] += 1
    if _on and key is not None and key not in _prescans and KEEP_PLANS > 0:
        kept["in_use"] = True
        _prescans[key] = kept
        for k in [k for k, v in _prescans.items() if not v["in_use"]][:max(0, len(_prescans) - KEEP_PLANS)]:
            del _prescans[k]


def release() -> None:
    """Every kept prescan free for the next replay (the replays using them have ended)."""
    for v in _prescans.values():
        v["in_use"] = False


def image(reader, bid: str) -> bytes:
    """A module image's bytes: decoded once per process while kept."""
    if not _on:
        return reader.blob(bid)
    return _kept_data(reader, bid, "images")


def small_blob(reader, bid: str, size: int) -> Optional[bytes]:
    """An H2D copy's source, decoded once per process while kept; None when not kept (off,
    or bigger than SMALL_BLOB: read as it streams)."""
    if not _on or size > SMALL_BLOB:
        return None
    return _kept_data(reader, bid, "blobs")


def _kept_data(reader, bid: str, what: str) -> bytes:
    global _data_bytes
    k = (reader_key(reader), bid)
    got = _data.get(k)
    if got is not None:
        stats[what + "_reused"] += 1
        return got
    got = reader.blob(bid)
    stats[what + "_read"] += 1
    if _data_bytes + len(got) <= KEEP_BYTES:
        _data[k] = got
        _data_bytes += len(got)
    return got


def fact(key: Tuple, make: Callable[[], Any]) -> Any:
    """make(), remembered under key while kept (what a module image's scan found)."""
    if not _on:
        return make()
    if key not in _facts:
        _facts[key] = make()
    return _facts[key]


def reader_key(reader) -> int:
    """The identity of a snapshot reader: this process opens each file version once
    (formats/opened.py), and a kept prescan holds its reader, so the id stays its own."""
    base = getattr(reader, "_reader", reader)         # an IndexedReader's snapshot reader
    if _on:
        _readers[id(base)] = base
    return id(base)
