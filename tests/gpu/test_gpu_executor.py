"""GPU suite, replay engine: the C executor (CUDASNAP_FASTPATH=1, the default) and the per-call
path (CUDASNAP_FASTPATH=0) give the same result on real workloads: the same calls, launches,
skipped queries, per-family counts, D2H verification and errors; the executor ran calls."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpuutil import WORK
from test_gpu_capture import DETERMINISTIC, WORKLOADS

pytestmark = pytest.mark.gpu
SAME = ("exit_code", "calls", "launches", "skipped", "by_family", "d2h_verified", "d2h_bytes", "d2h_unverified",
        "errors", "fell_back", "errors_recurred")


def _replay(snap, mode: str) -> dict:
    env = dict(os.environ, CUDASNAP_FASTPATH=mode)
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snap), "--json", "--watchdog", "120"],
                        env=env, capture_output=True, text=True, timeout=600)
    try:
        return json.loads(cp.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"replay ({mode}) printed no JSON: {cp.stderr[-1500:]}")


@pytest.mark.parametrize("name", ["torch_eager", "torch_eager_async", "torch_compile", "cupy", "jax_jit", "torch_graph"])
def test_executor_matches_the_per_call_path(name, runner, ptrs_binary):
    snap = WORK / "snaps" / f"{name}.cusnap"
    if not snap.exists():
        cmd, env = WORKLOADS[name]
        snap.parent.mkdir(parents=True, exist_ok=True)
        cap, _ = runner.capture(cmd or [str(ptrs_binary)], snap, {**DETERMINISTIC, **env})
        assert cap.returncode == 0, cap.stderr[-2000:]
    slow, fast = _replay(snap, "0"), _replay(snap, "1")
    assert slow["exit_code"] == 0, slow["errors"]
    assert {k: fast.get(k) for k in SAME} == {k: slow.get(k) for k in SAME}
    assert fast["native_calls"] > 0 and slow["native_calls"] == 0
    loop = lambda r: r["loop_end_mono"] - r["loop_start_mono"]  # noqa: E731
    print(f"{name}: {fast['native_calls']} of {fast['total_calls']} calls in the C executor; replay loop "
          f"{loop(slow):.3f} s on the per-call path, {loop(fast):.3f} s with the executor")
