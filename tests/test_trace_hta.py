"""The timeline trace read by Holistic Trace Analysis (HTA), the PyTorch team's reader of
Kineto traces, on the CUDA test double: what HTA finds (kernels, counts, durations, memory
operations, the launch behind each kernel, the rank, wall-clock time) equals `--out`."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from hta.common.trace import trace_event_timestamp_to_unixtime_ns
from hta.configs.env_options import HTA_DISABLE_NS_ROUNDING_ENV
from hta.trace_analysis import TraceAnalysis

from test_replay_habits import A_NAME, B_NAME, C_NAME, names_program

STEADY = {"CUDA_DOUBLE_SLOW": "*:1", "CUDA_DOUBLE_SLOW_FLOOR_US": "300"}
pytestmark = pytest.mark.filterwarnings("ignore:The inplace keyword")    # pandas, about HTA's own code


def _timeline(double, snap, trace: Path, out: Path):
    env = dict(double["env"])
    env.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    env.update(STEADY)
    t0 = time.time_ns()
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snap), "--profile", "timeline",
                         "--trace", str(trace), "--out", str(out), "-q"], env=env, capture_output=True, text=True,
                        timeout=120)
    t1 = time.time_ns()
    assert cp.returncode == 0, cp.stdout + cp.stderr
    return json.loads(out.read_text()), (t0, t1)


def _hta(trace_dir: Path):
    logging.getLogger("hta").setLevel(logging.ERROR)
    a = TraceAnalysis(trace_dir=str(trace_dir))
    df = a.t.get_trace(0).copy()
    sym = a.t.symbol_table.get_sym_table()
    df["name_s"] = df["name"].map(lambda i: sym[i])
    df["cat_s"] = df["cat"].map(lambda i: sym[i])
    return a, df


def _breakdown(a):
    """HTA's kernel breakdown with every kernel listed: {name: (type, sum_us)}."""
    _types, kernels = a.get_gpu_kernel_breakdown(visualize=False, duration_ratio=1.0, num_kernels=1000)
    return {r["name"]: (r["kernel_type"], float(r["sum (us)"])) for _i, r in kernels.iterrows()}


def _assert_kernels_match(prof, df, rows, exact: bool):
    """Every kernel of --out is a COMPUTATION row of HTA, with the same launch count and the
    same total: to the trace's ns resolution (exact), or within HTA's default rounding (each
    event's start up and end down to whole microseconds)."""
    kernels = {k.get("demangled") or k["name"]: k for k in prof["kernels"]}
    counted = Counter(df[df["cat_s"] == "kernel"]["name_s"])
    assert dict(counted) == {n: k["launches"] for n, k in kernels.items()}
    for name, k in kernels.items():
        kind, total = rows[name]
        assert kind == "COMPUTATION"
        slack = 0.001 * k["launches"] + 1e-6 if exact else 2 * k["launches"]
        assert k["total_us"] - slack <= total <= k["total_us"] + 0.001 * k["launches"] + 1e-6, (name, total, k)


def test_hta_reads_the_timeline_trace_as_out_says(double, tmp_path, monkeypatch):
    monkeypatch.setenv(HTA_DISABLE_NS_ROUNDING_ENV, "1")          # ns as written: totals compare exactly
    snap = tmp_path / "names.cusnap"
    pattern = "ABABCABCAB"
    seqs = names_program(snap, pattern)["seqs"]
    tdir = tmp_path / "trace"
    tdir.mkdir()
    prof, (w0, w1) = _timeline(double, snap, tdir / "replay.json", tmp_path / "prof.json")
    names = {k["name"]: k.get("demangled") for k in prof["kernels"]}
    # C++ kernels appear demangled (the double runs incr under both mangled names)
    assert names == {A_NAME: "incr(int*, int)", B_NAME: "void demo::incr<int>(int*, int)", C_NAME: "add_one"}
    a, df = _hta(tdir)
    meta = a.t.meta_data[0]
    assert meta["distributedInfo"] == {"rank": 0, "world_size": 1}
    assert meta["deviceProperties"][0]["name"] == "cudasnap test double"
    rows = _breakdown(a)
    _assert_kernels_match(prof, df, rows, exact=True)
    assert {k["name"]: k["launches"] for k in prof["kernels"]} == \
        {A_NAME: len(seqs["A"]), B_NAME: len(seqs["B"]), C_NAME: len(seqs["C"])}
    # memory operations: 3 H2D, 3 D2H and the memset, as MEMORY rows
    mem = Counter(df[df["cat_s"].isin(["gpu_memcpy", "gpu_memset"])]["name_s"])
    assert mem == {"Memcpy HtoD": 3, "Memcpy DtoH": 3, "Memset (Device)": 1}
    assert all(rows[n][0] == "MEMORY" for n in mem)
    assert set(rows) == set(names.values()) | set(mem)
    # HTA ties each kernel to the driver call that launched it (correlation = the call's seq)
    kern = df[df["cat_s"] == "kernel"]
    assert sorted(kern["correlation"]) == sorted(s for v in seqs.values() for s in v)
    launch = df.set_index("index")
    for _i, k in kern.iterrows():
        host = launch.loc[k["index_correlation"]]
        assert host["name_s"] == "cuLaunchKernel" and host["cat_s"] == "cuda_driver"
        assert host["correlation"] == k["correlation"] and host["ts"] <= k["ts"]
    # wall-clock time: the first kernel ran while the replay process did
    first = kern["ts"].min()
    assert w0 <= trace_event_timestamp_to_unixtime_ns(first, meta) <= w1


def test_hta_graph_launches_and_gzip(double, capture, tmp_path):
    """Every launch form (Ex, cooperative, library kernels) and the program's own graphs,
    timed whole without CUPTI; the trace gzip-compressed, as HTA also reads it."""
    cp, snap = capture(double["progs"]["launch_forms"])
    assert cp.returncode == 0, cp.stderr
    tdir = tmp_path / "trace"
    tdir.mkdir()
    prof, _w = _timeline(double, snap, tdir / "replay.json.gz", tmp_path / "prof.json")
    a, df = _hta(tdir)
    rows = _breakdown(a)
    _assert_kernels_match(prof, df, rows, exact=False)
    graphs = sorted(float(v[1]) for n, v in rows.items() if n.startswith("cuGraphLaunch #"))
    want = sorted(prof["summary"]["graph_launch_us"])
    assert len(graphs) == len(want) == prof["summary"]["graph_launches"] == 2
    assert all(w - 2 <= g <= w + 0.001 for g, w in zip(graphs, want)), (graphs, want)
    assert sum(prof["summary"].get("graph_launch_us") or []) > 0


def test_trace_rank_of_a_job_replay(monkeypatch):
    """A rank of a job replay writes its own rank and the world size (HTA keys ranks by it)."""
    from cudasnap.replay.group import ENV_NRANKS, ENV_RANK
    from cudasnap.replay.profile import trace
    monkeypatch.setenv(ENV_RANK, "3")
    monkeypatch.setenv(ENV_NRANKS, "4")
    assert trace._rank() == (3, 4)
    t = trace.trace_events([{"kind": "kernel", "name": "k", "seq": 1, "start_ns": 5000, "end_ns": 7000}],
                           rank=3, world_size=4, unix_offset_ns=10**18)
    assert t["distributedInfo"] == {"rank": 3, "world_size": 4} and t["baseTimeNanoseconds"] == 10**18 + 5000
    monkeypatch.setenv(ENV_RANK, "x")
    assert trace._rank() == (0, 1)
