"""What CUPTI tracing adds to a graph's run, for graph mode's consistency check.

Per-node times come from CUPTI-traced runs, and tracing lengthens them: it widens the gaps
between nodes and stretches each recorded duration a little.  The graph's own time is taken
without CUPTI.  So the check takes off the traced span what tracing adds per node, measured on
a graph of its own: a chain of K empty kernels, timed untraced (CUDA events around the launch)
and traced (CUPTI), in the same process (the chain's own speed varies between processes; the
difference does not: 0.16-0.18 us per node on an H200).  The graph being profiled never enters
the correction, so the check stays a check."""
from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional, Sequence

from .common import LaunchGate, destroy_all

_EMPTY_PTX = b"""
.version 6.0
.target sm_52
.address_size 64
.visible .entry cudasnap_empty()
{
    ret;
}
"""
NODES = 2000          # kernels in the calibration chain
RUNS = 5


def gap_model(untraced_us: Sequence[float], traced_runs: Sequence[Sequence[Any]], k: int) -> Optional[Dict[str, Any]]:
    """untraced_us: the chain's times without CUPTI; traced_runs: each traced run's kernel records
    (.t0, .t1 in ns). Returns the per-gap times untraced and traced (us) and the empty kernel's
    duration, or None when the runs are unusable."""
    runs = [sorted(r, key=lambda x: x.t0) for r in traced_runs if len(r) == k]
    if not untraced_us or not runs or k < 2:
        return None
    dur = statistics.median((x.t1 - x.t0) / 1e3 for r in runs for x in r)
    traced = statistics.median(
        (((r[-1].t1 - r[0].t0) / 1e3) - sum((x.t1 - x.t0) / 1e3 for x in r)) / (k - 1) for r in runs)
    untraced = (statistics.median(untraced_us) - k * dur) / (k - 1)
    span = statistics.median((r[-1].t1 - r[0].t0) / 1e3 for r in runs)
    whole = statistics.median(untraced_us)
    return {"nodes": k, "runs": len(runs), "kernel_us": dur, "gap_untraced_us": max(0.0, untraced),
            "gap_traced_us": traced, "tracing_per_gap_us": max(0.0, traced - max(0.0, untraced)),
            "tracing_per_node_us": max(0.0, (span - whole) / k),
            "chain_untraced_us": whole, "chain_traced_span_us": span}


class GapChain:
    """The calibration chain: built and timed untraced before CUPTI is opened, then timed
    traced on the open collector; model() combines them."""

    def __init__(self, rv, stream, k: int = NODES, runs: int = RUNS):
        self.rv, self.stream, self.k, self.runs = rv, stream, k, runs
        self.made: List = []
        self.untraced_us: List[float] = []
        self.traced: List[List[Any]] = []
        cu = rv.driver
        mod = rv.call("cuModuleLoadData", _EMPTY_PTX + b"\0")
        self.made.append(("cuModuleUnload", mod))
        fn = rv.call("cuModuleGetFunction", mod, b"cudasnap_empty")
        # as wide as a real kernel (2 blocks per SM): CUPTI's cost per node grows with the grid
        try:
            attr = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
            self.grid = 2 * max(1, int(rv.call("cuDeviceGetAttribute", attr, rv.device)))
        except Exception:
            self.grid = 256
        mode = getattr(getattr(cu, "CUstreamCaptureMode", None), "CU_STREAM_CAPTURE_MODE_RELAXED", 2)
        rv.call("cuStreamBeginCapture", stream, mode)
        try:
            for _ in range(k):
                rv.call("cuLaunchKernel", fn, self.grid, 1, 1, 128, 1, 1, 0, stream, None, 0)
        finally:
            graph = rv.call("cuStreamEndCapture", stream)
            self.made.append(("cuGraphDestroy", graph))
        self.exe = rv.call("cuGraphInstantiate", graph, 0)
        self.made.append(("cuGraphExecDestroy", self.exe))
        self._launch()                                  # upload

    def _launch(self) -> None:
        self.rv.call("cuGraphLaunch", self.exe, self.stream)
        self.rv.call("cuStreamSynchronize", self.stream)

    def time_untraced(self) -> None:
        rv = self.rv
        e0, e1 = rv.call("cuEventCreate", 0), rv.call("cuEventCreate", 0)
        self.made += [("cuEventDestroy", e0), ("cuEventDestroy", e1)]
        gate = LaunchGate.open(rv, self.stream)       # as the graph itself is timed (graphmode)
        try:
            for _ in range(self.runs):
                LaunchGate.launch_timed(rv, gate, self.exe, self.stream, e0, e1)
                rv.call("cuStreamSynchronize", self.stream)
                self.untraced_us.append(float(rv.call("cuEventElapsedTime", e0, e1)) * 1e3)
        finally:
            if gate is not None:
                gate.close()

    def time_traced(self, clock) -> None:
        """Runs on the open CUPTI collector (clock: graphunits.WindowClock)."""
        windows = []
        clock.start()
        for _ in range(self.runs):
            m0 = clock.mark()
            self._launch()
            windows.append((m0, clock.mark()))
        self.traced = [[x for x in run if x.kind == "kernel"] for run in clock.collect_records(windows)]

    def model(self) -> Optional[Dict[str, Any]]:
        m = gap_model(self.untraced_us, self.traced, self.k)
        if m is not None:
            m["grid"] = self.grid
        return m

    def close(self) -> None:
        destroy_all(self.rv.driver, self.made)
        self.made = []
