"""GPU suite, replay: every capture-suite workload replayed on the GPU in a separate process.

Each must show all D2H results verified, placement 100% ("0 fell back") and exit code 0."""
from __future__ import annotations


import pytest

from gpuutil import WORK, record_result, replay_snapshot
from test_gpu_capture import DETERMINISTIC, WORKLOADS

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_replay_workload(name, runner, ptrs_binary):
    snap = WORK / "snaps" / f"{name}.cusnap"
    if not snap.exists():
        cmd, env = WORKLOADS[name]
        snap.parent.mkdir(parents=True, exist_ok=True)     # capture refuses a missing directory
        cap, _ = runner.capture(cmd or [str(ptrs_binary)], snap, {**DETERMINISTIC, **env})
        assert cap.returncode == 0, cap.stderr[-2000:]
    row, res, rc = replay_snapshot(snap, "replay", name)
    record_result(row)
    assert rc == 0, row
    assert res["fell_back"] == 0, row
    assert res["d2h_verified"] > 0 and not res["mismatches"], row
