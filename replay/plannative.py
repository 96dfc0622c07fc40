"""The pre-scan's plan compiled in C (replay/plan_walk.c, cudasnap.replay._plan): plain call records become
ex_op entries, batch counters and write summaries without a Python object per record; a
batch's records are decoded when something asks for them (LazyRecs).

Planner (replay/plan.py) stays the reference: every record the C walk is not sure about is
handed over, decoded, and fed to the same Python code, whose ops join the C batch (pl_push).
Without the module (not built, or CUDASNAP_NATIVE_RECORDS=0) the engine uses Planner alone."""
from __future__ import annotations

from array import array
from typing import Any, Callable, Dict, List, Optional

from cudasnap.formats import native
from cudasnap.formats.container import record_list, record_one

from . import plan
from .plan import BATCH_MAX, SKIP, OpBatch, Planner, OP

M_PLAN = 5
DONE, FALLBACK, NEED, SLOT, BLOB, CLOSE, LIMIT = 0, 1, 2, 4, 5, 6, 7
PLAIN, PTDS, WORK = 0x100, 0x200, 0x400
_U64 = 1 << 64
HANDED_MIN, HANDED_SKIP = 32, 4   # a frame whose records C mostly hands over: it and the next 4 go to Python


def _arr(code: str, buf) -> array:
    a = array(code)
    a.frombytes(buf)
    return a


def _list(cffi, p, n: int) -> list:
    return cffi.unpack(p, n) if n else []


def _split(v: int):
    """(negative, magnitude) of a msgpack-range int, or None."""
    if type(v) is not int or not -_U64 < v < _U64:
        return None
    return (1, -v) if v < 0 else (0, v)


class LazyRecs:
    """A batch's records: op i's record decoded from its span of a records frame when first
    asked for (records the Python planner compiled are kept as they are)."""
    __slots__ = ("n", "fr", "st", "en", "frames", "got", "path")

    def __init__(self, n, fr, st, en, frames, got, path):
        self.n, self.fr, self.st, self.en, self.frames, self.got, self.path = n, fr, st, en, frames, got, path

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Dict[str, Any]:
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(i)
        rec = self.got.get(i)
        if rec is None:
            payload, off = self.frames[self.fr[i]]
            rec = self.got[i] = record_one(payload[self.st[i]:self.en[i]], self.path, off)
        return rec

    def __iter__(self):
        for i in range(self.n):
            yield self[i]

    def each(self):
        """Every record, those not decoded yet decoded without being kept (the replay index)."""
        got, frames = self.got, self.frames
        for i in range(self.n):
            rec = got.get(i)
            if rec is None:
                payload, off = frames[self.fr[i]]
                rec = record_one(payload[self.st[i]:self.en[i]], self.path, off)
            yield rec


def module():
    """cudasnap.replay._plan, or None: not built, or the C walks turned off
    (CUDASNAP_NATIVE_RECORDS=0, which formats/native.py reads)."""
    if native.module() is None:          # the same switch; it also sets the walk's result names
        return None
    try:
        from . import _plan  # type: ignore
    except Exception:
        return None
    return _plan


class NativePlanner(Planner):
    """Planner with the C walk: walk() feeds one records frame; records it hands over go
    through record(rec), the engine's per-record pre-scan, which calls add() as before."""

    def __init__(self, mod, path, python_only: Callable[[str], int], workload: Optional[Callable[[str], bool]],
                 *args, **kw):
        super().__init__(*args, **kw)
        self.mod, self.path, self.python_only, self.workload = mod, path, python_only, workload
        self.w = native.Walk(mod, M_PLAN)
        cffi, self.lib = mod.ffi, mod.lib
        self.cffi = cffi
        scratch = int(self.ffi.cast("uintptr_t", self._scratch)) if self._scratch is not None else 0
        self.o = self.lib.pl_new(self.w.c, int(bool(self.pace)), scratch)
        if self.o == cffi.NULL:
            raise MemoryError
        self.o.max_ops = plan.PLAN_MAX_OPS
        self._names: Dict[str, int] = {}       # TAB_NAMES: name -> entry index
        self._name_list: List[str] = []
        self._fams: List[str] = []
        self._fam_of: Dict[str, int] = {}
        self._frames: Dict[int, tuple] = {}     # frame id -> (payload, file offset)
        self._frame = 0
        self._pyrecs: Dict[int, Dict[str, Any]] = {}   # open batch: op index -> record Python compiled
        self._pykeep: List[Any] = []
        self._weird_tid: Any = None
        self._expected_keep: List[Any] = []
        self._ranges_ver: Any = None
        self._skip = 0

    # ------------------------------------------------------------------ names, counters
    def _name_id(self, f: str) -> int:
        i = self._names.get(f)
        if i is None:
            k = self._kind(f) if self.fast else None
            v = 0
            if k is not None and not self.python_only(f):
                v = k[0] | PLAIN | (PTDS if ("_ptsz" in f or "_ptds" in f) else 0) | (self._fam_id(k[1]) << 16)
                if self.workload is not None and self.workload(f):
                    v |= WORK
            try:
                key = f.encode()
            except UnicodeEncodeError:         # not a name C can meet: its ops summarised in Python
                return -1
            self.w.set(native.TAB_NAMES, key, v)
            i = self._names[f] = len(self._name_list)
            self._name_list.append(f)
        return i

    def _fam_id(self, fam: str) -> int:
        i = self._fam_of.get(fam)
        if i is None:
            i = self._fam_of[fam] = len(self._fams)
            self._fams.append(fam)
        return i

    def take(self):
        """(calls, highest int seq or None, seq of the last workload call or None) the C walk
        counted since the last take."""
        o = self.o
        if not o.total:                        # nothing compiled in C since the last take
            return 0, None, None
        n, mx = o.total, (-o.max_u if o.max_neg else o.max_u) if o.has_max else None
        wl = (-o.wl_u if o.wl_neg else o.wl_u) if o.has_wl else None
        o.total = o.has_max = o.has_wl = 0
        return n, mx, wl

    def _origin_from_c(self) -> None:
        o = self.o
        if self.t_origin is None and o.has_origin:
            self.t_origin = -o.origin_u if o.origin_neg else o.origin_u

    # ------------------------------------------------------------------ the walk
    def walk(self, payload: bytes, count: int, offset: int, checked: bool, record: Callable[[dict], Any]) -> bool:
        """One records frame: C compiles what it can, record(rec) gets the others in order.
        False: not a payload C reads, or one left to Python (the caller decodes it)."""
        if self._skip:                          # the last frames were mostly handed over
            self._skip -= 1
            return False
        cffi, lib, c = self.cffi, self.lib, self.w.c
        buf = cffi.from_buffer("uint8_t[]", payload)
        n = len(payload)
        if not checked and lib.rd_check(buf, n, count) != 0:
            return False
        o = self.o
        self._frame += 1
        o.frame = self._frame
        self._frames[self._frame] = (payload, offset)
        pos = cffi.new("size_t *", 0)
        handed = 0
        while True:
            rc = lib.rd_run(c, buf, n, pos)
            if rc == DONE:
                return True
            if rc == FALLBACK or rc == LIMIT:
                if rc == FALLBACK:
                    start, end = pos[0], c.rec_end
                    pos[0] = end
                    c.idx += 1
                    record(record_one(payload[start:end], self.path, offset))
                    handed += 1
                else:
                    self._drop()
                # the plan is dropped, or most records need Python: the rest the Python way
                # (one decode for them all; the same results either way)
                if not self.keeping or (handed >= HANDED_MIN and 2 * handed > c.idx):
                    if self.keeping:
                        self._skip = HANDED_SKIP
                    for rec in record_list(payload[pos[0]:], count - c.idx, self.path, offset):
                        record(rec)
                    return True
            elif rc == NEED:
                self._name_id(cffi.unpack(cffi.cast("char *", c.key), c.keylen).decode())
            elif rc == SLOT:
                h = -c.hval if c.hneg else c.hval
                self.w._check(lib.pl_set_slot(c, o.slot_ns, c.hneg, c.hval, self.slots.slot("hf"[o.slot_ns], h)))
            elif rc == BLOB:
                key = cffi.unpack(cffi.cast("char *", c.key), c.keylen)
                data = self.expected(key.decode())
                if type(data) is bytes:
                    self._expected_keep.append(data)
                    cb = cffi.from_buffer(data)
                    self._expected_keep.append(cb)
                    self.w._check(lib.pl_set_blob(c, key, len(key), len(data), int(cffi.cast("uintptr_t", cb))))
                else:
                    self.w._check(lib.pl_set_blob(c, key, len(key), -1, 0))
            elif rc == CLOSE:
                self._close_native(self.items)
            else:
                self.w._check(-1)

    def _drop(self) -> None:
        self.keeping = False
        self.items = []
        self.cur = None
        self._params = {}
        self._memo = {}
        self.lib.pl_reset(self.w.c)
        self._pyrecs, self._pykeep, self._frames = {}, [], {}

    # ------------------------------------------------------------------ records Python compiles
    def _feed(self, rec, out: List[Any]) -> None:
        """Planner._feed with the C batch: the same _compile, ops pushed to the C walk's batch."""
        get = rec.get
        f = get("f") or ""
        o = self.o
        if self.pace and self.t_origin is None:
            self._origin_from_c()
            if self.t_origin is None and type(get("t0")) is int and _split(rec["t0"]):
                self.t_origin = rec["t0"]
                o.has_origin = 1
                o.origin_neg, o.origin_u = _split(self.t_origin)
        c = self._compile(rec, get, f)
        if c is not None:
            kind, fam, op = c
            tid = get("tid")
            if o.n and (o.n >= BATCH_MAX or self._tid() != tid):
                self._close_native(out)
            if not o.n:
                self._set_tid(tid)
            self._push(kind, fam, f, rec, op)
            return
        if o.n:
            self._close_native(out)
        self.nrecs += 1
        out.append(rec)

    def _tid(self):
        o = self.o
        if o.tid_kind == 0:
            return None
        if o.tid_kind == 1:
            return -o.tid_u if o.tid_neg else o.tid_u
        return self._weird_tid

    def _set_tid(self, tid) -> None:
        o = self.o
        sp = _split(tid) if type(tid) is int else None
        if tid is None:
            o.tid_kind = 0
        elif sp is not None:
            o.tid_kind, (o.tid_neg, o.tid_u) = 1, sp
        else:
            o.tid_kind, self._weird_tid = 2, tid     # the C walk hands this batch's records over

    def _push(self, kind: int, fam_name: str, f, rec, op) -> None:
        o = self.o
        val, r0, r1, rf, dst, src, cnt, grid, block, shm, params = op
        pp = size = 0
        cffi = self.cffi
        if params:
            cb = cffi.from_buffer(params)
            self._pykeep.append(cb)
            pp, size = int(cffi.cast("uintptr_t", cb)), len(params)
        if type(src) is bytes:                 # launch attributes (LAUNCH_EX): their address
            cb = cffi.from_buffer(src)
            self._pykeep.append(cb)
            src = int(cffi.cast("uintptr_t", cb))
        opb = OP.pack(kind, 0, val, r0, r1, rf, dst, src, cnt, grid[0], grid[1], grid[2], block[0], block[1],
                       block[2], shm, pp, size, 0.0)
        fam = self._fam_id(fam_name)
        name = self._name_id(f) if type(f) is str else -1         # -1: summarised in Python
        seq = _split(rec["s"])
        h = _split(rec["a"]["f"]) if kind <= plan.LAUNCH_EX and kind != SKIP else (0, 0)
        t0 = rec.get("t0") if self.pace else None
        t = _split(t0) if type(t0) is int else None
        if seq is None or h is None or name < 0:
            o.pysumm = 1
            seq, h = seq or (0, 0), h or (0, 0)
        i = o.n
        self.w._check(self.lib.pl_push(self.w.c, opb, kind, fam, name, seq[0], seq[1], h[0], h[1], int(t is not None),
                                       t[0] if t else 0, t[1] if t else 0))
        self._pyrecs[i] = rec

    # ------------------------------------------------------------------ closing a batch
    def _sync_ranges(self) -> None:
        r = self.ranges
        ver = (len(r.bases), getattr(r, "version", None))
        if ver == self._ranges_ver and ver[1] is not None:
            return
        self._ranges_ver = ver
        ok = all(type(b) is int and 0 <= b < _U64 and type(r.size[b]) is int for b in r.bases)
        self.o.ranges_ok = int(ok)
        if ok:
            cffi = self.cffi
            lo = cffi.new("uint64_t[]", r.bases or [0])
            sz = cffi.new("uint64_t[]", [s if s < _U64 else 0 for s in (max(r.size[b], 1) for b in r.bases)] or [0])
            self.w._check(self.lib.pl_ranges(self.w.c, lo, sz, len(r.bases)))

    def _close_native(self, out: List[Any]) -> None:
        cffi, lib, o = self.cffi, self.lib, self.o
        self._sync_ranges()
        self.w._check(lib.pl_close(self.w.c))
        n = o.n
        b = OpBatch(self._tid())
        b.n = n
        b.kinds = _arr("B", cffi.buffer(o.kinds, n))
        fams = self._fams
        b.fams = list(map(fams.__getitem__, _arr("H", cffi.buffer(o.fams, 2 * n))))
        fr = _arr("I", cffi.buffer(o.fr, 4 * n))
        frames = {i: self._frames[i] for i in set(fr) if i in self._frames}
        b.recs = LazyRecs(n, fr, _arr("I", cffi.buffer(o.st, 4 * n)), _arr("I", cffi.buffer(o.en, 4 * n)), frames,
                          self._pyrecs, self.path)
        counts = {"calls": o.calls, "launches": o.launches, "skipped": o.skipped,
                  "fam": {fams[o.fam_id[j]]: o.fam_n[j] for j in range(o.nfam)}, "d2h": o.d2h,
                  "d2h_bytes": o.d2h_bytes}
        b.funcs = {(-o.fn_u[j] if o.fn_neg[j] else o.fn_u[j]): o.fn_i[j] for j in range(o.nfuncs)}
        b.sync_idx = _list(cffi, o.sync_idx, o.nsync)
        b.nsync = o.nsync
        b.has_ctx_sync = bool(o.has_ctx_sync)
        b.ctx_ops = _list(cffi, o.ctx_idx, o.nctx)
        b.copies = _list(cffi, o.copy_idx, o.ncopy)
        keep: List[Any] = [self._scratch] if o.d2h else []
        arena = lib.pl_take_arena(self.w.c)      # the launch parameters the ops point at
        if arena != cffi.NULL:
            keep.append(cffi.gc(arena, lib.pl_free))
        if self.ffi is not None:
            raw = lib.pl_take_ops(self.w.c)     # the C array itself, freed with the batch
            if raw == cffi.NULL:
                raise MemoryError
            raw = cffi.gc(raw, lib.pl_free)
            keep.append(raw)
            b.ops = self.ffi.cast("ex_op *", int(cffi.cast("uintptr_t", raw)))
            keep.extend(self._pykeep)
            keep.extend(p for p, _ in frames.values())
            if o.d2h:
                keep.append(self._expected_keep)
        b.keep = keep
        b.last_seq = (-o.last_u if o.last_neg else o.last_u) if n else None
        if o.seqs_ok and not o.pysumm:
            b.seqs = _arr("q", cffi.buffer(o.seqs, 8 * n))
        b.counts = counts
        b.fslots = [(self.slots.index[("f", h)], h, i) for h, i in b.funcs.items()]
        if o.pysumm or not o.ranges_ok:
            if o.pysumm:
                b.last_seq = b.recs[-1]["s"] if n else None
            b.marks = self._summarise(b)
        else:
            names = self._name_list
            marks = []
            for j in range(o.nmarks):
                m = o.marks[j]
                seq = -m.seq_u if m.seq_neg else m.seq_u
                t = m.type
                if t == 107:          # "k"
                    marks.append((m.addr, seq, "k", -m.h_u if m.h_neg else m.h_u))
                elif t == 110:        # "n"
                    marks.append((m.addr, seq, "n", names[m.name]))
                else:
                    marks.append((m.addr, seq, "c", m.src, names[m.name]))
            b.marks = marks
            b.addrs = _list(cffi, o.addrs, o.naddrs)
        lib.pl_reset(self.w.c)
        self._pyrecs, self._pykeep = {}, []
        cur = self._frames.get(self._frame)
        self._frames = {self._frame: cur} if cur is not None else {}
        out.append(b)

    # ------------------------------------------------------------------ Planner's interface
    def add(self, rec) -> None:
        self._feed(rec, self.items)
        if self.nrecs > plan.PLAN_MAX_RECORDS or self.o.nops > plan.PLAN_MAX_OPS:
            self._drop()

    def finish(self) -> List[Any]:
        self._origin_from_c()
        if self.o.n:
            self._close_native(self.items)
        self._params = {}
        self._memo = {}
        self._frames = {}
        return self.items
