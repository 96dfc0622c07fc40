"""replay --sim: snapshots taken on the test double, of a program whose module is PTX (committed
in tests/data/sim with the .cu it came from), replayed on GPGPU-Sim and verified against the
recorded results. Skipped unless $CUDASNAP_GPGPUSIM names a simulator build (tests/simbuild.py)."""
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
from simbuild import SIM, needs_sim

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "sim"


pytestmark = needs_sim


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
    assert prof["run"]["gpu"]["name"] == "GPGPU-Sim SM90_H100 (simulated)"     # the double is an sm_90 GPU
    assert prof["run"]["simulated"]["core_clock_mhz"] == 1132.0
    assert prof["run"]["simulated"]["config_why"] == "closest to the captured cudasnap test double (sm_90)"
    assert "tile_sum:" in cp.stdout and "cycles" in cp.stdout
    gpu_json = tmp / "gpu.json"
    g = _cli("replay", snaps["plain"], "-k", "tile_sum", "--profile", "timeline", "--out", gpu_json,
             env=snaps["double"]["env"])
    assert g.returncode == 0, g.stdout + g.stderr
    c = _cli("compare", gpu_json, sim_json)
    assert c.returncode == 0, c.stdout + c.stderr              # different devices: no regression judged
    assert "silicon vs simulator" in c.stdout and "tile_sum" in c.stdout and "SIDE BY SIDE:" in c.stdout
    # the double reports a 1980 MHz clock: the cycles become time at it
    assert "simulated time at the silicon's 1980 MHz" in c.stdout
    cyc = row["cycles"]
    assert re.search(rf"tile_sum +[0-9.]+ us +{cyc} +{cyc / 1980:.2f} us", c.stdout), c.stdout
    assert "correlation: none (1 kernel(s) both measured and simulated: a correlation needs 3 or more)" in c.stdout


def test_correlation_across_kernels(snaps, tmp_path):
    """compare of a GPU profile with a simulated one over several kernels: per kernel measured
    time, cycles, time at the silicon's clock and error; Pearson and Spearman; the HTML report
    plots it. Cycles here are the measured times at half the clock (every error -50%), and one
    kernel is left unsimulated."""
    gpu_json = snaps["tmp"] / "gpu.json"
    sim_json = snaps["tmp"] / "sim.json"
    if not gpu_json.exists() or not sim_json.exists():
        pytest.skip("needs test_performance_profile_compares_with_silicon's profiles")
    gpu = json.loads(gpu_json.read_text())
    sim = json.loads(sim_json.read_text())
    times = [("fill", 10.0), ("add_one", 20.0), ("saxpy", 40.0), ("tile_sum", 35.0), ("histo", 100.0)]
    gpu["launches"] = [dict(gpu["launches"][0], name=n, time_us=t, index=i) for i, (n, t) in enumerate(times)]
    sim["launches"] = [dict(sim["launches"][0], name=n, cycles=int(t * 990), index=i)
                       for i, (n, t) in enumerate(times[:4])]
    for prof, path in ((gpu, tmp_path / "g.json"), (sim, tmp_path / "s.json")):
        from cudasnap.replay.profile.report import aggregate
        prof["kernels"] = aggregate(prof["launches"])
        path.write_text(json.dumps(prof))
    html = tmp_path / "r.html"
    c = _cli("compare", tmp_path / "g.json", tmp_path / "s.json", "--html", html)
    assert c.returncode == 0, c.stdout + c.stderr
    assert re.search(r"correlation over 4 kernels: Pearson 1\.000( \(p [^)]*\))?, Spearman 1\.000( \(p [^)]*\))?; "
                     r"mean error -50\.0%, mean absolute error 50\.0%", c.stdout), c.stdout
    assert re.search(r"saxpy +40\.00 us +39600 +20\.00 us +-50%", c.stdout), c.stdout
    assert "measured but not simulated: 1 kernel(s) (histo)" in c.stdout
    page = html.read_text()
    assert "Silicon vs simulator (GPGPU-Sim SM90_H100)" in page and "simulated vs measured time per kernel" in page
    j = _cli("compare", tmp_path / "g.json", tmp_path / "s.json", "--json")
    corr = json.loads(j.stdout)["correlation"]
    assert corr["n"] == 4 and corr["clock_mhz"] == 1980 and abs(corr["pearson"] - 1) < 1e-9


def test_model_of_the_captured_gpu():
    from cudasnap.replay.sim import pick_config
    have = ["SM75_RTX2060", "SM7_QV100", "SM86_RTX3070", "SM90_H100"]
    assert pick_config(have, {"name": "NVIDIA H100 80GB HBM3", "cc": [9, 0]}) == (
        "SM90_H100", "closest to the captured NVIDIA H100 80GB HBM3 (sm_90)")
    assert pick_config(have, {"name": "NVIDIA H200", "cc": [9, 0]})[0] == "SM90_H100"
    assert pick_config(have, {"name": "NVIDIA GeForce RTX 3070", "cc": [8, 6]})[0] == "SM86_RTX3070"
    assert pick_config(have, {"name": "NVIDIA A100-SXM4-80GB", "cc": [8, 0]}) == (
        "SM75_RTX2060", "closest to the captured NVIDIA A100-SXM4-80GB (sm_80): the newest model below it")
    assert pick_config(have, None) == ("SM86_RTX3070", "the snapshot does not say which GPU it was captured on")


def test_the_chosen_model_is_named(snaps):
    cp = _sim(snaps["plain"], "-k", "fill")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert cp.stdout.startswith("simulator: GPGPU-Sim SM90_H100 (closest to the captured cudasnap test double "
                                "(sm_90)), functional mode\n"), cp.stdout
    asked = _cli("replay", snaps["plain"], "-k", "fill", "--sim", "gpgpu-sim:SM7_QV100", "--sim-path", SIM)
    assert asked.returncode == 0 and "simulator: GPGPU-Sim SM7_QV100 (asked for)" in asked.stdout, asked.stdout


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


def test_memory_model_qualifiers_run_as_volatile_accesses_and_fences(snaps, tmp_path):
    """Relaxed/acquire/release loads and stores, fence.sc/.acq_rel and griddepcontrol, which the
    simulator's parser rejects, run as volatile accesses and membar (the same or stronger order);
    an atomic with a qualifier is refused before the run, by name."""
    ptx = DATA / "ordering_add_one.ptx"
    cp = _sim(snaps["plain"], "--replace", f"add_one={ptx}")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "OK: every recorded D2H result reproduced" in cp.stdout, cp.stdout
    bad = tmp_path / "atom.ptx"
    bad.write_text(re.sub(r"^(\s*)ret;", r"\1atom.relaxed.gpu.global.add.u32 %r6, [%rd4], 0;\n\1ret;",
                          ptx.read_text(), count=1, flags=re.M))
    cp = _sim(snaps["plain"], "--replace", f"add_one={bad}")
    assert cp.returncode == 2 and cp.stdout == "", cp.stdout + cp.stderr
    assert cp.stderr.strip().splitlines() == [
        "cudasnap: error: kernel add_one uses memory-model qualifiers on atomics, vectors or other accesses "
        "(the simulator cannot parse them; only scalar ld/st and fence are rewritten); the simulator cannot run it"]


def test_a_fence_some_warps_run_leaves_the_barriers_paired(snaps):
    """Thread 0 of each CTA runs a membar before the CTA's barrier, as cuSOLVER's getrf_pivot does
    when it publishes a pivot: the simulator's functional mode took it for a barrier arrival, so a
    later bar.sync let warps read shared memory another warp had not written yet (a wrong pivot on
    an H100 capture); functional mode runs without the fence (its memory is sequentially
    consistent), performance mode keeps it."""
    from cudasnap.replay.sim import ptx
    cp = _sim(snaps["plain"], "--replace", f"add_one={DATA / 'membar_add_one.ptx'}")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "OK: every recorded D2H result reproduced" in cp.stdout, cp.stdout
    text = "\tmembar.gl;\n\t@%p1 membar.cta;\n\tmembar.sys ;\n\tbar.sync 0;\n"
    assert ptx.for_mode(text, "functional") == "\t\n\t\n\t\n\tbar.sync 0;\n"
    assert ptx.for_mode(text, "performance") == text


def test_kernel_not_run_that_the_simulator_refuses_stays_out(snaps, tmp_path):
    """A module's kernel that is not launched and holds what the parser rejects (an atomic with a
    memory-model qualifier) is left out of the simulator's PTX, so the kernels that run still do."""
    both = tmp_path / "both.ptx"
    ptx = (DATA / "ordering_add_one.ptx").read_text()
    other = re.sub(r"\badd_one\b", "idle_add", ptx.split(".address_size 64", 1)[1])
    other = re.sub(r"^(\s*)ret;", r"\1atom.relaxed.gpu.global.add.u32 %r6, [%rd4], 0;\n\1ret;", other, flags=re.M)
    both.write_text(ptx + other)
    cp = _sim(snaps["plain"], "--replace", f"add_one={both}")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "OK: every recorded D2H result reproduced" in cp.stdout, cp.stdout


def test_literals_the_lexer_misreads_are_rewritten(snaps):
    """A 64-bit instruction's immediate outside int32 (its upper half lost), the U suffix (an
    abort) and immediate elements of a stored vector (a parse error) run as the GPU reads them."""
    cp = _sim(snaps["plain"], "--replace", f"add_one={DATA / 'imm_add_one.ptx'}")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "OK: every recorded D2H result reproduced" in cp.stdout, cp.stdout


@pytest.mark.parametrize("line", ["bogus.op.u32 %r1, %r1;", "mov.u32 %r1, no_such_symbol;"])
def test_ptx_the_simulator_fails_to_parse_is_named(snaps, tmp_path, line):
    """PTX that no check foresaw and the simulator's parser rejects, as a syntax error or as an
    operand without a declaration (it then crashes): exit 2, one line naming the function, the
    line and what to do, never a bare crash."""
    good = (DATA / "wrong_add_one.ptx").read_text()
    bad = tmp_path / "bad.ptx"
    bad.write_text(re.sub(r"^(\s*)ret;", r"\1" + line + r"\n\1ret;", good, count=1, flags=re.M))
    cp = _sim(snaps["plain"], "--replace", f"add_one={bad}")
    assert cp.returncode == 2, cp.stdout + cp.stderr
    err = cp.stderr.strip().splitlines()
    assert len(err) == 1 and "its PTX parser rejects line" in err[0] and f"of add_one ('{line.split(',')[0]}" in err[0], err
    assert "the simulator cannot run it" in err[0] and "--replace KERNEL=FILE.ptx" in err[0]


@pytest.mark.parametrize("mode", ["functional", "performance"])
def test_a_closed_stdout_keeps_the_simulated_verdict(snaps, mode):
    """`replay --sim ... | head -1`: the reader going away changes no exit code (0 verified, 1 a
    mismatch); the simulator's worker writes its report through a pipe-safe stream too."""
    # performance mode in the smallest config (30 SMs; the H100's 132, each ticked every cycle,
    # take 6x the time): the pipe is what is checked here
    sim = "gpgpu-sim:SM75_RTX2060" if mode == "performance" else "gpgpu-sim"
    for extra, want in (((), 0), (("--replace", f"add_one={DATA / 'wrong_add_one.ptx'}"), 1)):
        p = subprocess.Popen([sys.executable, "-m", "cudasnap", "replay", str(snaps["plain"]), "--sim", sim,
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
    assert (out / "replay.functional.ptx").read_text() == (out / "replay.ptx").read_text()     # the mode it ran


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


@pytest.fixture(scope="module")
def hostmem(snaps):
    """hostfree on the double (its first add_one reads and writes mapped pinned host memory
    through the pointer cuMemHostGetDevicePointer gave), captured with the mapped memory's
    contents, and an extract of that launch."""
    d, tmp = snaps["double"], snaps["tmp"]
    snap, x = tmp / "hostfree.cusnap", tmp / "hostfree.x.cusnap"
    cp = _cli("capture", "-o", snap, "--ring-mb", "16", "--", d["progs"]["hostfree"],
              env=dict(d["env"], CUDASNAP_MAPPED_MEMORY="1"), timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    first = min(r["s"] for r in _records(snap) if r.get("f") == "cuLaunchKernel")
    ex = _cli("extract", snap, "--launch", first, "-o", x, "-f", env=d["env"])
    assert ex.returncode == 0, ex.stdout + ex.stderr
    return snap, x


def _records(snap):
    from cudasnap.formats import SnapshotReader
    return list(SnapshotReader(str(snap)).records(("c",)))


def test_mapped_host_memory_runs_on_the_simulator(hostmem):
    """The kernel gets the simulator's copy of the mapped range; the host memory's final bytes
    (checked at its free) and the later D2H verify; a kernel computing something else is a
    mismatch, so the data does go through the simulated kernel; the extract of that launch runs."""
    snap, x = hostmem
    ptx = DATA / "kernels.ptx"
    cp = _sim(snap, "--replace", f"add_one={ptx}")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert re.search(r"D2H verified\s+2 \(", cp.stdout) and "not implement" not in cp.stderr
    bad = _sim(snap, "--replace", f"add_one={DATA / 'wrong_add_one.ptx'}")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert re.search(r"call #\d+ cuMemFreeHost", bad.stdout), bad.stdout
    cx = _sim(x, "--replace", f"add_one={ptx}")
    assert cx.returncode == 0, cx.stdout + cx.stderr
    assert "cuMemHostGetDevicePointer" not in cx.stdout + cx.stderr


def test_every_gap_is_listed_in_one_refusal(snaps):
    """graphnodes builds graphs node by node (the adapter runs captured graphs only): one refusal
    lists each call the adapter lacks (name, count, first call), and nothing is simulated."""
    d = snaps["double"]
    snap = snaps["tmp"] / "graphnodes.cusnap"
    cp = _cli("capture", "-o", snap, "--ring-mb", "16", "--", d["progs"]["graphnodes"], env=d["env"], timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    r = _sim(snap)
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    head, *items = r.stderr.strip().splitlines()
    m = re.match(r"cudasnap: error: the simulator cannot run this snapshot: (\d+) gaps \(nothing was simulated\):$", head)
    assert m and int(m.group(1)) == len(items) >= 5, r.stderr
    text = "\n".join(items)
    for f in ("cuGraphCreate", "cuGraphAddKernelNode_v2", "cuGraphAddNode_v2"):
        assert re.search(rf"^  - {f} \(\d+ calls?, first #\d+\): the simulator adapter does not implement it$",
                         text, re.M), text
    assert re.search(r"^  - cuGraphAddNode_v2 \(4 calls, first #\d+\)", text, re.M), text


def test_captured_graph_runs_as_its_work_in_order(snaps):
    """simgraph captures fill, add_one and a device copy into a graph and launches it twice: the
    simulator runs the graph's work in capture order at each launch, and the results verify
    (add_one applied twice)."""
    d = snaps["double"]
    snap = snaps["tmp"] / "simgraph.cusnap"
    cp = _cli("capture", "-o", snap, "--ring-mb", "16", "--", d["progs"]["simgraph"], DATA / "kernels.ptx",
              env=d["env"], timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    r = _sim(snap)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"D2H verified\s+2 \(", r.stdout) and "OK: every recorded D2H result reproduced" in r.stdout
    bad = _sim(snap, "--replace", f"add_one={DATA / 'wrong_add_one.ptx'}")
    assert bad.returncode == 1, bad.stdout + bad.stderr

def _triton_like_cubin(text: bytes) -> bytes:
    """An sm_90 CUDA ELF whose one PROGBITS section holds the double's image (the double runs
    the kernels it names), as Triton's cubin holds SASS."""
    body = text + b"\0" * (8 - len(text) % 8)
    shoff = 64 + len(body)
    ident = b"\x7fELF\x02\x01\x01\x33\x07" + bytes(7)
    head = ident + struct.pack("<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, shoff, 0x005A005A, 64, 0, 0, 64, 2, 0)
    sec = struct.pack("<IIQQQQIIQQ", 0, 1, 0, 0, 64, len(text), 0, 0, 1, 0)
    return head + body + bytes(64) + sec


@pytest.fixture(scope="module")
def jit(snaps):
    """simprog loading a cubin that a Triton-like cache holds with its PTX (cache/<hash>/K.cubin
    and K.ptx), captured with TRITON_CACHE_DIR naming the cache; the cubin holds no PTX."""
    d, tmp = snaps["double"], snaps["tmp"]
    names = b"".join(b"kernel %s\n" % k for k in (b"fill", b"add_one", b"saxpy", b"tile_sum", b"histo", b"chase"))
    cubin = _triton_like_cubin(b"CUDADOUBLE\n" + names)
    entry = tmp / "cache" / "Q3M2XKJ7VLBTV4ASGBMHN5ZQ"
    entry.mkdir(parents=True)
    (entry / "fill.cubin").write_bytes(cubin)
    (entry / "fill.ptx").write_bytes((DATA / "kernels.ptx").read_bytes())
    (tmp / "cache" / "other").mkdir()
    (tmp / "cache" / "other" / "fill.cubin").write_bytes(cubin[:-1] + b"\1")    # same size, other bytes
    snap = tmp / "jit.cusnap"
    cp = _cli("capture", "-o", snap, "--ring-mb", "16", "--", d["progs"]["simprog"], entry / "fill.cubin",
              env=dict(d["env"], TRITON_CACHE_DIR=str(tmp / "cache")), timeout=120)
    assert cp.returncode == 0 and snap.exists(), cp.stdout + cp.stderr
    assert "PTX kept for 1 module(s) from the triton cache" in cp.stdout + cp.stderr, cp.stdout + cp.stderr
    return snap, entry


def test_jit_cubin_is_captured_with_its_ptx_and_simulated(jit):
    """The PTX found beside the loaded cubin in the cache (matched by the cubin's bytes) is
    recorded with the module; info says where it came from; the simulator runs it and every
    result verifies."""
    snap, entry = jit
    from cudasnap.formats import SnapshotReader
    from cudasnap.formats.jitptx import kept_ptx
    kept = kept_ptx(SnapshotReader(str(snap)))
    (got,) = kept.values()
    assert got["from"] == "triton cache" and got["path"] == str(entry / "fill.cubin")
    assert got["ptx"] == (DATA / "kernels.ptx").read_bytes()
    info = _cli("info", snap)
    assert info.returncode == 0, info.stderr
    assert re.search(r"cubin .*sm_90 .*triton cache", info.stdout), info.stdout
    assert re.search(r"tile_sum .*\b1\b.*triton cache", info.stdout), info.stdout
    cp = _sim(snap)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert re.search(r"D2H verified\s+6 \(", cp.stdout) and "OK: every recorded D2H result reproduced" in cp.stdout


def test_jit_ptx_goes_with_an_extract(jit, snaps):
    snap, _entry = jit
    x = snaps["tmp"] / "jit.x.cusnap"
    ex = _cli("extract", snap, "--kernel", "tile_sum", "-o", x, "-f", env=snaps["double"]["env"])
    assert ex.returncode == 0, ex.stdout + ex.stderr
    cp = _sim(x)
    assert cp.returncode == 0 and re.search(r"D2H verified\s+[1-9]\d* \(", cp.stdout), cp.stdout + cp.stderr
    assert "OK: every recorded D2H result reproduced" in cp.stdout


def test_triton_style_ptx_runs(snaps):
    """PTX as Triton (LLVM) writes it: `.param .u64 .ptr .global .align 1` parameters, .reqntid,
    `@%p ld.global.L1::evict_last.b32 { %r2 }, [ %rd1 + 0 ]`: the simulator's parser takes it once
    the hints are dropped, and the kernel's results verify."""
    from cudasnap.replay.sim import ptx
    text = (DATA / "triton_add_one.ptx").read_text()
    assert ptx.entries(text)["add_one"] == [(0, 8), (8, 4)]
    fixed = ptx.for_sim(text)
    assert ".reqntid 256" not in fixed and "L1::evict_last" not in fixed and "{ %r2 }" not in fixed
    assert "@%p1 ld.global.b32 %r2, [ %rd1 + 0 ];" in fixed
    cp = _sim(snaps["plain"], "--replace", f"add_one={DATA / 'triton_add_one.ptx'}")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "OK: every recorded D2H result reproduced" in cp.stdout


def test_warp_shuffles_run_as_the_gpu_runs_them(snaps):
    """The simulator's own shfl leaves some lanes' destinations unwritten; every shuffle form
    (bfly, down with its in-range predicate, up, idx of a register lane) runs as a shared-memory
    exchange instead, and an add_one that sends each value around the warp and back verifies."""
    cp = _sim(snaps["plain"], "--replace", f"add_one={DATA / 'shfl_add_one.ptx'}")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "OK: every recorded D2H result reproduced" in cp.stdout, cp.stdout
    assert "uses warp shuffles, run as shared-memory exchanges" in cp.stderr


def test_ldmatrix_runs_as_shared_memory_loads(snaps):
    """Non-transposed ldmatrix (.x1, .x4), which the simulator's parser rejects, runs as loads
    of each lane's row address and word, in shared memory past the kernel's own dynamic shared
    memory (which the simulator places where its static arrays start)."""
    cp = _sim(snaps["plain"], "--replace", f"add_one={DATA / 'ldmatrix_add_one.ptx'}")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "OK: every recorded D2H result reproduced" in cp.stdout, cp.stdout
    assert "uses ldmatrix, run as shared-memory loads" in cp.stderr


def test_bounded_performance_mode(snaps, tmp_path):
    """--sim-max-ctas 4: tile_sum's 16 CTAs are timed on samples of 2 and 4 and extrapolated with
    the error stated (here the samples fill less than the GPU: the bracket is wide and holds the
    whole launch's cycles); the verdict comes from a functional pass over every CTA."""
    out = tmp_path / "b.json"
    cp = _sim(snaps["plain"], "-k", "tile_sum", "--sim-mode", "performance", "--sim-max-ctas", "4", "--out", out,
              "--progress")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "launches over 4 CTAs timed on samples" in cp.stdout and re.search(r"D2H verified\s+1 \(", cp.stdout)
    assert "divergence" not in cp.stdout + cp.stderr                      # the samples' partial results
    assert re.search(r"^cudasnap: simulated 1/1 kernels \(tile_sum", cp.stderr, re.M), cp.stderr
    (row,) = json.loads(out.read_text())["launches"]
    b = row["bounded"]
    assert b["ctas"] == 16 and b["sampled_ctas"] == [2, 4] and row["cycles"] == b["cycles"]
    assert b["linear"] <= b["cycles"] <= b["scaled"] and b["error_cycles"] == round((b["scaled"] - b["linear"]) / 2)
    m = re.search(r"tile_sum: (\d+) cycles +[0-9.]+ us \+- (\d+) \(\+-\d+%\), extrapolated from 2 and 4 of 16 CTAs", cp.stdout)
    assert m and int(m.group(1)) == row["cycles"], cp.stdout
    # the whole launch as test_performance_profile_compares_with_silicon simulated it: inside the bracket
    prof = snaps["tmp"] / "sim.json"
    if prof.exists():
        whole = json.loads(prof.read_text())["launches"][0]["cycles"]
        assert abs(whole - b["cycles"]) <= b["error_cycles"] + 1, (whole, b)
    # the verdict pass was bounded too: tile_sum's first 4 CTAs wrote 4 of its 16 ints, whose top
    # bytes are 0 as the memory was before (a store of an unchanged byte is invisible: not judged)
    assert "sample: EXACT on 4 of 16 CTAs of tile_sum (25.0% of the launch; 12 of 64 result bytes checked" in cp.stdout
    bad = _sim(snaps["plain"], "-k", "tile_sum", "--sim-max-ctas", "1")
    assert bad.returncode == 2 and bad.stderr.strip() == "cudasnap: error: --sim-max-ctas 1: give 2 or more"


@pytest.fixture(scope="module")
def planted(snaps):
    """simprog captured with a wrong byte planted in fill's result (4,096 u32 by 16 CTAs of 256
    threads): at byte 100 (written by CTA 0) and at byte 10,000 (CTA 9)."""
    d = snaps["double"]
    out = {}
    for key, off in (("inside", 100), ("outside", 10000)):
        snap = snaps["tmp"] / f"planted_{key}.cusnap"
        env = dict(d["env"], CUDA_DOUBLE_CORRUPT=f"fill:1@{off}")
        cp = _cli("capture", "-o", snap, "--ring-mb", "16", "--", d["progs"]["simprog"], DATA / "kernels.ptx",
                  env=env, timeout=120)
        assert snap.exists(), cp.stdout + cp.stderr
        out[key] = snap
    return out


def test_bounded_functional_verdict(snaps, planted):
    """--sim-max-ctas 4 in functional mode: fill's first 4 of 16 CTAs run and only the bytes they
    changed are judged; a wrong byte they wrote is DIFFERENT (exit 1), one beyond them
    is not judged, and the line says how much was not."""
    # 0x00C0FFEE over memory that held zeros: each word's top byte is unchanged, so invisible (not judged)
    line = "sample: {} on 4 of 16 CTAs of fill (25.0% of the launch; 3,072 of 16,384 result bytes checked, 13,312 not judged)"
    cp = _sim(snaps["plain"], "-k", "fill", "--sim-max-ctas", "4", "--progress")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert cp.stderr.startswith("cudasnap: simulating the first 4 of 16 CTAs of fill\ncudasnap: simulated 1/1 kernels"), cp.stderr
    assert "judged on their first 4 CTAs" in cp.stdout and line.format("EXACT") in cp.stdout, cp.stdout
    # the plain OK line's notes stay (fill's selection leaves 5 results uncompared); only judged bytes counted
    assert ("OK on a sample: 3,072 of 16,384 result bytes checked, on 4 of 16 CTAs; 5 D2H result(s) not compared: "
            "they depend on work the selection left out (exit 0)") in cp.stdout
    assert re.search(r"D2H verified\s+1 \(3\.0 KiB\)", cp.stdout), cp.stdout
    assert "every recorded D2H result reproduced" not in cp.stdout
    cp = _sim(planted["inside"], "-k", "fill", "--sim-max-ctas", "4")
    assert cp.returncode == 1, cp.stdout + cp.stderr
    assert line.format("DIFFERENT") in cp.stdout
    assert re.search(r"call #\d+ cuMemcpyDtoH_v2: first divergence at byte offset 100 .*1 bytes differ of 16384", cp.stdout)
    assert "FAILED: verification mismatch (exit 1)" in cp.stdout
    cp = _sim(planted["outside"], "-k", "fill", "--sim-max-ctas", "4")
    assert cp.returncode == 0 and line.format("EXACT") in cp.stdout, cp.stdout + cp.stderr
    doc = json.loads(_sim(planted["outside"], "-k", "fill", "--sim-max-ctas", "4", "--json").stdout)
    assert doc["exit_code"] == 0 and doc["mismatches"] == []
    assert doc["sample"] == {"kernel": "fill", "ctas": 4, "of": 16, "checked": 3072, "read": 16384, "unjudged": 0,
                             "later": 0, "launches": 1}
    # the whole program: add_one, saxpy... run after the sampled fill and may read what its other
    # CTAs write, so nothing read back at the end is judged: never a pass; histo runs whole
    cp = _sim(snaps["plain"], "--sim-max-ctas", "4")
    assert cp.returncode == 2, cp.stdout + cp.stderr
    assert "nothing was judged; raise --sim-max-ctas" in cp.stdout and "later launch(es)" in cp.stdout
    assert "histo (16 CTAs) ran whole, not on a sample: its CTAs combine results through global atomics" in cp.stderr


def test_bounded_verdict_judging_nothing_is_never_a_pass(snaps, tmp_path):
    """A sampled launch whose result is never read back (--calls fill: the copies left out) and a
    sample whose memory is past the read budget (CUDASNAP_SIM_SAMPLE_MB=0) judge nothing: exit 2,
    the sample line says NOT JUDGED. With --replace the notes name the kernel, not its merged name."""
    cp = _sim(snaps["plain"], "--calls", "fill", "--sim-max-ctas", "4")
    assert cp.returncode == 2, cp.stdout + cp.stderr
    assert ("sample: NOT JUDGED on 4 of 16 CTAs of fill (25.0% of the launch; 0 of 0 result bytes checked, "
            "0 not judged)") in cp.stdout, cp.stdout
    assert "no result was read back after the 4 sampled CTAs of fill ran: nothing was judged" in cp.stdout
    assert "OK" not in cp.stdout.splitlines()[-1]
    doc = json.loads(_sim(snaps["plain"], "--calls", "fill", "--sim-max-ctas", "4", "--json").stdout)
    assert doc["exit_code"] == 2 and doc["sample"]["checked"] == 0 and doc["sample"]["kernel"] == "fill"
    env = dict(os.environ, CUDASNAP_SIM_SAMPLE_MB="0")
    cp = _cli("replay", snaps["plain"], "--sim", "gpgpu-sim", "--sim-path", SIM, "-k", "fill", "--sim-max-ctas", "4",
              env=env)
    assert cp.returncode == 2, cp.stdout + cp.stderr
    assert re.search(r"sample: NOT JUDGED on 4 of 16 CTAs of fill \(25\.0% of the launch; 0 of 16,384 result bytes "
                     r"checked, 16,384 not judged; 1 D2H result\(s\) wholly unjudged; [0-9,]+ bytes of allocations past "
                     r"the memory budget not read", cp.stdout), cp.stdout
    cp = _sim(snaps["plain"], "-k", "fill", "--sim-max-ctas", "4", "--replace", f"fill={DATA / 'kernels.ptx'}",
              "--progress")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "cudasnap: simulating the first 4 of 16 CTAs of fill\n" in cp.stderr and "__cs" not in cp.stdout + cp.stderr
    assert "sample: EXACT on 4 of 16 CTAs of fill (" in cp.stdout


def test_bounded_verdict_leaves_strided_reads_unjudged():
    """The sample's mask maps contiguous bytes: the rows of a 2-D copy read back after a sampled
    launch are wholly unjudged; a contiguous read is judged on the bytes the sample wrote only, and
    only those count as verified bytes."""
    import types
    import numpy as np
    from cudasnap.replay.context import ReplayContext
    from cudasnap.replay.options import ReplayResult

    class Cu:
        sample = {"kernel": "k", "ctas": 4, "of": 16, "later": 0, "launches": 1}

        def sample_mask(self, addr, n):
            mask = np.zeros(n, dtype=bool)
            if addr is not None:
                mask[:3] = True
            return mask

    ctx = types.SimpleNamespace(hooks=types.SimpleNamespace(stale=lambda src: False), space=None, cu=Cu(),
                                tr=lambda a: a, res=ReplayResult(), types=None)
    ctx._sampled = lambda *a: ReplayContext._sampled(ctx, *a)
    ReplayContext.verify(ctx, {"s": 1, "f": "cuMemcpy2D_v2"}, b"abcdefgh", b"abcdefgh", 0x1000, strided=True)
    assert ctx.res.sample == {"checked": 0, "read": 8, "unjudged": 1, **Cu.sample} and ctx.res.d2h_verified == 0
    ReplayContext.verify(ctx, {"s": 2, "f": "cuMemcpyDtoH_v2"}, b"abcdefgh", b"abcdXXXX", 0x1000)
    assert ctx.res.sample["checked"] == 3 and ctx.res.d2h_verified == 1 and ctx.res.d2h_bytes == 3


def test_bounded_verdict_rules():
    """What a sample cannot judge: kernels that read their grid size or combine CTAs' results
    through global atomics run whole; only changed bytes count; the line says what was not judged."""
    from cudasnap.replay.sim.bounded import memory_diff, unsampled, verdict_line
    assert "grid size" in unsampled("mov.u32 %r2, %nctaid.x;")
    for atom in ("atom.global.add.u32 %r1, [%rd2], 1;", "red.global.add.f32 [%rd1], %f1;", "atom.add.u32 %r1, [%rd2], 1;"):
        assert "atomics" in unsampled(atom), atom
    assert unsampled("atom.shared.add.u32 %r1, [%r2], 1;\nmov.u32 %r1, %ctaid.x;") is None
    from cudasnap.replay.sim import Plan, _whole
    ptx = (".func bump(.param .b64 p)\n{\n.reg .b64 %rd<2>;\nld.param.u64 %rd1, [p];\n"
           "red.global.add.u32 [%rd1], 1;\nret;\n}\n"
           ".visible .entry calls(.param .u64 a)\n{\n.reg .b64 %rd<2>;\nld.param.u64 %rd1, [a];\n"
           "{\n.param .b64 q;\nst.param.b64 [q], %rd1;\ncall.uni bump, (q);\n}\nret;\n}\n"
           ".visible .entry plain(.param .u64 a)\n{\n.reg .b32 %r<2>;\nmov.u32 %r1, %ctaid.x;\nret;\n}\n")
    assert _whole(Plan(texts=[ptx])) == {"calls": "its CTAs combine results through global atomics"}
    m = memory_diff({0x100: b"\0\0\0\0", 0x200: b"ab"}, {0x100: b"\x01\0\0\x02", 0x200: b"ab"})
    assert list(m) == [0x100] and m[0x100].tolist() == [True, False, False, True]
    s = {"kernel": "k", "ctas": 64, "of": 1056, "checked": 4096, "read": 67584, "unjudged": 1, "later": 2}
    assert verdict_line(s, "EXACT") == ("EXACT on 64 of 1,056 CTAs of k (6.1% of the launch; 4,096 of 67,584 result "
                                        "bytes checked, 63,488 not judged; 1 D2H result(s) wholly unjudged; 2 later "
                                        "launch(es) may read what the unsimulated CTAs write: nothing after them judged)")
    assert verdict_line(dict(s, unread=2048), "NOT JUDGED").endswith(
        "; 2,048 bytes of allocations past the memory budget not read (CUDASNAP_SIM_SAMPLE_MB); 2 later launch(es) "
        "may read what the unsimulated CTAs write: nothing after them judged)")


def test_bounded_estimate():
    from cudasnap.replay.sim.bounded import estimate, fold, sample_grid
    assert sample_grid((100, 1, 1), 8) == ((8, 1, 1), 8)
    assert sample_grid((10, 10, 1), 25) == ((10, 3, 1), 30)
    assert sample_grid((4, 4, 8), 40) == ((4, 4, 3), 48)
    e = estimate(1000, 100, 1000, 200, 2000)          # cycles grow as CTAs: both models agree
    assert e["cycles"] == 10000 and e["error_cycles"] == 0
    runs = fold([("a", 5), ("k", 100), ("k", 200), ("b", 7)], [{"at": 1, "total": 1000, "ctas": [100, 200]}])
    assert [(n, c) for n, c, _e in runs] == [("a", 5), ("k", 1000), ("b", 7)]


def test_launch_attributes_the_model_takes():
    """cuLaunchKernelEx: a one-CTA cluster and hints change nothing the simulator computes (Triton
    sets them); a cooperative launch or a real cluster is refused by name."""
    from cuda.bindings import driver as cu
    from cudasnap.replay.sim.driver import SimDriver
    ids = cu.CUlaunchAttributeID
    c = cu.CUlaunchConfig()
    one = cu.CUlaunchAttribute()
    one.id = ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    one.value.clusterDim.x = one.value.clusterDim.y = one.value.clusterDim.z = 1
    pri = cu.CUlaunchAttribute()
    pri.id = ids.CU_LAUNCH_ATTRIBUTE_PRIORITY
    coop = cu.CUlaunchAttribute()
    coop.id = ids.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
    d = SimDriver.__new__(SimDriver)
    c.attrs, c.numAttrs = [one, pri], 2
    assert d._refused_attr(c) is None
    c.attrs, c.numAttrs = [one, pri, coop], 3
    assert d._refused_attr(c) == "COOPERATIVE"
    one.value.clusterDim.x = 2
    c.attrs, c.numAttrs = [one], 1
    assert d._refused_attr(c) == "CLUSTER_DIMENSION"


@pytest.fixture(scope="module")
def globs(snaps):
    """simglob on the double: a kernel reading a __device__ float (its image's initializer, then
    set through its address) and a __constant__ array set through its address; "sass" also looks
    up a global of a module without PTX; "sinp" runs fast_sin (sin.approx) too, its recorded
    results one ULP off on every third element as a GPU's approximation would leave them."""
    d = snaps["double"]
    out = {}
    for key, args, extra in (("plain", [], {}), ("sass", ["sass"], {}),
                             ("sinp", [DATA / "fast_sin.ptx"], {"CUDA_DOUBLE_PERTURB": "fast_sin:ulp:3"})):
        snap = snaps["tmp"] / f"simglob_{key}.cusnap"
        cp = _cli("capture", "-o", snap, "--ring-mb", "16", "--", d["progs"]["simglob"], DATA / "globals.ptx", *args,
                  env=dict(d["env"], **extra), timeout=120)
        want = r"-0\.7568" if key == "sinp" else r"4\.0000"      # sin(4.0) after fast_sin
        assert cp.returncode == 0 and re.search(rf"^SIMGLOB 1\.7500 {want} -1\.250$", cp.stdout, re.M), cp.stdout + cp.stderr
        out[key] = snap
    return out


def test_module_globals_run_on_the_simulator(globs, snaps):
    """cuModuleGetGlobal gives the simulator's address of each variable (the PTX loader's, its
    initializer in place): the kernel reads the initializer, then the values the program wrote
    through the addresses, and a D2H of the constant array verifies; a kernel that ignores the
    globals is a mismatch; export --sim carries them too."""
    cp = _sim(globs["plain"])
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "D2H results: 3 EXACT, 0 CLOSE, 0 DIFFERENT" in cp.stdout and "not implement" not in cp.stderr
    bad = snaps["tmp"] / "glob_bad.ptx"
    bad.write_text((DATA / "globals.ptx").read_text().replace("ld.const.f32 \t%f3, [%rd7];", "mov.f32 \t%f3, 0f00000000;"))
    r = _sim(globs["plain"], "--replace", f"glob_axpb={bad}")
    assert r.returncode == 1 and re.search(r"DIFFERENT: call #\d+ cuMemcpyDtoH", r.stdout), r.stdout + r.stderr
    assert "math library" not in r.stdout           # no approximate instruction in this kernel
    # performance mode: the cycles of the two launches, not of the adapter's lookup of the addresses
    prof = snaps["tmp"] / "glob_perf.json"
    pf = _sim(globs["plain"], "--sim-mode", "performance", "--out", prof, "-f")
    assert pf.returncode == 0, pf.stdout + pf.stderr
    assert [r["name"] for r in json.loads(prof.read_text())["launches"]] == ["glob_axpb", "glob_axpb"]
    # the second launch alone: the extract starts from the globals' contents at that launch
    x = snaps["tmp"] / "glob2.x.cusnap"
    ex = _cli("extract", globs["plain"], "--kernel", "glob_axpb#2", "-o", x, "-f", env=snaps["double"]["env"])
    assert ex.returncode == 0, ex.stdout + ex.stderr
    cx = _sim(x)
    assert cx.returncode == 0 and re.search(r"D2H results: \d+ EXACT, 0 CLOSE, 0 DIFFERENT", cx.stdout), cx.stdout + cx.stderr
    if shutil.which("make"):
        out = snaps["tmp"] / "export_glob"
        ex = _cli("export", globs["plain"], "-o", out, "--sim")
        assert ex.returncode == 0, ex.stdout + ex.stderr
        assert subprocess.run(["make", "-s", "-C", str(out), f"SIM={SIM}"], capture_output=True).returncode == 0
        run = subprocess.run(["make", "-s", "-C", str(out), "run", f"SIM={SIM}"], capture_output=True, text=True,
                             timeout=300)
        assert run.returncode == 0 and "OK: 3 device-to-host results verified" in run.stderr, run.stderr


def test_a_global_the_simulator_cannot_provide_is_refused_by_name(globs):
    """A global of a module with no PTX: one line naming the call, the variable and why, before
    anything runs; info --sim lists it with the snapshot's gaps."""
    cp = _sim(globs["sass"])
    assert cp.returncode == 2 and cp.stdout == "", cp.stdout + cp.stderr
    assert re.fullmatch(r"cudasnap: error: call #\d+ cuModuleGetGlobal_v2 asks for module global g_table: its module "
                        r"\(call #\d+\) has no PTX; the simulator cannot provide it\n", cp.stderr), cp.stderr
    info = _cli("info", globs["sass"], "--sim")
    assert info.returncode == 0 and re.search(r"^  - call #\d+ cuModuleGetGlobal_v2 asks for module global g_table",
                                              info.stdout, re.M), info.stdout


def test_module_variables_and_their_probe():
    from cudasnap.replay.sim import ptx
    text = (DATA / "globals.ptx").read_text()
    assert ptx.variables(text) == {"g_scale": ("global", 4), "c_bias": ("const", 16)}
    assert ptx.variables(".extern .global .align 4 .b8 x[];\n.global .v2 .u32 a[3][2] = {1};\n"
                         ".entry k()\n{\n.const .f32 inside;\n}\n") == {"x": ("global", None), "a": ("global", 48)}
    probe = ptx.probe(["g_scale", "c_bias"])
    assert "mov.u64 %cs_g1, c_bias;\n\tst.global.u64 [%cs_g0+8], %cs_g1;" in probe
    assert ptx.entries(probe) == {ptx.PROBE: [(0, 8)]}


def test_a_difference_from_approximate_math_is_named(globs):
    """sin.approx: the simulator computes it with the host's math library, a GPU approximates.
    The plan warns; within the simulator's default tolerance the result is CLOSE; bit-exact it is
    DIFFERENT (exit 1 stays) and says that its writer uses sin.approx.f32 and what that means."""
    cp = _sim(globs["sinp"])
    assert cp.returncode == 0 and "D2H results: 3 EXACT, 1 CLOSE, 0 DIFFERENT" in cp.stdout, cp.stdout + cp.stderr
    assert "warning: kernel fast_sin uses approximate math (sin.approx" in cp.stderr, cp.stderr
    ex = _sim(globs["sinp"], "--exact")
    assert ex.returncode == 1, ex.stdout + ex.stderr
    line = next(l for l in ex.stdout.splitlines() if l.startswith("DIFFERENT: "))
    assert "last written by #" in line and line.endswith(
        "; its writer uses sin.approx.f32, which the simulator computes with the host's math library where the GPU "
        "approximates: a difference in the last bits there is the simulator's (--dtype judges it within a tolerance)"), line


def test_a_difference_where_ptxas_may_fuse_is_named(snaps, tmp_path):
    """simprog whose add_one adds a product (mul.f32 into add.f32, no rounding mode), its recorded
    results one ULP off on every third element as a GPU's fused FMA could leave them (saxpy reads
    them): CLOSE by
    default; under --exact DIFFERENT (exit 1) that says the GPU may have fused the pair; a writer
    without such a pair claims no cause."""
    d = snaps["double"]
    text = (DATA / "kernels.ptx").read_text()
    fused = tmp_path / "fused.ptx"           # x * 1 + 1
    fused.write_text(text.replace("add.f32 \t%f2, %f1, 0f3F800000;",
                                  "mul.f32 \t%f2, %f1, 0f3F800000;\n\tadd.f32 \t%f2, %f2, 0f3F800000;", 1))
    assert fused.read_text() != text
    snap = tmp_path / "fused.cusnap"
    cp = _cli("capture", "-o", snap, "--ring-mb", "16", "--", d["progs"]["simprog"], fused,
              env=dict(d["env"], CUDA_DOUBLE_PERTURB="add_one:ulp:3"), timeout=120)
    assert snap.exists(), cp.stdout + cp.stderr
    cp = _sim(snap)
    assert cp.returncode == 0 and re.search(r"D2H results: \d+ EXACT, [12] CLOSE, 0 DIFFERENT", cp.stdout), cp.stdout + cp.stderr
    ex = _sim(snap, "--exact")
    assert ex.returncode == 1, ex.stdout + ex.stderr
    line = next(l for l in ex.stdout.splitlines() if l.startswith("DIFFERENT: ") and " add_one" in l)
    assert re.search(r"last written by #\d+ add_one;", line) and line.endswith(
        "; its writer adds products (mul.f32 into add/sub.f32 without a rounding mode) that ptxas may "
        "fuse into one FMA on the GPU (one rounding) and the simulator rounds twice: a difference in "
        "the last bits there is the simulator's (--dtype judges it within a tolerance)"), line
    plain = _sim(snaps["plain"], "--replace", f"add_one={DATA / 'wrong_add_one.ptx'}")
    assert plain.returncode == 1 and "DIFFERENT: " in plain.stdout and "may fuse" not in plain.stdout, plain.stdout


def test_contractible_pairs_in_ptx():
    from cudasnap.replay.numerics import ptx_contractions
    text = (".visible .entry a(.param .u64 p)\n{\n\tmul.f64 %fd1, %fd2, %fd3;\n\tsub.f64 %fd4, %fd5, %fd1;\n"
            "\tmul.rn.f32 %f1, %f2, %f3;\n\tadd.f32 %f4, %f1, %f5;\n}\n"
            ".visible .entry b(.param .u64 p)\n{\n\tmul.f32 %f1, %f2, %f3;\n\tadd.rn.f32 %f4, %f1, %f5;\n"
            "\tadd.f32 %f6, %f7, %f8;\n}\n")
    assert ptx_contractions(text) == {"a": ["f64"], "b": []}


def test_approximate_instructions_in_ptx():
    from cudasnap.replay.numerics import ptx_approx_ops
    text = (DATA / "fast_sin.ptx").read_text() + (
        ".visible .entry other(.param .u64 p)\n{\n\tsin.approx.ftz.f32 %f1, %f2;\n\tex2.approx.f32 %f3, %f1;\n"
        "\trcp.approx.ftz.f64 %fd1, %fd2;\n\tdiv.rn.f32 %f4, %f3, %f1;\n\tsin.approx.f32 %f5, %f4;\n}\n")
    assert ptx_approx_ops(text) == {"fast_sin": ["sin.approx.f32"], "other": ["ex2.approx.f32", "sin.approx.f32",
                                                                             "sin.approx.ftz.f32"]}
    assert ptx_approx_ops((DATA / "kernels.ptx").read_text()) == dict.fromkeys(
        ("add_one", "fill", "saxpy", "chase", "tile_sum", "histo"), [])
