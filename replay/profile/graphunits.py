"""Timing the program's own CUDA graphs (recorded cuGraphLaunch calls) as units, and matching
CUPTI kernel records to timed runs by time window.

Programs such as JAX/XLA (command buffers) and CUDA-graph PyTorch run (nearly) all their kernels
inside graphs: the launches are recorded into a stream capture (cuStreamBeginCapture(ToGraph)
.. cuStreamEndCapture) or added as kernel nodes, and executed by cuGraphLaunch.  Such launches
are graph nodes, not executed launches, so isolated and graph mode time the recorded
cuGraphLaunch calls instead: each run restores the memory the graph can write (saved before
the recorded launch), launches the graph, waits for it; CUPTI gives one kernel record per
kernel node, reported per node (and aggregated per kernel name like any launch row).

Matching CUPTI records to runs does not rely on correlation ids (external correlation records
are only emitted when API activity records are enabled): every timed run is bracketed by
synchronizations and CUPTI timestamps (cupti.get_timestamp(), the activity records' own clock),
and a kernel record belongs to the run whose window holds its midpoint.  Without
get_timestamp, the window is the records delivered between two forced flushes."""
from __future__ import annotations

import bisect
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Tuple

from cudasnap.formats.abi import base_name

from cudasnap.formats.vocab import in_class, is_graph_launch, is_launch  # noqa: F401  (isolated.py takes it from here)
from .common import LaunchGate, MemorySaver, ranges_for, stats


def _base(f: str) -> str:
    return base_name(f or "")


# ----------------------------------------------------------------------------- CUPTI windows
class WindowClock:
    """Marks for run windows on a CuptiCollector: CUPTI timestamps, else flush indices."""

    def __init__(self, cupti):
        self.cupti = cupti
        self.use_ts = hasattr(cupti, "timestamp")

    def start(self) -> None:
        """Before a batch of runs: records of earlier work are delivered now."""
        try:
            self.cupti.flush()
        except Exception:
            pass

    def mark(self) -> Tuple:
        if self.use_ts:
            try:
                return ("t", int(self.cupti.timestamp()))
            except Exception:
                self.use_ts = False
        self.cupti.flush()
        return ("n", len(self.cupti.kernels), len(self.cupti.copies))

    def collect(self, windows: List[Tuple[Tuple, Tuple]]) -> List[List[Tuple[int, int, str]]]:
        """Kernel records (start, end, name) of each window, sorted by start (flushes first)."""
        try:
            self.cupti.flush()
        except Exception:
            pass
        return match_windows(self.cupti.kernels, windows)

    def collect_records(self, windows: List[Tuple[Tuple, Tuple]]) -> List[List["Rec"]]:
        """Every record (kernels, memcpys, memsets) of each window with the graph node that ran
        it, sorted by start (flushes first)."""
        try:
            self.cupti.flush()
        except Exception:
            pass
        return records_in_windows(self.cupti, windows)


class Rec(tuple):
    """One CUPTI record: (start, end, name, kind, graph id, graph node id); kind is "kernel",
    "memcpy" or "memset"; the ids are 0 for work outside graphs (or without the fields)."""
    __slots__ = ()

    def __new__(cls, t0, t1, name, kind="kernel", graph=0, node=0):
        return tuple.__new__(cls, (t0, t1, name, kind, graph, node))

    t0 = property(lambda self: self[0])
    t1 = property(lambda self: self[1])
    name = property(lambda self: self[2])
    kind = property(lambda self: self[3])
    graph = property(lambda self: self[4])
    node = property(lambda self: self[5])


def collector_records(cupti) -> Tuple[List[Rec], List[Rec]]:
    """A collector's kernel and copy records as Rec (graph ids from kernel_nodes/copy_nodes when
    the collector keeps them)."""
    kn = getattr(cupti, "kernel_nodes", None) or []
    cn = getattr(cupti, "copy_nodes", None) or []
    ks_raw = cupti.kernels
    cs_raw = getattr(cupti, "copies", None) or []
    new = tuple.__new__              # Rec without its Python-level __new__: hundreds of thousands of records
    zero = (0, 0)
    kn = list(kn[:len(ks_raw)]) + [zero] * (len(ks_raw) - len(kn))
    cn = list(cn[:len(cs_raw)]) + [zero] * (len(cs_raw) - len(cn))
    ks = [new(Rec, (k[1], k[2], k[3], "kernel", g[0], g[1])) for k, g in zip(ks_raw, kn)]
    cs = [new(Rec, (c[1], c[2], c[4], c[4], g[0], g[1])) for c, g in zip(cs_raw, cn)]
    return ks, cs


def records_in_windows(cupti, windows) -> List[List[Rec]]:
    """Records of each window (as match_windows: time windows by midpoint, else the records
    delivered between two flushes), sorted by start."""
    ks, cs = collector_records(cupti)
    out: List[List[Rec]] = [[] for _ in windows]
    timed = sorted((w[0][1], w[1][1], i) for i, w in enumerate(windows) if w[0][0] == "t" and w[1][0] == "t")
    starts = [w[0] for w in timed]
    for i, (m0, m1) in enumerate(windows):
        if m0[0] == "n" and m1[0] == "n":
            out[i] = ks[m0[1]:m1[1]]
            if len(m0) > 2 and len(m1) > 2:
                out[i] += cs[m0[2]:m1[2]]
    if timed:
        for r in ks + cs:
            mid = (r[0] + r[1]) / 2
            j = bisect.bisect_right(starts, mid) - 1
            if j >= 0 and mid <= timed[j][1]:
                out[timed[j][2]].append(r)
    for lst in out:
        lst.sort()
    return out


def match_windows(kernels, windows) -> List[List[Tuple[int, int, str]]]:
    """kernels: CuptiCollector.kernels tuples (corr, start, end, name, stream_id); windows: pairs
    of marks (("t", ns) or ("n", record index)).  A record belongs to the time window that holds
    its midpoint (windows are disjoint: each is closed by a synchronization)."""
    out: List[List[Tuple[int, int, str]]] = [[] for _ in windows]
    timed = sorted((w[0][1], w[1][1], i) for i, w in enumerate(windows) if w[0][0] == "t" and w[1][0] == "t")
    starts = [w[0] for w in timed]
    for i, (m0, m1) in enumerate(windows):
        if m0[0] == "n" and m1[0] == "n":
            out[i] = [(k[1], k[2], k[3]) for k in kernels[m0[1]:m1[1]]]
    if timed:
        for k in kernels:
            mid = (k[1] + k[2]) / 2
            j = bisect.bisect_right(starts, mid) - 1
            if j >= 0 and mid <= timed[j][1]:
                out[timed[j][2]].append((k[1], k[2], k[3]))
    for lst in out:
        lst.sort()
    return out


def node_rows(runs: List[List[Tuple]]) -> List[Dict[str, Any]]:
    """Per-kernel-node times over runs.  A kernel record with a graph node id (Rec, or a tuple
    (start, end, name, node id)) belongs to that node; without one, the k-th kernel of a name
    in a run is one node."""
    nodes: Dict[Tuple, Dict[str, Any]] = {}
    order: List[Tuple] = []
    for run in runs:
        seen: Dict[str, int] = {}
        for r in run:
            t0, t1, name = r[0], r[1], r[2]
            if isinstance(r, Rec):
                if r.kind != "kernel":
                    continue
                nid = r.node
            else:
                nid = r[3] if len(r) > 3 else 0
            if nid:
                key: Tuple = ("id", nid)
            else:
                k = seen.get(name, 0)
                seen[name] = k + 1
                key = (name, k)
            if key not in nodes:
                nodes[key] = {"name": name, "times_us": [], "first": t0, "graph_node_id": nid or None}
                order.append(key)
            nodes[key]["times_us"].append((t1 - t0) / 1e3)
    rows = []
    for i, key in enumerate(sorted(order, key=lambda k: nodes[k]["first"])):
        r = nodes[key]
        row = {"node": i, "name": r["name"], "times_us": r["times_us"]}
        if r["graph_node_id"]:
            row["graph_node_id"] = r["graph_node_id"]
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------- recorded graphs
class RecordedGraphs:
    """What the recording put into each graph: launch records captured into it (stream capture)
    and kernel nodes added to it; per executable graph, through cuGraphInstantiate."""

    def __init__(self, rv):
        from ..events import LAUNCH_CONFIG
        self.rv = rv
        self.graphs: Dict[int, List[Dict[str, Any]]] = {}     # recorded CUgraph -> launch/node records
        self.execs: Dict[int, List[Dict[str, Any]]] = {}      # recorded CUgraphExec -> records
        self.launches: List[Dict[str, Any]] = []              # cuGraphLaunch records
        self.captured_launches = 0
        open_caps: Dict[Any, List[Dict[str, Any]]] = {}
        if getattr(rv.snapshot, "graph_calls", None) is False:
            return                   # no graph in the recording (the replay's index says): nothing to read
        for rec in rv.snapshot.records(("c",)):
            if rec.get("r", 0) != 0 or rec.get("incomplete"):
                continue
            f = rec.get("f") or ""
            a = rec.get("a") or {}
            b = _base(f)
            if in_class(b, "begins_capture"):      # into a graph of its own, or one the program made
                open_caps[a.get("hStream")] = self.graphs.setdefault(a["hGraph"], []) if "hGraph" in a else []
            elif in_class(b, "ends_capture"):
                cap = open_caps.pop(a.get("hStream"), None)
                g = a.get("phGraph")
                if cap is not None and g:
                    lst = self.graphs.setdefault(g, [])
                    if lst is not cap:
                        lst.extend(cap)
            elif in_class(b, "sets_kernel_node") or in_class(b, "adds_node"):
                if (rec.get("x") or {}).get("params") is not None:
                    key = a.get("hGraphExec") if "Exec" in b else a.get("hGraph")
                    (self.execs if "Exec" in b else self.graphs).setdefault(key, []).append(rec)
            elif in_class(b, "adds_child_graph"):
                self.graphs.setdefault(a.get("hGraph"), []).extend(self.graphs.get(a.get("childGraph"), []))
            elif in_class(b, "instantiates"):
                ex = a.get("phGraphExec")
                if ex:
                    self.execs.setdefault(ex, []).extend(self.graphs.get(a.get("hGraph"), []))
            elif in_class(b, "updates_exec"):
                self.execs.setdefault(a.get("hGraphExec"), []).extend(self.graphs.get(a.get("hGraph"), []))
            elif is_graph_launch(b):
                self.launches.append(rec)
            elif is_launch(f) and open_caps:
                hs = a.get("hStream")
                cfg = a.get("config")
                if isinstance(cfg, (bytes, bytearray)) and len(cfg) >= LAUNCH_CONFIG.size:
                    hs = LAUNCH_CONFIG.unpack_from(bytes(cfg))[7]
                self.captured_launches += 1
                if hs in open_caps:
                    open_caps[hs].append(rec)
                else:                  # a stream that joined a capture (event wait): every open one
                    for cap in open_caps.values():
                        cap.append(rec)

    def exec_of(self, rec) -> Optional[int]:
        a = rec.get("a") or {}
        return a.get("hGraph") or a.get("hGraphExec")

    def records_of(self, rec) -> List[Dict[str, Any]]:
        return self.execs.get(self.exec_of(rec), [])

    def kernel_names(self, rec) -> List[str]:
        out = []
        for r in self.records_of(rec):
            fh = (r.get("a") or {}).get("f")
            if fh is not None:
                out.append(self.rv.kernel_name(fh))
        return out

    def selected(self, sel, rec) -> bool:
        """Is this cuGraphLaunch selected: everything, --launch/--calls naming it, or a kernel
        recorded into its graph selected (--kernels/--calls)."""
        if sel.everything:
            return True
        if sel.launch is not None:
            return rec.get("s") == sel.launch
        if sel.sel is not None and sel.sel(rec, sel.func_names) and not sel.name_filter and not sel.counting:
            return True
        for r in self.records_of(rec):
            fh = (r.get("a") or {}).get("f")
            name = self.rv.kernel_name(fh) if fh is not None else ""
            if sel.rec(r, name):
                return True
        return False

    def saver(self, rec, limit: int) -> MemorySaver:
        evs = [SimpleNamespace(rec_params=bytes((r.get("x") or {}).get("params") or b"")) for r in self.records_of(rec)]
        return MemorySaver(self.rv, ranges_for(self.rv, evs, limit))


# ----------------------------------------------------------------------------- one unit
class GraphUnit:
    """One recorded cuGraphLaunch timed as a unit: save memory before it (before_call), repeat it
    after it ran (after_call), each run from the saved memory."""

    def __init__(self, rv, rec, saver: MemorySaver, names: List[str]):
        self.rv = rv
        self.rec = rec
        self.seq = rec.get("s")
        self.saver = saver
        self.names = names
        a = rec.get("a") or {}
        self.exec = rv.live_handle(rec, a.get("hGraph") or a.get("hGraphExec"), "graph exec")
        self.stream = rv.stream(rec, a.get("hStream"))

    def _prep(self, flusher) -> None:
        self.saver.restore(self.stream)
        if flusher is not None:
            flusher.flush(self.stream)
        self.rv.call("cuStreamSynchronize", self.stream)

    def run_cupti(self, cupti, n_warm: int, n_timed: int, flusher=None) -> List[List[Rec]]:
        clock = WindowClock(cupti)
        clock.start()
        windows = []
        for i in range(n_warm + n_timed):
            self._prep(flusher)
            m0 = clock.mark() if i >= n_warm else None
            self.rv.call("cuGraphLaunch", self.exec, self.stream)
            self.rv.call("cuStreamSynchronize", self.stream)
            if m0 is not None:
                windows.append((m0, clock.mark()))
        return [[r for r in run if r.kind == "kernel"] for run in clock.collect_records(windows)]

    def run_events(self, n_warm: int, n_timed: int, flusher=None) -> List[float]:
        rv = self.rv
        times = []
        gate = LaunchGate.open(rv, self.stream)      # the events time the GPU, not the host's submission
        self.gated = gate is not None
        try:
            for i in range(n_warm + n_timed):
                self._prep(flusher)
                e0, e1 = rv.call("cuEventCreate", 0), rv.call("cuEventCreate", 0)
                try:
                    LaunchGate.launch_timed(rv, gate, self.exec, self.stream, e0, e1)
                    rv.call("cuEventSynchronize", e1)
                    if i >= n_warm:
                        times.append(float(rv.call("cuEventElapsedTime", e0, e1)) * 1e3)
                finally:
                    for e in (e0, e1):
                        try:
                            rv.driver.cuEventDestroy(e)
                        except Exception:
                            pass
        finally:
            if gate is not None:
                self.gated = gate.ok
                gate.close()
        return times


def unit_rows(unit: GraphUnit, runs, n_timed: int, mode: str) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    """Kernel-node rows of a unit's CUPTI runs, and the unit's summary row."""
    rows = []
    for r in node_rows(runs):
        r.update(seq=unit.seq, unit="graph", graph_seq=unit.seq, cupti_name=r["name"], timing="cupti")
        r.update(stats(r["times_us"]))
        rows.append(r)
    got = [run for run in runs if run]
    info: Dict[str, Any] = {"seq": unit.seq, "kernels_recorded": len(unit.names), "runs": n_timed,
                            "runs_with_records": len(got)}
    if got:
        info["kernels_per_run"] = statistics_median([len(run) for run in got])
        info["span_us"] = statistics_median([(run[-1][1] - run[0][0]) / 1e3 for run in got])
        info["kernel_us"] = statistics_median([sum(r[1] - r[0] for r in run) / 1e3 for run in got])
        info["covered_us"] = statistics_median([covered_ns([(r[0], r[1]) for r in run]) / 1e3 for run in got])
    return rows, info


def covered_ns(spans: List[Tuple[int, int]]) -> int:
    """Length covered by a set of [start, end) intervals (concurrent nodes counted once)."""
    total, end = 0, None
    for a, b in sorted(spans):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def statistics_median(xs):
    import statistics
    return statistics.median(xs)
