"""GPU suite, runtime features of CUDA's own samples (workloads/samples.cu): managed and mapped
memory, host callbacks, cooperative and cluster launches, large dynamic shared memory, symbols,
stream-ordered pools, graphs with host and conditional nodes, dynamic parallelism, batched copies,
priorities and events, device printf. Each part alone: capture keeps the program's exit code and
output, and the replay exits 0 with every allocation placed and its D2H results verified (managed memory,
and mapped pinned memory with CUDASNAP_MAPPED_MEMORY=1: recorded with the launches that reach
it, its final bytes verified at its free)."""
from __future__ import annotations

import subprocess

import pytest

from gpuutil import HERE, WORK, _build, record_result, replay_snapshot

pytestmark = pytest.mark.gpu

PARTS = ["managed", "mapped", "hostfunc", "coop", "cluster", "bigsmem", "symbols", "mempool", "graphs",
         "conditional", "cdp", "batch", "events", "printf"]


@pytest.fixture(scope="module")
def samples_binary():
    src = HERE / "workloads" / "samples.cu"
    out = WORK / "samples"
    return _build(src, out, ["nvcc", "-O2", "-cudart", "static", "-arch=sm_90", "-rdc=true", "-o", str(out), str(src),
                             "-lcudadevrt"])


@pytest.mark.parametrize("part", PARTS)
def test_sample_part_captures_and_replays(part, samples_binary, runner, tmp_path):
    native = subprocess.run([str(samples_binary), part], capture_output=True, text=True, timeout=120)
    assert native.returncode == 0, native.stdout + native.stderr
    snap = tmp_path / f"{part}.cusnap"
    # mapped pinned memory the host writes is recorded when asked for (CUDASNAP_MAPPED_MEMORY=1)
    cap, _ = runner.capture([str(samples_binary), part], snap,
                            extra_env={"CUDASNAP_MAPPED_MEMORY": "1"} if part == "mapped" else None)
    assert cap.returncode == 0 and cap.stdout == native.stdout, (native.stdout, cap.stdout, cap.stderr[-2000:])
    row, res, rc = replay_snapshot(snap, "samples", part)
    record_result(row)
    assert rc == 0, row
    assert res["fell_back"] == 0, row
    if part == "printf":              # the kernel's printf again, on stderr beside --json
        assert "device says 40" in row["stderr"] and "device says 41" in row["stderr"], row
    else:
        assert res["d2h_verified"] >= 1, row


def test_graph_mode_of_device_side_launches_times_them_or_says_why(samples_binary, runner, tmp_path):
    """Graph mode and dynamic parallelism: either every launch is timed, or the profile is not
    taken (exit 2) and the message names the module that launches from the device."""
    import json
    import sys
    snap = tmp_path / "cdp.cusnap"
    cap, _ = runner.capture([str(samples_binary), "cdp"], snap)
    assert cap.returncode == 0, cap.stderr[-2000:]
    out = tmp_path / "graph.json"
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snap), "--profile", "graph", "--out", str(out)],
                        capture_output=True, text=True, timeout=300)
    text = cp.stdout + cp.stderr          # the replay's errors print with its summary, on stdout
    s = json.loads(out.read_text())["summary"] if out.exists() else {}
    record_result({"workload": "samples", "part": "cdp graph", "rc": cp.returncode, "output": text[-2500:],
                   "summary": {k: s.get(k) for k in ("launches", "launches_timed", "error", "hint", "unrecorded")}})
    if cp.returncode == 0:
        assert "error" not in s and s["launches"] > 0 and s["launches_timed"] == s["launches"], s
    else:
        assert cp.returncode == 2 and "launches kernels from the device" in text, text[-2500:]
