"""GPU suite, stream memory operations: an nvcc program whose streams order work through
cuStreamWriteValue/cuStreamWaitValue on device memory (workloads/memops.cu) captures with its
own output and replays with its D2H results verified at the recorded addresses."""
from __future__ import annotations

import subprocess

import pytest

from gpuutil import HERE, WORK, _build, record_result, replay_snapshot

pytestmark = pytest.mark.gpu


def test_stream_memory_operations_capture_and_replay(runner, tmp_path):
    src = HERE / "workloads" / "memops.cu"
    exe = _build(src, WORK / "memops", ["nvcc", "-O2", "-arch=sm_90", "-o", str(WORK / "memops"), str(src), "-lcuda"])
    native = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert native.returncode == 0, native.stdout + native.stderr
    snap = tmp_path / "memops.cusnap"
    cap, _ = runner.capture([str(exe)], snap)
    assert cap.returncode == 0 and cap.stdout == native.stdout, cap.stdout + cap.stderr[-2000:]
    row, res, rc = replay_snapshot(snap, "memops", "memops")
    record_result(row)
    assert rc == 0, row
    assert res["fell_back"] == 0 and res["d2h_verified"] >= 2, row
