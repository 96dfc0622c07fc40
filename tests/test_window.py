"""Capture windows on the test double: `cudasnap capture --window SPEC` writes one snapshot
per window (the state at its start + the calls inside), each replays with exit 0."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cudasnap.capture.window import StateKeeper, parse_window_spec
from cudasnap.formats import SnapshotReader
from cudasnap.shim import description


def _cap(double, out: Path, spec: str, *prog, extra=()):
    return subprocess.run([sys.executable, "-m", "cudasnap", "capture", "-o", str(out), "--ring-mb", "16",
                           "--window", spec, *extra, "--", *prog], env=double["env"], capture_output=True,
                          text=True, timeout=120)


def _replay(double, snap):
    return subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snap)], env=double["env"],
                          capture_output=True, text=True, timeout=120)


def _recs(path):
    return list(SnapshotReader(path).records())


def test_launch_range_window_replays(double, tmp_path):
    prog = [double["progs"]["windowed"], "12"]
    native = subprocess.run(prog, env=double["env"], capture_output=True, text=True, timeout=60)
    cp = _cap(double, tmp_path / "w.cusnap", "launches:6-11", *prog)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout == native.stdout                   # the program computes the same
    w1 = tmp_path / "w.w1.cusnap"
    assert sorted(p.name for p in tmp_path.glob("*.cusnap")) == ["w.w1.cusnap"]
    recs = _recs(w1)
    hdr = SnapshotReader(w1).header
    assert hdr["window"]["mode"] == "launches" and hdr["window"]["n"] == 1
    wins = [r for r in recs if r["k"] == "win"]
    assert [w["op"] for w in wins] == ["open", "state", "close"]
    state = [r for r in recs if r["k"] == "c" and r.get("state")]
    # the long-lived buffers and the step's scratch buffer, restored with their contents
    assert len(state) == 3 and wins[1]["bytes"] == 8192 + (9 << 20)
    calls = [r for r in recs if r["k"] == "c" and not r.get("state")]
    launches = [c for c in calls if c["f"] == "cuLaunchKernel"]
    i_open = recs.index(wins[0])
    assert len([c for c in recs[i_open:] if c.get("f") == "cuLaunchKernel"]) == 6    # launches 6..11
    assert len(launches) == 6
    # freed scratch buffers of earlier steps are not in the state; the live ones are
    allocs = [c for c in recs[:i_open] if c.get("f") == "cuMemAlloc_v2"]
    assert len(allocs) == 3
    assert not any(c.get("f", "").startswith("cuMemcpy") for c in recs[:i_open])
    rp = _replay(double, w1)
    assert rp.returncode == 0, rp.stdout + rp.stderr
    assert "0 fell back" in rp.stdout and re.search(r"mismatches\s+0\n", rp.stdout)
    assert re.search(r"D2H verified\s+4 ", rp.stdout), rp.stdout
    whole = tmp_path / "whole.cusnap"
    subprocess.run([sys.executable, "-m", "cudasnap", "capture", "-o", str(whole), "--ring-mb", "16", "--", *prog],
                   env=double["env"], capture_output=True, timeout=120, check=True)
    assert w1.stat().st_size < whole.stat().st_size


def test_signal_windows(double, tmp_path):
    """SIGUSR1 to cudasnap opens and closes: two windows, two snapshots, both replay."""
    p = subprocess.Popen([sys.executable, "-m", "cudasnap", "capture", "-o", str(tmp_path / "s.cusnap"),
                          "--ring-mb", "16", "--window", "signal", "--", double["progs"]["windowed"], "40", "15"],
                         env=double["env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = []
    for line in p.stdout:
        out.append(line)
        if line.strip() in ("STEP 5", "STEP 12", "STEP 16", "STEP 23"):
            p.send_signal(signal.SIGUSR1)
    err = p.stderr.read()
    assert p.wait(timeout=120) == 0, err
    native = subprocess.run([double["progs"]["windowed"], "40", "15"], env=double["env"], capture_output=True,
                            text=True, timeout=60)
    assert "".join(out) == native.stdout                 # SIGUSR1 never reached the program
    snaps = sorted(p.name for p in tmp_path.glob("*.cusnap"))
    assert snaps == ["s.w1.cusnap", "s.w2.cusnap"], err
    for s in snaps:
        rp = _replay(double, tmp_path / s)
        assert rp.returncode == 0, rp.stdout + rp.stderr
        assert re.search(r"D2H verified\s+[1-9]", rp.stdout)
    assert "window 2 (signal)" in err
    # the 9 MiB buffer did not change: window 2's state refers to it and the recorder took
    # its data from window 1's file; its read-back at step 19 verifies it
    st = [r for r in _recs(tmp_path / "s.w2.cusnap") if r["k"] == "win" and r["op"] == "state"][0]
    assert st["referenced"] >= 9 << 20, st
    assert any(r.get("f") == "cuMemcpyDtoH_v2" and r["a"]["ByteCount"] == 9 << 20
               for r in _recs(tmp_path / "s.w2.cusnap") if r["k"] == "c")


@pytest.mark.parametrize("spec,expect", [("nvtx:step#2", 1), ("profiler", 1), ("kernel:add_one#2", 1),
                                         ("nvtx:step", 3)])
def test_nvtx_profiler_kernel_windows(double, tmp_path, spec, expect):
    extra = ("--context", "1") if spec.startswith("kernel:") else ()      # --context acts on kernel windows alone
    cp = _cap(double, tmp_path / "n.cusnap", spec, double["progs"]["nvtx_client"], "3", extra=extra)
    assert cp.returncode == 0, cp.stderr
    snaps = sorted(tmp_path.glob("n.w*.cusnap"))
    assert len(snaps) == expect, cp.stderr
    for s in snaps:
        recs = _recs(s)
        assert any(r.get("f", "").startswith("cuLaunch") for r in recs)
        assert _replay(double, s).returncode == 0


def test_info_shows_window(double, tmp_path):
    cp = _cap(double, tmp_path / "w.cusnap", "launches:2-3", double["progs"]["windowed"], "4")
    assert cp.returncode == 0, cp.stderr
    info = subprocess.run([sys.executable, "-m", "cudasnap", "info", str(tmp_path / "w.w1.cusnap")],
                          env=double["env"], capture_output=True, text=True, timeout=60)
    assert info.returncode == 0, info.stderr
    assert re.search(r"window\s*:.*launches:2-3.*state 9\.0 MiB in 3 ranges", info.stdout), info.stdout


def test_a_window_to_a_launch_past_any_count_runs_to_the_end(double, tmp_path):
    """launches:A-B with B beyond 2**64 (what the shim can count) is read as "to the end"; it
    used to overflow the shim's parse, so the window never opened."""
    assert parse_window_spec("launches:1-" + "9" * 30)["b"] == 2 ** 63 - 1
    cp = _cap(double, tmp_path / "w.cusnap", "launches:1-" + "9" * 30, double["progs"]["windowed"], "4")
    assert cp.returncode == 0 and (tmp_path / "w.w1.cusnap").exists(), cp.stderr
    assert _replay(double, tmp_path / "w.w1.cusnap").returncode == 0


@pytest.mark.parametrize("spec", ["launches:5-2", "launches:x", "nvtx:", "kernel:(", "time:3-1", "bogus", "signal:1",
                                  "launches:99999999999999999999-99999999999999999999"])
def test_bad_window_spec_is_one_line(double, tmp_path, spec):
    cp = _cap(double, tmp_path / "x.cusnap", spec, double["progs"]["windowed"], "1")
    assert cp.returncode == 2
    assert cp.stderr.count("\n") == 1 and "--window" in cp.stderr
    with pytest.raises(ValueError):
        parse_window_spec(spec)


def _c(s, f, a, r=0, **kw):
    return {"k": "c", "s": s, "tid": 1, "f": f, "a": a, "r": r, **kw}


def test_state_keeper_drops_what_was_destroyed():
    k = StateKeeper(description.load())
    k.feed(_c(0, "cuInit", {"Flags": 0}))
    k.feed(_c(1, "cuModuleLoadData", {"module": 0xA0000, "image": 0x1}))
    k.feed(_c(2, "cuModuleGetFunction", {"hfunc": 0xB0000, "hmod": 0xA0000, "name": "k"}))
    k.feed(_c(3, "cuFuncSetAttribute", {"hfunc": 0xB0000, "attrib": 8, "value": 1 << 16}))
    k.feed(_c(4, "cuMemAlloc_v2", {"dptr": 0x600000000000, "bytesize": 4096}))
    k.feed(_c(5, "cuMemAlloc_v2", {"dptr": 0x600000001000, "bytesize": 4096}))
    k.feed(_c(6, "cuLaunchKernel", {"f": 0xB0000}))
    k.feed(_c(7, "cuMemFree_v2", {"dptr": 0x600000000000}))
    k.feed(_c(8, "cuMemAlloc_v2", {"dptr": 0x600000002000, "bytesize": 4096}, r=2))   # failed: no state
    assert list(k.calls) == [0, 1, 2, 3, 5]
    k.feed(_c(9, "cuModuleUnload", {"hmod": 0xA0000}))
    assert list(k.calls) == [0, 5]
    # VMM: a handle released while mapped stays until the mapping goes
    k.feed(_c(10, "cuMemAddressReserve", {"ptr": 0x700000000000, "size": 1 << 21, "alignment": 0, "addr": 0, "flags": 0}))
    k.feed(_c(11, "cuMemCreate", {"handle": 0xC0000, "size": 1 << 21, "prop": b"", "flags": 0}))
    k.feed(_c(12, "cuMemMap", {"ptr": 0x700000000000, "size": 1 << 21, "offset": 0, "handle": 0xC0000, "flags": 0}))
    k.feed(_c(13, "cuMemSetAccess", {"ptr": 0x700000000000, "size": 1 << 21, "desc": b"", "count": 1}))
    k.feed(_c(14, "cuMemRelease", {"handle": 0xC0000}))
    assert list(k.calls) == [0, 5, 10, 11, 12, 13, 14]
    k.feed(_c(15, "cuMemUnmap", {"ptr": 0x700000000000, "size": 1 << 21}))
    assert list(k.calls) == [0, 5, 10]
    # streams and events made and destroyed per step leave nothing; a stream capture is kept whole
    k.feed(_c(16, "cuStreamCreate", {"phStream": 0xD0000, "Flags": 0}))
    k.feed(_c(17, "cuStreamBeginCapture_v2", {"hStream": 0xD0000, "mode": 0}))
    k.feed(_c(18, "cuLaunchKernel", {"f": 0xB0000, "hStream": 0xD0000}))
    k.feed(_c(19, "cuStreamEndCapture", {"hStream": 0xD0000, "phGraph": 0xE0000}))
    assert list(k.calls) == [0, 5, 10, 16, 17, 18, 19]
    # a lookup repeated with the same answer is kept once
    k.feed(_c(20, "cuDeviceGet", {"device": 0, "ordinal": 0}))
    k.feed(_c(21, "cuDeviceGet", {"device": 0, "ordinal": 0}))
    assert 20 in k.calls and 21 not in k.calls


# ------------------------------------------------------------------ end state
def test_window_without_d2h_verifies_its_end_state(double, tmp_path):
    """launches:6-6 holds one add_one launch and no device-to-host copy: the end state the
    window recorded at its close (every live allocation's chunk hashes) is what verifies it;
    a result corrupted on replay (CUDA_DOUBLE_CORRUPT) is a mismatch naming the allocation,
    the chunk and the kernel that wrote it."""
    prog = [double["progs"]["windowed"], "12"]
    cp = _cap(double, tmp_path / "w.cusnap", "launches:6-6", *prog)
    assert cp.returncode == 0, cp.stderr
    w1 = tmp_path / "w.w1.cusnap"
    recs = _recs(w1)
    assert not any(r.get("f", "").startswith("cuMemcpyDtoH") for r in recs if r["k"] == "c")
    ends = [r for r in recs if r["k"] == "endstate"]
    assert len(ends) == 3 and sum(r["size"] for r in ends) == 8192 + (9 << 20)
    for r in ends:
        assert r["hash"] == "cs_hash_chunks" and r["chunk"] == 4 << 20
        assert len(r["h"]) == 8 * ((r["size"] // 16 * 16 + r["chunk"] - 1) // r["chunk"]) and r["tail"] == b""
    assert recs.index(ends[-1]) < recs.index([r for r in recs if r["k"] == "win" and r["op"] == "close"][0])
    rp = _replay(double, w1)
    assert rp.returncode == 0, rp.stdout + rp.stderr
    assert "0 D2H result(s) verified" in rp.stdout
    m = re.search(r"end state: (\d+) allocation\(s\), ([\d.]+) MiB verified", rp.stdout)
    assert m and int(m.group(1)) == 3 and float(m.group(2)) > 0, rp.stdout
    bad = subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(w1)],
                         env={**double["env"], "CUDA_DOUBLE_CORRUPT": "add_one:1"}, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert re.search(r"MISMATCH: end state: allocation 0x[0-9a-f]+ \(4096 bytes\): chunk 0 \(bytes 0-4096\) differs",
                     bad.stdout), bad.stdout
    assert "last written by #" in bad.stdout and "add_one" in bad.stdout
    assert "2 allocation(s)" in bad.stdout and "1 differ" in bad.stdout


def test_end_state_hash_is_the_kernel_function():
    """replay/endstate.py's host hash is hash_kernel.cu's sum: a pure-Python transcription
    agrees across a chunk boundary, and the PTX replay loads is the shim's."""
    import os
    from cudasnap.replay import endstate as E
    m64 = (1 << 64) - 1

    def mix(a, b, i):
        h = ((a ^ (i * E._K1)) * E._K2) & m64
        h ^= ((b + i) * E._K3) & m64
        h ^= h >> 31
        return (h * E._K4) & m64

    data = os.urandom(16 * 40)
    first = E._WORDS - 25                  # 25 words in chunk 0, 15 in chunk 1
    want = [0, 0]
    for k in range(40):
        a = int.from_bytes(data[16 * k:16 * k + 8], "little")
        b = int.from_bytes(data[16 * k + 8:16 * k + 16], "little")
        w = first + k
        want[w // E._WORDS] = (want[w // E._WORDS] + mix(a, b, w % E._WORDS)) & m64
    assert E.host_hashes(data, first) == want
    ptx = E.hash_ptx()
    assert ptx.endswith(b"\0") and b".entry cs_hash_chunks" in ptx and b".version" in ptx


@pytest.mark.parametrize("spec,mode", [("launches:5-6", ""), ("launches:5-9", ""), ("kernel:incr", ""),
                                       ("launches:4-5", "once"), ("launches:2-3", "once")])
def test_window_inside_a_stream_capture_waits_for_its_end(double, tmp_path, spec, mode):
    """A window whose start or end falls inside a stream capture (PyTorch's CUDA graphs,
    XLA's command buffers) must not sync or copy there: that invalidates the program's
    capture. It opens or closes at the first call after the capture, and replays; an executable
    graph whose graph was destroyed before the window (once) is kept in its state."""
    prog = [double["progs"]["capwin"], "4", *([mode] if mode else [])]
    native = subprocess.run(prog, env=double["env"], capture_output=True, text=True, timeout=60)
    assert native.returncode == 0, native.stderr
    cp = _cap(double, tmp_path / "c.cusnap", spec, *prog)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout == native.stdout
    w1 = tmp_path / "c.w1.cusnap"
    recs = _recs(w1)
    wins = [r["op"] for r in recs if r["k"] == "win"]
    assert wins[0] == "open" and wins[-1] == "close", wins
    rp = _replay(double, w1)
    assert rp.returncode == 0, rp.stdout + rp.stderr
    assert "end state" in rp.stdout or re.search(r"D2H verified\s+[1-9]", rp.stdout), rp.stdout


def test_threads_reaching_the_first_launch_together_open_one_window(double, tmp_path):
    """Four threads launch in tight loops: two of them could take the same launch number as the
    window's first and both open it (two windows, each dump waiting on the other for seconds,
    and the first's end releasing the program while the second still copied)."""
    prog = [double["progs"]["threads"], "300"]
    native = subprocess.run(prog, env=double["env"], capture_output=True, text=True, timeout=60)
    for i in range(8):                   # the race took 31 of 40 runs before the fix
        a = 200 + 37 * i
        out = tmp_path / f"r{i}" / "w.cusnap"
        out.parent.mkdir()
        cp = _cap(double, out, f"launches:{a}-{a + 50}", *prog)
        assert cp.returncode == 0 and sorted(cp.stdout.splitlines()) == sorted(native.stdout.splitlines()), cp.stderr
        assert [p.name for p in out.parent.glob("w.w*.cusnap")] == ["w.w1.cusnap"], cp.stderr
        pauses = [float(x) for x in re.findall(r"program paused ([\d.]+) ms", cp.stderr)]
        assert len(pauses) == 1 and pauses[0] < 1000, cp.stderr
    rp = _replay(double, out.parent / "w.w1.cusnap")
    assert rp.returncode == 0, rp.stdout + rp.stderr
