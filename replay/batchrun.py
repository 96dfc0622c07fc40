"""The replay engine's batch runner (a part the Replayer composes): runs a plan's OpBatch items
(replay/plan.py) in the C executor (replay/executor.py) and keeps, in bulk, the bookkeeping
their handlers keep call by call: counters, last writers, current contexts, sync times, the
launch timestamps; hands a call to its handler when the executor cannot run it."""
from __future__ import annotations

import bisect
import queue
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Tuple

from . import plan
from .driverops import DriverCallError
from .executor import MISMATCH, NEED_SLOW
from .plan import OpBatch

if TYPE_CHECKING:
    from .driverops import Watchdog
    from .profrange import ProfilerRange

D2H_AHEAD_EACH = 1 << 20         # D2H expectations read ahead: at most this big each
D2H_AHEAD_TOTAL = 64 << 20       # and this much in all
SYNC_TIMES_MAX = 100_000         # synchronization times kept in the result


class _OpDesc:
    """The watchdog's description of a running batch: names the call in progress."""

    def __init__(self, ex, b: OpBatch):
        self.ex, self.b = ex, b

    def __str__(self) -> str:
        b = self.b
        try:
            i = min(max(0, self.ex.current()), b.n - 1)
        except Exception:
            i = 0
        return f"call #{b.recs[i].get('s')} {b.recs[i].get('f')}"

    __format__ = lambda self, spec: format(str(self), spec)  # noqa: E731



class RecordedThread:
    """The recorded thread of the last call replayed: a call of another thread makes that
    thread's current context current first (the per-call path and the batches share it)."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.last = None

    def switch(self, tid, follow: bool = True) -> None:
        if follow and tid != self.last and self.last is not None and tid in self.ctx.cur_ctx:
            try:
                self.ctx.raw("cuCtxSetCurrent", self.ctx.cur_ctx[tid])
            except DriverCallError:
                pass
        self.last = tid


class RecordedThreads:
    """--threads: each recorded thread replays on a thread of its own, one call at a time, in
    file order (a global turnstile); run(rec) returns once one(rec) has run there."""

    def __init__(self, one: Callable):
        self._one = one
        self._workers: Dict[Any, "queue.Queue"] = {}

    def run(self, rec) -> None:
        tid = rec.get("tid", 0)
        q = self._workers.get(tid)
        if q is None:
            q = queue.Queue()
            self._workers[tid] = q
            threading.Thread(target=self._worker, args=(q,), daemon=True, name=f"replay-tid-{tid}").start()
        done = threading.Event()
        box: List[BaseException] = []
        q.put((rec, done, box))
        done.wait()
        if box:
            raise box[0]

    def _worker(self, q) -> None:
        while True:
            item = q.get()
            if item is None:
                return
            rec, done, box = item
            try:
                self._one(rec)
            except BaseException as e:  # handed to the main thread
                box.append(e)
            finally:
                done.set()

    def stop(self) -> None:
        for q in self._workers.values():
            q.put(None)


class BatchRunner:
    """Runs the OpBatch items of one replay loop (engine.Replayer._loop makes it), given all it
    works with: the replay state (ctx), the C executor (None: every call through its handler)
    and the plan's slots; the per-call path (one: a call through its handler; error: record an
    error, stop unless --continue-on-error); the events (emit, the live subscribers list, the
    view); the watchdog, the profiler range (profrange.py), the recorded pace (pace_wait, None
    when fast; pace_base) and the recorded thread."""

    def __init__(self, ctx, executor, slots, *, one: Callable, error: Callable, ensure_init: Callable,
                 emit: Callable, subscribers: List[Any], view: Any, watchdog: Optional["Watchdog"],
                 prange: "ProfilerRange", pace_wait: Optional[Callable], pace_base: float, thread: RecordedThread):
        self.ctx, self._executor, self._slots = ctx, executor, slots
        self._one, self._error, self.ensure_init = one, error, ensure_init
        self.emit, self.subscribers, self.view = emit, subscribers, view
        self.watchdog, self.prange, self.thread = watchdog, prange, thread
        self.pace_wait, self.pace_base = pace_wait, pace_base
        self._moved_key: Any = None                      # the relocations _moved was computed for
        self._moved: List[Tuple[int, int]] = []          # recorded ranges replay had to move

    def _slow(self, b: OpBatch, start: int, end: int) -> None:
        """Ops [start, end) one by one through their handlers."""
        for i in range(start, end):
            rec = b.recs[i]
            if self.pace_wait is not None:
                self.pace_wait(rec)
            self._one(rec)
            self.prange.after(rec["s"])

    def _native_ok(self, b: OpBatch) -> bool:
        """May this batch run in the executor?  Not while a stream captures, with conditional
        graph handles to patch, with a function handle reused for another kernel, nor when an
        address it names lies in an allocation replay had to move (the handlers translate)."""
        if self._executor is None or b.ops is None or self.ctx.capturing or self.ctx.cond_handles:
            return False
        fv = self.ctx.fn_versions
        if fv and any(h in fv for h in b.funcs):
            return False
        sp = self.ctx.space
        if sp is not None and sp.relocations:
            key = (len(sp.relocations), len(sp.allocs))
            if self._moved_key != key:
                self._moved_key = key
                self._moved = [(a.rec_base, a.rec_base + max(a.size, 1)) for a in sp.allocs.values()
                               if a.live_base != a.rec_base]
            addrs = b.addrs
            for lo, hi in self._moved:
                j = bisect.bisect_left(addrs, lo)
                if j < len(addrs) and addrs[j] < hi:
                    return False
        for i in b.copies:     # cuMemcpy(Async): both ends must be replayed device memory
            a = b.recs[i]["a"]
            if sp is None or sp.find(a.get("src") or 0) is None or sp.find(a.get("dst") or 0) is None:
                return False
        return True

    @staticmethod
    def _op_addrs(b: OpBatch, i: int) -> Iterable[int]:
        k = b.kinds[i]
        a = b.recs[i]["a"]
        if k in plan.LAUNCHES:
            p = b.recs[i]["x"]["params"]
            return [int.from_bytes(p[o:o + 8], "little") for o in range(0, len(p) - 7, 8)]
        if plan.MEMSET8 <= k <= plan.MEMSET32_ASYNC:
            return [a["dstDevice"]]
        if k in (plan.COPY, plan.COPY_ASYNC):
            return [a["dst"], a["src"]]
        if k in (plan.COPY_DTOD, plan.COPY_DTOD_ASYNC):
            return [a["dstDevice"], a["srcDevice"]]
        if k == plan.D2H:
            return [a["srcDevice"]]
        return ()

    def run(self, b: OpBatch) -> None:
        """Replay a run of plain calls in file order: in the C executor when nothing needs
        per-call Python work, else call by call through the handlers."""
        self.ensure_init()
        if not self._native_ok(b):
            self._slow(b, 0, b.n)
            return
        self.thread.switch(b.tid)
        slots = self._slots
        vals = slots.values
        for sl, h, i in b.fslots:          # functions not looked up yet: resolve them now
            if vals[sl] == 0:
                try:
                    from .functions import resolve_function
                    resolve_function(self.ctx, b.recs[i], h)
                except Exception:
                    pass                    # its launch takes the handler: the error lands there
        ex = self._executor
        res = self.ctx.res
        n = b.n
        pos = 0
        while pos < n:
            end = n
            pr_at = None
            pr = self.prange
            if pr.on and pr.state != 2:
                pr_at = pr.split(b, pos)
                if pr_at is not None:
                    end = pr_at[0]
            if pos < end:
                if self.watchdog is not None:
                    self.watchdog.arm(_OpDesc(ex, b))
                l0 = res.launches
                try:
                    i, code, t_first, t_last, syncs = ex.run(b, pos, end, slots, self.pace_base)
                finally:
                    if self.watchdog is not None:
                        self.watchdog.disarm()
                self._account(b, pos, i, t_first, t_last, syncs)
                if self.subscribers and i > pos:
                    self.emit("batch", plan.BatchEvent(b, pos, i, l0, self.view))
                if i < end:
                    rec = b.recs[i]
                    if code in (NEED_SLOW, MISMATCH):
                        self._one(rec)
                        self._after_ctx_ops(b, i, i + 1)
                    else:
                        # as the handler's drv() reports it; a launch marked its writes first
                        res.last_seq = rec["s"]
                        if b.kinds[i] in plan.LAUNCHES:
                            self._marks_exact(b, i, i + 1)
                        self._error(rec, f"call #{rec['s']} {rec['f']}: {self.ctx.new_error_text(code, rec['f'])}")
                    pos = i + 1
                    continue
                pos = end
            if pr_at is not None:
                at, what = pr_at
                if what == "start":
                    pr.start(b.seq(at))
                else:
                    # the op at `at` - 1 was the last workload call: stop after it
                    pr.stop(b.seq(at - 1))

    def _account(self, b: OpBatch, s: int, e: int, t_first, t_last, syncs) -> None:
        """The counters and bookkeeping of ops [s, e) the executor ran, as their handlers keep them."""
        if e <= s:
            return
        res = self.ctx.res
        if s == 0 and e == b.n:
            c = b.counts
            res.calls += c["calls"]
            res.launches += c["launches"]
            res.skipped += c["skipped"]
            if c["d2h"]:
                res.d2h_verified += c["d2h"]
                res.d2h_bytes += c["d2h_bytes"]
            fam = res.by_family
            for k, v in c["fam"].items():
                fam[k] = fam.get(k, 0) + v
            if b.marks and self.ctx.space is not None:
                self._marks_apply(b.marks)
            if b.has_ctx_sync:
                self.ctx.keepalive.clear()
        else:
            fam = res.by_family
            for i in range(s, e):
                k = b.kinds[i]
                if k == plan.SKIP:
                    res.skipped += 1
                    continue
                res.calls += 1
                f = b.fams[i]
                fam[f] = fam.get(f, 0) + 1
                if k in plan.LAUNCHES:
                    res.launches += 1
                elif k == plan.SYNC_CTX:
                    self.ctx.keepalive.clear()
                elif k == plan.D2H:
                    res.d2h_verified += 1
                    res.d2h_bytes += b.recs[i]["a"]["ByteCount"]
            if self.ctx.space is not None:
                self._marks_exact(b, s, e)
        res.native_calls += e - s
        res.last_seq = b.seq(e - 1)
        if t_first is not None:
            if res.first_launch_mono is None:
                res.first_launch_mono = t_first
                res.first_launch_unix = time.time() - (time.monotonic() - t_first)
            res.last_launch_mono = t_last
        if syncs:
            room = SYNC_TIMES_MAX - len(res.sync_mono)
            if room > 0:
                seqs = [b.seq(i) for i in b.sync_idx if s <= i < e]
                res.sync_mono.extend([q, t] for q, t in zip(seqs[:room], syncs))
        if b.ctx_ops:
            self._after_ctx_ops(b, s, e)

    def _after_ctx_ops(self, b: OpBatch, s: int, e: int) -> None:
        """The context current on the batch's thread after ops [s, e) (the handlers' _current)."""
        for i in reversed(b.ctx_ops):
            if s <= i < e:
                if b.kinds[i] == plan.CTX_POP:          # as ctx_pop: whatever is current now
                    cur = self.ctx.cu.cuCtxGetCurrent()
                    self.ctx.cur_ctx[b.tid] = cur[1] if int(cur[0]) == 0 else self.ctx.cu.CUcontext(0)
                    return
                h = b.recs[i]["a"].get("ctx")
                ctx = self.ctx.handles.get(h) if h else self.ctx.cu.CUcontext(0)
                if ctx is not None:
                    self.ctx.cur_ctx[b.tid] = ctx
                return

    def _marks_apply(self, marks) -> None:
        """A whole batch's writes (plan.Planner._summarise), oldest first; copies read their
        source's writer as it was before the batch."""
        find = self.ctx.space.find
        pre = {}
        for m in marks:
            if m[2] == "c":
                al = find(m[3])
                pre[m[3]] = al.last_writer[1] if al is not None and al.last_writer else m[4]
        for m in marks:
            a = find(m[0])
            if a is None:
                continue
            kind = m[2]
            if kind == "k":
                a.last_writer = (m[1], self.ctx.kernel_name_of(m[3], m[1]))
            elif kind == "n":
                a.last_writer = (m[1], m[3])
            else:
                a.last_writer = (m[1], pre[m[3]])

    def _marks_exact(self, b: OpBatch, s: int, e: int) -> None:
        """Ops [s, e)'s writes, one by one, as their handlers mark them."""
        if self.ctx.space is None:
            return
        for i in range(s, e):
            k = b.kinds[i]
            rec = b.recs[i]
            a = rec["a"]
            seq = rec["s"]
            if k in plan.LAUNCHES:
                name = self.ctx.kernel_name_of(a["f"], seq)
                for v in self._op_addrs(b, i):
                    if v >= 0x10000:
                        self.ctx.mark_written(v, seq, name)
            elif plan.MEMSET8 <= k <= plan.MEMSET32_ASYNC:
                self.ctx.mark_written(a["dstDevice"], seq, rec["f"])
            elif plan.COPY_DTOD <= k <= plan.COPY_ASYNC:
                dst, src = self._op_addrs(b, i)
                al = self.ctx.space.find(src or 0)
                self.ctx.mark_written(dst, seq, al.last_writer[1] if al and al.last_writer else rec["f"])

