"""GPU suite, selections: on real workloads a replay of part of a snapshot (-c, -s, -k, --calls)
exits 0 with no MISMATCH (the D2H results its left-out work decides are counted, not compared),
a selection of nothing is one line and exit 2, and `extract --calls A-B --check` over a stretch of
launches verifies."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from test_gpu_profile import snapshot as _snap     # captured once per suite run, shared

from cudasnap.formats import SnapshotReader

pytestmark = pytest.mark.gpu

NAMES = ["torch_eager", "cupy", "triton_kernel", "nvcc_ptrs"]      # capture-suite workloads (WORKLOADS)


def _cli(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "cudasnap", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("name", NAMES)
def test_partial_replays_never_report_a_false_mismatch(name, runner, ptrs_binary):
    snap = _snap(name, runner, ptrs_binary)
    full = json.loads(_cli("replay", snap, "--json").stdout)
    assert full["exit_code"] == 0 and full["d2h_left_out"] == 0
    for sel in (["-c", "5"], ["-s", "3", "-c", "2"], ["-s", "1"]):
        cp = _cli("replay", snap, "--json", *sel)
        res = json.loads(cp.stdout)
        assert cp.returncode == 0 and not res["mismatches"], (sel, res["errors"], res["mismatches"][:1])
        # -c/-s leave launches out, never a copy: every D2H result is compared or counted as left out
        assert res["d2h_verified"] + res["d2h_left_out"] == full["d2h_verified"], (sel, res)
    cp = _cli("replay", snap, "-k", "no_kernel_is_called_this")
    assert cp.returncode == 2 and len(cp.stderr.strip().splitlines()) == 1, cp.stderr


@pytest.mark.parametrize("name", NAMES)
def test_extract_calls_over_a_stretch_of_launches_verifies(name, runner, ptrs_binary, tmp_path):
    snap = _snap(name, runner, ptrs_binary)
    with SnapshotReader(snap) as r:
        launches = [c["s"] for c in r.records("c") if c["f"].startswith("cuLaunch") and c.get("r", 0) == 0]
    assert launches
    lo, hi = launches[len(launches) // 3], launches[min(len(launches) - 1, len(launches) // 3 + 20)]
    out = tmp_path / "x.cusnap"
    cp = _cli("extract", snap, "--calls", f"{lo}-{hi}", "-o", out, "--check", "--ranges", "segment")
    assert cp.returncode == 0, cp.stdout[-2000:] + cp.stderr[-2000:]
    assert "kept " in cp.stdout and "verified" in cp.stdout
