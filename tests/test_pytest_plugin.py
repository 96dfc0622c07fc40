"""The pytest plugin: `pytest SNAPSHOT_OR_DIR` replays and verifies snapshots, one item each."""
from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest


def _pytest(double, cwd: Path, *args: str):
    env = dict(double["env"])
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def snaps(double, capture, tmp_path):
    d = tmp_path / "snaps"
    d.mkdir()
    for prog in ("direct", "launch_forms"):
        cp, _ = capture(double["progs"][prog], out=d / f"{prog}.cusnap")
        assert cp.returncode == 0, cp.stderr
    return d


def test_registered_as_a_pytest11_entry_point():
    eps = [e for e in entry_points(group="pytest11") if e.name == "cudasnap"]
    assert eps and eps[0].value == "cudasnap.pytest_plugin"


def test_collects_and_passes_snapshots(double, snaps):
    cp = _pytest(double, snaps.parent, "snaps/direct.cusnap", "-v", "--cudasnap-device", "0")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "snaps/direct.cusnap::replay PASSED" in cp.stdout and "1 passed" in cp.stdout

    cp = _pytest(double, snaps.parent, "snaps", "-v", "--cudasnap-dtype", "f32", "--cudasnap-rtol", "1e-5",
                 "--cudasnap-atol", "0")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "2 passed" in cp.stdout


def test_items_are_marked_gpu(double, snaps):
    cp = _pytest(double, snaps.parent, "snaps", "-m", "not gpu")
    assert cp.returncode == 5 and "2 deselected" in cp.stdout, cp.stdout      # 5: nothing left to run
    cp = _pytest(double, snaps.parent, "snaps", "-m", "gpu", "--collect-only", "-q")
    assert "snaps/direct.cusnap::replay" in cp.stdout and "snaps/launch_forms.cusnap::replay" in cp.stdout


def test_a_damaged_snapshot_fails_with_the_replay_report(double, snaps):
    data = (snaps / "direct.cusnap").read_bytes()
    (snaps / "direct.cusnap").write_bytes(data[:len(data) // 3])
    cp = _pytest(double, snaps.parent, "snaps/direct.cusnap")
    assert cp.returncode == 1, cp.stdout + cp.stderr
    assert "replay could not proceed" in cp.stdout and "1 failed" in cp.stdout


def test_a_verification_mismatch_fails(double, snaps):
    """The double's module knows add_one; a snapshot whose recorded D2H result is wrong fails."""
    from cudasnap.formats import SnapshotReader, SnapshotWriter

    src = snaps / "direct.cusnap"
    bad = snaps.parent / "bad" / "mismatch.cusnap"
    bad.parent.mkdir()
    with SnapshotReader(src) as r, SnapshotWriter(bad, r.raw_header) as w:
        blobs = {}
        for rec in r.records():
            if rec["k"] == "b":
                continue
            x = rec.get("x") if rec.get("k") == "c" else None
            for key, v in list((x or {}).items()):
                if isinstance(v, dict) and "blob" in v:
                    data = bytearray(r.blob(v["blob"]))
                    if rec["f"].startswith("cuMemcpyDtoH") and data:
                        data[0] ^= 0xFF                       # a result the replay will not reproduce
                    v = {**v, "blob": blobs.setdefault(bytes(data), w.add_blob(bytes(data)))}
                    x[key] = v
            w.write(rec)
    cp = _pytest(double, bad.parent, "mismatch.cusnap")
    assert cp.returncode == 1, cp.stdout + cp.stderr
    assert "verification mismatch" in cp.stdout


def test_not_collected_from_paths_pytest_walks_itself(double, snaps):
    """A project's own run (testpaths, or no path given) collects no snapshot unless --cudasnap."""
    (snaps / "test_plain.py").write_text("def test_ok():\n    pass\n")
    (snaps / "pytest.ini").write_text("[pytest]\ntestpaths = .\n")
    cp = _pytest(double, snaps, "-q")
    assert cp.returncode == 0 and "1 passed" in cp.stdout and "cusnap" not in cp.stdout, cp.stdout
    cp = _pytest(double, snaps, "-q", "--cudasnap")
    assert cp.returncode == 0 and "3 passed" in cp.stdout, cp.stdout + cp.stderr
    cp = _pytest(double, snaps, "-q", "-p", "no:cudasnap", ".")
    assert cp.returncode == 0 and "1 passed" in cp.stdout, cp.stdout + cp.stderr
