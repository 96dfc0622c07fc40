"""GPU suite, CUDA arrays, texture and surface objects: an nvcc program samples a 2D array
through a texture object and writes another through a surface (workloads/texture.cu). It
captures with its own output and replays with every D2H result verified; the calls the
runtime used are recorded in the results, so a copy form replay does not take shows there."""
from __future__ import annotations

import subprocess
from collections import Counter

import pytest

from cudasnap.formats import SnapshotReader
from gpuutil import HERE, WORK, _build, record_result, replay_snapshot

pytestmark = pytest.mark.gpu


def test_texture_and_surface_objects_capture_and_replay(runner, tmp_path):
    src = HERE / "workloads" / "texture.cu"
    exe = _build(src, WORK / "texture", ["nvcc", "-O2", "-arch=sm_90", "-o", str(WORK / "texture"), str(src)])
    native = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert native.returncode == 0, native.stdout + native.stderr
    snap = tmp_path / "texture.cusnap"
    cap, _ = runner.capture([str(exe)], snap)
    assert cap.returncode == 0 and cap.stdout == native.stdout, cap.stdout + cap.stderr[-2000:]
    with SnapshotReader(snap) as r:
        calls = Counter(c["f"] for c in r.records("c") if "Array" in c["f"] or "Object" in c["f"] or "2D" in c["f"]
                        or "3D" in c["f"])
    row, res, rc = replay_snapshot(snap, "texture", "texture")
    row["array_calls"] = dict(calls)
    record_result(row)
    assert rc == 0, row
    assert res["fell_back"] == 0 and res["d2h_verified"] >= 2, row
