"""GPU suite, `--profile metrics` (hardware counters through CUPTI's range profiler).

- an nvcc program (workloads/metrics_kernels.cu: a memory-bound triad and a compute-bound FMA
  kernel, 3 launches each) profiled with every section: the replay still verifies (every pass
  started from restored memory), the FLOP counts are the ones the source implies, the triad is
  memory-bound at 1/6 FLOP per byte and the FMA kernel compute-bound, theoretical occupancy is
  known, the stats SQLite table joins the kernel rows, the roofline page is written;
- where `ncu` is on PATH: SpeedOfLight and Occupancy figures within 5% of ncu's (two ncu runs;
  within ncu's own spread when larger; tests/gpu/metrics_vs_ncu.py says how) for both kernels.
Rows go to $CUDASNAP_GPU_RESULTS through record_result."""
from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys

import pytest

from gpuutil import HERE, WORK, _build, record_result

pytestmark = pytest.mark.gpu
PY = sys.executable
ITERS = 2048                     # fma_chain's loop count (metrics_kernels.cu)
N = 64 << 20                     # stream_triad's elements


def _have_profiler() -> bool:
    try:
        from cupti import profiler_host  # noqa: F401
        return True
    except Exception:
        return False


@pytest.fixture(scope="module")
def metrics_binary():
    src = HERE / "workloads" / "metrics_kernels.cu"
    return _build(src, WORK / "metrics_kernels", ["nvcc", "-O3", "-arch=sm_90", "-o", str(WORK / "metrics_kernels"), str(src)])


@pytest.fixture(scope="module")
def metrics_snapshot(metrics_binary):
    snap = WORK / "snaps" / "metrics_kernels.cusnap"
    snap.parent.mkdir(parents=True, exist_ok=True)
    cp = subprocess.run([PY, "-m", "cudasnap", "capture", "-f", "-o", str(snap), "--", str(metrics_binary)],
                        capture_output=True, text=True, timeout=600)
    assert cp.returncode == 0, cp.stderr[-2000:]
    return snap


def _sms() -> int:
    from cuda.bindings import driver as cu
    cu.cuInit(0)
    return int(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0)[1])


def test_metrics_nvcc_program(metrics_snapshot, tmp_path):
    if not _have_profiler():
        pytest.skip("cupti-python is not installed on the GPU machine")
    out, page = tmp_path / "m.json", tmp_path / "roof.html"
    cp = subprocess.run([PY, "-m", "cudasnap", "replay", str(metrics_snapshot), "--profile", "metrics", "--out", str(out),
                         "--html", str(page), "--watchdog", "300"], capture_output=True, text=True, timeout=1200)
    rep = json.loads(out.read_text()) if out.exists() else {}
    ks = {k["name"]: k for k in rep.get("kernels", [])}
    row = {"test": "metrics_nvcc", "rc": cp.returncode, "summary": rep.get("summary"),
           "warnings": rep.get("warnings", [])[:8], "stdout": cp.stdout[-3000:], "stderr": cp.stderr[-1500:],
           "kernels": {n: {"metrics": k.get("metrics"), "occupancy": k.get("occupancy"), "roofline": k.get("roofline")}
                       for n, k in ks.items()}}
    record_result(row)
    print(cp.stdout)
    assert cp.returncode == 0, row                        # verified: every pass started from restored memory
    s = rep["summary"]
    assert s["launches_profiled"] == 6 and s["passes"] >= 1 and not s.get("not_collected"), s
    triad, fma = ks["stream_triad"], ks["fma_chain"]
    assert triad["launches"] == 3 and fma["launches"] == 3
    threads = _sms() * 8 * 256
    m = fma["metrics"]
    assert m["sm__sass_thread_inst_executed_op_ffma_pred_on.sum"] == pytest.approx(threads * ITERS * 64, rel=1e-3), m
    assert triad["metrics"]["sm__sass_thread_inst_executed_op_ffma_pred_on.sum"] == pytest.approx(N, rel=1e-3)
    # the triad moves 12 bytes per element (two reads, one write) for 2 FLOP
    rt, rf = triad["roofline"], fma["roofline"]
    assert rt["dram_bytes"] == pytest.approx(3 * 12 * N, rel=0.1), rt
    assert 0.1 < rt["intensity"] < 0.25 and rt["bound"] == "memory", rt
    assert rf["bound"] == "compute" and rf["pct_of_roof"] > 50, rf
    assert triad["metrics"]["dram__throughput.avg.pct_of_peak_sustained_elapsed"] > 50
    assert m["sm__throughput.avg.pct_of_peak_sustained_elapsed"] > 50
    occ = fma["occupancy"]
    assert occ["theoretical_pct"] == 100.0 and occ["source"] == "driver", occ
    assert 0 < m["sm__warps_active.avg.pct_of_peak_sustained_active"] <= 100
    assert "arithmetic intensity" in page.read_text()
    # the stats export with the metrics table
    db = tmp_path / "x.sqlite"
    st = subprocess.run([PY, "-m", "cudasnap", "stats", str(metrics_snapshot), "--out", str(db), "--kernel-metrics",
                         str(out)], capture_output=True, text=True, timeout=600)
    assert st.returncode == 0, st.stderr
    con = sqlite3.connect(db)
    n = con.execute("SELECT COUNT(DISTINCT m.correlationId) FROM CUDASNAP_KERNEL_METRICS m JOIN "
                    "CUPTI_ACTIVITY_KIND_KERNEL k ON k.correlationId = m.correlationId").fetchone()[0]
    con.close()
    assert n == 6


def test_metrics_match_ncu(metrics_binary, tmp_path):
    if not shutil.which("ncu"):
        pytest.skip("ncu is not on PATH")
    if not _have_profiler():
        pytest.skip("cupti-python is not installed on the GPU machine")
    sys.path.insert(0, str(HERE))
    from metrics_vs_ncu import print_table, side_by_side
    res = side_by_side("nvcc_metrics", [str(metrics_binary)], tmp_path, min_us=20.0)
    record_result({"test": "metrics_vs_ncu", **res})
    print_table("nvcc_metrics", res["rows"])
    kernels = {r["kernel"] for r in res["rows"]}
    assert kernels == {"stream_triad", "fma_chain"}, res
    from metrics_vs_ncu import COMPARED
    assert len(res["rows"]) == 2 * (len(COMPARED) + 1), res   # each figure, theoretical occupancy too
    bad = [r for r in res["rows"] if not r["ok"]]
    assert not bad, bad
