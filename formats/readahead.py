"""What a pass over a snapshot's records found, handed to its reader (SnapshotReader, reader.py)
so that nothing reads the records again for it: the header's "proc" record, and the first
records frames a check before a replay decoded."""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, Optional

from .container import KIND_RECORDS, record_list, snap_error
from .reader import SCAN_KEEP_RECORDS


def seed_header(r, proc: Optional[Dict[str, Any]]) -> None:
    """Reader r's header gets the first "proc" record (None: the file has none), found by a
    pass that read every record (the replay's prescan): r.header then needs no pass of its own."""
    if getattr(r, "_header_merged", False) is None:
        h = dict(r._raw_header)
        if proc is not None:
            h["proc"] = proc
        r._header_merged = h


def first_record(r, accept: Callable[[Dict[str, Any]], bool], kinds: Iterable[str] = ("c",)) -> Optional[Dict[str, Any]]:
    """The first record of these kinds that accept() takes, reading records frames only as
    far as it (None: no such record). The frames read stay with the reader, decompressed,
    for the next pass (record_payloads hands them out once), so a check before a replay
    costs its one pass nothing."""
    want = set(kinds)
    room = SCAN_KEEP_RECORDS
    for fr in r._frames:
        if fr.kind != KIND_RECORDS:
            continue
        kept = r._scan_recs.get(fr.offset)
        if isinstance(kept, list):
            recs = kept
        else:
            if kept is not None:
                count, payload = kept[0], kept[1]
            else:
                _, payload = r._read_frame(fr.offset, expect_kind=KIND_RECORDS)
                if r._last_comp_len != fr.comp_len:
                    raise snap_error(r.path, fr.offset, "frame length disagrees with the index")
                count = r._last_count
            recs = record_list(payload, count, r.path, fr.offset)
            if kept is None and count <= room:   # the payload, not the records: the pass may walk it in C
                r._scan_recs[fr.offset] = (count, payload, False)
                room -= count
        for rec in recs:
            if rec.get("k") in want and accept(rec):
                return rec
    return None
