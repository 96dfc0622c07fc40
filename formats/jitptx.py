"""PTX a capture kept for a module whose image has none (a JIT compiler's cubin, its PTX found
beside it in the compiler's cache): `{"k": "ptx", "image": blob id of the module image,
"x": {"ptx": {"blob", "size"}}, "from": what kept it, "path": the cubin it matched}`."""
from __future__ import annotations

from typing import Any, Dict


def kept_ptx(reader) -> Dict[str, Dict[str, Any]]:
    """Image blob id -> {"ptx": bytes, "from": str, "path": str} for every ptx record whose
    PTX is in the snapshot (none in snapshots older than the record)."""
    out: Dict[str, Dict[str, Any]] = {}
    for rec in reader.records(("ptx",)):
        ref = (rec.get("x") or {}).get("ptx")
        img = rec.get("image")
        if isinstance(img, str) and isinstance(ref, dict) and isinstance(ref.get("blob"), str) \
                and reader.has_blob(ref["blob"]):
            out.setdefault(img, {"ptx": reader.blob(ref["blob"]), "from": str(rec.get("from") or "?"),
                                 "path": str(rec.get("path") or "")})
    return out
