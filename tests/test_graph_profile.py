"""Graph mode's per-node times: every kernel of the captured graph gets a time.

On the CUDA test double (no CUPTI): event record nodes between the launches, recorded when the
double runs the graph.  With a CUPTI stand-in whose records carry graph node ids the way CUPTI
reports them (ids of the executable graph's nodes, clones of the captured ones), plus records
that are no captured launch (a memset node run as a kernel, a kernel of nobody's graph)."""
from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap

import pytest

from synth import Synth
from test_profile import _replay, incr_memset_program

from double.fixtures import VIRTUAL_CLOCK


def two_kernel_program(path, n=16, spin_ms=2, rounds=2):
    """spin(spin_ms) then incr(D, n), `rounds` times; the D2H expects `rounds`."""
    s = Synth(path)
    ctx, mod, f_incr, f_spin = 0x55550000, 0x55560000, 0x55570005, 0x55570006
    D = 0x200000000000
    s.double_prologue("incr", f_incr, [[0, 8], [8, 4]], ctx, mod)
    s.call("cuModuleGetFunction", {"hfunc": f_spin, "hmod": mod, "name": "spin"})
    s.fn(f_spin, "spin", mod, [[0, 4]])
    s.call("cuMemAlloc_v2", {"dptr": D, "bytesize": n * 4})
    s.call("cuMemcpyHtoD_v2", {"dstDevice": D, "srcHost": 0x7F0000100000, "ByteCount": n * 4},
           x={"srcHost": s.blob(bytes(n * 4))})
    seqs = []
    for _ in range(rounds):
        seqs.append(s.launch(f_spin, struct.pack("<i", spin_ms))["s"])
        seqs.append(s.launch(f_incr, struct.pack("<Qi", D, n), block=n)["s"])
    s.expect_d2h(D, [rounds] * n)
    s.double_epilogue(frees=[D])
    return {"seqs": seqs}


# --------------------------------------------------------------------------- test double: event nodes
def test_graph_mode_times_every_kernel_of_a_two_kernel_snapshot(double, tmp_path):
    snap = tmp_path / "two.cusnap"
    facts = two_kernel_program(snap, spin_ms=2, rounds=2)
    out = tmp_path / "prof.json"
    # the check below compares times of separate graph runs: the spins' times are planted (the
    # double's virtual clock), so the host's load cannot move one run against another
    planted = {"CUDA_DOUBLE_SLOW": "spin:1", "CUDA_DOUBLE_SLOW_FLOOR_US": "2000", **VIRTUAL_CLOCK}
    rp = _replay(double, snap, "--profile", "graph", "--repeat", "3", "--warmup", "1", "--out", str(out),
                 env_extra=planted)
    assert rp.returncode == 0, rp.stdout + rp.stderr        # memory put back: the D2H still sees 2
    rep = json.loads(out.read_text())
    s = rep["summary"]
    assert "error" not in s, s
    assert s["backend"] == "events" and s["per_node_method"] == "event nodes between launches"
    assert s["launches"] == 4 and s["launches_timed"] == 4
    rows = rep["launches"]
    assert [r["seq"] for r in rows] == facts["seqs"]
    for r in rows:                                          # per-launch rows: every repeat, stats
        assert r["timing"] == "event nodes" and len(r["times_us"]) == 3
        assert {"median_us", "min_us", "max_us", "spread_pct"} <= set(r)
    spin = [r for r in rows if r["name"] == "spin"]
    assert all(r["median_us"] >= 1900 for r in spin)        # a 2 ms kernel measures as one
    ks = {k["name"]: k for k in rep["kernels"]}
    assert set(ks) == {"spin", "incr"} and all(k["timed"] == 2 and k["median_us"] is not None for k in ks.values())
    assert ks["spin"]["share_pct"] > 90
    c = s["check"]                                          # the spins are nearly all of the graph's time
    assert c["within_5pct"] is True, c
    assert abs(c["sum_us"] - c["graph_us"]) <= 0.05 * c["graph_us"]
    assert "per-node times: event nodes between launches; 4 of 4 launches timed" in rp.stdout
    assert "check: kernels" in rp.stdout and "within 5%" in rp.stdout


def test_graph_mode_checks_itself_against_a_timeline_replay(double, tmp_path):
    """--timeline-check: the same snapshot replayed once more under timeline (a child process);
    kernels of >= 5 us compared by median, those outside 5% listed. Off by default without CUPTI."""
    snap = tmp_path / "two.cusnap"
    two_kernel_program(snap, spin_ms=2, rounds=2)
    out = tmp_path / "prof.json"
    rp = _replay(double, snap, "--profile", "graph", "--repeat", "3", "--warmup", "1", "--out", str(out),
                 "--timeline-check")
    assert rp.returncode == 0, rp.stdout + rp.stderr
    rep = json.loads(out.read_text())
    t = rep["summary"]["timeline_check"]
    assert t["compared"] == 1 and t["min_us"] == 5.0, t          # the 2 ms spin; incr is too short
    # the double sleeps for a spin: a loaded host may stretch one mode's sleeps past 5%, so the
    # verdict is checked against the times it was made from, and those are the spin's
    graph_spin = [r["median_us"] for r in rep["launches"] if r["name"] == "spin"]
    assert all(g >= 1900 for g in graph_spin), graph_spin
    for c in t["outside"]:
        assert c["name"] == "spin" and c["graph_us"] >= 1900 and c["other_us"] >= 1900, c
        assert abs(c["diff_pct"]) > 5.0, c
    assert t["within"] is (not t["outside"]), t
    verdict = "all within 5%" if t["within"] else "1 outside 5%"
    assert "check against timeline mode (the same replay" in rp.stdout and f"1 kernels of >= 5 us, {verdict}" in rp.stdout
    out2 = tmp_path / "prof2.json"
    rp = _replay(double, snap, "--profile", "graph", "--repeat", "2", "--warmup", "0", "--out", str(out2))
    assert rp.returncode == 0 and "timeline_check" not in json.loads(out2.read_text())["summary"]
    assert "check against timeline mode" not in rp.stdout


def test_graph_mode_times_every_launch_of_a_long_captured_program(double, capture, tmp_path):
    cp, snap = capture(double["progs"]["direct"], "2000")
    assert cp.returncode == 0, cp.stderr
    out = tmp_path / "prof.json"
    rp = _replay(double, snap, "--profile", "graph", "--repeat", "2", "--warmup", "0", "--out", str(out))
    assert rp.returncode == 0, rp.stdout + rp.stderr
    rep = json.loads(out.read_text())
    assert rep["summary"]["launches_timed"] == 2000
    assert all(len(r["times_us"]) == 2 for r in rep["launches"])
    [k] = rep["kernels"]
    assert k["name"] == "add_one" and k["launches"] == k["timed"] == 2000 and k["median_us"] > 0


def test_graph_mode_memsets_and_copies_get_event_node_times(double, tmp_path):
    snap = tmp_path / "incr_ms.cusnap"
    incr_memset_program(snap)
    out = tmp_path / "prof.json"
    rp = _replay(double, snap, "--profile", "graph", "--repeat", "2", "--check-repeats", "--out", str(out))
    assert rp.returncode == 0, rp.stdout + rp.stderr
    s = json.loads(out.read_text())["summary"]
    assert s["launches_timed"] == 5 and s["graph_matches_replay"] is True
    assert {d["kind"]: (d["nodes"], d["timed"]) for d in s["other_nodes"]} == {"memset": (1, 1), "copy": (1, 1)}
    assert "memset/copy nodes: memset x1" in rp.stdout


def pool_scratch_program(path, n=16, rounds=3):
    """Each round, as a stream-ordered pool (cudaMallocAsync) allocator does: S = cuMemAllocAsync
    (the same address every round), memset S to 0, incr(S), copy S to D, cuMemFreeAsync(S).
    The D2H of D expects 1.  A graph of the rounds runs after every S was freed."""
    s = Synth(path)
    ctx, mod, f_incr = 0x55550000, 0x55560000, 0x55570005
    D, S = 0x200000000000, 0x200000400000
    s.double_prologue("incr", f_incr, [[0, 8], [8, 4]], ctx, mod)
    s.call("cuMemAlloc_v2", {"dptr": D, "bytesize": n * 4})
    seqs = []
    for _ in range(rounds):
        s.call("cuMemAllocAsync", {"dptr": S, "bytesize": n * 4, "hStream": 0})
        s.call("cuMemsetD32Async", {"dstDevice": S, "ui": 0, "N": n, "hStream": 0})
        seqs.append(s.launch(f_incr, struct.pack("<Qi", S, n), block=n)["s"])
        s.call("cuMemcpyDtoDAsync_v2", {"dstDevice": D, "srcDevice": S, "ByteCount": n * 4, "hStream": 0})
        s.call("cuMemFreeAsync", {"dptr": S, "hStream": 0})
    s.expect_d2h(D, [1] * n)
    s.double_epilogue(frees=[D])
    return {"seqs": seqs}


def test_graph_mode_keeps_memory_the_sequence_freed_until_the_graph_ran(double, tmp_path):
    snap = tmp_path / "pool.cusnap"
    facts = pool_scratch_program(snap)
    out = tmp_path / "prof.json"
    rp = _replay(double, snap, "--profile", "graph", "--repeat", "3", "--warmup", "1", "--check-repeats",
                 "--out", str(out))
    assert rp.returncode == 0, rp.stdout + rp.stderr
    rep = json.loads(out.read_text())
    s = rep["summary"]
    assert "error" not in s, s
    assert s["launches"] == 3 and s["launches_timed"] == 3, s
    assert [r["seq"] for r in rep["launches"]] == facts["seqs"]
    assert s.get("frees_held", 0) >= 2 and s.get("repeats_identical") is True, (s, rp.stdout[-3000:])


def test_graph_mode_relaunches_kernels_of_modules_the_program_unloaded(double, capture, tmp_path):
    """reload.c loads a module, launches its kernel and unloads it, eight times, and the double
    hands each kernel the handle value of the last: the unloads wait until the graph ran, so
    it relaunches each recorded kernel, not whichever the value names by then (threads that
    each load a library, JIT autotuners)."""
    cp, snap = capture(double["progs"]["reload"])
    assert cp.returncode == 0, cp.stderr
    out = tmp_path / "prof.json"
    rp = _replay(double, snap, "--profile", "graph", "--repeat", "2", "--check-repeats", "--out", str(out))
    assert rp.returncode == 0, rp.stdout + rp.stderr
    s = json.loads(out.read_text())["summary"]
    assert s["launches_timed"] == 9 and s.get("graph_matches_replay") is True, (s, rp.stdout[-2000:])
    assert "8 module/library unload(s) waited for the graph profile" in rp.stdout, rp.stdout[-2000:]


def test_double_event_record_nodes_are_stamped_when_the_graph_runs(double, tmp_path):
    """The double: cuEventRecordWithFlags(EXTERNAL) on a capturing stream is a graph node."""
    prog = textwrap.dedent('''
        import time
        from cuda.bindings import driver as cu
        def ok(r):
            assert int(r[0]) == 0, r
            return r[1] if len(r) == 2 else r[1:]
        ok(cu.cuInit(0)); dev = ok(cu.cuDeviceGet(0)); ctx = ok(cu.cuDevicePrimaryCtxRetain(dev))
        ok(cu.cuCtxSetCurrent(ctx))
        s = ok(cu.cuStreamCreate(1))
        e0, e1 = ok(cu.cuEventCreate(0)), ok(cu.cuEventCreate(0))
        ok(cu.cuStreamBeginCapture(s, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED))
        ok(cu.cuEventRecordWithFlags(e0, s, 1))
        ok(cu.cuEventRecordWithFlags(e1, s, 1))
        g = ok(cu.cuStreamEndCapture(s))
        assert int(cu.cuEventElapsedTime(e0, e1)[0]) != 0        # not recorded while capturing
        x = ok(cu.cuGraphInstantiate(g, 0))
        ok(cu.cuGraphLaunch(x, s))
        t1 = ok(cu.cuEventElapsedTime(e0, e1))
        assert t1 >= 0
        ok(cu.cuEventRecord(e0, s)); time.sleep(0.02); ok(cu.cuGraphLaunch(x, s))
        assert ok(cu.cuEventElapsedTime(e0, e1)) < 20             # both stamped again by the graph
        print("OK")
    ''')
    p = tmp_path / "ev.py"
    p.write_text(prog)
    cp = subprocess.run([sys.executable, str(p)], env=double["env"], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0 and "OK" in cp.stdout, cp.stdout + cp.stderr


# --------------------------------------------------------------------------- CUPTI graph node ids
NODES_WRAPPED = textwrap.dedent('''
    import json, sys
    from cuda.bindings import driver as cu
    from cudasnap.replay.options import ReplayOptions
    from cudasnap.replay.profile import ProfileConfig, profile_replay
    import cudasnap.replay.profile.graphmode as gm

    snap, behaviour = sys.argv[1], sys.argv[2]
    DUR = {"kernel": 10000, "memset": 3000, "memcpy": 4000}

    class FakeCupti:
        """CUPTI as it reports graphs: every record of a graph's work carries the graph id and the
        id of the executable graph's node that ran it; those nodes are clones (other ids) of the
        captured ones.  Node creation/cloning callbacks while tracking.  A memset node is reported
        as a kernel ("memset32_aligned1D", as CUPTI does without the hardware event system), and a
        kernel of no graph (node id 0) runs with each graph launch."""
        def __init__(self):
            self.kernels, self.copies, self.kernel_nodes, self.copy_nodes, self.ext = [], [], [], [], {}
            self.node_created, self.node_clones, self.node_tag = {}, {}, None
            self.now, self.pending, self.tracking, self.corr = 1000, [], False, 0
        def push(self, e): pass
        def pop(self): pass
        def flush(self):
            for kind, rec, node in self.pending:
                (self.kernels if kind == "k" else self.copies).append(rec)
                (self.kernel_nodes if kind == "k" else self.copy_nodes).append(node)
            self.pending = []
        def close(self): self.flush()
        def timestamp(self):
            self.now += 1000
            return self.now
        def track_graph_nodes(self):
            self.tracking = behaviour != "untracked"
            return self.tracking
        def untrack_graph_nodes(self): self.tracking = False
        def emit(self, kind, name, graph, node, dur):
            self.corr += 1
            t0 = self.now + 2000
            self.now = t0 + dur
            if kind == "kernel":
                self.pending.append(("k", (self.corr, t0, t0 + dur, name, 7), (graph, node)))
            else:
                self.pending.append(("c", (self.corr, t0, t0 + dur, 64, kind, 7), (graph, node)))

    fake = FakeCupti()
    gm.open_cupti = lambda backend, warn: fake
    next_id = [100]
    graphs, execs = {}, {}

    class W:
        def __init__(self):
            self.cap = None
        def __getattr__(self, name):
            fn = getattr(cu, name)
            def call(*a):
                kind = {"cuLaunchKernel": "kernel", "cuMemsetD32Async": "memset",
                        "cuMemcpyDtoDAsync": "memcpy"}.get(name)
                if self.cap is not None and kind:
                    next_id[0] += 1
                    nid = next_id[0]
                    if fake.tracking:
                        fake.node_created[nid] = fake.node_tag
                    self.cap.append((nid, kind, len(self.cap)))
                if name == "cuStreamBeginCapture":
                    self.cap = []
                r = fn(*a)
                if name == "cuStreamEndCapture":
                    graphs[int(r[1])], self.cap = self.cap, None
                if name == "cuGraphInstantiate":
                    nodes = []
                    for nid, kind, k in graphs[int(a[0])]:
                        next_id[0] += 1
                        nodes.append((next_id[0], kind, k))
                        if fake.tracking:
                            fake.node_clones[next_id[0]] = nid
                    execs[int(r[1])] = (len(execs) + 1, nodes)
                if name == "cuGraphLaunch" and behaviour != "silent":
                    gid, nodes = execs[int(a[0])]
                    for nid, kind, k in nodes:         # each op its own duration: op k takes 10 us * (k + 1)
                        if kind == "kernel":
                            fake.emit("kernel", "incr", gid, nid, DUR["kernel"] * (k + 1))
                        elif kind == "memset":
                            fake.emit("kernel", "memset32_aligned1D", gid, nid, DUR["memset"])
                        else:
                            fake.emit("memcpy", "memcpy", gid, nid, DUR["memcpy"])
                    fake.emit("kernel", "driver_internal", 0, 0, 500)
                return r
            return call

    cfg = ProfileConfig(mode="graph", repeat=3, warmup=1, backend="cupti" if behaviour == "silent" else "auto")
    run = profile_replay(snap, cfg, ReplayOptions(quiet=True, watchdog=5.0), driver=W())
    print(json.dumps({"exit": run.result.exit_code, "errors": run.result.errors, "report": run.report}, default=str))
''')


def _nodes_wrapped(double, tmp_path, snap, behaviour):
    p = tmp_path / "nodes_wrapped.py"
    p.write_text(NODES_WRAPPED)
    env = dict(double["env"])
    env.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    cp = subprocess.run([sys.executable, str(p), str(snap), behaviour], env=env, capture_output=True, text=True,
                        timeout=120)
    assert cp.stdout.strip(), cp.stderr
    return json.loads(cp.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("behaviour", ["tracked", "untracked"])
def test_graph_mode_per_node_times_from_cupti_graph_node_ids(double, tmp_path, behaviour):
    """incr x2, memset, incr x2, HtoD (a copy node), incr: 7 nodes, 5 launches.  The memset node's
    kernel record and a kernel of no graph do not cost a launch its time nor a run its use."""
    snap = tmp_path / "incr_ms.cusnap"
    facts = incr_memset_program(snap)
    r = _nodes_wrapped(double, tmp_path, snap, behaviour)
    assert r["exit"] == 0, r["errors"]
    rep = r["report"]
    s = rep["summary"]
    assert "error" not in s, s
    assert s["backend"] == "cupti" and s["per_node_method"] == "CUPTI graph node ids"
    assert s["node_mapping"] == ("node creation and clone records" if behaviour == "tracked"
                                 else "node ids in graph order")
    assert s["launches_timed"] == 5
    rows = rep["launches"]
    assert [x["seq"] for x in rows] == facts["seqs"]
    op_index = [0, 1, 3, 4, 6]                  # the launches among the 7 captured operations
    for x, k in zip(rows, op_index):
        assert x["times_us"] == [10.0 * (k + 1)] * 3, (x, k)
        assert x["timing"] == "cupti" and x["cupti_name"] == "incr"
    other = {d["kind"]: d for d in s["other_nodes"]}
    assert other["memset"]["us_per_run"] == 3.0 and other["copy"]["us_per_run"] == 4.0
    [un] = s["unrecorded"]
    assert un["name"] == "driver_internal" and un["per_run"] == 1 and un["us_per_run"] == 0.5
    c = s["check"]
    assert c["kernels_us"] == 10.0 * sum(k + 1 for k in op_index)
    assert c["between_nodes_us"] == 2.0 * 7           # 2 us before each of the 8 records, 7 gaps inside a run
    lo, hi = c["bounds_us"]                           # measured bounds: no gap, gaps as traced
    assert lo == c["kernels_us"] + 7.0 + 0.5 and hi - lo == 14.0
    assert c["within_bounds"] == (lo * 0.95 <= c["graph_us"] <= hi * 1.05)
    assert any("not a recorded launch" in w and "driver_internal" in w for w in rep["warnings"])


# --------------------------------------------------------------------------- units
def test_records_in_windows_keep_graph_node_ids():
    from types import SimpleNamespace
    from cudasnap.replay.profile.graphunits import node_rows, records_in_windows
    c = SimpleNamespace(kernels=[(1, 1100, 1200, "a", 7), (2, 1300, 1400, "a", 7), (3, 5000, 5100, "a", 7)],
                        kernel_nodes=[(1, 11), (1, 12), (1, 11)],
                        copies=[(4, 1250, 1260, 64, "memset", 7)], copy_nodes=[(1, 13)])
    runs = records_in_windows(c, [(("t", 1000), ("t", 2000)), (("t", 4000), ("t", 6000))])
    assert [[(r.name, r.kind, r.node) for r in run] for run in runs] == [
        [("a", "kernel", 11), ("memset", "memset", 13), ("a", "kernel", 12)], [("a", "kernel", 11)]]
    rows = node_rows(runs)                     # the same name twice in a run: two nodes, by node id
    assert [(x["graph_node_id"], x["times_us"]) for x in rows] == [(11, [0.1, 0.1]), (12, [0.1])]
    c2 = SimpleNamespace(kernels=c.kernels, copies=[])  # a collector without node ids: by name order
    assert [x["times_us"] for x in node_rows(records_in_windows(c2, [(("t", 1000), ("t", 2000))]))] == [[0.1], [0.1]]


def test_cupti_collector_keeps_graph_node_ids_per_record():
    from types import SimpleNamespace
    from cudasnap.replay.profile.timeline import CuptiCollector
    A = SimpleNamespace(CONCURRENT_KERNEL=10, KERNEL=1, MEMCPY=2, MEMSET=3, EXTERNAL_CORRELATION=4)
    col = CuptiCollector.__new__(CuptiCollector)
    col.c = SimpleNamespace(ActivityKind=A)
    col.kernels, col.copies, col.kernel_nodes, col.copy_nodes, col.ext = [], [], [], [], {}
    rec = dict(correlation_id=1, start=10, end=20, stream_id=7)
    acts = [SimpleNamespace(kind=10, name="k", graph_id=3, graph_node_id=77, **rec),
            SimpleNamespace(kind=10, name="plain", **rec),              # no graph fields: 0, 0
            SimpleNamespace(kind=3, bytes=64, graph_id=3, graph_node_id=78, **rec)]
    CuptiCollector._active = col
    try:
        CuptiCollector._completed(acts)
    finally:
        CuptiCollector._active = None
    assert col.kernel_nodes == [(3, 77), (0, 0)] and len(col.kernels) == 2
    assert col.copy_nodes == [(3, 78)] and col.copies[0][4] == "memset"


def test_graph_notes_and_median_comparison():
    from cudasnap.replay.profile.report import compare_kernel_medians, graph_notes
    s = {"mode": "graph", "launches": 3, "launches_timed": 3, "per_node_method": "CUPTI graph node ids",
         "node_mapping": "node creation and clone records", "total_us": 100.0,
         "other_nodes": [{"kind": "memset", "nodes": 1, "timed": 1, "us_per_run": 2.0}],
         "unrecorded": [{"name": "memset32_aligned1D", "per_run": 1.0, "us_per_run": 1.0}],
         "check": {"graph_us": 100.0, "kernels_us": 90.0, "other_nodes_us": 2.0, "unrecorded_us": 1.0,
                   "between_nodes_us": 5.0, "sum_us": 98.0, "diff_pct": -2.0, "within_5pct": True,
                   "kernel_share_pct": 90.0}}
    text = "\n".join(graph_notes(s))
    assert "per-node times: CUPTI graph node ids (node creation and clone records); 3 of 3 launches timed" in text
    assert "memset x1" in text and "memset32_aligned1D x1" in text
    assert "= 98.0 us vs the graph's 100.0 us (-2.0%, within 5%)" in text
    s["check"].update(between_nodes_us=9.0, tracing_us=4.0, between_nodes_traced_us=9.0,
                      gap_model={"nodes": 2000, "tracing_per_node_us": 0.17, "chain_untraced_us": 1250.0,
                                 "chain_traced_span_us": 1590.0})
    text = "\n".join(graph_notes(s))
    assert "between nodes 9.0 us - tracing 4.0 us = 98.0 us" in text
    assert "tracing: 170 ns per node that CUPTI adds" in text and "2000 empty kernels" in text
    g = {"launches": [{"name": "a", "cupti_name": "A", "median_us": 10.4}, {"name": "b", "median_us": 2.0},
                      {"name": "c", "median_us": 50.0}]}
    t = {"launches": [{"name": "a", "cupti_name": "A", "time_us": 10.0}, {"name": "b", "time_us": 2.1},
                      {"name": "d", "time_us": 9.0}]}
    assert [(d["name"], round(d["diff_pct"], 1)) for d in compare_kernel_medians(g, t)] == [("A", 4.0)]
    s["timeline_check"] = {"min_us": 5.0, "limit_pct": 5.0, "compared": 18, "within": False, "timeline_backend": "cupti",
                           "outside": [{"name": "gelu_bwd", "graph_us": 5.1, "other_us": 5.4, "diff_pct": -5.6}]}
    text = "\n".join(graph_notes(s))
    assert "check against timeline mode (a second replay, cupti): 18 kernels of >= 5 us, 1 outside 5%" in text
    assert "gelu_bwd: graph 5.1 us, timeline 5.4 us (-5.6%)" in text


def test_cupti_collector_follows_node_creation_and_cloning():
    """Resource callbacks: a created node is tagged with the operation being issued; a cloned
    node (instantiation) points to its original.  cbdata may be the ResourceData or its address."""
    from types import SimpleNamespace as NS
    from cudasnap.replay.profile.timeline import CuptiCollector
    graph_data = {0x500: NS(node=0x10, original_node=0), 0x600: NS(node=0x20, original_node=0x10)}
    resources = {0x700: NS(resource_descriptor=0x600)}
    c = NS(CallbackDomain=NS(RESOURCE=3, DRIVER_API=1), CallbackIdResource=NS(GRAPHNODE_CREATED=13, GRAPHNODE_CLONED=20),
           ResourceData=NS(from_ptr=lambda p, readonly=True: resources[p]),
           GraphData=NS(from_ptr=lambda p, readonly=True: graph_data[p]),
           get_graph_node_id=lambda h: 1000 + h)
    col = CuptiCollector.__new__(CuptiCollector)
    col.c, col.node_created, col.node_clones, col.node_tag = c, {}, {}, 4
    col._on_callback(None, 3, 13, NS(resource_descriptor=0x500))     # created while operation 4 was issued
    col._on_callback(None, 3, 20, 0x700)                              # cloned at instantiation
    col._on_callback(None, 1, 13, NS(resource_descriptor=0x500))     # another domain: ignored
    assert col.node_created == {1000 + 0x10: 4} and col.node_clones == {1000 + 0x20: 1000 + 0x10}


class _GateDriver:
    """ReplayContext.raw stand-in: host memory is a ctypes buffer; the stream's wait is checked when the
    host releases it (the word must reach the value waited for)."""

    def __init__(self, wait_ok=True):
        import ctypes
        self.buf = ctypes.create_string_buffer(8)
        self.calls, self.seen, self.wait_ok = [], [], wait_ok

    def call(self, name, *args):     # the ReplayView call LaunchGate makes
        self.calls.append((name, args))
        self.seen.append(self.word())          # the host word when the call was issued
        if name == "cuMemHostAlloc":
            import ctypes
            return ctypes.addressof(self.buf)
        if name == "cuMemHostGetDevicePointer":
            return 0xD000
        if name == "cuStreamWaitValue32" and not self.wait_ok:
            raise RuntimeError("CUDA_ERROR_NOT_SUPPORTED")
        return None

    def word(self):
        return struct.unpack_from("<I", self.buf.raw)[0]


def test_launch_gate_holds_the_stream_until_the_launch_was_issued():
    from cudasnap.replay.profile.common import LaunchGate
    d = _GateDriver()
    gate = LaunchGate.open(d, "S")
    assert gate is not None and d.word() == 1          # the trial hold was released
    d.calls.clear()
    d.seen.clear()
    LaunchGate.launch_timed(d, gate, "G", "S", "e0", "e1")
    assert [c[0] for c in d.calls] == ["cuStreamWaitValue32", "cuEventRecord", "cuGraphLaunch", "cuEventRecord"]
    assert d.seen == [1, 1, 1, 1]                       # held while issued: the GPU waits for 2
    assert d.calls[0][1] == ("S", 0xD000, 2, 0) and d.word() == 2
    with pytest.raises(RuntimeError):                   # issuing failed: the stream is released anyway
        with gate:
            raise RuntimeError("launch failed")
    assert d.word() == 3
    gate.close()
    assert d.calls[-1][0] == "cuMemFreeHost"


def test_launch_gate_is_none_where_stream_memory_operations_fail():
    from cudasnap.replay.profile.common import LaunchGate
    d = _GateDriver(wait_ok=False)
    assert LaunchGate.open(d, "S") is None
    assert d.calls[-1][0] == "cuMemFreeHost"


def test_graph_mode_that_times_no_node_is_an_error(double, tmp_path):
    """CUPTI asked for and its records match no node: the replay verified, but no per-node time
    was taken, so the run does not claim a profile (exit 2, the reason named)."""
    snap = tmp_path / "incr_ms.cusnap"
    incr_memset_program(snap)
    r = _nodes_wrapped(double, tmp_path, snap, "silent")
    assert r["exit"] == 2, r
    assert any("none of the 5 launches in the graph got a per-node time" in e for e in r["errors"]), r["errors"]
    assert r["report"]["run"]["exit_code"] == 2


def test_graph_mode_keeps_mapped_host_memory_the_program_freed(double, capture, tmp_path):
    """hostfree.c: a kernel reads pinned host memory through its device address, the program
    frees it, and a later kernel runs: the graph holds both launches and runs after the free, so
    the host memory's free waits for it (the double answers a kernel on unmapped memory with
    CUDA_ERROR_ILLEGAL_ADDRESS, as the GPU did)."""
    cp, snap = capture(double["progs"]["hostfree"])
    assert cp.returncode == 0 and "HOSTFREE 3072" in cp.stdout, cp.stdout + cp.stderr
    out = tmp_path / "prof.json"
    rp = _replay(double, snap, "--profile", "graph", "--repeat", "2", "--out", str(out))
    assert rp.returncode == 0, rp.stdout + rp.stderr
    s = json.loads(out.read_text())["summary"]
    assert "error" not in s and s["launches_timed"] == 2 and s.get("frees_held", 0) >= 1, s
