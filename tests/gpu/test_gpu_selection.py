"""GPU suite, selections: on real workloads a replay of part of a snapshot (-c, -s, -k, --calls)
exits 0 with no DIFFERENT result (the D2H results its left-out work decides are counted, not compared),
a selection of nothing is one line and exit 2, `extract --calls A-B --check` over a stretch of
launches verifies, and the Python API replays snapshot after snapshot in one process."""
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
    cp = _cli("extract", snap, "--calls", f"{lo}-{hi}", "-o", out, "--check", "--ranges", "segment", "--watchdog", "120")
    assert cp.returncode == 0, cp.stdout[-2000:] + cp.stderr[-2000:]
    assert "kept " in cp.stdout and "verified" in cp.stdout


def test_python_api_replays_snapshot_after_snapshot_in_one_process(runner, ptrs_binary):
    """`cudasnap.replay.replay()` in a loop, each snapshot twice: every replay gives the driver
    state back, so the next one places its memory at the recorded addresses again and none
    waits on the one before (a second replay over a first's state spun in cuKernelGetFunction)."""
    snaps = [str(_snap(n, runner, ptrs_binary)) for n in NAMES]
    code = ("import json, sys\nfrom cudasnap.replay import replay\n"
            "for p in json.loads(sys.argv[1]):\n"
            "    r = replay(p, watchdog=120)\n"
            "    print(json.dumps([p, r.exit_code, r.placed, r.fell_back, r.d2h_verified]), flush=True)\n")
    order = [s for s in snaps for _ in range(2)]
    cp = subprocess.run([sys.executable, "-c", code, json.dumps(order)], capture_output=True, text=True, timeout=900)
    rows = [json.loads(ln) for ln in cp.stdout.splitlines() if ln.startswith("[")]
    assert cp.returncode == 0 and len(rows) == len(order), (cp.stdout[-2000:], cp.stderr[-2000:])
    for first, second in zip(rows[::2], rows[1::2]):
        assert first[1] == second[1] == 0 and first[3] == second[3] == 0, (first, second)
        assert first[2] == second[2] and first[4] == second[4] > 0, (first, second)
