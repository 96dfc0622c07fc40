"""Records frames walked in C (cudasnap.formats._records, built from formats/records.c by
formats/build_records.py): dump lines, a scan's blob references and the summary's call counts
without a Python object per record.

The C walk hands every record it does not reproduce exactly to the Python code, which stays
the reference: a payload rd_check refuses is decoded the Python way (record_list, which
raises the SnapshotError it always raised), a record rd_run hands over is decoded alone and
given to the same Python function the pure-Python path calls. Without the module (not built,
or CUDASNAP_NATIVE_RECORDS=0) every caller takes the Python path, with the same results.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, Iterable, List, Optional

from .container import record_list, record_one
from .cuerrors import CURESULT_NAMES

DONE, FALLBACK, NEED, NOTE = 0, 1, 2, 3
M_TEXT, M_JSON, M_SCAN, M_SUMM, M_KINDS = range(5)
TAB_NAMES, TAB_BLOBS, TAB_FNS, TAB_REFS, TAB_HANDLES = range(5)
MEM_KINDS = ("H2D", "D2H", "D2D", "P2P", "unified", "memset", "alloc")
U64 = (1 << 64) - 1

_mod: Any = None
_resnames: Any = None


def module():
    """The cffi module, or None (not built, or turned off with CUDASNAP_NATIVE_RECORDS=0)."""
    global _mod, _resnames
    if os.environ.get("CUDASNAP_NATIVE_RECORDS", "1") == "0":
        return None
    if _mod is None:
        try:
            from . import _records  # type: ignore
        except Exception:
            _mod = False
        else:
            keep = {c: _records.ffi.new("char[]", n.encode()) for c, n in CURESULT_NAMES.items() if 0 <= c < 1000}
            arr = _records.ffi.new("const char *[1000]")
            for c, p in keep.items():
                arr[c] = p
            _resnames, _mod = (arr, keep), _records
    return _mod or None


class Walk:
    """One C walker (rd) in one mode, fed payloads one at a time (run)."""

    def __init__(self, mod, mode: int, blobs: bool = False, ranges: Iterable = (), errors: bool = False,
                 filtered: bool = False):
        self.ffi, self.lib = mod.ffi, mod.lib
        self.c = self.ffi.gc(self.lib.rd_new(), self.lib.rd_free)
        if self.c == self.ffi.NULL:
            raise MemoryError
        rs = [(lo, min(hi, U64)) for lo, hi in ranges if lo <= U64]
        lo = self.ffi.new("uint64_t[]", [a for a, _ in rs] or [0])
        hi = self.ffi.new("uint64_t[]", [b for _, b in rs] or [0])
        self._check(self.lib.rd_config(self.c, mode, int(blobs), int(filtered), int(errors), lo, hi, len(rs),
                                       _resnames[0]))
        self.disabled = False            # the rest goes the Python way (a record it cannot follow)

    @staticmethod
    def _check(rc: int) -> None:
        if rc < 0:
            raise MemoryError("cudasnap: out of memory in the records reader")

    def set(self, table: int, key: bytes, v: int = 0, s: Optional[bytes] = None) -> None:
        self._check(self.lib.rd_set(self.c, table, key, len(key), v, s if s is not None else self.ffi.NULL,
                                    len(s or b"")))

    def set_fn(self, h: int, sel: int, name: bytes) -> None:
        if not -U64 <= h <= U64:
            self.disabled = True
            return
        self._check(self.lib.rd_set_fn(self.c, int(h < 0), abs(h), sel, name, len(name)))

    def entries(self, table: int):
        """(key bytes, count) of a table's entries, in the order they were added."""
        key, klen, v2 = self.ffi.new("uint8_t **"), self.ffi.new("uint32_t *"), self.ffi.new("int64_t *")
        i = 0
        while self.lib.rd_entry(self.c, table, i, key, klen, v2):
            yield self.ffi.unpack(self.ffi.cast("char *", key[0]), klen[0]), v2[0]
            i += 1

    def run(self, payload: bytes, count: int, path: Any, offset: int, record: Callable[[dict], Any],
            need: Optional[Callable[[str], None]] = None, sync: Optional[Callable[[Any], None]] = None,
            out: Optional[Callable[[str], None]] = None, checked: bool = False) -> bool:
        """Walk one records frame. record(rec) gets each record handed over (decoded); a true
        result turns the walker off, and the frame's other records go to record too. need(name)
        classifies a function name; sync(c) takes the counters after each stretch; out(text)
        gets the lines made. False: the payload is not one C reads (the caller decodes it).
        checked: a walk already checked this payload (a scan's, kept by the reader)."""
        if self.disabled:
            return False
        ffi, lib, c = self.ffi, self.lib, self.c
        buf = ffi.from_buffer("uint8_t[]", payload)
        n = len(payload)
        if not checked and lib.rd_check(buf, n, count) != 0:
            return False
        pos = ffi.new("size_t *", 0)
        while True:
            rc = lib.rd_run(c, buf, n, pos)
            if c.outlen:
                out(str(ffi.buffer(c.out, c.outlen), "utf-8"))
                c.outlen = 0
            if sync is not None:
                sync(c)
            if rc == FALLBACK:
                start, end = pos[0], c.rec_end
                pos[0] = end
                c.idx += 1
                if record(record_one(payload[start:end], path, offset)):
                    self.disabled = True
                    for rec in record_list(payload[end:], count - c.idx, path, offset):
                        record(rec)
                    return True
            elif rc == NEED:
                need(ffi.unpack(ffi.cast("char *", c.key), c.keylen).decode())
            elif rc == DONE:
                return True
            elif rc != NOTE:
                self._check(-1)


# ---------------------------------------------------------------------------- scan

def scan_walk() -> Optional[Walk]:
    mod = module()
    return Walk(mod, M_SCAN) if mod else None


def scan_frame(w: Walk, payload: bytes, count: int, path: Any, offset: int,
               count_refs: Callable[[List[dict]], Dict[str, int]]):
    """(blob records, blob id -> references) of one records frame, or None (not one C reads)."""
    brecs: List[dict] = []
    refs: Dict[str, int] = {}

    def record(rec):
        if rec.get("k") == "b":
            brecs.append(rec)
        for b, k in count_refs([rec]).items():
            refs[b] = refs.get(b, 0) + k

    w.lib.rd_reset(w.c, TAB_REFS)
    if not w.run(payload, count, path, offset, record):
        return None
    for b, k in w.entries(TAB_REFS):
        b = b.decode()
        refs[b] = refs.get(b, 0) + k
    return brecs, refs


def kinds_walk(kinds) -> Optional[Walk]:
    """A walker handing over only records whose k is one of kinds (str), or None."""
    mod = module()
    if not mod or not all(type(k) is str for k in kinds):
        return None
    w = Walk(mod, M_KINDS)
    for k in kinds:
        try:
            w.set(TAB_NAMES, k.encode())
        except UnicodeEncodeError:
            return None
    return w


# ---------------------------------------------------------------------------- summary

def summarize(r, acc) -> None:
    """Feed every record of reader r to Summary acc: call records counted in C, the others
    (and the calls C hands over) through acc.add."""
    from .summary import name_class
    mod = module()
    w = Walk(mod, M_SUMM) if mod else None

    def need(name: str) -> None:
        acc.calls.setdefault(name, 0)          # the name's place among the calls: first seen
        w.set(TAB_NAMES, name.encode(), name_class(name))

    def sync(c) -> None:
        if c.nc:
            if not acc.nc:
                acc._c_at = len(acc.kinds)
            acc.nc += c.nc
            acc.n += c.n
            acc.errors += c.errors
            acc.unreturned += c.unreturned
            acc.state_calls += c.state_calls
            if c.has_t0 and c.t0 < acc._t0:
                acc._t0 = c.t0
            if c.has_t1 and c.t1 > acc._t1:
                acc._t1 = c.t1
            for k in range(len(MEM_KINDS)):
                if c.mem_n[k]:
                    m = acc.mem.setdefault(MEM_KINDS[k], [0, 0])
                    m[0] += c.mem_n[k]
                    m[1] += c.mem_b[k]
            if c.note == 1:
                acc.launches.setdefault(-c.hval if c.hneg else c.hval, 0)
            w.lib.rd_take(c)

    for off, count, payload, recs, checked in r.record_payloads():
        if recs is None and (w is None or not w.run(payload, count, r.path, off, acc.add, need, sync, checked=checked)):
            recs = record_list(payload, count, r.path, off)
        for rec in recs or ():
            acc.add(rec)
    if w is not None:
        for name, k in w.entries(TAB_NAMES):
            if k:
                acc.calls[name.decode()] += k
        for key, k in w.entries(TAB_HANDLES):
            h = int.from_bytes(key[1:], "little")
            acc.launches[-h if key[0] else h] += k


# ---------------------------------------------------------------------------- dump

class DumpWalk(Walk):
    """`cudasnap dump` lines made in C: M_TEXT or M_JSON, with the --calls terms
    (callset.parse_terms; None: every record) and the reader's blob sizes."""

    def __init__(self, mod, r, text: bool, blobs: bool, terms: Optional[list]):
        from .vocab import is_launch
        ts = terms or ()
        super().__init__(mod, M_TEXT if text else M_JSON, blobs,
                         [(t[1], U64 if t[2] is None else t[2]) for t in ts if t[0] == "seq"],
                         any(t[0] == "errors" for t in ts), terms is not None)
        self._by_name = [t[1] for t in ts if t[0] in ("group", "name")]
        self._kernel = [t[1] for t in ts if t[0] == "name"]
        self._all = terms is not None and not terms
        self._is_launch = is_launch
        for bid in r.blob_ids():
            self.set(TAB_BLOBS, bid.encode(), r.blob_size(bid))

    def need(self, name: str) -> None:
        sel = 1 if self._all or any(t(name) for t in self._by_name) else 0
        if self._kernel and self._is_launch(name):
            sel |= 2
        self.set(TAB_NAMES, name.encode(), sel)

    def fn(self, h: Any, name: str) -> bool:
        """A fn record's name for the launches after it; True when the walk cannot follow it."""
        try:
            if type(h) is not int:
                raise ValueError
            self.set_fn(h, int(any(m(name) for m in self._kernel)), name.encode())
        except (ValueError, UnicodeEncodeError):
            self.disabled = True
        return self.disabled


def dump_walk(r, text: bool, blobs: bool, terms: Optional[list]) -> Optional[DumpWalk]:
    mod = module()
    return DumpWalk(mod, r, text, blobs, terms) if mod else None
