"""Tests' way to make an edited copy of a snapshot: record by record, payloads re-added."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

from cudasnap.formats import SnapshotReader, SnapshotWriter


def rewrite(src, dst, mutate: Optional[Callable[[Dict[str, Any], Any, Any], None]] = None,
            payload: Optional[Callable[[str, bytes], bytes]] = None,
            reorder: Optional[Callable[[List[Dict[str, Any]]], List[Dict[str, Any]]]] = None) -> None:
    """Copy src to dst. payload(key, data) may replace a call's payload (its extra `key`, e.g.
    "image"); mutate(rec, reader, writer) may then edit the record; reorder(records) may give
    the records (blob records left out) in another file order."""
    r = SnapshotReader(src)
    with SnapshotWriter(dst, dict(r.raw_header)) as w:
        recs = [rec for rec in r.records() if rec.get("k") != "b"]
        for rec in (reorder(recs) if reorder else recs):
            for key, ref in list((rec.get("x") or {}).items()):
                if isinstance(ref, dict) and ref.get("blob"):
                    data = r.blob(ref["blob"])
                    ref["blob"] = w.add_blob(payload(key, data) if payload else data)
            if mutate is not None:
                mutate(rec, r, w)
            w.write(rec)
