"""Which of the prefix's calls an extract can leave out once its memory is known: device and
page-locked host allocations nothing reaches (with their frees), VMM mappings nothing reaches
(with their physical memory), streams and events no kept call names. A part of the Extractor
(export/extract.py): it reads the memory part's ranges, roots and prefix, and counts what goes
in the result."""
from __future__ import annotations

import bisect
from typing import Any, Dict, List, Optional, Set, Tuple

from cudasnap.formats.vocab import alloc_range, first_param, in_class

from . import ranges as R
from .emit import base_name
from .extract_common import ExtractResult
from .extract_memory import Memory

# What an extract may leave out when nothing reaches it, by the description's classes: device
# allocations (device_alloc) and page-locked host memory (host_alloc, kept when a pointer the
# selection or its memory holds points into it) with their frees (frees_alloc), never managed
# memory or imported memory; VMM mappings (vmm_map) with their physical memory; streams and
# events (stream_event_life). A free's pointer, a creation's handle and a destruction's are
# each the call's first parameter (vocab.first_param).


def reached(points: List[int], spans: List[Tuple[int, int]], lo: int, hi: int) -> bool:
    """Does a point (sorted) lie in [lo, hi), or a span (sorted) overlap it?"""
    i = bisect.bisect_left(points, lo)
    if i < len(points) and points[i] < hi:
        return True
    j = bisect.bisect_left(spans, (hi, 0))
    return any(s_lo < hi and s_hi > lo for s_lo, s_hi in spans[:j])


class Pruner:
    def __init__(self, res: ExtractResult, mem: Optional[Memory]):
        self.res, self.mem = res, mem

    def unreached_allocations(self) -> Set[int]:
        """Call numbers of the prefix's device allocations (cuMemAlloc and its kin) and page-locked
        host allocations the selection cannot reach, and of their frees: no range restored or
        expected lies in one, and no pointer in the selection's arguments, a kept state-building
        call's (a texture's or a tensor map's memory, say) or scanned memory points into it.
        With --memory all every one is kept."""
        mem = self.mem
        if mem.memory == "all":
            return set()
        spans = [(b, b + n) for b, n, _bid in list(mem.restore) + list(mem.expected)]
        points: List[int] = []
        allocs, frees, vmm = [], [], []
        ints: Set[int] = set()
        roots = {id(r) for r in mem.root_recs()}
        for rec in list(mem.root_recs()) + list(mem.prefix_recs):
            b = base_name(rec.get("f") or "")
            if (in_class(b, "device_alloc") or in_class(b, "host_alloc")) and id(rec) not in roots:
                allocs.append(rec)
                continue
            if in_class(b, "frees_alloc") and id(rec) not in roots:
                frees.append(rec)
                continue
            if in_class(b, "vmm_map") and id(rec) not in roots:
                vmm.append(rec)
                continue
            vals = list((rec.get("a") or {}).values()) + [(rec.get("x") or {}).get("params")]
            for v in vals:
                if isinstance(v, int):
                    ints.add(v)
                    if v >= R.MIN_ADDR:
                        points.append(v)
                elif isinstance(v, (bytes, bytearray)) and len(v) >= 8:
                    points += [int(w) for w in R.words(v)]
        points.sort()
        spans.sort()
        drop: Set[int] = set()
        dropped_at: Dict[int, int] = {}
        mem.host_allocs()
        for rec in sorted(allocs + frees, key=lambda r: r.get("s", 0)):
            a = rec.get("a") or {}
            b = base_name(rec.get("f") or "")
            if in_class(b, "frees_alloc"):
                if dropped_at.pop(a.get(first_param(rec.get("f"))), None) is not None:
                    drop.add(rec["s"])
                continue
            rng = (a.get("pp"), a.get("bytesize")) if in_class(b, "host_alloc") else alloc_range(rec)
            if rng is None or not all(isinstance(v, int) for v in rng) or rng[0] in mem.host_reached:
                continue
            lo, hi = rng[0], rng[0] + max(rng[1], 1)
            if reached(points, spans, lo, hi):
                continue
            drop.add(rec["s"])
            dropped_at[lo] = rec["s"]
        self.res.allocs_dropped = sum(1 for r in allocs if r["s"] in drop)
        drop |= self.unreached_mappings(vmm, lambda lo, hi: reached(points, spans, lo, hi), ints)
        return drop

    def unreached_mappings(self, vmm, is_reached, ints: Set[int]) -> Set[int]:
        """Call numbers of the prefix's VMM mappings nothing reaches (cuMemMap, its
        cuMemSetAccess and cuMemUnmap), with the cuMemCreate and cuMemRelease of a physical
        allocation all of whose mappings go and that no other kept call names (an export, a
        property query). Address reservations stay (they hold no memory). An access setting that
        spans a kept mapping keeps every mapping it covers."""
        maps = [r for r in vmm if in_class(r["f"], "maps_range")]
        span = {r["s"]: (r["a"].get("ptr"), r["a"].get("size")) for r in maps}
        if not all(isinstance(p, int) and isinstance(n, int) for p, n in span.values()):
            return set()
        cand = {r["s"] for r in maps if not is_reached(span[r["s"]][0], span[r["s"]][0] + max(span[r["s"]][1], 1))
                and r["a"].get("handle") not in ints}
        access = [(r["a"].get("ptr"), r["a"].get("size")) for r in vmm if in_class(r["f"], "sets_access")]
        changed = True
        while changed:
            changed = False
            for p, n in access:
                if not isinstance(p, int) or not isinstance(n, int):
                    return set()
                over = [s for s, (mp, mn) in span.items() if mp < p + n and p < mp + mn]
                if any(s not in cand for s in over) and any(s in cand for s in over):
                    cand -= set(over)
                    changed = True
        handles: Dict[Any, bool] = {}
        for r in maps:
            h = r["a"].get("handle")
            handles[h] = handles.get(h, True) and r["s"] in cand
        drop: Set[int] = set(cand)
        dropped_at = {span[s][0] for s in cand}
        for r in sorted(vmm, key=lambda r: r["s"]):
            a, b = r["a"], base_name(r["f"])
            if in_class(b, "sets_access"):
                over = [s for s, (mp, mn) in span.items() if mp < a["ptr"] + a["size"] and a["ptr"] < mp + mn]
                if over and all(s in cand for s in over):
                    drop.add(r["s"])
            elif in_class(b, "unmaps_range") and a.get("ptr") in dropped_at:
                drop.add(r["s"])
            elif in_class(b, "physical_memory") and handles.get(a.get("handle")):
                drop.add(r["s"])
        self.res.allocs_dropped += len(cand)
        return drop

    def unused_objects(self, kept: Set[int]) -> Set[int]:
        """Call numbers of the prefix's stream and event creations whose handle no other kept
        call names (in an argument, a struct argument or a launch's parameters), with their
        destructions."""
        mem = self.mem
        made: Dict[int, List[int]] = {}
        named: Set[int] = set()
        recs = [r for r in mem.prefix_recs if r["s"] in kept] + list(mem.root_recs())
        for rec in recs:
            b = base_name(rec.get("f") or "")
            a = rec.get("a") or {}
            key = first_param(rec.get("f")) if in_class(b, "stream_event_life") else None
            if key is not None and isinstance(a.get(key), int):
                made.setdefault(a[key], []).append(rec["s"])
                continue
            for v in list(a.values()) + [(rec.get("x") or {}).get("params")]:
                if isinstance(v, int):
                    named.add(v)
                elif isinstance(v, (bytes, bytearray)) and len(v) >= 8:
                    named.update(int(w) for w in R.words(v))
        root_seqs = {r.get("s") for r in mem.root_recs()}
        # a handle the selection creates or destroys itself is named by it
        drop = {s for h, seqs in made.items() if h not in named and not root_seqs.intersection(seqs) for s in seqs}
        self.res.objects_dropped = sum(1 for r in recs if r["s"] in drop
                                       and in_class(r.get("f"), "stream_event_life")
                                       and not in_class(r.get("f"), "destroys"))
        return drop
