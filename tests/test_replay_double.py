"""Replay end to end on the CUDA test double: capture real programs with `cudasnap capture`,
replay them with `cudasnap replay` (both with LD_LIBRARY_PATH pointing at the double)."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from cudasnap.formats import SnapshotReader
from synth import Synth, write_double_program
from snapedit import rewrite


def _replay(double, snap, *args, extra_env=None, timeout=120):
    env = dict(double["env"])
    env.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    env.update(extra_env or {})
    return subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snap), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def _calls(path):
    return [c for c in SnapshotReader(path).records() if c["k"] == "c"]


@pytest.mark.parametrize("prog", ["direct", "viadlsym", "viaproc", "chase", "launch_forms", "threads", "memops",
                                  "texture"])
def test_capture_then_replay_verifies(prog, double, capture):
    cp, snap = capture(double["progs"][prog])
    assert cp.returncode == 0, cp.stderr
    rp = _replay(double, snap)
    assert rp.returncode == 0, rp.stdout + rp.stderr
    assert re.search(r"\d+ placed at recorded address, 0 fell back", rp.stdout), rp.stdout
    assert "OK: every recorded D2H result reproduced" in rp.stdout


def test_stream_memory_operations_replay(double, capture):
    """A flag one stream writes (cuStreamWriteValue32) and another waits for before a kernel
    increments it, and a 64-bit write and wait: replayed on device memory, both D2H results
    verified, nothing refused."""
    cp, snap = capture(double["progs"]["memops"])
    assert cp.returncode == 0 and "FLAG 42 WIDE 123456789" in cp.stdout, cp.stdout + cp.stderr
    assert {c["f"] for c in _calls(snap)} >= {"cuStreamWriteValue32_v2", "cuStreamWaitValue64_v2"}
    rp = _replay(double, snap, "--json")
    assert rp.returncode == 0, rp.stdout + rp.stderr
    import json
    d = json.loads(rp.stdout)
    assert d["d2h_verified"] == 2 and d["fell_back"] == 0, d


def test_arrays_textures_and_surfaces_replay(double, capture):
    """A float array filled by a 2D copy and read through a texture object, a texture over
    linear device memory, a surface a kernel fills, read back by a 2D copy, 3D copies between
    pitched host slices and device memory, and 1D copies through arrays: replayed with every
    D2H result verified. A driver that hands out other object values than recorded
    (DOUBLE_TEX_BASE) stops the replay naming both values: kernels read the recorded one."""
    cp, snap = capture(double["progs"]["texture"])
    assert cp.returncode == 0 and "TEX 43680.0 LIN 262080.0 SURF 4160.0 C3D 23232.0 A1D 9656.0" in cp.stdout, cp.stdout + cp.stderr
    rp = _replay(double, snap, "--json")
    assert rp.returncode == 0, rp.stdout + rp.stderr
    import json
    d = json.loads(rp.stdout)
    assert d["d2h_verified"] == 5 and d["launches"] == 3 and d["fell_back"] == 0, d
    # the first tex_fetch alone: the surface's kernel is left out, so the array it wrote is
    # read back but not compared
    rp = _replay(double, snap, "-k", "tex_fetch", "-c", "1", "--json")
    assert rp.returncode == 0, rp.stdout + rp.stderr
    d = json.loads(rp.stdout)
    assert d["d2h_verified"] >= 1 and d["d2h_left_out"] >= 1 and not d["mismatches"], d
    rp = _replay(double, snap, extra_env={"DOUBLE_TEX_BASE": "100"})
    assert rp.returncode == 2 and "the driver gave texture object 0x65 where the program had 0x1" in rp.stdout, rp.stdout


def test_threads_option(double, capture):
    cp, snap = capture(double["progs"]["threads"])
    assert cp.returncode == 0
    rp = _replay(double, snap, "--threads", "--json")
    assert rp.returncode == 0, rp.stdout + rp.stderr
    assert '"exit_code": 0' in rp.stdout


def test_forced_fallback_is_reported_and_payloads_relocated(double, capture):
    cp, snap = capture(double["progs"]["chase"])
    assert cp.returncode == 0
    big = [c for c in _calls(snap) if c["f"] == "cuMemAlloc_v2" and c["a"]["bytesize"] == 8 << 20][0]
    addr = hex(big["a"]["dptr"])
    env = {"CUDASNAP_REPLAY_TEST_BLOCK": addr}
    rp = _replay(double, snap, extra_env=env)
    assert "1 fell back" in rp.stdout, rp.stdout
    assert f"fell back: {addr}" in rp.stdout and "did not honour" in rp.stdout
    assert "stale recorded address" in rp.stdout      # the pointer table in device memory
    assert rp.returncode == 2                          # the kernel chases a stale pointer
    rp = _replay(double, snap, "--relocate-payloads", extra_env=env)
    assert rp.returncode == 0, rp.stdout
    assert "1 fell back" in rp.stdout and "rewritten" in rp.stdout


def test_tampered_d2h_blob_exits_1_naming_the_call(double, capture, tmp_path):
    cp, snap = capture(double["progs"]["chase"])
    assert cp.returncode == 0
    d2h = [c for c in _calls(snap) if c["f"].startswith("cuMemcpyDtoH")][0]
    bad = tmp_path / "tampered.cusnap"

    def mutate(rec, r, w):
        if rec.get("k") == "c" and rec.get("s") == d2h["s"]:
            data = bytearray(r.blob(d2h["x"]["dstHost"]["blob"]))
            data[3] ^= 0xFF
            rec["x"]["dstHost"] = {"blob": w.add_blob(bytes(data)), "size": len(data)}

    rewrite(snap, bad, mutate)
    rp = _replay(double, bad)
    assert rp.returncode == 1, rp.stdout + rp.stderr
    assert f"call #{d2h['s']} {d2h['f']}" in rp.stdout and "byte offset 3" in rp.stdout
    assert "last written by" in rp.stdout and "chase" in rp.stdout


def test_a_result_that_differs_as_float_rounding_does_is_named_and_the_replay_goes_on(double, capture, tmp_path):
    """A recorded D2H result 1 ULP off (as a reduction with atomics gives from run to run):
    the mismatch carries the hint and the tolerance that accepts it, the replay runs to the end
    (exit 1 still), and --dtype f32 --rtol accepts it (exit 0). A result that is plainly wrong
    stops the replay there, as before."""
    import json
    import struct
    cp, snap = capture(double["progs"]["direct"])
    assert cp.returncode == 0
    whole = json.loads(_replay(double, snap, "--json").stdout)

    def edited(name, change):
        def payload(key, data):
            if len(data) >= 8 and struct.unpack_from("<f", data, 4)[0] == 11.0:     # the D2H result: i + 10
                data = data[:4] + struct.pack("<I", change(struct.unpack_from("<I", data, 4)[0])) + data[8:]
            return data
        out = tmp_path / name
        rewrite(snap, out, payload=payload)
        return out

    near = edited("near.cusnap", lambda w: w + 1)
    rp = _replay(double, near)
    assert rp.returncode == 1, rp.stdout + rp.stderr
    assert "floating-point atomics" in rp.stdout and "--dtype f32 --rtol 1e-06" in rp.stdout
    assert "1 D2H result(s) differ as float rounding does" in rp.stdout and "Traceback" not in rp.stderr
    res = json.loads(_replay(double, near, "--json").stdout)
    assert res["exit_code"] == 1 and res["rounding_mismatches"] == 1 and res["calls"] == whole["calls"]
    assert _replay(double, near, "--dtype", "f32", "--rtol", "1e-6").returncode == 0
    wrong = json.loads(_replay(double, edited("wrong.cusnap", lambda w: w ^ 0x40000000), "--json").stdout)
    assert wrong["exit_code"] == 1 and wrong["rounding_mismatches"] == 0 and wrong["calls"] < whole["calls"]
    assert "hint" not in wrong["mismatches"][0]


@pytest.mark.parametrize("odd", [1.5, None, "text", [1, 2]])
def test_a_call_record_whose_arguments_are_not_a_map_is_skipped_and_named(double, capture, tmp_path, odd):
    """A damaged or foreign record (its arguments or extras not a map): replay, info and dump
    give no traceback; replay skips the call, names it, and still judges every D2H result."""
    cp, snap = capture(double["progs"]["chase"])
    assert cp.returncode == 0
    q = next(c for c in _calls(snap) if c["f"] == "cuCtxGetDevice" or c["f"].startswith("cuDeviceGet"))
    bad = tmp_path / "odd.cusnap"

    def mutate(rec, r, w):
        if rec.get("k") == "c" and rec.get("s") == q["s"]:
            rec["a"] = odd

    rewrite(snap, bad, mutate)
    rp = _replay(double, bad)
    assert rp.returncode == 0, rp.stdout + rp.stderr
    assert ("1 call record(s) malformed (a function name, arguments, extras or thread of the wrong type), "
            f"first call #{q['s']} {q['f']}") in rp.stdout
    assert "OK: every recorded D2H result reproduced" in rp.stdout
    for cmd in (("info",), ("dump",), ("stats",)):
        out = subprocess.run([sys.executable, "-m", "cudasnap", *cmd, str(bad)], env=double["env"],
                             capture_output=True, text=True, timeout=60)
        assert "Traceback" not in out.stderr and out.returncode in (0, 1, 2), (cmd, out.stderr)
    # export and extract write programs and snapshots from it: they refuse, naming the call
    for cmd in (("export", str(bad), "-o", str(tmp_path / "x")),
                ("extract", str(bad), "--launch", "1", "-o", str(tmp_path / "e.cusnap"))):
        out = subprocess.run([sys.executable, "-m", "cudasnap", *cmd], env=double["env"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, (cmd, out.stderr)
        assert f"call #{q['s']} {q['f']}: the call record is malformed" in out.stderr, out.stderr


def test_truncated_snapshot_replays_to_last_complete_call(double, tmp_path):
    full = tmp_path / "full.cusnap"
    write_double_program(full, frame_bytes=512)
    data = full.read_bytes()
    cut = tmp_path / "cut.cusnap"
    cut.write_bytes(data[: int(len(data) * 0.8)])
    r = SnapshotReader(cut)
    assert r.truncated
    rp = _replay(double, cut)
    assert "truncated" in rp.stdout and "last complete call #" in rp.stdout, rp.stdout
    assert rp.returncode in (0, 1), rp.stdout + rp.stderr


def test_incomplete_call_stops_replay(double, tmp_path):
    p = tmp_path / "inc.cusnap"
    write_double_program(p, incomplete=True)
    rp = _replay(double, p)
    assert rp.returncode == 0, rp.stdout + rp.stderr
    assert "never returned in the recording" in rp.stdout


def test_synthetic_program_and_kernel_filter(double, tmp_path):
    p = tmp_path / "syn.cusnap"
    facts = write_double_program(p)
    rp = _replay(double, p)
    assert rp.returncode == 0, rp.stdout + rp.stderr
    assert "3 placed at recorded address, 0 fell back" in rp.stdout
    rp = _replay(double, p, "--kernels", "^add_one$", "--continue-on-error")
    # chase left out: its output is not compared (no false mismatch), and the summary says so
    assert rp.returncode == 0 and "DIFFERENT:" not in rp.stdout, rp.stdout
    assert "D2H result(s) not compared: they depend on work the selection left out" in rp.stdout
    assert f"call #{facts['d2h_c']}" not in rp.stdout


def test_watchdog_turns_a_hang_into_exit_2(double, tmp_path):
    import struct
    p = tmp_path / "hang.cusnap"

    def spin(s, facts):
        s.call("cuModuleGetFunction", {"hfunc": 0x66660001, "hmod": 0x55560000, "name": "spin"})
        s.fn(0x66660001, "spin", 0x55560000, [[0, 4]])
        s.launch(0x66660001, struct.pack("<i", 5000))

    write_double_program(p, extra_calls=[spin])
    rp = _replay(double, p, "--watchdog", "0.5", timeout=60)
    assert rp.returncode == 2
    assert "watchdog" in rp.stderr and "cuLaunchKernel" in rp.stderr


def test_no_driver_is_one_line_error(tmp_path):
    p = tmp_path / "syn.cusnap"
    write_double_program(p)
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(tmp_path)}   # no libcuda anywhere
    import os
    env.update({k: v for k, v in os.environ.items() if k.startswith(("PYTHON", "VIRTUAL_ENV", "HOME"))})
    env["LD_LIBRARY_PATH"] = str(tmp_path)
    rp = subprocess.run([sys.executable, "-m", "cudasnap", "replay", "-q", str(p)], env=env, capture_output=True,
                        text=True, timeout=60)
    assert rp.returncode == 2
    assert "Traceback" not in rp.stderr + rp.stdout


@pytest.mark.parametrize("use_after_destroy", [False, True])
def test_description_driven_handlers(double, tmp_path, use_after_destroy):
    """Streams, events and graphs replayed by the generic handler from the API description:
    created handles are remembered, passed on as live ones, and forgotten when destroyed."""
    p = tmp_path / "gen.cusnap"
    s = Synth(p)
    s.double_prologue("add_one", 0x55570001, [[0, 8], [8, 4]])
    S, E0, E1, G = 0x5000, 0x6000, 0x6001, 0x7000
    s.call("cuStreamCreateWithPriority", {"phStream": S, "flags": 1, "priority": -1})
    s.call("cuEventCreate", {"phEvent": E0, "Flags": 0})
    s.call("cuEventCreate", {"phEvent": E1, "Flags": 0})
    s.call("cuEventRecord", {"hEvent": E0, "hStream": S})
    s.call("cuStreamWaitEvent", {"hStream": 0, "hEvent": E0, "Flags": 0})
    s.call("cuEventRecord", {"hEvent": E1, "hStream": S})
    s.call("cuEventSynchronize", {"hEvent": E1})
    s.call("cuEventElapsedTime_v2", {"pMilliseconds": 0, "hStart": E0, "hEnd": E1})
    s.call("cuGraphCreate", {"phGraph": G, "flags": 0})
    s.call("cuGraphDestroy", {"hGraph": G})
    s.call("cuEventDestroy_v2", {"hEvent": E0})
    s.call("cuEventDestroy_v2", {"hEvent": E1})
    s.call("cuStreamSynchronize", {"hStream": S})
    s.call("cuStreamDestroy_v2", {"hStream": S})
    if use_after_destroy:
        s.call("cuEventSynchronize", {"hEvent": E1})
    s.close()
    rp = _replay(double, p)
    if use_after_destroy:
        assert rp.returncode == 2 and "unknown event 0x6001" in rp.stdout + rp.stderr, rp.stdout + rp.stderr
    else:
        assert rp.returncode == 0, rp.stdout + rp.stderr


OPEN_COUNTER = """
import runpy, sys
n = [0]
def hook(ev, args):
    if ev == "open" and isinstance(args[0], str) and args[0] == sys.argv[2]:
        n[0] += 1
sys.addaudithook(hook)
try:
    runpy.run_module("cudasnap", run_name="__main__")
finally:
    sys.stderr.write(f"opens={n[0]}\\n")
"""


@pytest.mark.parametrize("profile", [[], ["--profile", "timeline"]])
def test_a_replay_opens_its_snapshot_once(double, tmp_path, profile):
    """The preflight check, the architecture check, the engine and the end-state check share
    the process's one reader: the file is opened once (and once more only to sniff whether it
    is a job's manifest), its frames checked once."""
    snap = tmp_path / "s.cusnap"
    write_double_program(snap)
    args = ["replay", str(snap), "-q"] + profile + (["--out", str(tmp_path / "p.json")] if profile else [])
    cp = subprocess.run([sys.executable, "-c", OPEN_COUNTER, *args], env=double["env"], capture_output=True,
                        text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert cp.stderr.strip().splitlines()[-1] == "opens=2", cp.stderr
