"""Narrow memory ranges for `cudasnap extract --ranges exact`.

Caching allocators (PyTorch's, JAX's BFC) carve many tensors out of one driver allocation,
so restoring whole allocations restores far more than a kernel touches.  Here a pointer the
selection can reach (a launch parameter word, a struct argument's word, a copy or memset
argument, a TMA descriptor's address, or a word found in memory already restored) reaches
from itself to the next "tensor start" in its allocation.  Tensor starts are the device
addresses the snapshot's launches, copies and memsets name; one counts only if a call names
it while the pointer's tensor is live (see Boundaries.window).  The allocations are compared
before and after the selection (those no pointer reaches too, within a host-memory budget):
bytes it writes outside the ranges are restored and verified as well.  Reads outside them
cannot be seen: the extract's replay then does not verify (`extract --check` says so), and
`--ranges segment` restores whole allocations instead.
"""
from __future__ import annotations

import bisect
import os
from typing import Dict, Iterable, List, Optional, Set, Tuple

import numpy as np

from cudasnap.formats.vocab import first_param, in_class, is_launch, memset_width

from .emit import base_name

MIN_ADDR = 1 << 16                # smaller words are never device addresses
ALIGN = 16                        # addresses are taken down to this (a pointer may carry flag bits)
WHOLE_DIFF_LIMIT = 256 << 20      # allocations up to this size are compared whole
DIFF_MARGIN = 64 << 20            # larger ones: the ranges plus this much either side
SCAN_LIMIT = 1 << 30              # bytes of memory scanned for pointers, at most
DIFF_BUDGET = 4 << 30             # host memory for allocations kept to compare, at most
DIFF_BUDGET_ENV = "CUDASNAP_EXTRACT_DIFF_BYTES"   # overrides it (small hosts; tests)
COALESCE_GAP = 4096               # written bytes closer than this become one range
PTR_KEYS = ("dstDevice", "srcDevice", "dst", "src", "ptr", "dptr")
_ELEM_BYTES = {0: 1, 1: 2, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2, 10: 4, 11: 4, 12: 4}
Interval = Tuple[int, int]        # [start, end)


def words(data) -> np.ndarray:
    """The 8-byte aligned little-endian words of data (zero-padded), >= MIN_ADDR."""
    b = bytes(data)
    b += b"\0" * (-len(b) % 8)
    w = np.frombuffer(b, dtype="<u8")
    return w[w >= MIN_ADDR]


def pointer_args(rec) -> List[Tuple[int, int]]:
    """(address, bytes known to be reached) of a copy or memset's device pointer arguments."""
    a = rec.get("a") or {}
    b = base_name(rec.get("f") or "")
    n = 0
    if isinstance(a.get("ByteCount"), int):
        n = a["ByteCount"]
    elif in_class(b, "memset_1d") and isinstance(a.get("N"), int):
        n = a["N"] * memset_width(b)
    return [(a[k], n) for k in PTR_KEYS if isinstance(a.get(k), int) and a[k] >= MIN_ADDR]


def _u64s(v, n: int) -> List[int]:
    if isinstance(v, (bytes, bytearray)):
        return [int.from_bytes(v[i * 8:i * 8 + 8], "little") for i in range(min(n, len(v) // 8))]
    if isinstance(v, (list, tuple)):
        return [int(x) for x in v[:n]]
    return []


def tensor_map_extent(a) -> Optional[Tuple[bytes, int, int]]:
    """(encoded map, global address, bytes it spans) of a cuTensorMapEncode* record's args."""
    m, addr, rank = a.get("tensorMap"), a.get("globalAddress"), a.get("tensorRank")
    if not isinstance(m, (bytes, bytearray)) or not isinstance(addr, int) or not isinstance(rank, int) or rank < 1:
        return None
    dims = _u64s(a.get("globalDim"), rank)
    strides = _u64s(a.get("globalStrides"), rank - 1)
    if len(dims) != rank or len(strides) != rank - 1:
        return bytes(m), addr, 0
    n = dims[0] * _ELEM_BYTES.get(a.get("tensorDataType"), 1)
    for d, s in zip(dims[1:], strides):
        n += (d - 1) * s if d else 0
    return bytes(m), addr, n


class Boundaries:
    """Every device address the snapshot's launches, copies and memsets name (tensor starts),
    with the calls that name it, and the TMA descriptors it encoded.  Built without a GPU, in
    one pass over the records.

    A start counts for a pointer only if some call names it while the pointer's tensor is
    known to be live: from the pointer's last use before the selection to the selection's
    end (or, for a pointer first used by the selection, to its next use).  An allocator that
    once split a block differently leaves starts that no call names in that window."""

    def __init__(self, reader=None):
        self.tensor_maps: List[Tuple[bytes, int, int]] = []
        if reader is None:
            return self._index([], [])
        addrs: List[np.ndarray] = []
        seqs: List[np.ndarray] = []

        def add(w: np.ndarray, s: int) -> None:
            if len(w):
                addrs.append(w)
                seqs.append(np.full(len(w), s, dtype=np.int64))

        for rec in reader.records(("c",)):
            if rec.get("incomplete") or rec.get("r", 0) != 0:
                continue
            f, s = rec.get("f") or "", rec.get("s", 0)
            if is_launch(f):
                p = (rec.get("x") or {}).get("params")
                if isinstance(p, (bytes, bytearray)) and p:
                    add(np.unique(words(p)), s)
            elif in_class(f, "moves_memory"):
                add(np.array([p for p, _n in pointer_args(rec)], dtype="<u8"), s)
            elif in_class(f, "encodes_tensor_map"):
                tm = tensor_map_extent(rec.get("a") or {})
                if tm is not None:
                    self.tensor_maps.append(tm)
                    add(np.array([tm[1]], dtype="<u8"), s)
        self._index(addrs, seqs)

    def _index(self, addrs: List[np.ndarray], seqs: List[np.ndarray]) -> None:
        a = np.concatenate(addrs) if addrs else np.zeros(0, "<u8")
        q = np.concatenate(seqs) if seqs else np.zeros(0, np.int64)
        a = a & ~np.uint64(ALIGN - 1)
        order = np.lexsort((q, a))
        self._addr, self._seq = a[order], q[order]
        self.sorted: List[int] = [int(x) for x in np.unique(self._addr)]

    @classmethod
    def of(cls, uses: Dict[int, List[int]]) -> "Boundaries":
        """From {address: [call numbers naming it]} (tests)."""
        b = cls()
        b._index([np.array([k] * len(v), dtype="<u8") for k, v in uses.items()],
                 [np.array(v, dtype=np.int64) for v in uses.values()])
        return b

    def _uses(self, addr: int) -> np.ndarray:
        a = np.uint64(addr)
        return self._seq[np.searchsorted(self._addr, a, "left"):np.searchsorted(self._addr, a, "right")]

    def window(self, addr: int, first: int, last: int) -> Tuple[int, int]:
        """Calls during which the tensor at addr (used by the selection first..last) is live."""
        u = self._uses(addr & ~(ALIGN - 1))
        before = u[u < first]
        if len(before):
            return int(before[-1]), last
        after = u[u > last]
        return first, int(after[0]) if len(after) else last

    def next_after(self, addr: int, limit: int, win: Optional[Tuple[int, int]] = None) -> Optional[int]:
        """The first start above addr (below limit) that a call in win names (any call if None)."""
        i = bisect.bisect_right(self.sorted, addr)
        while i < len(self.sorted) and self.sorted[i] < limit:
            b = self.sorted[i]
            if win is None:
                return b
            u = self._uses(b)
            k = np.searchsorted(u, win[0], "left")
            if k < len(u) and u[k] <= win[1]:
                return b
            i += 1
        return None

    def roots_of(self, rec) -> List[Tuple[int, int]]:
        """(address, bytes known to be reached) for the pointers one selected call names."""
        out: List[Tuple[int, int]] = []
        p = (rec.get("x") or {}).get("params")
        if isinstance(p, (bytes, bytearray)) and p:
            out += [(int(w), 0) for w in np.unique(words(p))]
            pb = bytes(p)
            out += [(addr, n) for m, addr, n in self.tensor_maps if m in pb]
        else:                         # structs by value (a CUDA_MEMCPY3D, say): their pointer words
            for v in (rec.get("a") or {}).values():
                if isinstance(v, (bytes, bytearray)) and len(v) >= 8:
                    out += [(int(w), 0) for w in np.unique(words(v))]
        out += pointer_args(rec)
        return out


def object_roots(prefix, selected) -> List[Tuple[int, int]]:
    """The device pointers in the resource descriptions of the texture and surface objects whose
    handles a selected launch passes: kernels read that memory through the object."""
    params = [bytes(p) for p in ((r.get("x") or {}).get("params") for r in selected)
              if isinstance(p, (bytes, bytearray))]
    out: List[Tuple[int, int]] = []
    for rec in prefix:
        # a texture or surface object: its handle is the first parameter (class makes_view_object)
        key = first_param(rec.get("f")) if in_class(rec.get("f"), "makes_view_object") else None
        a = rec.get("a") or {}
        h, desc = a.get(key) if key else None, a.get("pResDesc")
        if not isinstance(h, int) or not isinstance(desc, (bytes, bytearray)):
            continue
        word = h.to_bytes(8, "little")
        if any(p[i:i + 8] == word for p in params for i in range(0, len(p) - 7, 8)):
            out += [(int(w), 0) for w in np.unique(words(desc))]
    return out


def merge(iv: Iterable[Interval], gap: int = 0) -> List[Interval]:
    out: List[List[int]] = []
    for lo, hi in sorted(iv):
        if out and lo <= out[-1][1] + gap:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


def subtract(iv: List[Interval], minus: List[Interval]) -> List[Interval]:
    """Parts of intervals iv (merged) not covered by minus (merged)."""
    out: List[Interval] = []
    for lo, hi in iv:
        cur = lo
        for mlo, mhi in minus:
            if mhi <= cur or mlo >= hi:
                continue
            if mlo > cur:
                out.append((cur, mlo))
            cur = max(cur, mhi)
        if cur < hi:
            out.append((cur, hi))
    return out


def extent(addr: int, known: int, seg: Interval, bounds: Boundaries,
           win: Optional[Tuple[int, int]] = None) -> Interval:
    """[addr, end): up to the next tensor start in the allocation seg (at least `known` bytes)."""
    s_lo, s_hi = seg
    nxt = bounds.next_after(addr, s_hi, win)
    end = s_hi if nxt is None else min(nxt, s_hi)
    end = min(max(end, addr + known), s_hi)
    return addr, max(end, min(addr + 1, s_hi))


def written(before: bytes, after: bytes, base: int, gap: int = COALESCE_GAP) -> List[Interval]:
    """Byte ranges (absolute, from base) that differ between two reads of the same window."""
    n = min(len(before), len(after))
    if not n or before[:n] == after[:n]:
        return []
    d = np.flatnonzero(np.frombuffer(before, np.uint8, n) != np.frombuffer(after, np.uint8, n))
    if not len(d):
        return []
    cut = np.flatnonzero(np.diff(d) > gap)
    starts = np.concatenate(([d[0]], d[cut + 1]))
    ends = np.concatenate((d[cut], [d[-1]])) + 1
    return [(base + int(a), base + int(b)) for a, b in zip(starts, ends)]


def diff_window(seg: Interval, ranges: List[Interval]) -> Interval:
    """The part of an allocation compared before and after the selection."""
    s_lo, s_hi = seg
    if s_hi - s_lo <= WHOLE_DIFF_LIMIT or not ranges:
        return seg
    return max(s_lo, ranges[0][0] - DIFF_MARGIN), min(s_hi, ranges[-1][1] + DIFF_MARGIN)


def plan(roots: List[Tuple[int, int]], live: List[Tuple[int, int, str]], bounds: Boundaries,
         find, span: Optional[Tuple[int, int]] = None) -> Dict[int, List[Interval]]:
    """Roots -> {index into live: merged intervals}; find(addr) gives the live index or None;
    span: the selection's first and last call numbers (None: every start counts)."""
    per: Dict[int, List[Interval]] = {}
    for addr, known in roots:
        i = find(addr)
        if i is None:
            continue
        b, n, _k = live[i]
        lo = max(addr & ~(ALIGN - 1), b)
        win = bounds.window(addr, *span) if span else None
        per.setdefault(i, []).append(extent(lo, known + addr - lo, (b, b + n), bounds, win))
    return {i: merge(v) for i, v in per.items()}


def new_roots(data: bytes, seen: Set[int]) -> List[Tuple[int, int]]:
    out = []
    for w in np.unique(words(data)):
        w = int(w)
        if w not in seen:
            seen.add(w)
            out.append((w, 0))
    return out


# ---------------------------------------------------------------- in the extracting replay
def start_exact(ex, rv) -> None:
    """Ranges from each pointer the selection reaches to the next tensor start, scanned for
    pointers transitively; then the allocations they lie in are read, to be compared after."""
    roots: List[Tuple[int, int]] = []
    for rec in ex.root_recs():
        roots += ex.bounds.roots_of(rec)
    roots += object_roots(ex.prefix_recs, ex.root_recs())
    seen = {a for a, _n in roots}
    for data in ex.copied_in():          # pointer tables the selection itself uploads
        roots += new_roots(data, seen)
    per: Dict[int, List[Interval]] = {}
    for i, r in enumerate(ex.live):
        if r[2] == "global":
            per[i] = [(r[0], r[0] + r[1])]
    scanned_iv: Dict[int, List[Interval]] = {}
    scanned = 0
    while roots:
        for i, iv in plan(roots, ex.live, ex.bounds, ex.find, (ex.first, ex.last)).items():
            per[i] = merge(per.get(i, []) + iv)
        roots = []
        for i, iv in per.items():
            todo = subtract(iv, scanned_iv.get(i, []))
            scanned_iv[i] = list(iv)
            for lo, hi in todo:
                if scanned >= SCAN_LIMIT:
                    break
                scanned += hi - lo
                data = ex.read(rv, lo, hi - lo)
                ex.note_host_refs(data)
                roots += new_roots(data, seen)
    ex.per = per
    ex.before = {}
    limit = int(os.environ.get(DIFF_BUDGET_ENV, DIFF_BUDGET))
    budget, uncompared = limit, 0
    for i, iv in sorted(per.items()):
        b, n, _k = ex.live[i]
        lo, hi = diff_window((b, b + n), iv)
        if hi - lo <= budget:
            budget -= hi - lo
            ex.before[i] = (lo, ex.read(rv, lo, hi - lo))
        else:                         # kept as blobs now; writes beyond its ranges go unseen
            uncompared += 1
            ex.before[i] = (None, [(l, h - l, ex.w.add_blob(ex.read(rv, l, h - l))) for l, h in iv])
    # the allocations no pointer reaches are compared too (while the budget lasts): what the
    # selection writes there, through addresses its parameters do not show, is restored and verified
    others = 0
    for i, (b, n, k) in enumerate(ex.live):
        if i in per or k == "global":
            continue
        if n <= budget:
            budget -= n
            per[i] = []
            ex.before[i] = (b, ex.read(rv, b, n))
        else:
            others += 1
    if uncompared:
        ex.res.notes.append(f"{uncompared} allocation(s) not compared before and after the selection (more than "
                            f"{limit} bytes in all, {DIFF_BUDGET_ENV}): bytes it writes beyond their ranges are not verified")
    if others:
        ex.res.notes.append(f"{others} allocation(s) no pointer reaches were not compared before and after the "
                            f"selection (more than {limit} bytes in all): what it writes there is not verified")
    ex.chosen = sorted(per)


def end_exact(ex, rv) -> None:
    """Add what the selection wrote beyond the ranges; restore every range as it was before
    the selection and expect it as it is after."""
    ex.restore, ex.expected = [], []
    beyond = 0
    segs = set()
    for i in ex.chosen:
        base, n, _k = ex.live[i]
        lo, before = ex.before[i]
        iv = ex.per[i]
        a = rv.find(base)
        live = a is not None and base + n <= a.rec_base + max(a.size, 1)    # not freed (or remade smaller)
        if lo is None:
            segs.add(i)
            ex.restore += before
            ex.expected += [(l, m, ex.w.add_blob(ex.read(rv, l, m))) for l, m, _b in before] if live else []
            continue
        after = None
        if live:
            after = ex.read(rv, lo, len(before))
            extra = subtract(merge(written(before, after, lo)), iv)
            beyond += sum(h - l for l, h in extra)
            iv = merge(iv + extra)
        if iv:
            segs.add(i)
        for l, h in iv:
            ex.restore.append((l, h - l, ex.w.add_blob(before[l - lo:h - lo])))
            if after is not None:
                ex.expected.append((l, h - l, ex.w.add_blob(after[l - lo:h - lo])))
    ex.before = {}
    ex.res.written_beyond = beyond
    ex.res.segments = len(segs)
    ex.res.segments_bytes = sum(ex.live[i][1] for i in segs)
    ex.res.restored = [(b, n) for b, n, _ in ex.restore]
    ex.res.restored_bytes = sum(n for _b, n, _ in ex.restore)
    ex.res.expected = len(ex.expected)
    ex.res.expected_bytes = sum(n for _b, n, _ in ex.expected)

