"""Blob references in records: how many times each blob is named (a scan's logical blob bytes)."""
from __future__ import annotations

from typing import Any, Dict, List

_CONTAINERS = frozenset((dict, list))


def frame_blob_refs(recs: List[Dict[str, Any]]) -> Dict[str, int]:
    """Blob id -> references in one frame's records."""
    refs: Dict[str, int] = {}
    plain = _CONTAINERS.isdisjoint
    for rec in recs:            # _count_blob_refs's first test, inline for most calls
        a, x = rec.get("a"), rec.get("x")
        if type(a) is dict and "blob" not in a and plain(map(type, a.values())) and (
                x is None or type(x) is dict and "blob" not in x and plain(map(type, x.values()))):
            continue
        _count_blob_refs(rec, refs)
    return refs


def _count_blob_refs(rec: Dict[str, Any], refs: Dict[str, int]) -> None:
    """Count {'blob': id} references inside a record's 'a' and 'x' maps."""
    for top in (rec.get("x"), rec.get("a")):
        if type(top) is dict:
            if "blob" in top or not _CONTAINERS.isdisjoint(map(type, top.values())):
                break
        elif isinstance(top, (dict, list)):
            break
    else:
        return                  # maps of scalars (most calls): no reference
    _count_nested_refs(rec, refs)


def _count_nested_refs(rec: Dict[str, Any], refs: Dict[str, int]) -> None:
    # the usual shapes (maps of scalars and of maps of scalars) without the walk, same counts
    # (decoded records hold plain dicts and lists only)
    found: List[str] = []
    n = 2
    for top in (rec.get("x"), rec.get("a")):
        t = type(top)
        if t is not dict:
            if isinstance(top, (dict, list)):
                return _walk_blob_refs(rec, refs)
            continue
        n += len(top)
        b = top.get("blob")
        if isinstance(b, str):
            found.append(b)
        kinds = set(map(type, top.values()))
        if list in kinds:
            return _walk_blob_refs(rec, refs)
        if dict in kinds:
            for v in top.values():
                if type(v) is dict:
                    n += len(v)
                    b = v.get("blob")
                    if isinstance(b, str):
                        found.append(b)
                    inner = set(map(type, v.values()))
                    if dict in inner or list in inner:
                        return _walk_blob_refs(rec, refs)
    if n > 10000:
        return _walk_blob_refs(rec, refs)
    for b in found:
        refs[b] = refs.get(b, 0) + 1


def _walk_blob_refs(rec: Dict[str, Any], refs: Dict[str, int]) -> None:
    stack = [rec.get("x"), rec.get("a")]
    budget = 10000
    while stack and budget > 0:
        budget -= 1
        v = stack.pop()
        if isinstance(v, dict):
            b = v.get("blob")
            if isinstance(b, str):
                refs[b] = refs.get(b, 0) + 1
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
