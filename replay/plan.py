"""The replay plan: call records compiled once, in file order, into records the engine
dispatches one by one and OpBatch runs of plain calls the C executor (replay/executor.py)
runs in one call each.

A plain call is one whose handler does nothing but the driver call and some bookkeeping the
batch can do in bulk: launches with packed parameters, event record / stream wait, 1-D
memsets, device-to-device copies, synchronizations, context switches, and skipped queries.
Its handles are compiled to slots of a table the handlers fill as they create them
(SlotMap), so the plan can be compiled before any handle exists.  The original records are
kept: the engine replays an op through its handler when the executor cannot (a slot still
empty, a moved allocation, a subscriber that wants each call, an error)."""
from __future__ import annotations

import struct
from array import array
from collections import Counter
from itertools import compress
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

# op kinds: formats/opkinds.py, the one list the C executor and the C plan compiler are built from
from cudasnap.formats.opkinds import (OP_FORMAT, BATCH_MAX, COPY, COPY_ASYNC, COPY_DTOD, COPY_DTOD_ASYNC,  # noqa: F401
                                      CTX_POP, CTX_PUSH, CTX_SET, D2H, D2H_MAX, EVENT_RECORD, EVENT_RECORD_FLAGS,
                                      LAUNCH, LAUNCH_EX, MEMSET8, MEMSET8_ASYNC, MEMSET16, MEMSET16_ASYNC,
                                      MEMSET32, MEMSET32_ASYNC, SKIP, STREAM_WAIT, SYNC_CTX, SYNC_EVENT,
                                      SYNC_STREAM, by_handler)
from cudasnap.shim.description import load as load_description

from . import dispatch
from cudasnap.formats.layout import packer, sizeof
from .slots import Ranges, SlotMap, Slots  # noqa: F401  (the engine takes them from here)

LAUNCHES = (LAUNCH, LAUNCH_EX)
SYNCS = (SYNC_STREAM, SYNC_EVENT, SYNC_CTX)
CTX_OPS = (CTX_SET, CTX_PUSH, CTX_POP)
CU_STREAM_LEGACY, CU_STREAM_PER_THREAD = 1, 2
LAUNCH_CONFIG = packer("CUlaunchConfig")     # grid, block, shmem, hStream, attrs, numAttrs

PLAN_MAX_RECORDS = 200_000        # records dispatched one by one, kept from the prescan
PLAN_MAX_OPS = 2_000_000          # ops kept (else the engine compiles while it reads again)

# handler function name -> how its calls compile (base name -> kind)
_BY_HANDLER = by_handler()
_MEMSET_KEY = {MEMSET8: "uc", MEMSET16: "us", MEMSET32: "ui", MEMSET8_ASYNC: "uc", MEMSET16_ASYNC: "us",
               MEMSET32_ASYNC: "ui"}
_ASYNC = (MEMSET8_ASYNC, MEMSET16_ASYNC, MEMSET32_ASYNC, COPY_DTOD_ASYNC, COPY_ASYNC)
_LAUNCH_SET, _D2H_SET, _SYNC_SET = frozenset(LAUNCHES), frozenset((D2H,)), frozenset(SYNCS)
_CTX_SET, _COPY_SET = frozenset(CTX_OPS), frozenset((COPY, COPY_ASYNC))
# ops that neither write nor read device memory (_summarise passes over them)
_NO_WRITES = frozenset((EVENT_RECORD, EVENT_RECORD_FLAGS, STREAM_WAIT, SYNC_STREAM, SYNC_EVENT, SYNC_CTX, CTX_SET,
                        CTX_PUSH, CTX_POP))


_MISS = object()
_Z3 = (0, 0, 0)
_EMPTY = (0, 0, 0, 0, 0, 0, 0, _Z3, _Z3, 0, None)
_U64 = 1 << 64
# ex_op, packed as formats/opkinds.py OP_FIELDS lays it out (checked against ffi.sizeof)
OP = struct.Struct(OP_FORMAT)
OP_SIZE = OP.size


def _u32(v) -> bool:
    return type(v) is int and 0 <= v < (1 << 32)


class OpBatch:
    """Consecutive plain calls of one recorded thread.  recs[i] is op i's record, fams[i] its
    family (dispatch), kinds[i] its op kind; ops (cffi ex_op[]) is built by close()."""
    __slots__ = ("tid", "recs", "kinds", "fams", "ops", "keep", "funcs", "fslots", "copies", "marks", "counts",
                 "nsync", "sync_idx", "has_ctx_sync", "addrs", "ctx_ops", "n", "last_seq", "_params", "seqs")

    def __init__(self, tid):
        self.tid = tid
        self.recs: List[Dict[str, Any]] = []
        self.kinds = array("B")
        self.fams: List[str] = []
        self.ops = None
        self.keep: List[Any] = []
        self.funcs: Dict[int, int] = {}        # recorded function handle -> first op using it
        self.fslots: List[Tuple[int, int, int]] = []   # (slot, handle, first op) per function
        self.copies: List[int] = []            # cuMemcpy(Async) ops: both ends checked at run time
        self.marks: List[tuple] = []           # summary of the batch's writes (see _summarise)
        self.counts: Dict[str, Any] = {}
        self.nsync = 0
        self.sync_idx: List[int] = []
        self.addrs: List[int] = []             # sorted distinct addresses the ops name (moved-memory check)
        self.has_ctx_sync = False
        self.ctx_ops: List[int] = []
        self.n = 0
        self.last_seq = None
        self.seqs = None                       # op i's seq without its record (the C planner's)

    def seq(self, i: int):
        return self.seqs[i] if self.seqs is not None else self.recs[i].get("s")


class BatchEvent:
    """Ops [start, end) of `batch` ran in the C executor ("batch" event; only subscribers whose
    `batch_ok` is true are present then).  index: the launch ordinal of the first launch among
    them (LaunchEvent.index's numbering)."""
    __slots__ = ("batch", "start", "end", "index", "replay")

    def __init__(self, batch: "OpBatch", start: int, end: int, index: int, replay):
        self.batch, self.start, self.end, self.index, self.replay = batch, start, end, index, replay

    def ops(self) -> Iterator[Tuple[int, int, Dict[str, Any]]]:
        """(op kind, launch ordinal or -1, record) per op that ran, in order."""
        b = self.batch
        n = self.index
        for i in range(self.start, self.end):
            k = b.kinds[i]
            if k <= LAUNCH_EX and k != SKIP:
                yield k, n, b.recs[i]
                n += 1
            else:
                yield k, -1, b.recs[i]


# CUlaunchAttributeID values whose value holds no handle or address: passed to the driver as
# recorded (cooperative, synchronization policy, cluster dimension and scheduling, programmatic
# stream serialization, priority, memory sync domain and map, preferred cluster dimension,
# shared memory carveout)
_VALUE_ONLY_ATTRS = frozenset({2, 3, 4, 5, 6, 8, 9, 10, 11, 14})
LAUNCH_ATTR_SIZE = sizeof("CUlaunchAttribute")   # id, pad, 64-byte value union


def _plain_attrs(attrs, nattr: int) -> bool:
    if type(attrs) is not bytes or len(attrs) < nattr * LAUNCH_ATTR_SIZE:
        return False
    return all(int.from_bytes(attrs[i * LAUNCH_ATTR_SIZE:i * LAUNCH_ATTR_SIZE + 4], "little") in _VALUE_ONLY_ATTRS
               for i in range(nattr))


def _stream_ref(slots: Slots, f: str, hs) -> Optional[int]:
    """Executor ref of a recorded stream (Replayer.stream's rule); None: not compilable."""
    if not hs:
        return -((CU_STREAM_PER_THREAD if ("_ptsz" in f or "_ptds" in f) else 0) + 1)
    if hs in (CU_STREAM_LEGACY, CU_STREAM_PER_THREAD):
        return -(hs + 1)
    if type(hs) is not int:
        return None
    return slots.slot("h", hs)


def _handle_ref(slots: Slots, h) -> Optional[int]:
    if type(h) is not int or not h:
        return None
    return slots.slot("h", h)


class Planner:
    """Turns complete call records, in file order, into plan items: records (dispatched one by
    one) and OpBatch runs.  keep=True collects them (within PLAN_MAX_*; past them `keeping`
    turns False and the plan is dropped: the engine compiles again as it reads)."""

    def __init__(self, fast: bool, slots: Slots, ranges: Ranges, keep: bool = True, ffi=None, pace: bool = False,
                 expected=None):
        self.fast = fast
        self.slots = slots
        self.ranges = ranges
        self.keeping = keep
        if ffi is not None and (ffi.sizeof("ex_op") != OP_SIZE or ffi.offsetof("ex_op", "at") != OP_SIZE - 8):
            ffi = None                    # a layout this packing does not know: handlers only
        self.ffi = ffi
        self.expected = expected          # blob id -> expected D2H bytes (or None): verified in C
        self._scratch = ffi.new("char[]", D2H_MAX) if ffi is not None and expected is not None else None
        self.items: List[Any] = []
        self.cur: Optional[OpBatch] = None
        self.nrecs = self.nops = 0
        self.pace = pace
        self.t_origin: Optional[int] = None   # recorded t0 of the first call (--pace recorded)
        self._disp: Dict[str, Any] = {}
        self._params: Dict[bytes, Any] = {}
        self._memo: Dict[tuple, Any] = {}

    # ------------------------------------------------------------------ classification
    def _kind(self, f: str):
        """(op kind, family) of an ABI name, or None (dispatched one by one)."""
        k = self._disp.get(f, 0)
        if k != 0:
            return k
        h = dispatch.lookup(f)
        k = None
        if h is None:
            if dispatch.is_query(f):
                k = (SKIP, "")
        else:
            kinds = _BY_HANDLER.get(getattr(h.fn, "__name__", ""))
            if kinds:
                try:                          # the base name, from the API description
                    base = (load_description().by_name(f) or {}).get("base")
                except Exception:
                    base = None
                kk = kinds.get(base or "")
                if kk is not None:
                    k = (kk, h.family)
        self._disp[f] = k
        return k

    def _op(self, kind: int, rec) -> Optional[tuple]:
        """(val, r0, r1, rf, dst, src, n, grid, block, shmem, params) for a record of this
        kind (the ex_op fields), or None when it needs its handler."""
        a = rec.get("a")
        if type(a) is not dict:
            return None
        f = rec["f"]
        S = self.slots
        if kind <= LAUNCH_EX:
            x = rec.get("x")
            params = x.get("params") if type(x) is dict else None
            h = a.get("f")
            if type(params) is not bytes or type(h) is not int or not h or "hostmem" in x:
                return None
            if kind == LAUNCH:
                g = a.get
                dims = (g("gridDimX", 1), g("gridDimY", 1), g("gridDimZ", 1), g("blockDimX", 1), g("blockDimY", 1),
                        g("blockDimZ", 1), g("sharedMemBytes", 0))
                hs = g("hStream")
            else:
                cfg = a.get("config")
                if not isinstance(cfg, (bytes, bytearray)) or len(cfg) < LAUNCH_CONFIG.size:
                    return None
                v = LAUNCH_CONFIG.unpack_from(cfg)
                nattr = v[9]
                if nattr:                      # launch attributes: passed as recorded, when value-only
                    attrs = x.get("attrs") if type(x) is dict else None
                    if not _plain_attrs(attrs, nattr):
                        return None
                    attrs = attrs[:nattr * LAUNCH_ATTR_SIZE]
                dims, hs = v[:7], v[7]
            for d in dims:
                if type(d) is not int or not 0 <= d < 4294967296:
                    return None
            sr = _stream_ref(S, f, hs)
            if sr is None:
                return None
            if kind == LAUNCH_EX and nattr:     # attrs ride in the op's src/n fields
                return (0, sr, 0, S.slot("f", h), 0, attrs, nattr, dims[0:3], dims[3:6], dims[6], params)
            return (0, sr, 0, S.slot("f", h), 0, 0, 0, dims[0:3], dims[3:6], dims[6], params)
        if kind <= STREAM_WAIT:
            e = _handle_ref(S, a.get("hEvent"))
            sr = _stream_ref(S, f, a.get("hStream"))
            fl = a.get("flags", 0) if kind == EVENT_RECORD_FLAGS else a.get("Flags", 0) if kind == STREAM_WAIT else 0
            if e is None or sr is None or not _u32(fl):
                return None
            return (fl, e, sr, 0, 0, 0, 0, _Z3, _Z3, 0, None) if kind != STREAM_WAIT else \
                (fl, sr, e, 0, 0, 0, 0, _Z3, _Z3, 0, None)
        r0 = 0
        if kind <= MEMSET32_ASYNC:
            dst, val, n = a.get("dstDevice"), a.get(_MEMSET_KEY[kind], 0), a.get("N", 0)
            if type(dst) is not int or not _u32(val) or type(n) is not int or n < 0:
                return None
            src = 0
        elif kind <= COPY_ASYNC:
            if kind >= COPY:
                x = rec.get("x")
                if type(x) is dict and ("hostsrc" in x or "hostdst" in x):
                    return None
                dst, src = a.get("dst"), a.get("src")
            else:
                dst, src = a.get("dstDevice"), a.get("srcDevice")
            n = a.get("ByteCount", 0)
            if type(dst) is not int or type(src) is not int or type(n) is not int or n < 0:
                return None
            val = 0
        elif kind == SYNC_STREAM:
            sr = _stream_ref(S, f, a.get("hStream"))
            return None if sr is None else (0, sr, 0, 0, 0, 0, 0, _Z3, _Z3, 0, None)
        elif kind == SYNC_EVENT:
            e = _handle_ref(S, a.get("hEvent"))
            return None if e is None else (0, e, 0, 0, 0, 0, 0, _Z3, _Z3, 0, None)
        elif kind == SYNC_CTX:
            return _EMPTY
        elif kind == D2H:
            x = rec.get("x")
            ref = x.get("dstHost") if type(x) is dict else None
            src, n = a.get("srcDevice"), a.get("ByteCount", 0)
            if self._scratch is None or type(ref) is not dict or type(ref.get("blob")) is not str \
                    or type(src) is not int or type(n) is not int or not 0 < n <= D2H_MAX or not 0 <= src < _U64:
                return None
            data = self.expected(ref["blob"])
            if data is None or len(data) != n:
                return None
            return (0, 0, 0, 0, int(self.ffi.cast("uintptr_t", self._scratch)), src, n, _Z3, _Z3, 0, data)
        elif kind == CTX_POP:
            return _EMPTY
        elif kind in CTX_OPS:
            h = a.get("ctx")
            if type(h) is not int:
                return None
            return (0, S.slot("h", h) if h else -1, 0, 0, 0, 0, 0, _Z3, _Z3, 0, None)
        else:
            return None
        if kind in _ASYNC:
            r0 = _stream_ref(S, f, a.get("hStream"))
            if r0 is None:
                return None
        if not (0 <= dst < _U64 and 0 <= src < _U64 and n < _U64):
            return None
        return (val, r0, 0, 0, dst, src, n, _Z3, _Z3, 0, None)

    # ------------------------------------------------------------------ feeding
    def _compile(self, rec, get, f) -> Optional[tuple]:
        """(kind, family, op) of a call the batch runs, or None: dispatched one by one (not a
        plain call, a recorded error, or a damaged record, whose handler reports it)."""
        k = None
        if self.fast and type(f) is str:
            k = self._disp.get(f, 0)          # 0: not classified yet (None: dispatched one by one)
            if k == 0:
                k = self._kind(f)
        if k is None or type(get("s")) is not int:
            return None
        kind = k[0]
        if kind == SKIP:
            return kind, k[1], _EMPTY
        if get("r", 0) != 0:
            return None                       # a recorded error: its handler decides
        # the same call with the same arguments compiles the same (loops repeat them);
        # keys and values as two tuples: the items' order and pairing, fewer objects
        a, x = get("a"), get("x")
        try:
            mk = (f, tuple(a), tuple(a.values()), (tuple(x), tuple(x.values())) if type(x) is dict else None)
            op = self._memo.get(mk, _MISS)
        except (TypeError, AttributeError):
            mk, op = None, _MISS
        if op is _MISS:
            op = self._op(kind, rec)
            if mk is not None:
                if len(self._memo) > 200_000:
                    self._memo.clear()
                self._memo[mk] = op
        return None if op is None else (kind, k[1], op)

    def _feed(self, rec, out: List[Any]) -> None:
        """Feed one record; finished items are appended to out."""
        get = rec.get
        f = get("f") or ""
        if self.pace and self.t_origin is None and type(get("t0")) is int:
            self.t_origin = rec["t0"]
        c = self._compile(rec, get, f)
        if c is not None:
            kind, fam, op = c
            tid = get("tid")
            b = self.cur
            if b is None or b.tid != tid or b.n >= BATCH_MAX:
                if b is not None:
                    self._close(b)
                    out.append(b)
                b = self.cur = OpBatch(tid)
            b.recs.append(rec)
            b.kinds.append(kind)
            b.fams.append(fam)
            b.keep.append(op)
            b.n += 1
            self.nops += 1
            return
        if self.cur is not None:
            self._close(self.cur)
            out.append(self.cur)
            self.cur = None
        self.nrecs += 1
        out.append(rec)

    def _close(self, b: OpBatch) -> None:
        """Build the C op array, the counters and the write summary."""
        ffi = self.ffi
        n = b.n
        counts: Dict[str, Any] = {"calls": 0, "launches": 0, "skipped": 0, "fam": {}, "d2h": 0, "d2h_bytes": 0}
        fam_c = counts["fam"]
        kinds = b.kinds
        # counted per (kind, family) pair; the indices of the kinds that keep them, one pass each
        for (kind, fm), c in Counter(zip(kinds, b.fams)).items():   # first-seen order: fam_c's too
            if kind == SKIP:
                counts["skipped"] += c
                continue
            counts["calls"] += c
            fam_c[fm] = fam_c.get(fm, 0) + c
            if kind <= LAUNCH_EX:
                counts["launches"] += c
        present = set(kinds)
        recs = b.recs

        def where(want):
            return list(compress(range(n), map(want.__contains__, kinds))) if not present.isdisjoint(want) else []

        for i in where(_LAUNCH_SET):
            h = recs[i]["a"]["f"]
            if h not in b.funcs:
                b.funcs[h] = i
        for i in where(_D2H_SET):
            counts["d2h"] += 1
            counts["d2h_bytes"] += recs[i]["a"]["ByteCount"]
        b.sync_idx = where(_SYNC_SET)
        b.nsync = len(b.sync_idx)
        b.has_ctx_sync = SYNC_CTX in present
        b.ctx_ops = where(_CTX_SET)
        b.copies = where(_COPY_SET)
        keep: List[Any] = [self._scratch] if counts["d2h"] else []
        if ffi is not None:
            buf = bytearray(OP_SIZE * max(n, 1))
            pack = OP.pack_into
            cache = self._params
            t_origin = self.t_origin
            for i in range(n):
                val, r0, r1, rf, dst, src, cnt, grid, block, shm, params = b.keep[i]
                pp = size = 0
                if params:
                    ent = cache.get(params)
                    if ent is None:
                        cb = ffi.from_buffer(params)
                        ent = cache[params] = (cb, int(ffi.cast("uintptr_t", cb)))
                    keep.append(ent[0])
                    pp, size = ent[1], len(params)
                if type(src) is bytes:           # launch attributes (LAUNCH_EX): their address
                    ent = cache.get(src)
                    if ent is None:
                        cb = ffi.from_buffer(src)
                        ent = cache[src] = (cb, int(ffi.cast("uintptr_t", cb)))
                    keep.append(ent[0])
                    src = ent[1]
                at = 0.0
                if t_origin is not None:
                    t0 = b.recs[i].get("t0")
                    if type(t0) is int:
                        at = max(0.0, (t0 - t_origin) * 1e-9)
                pack(buf, i * OP_SIZE, kinds[i], 0, val, r0, r1, rf, dst, src, cnt, grid[0], grid[1], grid[2],
                     block[0], block[1], block[2], shm, pp, size, at)
            ops = ffi.new("ex_op[]", max(n, 1))
            ffi.memmove(ops, buf, len(buf))
            b.ops = ops
        if len(self._params) > 100_000:
            self._params = {}
        b.keep = keep
        b.last_seq = b.recs[-1]["s"] if n else None
        b.counts = counts
        b.fslots = [(self.slots.index[("f", h)], h, i) for h, i in b.funcs.items()]
        b.marks = self._summarise(b)

    def _summarise(self, b: OpBatch) -> List[tuple]:
        """What the batch writes, as the handlers' mark_written calls would leave it: per
        allocation (recorded ranges; else per address) the last write, in op order.  Entries:
        (addr, seq, "k", function handle) for a launch (named at apply time), (addr, seq, "n",
        name) for a memset, (addr, seq, "c", src address, name) for a copy whose source was
        not written earlier in the batch (its writer is read at apply time)."""
        last: Dict[int, tuple] = {}
        ranges_key = self.ranges.key
        kcache: Dict[int, Optional[int]] = {}     # the ranges stay as they are during one batch

        def key(v):
            kk = kcache.get(v, _MISS)
            if kk is _MISS:
                kk = kcache[v] = ranges_key(v)
            return kk

        words_cache: Dict[bytes, tuple] = {}
        addrs = set()
        for kind, rec in zip(b.kinds, b.recs):
            if kind < LAUNCH or kind in _NO_WRITES:
                continue
            seq = rec["s"]
            a = rec["a"]
            if kind in LAUNCHES:
                p = rec["x"]["params"]
                ws = words_cache.get(p)
                if ws is None:
                    ws = words_cache[p] = tuple(dict.fromkeys(
                        v for v in (int.from_bytes(p[o:o + 8], "little") for o in range(0, len(p) - 7, 8))
                        if v >= 0x10000))
                h = a["f"]
                addrs.update(ws)
                for v in ws:
                    kk = key(v)
                    last[v if kk is None else kk] = (v, seq, "k", h)
            elif MEMSET8 <= kind <= MEMSET32_ASYNC:
                v = a["dstDevice"]
                addrs.add(v)
                kk = key(v)
                last[v if kk is None else kk] = (v, seq, "n", rec["f"])
            elif kind == D2H:
                addrs.add(a["srcDevice"])
            elif COPY_DTOD <= kind <= COPY_ASYNC:
                dst, src = (a["dst"], a["src"]) if kind in (COPY, COPY_ASYNC) else (a["dstDevice"], a["srcDevice"])
                addrs.add(src)
                addrs.add(dst)
                ks, kd = key(src), key(dst)
                w = last.get(src if ks is None else ks)
                if w is None:
                    ent = (dst, seq, "c", src, rec["f"])
                elif w[2] == "c":
                    ent = (dst, seq, "c", w[3], w[4])
                else:
                    ent = (dst, seq) + w[2:]
                last[dst if kd is None else kd] = ent
        b.addrs = sorted(addrs)
        return sorted(last.values(), key=lambda e: e[1])

    def add(self, rec) -> None:
        self._feed(rec, self.items)
        if self.nrecs > PLAN_MAX_RECORDS or self.nops > PLAN_MAX_OPS:
            self.keeping = False
            self.items = []
            self.cur = None
            self._params = {}
            self._memo = {}

    def finish(self) -> List[Any]:
        if self.cur is not None:
            self._close(self.cur)
            self.items.append(self.cur)
            self.cur = None
        self._params = {}
        self._memo = {}
        return self.items

    def stream(self, recs: Iterable[Dict[str, Any]]) -> Iterator[Any]:
        out: List[Any] = []
        for rec in recs:
            self._feed(rec, out)
            if out:
                yield from out
                out.clear()
        if self.cur is not None:
            self._close(self.cur)
            yield self.cur
            self.cur = None
