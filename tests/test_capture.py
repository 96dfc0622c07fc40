"""Capture end to end on the test-double driver: the real shim, ring, recorder and format."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections import Counter

import pytest

from cudasnap.formats import SnapshotReader


def _launches_printed(stdout: str) -> int:
    m = re.search(r"^LAUNCHES (\d+)$", stdout, re.M)
    assert m, stdout
    return int(m.group(1))


def _calls(path):
    r = SnapshotReader(path)
    return r, [c for c in r.records() if c["k"] == "c"]


def _recorded_launches(calls) -> int:
    return sum(1 for c in calls if c["f"].startswith("cuLaunch") and "Host" not in c["f"])


@pytest.mark.parametrize("prog", ["direct", "viadlsym", "viaproc", "launch_forms", "chase"])
def test_capture_matches_program(prog, double, capture, native):
    """Direct symbols, dlsym and cuGetProcAddress paths: output unchanged, every launch recorded."""
    path = double["progs"][prog]
    ref = native(path)
    cp, snap = capture(path)
    assert cp.returncode == ref.returncode == 0, cp.stderr
    # capture never changes the program's output; device addresses differ (placement region)
    mask = lambda s: re.sub(r"ptr 0x[0-9a-f]+", "ptr <addr>", s)
    assert mask(cp.stdout) == mask(ref.stdout)
    r, calls = _calls(snap)
    assert not r.truncated
    assert _recorded_launches(calls) == _launches_printed(ref.stdout)
    fns = {f["h"]: f for f in r.records(kinds=["fn"])}
    for c in calls:
        if c["f"].startswith("cuLaunchKernel") and c["f"] != "cuLaunchKernelEx":
            assert "params" in c.get("x", {}), c       # packed parameters always present
    assert all(f["params"] is not None for f in fns.values())
    assert [c["s"] for c in sorted(calls, key=lambda c: c["s"])] == sorted({c["s"] for c in calls})
    assert any(c["f"] == "cuModuleLoadData" and c["x"]["image"]["blob"] for c in calls) or prog == "launch_forms"


def test_records_match_what_program_did(double, capture):
    cp, snap = capture(double["progs"]["direct"], "7")
    r, calls = _calls(snap)
    names = [c["f"] for c in calls]
    assert names[0] == "cuInit"
    alloc = next(c for c in calls if c["f"] == "cuMemAlloc_v2")
    assert alloc["a"]["bytesize"] == 4096 and alloc["a"]["dptr"] != 0
    h2d = next(c for c in calls if c["f"] == "cuMemcpyHtoD_v2")
    assert h2d["a"]["dstDevice"] == alloc["a"]["dptr"]
    data = r.blob(h2d["x"]["srcHost"]["blob"])
    import struct
    assert struct.unpack("<4f", data[:16]) == (0.0, 1.0, 2.0, 3.0)
    d2h = next(c for c in calls if c["f"] == "cuMemcpyDtoH_v2")
    out = r.blob(d2h["x"]["dstHost"]["blob"])
    assert struct.unpack("<4f", out[:16]) == (7.0, 8.0, 9.0, 10.0)   # 7 launches of add_one
    launches = [c for c in calls if c["f"] == "cuLaunchKernel"]
    assert len(launches) == 7
    fn = next(iter(r.records(kinds=["fn"])))
    assert fn["name"] == "add_one" and fn["params"] == [[0, 8], [8, 4]]
    assert launches[0]["x"]["params"][:8] == alloc["a"]["dptr"].to_bytes(8, "little")
    proc = next(iter(r.records(kinds=["proc"])))
    assert proc["driver_version"] == 13000 and proc["gpus"][0]["cc"] == [9, 0]
    end = next(iter(r.records(kinds=["end"])))
    assert end["exit"] == 0 and end["clean_exit"]
    assert all(c["t1"] >= c["t0"] for c in calls)


def test_four_threads_ordering(double, capture, native):
    cp, snap = capture(double["progs"]["threads"])
    assert cp.returncode == 0, cp.stderr
    r, calls = _calls(snap)
    tids = Counter(c["tid"] for c in calls if c["f"].startswith("cuLaunch"))
    assert len(tids) == 4 and len(set(tids.values())) == 1
    assert _recorded_launches(calls) == _launches_printed(cp.stdout)
    seqs = [c["s"] for c in calls]
    assert len(seqs) == len(set(seqs))
    # per thread, sequence numbers increase in program order
    for tid in tids:
        mine = [c for c in calls if c["tid"] == tid]
        assert [c["s"] for c in mine] == sorted(c["s"] for c in mine)
        assert all(a["t0"] <= b["t0"] for a, b in zip(mine, mine[1:]))


def test_child_process_gets_its_own_snapshot(double, capture, tmp_path):
    cp, snap = capture(double["progs"]["child"], out=tmp_path / "child.cusnap")
    assert cp.returncode == 0, cp.stderr
    snaps = sorted(tmp_path.glob("child*.cusnap"))
    assert len(snaps) == 2, (snaps, cp.stderr)     # parent + CUDA child; the non-CUDA child leaves nothing
    pids = {SnapshotReader(s).header["pid"] for s in snaps}
    assert len(pids) == 2
    for s in snaps:
        _, calls = _calls(s)
        assert _recorded_launches(calls) > 0


def test_program_that_never_touches_cuda(double, capture, tmp_path):
    cp, snap = capture(double["progs"]["nocuda"])
    assert cp.returncode == 3                      # exit code passes through
    assert "hello" in cp.stdout
    assert not snap.exists()
    assert not list(tmp_path.glob("*.cusnap"))


def test_sigkill_mid_run_leaves_readable_snapshot(double, capture):
    """killme raises SIGKILL on itself after 500 launches: the snapshot keeps every call."""
    cp, snap = capture(double["progs"]["killme"], "500")
    assert cp.returncode in (-9, 137), cp.returncode
    r, calls = _calls(snap)
    ready = int(re.search(r"READY (\d+)", cp.stdout).group(1))
    launches = _recorded_launches(calls)
    assert launches >= 500                         # every launch that entered the ring survived
    assert len(calls) >= ready + 500
    end = next(iter(r.records(kinds=["end"])))
    assert end["signal"] == 9 and not end["clean_exit"]


def test_sigkill_from_outside(double, tmp_path):
    """The program is killed by someone else while launching in a loop."""
    import sys

    out = tmp_path / "k.cusnap"
    p = subprocess.Popen([sys.executable, "-m", "cudasnap", "capture", "-o", str(out), "--ring-mb", "16", "--",
                          double["progs"]["killme"]],
                         env=double["env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert line.startswith("READY")
    time.sleep(0.3)
    child = [int(x) for x in subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()]
    assert child
    os.kill(child[0], signal.SIGKILL)
    p.wait(timeout=60)
    assert p.returncode in (-9, 137)
    r, calls = _calls(out)
    assert _recorded_launches(calls) > 100
    assert not r.truncated                          # the recorder outlived the program and closed the file


@pytest.mark.parametrize("drain", ["lazy", "eager"])
def test_killed_inside_a_launch(double, tmp_path, drain):
    """A launch's record is complete before the call: killed inside cuLaunchKernel, the
    snapshot has that launch, marked as a call that never returned."""
    import sys

    out = tmp_path / "spin.cusnap"
    p = subprocess.Popen([sys.executable, "-m", "cudasnap", "capture", "-o", str(out), "--drain", drain, "--",
                          double["progs"]["killme"], "-1"],
                         env=double["env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().startswith("READY")
    p.stdout.readline()
    assert p.stdout.readline().startswith("SPIN")
    time.sleep(0.5)
    child = [int(x) for x in subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()]
    os.kill(child[0], signal.SIGKILL)
    p.wait(timeout=60)
    r, calls = _calls(out)
    last = calls[-1]
    assert last["f"] == "cuLaunchKernel" and last.get("incomplete") is True, last
    assert _recorded_launches(calls) == 6
    assert all(not c.get("incomplete") for c in calls[:-1])


def test_info_and_dump_on_captured_snapshot(double, capture):
    from typer.testing import CliRunner

    from cudasnap.cli import app

    cp, snap = capture(double["progs"]["direct"], "3")
    res = CliRunner().invoke(app, ["info", str(snap)])
    assert res.exit_code == 0 and "add_one" in res.output
    res = CliRunner().invoke(app, ["dump", str(snap), "--calls", "launches"])
    assert res.exit_code == 0 and res.output.count("cuLaunchKernel") == 3


def test_unwritable_snapshot_never_stalls_the_program(double, capture):
    """/dev/full: every write fails. The program runs to the end, unchanged; capture then says
    the snapshot was not saved and, the program having succeeded, exits 2 (never "captured")."""
    cp, _ = capture(double["progs"]["direct"], "20", out=__import__("pathlib").Path("/dev/full"))
    assert cp.returncode == 2
    assert "LAUNCHES 20" in cp.stdout
    assert "/dev/full: the snapshot was not saved completely" in cp.stderr
    assert cp.stderr.strip().splitlines()[-1].startswith("cudasnap: error: ")


@pytest.mark.parametrize("where", ["missing_dir", "a_dir", "not_a_dir", "unwritable"])
def test_unwritable_output_path_is_refused_before_the_program_runs(tmp_path, where):
    from pathlib import Path
    from cudasnap.capture.runner import run_capture
    out = {"missing_dir": tmp_path / "nope" / "x.cusnap", "a_dir": tmp_path,
           "not_a_dir": tmp_path / "file" / "x.cusnap", "unwritable": Path("/sys/x.cusnap")}[where]
    (tmp_path / "file").write_text("")
    marker = tmp_path / "ran"
    assert run_capture(["touch", str(marker)], out, ring_mb=1) == 2
    assert not marker.exists()


def test_disk_full_mid_capture_marks_partial(double, capture, tmp_path):
    """A 64 KiB tmpfs fills during the capture: warn once, keep what fits, never stall."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        cp, snap = capture(double["progs"]["direct"], "30000", out=mnt / "t.cusnap")
        assert cp.returncode == 2 and "LAUNCHES" in cp.stdout   # the program succeeded, the snapshot did not
        warnings = [l for l in cp.stderr.splitlines() if l.startswith("cudasnap: warning:")]
        assert sum("No space left on device" in l for l in warnings) <= 2   # warned once (plus the close)
        assert "the snapshot was not saved completely" in cp.stderr
        with SnapshotReader(snap) as r:        # closed before the unmount (else: busy)
            assert r.truncated or any(e.get("partial") for e in r.records(kinds=["end"]))
    finally:
        subprocess.run(["umount", str(mnt)])


@pytest.mark.parametrize("copy_threads", ["0", "3"])
def test_large_payloads_are_chunked_and_deduplicated(double, capture, tmp_path, copy_threads):
    """A 21 MiB buffer uploaded twice, then with one byte changed, then read back: the shim
    digests its 4 MiB chunks (on helper threads or alone) and sends only new ones; every
    payload reads back exactly; the file stores 6 + 1 chunks."""
    from cudasnap.formats.container import blob_id_of
    work = tmp_path / "payloads"
    work.mkdir()
    cp, snap = capture(double["progs"]["bigcopy"], str(work), extra_env={"CUDASNAP_COPY_THREADS": copy_threads})
    assert cp.returncode == 0 and "MATCH 1" in cp.stdout, cp.stderr
    v1, v2 = (work / "v1.bin").read_bytes(), (work / "v2.bin").read_bytes()
    r, calls = _calls(snap)
    h2d = [c["x"]["srcHost"]["blob"] for c in calls if c["f"] == "cuMemcpyHtoD_v2"]
    d2h = [c["x"]["dstHost"]["blob"] for c in calls if c["f"] == "cuMemcpyDtoH_v2"]
    assert h2d == [blob_id_of(v1), blob_id_of(v1), blob_id_of(v2)] and d2h == [blob_id_of(v2)]
    assert r.blob(h2d[0]) == v1 and r.blob(h2d[2]) == v2 and r.blob(d2h[0]) == v2
    chunk_frames = [f for f in r.frames() if f[1] == "chunk"]
    assert len(chunk_frames) == 7, chunk_frames       # 5 whole + 1 tail, then the changed one
    r.verify()


@pytest.mark.parametrize("all_queries", [False, True])
def test_identical_queries_are_counted(double, tmp_path, all_queries):
    """Two threads asking the same questions before every launch: the snapshot accounts for
    every call, as a record or (by default) as a counted repeat of that thread's recorded
    call with the same arguments, outputs and result; --all-queries records each one."""
    import sys
    from cudasnap.inspect_cmds import summarize
    cudasnap_cmd = lambda *a: [sys.executable, "-m", "cudasnap", *a]
    snap = tmp_path / "q.cusnap"
    cmd = cudasnap_cmd("capture", "-q", "-o", str(snap), *(["--all-queries"] if all_queries else []),
                       "--", double["progs"]["queries"], "300")
    cp = subprocess.run(cmd, env=double["env"], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    made = {k: int(v) for k, v in re.findall(r"(cu\w+) (\d+)", cp.stdout)}
    r, calls = _calls(snap)
    by_seq = {c["s"]: c for c in calls}
    stored, counted = Counter(), Counter()
    for c in calls:
        stored[c["f"].removesuffix("_v2")] += 1
    reps = list(r.records(kinds=["rep"]))
    for rep in reps:
        for e in rep["calls"]:
            orig = by_seq[e["of"]]
            assert orig["f"] == e["f"] and orig["tid"] == rep["tid"] and e["n"] > 0
            counted[e["f"].removesuffix("_v2")] += e["n"]
    for name, n in made.items():
        assert stored[name] + counted[name] == n, (name, stored[name], counted[name], n)
    assert stored["cuLaunchKernel"] == 600
    if all_queries:
        assert not reps
    else:
        assert stored["cuCtxGetDevice"] < 20 and counted["cuCtxGetDevice"] > 1700
    info = summarize(r)["calls"]                      # `cudasnap info` counts them all
    assert sum(n for f, n in info["by_name"].items() if f.startswith("cuCtxGetDevice")) == made["cuCtxGetDevice"]
    assert info["collapsed"] == sum(counted.values())


def test_session_dir_falls_back_when_dev_shm_is_small(monkeypatch, capsys):
    """A container's small /dev/shm: rings go to the temporary directory instead."""
    from cudasnap.capture import runner as cr

    monkeypatch.setattr(cr, "_free_bytes", lambda p: (64 << 20) if p == "/dev/shm" else (1 << 40))
    d = cr._session_dir(256)
    try:
        assert not str(d).startswith("/dev/shm")
        assert capsys.readouterr().err == ""
    finally:
        d.rmdir()
    monkeypatch.setattr(cr, "_free_bytes", lambda p: 0)
    d = cr._session_dir(256)
    try:
        assert "has room for two 256 MiB rings" in capsys.readouterr().err
    finally:
        d.rmdir()


@pytest.mark.parametrize("clock", ["tsc", "ns"])
def test_timestamps_are_monotonic_ns(double, tmp_path, clock):
    """Record timestamps come out as CLOCK_MONOTONIC ns whether the shim took them from the
    TSC (where the kernel's clocksource is tsc) or from clock_gettime (CUDASNAP_CLOCK=ns)."""
    import sys

    env = dict(double["env"])
    if clock == "ns":
        env["CUDASNAP_CLOCK"] = "ns"
    out = tmp_path / "clk.cusnap"
    a = time.monotonic_ns()
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "capture", "-q", "-o", str(out), "--",
                         double["progs"]["direct"], "20"], env=env, capture_output=True, text=True)
    b = time.monotonic_ns()
    assert cp.returncode == 0, cp.stderr
    _r, calls = _calls(out)
    t0 = [c["t0"] for c in calls]
    assert all(a <= t <= b for t in t0)
    assert t0 == sorted(t0)
    assert all(0 <= c["t1"] - c["t0"] < 10**9 for c in calls)
