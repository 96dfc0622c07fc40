"""GPU suite, replay: every capture-suite workload replayed on the GPU in a separate process.

Each must show all D2H results verified, placement 100% ("0 fell back") and exit code 0."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpuutil import WORK, record_result
from test_gpu_capture import DETERMINISTIC, WORKLOADS

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_replay_workload(name, runner, ptrs_binary):
    snap = WORK / "snaps" / f"{name}.cusnap"
    if not snap.exists():
        cmd, env = WORKLOADS[name]
        cap, _ = runner.capture(cmd or [str(ptrs_binary)], snap, {**DETERMINISTIC, **env})
        assert cap.returncode == 0, cap.stderr[-2000:]
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snap), "--json", "--watchdog", "120"],
                        capture_output=True, text=True, timeout=600)
    try:
        res = json.loads(cp.stdout)
    except json.JSONDecodeError:
        res = {}
    row = {"test": "replay", "workload": name, "rc": cp.returncode,
           **{k: res.get(k) for k in ("placed", "fell_back", "d2h_verified", "d2h_bytes", "d2h_unverified", "launches",
                                      "calls", "total_calls", "elapsed_s", "message", "stopped_at", "params_relocated")},
           "fallbacks": (res.get("fallbacks") or [])[:5], "mismatches": (res.get("mismatch_text") or [])[:3],
           "errors": (res.get("errors") or [])[:5], "warnings": (res.get("warnings") or [])[:5],
           "stderr": cp.stderr[-1500:]}
    record_result(row)
    assert cp.returncode == 0, row
    assert res["fell_back"] == 0, row
    assert res["d2h_verified"] > 0 and not res["mismatches"], row
