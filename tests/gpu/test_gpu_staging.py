"""GPU suite, staging: big H2D copies (synchronous and asynchronous, some compressible) replay
through the read-ahead slots, page-locked, on the GPU; every buffer comes back verified."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpuutil import HERE, WORK, _build, record_result

pytestmark = pytest.mark.gpu


def test_staged_h2d_copies_replay_verified(runner, tmp_path):
    src = HERE / "workloads" / "staged_h2d.cu"
    exe = _build(src, WORK / "staged_h2d", ["nvcc", "-O2", "-arch=sm_90", "-o", str(WORK / "staged_h2d"), str(src)])
    snap = tmp_path / "staged.cusnap"
    cap, _ = runner.capture([str(exe)], snap)
    assert cap.returncode == 0, cap.stderr[-2000:]
    env = dict(os.environ, CUDASNAP_STAGE_STATS="1")
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snap), "--json", "--watchdog", "120"],
                        capture_output=True, text=True, timeout=600, env=env)
    res = json.loads(cp.stdout) if cp.stdout.startswith("{") else {}
    stage = [line for line in cp.stderr.splitlines() if "staging:" in line]
    record_result({"test": "staging", "workload": "staged_h2d", "rc": cp.returncode, "d2h_verified": res.get("d2h_verified"),
                   "mismatches": (res.get("mismatch_text") or [])[:3], "errors": (res.get("errors") or [])[:3],
                   "warnings": (res.get("warnings") or [])[:3], "staging": stage[-1:] or None})
    assert cp.returncode == 0, (res.get("errors"), cp.stderr[-2000:])
    assert res["d2h_verified"] >= 6 and not res["mismatches"] and res["fell_back"] == 0, res
    assert stage and "staging: 6 copies" in stage[-1], cp.stderr[-2000:]
    assert not [w for w in res.get("warnings", []) if "page-lock" in w], res["warnings"]
