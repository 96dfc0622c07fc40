"""`cudasnap extract` end to end on the CUDA test double: a small snapshot of selected launches
whose replay verifies against what the original's replay produced."""
from __future__ import annotations

import struct
import subprocess
import sys

import pytest

from cudasnap.formats import SnapshotReader


def _cli(double, *args, timeout=120):
    return subprocess.run([sys.executable, "-m", "cudasnap", *args], env=double["env"], capture_output=True,
                          text=True, timeout=timeout)


def _calls(path):
    return [r for r in SnapshotReader(path).records() if r["k"] == "c"]


def _extract_and_replay(double, snap, out, *sel):
    ex = _cli(double, "extract", str(snap), "-o", str(out), *sel)
    assert ex.returncode == 0, ex.stdout + ex.stderr
    rp = _cli(double, "replay", str(out))
    assert rp.returncode == 0, rp.stdout + rp.stderr
    assert "OK: every recorded D2H result reproduced" in rp.stdout
    return ex, rp


def test_one_launch_restores_its_input_and_expects_its_output(double, capture, tmp_path):
    cp, snap = capture(double["progs"]["direct"])
    assert cp.returncode == 0
    calls = _calls(snap)
    launches = [c for c in calls if c["f"] == "cuLaunchKernel"]
    assert len(launches) == 10
    ex, _ = _extract_and_replay(double, snap, tmp_path / "x.cusnap", "--launch", str(launches[4]["s"]))
    assert "% of" in ex.stdout and " s\n" in ex.stdout.splitlines()[0] + "\n"
    r = SnapshotReader(tmp_path / "x.cusnap")
    xc = [c for c in r.records() if c["k"] == "c"]
    assert [c["f"] for c in xc if c["f"].startswith("cuLaunch")] == ["cuLaunchKernel"]
    assert [c.get("os") for c in xc if c["f"].startswith("cuLaunch")] == [launches[4]["s"]]
    h2d = [c for c in xc if c["f"] == "cuMemcpyHtoD_v2"]
    d2h = [c for c in xc if c["f"] == "cuMemcpyDtoH_v2"]
    assert len(h2d) == 1 and len(d2h) == 1
    before = struct.unpack("<1024f", r.blob(h2d[0]["x"]["srcHost"]["blob"]))
    after = struct.unpack("<1024f", r.blob(d2h[0]["x"]["dstHost"]["blob"]))
    assert before[:3] == (4.0, 5.0, 6.0)          # i + the four add_one launches before it
    assert after[:3] == (5.0, 6.0, 7.0)
    # the last launch's expected result is what the program itself read back
    ex, _ = _extract_and_replay(double, snap, tmp_path / "last.cusnap", "--launch", str(launches[-1]["s"]))
    r2 = SnapshotReader(tmp_path / "last.cusnap")
    got = [c for c in r2.records() if c["k"] == "c" and c["f"] == "cuMemcpyDtoH_v2"][0]
    orig = [c for c in calls if c["f"] == "cuMemcpyDtoH_v2"][0]
    assert r2.blob(got["x"]["dstHost"]["blob"]) == SnapshotReader(snap).blob(orig["x"]["dstHost"]["blob"])


def test_pointer_scanning_restores_what_a_pointer_table_reaches(double, capture, tmp_path):
    cp, snap = capture(double["progs"]["chase"])
    assert cp.returncode == 0
    ex, _ = _extract_and_replay(double, snap, tmp_path / "x.cusnap", "--kernel", "chase")
    assert "memory restored: 10 range(s)" in ex.stdout and "pointer scanning" in ex.stdout
    ex, _ = _extract_and_replay(double, snap, tmp_path / "all.cusnap", "--kernel", "chase", "--memory", "all")
    assert "every live allocation" in ex.stdout


def test_kernel_occurrence_leaves_out_unneeded_modules(double, capture, tmp_path):
    cp, snap = capture(double["progs"]["launch_forms"])
    assert cp.returncode == 0
    ex, _ = _extract_and_replay(double, snap, tmp_path / "x.cusnap", "--kernel", "add_one#3")
    assert "module loads kept 1, left out 1" in ex.stdout
    xc = [c["f"] for c in _calls(tmp_path / "x.cusnap")]
    assert "cuLibraryLoadData" in xc and "cuModuleLoadData" not in xc
    _extract_and_replay(double, snap, tmp_path / "s.cusnap", "--kernel", "sax")
    launches = [c for c in _calls(snap) if c["f"].startswith("cuLaunch")]
    ex, _ = _extract_and_replay(double, snap, tmp_path / "r.cusnap", "--calls",
                                f"{launches[0]['s']}-{launches[-1]['s']}")
    assert "module loads kept 2, left out 0" in ex.stdout


def test_extract_refuses_what_it_cannot_find(double, capture, tmp_path):
    cp, snap = capture(double["progs"]["direct"])
    assert cp.returncode == 0
    ex = _cli(double, "extract", str(snap), "-o", str(tmp_path / "x.cusnap"), "--kernel", "add_one#11")
    assert ex.returncode == 2 and "10 found" in ex.stderr
    ex = _cli(double, "extract", str(snap), "-o", str(tmp_path / "x.cusnap"), "--launch", "1", "--kernel", "a")
    assert ex.returncode == 2 and "exactly one of" in ex.stderr
    assert not (tmp_path / "x.cusnap").exists()
    cp, snap = capture(double["progs"]["launch_forms"])
    captured = [c for c in _calls(snap) if c["f"] == "cuLaunchKernel" and c["a"].get("hStream")][0]
    ex = _cli(double, "extract", str(snap), "-o", str(tmp_path / "x.cusnap"), "--launch", str(captured["s"]))
    assert ex.returncode == 2 and "captured into a graph" in ex.stderr
