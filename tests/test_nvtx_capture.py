"""NVTX ranges captured without changing the program: the shim is the NVTX v3 injection library
(NVTX_INJECTION64_PATH). The client here (tests/double/progs/nvtx_client.c) loads it and calls
InitializeInjectionNvtx2 as libnvToolsExt and every header-only NVTX instance do."""
from __future__ import annotations

import json
import subprocess
import sys

from cudasnap.formats import SnapshotReader


def _cli(double, *args):
    return subprocess.run([sys.executable, "-m", "cudasnap", *args], env=double["env"], capture_output=True,
                          text=True, timeout=120)


def _records(snap):
    with SnapshotReader(snap) as r:
        return list(r.records())


def test_nvtx_ranges_of_an_injected_client_are_recorded(double, capture):
    cp, snap = capture(double["progs"]["nvtx_client"], "3")
    assert cp.returncode == 0, cp.stderr
    assert "INJECTED 1" in cp.stdout and "LAUNCHES 3" in cp.stdout
    recs = _records(snap)
    nv = [r for r in recs if r["k"] == "nvtx"]
    ops = [(r["op"], r["name"], r["domain"]) for r in nv]
    step = [("push", "step", None), ("push", "registered step", "mylib"), ("pop", "registered step", "mylib"),
            ("pop", "step", None)]
    assert ops == ([("push", "setup", None), ("pop", "setup", None)] + step * 3 +
                   [("start", "async range", None), ("mark", "marker", None), ("push", "wide \u2603", None),
                    ("pop", "wide \u2603", None), ("end", "async range", None),
                    ("push", "second instance", None), ("pop", "second instance", None)])
    tid = next(r["tid"] for r in recs if r["k"] == "c")
    assert all(r["tid"] == tid for r in nv)
    # "setup" was pushed before the first driver call (the ring did not exist yet): written when it
    # opened, with the time it was made
    calls = [r for r in recs if r["k"] == "c"]
    first = calls[0]
    assert first["f"] == "cuInit" and nv[0]["t"] < first["t0"] < nv[1]["t"]
    # each launch lies inside its ranges, on the same clock
    launches = [c for c in calls if c["f"].startswith("cuLaunch")]
    pushes = [r for r in nv if r["op"] == "push" and r["name"] == "registered step"]
    pops = [r for r in nv if r["op"] == "pop" and r["name"] == "registered step"]
    for lo, c, hi in zip(pushes, launches, pops):
        assert lo["t"] <= c["t0"] <= c["t1"] <= hi["t"]
    assert [r["id"] for r in nv if r["op"] in ("push", "pop") and r["name"] == "registered step"] == [0] * 6
    start = next(r for r in nv if r["op"] == "start")
    assert start["id"] >= 1 and next(r for r in nv if r["op"] == "end")["id"] == start["id"]
    hdr = SnapshotReader(snap).header
    assert hdr["options"]["nvtx"] == "recorded"


def test_info_and_dump_show_nvtx_ranges(double, capture):
    cp, snap = capture(double["progs"]["nvtx_client"], "4")
    assert cp.returncode == 0, cp.stderr
    info = _cli(double, "info", str(snap), "--json")
    assert info.returncode == 0, info.stderr
    nv = json.loads(info.stdout)["nvtx"]
    by = {(r["name"], r["domain"], r["kind"]): r for r in nv["by_name"]}
    assert by[("step", None, "range")]["count"] == 4 and by[("step", None, "range")]["closed"] == 4
    assert by[("registered step", "mylib", "range")]["count"] == 4
    assert by[("marker", None, "mark")]["count"] == 1
    assert by[("async range", None, "range")]["closed"] == 1
    assert nv["ranges"] == 4 + 4 + 4 and nv["marks"] == 1
    text = _cli(double, "info", str(snap))
    assert "NVTX ranges recorded (12 ranges, 1 marks)" in text.stdout
    line = next(l for l in text.stdout.splitlines() if l.startswith("registered step"))
    assert line.split()[2:4] == ["mylib", "4"]
    dump = _cli(double, "dump", str(snap))
    assert dump.returncode == 0
    lines = [l for l in dump.stdout.splitlines() if l.startswith("[nvtx")]
    assert len(lines) == 2 + 4 * 4 + 5 + 2
    assert any(l.startswith("[nvtx push]") and '"registered step"' in l and "domain=mylib" in l for l in lines)
    jl = _cli(double, "dump", str(snap), "--format", "jsonl")
    assert sum(json.loads(l)["k"] == "nvtx" for l in jl.stdout.splitlines()) == len(lines)


def test_a_tool_already_named_keeps_nvtx(double, capture, tmp_path):
    """Under nsys or ncu NVTX_INJECTION64_PATH names their library: capture leaves it (the
    program loads that one) and says the ranges were not recorded."""
    other = tmp_path / "libother-injection.so"
    cp, snap = capture(double["progs"]["nvtx_client"], "2", extra_env={"NVTX_INJECTION64_PATH": str(other)})
    assert cp.returncode == 0, cp.stderr
    assert "INJECTED 0" in cp.stdout                # the client tried the other library
    recs = _records(snap)
    assert not [r for r in recs if r["k"] == "nvtx"]
    assert SnapshotReader(snap).header["options"]["nvtx"] == f"not recorded: NVTX_INJECTION64_PATH={other}"


def test_injection_outside_a_capture_declines(double, tmp_path):
    """The shim loaded as an injection without a capture session turns NVTX down (NVTX then
    makes every call a no-op) and the program runs as usual."""
    from cudasnap.capture.runner import shim_path
    env = dict(double["env"])
    env["NVTX_INJECTION64_PATH"] = shim_path()
    env.pop("CUDASNAP_SESSION", None)
    cp = subprocess.run([double["progs"]["nvtx_client"], "2"], env=env, capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert "INJECTED 0" in cp.stdout and "LAUNCHES 2" in cp.stdout
