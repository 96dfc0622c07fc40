"""`info SNAP --sim [--timeline P.json]`: which kernels of a snapshot can run on the simulator,
why the others cannot, and their share of GPU time. Read from the snapshot alone: no simulator
build is needed (the last test checks the reasons against `replay --sim`'s refusal where one is)."""
from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from simbuild import SIM, needs_sim
from synth import Synth

REPO_DATA = Path(__file__).resolve().parent / "data" / "sim"

PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry good(.param .u64 good_p0)
{
  ret;
}
.visible .entry shfl(.param .u64 shfl_p0)
{
  .reg .b32 %r<3>;
  shfl.sync.down.b32 %r1, %r2, 1, 31, -1;
  ret;
}
.visible .entry asyncy(.param .u64 asyncy_p0)
{
  .reg .b64 %rd<2>;
  .reg .b32 %r<2>;
  cp.async.ca.shared.global [%r1], [%rd1], 4;
  ret;
}
.visible .entry coop(.param .u64 coop_p0)
{
  ret;
}
.visible .entry chaser(.param .u64 chaser_p0)
{
  ret;
}
"""
A, B, C = 0x300000000000, 0x300000100000, 0x300000200000
# (kernel, handle, GPU time of its one launch in us)
KERNELS = [("good", 0x401, 60.0), ("shfl", 0x402, 10.0), ("asyncy", 0x403, 5.0), ("coop", 0x404, 3.0),
           ("chaser", 0x405, 2.0), ("gemm_sass", 0x406, 20.0)]


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "cudasnap", *map(str, args)], capture_output=True, text=True,
                          timeout=120, env=env)


def _fatbin_sass_only(arch=90) -> bytes:
    payload = b"\x7fELF" + bytes(60)
    entry = struct.pack("<HHIQ", 2, 0, 64, len(payload)) + bytes(12) + struct.pack("<I", arch) + bytes(40)
    body = entry + payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def _context_and_module(s) -> None:
    """A synthetic snapshot's start: the driver, the primary context and the PTX module 0x222."""
    s.call("cuInit", {"Flags": 0})
    s.call("cuDevicePrimaryCtxRetain", {"pctx": 0x111, "dev": 0})
    s.call("cuCtxSetCurrent", {"ctx": 0x111})
    s.call("cuModuleLoadData", {"module": 0x222, "image": 1}, x={"image": s.blob(PTX + b"\0")})


@pytest.fixture(scope="module")
def snap(tmp_path_factory):
    """Six kernels: good (runs), shfl (runs, warned), asyncy (cp.async), coop (launched by
    cuLaunchCooperativeKernel, which the adapter lacks), chaser (its buffer holds a pointer
    that cannot be relocated with proof), gemm_sass (SASS only); and cuGraphCreate, a gap no
    kernel names. Beside it: a timeline of it, with each launch's GPU time."""
    d = tmp_path_factory.mktemp("simcov")
    path = d / "cov.cusnap"
    s = Synth(path)
    _context_and_module(s)
    s.call("cuModuleLoadData", {"module": 0x223, "image": 2}, x={"image": s.blob(_fatbin_sass_only())})
    for k, h, _t in KERNELS:
        s.call("cuModuleGetFunction", {"hfunc": h, "hmod": 0x223 if k == "gemm_sass" else 0x222, "name": k})
        s.fn(h, k, 0x223 if k == "gemm_sass" else 0x222, [[0, 8]])
    for base in (A, B, C):
        s.call("cuMemAlloc_v2", {"dptr": base, "bytesize": 256})
    # B holds the end of A: a pointer into A, or into whatever follows it? Not provable.
    s.call("cuMemcpyHtoD_v2", {"dstDevice": B, "srcHost": 0x7F0000100000, "ByteCount": 16},
           x={"srcHost": s.blob(struct.pack("<QQ", A + 256, 0))})
    s.call("cuGraphCreate", {"phGraph": 0x777, "flags": 0})
    seqs = {}
    for k, h, _t in KERNELS:
        arg = B if k == "chaser" else C
        rec = s.launch(h, struct.pack("<Q", arg), f="cuLaunchCooperativeKernel" if k == "coop" else "cuLaunchKernel")
        seqs[k] = rec["s"]
    s.call("cuCtxSynchronize", {})
    s.w.write({"k": "end", "exit": 0, "signal": None, "partial": False})
    s.close()
    from cudasnap.formats import SnapshotReader
    from cudasnap.replay.profile.report import snapshot_id
    with SnapshotReader(str(path)) as r:
        sid = snapshot_id(r.raw_header)
    prof = {"summary": {"mode": "timeline", "launches_timed": len(KERNELS)},
            "launches": [{"seq": seqs[k], "index": i, "name": k, "time_us": t} for i, (k, _h, t) in enumerate(KERNELS)],
            "kernels": [], "warnings": [], "snapshot": str(path),
            "run": {"snapshot": str(path), "snapshot_id": sid, "gpu": {"name": "NVIDIA H100 80GB HBM3"}}}
    tl = d / "cov.gpu.json"
    tl.write_text(json.dumps(prof))
    return {"snap": path, "timeline": tl, "profile": prof, "dir": d}


def _no_sim_env():
    return {k: v for k, v in os.environ.items() if k != "CUDASNAP_GPGPUSIM"}


SUMMARY = ("2 of 6 kernels (70.0% of GPU time) can run on the simulator; n/a: 1 no PTX (SASS only), 1 cp.async, "
           "1 call gap: cuLaunchCooperativeKernel, 1 pointer problem")


def test_coverage_per_kernel_with_reasons_and_time(snap):
    cp = _cli("info", snap["snap"], "--sim", "--timeline", snap["timeline"], env=_no_sim_env())
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert cp.stderr == ""
    out = cp.stdout
    assert out.rstrip().splitlines()[-1] == SUMMARY, out
    rows = {l.split()[0]: l for l in out.splitlines() if l.split() and l.split()[0] in dict(
        (k, 1) for k, _h, _t in KERNELS)}
    assert re.search(r"^good\s+1\s+60\.0\s+60\.0%\s+image\s+runnable$", rows["good"]), rows["good"]
    assert rows["shfl"].endswith("runnable (warned: warp shuffles)"), rows["shfl"]
    assert re.search(r"\snone\s+n/a: no PTX \(SASS only\)$", rows["gemm_sass"]), rows["gemm_sass"]
    assert rows["asyncy"].endswith("n/a: cp.async") and rows["chaser"].endswith("n/a: pointer problem")
    assert rows["coop"].endswith("n/a: call gap: cuLaunchCooperativeKernel"), rows["coop"]
    # each n/a with its reason in full, then the gap no kernel names
    assert re.search(r"^  - kernel gemm_sass \(first launched at call #\d+\) has no PTX \(module of call #5: "
                     r"fatbin: sm_90 SASS\)", out, re.M), out
    assert "  - kernel asyncy uses cp.async (the simulator cannot parse it); the simulator cannot run it" in out
    assert re.search(r"^  - cuLaunchCooperativeKernel \(1 call, first #\d+\): the simulator adapter does not "
                     r"implement it$", out, re.M), out
    assert re.search(r"^  - call #\d+ cuMemcpyHtoD_v2 writes buffer 0x300000100000 \(256 B, call #\d+\): the word at "
                     r"offset 0 \(0x300000000100\) is the end of allocation 0x300000000000", out, re.M), out
    assert re.search(r"1 gap\(s\) no kernel's launch names.*\n  - cuGraphCreate \(1 call, first #\d+\): the simulator "
                     r"adapter does not implement it$", out, re.M), out


def test_coverage_json(snap):
    cp = _cli("info", snap["snap"], "--sim", "--timeline", snap["timeline"], "--json", env=_no_sim_env())
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    s = doc["summary"]
    assert s["line"] == SUMMARY
    assert (s["kernels"], s["runnable"], s["launches"], s["runnable_launches"]) == (6, 2, 6, 2)
    assert s["gpu_time_us"] == pytest.approx(100.0) and s["runnable_time_pct"] == pytest.approx(70.0)
    assert s["na"] == {"no PTX (SASS only)": 1, "cp.async": 1, "call gap: cuLaunchCooperativeKernel": 1,
                       "pointer problem": 1}
    by = {k["name"]: k for k in doc["kernels"]}
    assert [k["name"] for k in doc["kernels"]] == ["good", "gemm_sass", "shfl", "asyncy", "coop", "chaser"]  # by time
    assert by["good"]["runnable"] and by["good"]["ptx"] == "image" and by["good"]["reasons"] == []
    assert by["good"]["image"] == "ptx" and by["gemm_sass"]["image"] == "fatbin"
    assert by["good"]["share_pct"] == pytest.approx(60.0) and by["good"]["timed"] == 1
    assert by["shfl"]["runnable"] and [w["warning"] for w in by["shfl"]["warnings"]] == ["warp shuffles"]
    assert by["gemm_sass"]["ptx"] is None and not by["gemm_sass"]["runnable"]
    assert [r["reason"] for r in by["chaser"]["reasons"]] == ["pointer problem"]
    assert len(doc["snapshot_gaps"]) == 1 and doc["snapshot_gaps"][0].startswith("cuGraphCreate (1 call")
    assert doc["timeline"] == str(snap["timeline"])


def test_coverage_without_a_timeline(snap):
    cp = _cli("info", snap["snap"], "--sim", "--json", env=_no_sim_env())
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["summary"]["line"].startswith("2 of 6 kernels can run on the simulator; n/a: ")
    assert "runnable_time_pct" not in doc["summary"] and all("time_us" not in k for k in doc["kernels"])
    text = _cli("info", snap["snap"], "--sim", env=_no_sim_env())
    assert text.returncode == 0 and "GPU us" not in text.stdout
    assert text.stdout.rstrip().endswith(doc["summary"]["line"])


def test_a_graph_kernel_only_in_the_timeline_is_counted(snap, tmp_path):
    """A kernel the timeline times but no recorded launch runs (a graph node's): counted, with
    the reasons its module gives."""
    prof = json.loads(json.dumps(snap["profile"]))
    prof["launches"].append({"seq": 99, "index": 6, "name": "node_kernel", "time_us": 100.0})
    p = tmp_path / "t.json"
    p.write_text(json.dumps(prof))
    cp = _cli("info", snap["snap"], "--sim", "--timeline", p, "--json")
    doc = json.loads(cp.stdout)
    k = next(k for k in doc["kernels"] if k["name"] == "node_kernel")
    assert k["launches"] == 0 and k["timed"] == 1 and k["share_pct"] == pytest.approx(50.0)
    assert [r["reason"] for r in k["reasons"]] == ["no PTX (image not captured)"]
    assert doc["summary"]["line"].startswith("2 of 7 kernels (35.0% of GPU time)")


@pytest.mark.parametrize("case", ["missing", "corrupt", "not_profile", "bad_shape", "other_snapshot", "simulated",
                                  "untimed"])
def test_bad_timeline_is_one_line(snap, tmp_path, case):
    p = tmp_path / f"{case}.json"
    prof = json.loads(json.dumps(snap["profile"]))
    if case == "corrupt":
        p.write_text(json.dumps(prof)[:-20])
    elif case == "not_profile":
        p.write_text("[1, 2, 3]")
    elif case == "bad_shape":
        prof["launches"][0]["time_us"] = "fast"
        p.write_text(json.dumps(prof))
    elif case == "other_snapshot":
        prof["run"]["snapshot_id"] = "f" * 32
        p.write_text(json.dumps(prof))
    elif case == "untimed":
        prof["launches"] = []
        p.write_text(json.dumps(prof))
    elif case == "simulated":
        prof["run"]["simulated"] = {"simulator": "gpgpu-sim"}
        p.write_text(json.dumps(prof))
    cp = _cli("info", snap["snap"], "--sim", "--timeline", p)
    assert cp.returncode == 2 and cp.stdout == "", cp.stdout + cp.stderr
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cudasnap: error: "), cp.stderr
    want = {"missing": "no such file", "corrupt": "not a profile JSON", "not_profile": "not a profile written by",
            "bad_shape": "launches[0].time_us is a string, not a number",
            "other_snapshot": "a profile of another snapshot", "simulated": "a simulated profile",
            "untimed": "no launch of it has a time"}[case]
    assert want in lines[0], lines[0]


def test_bad_use_is_one_line(snap, tmp_path):
    cp = _cli("info", snap["snap"], "--timeline", snap["timeline"])
    assert cp.returncode == 2 and "--timeline" in cp.stderr and "--sim" in cp.stderr
    assert len(cp.stderr.strip().splitlines()) == 1, cp.stderr
    bad = tmp_path / "bad.cusnap"
    bad.write_bytes(b"not a snapshot" * 10)
    cp = _cli("info", bad, "--sim")
    assert cp.returncode == 2 and len(cp.stderr.strip().splitlines()) == 1 and "Traceback" not in cp.stderr


def test_ldmatrix_is_refused_before_the_run():
    """ldmatrix, which the simulator's parser rejects, is named among the constructs it cannot run
    (coverage and the refusal) where it is left as it is (transposed), not found by a crash."""
    from cudasnap.replay.sim import ptx
    body = ".visible .entry k(.param .u64 p)\n{\n ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r1, %r2, %r3, %r4}, [%r5];\n}"
    assert ptx.constructs(body) == [("ldmatrix/stmatrix (the simulator cannot parse it; only the non-transposed "
                                     "ldmatrix with a 32-bit address is rewritten)", True)]
    assert ptx.constructs(ptx.for_sim(body.replace(".x4.", ".x4.trans."))) == ptx.constructs(body)


@needs_sim
def test_reasons_are_replay_sims_refusal(snap):
    """Every reason coverage gives, and each gap no kernel names, is a line of the refusal
    `replay --sim` prints before simulating anything."""
    doc = json.loads(_cli("info", snap["snap"], "--sim", "--json").stdout)
    cp = _cli("replay", snap["snap"], "--sim", "gpgpu-sim", "--sim-path", SIM)
    assert cp.returncode == 2 and cp.stdout == "", cp.stdout + cp.stderr
    items = {l[4:] for l in cp.stderr.splitlines() if l.startswith("  - ")}
    mine = {r["detail"] for k in doc["kernels"] for r in k["reasons"]} | set(doc["snapshot_gaps"])
    assert mine == items, (mine ^ items)


def test_matrix_sim_column(snap):
    """The GPU suite's matrix (tests/gpu/matrix.py) shows the coverage in its sim column, K/N
    kernels and the share of GPU time, and lists each n/a kernel with its reason."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
    try:
        import matrix
    finally:
        sys.path.pop(0)
    doc = json.loads(_cli("info", snap["snap"], "--sim", "--timeline", snap["timeline"], "--json").stdout)
    s = doc["summary"]
    cov = {k: s.get(k) for k in ("kernels", "runnable", "runnable_time_pct", "na", "snapshot_gaps", "line")}
    cov["na_kernels"] = [{"name": k["name"], "share_pct": k.get("share_pct"), "reasons": [r["reason"] for r in k["reasons"]]}
                         for k in doc["kernels"] if not k["runnable"]]
    rows = [{"run": 1, "workload": "w", "cells": {"capture": {"ok": True, "s": 1, "detail": ""},
                                                   "sim": {"ok": True, "s": 1, "detail": s["line"], "coverage": cov}}}]
    line = matrix.table(rows).splitlines()[-1]
    assert "| ok 2/6, 70% |" in line, line
    text = matrix.sim_coverage(rows)
    assert text.startswith(f"w (run 1): {SUMMARY}; a whole-snapshot replay also meets 1 gap(s)\n"), text
    assert "  n/a gemm_sass (20.0% of GPU time): no PTX (SASS only)\n" in text
    assert "  n/a coop (3.0% of GPU time): call gap: cuLaunchCooperativeKernel\n" in text
    # a JAX workload is captured with XLA's PTX kept; the column says what capture kept
    assert matrix.CAPTURE_OPTS["jax_jit"] == matrix.CAPTURE_OPTS["jax_train"] == ["--keep-ptx", "xla"]
    rows[0]["cells"]["sim"]["coverage"]["ptx_kept"] = "PTX kept for 3 of 4 cubin modules (xla dump: 3)"
    assert matrix.sim_coverage(rows).startswith(f"w (run 1): {SUMMARY}; a whole-snapshot replay also meets 1 gap(s); "
                                                "capture: PTX kept for 3 of 4 cubin modules (xla dump: 3)\n")


def test_bench_verdicts(tmp_path):
    """bench/sim_kernels.py reads a simulated extract's verdict from its output and exit code."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    try:
        import sim_kernels
    finally:
        sys.path.pop(0)
    cases = {"a": (0, "D2H results: 2 EXACT, 0 CLOSE, 0 DIFFERENT\nOK: every recorded D2H result reproduced (exit 0)\n", "EXACT"),
             "b": (0, "D2H results: 1 EXACT, 1 CLOSE, 0 DIFFERENT\nCLOSE: x\nOK: every recorded D2H result reproduced "
                      "(1 CLOSE within torch) (exit 0)\n", "CLOSE"),
             "c": (1, "DIFFERENT: call #5 cuMemcpyDtoH_v2: first divergence\nFAILED: verification mismatch (exit 1)\n",
                   "DIFFERENT"),
             "d": (2, "cudasnap: error: kernel k uses cp.async\n", "refused"),
             "e": (124, "", "failed"),
             "f": (0, "OK: 9 calls replayed; 0 D2H result(s) verified, 0 without a recorded result (exit 0)\n", "unverified")}
    for n, (rc, text, want) in cases.items():
        (tmp_path / f"{n}.sim.rc").write_text(f"{rc}\n")
        (tmp_path / f"{n}.sim.txt").write_text(text)
        assert sim_kernels.verdict(str(tmp_path), n)[0] == want, n
    assert sim_kernels.verdict(str(tmp_path), "missing")[0] == "not simulated"
    assert sim_kernels.jit({"image": "ptx", "ptx": "image"}) and sim_kernels.jit({"image": "cubin", "ptx": "triton cache"})
    assert not sim_kernels.jit({"image": "fatbin", "ptx": "image"}) and not sim_kernels.jit({"image": "fatbin", "ptx": None})


def test_debug_sections_are_dropped_for_the_parser():
    """Triton's PTX carries DWARF sections; two modules of it merged into one file repeat them,
    which the simulator's parser rejects: they are dropped (they change nothing it computes)."""
    from cudasnap.replay.sim import ptx
    mod = PTX.decode() + ("\t.section\t.debug_abbrev\n\t{\n.b8 1\n.b8 17\n\t}\n\t.section\t.debug_info\n\t{\n.b32 10\n\t}\n"
                          "\t.section\t.debug_macinfo\t{\t}\n")
    fixed = ptx.for_sim(mod)
    assert ".section" not in fixed and ".b8 17" not in fixed
    assert ptx.entries(fixed) == ptx.entries(PTX.decode())
    merged = ptx.merge([fixed, ptx.rename_entry(fixed, "good", "good2")])
    assert ".section" not in merged and merged.count(".entry") == 10


def test_only_modules_whose_kernels_run_are_merged(tmp_path):
    """A module none of whose kernels the replay launches stays out of the simulator's PTX file
    (a construct its parser rejects there would stop the run), yet coverage still judges it."""
    from cudasnap.formats import SnapshotReader
    from cudasnap.replay.options import ReplayOptions
    from cudasnap.replay.sim import kernel_problems, plan
    other = PTX.replace(b"good", b"solo").replace(b"shfl", b"solo_s").replace(b"asyncy", b"solo_a") \
        .replace(b"coop", b"solo_c").replace(b"chaser", b"solo_ch")
    path = tmp_path / "two.cusnap"
    s = Synth(path)
    _context_and_module(s)
    s.call("cuModuleLoadData", {"module": 0x223, "image": 2}, x={"image": s.blob(other + b"\0")})
    s.call("cuModuleGetFunction", {"hfunc": 0x401, "hmod": 0x223, "name": "solo"})
    s.fn(0x401, "solo", 0x223, [[0, 8]])
    s.call("cuMemAlloc_v2", {"dptr": C, "bytesize": 256})
    s.launch(0x401, struct.pack("<Q", C))
    s.close()
    with SnapshotReader(str(path)) as r:
        p = plan(r, ReplayOptions(), [])
    assert len(p.texts) == 1 and ".entry solo(" in p.texts[0] and ".entry asyncy" not in p.texts[0]
    # solo_a (cp.async) is in the launched module, never launched: left out of the file, not refused
    assert ".entry solo_a" not in p.texts[0] and ".entry solo_c(" in p.texts[0] and p.refusals == []
    assert [x for x, _ in kernel_problems(p, "asyncy", 1)[0]] == ["cp.async"]   # judged all the same
    assert [x for x, _ in kernel_problems(p, "solo_a", 1)[0]] == ["cp.async"]


def test_warp_shuffles_are_rewritten_as_exchanges():
    """Each shfl form becomes a store of the lane's value and a load of its source lane's, in a
    per-CTA array declared before its function; the `d|p` form sets p; a guard stays on both;
    coverage names it as a note, not a reason to refuse."""
    from cudasnap.replay.sim import ptx
    text = (REPO_DATA / "shfl_add_one.ptx").read_text()
    out = ptx.for_sim(text)
    assert "shfl." not in out.replace(ptx.SHFL_NOTE, "")
    assert out.count(ptx.SHFL_NOTE) == 5 and out.count("st.shared.b32 [%cs_sh6], %cs_sh11;") == 5
    assert re.search(r"^\.extern \.shared \.align 4 \.b32 __cs_shfl_[0-9a-f]{8}\[\];\n\.visible \.entry add_one\(", out, re.M)
    assert out.count(f"add.u32 %cs_sh5, %cs_sh5, {ptx.SCRATCH_AT};") == 5       # past any CTA's shared memory
    assert "ld.shared.b32 %r9, [%cs_sh10];\n\tmov.pred %p2, %cs_shp0;" in out          # d|p
    assert "setp.ge.s32 %cs_shp0, %cs_sh9, %cs_sh8;" in out                              # up: j >= its bound
    guarded = ptx.for_sim(".visible .entry k(.param .u64 p)\n{\n\t@!%p1 shfl.sync.bfly.b32 %r1, %r2, 4, 31, -1;\n}\n")
    assert "\t@!%p1 st.shared.b32" in guarded and "\t@!%p1 ld.shared.b32 %r1," in guarded
    assert ptx.entries(out) == ptx.entries(text)
    assert [(w, r) for w, r in ptx.constructs(out)] == [
        ("warp shuffles, run as shared-memory exchanges (performance mode counts that exchange's instructions "
         "and shared-memory traffic)", None)]


def test_ldmatrix_is_rewritten_as_loads():
    """Non-transposed ldmatrix with a 32-bit shared address becomes the loads of each lane's row
    address and word; the transposed form stays refused."""
    from cudasnap.replay.sim import ptx
    out = ptx.for_sim((REPO_DATA / "ldmatrix_add_one.ptx").read_text())
    assert "ldmatrix.sync" not in out and out.count(ptx.LDM_NOTE) == 2
    for reg in ("%r13", "%r14", "%r15", "%r16", "%r17"):
        assert f"\tld.shared.b32 {reg}, [%cs_sh8];" in out, reg
    assert "\tadd.s32 %cs_sh10, %cs_sh9, 24;" in out                          # .x4: the fourth matrix's rows
    trans = ".visible .entry k(.param .u64 p)\n{\n\tldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%r1}, [%r2];\n}\n"
    assert [r for _w, r in ptx.constructs(ptx.for_sim(trans))] == [True]
