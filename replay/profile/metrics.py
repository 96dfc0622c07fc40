"""`--profile metrics`: hardware counters per kernel launch, as Nsight Compute's sections give
them, each launch replayed from restored memory once per pass the counters need.

Which launches: the selection of every mode (-k/-s/-c, --kernels, --calls, --launch).  What:
--section NAME (repeatable; metrics_sections.py) and --metrics a,b (raw metric names).  How,
per selected launch (the same machinery as isolated mode):
1. before the launch, everything it could write is saved (common.MemorySaver: every live
   allocation when they fit in save_limit, else what its pointer parameters point into);
2. the launch runs as recorded;
3. for every pass of the counter configuration: the saved memory is restored, L2 is flushed
   (--flush-l2, the same read-a-buffer flush as isolated mode, as ncu's --cache-control all),
   the stream synchronized, then CUPTI's range profiler brackets the relaunch
   (metrics_cupti.py).  Each pass starts from the pre-launch contents, so afterwards memory
   holds exactly one application of the kernel and the replay (with its D2H verification)
   goes on as recorded.
Clocks are not locked (ncu locks them to base by default: compare with ncu --clock-control
none).  Theoretical occupancy comes from the launch configuration and the function's
attributes (cuFuncGetAttribute, cuOccupancyMaxActiveBlocksPerMultiprocessor); its limiter is
every resource whose block limit is the smallest (metrics_sections.occupancy_limits).  The
roofline (roofline.py) uses the peak metrics of the SpeedOfLight_RooflineChart section, or,
where the chip's CUPTI lacks them, peaks measured on the card once and cached.

Without CUPTI's profiler (no cupti-python, a libcupti without the range profiler, no
permission to read counters) the replay still runs and verifies, and the profile is an
error: exit 2.  Launches recorded into a stream capture (graph nodes) and collectives of a
job are not profiled (they are counted)."""
from __future__ import annotations

import os
import statistics
from typing import Any, Callable, Dict, List, Optional

from ..driverops import handle_int
from ..group import ENV_RANK
from . import metrics_sections as ms
from .common import MemorySaver, Selection, base_row, replays_alone, save_before
from .isolated import L2Flusher
from .metrics_cupti import MetricsUnavailable, open_collector


class MetricsProfiler:
    mode = "metrics"
    label = "metrics profiler"
    wants_calls = False

    def __init__(self, cfg, warn: Callable[[str], None]):
        self.cfg = cfg
        self.warn = warn
        self.rv = None
        self.sel = None
        self.sections, self.wanted = ms.plan(list(cfg.sections or []), cfg.metrics)
        self.collector = None
        self.collected_as: Dict[str, str] = {}
        self.error: Optional[str] = None
        self.rows: List[Dict[str, Any]] = []
        self.flusher: Optional[L2Flusher] = None
        self.saved_bytes = 0
        self.config_passes: Optional[int] = None
        self.skipped_captured = 0
        self.skipped_collectives = 0
        self.in_job = bool(os.environ.get(ENV_RANK))
        self._occ_cache: Dict[Any, Dict[str, Any]] = {}
        self._dev_attrs: Optional[Dict[str, int]] = None
        self.measured_peaks: Optional[Dict[str, Any]] = None
        self._closed = False

    # ---------------------------------------------------------------- events
    def on_event(self, kind: str, ev) -> None:
        if kind == "start":
            self.rv = ev.replay
            self.sel = Selection(self.cfg, self.rv, alone_only=True)      # -c counts launches it can profile
        elif kind == "before_launch" and self.sel(ev):
            if not replays_alone(self, ev, "metrics", "not profiled"):
                return
            if self.error is not None or not self._open():
                return
            self._save(ev)
        elif kind == "after_launch" and "metrics" in ev.data:
            self._profile(ev)
        elif kind in ("teardown", "end"):
            if self.flusher is not None:
                self.flusher.close()
                self.flusher = None
            if kind == "end":
                self._close()

    def _open(self) -> bool:
        if self.collector is not None:
            return True
        try:
            dev = handle_int(self.rv.device) if self.rv.device is not None else int(self.rv.options.device or 0)
            self.collector = open_collector(dev)
            self.collected_as = self.collector.prepare(self.wanted, self.warn, ms.alternative, quiet=ms.OPTIONAL)
            self.config_passes = int(self.collector.passes())
        except MetricsUnavailable as e:
            self._fail(str(e))
            return False
        except Exception as e:
            self._fail(f"{type(e).__name__}: {e}")
            return False
        return True

    def _fail(self, why: str) -> None:
        if self.error is None:
            self.error = f"CUPTI's profiler is not available: {why}"
            self.warn("metrics: " + self.error)
        if self.collector is not None:
            try:
                self.collector.close()
            except Exception:
                pass
            self.collector = None

    def _save(self, ev) -> None:
        save_before(self, ev, "metrics")

    _base_row = staticmethod(base_row)

    def _profile(self, ev) -> None:
        rv, cfg = self.rv, self.cfg
        saver: MemorySaver = ev.data.pop("metrics")
        row = self._base_row(ev, saver)
        s = ev.stream
        try:
            if cfg.flush_l2 and self.flusher is None:
                self.flusher = L2Flusher(rv)
            ctx = handle_int(rv.call("cuCtxGetCurrent"))

            def prepare() -> None:
                saver.restore(s)
                if self.flusher is not None:
                    self.flusher.flush(s)
                rv.call("cuStreamSynchronize", s)

            values, passes = self.collector.collect(ctx, prepare, ev.ctx.relaunch,
                                                    lambda: rv.call("cuStreamSynchronize", s))
            rv.call("cuStreamSynchronize", s)
            row["metrics"] = {m: values.get(self.collected_as.get(m, m)) for m in self.wanted
                              if values.get(self.collected_as.get(m, m)) is not None}
            row["passes"] = passes
            dur = row["metrics"].get("gpu__time_duration.sum")
            if dur is not None:
                row["time_us"] = dur / 1e3
        except MetricsUnavailable as e:
            self._fail(str(e))
            row["error"] = self.error
        except Exception as e:
            self.warn(f"metrics: call #{ev.seq} {ev.name}: {type(e).__name__}: {e}")
            row["error"] = f"{type(e).__name__}: {e}"
            try:
                rv.call("cuCtxSynchronize")
            except Exception:
                pass
        finally:
            saver.free()
        if "Occupancy" in self.sections:
            row["occupancy"] = self._occupancy(ev)
        self.rows.append(row)
        if "metrics" in row and "SpeedOfLight_RooflineChart" in self.sections and self.measured_peaks is None:
            self._peaks_if_missing(row["metrics"])

    # ---------------------------------------------------------------- occupancy
    def _device_attrs(self) -> Dict[str, int]:
        if self._dev_attrs is None:
            rv = self.rv
            A = rv.driver.CUdevice_attribute
            names = {"max_threads_per_sm": "CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR",
                     "max_blocks_per_sm": "CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR",
                     "regs_per_sm": "CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR",
                     "smem_per_sm": "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR",
                     "reserved_smem_per_block": "CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK",
                     "warp_size": "CU_DEVICE_ATTRIBUTE_WARP_SIZE"}
            d: Dict[str, int] = {}
            for k, a in names.items():
                try:
                    d[k] = int(rv.call("cuDeviceGetAttribute", getattr(A, a), rv.device))
                except Exception:
                    d[k] = 0
            self._dev_attrs = d
        return self._dev_attrs

    def _occupancy(self, ev) -> Dict[str, Any]:
        threads = ev.block[0] * ev.block[1] * ev.block[2]
        key = (handle_int(ev.function), threads, ev.shmem)
        got = self._occ_cache.get(key)
        if got is not None:
            return got
        rv = self.rv
        F = rv.driver.CUfunction_attribute
        d: Dict[str, Any] = {"block_threads": threads, "dynamic_smem": ev.shmem}
        fn = rv.bound_function(ev.function)        # a library kernel (CUkernel): its CUfunction
        try:
            d["registers_per_thread"] = int(rv.call("cuFuncGetAttribute", F.CU_FUNC_ATTRIBUTE_NUM_REGS, fn))
            d["static_smem"] = int(rv.call("cuFuncGetAttribute", F.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn))
        except Exception as e:
            d["error"] = f"function attributes: {e}"
            self._occ_cache[key] = d
            return d
        dev = self._device_attrs()
        smem = d["static_smem"] + ev.shmem + (dev.get("reserved_smem_per_block") or 0)
        d["smem_per_block"] = smem
        limits = ms.occupancy_limits(threads, d["registers_per_thread"], smem, dev)
        try:
            active: Optional[int] = int(rv.call("cuOccupancyMaxActiveBlocksPerMultiprocessor", fn,
                                                   threads, ev.shmem))
        except Exception:
            active = None
        d.update(ms.theoretical_occupancy(active, threads, limits, dev))
        if ev.config is not None:
            d["note"] = "cuLaunchKernelEx: launch attributes (clusters) may lower it further"
        self._occ_cache[key] = d
        return d

    # ---------------------------------------------------------------- peaks
    def _peaks_if_missing(self, values: Dict[str, float]) -> None:
        """Peaks measured on the card (roofline.measured_peaks: cached per GPU) when the peak
        metrics are missing."""
        p = ms.metric_peaks(values)
        if p.get("fp32_flops") and p.get("dram_bytes_per_s"):
            return
        from .roofline import measured_peaks
        try:
            self.measured_peaks = measured_peaks(self.rv)
        except Exception as e:
            self.measured_peaks = {"error": f"{type(e).__name__}: {e}"}
            self.warn(f"metrics: peaks could not be measured ({type(e).__name__}: {e}); no roofline")

    # ---------------------------------------------------------------- results
    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.collector is not None:
            try:
                self.collector.close()
            except Exception as e:
                self.warn(f"metrics: closing CUPTI failed ({type(e).__name__}: {e})")

    def launch_rows(self) -> List[Dict[str, Any]]:
        self._close()
        return [dict(r) for r in self.rows]

    def summary(self) -> Dict[str, Any]:
        ok = [r for r in self.rows if "metrics" in r]
        d: Dict[str, Any] = {"mode": "metrics", "backend": getattr(self.collector, "name", None) or "cupti range profiler",
                             "chip": getattr(self.collector, "chip", None), "sections": self.sections,
                             "metrics": self.wanted, "launches_profiled": len(ok), "passes": self.config_passes,
                             "flush_l2": self.cfg.flush_l2, "max_saved_bytes": self.saved_bytes,
                             "clocks": "not locked (ncu --clock-control none compares)"}
        other = {k: v for k, v in self.collected_as.items() if k != v}
        if other:
            d["collected_as"] = other
        missing = [m for m in self.wanted if m not in self.collected_as and m not in ms.OPTIONAL] \
            if self.collector is not None else []
        if missing:
            d["not_collected"] = missing
        if self.skipped_captured:
            d["captured_launches"] = self.skipped_captured
        if self.skipped_collectives:
            d["collective_launches"] = self.skipped_collectives
        if self.measured_peaks is not None:
            d["measured_peaks"] = self.measured_peaks
        if ok:
            d["total_us"] = sum(r.get("time_us", 0.0) for r in ok)
        elif self.error:
            d["error"] = self.error
        else:
            why = [r["error"] for r in self.rows if r.get("error")]
            left = (self.skipped_captured or 0) + (self.skipped_collectives or 0) \
                + (getattr(self.sel, "not_alone", 0) or 0)
            d["error"] = ("no launch was profiled" + (f" ({why[0]})" if why else
                          f" (every selected launch, {left}, was recorded into a stream capture, a graph's node, or "
                          f"is a collective: metrics replays launches alone; --profile isolated or timeline time "
                          f"the program's graph launches)" if left else " (no selected launch ran)"))
        return d

    def finish_report(self, report: Dict[str, Any]) -> None:
        """Per-kernel medians of every metric, the roofline per kernel (roofline.py) and the
        section layout, added to the report build_report made."""
        from .roofline import kernel_roofline, launch_point
        peaks_fallback = self.measured_peaks if self.measured_peaks and "error" not in self.measured_peaks else None
        by: Dict[str, List[Dict[str, Any]]] = {}
        for r in report["launches"]:
            if "metrics" in r:
                by.setdefault(r["name"], []).append(r)
                if "SpeedOfLight_RooflineChart" in self.sections:
                    r["roofline"] = launch_point(r["metrics"], peaks_fallback)
        for k in report["kernels"]:
            rows = by.get(k["name"]) or []
            if not rows:
                continue
            names = list(dict.fromkeys(m for r in rows for m in r["metrics"]))
            k["metrics"] = {m: statistics.median([r["metrics"][m] for r in rows if m in r["metrics"]]) for m in names}
            k["passes"] = max(r.get("passes") or 0 for r in rows)
            occ = next((r["occupancy"] for r in rows if r.get("occupancy")), None)
            if occ is not None:
                k["occupancy"] = occ
            if "SpeedOfLight_RooflineChart" in self.sections:
                k["roofline"] = kernel_roofline(rows, peaks_fallback)
        if self._dev_attrs:               # the SM's limits, once: advise weighs other block sizes with them
            report["summary"]["sm_limits"] = dict(self._dev_attrs)
        report["sections"] = {n: [{"metric": m, "label": lab, "unit": u} for m, lab, u in ms.SECTIONS[n]]
                              for n in self.sections}
