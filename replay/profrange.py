"""The profiler range of a replay (`--profiler-range recorded|workload`): a recorded
cuProfilerStart/Stop is called on replay, so a profiler collecting from them (nsys
--capture-range=cudaProfilerApi, ncu --profile-from-start off) sees the range the program asked
for; under `workload` those are ignored and the range opens right before the first workload
call and closes after the last one, once its work is done."""
from __future__ import annotations

from typing import Callable, Optional

from cudasnap.formats import cu_result_name
from cudasnap.formats.abi import base_name
from cudasnap.formats.vocab import in_class, is_workload

from . import plan
from .driverops import result_code
from .plan import OpBatch

PROFILER_RANGES = ("recorded", "workload")


class ProfilerRange:
    """on: --profiler-range workload; state 0 before the range, 1 inside, 2 after; last: the seq
    of the last workload call (the prescan finds it). guard(desc, fn) runs fn under the
    replay's watchdog."""

    def __init__(self, ctx, guard: Callable):
        self.ctx, self.guard = ctx, guard
        self.on = False
        self.state = 0
        self.last: Optional[int] = None

    def control(self, rec) -> None:
        """A recorded cuProfilerStart/Stop (the profiler handler calls it)."""
        f = base_name(rec.get("f") or "")
        p = self.ctx.res.profiler
        if not (in_class(f, "starts_profiler") or in_class(f, "stops_profiler")):
            return                                     # cuProfilerInitialize: deprecated, no effect
        if self.on:
            p["ignored"] = p.get("ignored", 0) + 1
            return
        self.call(f, rec.get("s"))

    def call(self, name: str, seq) -> bool:
        p = self.ctx.res.profiler
        try:
            code = result_code(getattr(self.ctx.cu, name)()[0])
        except Exception as e:                          # bindings without it: say so, go on
            self.ctx.note(f"{name}: {type(e).__name__}: {e}")
            return False
        if code != 0:
            self.ctx.note(f"{name}{f' (call #{seq})' if seq is not None else ''}: replay returned {cu_result_name(code)}")
            return False
        key = "starts" if in_class(name, "starts_profiler") else "stops"
        p[key] += 1
        edge = "first_seq" if key == "starts" else "last_seq"
        if seq is not None and (edge not in p or key == "stops"):
            p[edge] = seq
        return True

    def start(self, seq) -> None:
        """Right before the first workload call."""
        self.state = 1
        self.call("cuProfilerStart", seq)

    def stop(self, seq) -> None:
        """After the last workload call, once its work is done."""
        self.state = 2
        try:
            self.guard("cuCtxSynchronize before cuProfilerStop", lambda: self.ctx.cu.cuCtxSynchronize())
        except Exception:
            pass
        self.call("cuProfilerStop", seq)

    def before(self, f: str, seq) -> None:
        """Before call seq (f) runs: open the range at the first workload call."""
        if self.on and self.state == 0 and is_workload(f):
            self.start(seq)

    def after(self, seq) -> None:
        """After call seq ran (or was left out): close the range past the last workload call."""
        if self.state == 1 and isinstance(seq, int) and seq >= (self.last or 0):
            self.stop(seq)

    def split(self, b: OpBatch, pos: int):
        """Where in b[pos:] the range starts ("start", before the op) or stops ("stop", after op
        at-1), or None."""
        if self.state == 0:
            for i in range(pos, b.n):
                if b.kinds[i] != plan.SKIP and is_workload(b.recs[i]["f"]):
                    return i, "start"
            return None
        last = self.last or 0
        for i in range(pos, b.n):
            if b.kinds[i] != plan.SKIP and b.seq(i) >= last:
                return i + 1, "stop"
        return None
