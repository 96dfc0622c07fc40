"""replay --sim: snapshots taken on the test double, of a program whose module is PTX (committed
in tests/data/sim with the .cu it came from), replayed on GPGPU-Sim and verified against the
recorded results. Skipped where no simulator build is found ($CUDASNAP_GPGPUSIM, else the CI
machine's build)."""
from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from double import fixtures

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "sim"


def _sim_path():
    # the variable, else the build the CI machine keeps beside the checkout
    for p in (os.environ.get("CUDASNAP_GPGPUSIM"), str(REPO.parent / "shared" / "sim" / "gpgpu-sim"),
              "/work/shared/sim/gpgpu-sim"):
        if p and os.path.isfile(os.path.join(p, "lib", "libcudart.so")):
            return p
    return None


SIM = _sim_path()
pytestmark = pytest.mark.skipif(SIM is None, reason="no GPGPU-Sim build (set CUDASNAP_GPGPUSIM to one)")


def _cli(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "cudasnap", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _sim(snap, *args):
    return _cli("replay", snap, "--sim", "gpgpu-sim", "--sim-path", SIM, *args)


@pytest.fixture(scope="module")
def snaps(tmp_path_factory):
    """Captures of simprog on the double: plain, with a one-past-the-end pointer stored in its
    table, and with add_one's recorded result corrupted (CUDA_DOUBLE_CORRUPT)."""
    d = fixtures.built_double(tmp_path_factory)
    tmp = tmp_path_factory.mktemp("simsnaps")
    out = {}
    for key, args, extra in (("plain", [], {}), ("ends", ["ends"], {}),
                             ("corrupt", [], {"CUDA_DOUBLE_CORRUPT": "add_one:1"})):
        env = dict(d["env"], **extra)
        snap = tmp / f"{key}.cusnap"
        cp = _cli("capture", "-o", snap, "--ring-mb", "16", "--", d["progs"]["simprog"], DATA / "kernels.ptx", *args,
                  env=env, timeout=120)
        assert snap.exists(), cp.stdout + cp.stderr
        out[key] = snap
    out["double"] = d
    out["tmp"] = tmp
    return out


def test_functional_replay_verifies_every_kernel(snaps):
    """fill, add_one, saxpy, tile_sum (shared memory, barriers), histo (atomics) and chase (a
    pointer table uploaded to device memory, relocated) all run on the simulator and verify."""
    cp = _sim(snaps["plain"])
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "OK: every recorded D2H result reproduced" in cp.stdout
    assert re.search(r"D2H verified\s+6 \(", cp.stdout) and re.search(r"\nlaunches\s+7\n", cp.stdout)
    assert "stale recorded address(es)" in cp.stdout and "rewritten" in cp.stdout    # the table, relocated


def test_selection_runs_one_kernel(snaps):
    cp = _sim(snaps["plain"], "-k", "tile_sum", "--progress")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert re.match(r"cudasnap: simulated 1/1 kernels \(tile_sum: [0-9.]+ s\), [0-9.]+ s elapsed\n$", cp.stderr), cp.stderr
    assert re.search(r"\nlaunches\s+1\n", cp.stdout) and re.search(r"D2H verified\s+1 \(", cp.stdout)


def test_unprovable_pointer_refused_by_name(snaps):
    cp = _sim(snaps["ends"])
    assert cp.returncode == 2
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1, cp.stderr
    assert "cuMemcpyHtoD_v2 writes buffer 0x" in lines[0] and "is the end of allocation" in lines[0]
    assert "cannot be relocated with proof" in lines[0]
    assert cp.stdout == ""                                   # refused before anything ran


def test_wrong_kernel_is_a_mismatch(snaps):
    """--replace with a PTX that computes something else: a mismatch naming call, kernel, offset."""
    cp = _sim(snaps["plain"], "--replace", f"add_one={DATA / 'wrong_add_one.ptx'}")
    assert cp.returncode == 1, cp.stdout + cp.stderr
    assert re.search(r"call #\d+ cuMemcpyDtoH_v2: first divergence at byte offset \d+ .*last written by #\d+ ", cp.stdout)
    assert "FAILED: verification mismatch (exit 1)" in cp.stdout and "OK:" not in cp.stdout


def test_tampered_recording_is_a_mismatch(snaps):
    cp = _sim(snaps["corrupt"])
    assert cp.returncode == 1, cp.stdout + cp.stderr
    assert re.search(r"call #\d+ cuMemcpyDtoH_v2: first divergence at byte offset 0 ", cp.stdout)
    assert "FAILED: verification mismatch (exit 1)" in cp.stdout and "OK:" not in cp.stdout


def _fatbin_sass_only(arch=90) -> bytes:
    payload = b"\x7fELF" + bytes(60)
    entry = struct.pack("<HHIQ", 2, 0, 64, len(payload)) + bytes(12) + struct.pack("<I", arch) + bytes(40)
    body = entry + payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def test_sass_only_kernel_refused_before_the_run(tmp_path):
    from synth import Synth
    snap = tmp_path / "sass.cusnap"
    s = Synth(snap)
    s.call("cuInit", {"Flags": 0})
    s.call("cuDevicePrimaryCtxRetain", {"pctx": 0x111, "dev": 0})
    s.call("cuCtxSetCurrent", {"ctx": 0x111})
    s.call("cuModuleLoadData", {"module": 0x222, "image": 1}, x={"image": s.blob(_fatbin_sass_only())})
    s.call("cuModuleGetFunction", {"hfunc": 0x333, "hmod": 0x222, "name": "gemm_sass"})
    s.fn(0x333, "gemm_sass", 0x222, [[0, 8]])
    s.call("cuMemAlloc_v2", {"dptr": 0x300000000000, "bytesize": 64})
    s.launch(0x333, struct.pack("<Q", 0x300000000000))
    s.close()
    cp = _sim(snap)
    assert cp.returncode == 2
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1, cp.stderr
    assert lines[0].startswith("cudasnap: error: kernel gemm_sass (first launched at call #")
    assert "has no PTX (module of call #4: fatbin: sm_90 SASS)" in lines[0]
    assert "--replace gemm_sass=FILE.ptx" in lines[0]
    assert cp.stdout == ""


def test_performance_profile_compares_with_silicon(snaps):
    """Performance mode writes per-kernel cycles into a timeline profile; compare puts it beside a
    timeline profile of the (here: double's) device, saying it is silicon vs simulator."""
    tmp = snaps["tmp"]
    sim_json = tmp / "sim.json"
    cp = _sim(snaps["plain"], "-k", "tile_sum", "--sim-mode", "performance", "--out", sim_json)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    prof = json.loads(sim_json.read_text())
    assert prof["summary"]["mode"] == "timeline" and prof["summary"]["simulated"] is True
    (row,) = prof["launches"]
    assert row["name"] == "tile_sum" and row["cycles"] > 0 and row["time_us"] > 0
    assert prof["run"]["gpu"]["name"] == "GPGPU-Sim SM86_RTX3070 (simulated)"
    assert prof["run"]["simulated"]["core_clock_mhz"] == 1132.0
    assert "tile_sum:" in cp.stdout and "cycles" in cp.stdout
    gpu_json = tmp / "gpu.json"
    g = _cli("replay", snaps["plain"], "-k", "tile_sum", "--profile", "timeline", "--out", gpu_json,
             env=snaps["double"]["env"])
    assert g.returncode == 0, g.stdout + g.stderr
    c = _cli("compare", gpu_json, sim_json)
    assert c.returncode == 0, c.stdout + c.stderr              # different devices: no regression judged
    assert "silicon vs simulator" in c.stdout and "tile_sum" in c.stdout and "SIDE BY SIDE:" in c.stdout


def test_no_simulator_build_is_one_line(tmp_path, snaps):
    env = {k: v for k, v in os.environ.items() if k != "CUDASNAP_GPGPUSIM"}
    cp = _cli("replay", snaps["plain"], "--sim", "gpgpu-sim", env=env)
    assert cp.returncode == 2
    assert cp.stderr.strip() == ("cudasnap: error: --sim gpgpu-sim: where is the GPGPU-Sim build? give --sim-path DIR "
                                 "or set CUDASNAP_GPGPUSIM=DIR (a directory holding lib/libcudart.so and configs/)")
    bad = _cli("replay", snaps["plain"], "--sim", "gpgpu-sim:SM99_NONE", "--sim-path", SIM)
    assert bad.returncode == 2 and "no config SM99_NONE" in bad.stderr and "SM86_RTX3070" in bad.stderr


def test_ptx_the_simulator_cannot_run_is_refused_by_name(snaps):
    """A kernel whose PTX holds cp.async (a parse error in the simulator) is refused before the run."""
    cp = _sim(snaps["plain"], "--replace", f"add_one={DATA / 'cp_async_add_one.ptx'}")
    assert cp.returncode == 2 and cp.stdout == ""
    assert cp.stderr.strip().splitlines() == [
        "cudasnap: error: kernel add_one uses cp.async (the simulator cannot parse it); the simulator cannot run it"]


def test_ptx_the_simulator_fails_to_parse_is_named(snaps, tmp_path):
    """PTX that no check foresaw and the simulator's parser rejects (it then crashes): exit 2,
    one line naming the function, the line and what to do, never a bare crash."""
    good = (DATA / "wrong_add_one.ptx").read_text()
    bad = tmp_path / "bad.ptx"
    bad.write_text(re.sub(r"^(\s*)ret;", r"\1bogus.op.u32 %r1, %r1;\n\1ret;", good, count=1, flags=re.M))
    cp = _sim(snaps["plain"], "--replace", f"add_one={bad}")
    assert cp.returncode == 2, cp.stdout + cp.stderr
    err = cp.stderr.strip().splitlines()
    assert len(err) == 1 and "its PTX parser rejects line" in err[0] and "of add_one ('bogus.op.u32" in err[0], err
    assert "the simulator cannot run it" in err[0] and "--replace KERNEL=FILE.ptx" in err[0]


@pytest.mark.parametrize("mode", ["functional", "performance"])
def test_a_closed_stdout_keeps_the_simulated_verdict(snaps, mode):
    """`replay --sim ... | head -1`: the reader going away changes no exit code (0 verified, 1 a
    mismatch); the simulator's worker writes its report through a pipe-safe stream too."""
    for extra, want in (((), 0), (("--replace", f"add_one={DATA / 'wrong_add_one.ptx'}"), 1)):
        p = subprocess.Popen([sys.executable, "-m", "cudasnap", "replay", str(snaps["plain"]), "--sim", "gpgpu-sim",
                              "--sim-path", SIM, "--sim-mode", mode, *extra],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        p.stdout.read(1)
        p.stdout.close()                     # as head does after its first line
        err = p.stderr.read().decode()
        assert p.wait(timeout=300) == want, (mode, extra, err)
        assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_ptx_helpers():
    from cudasnap.replay.sim import ptx
    text = (DATA / "kernels.ptx").read_text()
    ents = ptx.entries(text)
    assert ents["saxpy"] == [(0, 4), (8, 8), (16, 8), (24, 4)] and ents["histo"] == [(0, 8), (8, 8), (16, 4), (20, 4)]
    assert ptx.constructs(ptx.bodies(text)["tile_sum"]) == []
    merged = ptx.merge([text, (DATA / "cp_async_add_one.ptx").read_text()])
    assert merged.startswith(".version 9.0\n.target sm_80\n.address_size 64\n") and merged.count(".target") == 1
    assert ptx.constructs("shfl.sync.bfly.b32 %r1, %r2, 1, 31, -1;") == [
        ("shfl.sync (the simulator gives wrong results for some uses)", False)]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("key,verdict", [("plain", "OK: 6 device-to-host results verified"), ("corrupt", "MISMATCH: call #")])
def test_export_for_the_simulator_builds_runs_and_verifies(snaps, key, verdict):
    """export --sim: a standalone program (replay.c, the adapter, the merged PTX, data/) that a
    simulator team builds against its GPGPU-Sim and runs; a tampered recording is a mismatch."""
    out = snaps["tmp"] / f"export_{key}"
    ex = _cli("export", snaps[key], "-o", out, "--sim")
    assert ex.returncode == 0, ex.stdout + ex.stderr
    assert "7 launches, 6 D2H results to verify" in ex.stdout
    build = subprocess.run(["make", "-s", "-C", str(out), f"SIM={SIM}"], capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stdout + build.stderr
    run = subprocess.run(["make", "-s", "-C", str(out), "run", f"SIM={SIM}"], capture_output=True, text=True, timeout=300)
    assert verdict in run.stderr, run.stdout + run.stderr
    assert (run.returncode == 0) == (key == "plain")


def test_export_for_the_simulator_refuses_sass_only(tmp_path):
    snap = tmp_path / "sass.cusnap"
    from synth import Synth
    s = Synth(snap)
    s.call("cuInit", {"Flags": 0})
    s.call("cuModuleLoadData", {"module": 0x222, "image": 1}, x={"image": s.blob(_fatbin_sass_only())})
    s.call("cuModuleGetFunction", {"hfunc": 0x333, "hmod": 0x222, "name": "gemm_sass"})
    s.fn(0x333, "gemm_sass", 0x222, [[0, 8]])
    s.launch(0x333, struct.pack("<Q", 0))
    s.close()
    cp = _cli("export", snap, "-o", tmp_path / "out", "--sim")
    assert cp.returncode == 2 and "kernel gemm_sass" in cp.stderr and "has no PTX" in cp.stderr
    assert not (tmp_path / "out").exists()


def test_extract_then_simulate(snaps):
    """The way in for big programs: extract one launch, replay it on the simulator (--json)."""
    x = snaps["tmp"] / "histo.x.cusnap"
    ex = _cli("extract", snaps["plain"], "--kernel", "histo", "-o", x, "-f", env=snaps["double"]["env"])
    assert ex.returncode == 0, ex.stdout + ex.stderr
    cp = _sim(x, "--json")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    res = json.loads(cp.stdout)
    assert res["exit_code"] == 0 and res["d2h_verified"] >= 1 and res["launches"] == 1 and not res["mismatches"]
