"""What a kept campaign worker keeps between its replays of a snapshot (campaign/cellserver.py:
one process replaying request after request). Only what never touches the GPU: the prescan
(the plan of batches, the replay index, the handles' slot numbering, the functions, contexts and
code loads it found, the D2H results read ahead), decoded module images and what was read from
them, and the decoded sources of small H2D copies (the bytes the copies send, never the memory
they fill). Each replay still runs every driver call of the snapshot from a fresh driver state
(contexts, modules, memory given back by Replayer.close).

Off unless enabled (engine.track_replays, which a kept worker calls): a process that replays once
keeps nothing. A kept prescan serves one replay at a time (taken, then given back by release(),
which close_replays calls); a replay that finds it taken builds its own.

Everything is kept under the snapshot's file identity (formats/opened.py identity: path, device,
inode, size, modification and change times): a file rewritten in place, even to the same size and
modification time, is another version, and what was kept for the older one is dropped when the
newer one is first replayed. Bounds, each the least recently used dropped first:
  CUDASNAP_KEEP_MB (1024): decoded payloads (module images, H2D sources of at most SMALL_BLOB)
    and the kept prescans' D2H results read ahead, together, MiB;
  CUDASNAP_KEEP_PLANS (4): prescans, each holding at most plan.PLAN_MAX_RECORDS decoded records
    and batchrun.D2H_AHEAD_TOTAL of D2H results;
  KEEP_FACTS (4096): what was read from module images (small: a scan's findings per image).
An invalid value of either variable reads as its default."""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, Optional, Tuple


def env_number(name: str, default: float, kind: Callable[[str], Any] = int) -> Any:
    """A non-negative number from the environment; unset or invalid: the default (a tuning knob
    read at import must never stop a replay)."""
    try:
        v = kind(os.environ.get(name) or default)
    except ValueError:
        return default
    return v if v >= 0 else default


KEEP_BYTES = env_number("CUDASNAP_KEEP_MB", 1024) << 20
SMALL_BLOB = 1 << 20             # an H2D source kept when at most this big (bigger ones stream)
# prescans kept at most, the least recently taken dropped first (a campaign's task replays one
# snapshot's rounds before the next: a few suffice)
KEEP_PLANS = env_number("CUDASNAP_KEEP_PLANS", 4)
KEEP_FACTS = 4096

_on = False
_prescans: Dict[Tuple, Dict[str, Any]] = {}      # key (its [0]: the file identity) -> kept pass
_data: Dict[Tuple[Tuple, str], bytes] = {}       # (file identity, blob id) -> decoded payload
_data_bytes = 0
_facts: Dict[Tuple, Any] = {}                    # keys holding the file identity
_current: Dict[str, Tuple] = {}                  # path -> the file identity last replayed
# what was built and what was reused (tests and bench/bench_kept.py read them)
stats = {"prescans_built": 0, "prescans_reused": 0, "images_read": 0, "images_reused": 0, "blobs_read": 0,
         "blobs_reused": 0, "dropped": 0}


def enable() -> None:
    global _on
    _on = True


def enabled() -> bool:
    return _on


def kept(key: Optional[Tuple]) -> bool:
    """Is a prescan kept under key (campaign/cellserver.py: plan ahead again when not)?"""
    return key is not None and key in _prescans


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
        kept.setdefault("bytes", 0)
        _prescans[key] = kept
        for k in [k for k, v in _prescans.items() if not v["in_use"]][:max(0, len(_prescans) - KEEP_PLANS)]:
            del _prescans[k]
        _trim()


def release() -> None:
    """Every kept prescan free for the next replay (the replays using them have ended)."""
    for v in _prescans.values():
        v["in_use"] = False
    _trim()


def used_bytes() -> int:
    """What CUDASNAP_KEEP_MB counts: payloads and the prescans' D2H results read ahead."""
    return _data_bytes + sum(v["bytes"] for v in _prescans.values())


def _trim() -> None:
    """Within KEEP_BYTES: the least recently used payloads dropped first, then prescans no
    replay is using."""
    global _data_bytes
    over = used_bytes() - KEEP_BYTES
    while over > 0 and _data:
        k = next(iter(_data))
        n = len(_data.pop(k))
        _data_bytes -= n
        over -= n
    for k in [k for k, v in _prescans.items() if not v["in_use"]]:
        if over <= 0:
            break
        over -= _prescans.pop(k)["bytes"]


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
        _data[k] = _data.pop(k)                  # the most recently used last
        stats[what + "_reused"] += 1
        return got
    got = reader.blob(bid)
    stats[what + "_read"] += 1
    if len(got) <= KEEP_BYTES:
        _data[k] = got
        _data_bytes += len(got)
        _trim()
    return got


def fact(key: Tuple, make: Callable[[], Any]) -> Any:
    """make(), remembered under key while kept (what a module image's scan found); key holds
    the file identity (reader_key)."""
    if not _on:
        return make()
    if key in _facts:
        _facts[key] = got = _facts.pop(key)
        return got
    got = _facts[key] = make()
    while len(_facts) > KEEP_FACTS:
        del _facts[next(iter(_facts))]
    return got


def reader_key(reader) -> Tuple:
    """The identity of the file version a snapshot reader reads (formats/opened.py identity,
    taken when it was opened). While kept, the first use of a newer version of a path drops
    what was kept for the older one."""
    from cudasnap.formats.opened import identity
    base = getattr(reader, "_reader", reader)         # an IndexedReader's snapshot reader
    ident = getattr(base, "identity", None)
    if ident is None:                                 # a reader not opened by formats/opened.py
        ident = identity(base.path)
        try:
            base.identity = ident
        except AttributeError:
            pass
    if _on:
        was = _current.get(ident[0])
        if was != ident:
            if was is not None:
                forget(was)
            _current[ident[0]] = ident
    return ident


def forget(ident: Tuple) -> None:
    """Drop everything kept for one file version (a replay using its prescan keeps its own)."""
    global _data_bytes
    for k in [k for k in _prescans if k[0] == ident]:
        del _prescans[k]
        stats["dropped"] += 1
    for k in [k for k in _data if k[0] == ident]:
        _data_bytes -= len(_data.pop(k))
        stats["dropped"] += 1
    for k in [k for k in _facts if ident in k]:
        del _facts[k]
