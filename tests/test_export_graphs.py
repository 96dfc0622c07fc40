"""`cudasnap export` of CUDA graphs built node by node (cuGraphAdd*Node, cuGraphAddNode,
cuGraph*SetParams: how XLA's command buffers build theirs), on the CUDA test double: capture
progs/graphnodes.c, replay it, export the snapshot and an extract of one graph launch, build each
program against the double and run it; and the C text of the node kinds the double does not run
(copy, event and child-graph nodes, v1 kernel node params, cuGraphExecUpdate), checked against a
real cuda.h where one is installed."""
from __future__ import annotations

import glob
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from cudasnap.formats import SnapshotReader, SnapshotWriter
from cudasnap.formats.abi import base_name

pytestmark = pytest.mark.skipif(shutil.which("make") is None or shutil.which(os.environ.get("CC", "cc")) is None,
                                reason="needs make and a C compiler")

CC = os.environ.get("CC", "cc")


def _cli(double, *args):
    return subprocess.run([sys.executable, "-m", "cudasnap", *map(str, args)], env=double["env"],
                          capture_output=True, text=True, timeout=180)


def _build_and_run(double, out: Path, *env_extra):
    cp = subprocess.run(["make", "-s", "-C", str(out), f"CC={CC}", f"CFLAGS=-O1 -Wall -I{double['cuda_include']}",
                         f"LDFLAGS=-L{double['libdir']}", "CUDA_HOME=/nonexistent"],
                        capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    env = dict(double["env"])
    env.update(dict(env_extra))
    return subprocess.run([str(out / "replay")], env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def graphnodes(double, capture):
    cp, snap = capture(double["progs"]["graphnodes"])
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "GRAPHNODES OK" in cp.stdout
    return snap


def _calls(snap):
    with SnapshotReader(snap) as r:
        return [rec for rec in r.records("c")]


def test_capture_records_node_structs_and_packed_arguments(graphnodes):
    recs = _calls(graphnodes)
    names = [base_name(r["f"]) for r in recs]
    for b in ("cuGraphCreate", "cuGraphAddMemsetNode", "cuGraphAddKernelNode", "cuGraphAddNode",
              "cuGraphAddEmptyNode", "cuGraphAddDependencies", "cuGraphExecKernelNodeSetParams",
              "cuGraphKernelNodeSetParams"):
        assert b in names, b
    for r in recs:
        b = base_name(r["f"])
        if b in ("cuGraphAddKernelNode", "cuGraphExecKernelNodeSetParams", "cuGraphKernelNodeSetParams"):
            assert len(r["a"]["nodeParams"]) == 72 and r["x"]["params"], r
        if b == "cuGraphAddNode" and struct.unpack_from("<I", r["a"]["nodeParams"], 0)[0] == 0:
            assert len(r["a"]["nodeParams"]) == 256 and r["x"]["params"], r
    assert sum(1 for n in names if n == "cuGraphLaunch") == 5


def test_replay_of_a_graph_built_node_by_node_verifies(double, graphnodes):
    cp = _cli(double, "replay", graphnodes)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "mismatches                             0" in cp.stdout


def test_export_of_a_graph_built_node_by_node_builds_runs_and_verifies(double, graphnodes, tmp_path):
    out = tmp_path / "exp"
    ex = _cli(double, "export", graphnodes, "-o", out)
    assert ex.returncode == 0, ex.stdout + ex.stderr
    src = (out / "replay.c").read_text()
    assert "static CUgraphNode gnode[7];" in src
    assert "cuGraphAddMemsetNode(&gnode[0], graph[0], NULL, 0, &m_, c_)" in src
    assert "CUgraphNode d_[] = {gnode[0]}; CK(cuGraphAddKernelNode(&gnode[1], graph[0], d_, 1, &k_));" in src
    assert "CU_LAUNCH_PARAM_BUFFER_POINTER, params_live(P" in src
    assert "CK(cuGraphAddEmptyNode(&gnode[3], graph[0], d_, 2));" in src
    assert "#if CUDA_VERSION >= 12030" in src and "cuGraphAddDependencies(graph[0], f_, t_, NULL, 1)" in src
    assert "cuGraphExecKernelNodeSetParams(gexec[0], gnode[4], &k_)" in src
    assert "cuGraphKernelNodeSetParams(gnode[5], &k_)" in src
    run = _build_and_run(double, out)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "OK: 7 device-to-host results verified" in run.stdout
    # the results are the graph's work: a planted wrong value in the last launch's a[] is caught
    # (add_one runs twice a launch: its 6th run is the third launch's last node)
    bad = _build_and_run(double, out, ("CUDA_DOUBLE_CORRUPT", "add_one:6"))
    assert bad.returncode == 1 and "MISMATCH call #24 cuMemcpyDtoH" in bad.stderr, bad.stdout + bad.stderr
    real = _real_cuda_include()
    if real:
        cp = subprocess.run([CC, "-fsyntax-only", "-Wall", f"-I{real}", str(out / "replay.c")],
                            capture_output=True, text=True, timeout=120)
        assert cp.returncode == 0, cp.stderr


def _graph_launches(snap):
    return [r["s"] for r in _calls(snap) if base_name(r["f"]) == "cuGraphLaunch"]


def test_extract_of_one_graph_launch_exports_and_verifies(double, graphnodes, tmp_path):
    # the 4th graph launch: after cuGraphExecKernelNodeSetParams changed a node of its graph
    n = _graph_launches(graphnodes)[3]
    small = tmp_path / "launch.cusnap"
    ex = _cli(double, "extract", graphnodes, "--launch", n, "--memory", "all", "-o", small, "--check")
    assert ex.returncode == 0, ex.stdout + ex.stderr
    assert "expected results: 3 range(s)" in ex.stdout, ex.stdout
    out = tmp_path / "exp_launch"
    cp = _cli(double, "export", small, "-o", out)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    src = (out / "replay.c").read_text()
    assert "cuGraphExecKernelNodeSetParams(gexec[0], gnode[4], &k_)" in src
    run = _build_and_run(double, out)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "OK: 3 device-to-host results verified" in run.stdout
    bad = _build_and_run(double, out, ("CUDA_DOUBLE_CORRUPT", "fill:1"))
    assert bad.returncode == 1, bad.stdout + bad.stderr


def test_extract_of_one_graph_launch_finds_the_memory_its_nodes_use(double, graphnodes, tmp_path):
    n = _graph_launches(graphnodes)[3]
    small = tmp_path / "launch.cusnap"
    ex = _cli(double, "extract", graphnodes, "--launch", n, "-o", small)
    assert ex.returncode == 0, ex.stdout + ex.stderr
    assert "expected results: 0 range(s)" not in ex.stdout, ex.stdout
    rp = _cli(double, "replay", small)
    assert rp.returncode == 0 and "D2H" in rp.stdout, rp.stdout + rp.stderr


# ------------------------------------------------------------------ node kinds the double does not run
def _real_cuda_include():
    for d in [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-1[2-9]*"))]:
        if d and os.path.isfile(os.path.join(d, "include", "cuda.h")):
            return os.path.join(d, "include")
    return None


def _spliced(src, dst, extra, after="cuGraphInstantiateWithFlags"):
    """dst: src's records up to its first `after` call, then the calls `extra` makes from the
    recorded handles (a dict: graph, exec, ctx, fn, nodes, allocations)."""
    with SnapshotReader(src) as r, SnapshotWriter(dst, dict(r.raw_header)) as w:
        h = {"nodes": [], "allocs": []}
        last = 0
        for rec in r.records():
            if rec.get("k") == "c":
                a, b = rec.get("a") or {}, base_name(rec.get("f") or "")
                if b == "cuCtxCreate":
                    h["ctx"] = a["pctx"]
                elif b == "cuGraphCreate":
                    h["graph"] = a["phGraph"]
                elif b == "cuModuleGetFunction" and a.get("name") == "add_one":
                    h["fn"] = a["hfunc"]
                elif b == "cuMemAlloc":
                    h["allocs"].append(a["dptr"])
                elif b.startswith("cuGraphAdd") and "phGraphNode" in a:
                    h["nodes"].append(a["phGraphNode"])
                x = rec.get("x")
                if isinstance(x, dict):
                    rec = dict(rec, x={k: ({**v, "blob": w.add_blob(r.blob(v["blob"]))}
                                           if isinstance(v, dict) and "blob" in v else v) for k, v in x.items()})
                last = rec["s"]
            w.write(rec)
            if rec.get("k") == "c" and base_name(rec.get("f") or "") == after:
                h["exec"] = rec["a"]["phGraphExec"]
                break
        for i, (f, a, x) in enumerate(extra(h)):
            c = {"k": "c", "s": last + 1 + i, "tid": 1, "t0": 0, "t1": 1, "f": f, "a": a, "r": 0}
            if x:
                c["x"] = x
            w.write(c)
    return dst


def _memcpy3d(src, dst, n, src_type=2, dst_type=2):
    b = bytearray(200)
    struct.pack_into("<I", b, 32, src_type)
    struct.pack_into("<Q", b, 48 if src_type != 1 else 40, src)
    struct.pack_into("<I", b, 88 + 32, dst_type)
    struct.pack_into("<Q", b, 88 + 48, dst)
    struct.pack_into("<QQQ", b, 176, n, 1, 1)
    return bytes(b)


def _node_params(t, union=b""):
    return struct.pack("<I12x", t) + union.ljust(232, b"\0") + bytes(8)


def test_other_node_kinds_translate(double, graphnodes, tmp_path):
    ev, n0, n1, n2, n3 = 0x7e0001, 0x7e0101, 0x7e0102, 0x7e0103, 0x7e0104

    def extra(h):
        a, b = h["allocs"][0], h["allocs"][1]
        kv1 = struct.pack("<Q7I", h["fn"], 2, 1, 1, 128, 1, 1, 0) + bytes(56 - 36)
        memset_u = struct.pack("<QQIIQQQ", b, 0, 3, 4, 16, 1, 0)
        edge = bytes([0, 0, 1, 0, 0, 0, 0, 0])      # a programmatic edge
        return [
            ("cuEventCreate", {"phEvent": ev, "Flags": 0}, None),
            ("cuGraphAddMemcpyNode", {"phGraphNode": n0, "hGraph": h["graph"], "dependencies": 0, "numDependencies": 0,
                                      "copyParams": _memcpy3d(a, b, 64), "ctx": h["ctx"]}, None),
            ("cuGraphAddNode_v2", {"phGraphNode": n1, "hGraph": h["graph"], "dependencies": struct.pack("<Q", n0),
                                   "dependencyData": edge, "numDependencies": 1,
                                   "nodeParams": _node_params(7, struct.pack("<Q", ev))}, None),
            ("cuGraphAddKernelNode", {"phGraphNode": n2, "hGraph": h["graph"], "dependencies": 0, "numDependencies": 0,
                                      "nodeParams": kv1}, {"params": struct.pack("<Qi4x", a, 16)}),
            ("cuGraphAddChildGraphNode", {"phGraphNode": n3, "hGraph": h["graph"], "dependencies": 0,
                                          "numDependencies": 0, "childGraph": h["graph"]}, None),
            ("cuGraphExecNodeSetParams", {"hGraphExec": h["exec"], "hNode": h["nodes"][0],
                                          "nodeParams": _node_params(2, memset_u)}, None),
            ("cuGraphExecUpdate_v2", {"hGraphExec": h["exec"], "hGraph": h["graph"], "resultInfo": bytes(24)}, None),
            ("cuGraphRetainUserObject", {"graph": h["graph"], "object": 1, "count": 1, "flags": 1}, None),
            # a capture into the existing graph after a node (XLA's command buffers)
            ("cuStreamCreate", {"phStream": 0x7e0301, "Flags": 1}, None),
            ("cuStreamBeginCaptureToGraph", {"hStream": 0x7e0301, "hGraph": h["graph"],
                                             "dependencies": struct.pack("<Q", n0), "dependencyData": 0,
                                             "numDependencies": 1, "mode": 0}, None),
            ("cuStreamEndCapture", {"hStream": 0x7e0301, "phGraph": h["graph"]}, None),
        ]

    snap = _spliced(graphnodes, tmp_path / "kinds.cusnap", extra)
    out = tmp_path / "exp_kinds"
    ex = _cli(double, "export", snap, "-o", out)
    assert ex.returncode == 0, ex.stdout + ex.stderr
    assert "exported as plain dependencies" in ex.stdout
    src = (out / "replay.c").read_text()
    assert "y_.srcDevice = TR(y_.srcDevice);" in src
    assert "cuGraphAddMemcpyNode(&gnode[7], graph[0], NULL, 0, &y_, c_)" in src
    assert "CUgraphNode d_[] = {gnode[7]}; CK(cuGraphAddEventRecordNode(&gnode[8], graph[0], d_, 1, event[0]));" in src
    assert "k_.func = fn[0];" in src and "cuGraphAddKernelNode(&gnode[9], graph[0], NULL, 0, &k_)" in src
    assert "cuGraphAddChildGraphNode(&gnode[10], graph[0], NULL, 0, graph[0])" in src
    assert "cuGraphExecMemsetNodeSetParams(gexec[0], gnode[0], &m_, c_)" in src and "m_.value = 3;" in src
    assert "CUgraphExecUpdateResultInfo u_; CK(cuGraphExecUpdate(gexec[0], graph[0], &u_));" in src
    assert "CUgraphNode d_[] = {gnode[7]}; CK(cuStreamBeginCaptureToGraph(" in src and "graph[0], d_, NULL, 1," in src
    assert "{ CUgraph g_; CK(cuStreamEndCapture(" in src
    real = _real_cuda_include()
    if real is None:
        pytest.skip("no CUDA toolkit cuda.h to check the C against")
    cp = subprocess.run([CC, "-fsyntax-only", "-Wall", f"-I{real}", str(out / "replay.c")],
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr


@pytest.mark.parametrize("what,call,msg", [
    ("conditional", lambda h: ("cuGraphAddNode_v2", {"phGraphNode": 0x7e0201, "hGraph": h["graph"], "dependencies": 0,
                                                      "dependencyData": 0, "numDependencies": 0,
                                                      "nodeParams": _node_params(13, bytes(40))}, None),
     "conditional graph nodes (CUgraphNodeType 13) are not exported"),
    ("host copy", lambda h: ("cuGraphAddMemcpyNode", {"phGraphNode": 0x7e0202, "hGraph": h["graph"], "dependencies": 0,
                                                       "numDependencies": 0, "ctx": h["ctx"],
                                                       "copyParams": _memcpy3d(0x7f0000001000, h["allocs"][0], 64, 1)},
                             None),
     "the copy node's source is host memory of the recorded process"),
    ("kernel node without arguments", lambda h: ("cuGraphAddKernelNode_v2", {
        "phGraphNode": 0x7e0203, "hGraph": h["graph"], "dependencies": 0, "numDependencies": 0,
        "nodeParams": struct.pack("<Q7I", h["fn"], 1, 1, 1, 1, 1, 1, 0) + bytes(36)}, None),
     "the kernel node's packed arguments were not captured"),
])
def test_export_refuses_what_it_cannot_rebuild(double, graphnodes, tmp_path, what, call, msg):
    snap = _spliced(graphnodes, tmp_path / "refused.cusnap", lambda h: [call(h)])
    ex = _cli(double, "export", snap, "-o", tmp_path / "out")
    assert ex.returncode == 2, ex.stdout + ex.stderr
    assert msg in ex.stderr, ex.stderr
    assert not (tmp_path / "out" / "replay.c").exists()


def test_nodes_a_program_asks_for_are_mapped_by_position(double, capture, tmp_path):
    """progs/capnodes.c changes a kernel node of a graph made by stream capture, found through
    cuGraphGetNodes: replay asks the live graph for its nodes and maps the recorded handles, so
    the change lands on the same node and the results verify."""
    cp, snap = capture(double["progs"]["capnodes"])
    assert cp.returncode == 0 and "CAPNODES OK" in cp.stdout, cp.stdout + cp.stderr
    calls = [r["f"] for r in _calls(snap)]
    assert "cuGraphGetNodes" in calls and "cuGraphGetRootNodes" in calls
    rp = subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snap), "--json"], env=double["env"],
                        capture_output=True, text=True, timeout=120)
    assert rp.returncode == 0, rp.stdout + rp.stderr
    res = json.loads(rp.stdout)
    assert res["d2h_verified"] == 2 and not res["mismatches"] and not res["errors"], rp.stdout
    out = tmp_path / "exp"                      # export asks its own graph the same way
    ex = _cli(double, "export", snap, "-o", out)
    assert ex.returncode == 0, ex.stdout + ex.stderr
    assert "CK(cuGraphGetNodes(graph[0], l_, &n_));" in (out / "replay.c").read_text()
    run = _build_and_run(double, out)
    assert run.returncode == 0 and "OK: 2 device-to-host results verified" in run.stdout, run.stdout + run.stderr
