"""Graph mode's sequence, recorded from the replay as it runs: the selected launches and the
memsets and copies between them (the operations the graph will hold), and the memory before
the first selected launch (every graph run starts from it).  A part of GraphProfiler
(graphmode.py), held as its `sequence`: given the profiler's configuration, warnings, summary
and progress phases, it keeps first_seq, last_seq, ops, launches, pre and skipped_ops, which
the profiler's phases read.

Two ways the replay runs the calls, and the sequence is recorded from both:
- call by call through the handlers: a "before_launch" event per launch (a LaunchEvent, which
  can relaunch itself) and a "copy" event per memset or copy;
- in the C executor (replay/batchrun.py), as timeline mode replays: a "batch" event after each
  run of plain calls, whose records give the launches (SeqLaunch: the live function, the
  recorded dimensions and parameters, which the executor used as they are) and the memsets and
  device-to-device copies.  Graph mode asks for the executor (`batch_ok`) when every launch is
  selected, and its timeline check can use CUPTI (or is off).

The memory before the first selected launch is saved at the last point the profiler gets
control before it: just before the launch when it runs call by call, else after the last call
that ran on its own before the executor's run that holds it (`after_call`: the allocations, the
module loads and the host-to-device copies of the program are such calls, never the
executor's).  A memset or device-to-device copy between that point and the first selected
launch (the prelude) is issued again after every restore, before the graph runs, so each run
starts from the memory the first launch saw."""
from __future__ import annotations

import ctypes
import os
import re
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Tuple

from cudasnap.formats.abi import base_name
from cudasnap.formats.callset import learn_kernel_name
from cudasnap.formats.layout import recorded_stream
from cudasnap.formats.vocab import in_class, is_graph_launch, is_launch, may_batch

from .. import dispatch
from ..collectives import is_collective
from ..group import ENV_RANK
from ..selection import track_capture
from cudasnap.formats.layout import sizeof
from ..params import LAUNCH_CONFIG, LaunchParams
from ..plan import COPY_ASYNC, LAUNCH_EX, LAUNCHES, MEMSET8
from .common import MemorySaver, ranges_for

PRE_PHASE = "saving memory before the sequence"
_MEMSET_RX = re.compile(r"cuMemset(D2D|D)(8|16|32)")
_MEMSET_VAL = {"8": "uc", "16": "us", "32": "ui"}
LAUNCH_ATTR_SIZE = sizeof("CUlaunchAttribute")
# Calls of the description's class may_batch (formats/vocab.py) may run in the C executor (the
# plan's op kinds, replay/plan.py); any other call with a handler runs on its own, with
# before_call/after_call events.
_COPY_KINDS = frozenset(range(MEMSET8, COPY_ASYNC + 1))


class SeqLaunch:
    """A selected launch the C executor ran: what graph mode's rows and relaunches need.  The
    executor runs a launch only with its recorded parameters (no moved memory, no conditional
    handles to patch), so those are the live ones."""
    __slots__ = ("seq", "index", "call", "name", "grid", "block", "shmem", "rec_stream", "rec_params", "function",
                 "_rp", "_attrs", "_nattr", "_ex", "_p")

    def __init__(self, rv, kind: int, rec, index: int):
        a = rec["a"]
        x = rec.get("x") or {}
        h = a.get("f")
        self._rp = rv
        self.seq, self.index, self.call = rec.get("s"), index, rec.get("f") or ""
        self.name = rv.kernel_name(h, self.seq)
        self.function = rv.bound_function(rv.resolve_function(rec, h))
        self.rec_params = bytes(x.get("params") or b"")
        self._ex = kind == LAUNCH_EX
        self._attrs, self._nattr = b"", 0
        if self._ex:
            v = LAUNCH_CONFIG.unpack_from(bytes(a["config"]))
            self.grid, self.block, self.shmem, hs, self._nattr = tuple(v[0:3]), tuple(v[3:6]), v[6], v[7], v[9]
            self._attrs = bytes(x.get("attrs") or b"")[:self._nattr * LAUNCH_ATTR_SIZE]
        else:
            g = a.get
            self.grid = (g("gridDimX", 1), g("gridDimY", 1), g("gridDimZ", 1))
            self.block = (g("blockDimX", 1), g("blockDimY", 1), g("blockDimZ", 1))
            self.shmem, hs = g("sharedMemBytes", 0), g("hStream")
        self.rec_stream = hs if isinstance(hs, int) else 0
        self._p: Optional[LaunchParams] = None

    @property
    def params(self) -> bytes:
        return self.rec_params

    def relaunch(self, stream) -> None:
        """The launch again, on `stream` (a capture copies the parameters: one buffer serves)."""
        rv = self._rp
        if self._p is None:
            self._p = LaunchParams(self.rec_params)
        p = self._p
        fn = rv.bound_function(self.function)
        if not self._ex or not self._nattr:      # no attributes: the same launch as cuLaunchKernel
            rv.call("cuLaunchKernel", fn, *self.grid, *self.block, self.shmem, stream, None, p.extra_ptr)
            return
        cu = rv.driver
        c = cu.CUlaunchConfig()
        c.gridDimX, c.gridDimY, c.gridDimZ = self.grid
        c.blockDimX, c.blockDimY, c.blockDimZ = self.block
        c.sharedMemBytes = self.shmem
        c.hStream = stream
        attrs = []
        for i in range(self._nattr):          # value-only attributes (the executor ran no other)
            at = cu.CUlaunchAttribute()
            ctypes.memmove(int(at.getPtr()), self._attrs[i * LAUNCH_ATTR_SIZE:(i + 1) * LAUNCH_ATTR_SIZE],
                           LAUNCH_ATTR_SIZE)
            attrs.append(at)
        if attrs:
            c.attrs = attrs
        c.numAttrs = len(attrs)
        rv.call("cuLaunchKernelEx", c, fn, None, p.extra_ptr)


def relaunch(ev, stream) -> None:
    """A recorded launch of the sequence again on `stream`: a SeqLaunch or a LaunchEvent."""
    if type(ev) is SeqLaunch:
        ev.relaunch(stream)
    else:
        ev.ctx.relaunch(stream)


def _runs_alone(rec) -> bool:
    """Does the replay run this call on its own (a handler, with after_call), never in the
    executor?  Calls it skips without a handler (queries, failed calls) are not counted."""
    f = rec.get("f") or ""
    h = dispatch.lookup(f)
    if h is None or (rec.get("r", 0) != 0 and not h.errors):
        return False
    return not may_batch(f)


class SequenceRecording:
    def __init__(self, cfg, warn: Callable[[str], None], info: Dict[str, Any], phase: Callable[..., Any]):
        self.cfg, self.warn, self.info, self.phase = cfg, warn, info, phase   # the profiler's
        self.rv = None
        self.sel = None
        self.first_seq: Optional[int] = None
        self.last_seq: Optional[int] = None
        self.ops: List[Tuple] = []               # ("launch", ev) | ("memset", name, args) | ("dtod", dst, src, n)
        self.launches: List[Any] = []            #   | ("htod", rec, dst, n)
        self.skipped_ops: Dict[str, int] = {}
        self.skipped_captured = 0
        self.pre: Optional[MemorySaver] = None
        self.pre_pending = False                 # the pre-state is still to be saved
        self.pre_after: Optional[int] = None     # saved no earlier than after this call
        self.pre_seq: Optional[int] = None       # saved after this call
        self.early: List[Tuple[int, Dict[str, Any]]] = []
        self.sel_params: List[bytes] = []
        self.collectives: List[int] = []
        self.graph_launch_seqs: List[int] = []
        self.due = False                         # the sequence is complete: the graph can be built
        self.in_job = False                      # a rank of a job: profiled at the replay's end

    # ------------------------------------------------------------------ before the replay
    def _between_collectives(self, selected, collectives):
        """A rank of a job, every launch selected: the longest stretch of launches between two
        collectives (a graph of one rank cannot run a collective apart from its peers'), said in
        a note; the ranks replay the rest as recorded."""
        runs, cur = [], []
        cs = sorted(collectives)
        j = 0
        for s, p in selected:
            while j < len(cs) and cs[j] < s:
                j += 1
                if cur:
                    runs.append(cur)
                    cur = []
            if j < len(cs) and cs[j] == s:
                continue
            cur.append((s, p))
        if cur:
            runs.append(cur)
        best = max(runs, key=len) if runs else selected
        self.warn(f"graph: a rank of a job: the {len(best)} launches of calls #{best[0][0]}..#{best[-1][0]} "
                  f"(the longest stretch between collectives) are profiled at the replay's end (calls that free "
                  f"memory wait until then), from the memory saved before them; select others with -s/-c or --calls")
        self.info["stretch"] = {"first": best[0][0], "last": best[-1][0], "launches": len(best),
                                "collectives": len(collectives)}
        return best

    def scan(self, rv, sel) -> None:
        """One pass over the recorded calls: the first and last selected launch, their recorded
        parameters (what the pre-state must hold), collectives and the program's own graph
        launches in between, and where the pre-state can be saved (pre_after: the last call
        before the first selected launch that runs on its own; early: memsets and copies
        after such calls, the prelude candidates)."""
        self.rv, self.sel = rv, sel
        in_capture: set = set()
        graph_launches: List[int] = []
        in_job = self.in_job = bool(os.environ.get(ENV_RANK))
        collectives: List[int] = []
        selected: List[Tuple[int, Optional[bytes]]] = []     # (seq, recorded parameters)
        alone: List[int] = []                      # seqs of calls that run on their own
        early: List[Tuple[int, Dict[str, Any]]] = []
        names: Dict[Any, str] = {}                 # function handle -> kernel name, as the recording went
        for rec in rv.snapshot.records(("c", "fn")):
            learn_kernel_name(names, rec)   # the replay has not read these yet: collectives are named here
            if rec.get("k") == "fn":
                continue
            f = rec.get("f") or ""
            if rec.get("incomplete"):
                continue
            s = rec.get("s")
            if self.first_seq is None and isinstance(s, int):     # before the first selected launch
                if _runs_alone(rec):
                    alone.append(s)
                elif rec.get("r", 0) == 0 and (in_class(f, "memset_group") or in_class(f, "copy_group")) \
                        and (rec.get("a") or {}).get("hStream") not in in_capture:
                    early.append((s, rec))
            if rec.get("r", 0) != 0:
                continue
            a = rec.get("a") or {}
            b = base_name(f)
            if track_capture(rec, in_capture):
                continue
            if is_graph_launch(b):
                graph_launches.append(s)
                continue
            if not is_launch(f):
                continue
            hs = recorded_stream(f, a)
            if hs and hs in in_capture:
                continue
            kname = names.get(a.get("f")) or rv.kernel_name(a.get("f"))
            if in_job and is_collective(kname):
                collectives.append(s)
            if self.sel.rec(rec, kname) and isinstance(s, int):
                if self.first_seq is None or s < self.first_seq:
                    self.first_seq = s
                if self.last_seq is None or s > self.last_seq:
                    self.last_seq = s
                p = (rec.get("x") or {}).get("params")
                selected.append((s, bytes(p) if p else None))
        self.collectives = collectives
        if collectives and selected and self.sel.everything:
            selected = self._between_collectives(selected, collectives)
            self.first_seq, self.last_seq = selected[0][0], selected[-1][0]
        self.sel_params.extend(p for _s, p in selected if p)
        self.graph_launch_seqs = graph_launches
        if self.first_seq is not None:
            before = [s for s in alone if s < self.first_seq]
            self.pre_after = max(before) if before else None
            lo = self.pre_after if self.pre_after is not None else -1
            self.early = [(s, r) for s, r in early if lo < s < self.first_seq]

    # ------------------------------------------------------------------ while the replay runs
    def record(self, kind: str, ev) -> None:
        """One replay event, before the graph is built."""
        if kind == "before_launch":
            # in the stretch only: a rank's stretch starts after a collective the selection holds
            if self.sel(ev) and isinstance(ev.seq, int) and self.first_seq <= ev.seq <= self.last_seq:
                if self.rv.stream_capturing(ev.rec_stream, ev.stream):
                    self.skipped_captured += 1       # a node of the program's own graph, not run now
                else:
                    if self.pre_pending:
                        self._save_pre(ev.seq, exact=True)
                    self.ops.append(("launch", ev))
                    self.launches.append(ev)
                    if ev.seq == self.last_seq:
                        self.due = True
        elif kind == "batch":
            self._add_batch(ev)
        elif kind == "after_call":
            s = ev.seq
            if self.pre_pending and isinstance(s, int) and s < self.first_seq \
                    and (self.pre_after is None or s >= self.pre_after):
                self._save_pre(s)
        elif kind == "copy" and self.ops and isinstance(ev.seq, int) and ev.seq <= self.last_seq:
            self._add_copy(ev.rec, ev)
        elif kind == "after_launch" and ev.seq == self.last_seq:
            self.due = True

    def _add_batch(self, ev) -> None:
        """A run of calls the executor ran: the selected launches, memsets and copies in it."""
        b = ev.batch
        first, last = self.first_seq, self.last_seq
        lo, hi = b.seq(ev.start), b.seq(ev.end - 1)
        if not isinstance(lo, int) or not isinstance(hi, int):
            return
        if hi < first:
            if self.pre_pending and (self.pre_after is None or hi >= self.pre_after):
                self._save_pre(hi)
            return
        if lo > last:
            self.due = True
            return
        if self.pre_pending:
            self.pre_pending = False
            self.warn(f"graph: the first selected launch (call #{first}) ran in a batch before the memory it "
                      f"starts from could be saved; graph runs start from the memory the sequence left")
        rv = self.rv
        for k, index, rec in ev.ops():
            s = rec.get("s")
            if not isinstance(s, int) or s < first or s > last:
                continue
            if k in LAUNCHES:
                try:
                    sl = SeqLaunch(rv, k, rec, index)
                except Exception as e:
                    self._skip(f"launch not relaunchable ({type(e).__name__})")
                    self.warn(f"graph: call #{s}: {type(e).__name__}: {e}; left out of the graph")
                    continue
                self.ops.append(("launch", sl))
                self.launches.append(sl)
            elif k in _COPY_KINDS and self.ops:
                self._add_copy(rec)
        if hi >= last:
            self.due = True

    def _save_pre(self, seq: int, exact: bool = False) -> None:
        """Memory before the first selected launch, saved after call #seq (exact: just before
        the launch): every graph run starts from it."""
        rv = self.rv
        if rv.capturing:
            if exact:
                self.pre_pending = False
                self.warn("graph: the first selected launch comes during a recorded stream capture: graph runs start "
                          "from the memory the sequence left (not restored to the pre-sequence state)")
            return
        self.pre_pending = False
        try:
            with self.phase(PRE_PHASE):
                rv.call("cuCtxSynchronize")
                evs = [SimpleNamespace(rec_params=p) for p in self.sel_params]
                pre = MemorySaver(rv, ranges_for(rv, evs, self.cfg.save_limit))
                pre.save()
            self.pre = pre
            self.pre_seq = seq
            rv.hold_frees()          # the graph runs after the sequence freed its memory
        except Exception as e:
            self.warn(f"graph: could not save memory before call #{self.first_seq} ({type(e).__name__}: {e}); graph "
                      f"runs start from the memory the sequence left")

    def _skip(self, what: str) -> None:
        self.skipped_ops[what] = self.skipped_ops.get(what, 0) + 1

    def _copy_op(self, rec, ev=None) -> Optional[Tuple]:
        """The graph operation of a memset/copy record; None for one that writes no device memory
        a later kernel reads (device-to-host) or that the graph cannot hold (counted)."""
        rv = self.rv
        if rec.get("r", 0) != 0:
            return None
        f = rec.get("f") or ""
        a = rec.get("a") or {}
        if ev is not None and "Async" in f and rv.stream_capturing(ev.rec_stream, ev.stream):
            return None
        b = base_name(f)
        m = _MEMSET_RX.match(b)
        if m:
            two_d, width = m.group(1) == "D2D", m.group(2)
            name = ("cuMemsetD2D" if two_d else "cuMemsetD") + width + "Async"
            dst = rv.translate(a.get("dstDevice"))
            val = a.get(_MEMSET_VAL[width], 0)
            args = [dst, a.get("dstPitch", 0), val, a.get("Width", 0), a.get("Height", 0)] if two_d \
                else [dst, val, a.get("N", 0)]
            return ("memset", name, args, rec.get("s"))
        n = int(a.get("ByteCount") or 0)
        if in_class(b, "d2d_copy"):
            return ("dtod", rv.translate(a.get("dstDevice")), rv.translate(a.get("srcDevice")), n, rec.get("s"))
        if in_class(b, "unified_copy"):
            if rv.find(a.get("dst") or 0) is not None and rv.find(a.get("src") or 0) is not None:
                return ("dtod", rv.translate(a.get("dst")), rv.translate(a.get("src")), n, rec.get("s"))
            self._skip(b)
            return None
        if in_class(b, "h2d_copy"):
            return ("htod", rec, rv.translate(a.get("dstDevice")), n, rec.get("s"))
        if "DtoH" in b or "AtoH" in b:
            return None                           # results for the host: nothing a later kernel reads
        self._skip(b)
        return None

    def _add_copy(self, rec, ev=None) -> None:
        """A memset/copy between the first and the last selected launch (after it ran)."""
        op = self._copy_op(rec, ev)
        if op is not None:
            self.ops.append(op)

    def prelude(self) -> List[Tuple]:
        """Memsets and device-to-device copies that ran between the save of the pre-state and
        the first selected launch: issued after every restore, before the graph."""
        if self.pre is None or self.pre_seq is None:
            return []
        out = []
        for s, rec in self.early:
            if s > self.pre_seq:
                b = base_name(rec.get("f") or "")
                if "DtoH" in b or "HtoD" in b:       # host copies run on their own: before the save
                    continue
                skipped = dict(self.skipped_ops)
                op = self._copy_op(rec)
                self.skipped_ops = skipped
                if op is not None and op[0] in ("memset", "dtod"):
                    out.append(op)
        return out

    def stage(self) -> List[int]:
        """Host-to-device payloads into device memory, before the capture (a capture may not
        read pageable host memory): one buffer and one copy for all of them, since an
        allocation per payload costs more than the graph for thousands of copies."""
        rv = self.rv
        parts: List[Tuple[int, bytes]] = []         # (index of the op, payload)
        total = 0
        for i, op in enumerate(self.ops):
            if op[0] != "htod":
                continue
            rec, n = op[1], op[3]
            data = rv.host_bytes(rec, "srcHost")
            if data is None or n == 0 or total + n > self.cfg.save_limit:
                self.ops[i] = ("skip",)
                self._skip("cuMemcpyHtoD")
                continue
            parts.append((i, rv.h2d_payload(rec, bytes(data))[:n]))
            total += -(-n // 256) * 256             # each payload 256-byte aligned, as cuMemAlloc's are
        bufs: List[int] = []
        if parts:
            host = bytearray(total)
            offs = []
            off = 0
            for _i, data in parts:
                host[off:off + len(data)] = data
                offs.append(off)
                off += -(-len(data) // 256) * 256
            buf = int(rv.call("cuMemAlloc", total))
            bufs.append(buf)
            rv.call("cuMemcpyHtoD", buf, host, total)
            for (i, _data), o in zip(parts, offs):
                self.ops[i] = self.ops[i][:5] + (buf + o,)
        self.ops = [op for op in self.ops if op[0] != "skip"]
        return bufs
