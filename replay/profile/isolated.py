"""`--profile isolated`: each selected launch runs warmup + repeat more times, its memory
restored to the pre-launch contents before every run, as Nsight Compute's kernel replay does.

Which memory a launch writes is not known, so (like NCU) everything it could touch is saved:
every live replayed allocation when they all fit in `save_limit` bytes, else every allocation
a pointer-sized parameter points into.  Saved copies live in device memory (cuMemAlloc +
cuMemcpyDtoD) and are copied back on the launch's stream before each run.  Every run starts
from the pre-launch contents, so after the last one memory holds exactly one application of
the kernel, and replay (with its D2H verification) continues as recorded.

Timing: CUPTI kernel activity records (cupti-python; the same source as timeline mode) give
each run's kernel duration on the GPU, without launch latency or the restore copies.  Each run
is: restore the saved memory (and flush L2 with --flush-l2) on the launch's stream, synchronize,
CUPTI timestamp, launch, synchronize, CUPTI timestamp; a kernel record belongs to the run whose
window holds it (graphunits.match_windows: no correlation ids needed).  A launch whose runs got
no CUPTI record is timed again with CUDA events (with a warning); without CUPTI, CUDA events
around each run are the timing (with a warning: they include launch gaps, so they read higher
and spread more).  A launch that could not be timed at all is a row with an error.  Spread over
the timed repeats is reported as (max - min) / median (spread_pct) and as the interquartile
range (iqr_pct) and the relative standard deviation (noise_pct, nvbench's "Noise").

Launches recorded into a stream capture are graph nodes, not run when replayed: the program's
cuGraphLaunch calls are timed instead, each as a unit (graphunits.py), with the memory the graph
can write restored before every run; CUPTI gives a row per kernel node (unit="graph")."""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..group import ENV_RANK
from .common import MemorySaver, Selection, base_row, ranges_for, replays_alone, save_before, stats  # noqa: F401  (re-exported)
from .graphunits import GraphUnit, RecordedGraphs, WindowClock, is_graph_launch, unit_rows
from .timeline import open_cupti

# Reads a buffer through L2 (16-byte loads, grid-stride); stores only if the xor of everything
# read equals a value the zeroed buffer never gives, so the loads are not optimized away.
_SCRUB_PTX = b"""
.version 6.0
.target sm_52
.address_size 64
.visible .entry cudasnap_l2_scrub(.param .u64 buf, .param .u64 nvec, .param .u64 sink)
{
    .reg .pred %p;
    .reg .b32 %a<5>, %x, %t, %nt, %c, %nc;
    .reg .b64 %base, %n, %i, %stride, %addr, %off, %sk;
    ld.param.u64 %base, [buf];
    ld.param.u64 %n, [nvec];
    ld.param.u64 %sk, [sink];
    mov.u32 %t, %tid.x;
    mov.u32 %nt, %ntid.x;
    mov.u32 %c, %ctaid.x;
    mov.u32 %nc, %nctaid.x;
    mul.wide.u32 %i, %c, %nt;
    cvt.u64.u32 %off, %t;
    add.u64 %i, %i, %off;
    mul.wide.u32 %stride, %nc, %nt;
    mov.b32 %x, 0;
LOOP:
    setp.ge.u64 %p, %i, %n;
    @%p bra DONE;
    shl.b64 %off, %i, 4;
    add.u64 %addr, %base, %off;
    ld.global.v4.u32 {%a1, %a2, %a3, %a4}, [%addr];
    xor.b32 %x, %x, %a1;
    xor.b32 %x, %x, %a2;
    xor.b32 %x, %x, %a3;
    xor.b32 %x, %x, %a4;
    add.u64 %i, %i, %stride;
    bra LOOP;
DONE:
    setp.ne.u32 %p, %x, 0x9e3779b9;
    @%p bra END;
    st.global.u32 [%sk], %x;
END:
    ret;
}
"""


class L2Flusher:
    """Starts a run from an L2 that holds none of the program's data and no dirty lines.

    A memset of twice the L2 evicts everything but leaves L2 full of dirty lines, which the
    timed kernel may then have to write back. So the flush is a read of a zeroed buffer twice
    the L2's size by a small PTX kernel: dirty lines (the restore's and any earlier) are
    written back before the run's window opens, and L2 holds only clean, unrelated lines. In
    one side-by-side run this gave the lower worst-case spread (3.3% vs 4.2% for the memset).
    Where the kernel cannot be loaded, or CUDASNAP_L2_FLUSH=memset asks for it (for
    comparisons), the memset is used."""

    def __init__(self, rv):
        self.rv = rv
        cu = rv.driver
        try:
            l2 = int(rv.call("cuDeviceGetAttribute", cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, rv.device))
        except Exception:
            l2 = 0
        self.size = max(2 * l2, 8 << 20)
        self.buf = int(rv.call("cuMemAlloc", self.size))
        self.n = 0
        self.mode = "memset"
        self.module = None
        if os.environ.get("CUDASNAP_L2_FLUSH", "read") == "memset":
            return
        try:
            rv.call("cuMemsetD8", self.buf, 0, self.size)
            self.module = rv.call("cuModuleLoadData", _SCRUB_PTX + b"\0")
            self.fn = rv.call("cuModuleGetFunction", self.module, b"cudasnap_l2_scrub")
            sms = int(rv.call("cuDeviceGetAttribute", cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, rv.device))
            from ..params import LaunchParams
            self.params = LaunchParams((self.buf).to_bytes(8, "little") + (self.size // 16).to_bytes(8, "little")
                                       + (self.buf).to_bytes(8, "little"))
            self.grid = max(1, sms) * 4
            self.mode = "read"
        except Exception:
            pass

    def flush(self, stream) -> None:
        if self.mode == "read":
            self.rv.call("cuLaunchKernel", self.fn, self.grid, 1, 1, 256, 1, 1, 0, stream, None, self.params.extra_ptr)
            return
        self.n += 1
        self.rv.call("cuMemsetD8Async", self.buf, self.n & 0xFF, self.size, stream)

    def close(self) -> None:
        for name, h in (("cuMemFree", self.buf), ("cuModuleUnload", self.module)):
            if h is None:
                continue
            try:
                self.rv.call(name, h)
            except Exception:
                pass


EVENT_WARNING = ("isolated: CUPTI (cupti-python) is not available: timing repeats with CUDA events, which include "
                 "launch gaps (higher, noisier times); install cupti-python for kernel durations from CUPTI")


class IsolatedProfiler:
    mode = "isolated"
    label = "isolated profiler"
    wants_calls = False          # set in start when the recording launches graphs (cuGraphLaunch)
    CUPTI_GIVE_UP = 3            # profiled launches in a row without any CUPTI record: events from then on

    def __init__(self, cfg, warn: Callable[[str], None]):
        self.cfg = cfg
        self.warn = warn
        self.rv = None
        self.sel = None
        self.rows: List[Dict[str, Any]] = []
        self.units: List[Dict[str, Any]] = []
        self.flusher: Optional[L2Flusher] = None
        self.saved_bytes = 0
        self.backend = "events"
        self.cupti = None
        self.graphs = None
        self.skipped_captured = 0
        self.skipped_collectives = 0
        self.in_job = bool(os.environ.get(ENV_RANK))
        self._pending_units: Dict[Any, Any] = {}
        self._cupti_misses = 0          # consecutive launches without any CUPTI record
        self._cupti_dead = False
        self._events_fallbacks = 0
        self._lost_runs = 0
        self._closed = False

    def on_event(self, kind: str, ev) -> None:
        if kind == "start":
            self.rv = ev.replay
            self.sel = Selection(self.cfg, self.rv)
            self.cupti = open_cupti(self.cfg.backend, self.warn)
            if self.cupti is not None:
                self.backend = "cupti"
            else:
                self.warn(EVENT_WARNING)
            try:
                self.graphs = RecordedGraphs(self.rv)
                self.wants_calls = bool(self.graphs.launches)
            except Exception as e:
                self.warn(f"isolated: could not scan the recording's graphs ({type(e).__name__}: {e})")
        elif kind == "before_launch" and self.sel(ev):
            # captured launches are timed with their cuGraphLaunch; collectives run once, in place
            if not replays_alone(self, ev, "isolated", "not timed (--profile timeline times them)"):
                return
            self._save(ev)
        elif kind == "after_launch" and "isolated" in ev.data:
            self._repeat(ev)
        elif kind == "before_call":
            self._before_graph_launch(ev)
        elif kind == "after_call":
            if self._pending_units:
                unit = self._pending_units.pop(ev.seq, None)
                if unit is not None:
                    self._repeat_unit(unit)
        elif kind in ("teardown", "end"):
            if self.flusher is not None:
                self.flusher.close()
                self.flusher = None
            if kind == "end":
                self._close()

    # ------------------------------------------------------------------ plain launches
    def _save(self, ev) -> None:
        save_before(self, ev, "isolated")

    _base_row = staticmethod(base_row)

    def _use_cupti(self) -> bool:
        return self.cupti is not None and not self._cupti_dead

    def _cupti_result(self, got_any: bool, what: str) -> None:
        """Count launches whose runs got no CUPTI record; give CUPTI up after a few in a row."""
        if got_any:
            self._cupti_misses = 0
            return
        self._cupti_misses += 1
        self._events_fallbacks += 1
        if self._cupti_misses >= self.CUPTI_GIVE_UP and not self._cupti_dead:
            self._cupti_dead = True
            self.warn(f"isolated: CUPTI delivered no kernel record for the last {self._cupti_misses} profiled "
                      f"launches (latest: {what}): timing the rest with CUDA events")

    def _repeat(self, ev) -> None:
        rv, cfg = self.rv, self.cfg
        saver: MemorySaver = ev.data.pop("isolated")
        row = self._base_row(ev, saver)
        try:
            if cfg.flush_l2 and self.flusher is None:
                self.flusher = L2Flusher(rv)
            digests: List[str] = []
            done = False
            if self._use_cupti():
                runs = self._windowed_runs(ev, saver, digests)
                times = [sum(t1 - t0 for t0, t1, _n in run) / 1e3 for run in runs if run]
                self._lost_runs += len(runs) - len(times)
                self._cupti_result(bool(times), f"call #{ev.seq} {ev.name}")
                if times:
                    row["times_us"] = times
                    row["cupti_name"] = next(run[0][2] for run in runs if run)
                    row["timing"] = "cupti"
                    row.update(stats(times))
                    done = True
                else:
                    digests = []
            if not done:
                times = self._events_runs(ev, saver, digests)
                row["times_us"] = times
                row["timing"] = "events"
                row.update(stats(times))
            if cfg.check_repeats:
                row["repeats_identical"] = len(set(digests)) <= 1
                if not row["repeats_identical"]:
                    self.warn(f"isolated: call #{ev.seq} {ev.name}: written memory differs between repeats "
                              f"(nondeterministic kernel, or it writes memory outside what was saved)")
        except Exception as e:
            self.warn(f"isolated: call #{ev.seq} {ev.name}: {type(e).__name__}: {e}")
            row["error"] = str(e)
            try:  # leave memory as one run of the kernel left it, if we can
                rv.call("cuCtxSynchronize")
            except Exception:
                pass
        finally:
            saver.free()
        if "median_us" not in row and "error" not in row:
            row["error"] = "no timing: neither CUPTI nor CUDA events gave a time for its runs"
        self.rows.append(row)

    def _windowed_runs(self, ev, saver, digests: List[str]):
        """Each run alone in a CUPTI time window: restore (and flush), wait, mark, launch, wait, mark."""
        rv, cfg, s = self.rv, self.cfg, ev.stream
        clock = WindowClock(self.cupti)
        clock.start()
        windows = []
        for i in range(cfg.warmup + cfg.repeat):
            saver.restore(s)
            if self.flusher is not None:
                self.flusher.flush(s)
            rv.call("cuStreamSynchronize", s)
            m0 = clock.mark() if i >= cfg.warmup else None
            ev.ctx.relaunch()
            if m0 is not None:
                rv.call("cuStreamSynchronize", s)
                windows.append((m0, clock.mark()))
            if cfg.check_repeats and i >= cfg.warmup:
                digests.append(saver.digest())
        rv.call("cuStreamSynchronize", s)
        return clock.collect(windows)

    def _events_runs(self, ev, saver, digests: List[str]) -> List[float]:
        """Queued back to back (no host wait): the event pair sits right around the kernel."""
        rv, cfg = self.rv, self.cfg
        s = ev.stream
        evs: List[Tuple] = []
        try:
            for i in range(cfg.warmup + cfg.repeat):
                saver.restore(s)
                if self.flusher is not None:
                    self.flusher.flush(s)
                e0 = rv.call("cuEventCreate", 0)
                e1 = rv.call("cuEventCreate", 0)
                evs.append((e0, e1) if i >= cfg.warmup else (e0, e1, "warmup"))
                rv.call("cuEventRecord", e0, s)
                ev.ctx.relaunch()
                rv.call("cuEventRecord", e1, s)
                if cfg.check_repeats and i >= cfg.warmup:
                    digests.append(saver.digest())
            rv.call("cuCtxSynchronize")
            return [float(rv.call("cuEventElapsedTime", p[0], p[1])) * 1e3 for p in evs if len(p) == 2]
        finally:
            for p in evs:
                for e in p[:2]:
                    try:
                        rv.driver.cuEventDestroy(e)
                    except Exception:
                        pass

    # ------------------------------------------------------------------ the program's graphs
    def _before_graph_launch(self, ev) -> None:
        if self.graphs is None or not is_graph_launch(ev.call):
            return
        rec = ev.rec
        if rec.get("r", 0) != 0 or not self.graphs.selected(self.sel, rec):
            return
        rv = self.rv
        names = self.graphs.kernel_names(rec)
        base = {"seq": ev.seq, "name": f"cuGraphLaunch #{ev.seq}", "unit": "graph", "kernels_recorded": len(names)}
        if rv.capturing:              # launched into a capture being rebuilt: not run now
            return
        saver = self.graphs.saver(rec, self.cfg.save_limit)
        if not saver.ranges:
            self.warn(f"isolated: call #{ev.seq} cuGraphLaunch: the memory its graph can write is not known "
                      f"(no live allocation, or more than the save limit and no recorded kernel parameters); "
                      f"not profiled")
            self.rows.append(base | {"error": "memory the graph writes is not known"})
            return
        try:
            saver.save()
            unit = GraphUnit(rv, rec, saver, names)
        except Exception as e:
            saver.free()
            self.warn(f"isolated: call #{ev.seq} cuGraphLaunch: could not prepare ({type(e).__name__}: {e}); "
                      f"not profiled")
            self.rows.append(base | {"error": f"not prepared: {e}"})
            return
        self.saved_bytes = max(self.saved_bytes, saver.nbytes)
        self._pending_units[ev.seq] = unit

    def _repeat_unit(self, unit) -> None:
        rv, cfg = self.rv, self.cfg
        base = {"seq": unit.seq, "name": f"cuGraphLaunch #{unit.seq}", "unit": "graph",
                "kernels_recorded": len(unit.names), "saved_bytes": unit.saver.nbytes}
        info: Dict[str, Any] = {"seq": unit.seq, "kernels_recorded": len(unit.names)}
        try:
            if cfg.flush_l2 and self.flusher is None:
                self.flusher = L2Flusher(rv)
            rows: List[Dict[str, Any]] = []
            if self._use_cupti():
                runs = unit.run_cupti(self.cupti, cfg.warmup, cfg.repeat, self.flusher)
                rows, info = unit_rows(unit, runs, cfg.repeat, "isolated")
                self._lost_runs += cfg.repeat - info["runs_with_records"]
                self._cupti_result(bool(rows), f"call #{unit.seq} cuGraphLaunch")
                if self.sel.name_filter:
                    rows = [r for r in rows if self.sel.matches_name(r["name"])] or rows
                for r in rows:
                    r["saved_bytes"] = unit.saver.nbytes
                info["timing"] = "cupti"
            if not rows:
                times = unit.run_events(cfg.warmup, cfg.repeat, self.flusher)
                rows = [base | {"times_us": times, "timing": "events", **stats(times)}]
                info["timing"] = "events"
                if times:
                    info["graph_us"] = rows[0]["median_us"]
            self.rows.extend(rows)
        except Exception as e:
            self.warn(f"isolated: call #{unit.seq} cuGraphLaunch: {type(e).__name__}: {e}")
            self.rows.append(base | {"error": str(e)})
            info["error"] = str(e)
            try:
                rv.call("cuCtxSynchronize")
            except Exception:
                pass
        finally:
            unit.saver.free()
        self.units.append(info)

    # ------------------------------------------------------------------ results
    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for unit in self._pending_units.values():
            unit.saver.free()
        self._pending_units = {}
        if self.cupti is not None:
            try:
                self.cupti.close()
            except Exception as e:
                self.warn(f"isolated: CUPTI flush failed ({type(e).__name__}: {e})")
        if self._lost_runs:
            self.warn(f"isolated: {self._lost_runs} timed run(s) had no CUPTI kernel record")
        if self._events_fallbacks:
            self.warn(f"isolated: {self._events_fallbacks} launch(es) got no CUPTI kernel record and were timed "
                      f"with CUDA events (which include launch gaps)")

    def launch_rows(self) -> List[Dict[str, Any]]:
        self._close()
        return [{k: v for k, v in r.items() if not k.startswith("_")} for r in self.rows]

    def summary(self) -> Dict[str, Any]:
        ok = [r for r in self.rows if "median_us" in r]
        plain = [r for r in ok if r.get("unit") != "graph"]
        timings = {r.get("timing") for r in ok}
        backend = self.backend if not timings else "+".join(t for t in ("cupti", "events") if t in timings)
        d = {"mode": "isolated", "backend": backend, "launches_profiled": len(plain), "repeat": self.cfg.repeat,
             "warmup": self.cfg.warmup, "flush_l2": self.cfg.flush_l2, "max_saved_bytes": self.saved_bytes}
        if self.units:
            d["graph_launches_profiled"] = sum(1 for u in self.units if "error" not in u)
            d["graph_kernel_rows"] = sum(1 for r in ok if r.get("unit") == "graph")
            d["graph_units"] = self.units[:50]
        paths = []
        if plain:
            paths.append("launches relaunched one by one")
        if any(r.get("unit") == "graph" for r in ok):
            paths.append("the program's cuGraphLaunch calls timed as units (kernels recorded into graphs)")
        d["paths"] = paths
        if self.skipped_captured:
            d["captured_launches"] = self.skipped_captured
        if self.skipped_collectives:
            d["collective_launches"] = self.skipped_collectives
            paths.append(f"{self.skipped_collectives} collective launches run once, not timed (they wait for peers)")
        if ok:
            d["total_us"] = sum(r["median_us"] for r in ok)
            d["max_spread_pct"] = max(r["spread_pct"] for r in ok)
        else:
            why = [r["error"] for r in self.rows if r.get("error")]
            d["error"] = ("no launch was timed" + (f" ({why[0]})" if why else
                          " (no selected launch ran outside a stream capture, and no selected graph launch)"))
            if not getattr(self, "_warned_none", False):
                self._warned_none = True
                self.warn("isolated: " + d["error"])
        return d
