"""`cudasnap advise` on a launch-bound PyTorch loop (workloads/advise_loop.py): it names the
launch-bound stretch, measures it as a CUDA graph by a replay, and the measured gain agrees
within 10% with the program's own: its eager step against a CUDA graph of the step (per-step
wall times, natively). The gain is compared as the share of the eager time a graph saves: the
eager step's own wall time moves by half between two runs of the program on a busy host (323
and 510 us on one H200), so microseconds per step from two runs do not compare. The speed-up
is recorded and only bounded: it is 1/(1 - share), which near a 90% share turns a 5% share
difference into 70% (93.3% vs 88.8% of the eager time saved gave 15.0x vs 8.9x on one H200). Rows go to $CUDASNAP_GPU_RESULTS through record_result."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpuutil import HERE, record_result
from test_gpu_capture import DETERMINISTIC
OPS = 40          # kernels per step: advise_loop.OPS (not imported: it imports torch)

pytestmark = pytest.mark.gpu
PY = sys.executable
LOOP = HERE / "workloads" / "advise_loop.py"
STEPS = 40


def test_advise_measures_the_launch_bound_loop_as_a_graph(runner, tmp_path):
    snap = tmp_path / "advise_loop.cusnap"
    cap, _ = runner.capture([PY, str(LOOP), "eager", str(STEPS)], snap, DETERMINISTIC)
    assert cap.returncode == 0, cap.stderr[-2000:]
    nat_out = tmp_path / "native.json"
    cp = subprocess.run([PY, str(LOOP), "native", str(nat_out), "200"], capture_output=True, text=True, timeout=600)
    assert cp.returncode == 0, cp.stderr[-2000:]
    nat = json.loads(nat_out.read_text())
    out = tmp_path / "advise.json"
    cp = subprocess.run([PY, "-m", "cudasnap", "advise", str(snap), "--out", str(out), "--graphs", "1",
                         "--timeout", "600"], capture_output=True, text=True, timeout=1800)
    assert cp.returncode == 0, (cp.stdout + cp.stderr)[-3000:]
    res = json.loads(out.read_text())
    lb = [f for f in res["findings"] if f["kind"] == "launch-bound"]
    top = max(lb, key=lambda f: f["evidence"]["kernels"]) if lb else None
    w = (top or {}).get("what_if") or {}
    native_speedup = nat["eager_median_us"] / nat["graph_median_us"]
    row = {"test": "advise_launch_bound_torch_loop", "device": nat["device"], "stdout": cp.stdout[-3000:],
           "native_eager_step_us": round(nat["eager_median_us"], 2), "native_graph_step_us": round(nat["graph_median_us"], 2),
           "native_speedup": round(native_speedup, 3), "stretch": (top or {}).get("evidence"), "what_if": w,
           "findings": [(f["kind"], f["title"], f["at_stake_us"]) for f in res["findings"]]}
    native_gain = nat["eager_median_us"] - nat["graph_median_us"]
    if w.get("measured"):
        steps = max(round(top["evidence"]["kernels"] / OPS), 1)
        row.update(advise_speedup=w["speedup"], steps_in_stretch=steps,
                   speedup_diff_pct=round((w["speedup"] - native_speedup) / native_speedup * 100, 2),
                   advise_gain_per_step_us=round(w["gain_us"] / steps, 2), native_gain_per_step_us=round(native_gain, 2),
                   gain_diff_pct=round((w["gain_us"] / steps - native_gain) / native_gain * 100, 2),
                   native_gain_pct=round(native_gain / nat["eager_median_us"] * 100, 2), advise_gain_pct=w["gain_pct"])
        row["gain_share_diff_pct"] = round((row["advise_gain_pct"] - row["native_gain_pct"]) / row["native_gain_pct"] * 100, 2)
    record_result(row)
    assert top is not None, row["findings"]
    assert w.get("measured") and w["replay"]["exit_code"] == 0, w
    assert abs(row["gain_share_diff_pct"]) <= 10.0, row
    assert w["speedup"] >= 2.0 and native_speedup >= 2.0, row       # both see a launch-bound loop


BOUNDS = HERE / "workloads" / "advise_bounds.py"
GEMM_RX = r"gemm|nvjet|xmma|cutlass|sm90"


def _captured_with_metrics(runner, cmd, tmp_path):
    """(snapshot, metrics profile JSON) of a program captured, then replayed under --profile metrics."""
    snap = tmp_path / "prog.cusnap"
    cap, _ = runner.capture(cmd, snap, DETERMINISTIC)
    assert cap.returncode == 0, cap.stderr[-2000:]
    metrics = tmp_path / "metrics.json"
    cp = subprocess.run([PY, "-m", "cudasnap", "replay", str(snap), "--profile", "metrics", "--out", str(metrics)],
                        capture_output=True, text=True, timeout=900)
    assert cp.returncode == 0, (cp.stdout + cp.stderr)[-3000:]
    return snap, metrics


def test_advise_tells_a_memory_bound_kernel_from_a_gemm_by_their_counters(runner, tmp_path):
    """advise --metrics: the elementwise kernel over 256 MiB is memory-bound with its DRAM
    throughput as % of peak; the GEMM is compute-bound, or its finding says what bounds it
    instead, with the SM and memory figures as evidence."""
    import re
    snap, metrics = _captured_with_metrics(runner, [PY, str(BOUNDS)], tmp_path)
    out = tmp_path / "advise.json"
    cp = subprocess.run([PY, "-m", "cudasnap", "advise", str(snap), "--metrics", str(metrics), "--out", str(out),
                         "--no-what-if", "--top", "30"], capture_output=True, text=True, timeout=900)
    assert cp.returncode == 0, (cp.stdout + cp.stderr)[-3000:]
    bound = [f for f in json.loads(out.read_text())["findings"]
             if f["kind"] in ("memory-bound", "compute-bound", "compute-and-memory-bound", "latency-bound")]
    record_result({"test": "advise_bounds", "stdout": cp.stdout[-3000:],
                   "bound": [(f["kind"], f["title"], f["evidence"]) for f in bound]})
    gemm = [f for f in bound if re.search(GEMM_RX, f.get("kernel") or "", re.I)]
    # y = x * 2 + 1 (torch.randn's kernel, distribution_elementwise_grid_stride_kernel, is not it)
    elementwise = [f for f in bound if re.search(r"vectorized_elementwise|unrolled_elementwise", f.get("kernel") or "")]
    assert elementwise and gemm, [(f["kind"], f.get("kernel")) for f in bound]
    ew = elementwise[0]
    assert ew["kind"] == "memory-bound" and "DRAM throughput" in ew["title"], ew
    assert ew["evidence"]["dram_pct"] >= 60, ew["evidence"]
    g = gemm[0]
    assert g["evidence"]["sm_pct"] is not None and g["evidence"]["memory_pct"] is not None, g
    if g["kind"] != "compute-bound":       # what bounds it instead is named, with its figures
        assert "% of peak" in g["title"] and g["advice"], g
    # the tensor cores' work is counted: the GEMM's FLOP against the fp16 tensor peak
    assert (g["evidence"].get("precision") or "").startswith("tensor_"), g["evidence"]
    assert 30 <= (g["evidence"].get("flop_pct_of_peak") or 0) <= 100, g["evidence"]


OCCUPANCY = HERE / "workloads" / "advise_occupancy.cu"


def test_advise_replays_a_low_occupancy_kernel_at_a_better_block_size(runner, tmp_path):
    """advise --metrics on an nvcc kernel that shared memory holds to 4 blocks per SM: at 128
    threads that is 25% theoretical occupancy; the what-if replays it at 512 threads per block
    (grid scaled, 100%), verifies the results and measures the time. The gain is recorded."""
    from gpuutil import WORK, _build
    binary = _build(OCCUPANCY, WORK / "advise_occupancy",
                    ["nvcc", "-O3", "-arch=sm_90", "-o", str(WORK / "advise_occupancy"), str(OCCUPANCY)])
    snap, metrics = _captured_with_metrics(runner, [str(binary)], tmp_path)
    out = tmp_path / "advise.json"
    cp = subprocess.run([PY, "-m", "cudasnap", "advise", str(snap), "--metrics", str(metrics), "--out", str(out),
                         "--graphs", "0", "--top", "30"], capture_output=True, text=True, timeout=900)
    assert cp.returncode == 0, (cp.stdout + cp.stderr)[-3000:]
    occ = [f for f in json.loads(out.read_text())["findings"] if f["kind"] == "occupancy"]
    record_result({"test": "advise_block_size", "stdout": cp.stdout[-3000:],
                   "occupancy": [(f["title"], f.get("what_if")) for f in occ]})
    f = next(f for f in occ if f.get("kernel") == "chase_smem")
    assert f["evidence"]["theoretical_occupancy_pct"] == pytest.approx(25.0), f["evidence"]
    w = f["what_if"]
    assert w["kind"] == "launch" and w["measured"] and w["verified"], w
    assert w["occupancy"]["block"] == 512 and w["occupancy"]["occupancy_pct"] == pytest.approx(100.0), w["occupancy"]
    assert w["applied"]["applied"] == 3 and w["kernels"][0]["launches"] == 3, w
