"""Graph mode's per-node times from CUPTI records: each record's graph node id (an executable
graph's node, a clone of a captured one) traced back to the captured operation, by CUPTI's node
creation and cloning records or, without them, by the order of the graph (one chain); records
without node ids by kernel order.  A part of GraphProfiler (graphmode.py), held as its `nodes`:
given the captured operations and launches with the records, it keeps the per-node results."""
from __future__ import annotations

import statistics
from typing import Any, Callable, Dict, List, Optional, Tuple

from .graphunits import covered_ns


class NodeAttribution:
    def __init__(self, info: Dict[str, Any], warn: Callable[[str], None]):
        self.info, self.warn = info, warn              # the profiler's: its summary and warnings
        self.ops: List[Tuple] = []                     # the profiler's captured operations, launches
        self.launches: List[Any] = []
        self.node_times: List[List[float]] = []        # per launch
        self.node_names: List[Optional[str]] = []      # CUPTI's kernel name of each launch's node
        self.op_times: List[List[float]] = []          # per captured operation (launches, memsets, copies)
        self.extra_records: List[Dict[str, Any]] = []  # CUPTI records of no captured operation
        self.between_us: Optional[float] = None        # CUPTI runs: time inside the run no record covers
        self.records_per_run: List[int] = []           # CUPTI runs: records (nodes) in each
        self.cupti_spans_us: List[float] = []          # CUPTI runs: first record's start to last's end

    def by_events(self, ops: List[Tuple], launches: List[Any], op_times: List[List[float]]) -> None:
        """Per-operation times from event nodes (no records, no names)."""
        self.ops, self.launches, self.op_times = ops, launches, op_times
        self.node_times = [op_times[k] for k, op in enumerate(ops) if op[0] == "launch"]
        self.node_names = [None] * len(launches)

    @staticmethod
    def _op_kind(op) -> str:
        return {"launch": "kernel", "memset": "memset"}.get(op[0], "memcpy")

    def per_node(self, ops: List[Tuple], launches: List[Any], runs: List[List[Any]],
                 created: Optional[Dict[int, Any]] = None, clones: Optional[Dict[int, int]] = None) -> None:
        """Per-node times of these operations and launches from the records of each CUPTI run
        (graphunits.Rec)."""
        self.ops, self.launches = ops, launches
        if not any(r[5] for run in runs for r in run):
            self._per_node_by_order(runs)
            return
        id2op, how = self._map_node_ids(runs, created or {}, clones or {})
        self.info["per_node_method"] = "CUPTI graph node ids"
        self.info["node_mapping"] = how
        self._attribute(runs, id2op)

    def _map_node_ids(self, runs, created: Dict[int, Any], clones: Dict[int, int]) -> Tuple[Dict[int, int], str]:
        """Graph node id of the records -> index of the captured operation."""
        seen = {r[5] for run in runs for r in run if r[5]}
        ops_of = {nid: tag for nid, tag in created.items() if isinstance(tag, int) and 0 <= tag < len(self.ops)}
        exact = {}
        for nid in seen:
            t = ops_of.get(clones.get(nid, nid))
            if t is not None:
                exact[nid] = t
        if exact and len(exact) * 2 >= len(seen):
            return exact, ("node creation and clone records" if any(n in clones for n in exact)
                           else "node creation records")
        return self._align_node_ids(runs), "node ids in graph order"

    def _align_node_ids(self, runs, lookahead: int = 16) -> Dict[int, int]:
        """Node ids matched to the captured operations by graph order.  The graph is a chain
        (one stream): a run's nodes start in the order of the operations.  The run that saw
        the most nodes gives the order; a node is the next operation of its kind (kernel name
        too, where the recorded names are CUPTI's), a few operations ahead at most; what has
        no such operation (a kernel the driver added) is left unmatched."""
        best = max(runs, key=lambda run: len({r.node for r in run if r.node}), default=[])
        groups: Dict[int, Dict[str, Any]] = {}
        for r in best:
            if not r.node:
                continue
            g = groups.setdefault(r.node, {"t0": r.t0, "kinds": set(), "name": None})
            g["t0"] = min(g["t0"], r.t0)
            g["kinds"].add(r.kind)
            if r.kind == "kernel" and g["name"] is None:
                g["name"] = r.name
        names = {op[1].name for op in self.ops if op[0] == "launch"}
        kgroups = [g for g in groups.values() if g["kinds"] == {"kernel"}]
        comparable = bool(kgroups) and sum(g["name"] in names for g in kgroups) * 2 >= len(kgroups)
        kinds = [self._op_kind(op) for op in self.ops]
        out: Dict[int, int] = {}
        j = 0
        for nid in sorted(groups, key=lambda n: groups[n]["t0"]):
            g = groups[nid]
            gk = "memset" if "memset" in g["kinds"] else "memcpy" if "memcpy" in g["kinds"] else "kernel"
            want = {gk}
            if gk == "kernel" and comparable and g["name"] not in names:
                want = {"memset", "memcpy"}            # the driver's kernel for a memset/copy node
            for k in range(j, min(len(self.ops), j + lookahead)):
                if kinds[k] not in want:
                    continue
                if "kernel" in want and comparable and self.ops[k][1].name != g["name"]:
                    continue
                out[nid] = k
                j = k + 1
                break
        return out

    def _attribute(self, runs, id2op: Dict[int, int]) -> None:
        """Records -> operations, run by run: an operation's time in a run spans its records."""
        n = len(self.ops)
        launch_of = {}
        li = 0
        for k, op in enumerate(self.ops):
            if op[0] == "launch":
                launch_of[k] = li
                li += 1
        self.node_times = [[] for _ in self.launches]
        self.node_names = [None] * len(self.launches)
        self.op_times = [[] for _ in range(n)]
        extra: Dict[str, Dict[str, Any]] = {}
        between: List[float] = []
        for run in runs:
            if not run:
                continue
            per: Dict[int, List[int]] = {}
            names: Dict[int, str] = {}
            spans: List[Tuple[int, int]] = []
            for r in run:            # Rec fields by position: (t0, t1, name, kind, graph, node)
                t0, t1, name, kind, _g, node = r
                k = id2op.get(node) if node else None
                spans.append((t0, t1))
                if k is None:
                    key = name if kind == "kernel" else f"({kind})"
                    e = extra.setdefault(key, {"name": key, "kind": kind, "records": 0, "us": 0.0})
                    e["records"] += 1
                    e["us"] += (t1 - t0) / 1e3
                    continue
                sp = per.get(k)
                if sp is None:
                    per[k] = [t0, t1]
                else:
                    if t0 < sp[0]:
                        sp[0] = t0
                    if t1 > sp[1]:
                        sp[1] = t1
                if kind == "kernel" and k not in names:
                    names[k] = name
            for k, (t0, t1) in per.items():
                self.op_times[k].append((t1 - t0) / 1e3)
                if k in launch_of and k in names:
                    self.node_names[launch_of[k]] = names[k]
            self.records_per_run.append(len(spans))
            t_first, t_last = min(a for a, _ in spans), max(b for _, b in spans)
            self.cupti_spans_us.append((t_last - t_first) / 1e3)
            between.append(((t_last - t_first) - covered_ns(spans)) / 1e3)
        for k, li in launch_of.items():
            self.node_times[li] = self.op_times[k]
        runs_used = sum(1 for run in runs if run)
        for e in extra.values():
            e["per_run"] = e["records"] / runs_used if runs_used else 0
            e["us_per_run"] = e.pop("us") / runs_used if runs_used else 0.0
        self.extra_records = sorted(extra.values(), key=lambda e: -e["us_per_run"])
        if between:
            self.between_us = statistics.median(between)
        if self.extra_records:
            self.warn("graph: CUPTI records of no captured operation (not a recorded launch), per run: "
                      + ", ".join(f"{e['name'][:60]} x{e['per_run']:g}" for e in self.extra_records[:5])
                      + (" ..." if len(self.extra_records) > 5 else ""))
        untimed = sum(1 for t in self.node_times if not t)
        if untimed:
            self.warn(f"graph: {untimed} of {len(self.launches)} launches got no CUPTI record of their graph node")
        if not any(self.node_times):
            self.node_times = []

    def _per_node_by_order(self, runs) -> None:
        """Records without graph node ids (a CUPTI without the fields): the i-th kernel record
        of a run is launch i, in runs with as many kernel records as launches."""
        n = len(self.launches)
        self.node_times = [[] for _ in range(n)]
        self.node_names = [None] * n
        skipped = 0
        for run in runs:
            ks = sorted(r for r in run if r.kind == "kernel")
            if not ks:
                continue
            if len(ks) != n:
                skipped += 1
                continue
            self.cupti_spans_us.append((ks[-1][1] - ks[0][0]) / 1e3)
            for i, r in enumerate(ks):
                self.node_times[i].append((r.t1 - r.t0) / 1e3)
                self.node_names[i] = r.name
        self.info["per_node_method"] = "CUPTI kernel order"
        if skipped:
            self.warn(f"graph: CUPTI records carry no graph node ids and {skipped} run(s) had a kernel count other "
                      f"than the graph's {n} launches; not used for per-node times")
        if not any(self.node_times):
            self.node_times = []
