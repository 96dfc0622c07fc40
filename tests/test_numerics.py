"""Three outcomes of a compared D2H result (EXACT, CLOSE, DIFFERENT), element types read from
the writing kernel's PTX or given, tolerances in the forms users know, defaults by target."""
from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cudasnap.replay.numerics import (CLOSE, DIFFERENT, EXACT, Tolerance, TypeOracle, measure, parse_dtype_specs,
                                      parse_tolerance, ptx_store_types)
from simbuild import SIM, needs_sim

DATA = Path(__file__).resolve().parent / "data" / "sim"
N = 4096


# ------------------------------------------------------------------------------ units
def test_tolerance_forms():
    assert parse_tolerance("torch").kind == "torch" and parse_tolerance("default").kind == "torch"
    t = parse_tolerance("rtol=1e-5,atol=1e-8")
    assert (t.kind, t.rtol, t.atol) == ("rel", 1e-5, 1e-8)
    assert parse_tolerance("ulp:4").ulp == 4 and parse_tolerance("exact").exact and parse_tolerance("ulp:0").exact
    for bad in ("tight", "rtol=x", "ulp:-1", "rtol=1,foo=2", "rtol=-1"):
        with pytest.raises(ValueError, match="expected exact, torch"):
            parse_tolerance(bad)
    assert parse_dtype_specs(["f16", "#12=bf16", "gemm.*=float32"]) == [(None, "f16"), ("#12", "bf16"), ("gemm.*", "f32")]
    with pytest.raises(ValueError, match="--dtype 'x=f8'"):
        parse_dtype_specs(["x=f8"])


def _bits(a, dt):
    return np.asarray(a, dtype=dt).tobytes()


def test_float32_last_bit_is_close_with_counts():
    e = np.linspace(0.1, 10, 1000, dtype=np.float32)
    g = e.copy()
    g.view(np.uint32)[::10] += 1
    j = measure(e.tobytes(), g.tobytes(), "f32", Tolerance("torch"))
    assert (j.outcome, j.differing, j.elements, j.max_ulp) == (CLOSE, 100, 1000, 1)
    assert 0 < j.max_rel < 1.2e-7
    ex = measure(e.tobytes(), g.tobytes(), "f32", Tolerance())
    assert ex.outcome == DIFFERENT and ex.first == 0 and ex.would_pass
    assert measure(e.tobytes(), e.tobytes(), "f32", Tolerance()).outcome == EXACT
    plus1 = measure(e.tobytes(), (e + 1).tobytes(), "f32", Tolerance("rel", rtol=1e-2))
    assert plus1.outcome == DIFFERENT and plus1.first == 0 and plus1.got_val == pytest.approx(1.1)
    assert measure(e.tobytes(), g.tobytes(), "f32", Tolerance("ulp", ulp=1)).outcome == CLOSE
    nan = g.copy()
    nan[5] = np.nan
    assert measure(e.tobytes(), nan.tobytes(), "f32", Tolerance("torch")).outcome == DIFFERENT


def test_half_types_are_judged_in_their_own_type():
    """A float16 difference of 5e-4 relative passes float16's defaults (rtol 1e-3), not float32's;
    a bfloat16 one of 1% passes bfloat16's (1.6e-2)."""
    e = np.full(64, 1.0, dtype=np.float16)
    g = e.copy()
    g[3] = np.float16(1.0 + 2 ** -10)                    # 1 ULP of float16: 9.8e-4 relative
    j = measure(e.tobytes(), g.tobytes(), "f16", Tolerance("torch"))
    assert (j.outcome, j.differing, j.elements, j.max_ulp) == (CLOSE, 1, 64, 1)
    assert j.max_rel == pytest.approx(2 ** -10)
    # the same bytes read as float32 are other numbers: the type matters
    assert measure(e.tobytes(), g.tobytes(), "f32", Tolerance("torch")).elements == 32

    def bf16(vals):
        return (np.asarray(vals, dtype=np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
    eb, gb = bf16([1.0] * 8), bf16([1.0] * 7 + [1.0078125])    # 1 ULP of bfloat16: 0.78%
    jb = measure(eb, gb, "bf16", Tolerance("torch"))
    assert (jb.outcome, jb.differing, jb.elements, jb.max_ulp) == (CLOSE, 1, 8, 1)
    # the same 0.78% in a float16 buffer is beyond float16's defaults
    h = np.full(8, 1.0, dtype=np.float16)
    h2 = h.copy()
    h2[7] = np.float16(1.0078125)
    assert measure(h.tobytes(), h2.tobytes(), "f16", Tolerance("torch")).outcome == DIFFERENT


def test_element_types_from_ptx_stores():
    ptx = """
.visible .entry k_f32(.param .u64 p) { st.global.f32 [%rd1], %f1; st.global.v4.f32 [%rd2], {%f1,%f2,%f3,%f4}; }
.visible .entry k_half(.param .u64 p) { cvt.rn.f16.f32 %rs1, %f1; st.global.b16 [%rd1], %rs1; }
.visible .entry k_bf16(.param .u64 p) { cvt.rn.bf16.f32 %rs1, %f1; st.global.b16 [%rd1], %rs1; }
.visible .entry k_mixed(.param .u64 p) { st.global.f32 [%rd1], %f1; st.global.u32 [%rd2], %r1; }
.visible .entry k_atom(.param .u64 p) { red.global.add.f32 [%rd1], %f1; }
.visible .entry k_int(.param .u64 p) { st.global.u64 [%rd1], %rd2; }
.visible .entry k_generic(.param .u64 p) { st.shared.u32 [%r1], %r2; st.v4.f32 [%rd1], {%f1,%f2,%f3,%f4}; }
"""
    t = ptx_store_types(ptx)
    assert {k: v[0] for k, v in t.items()} == {"k_f32": "f32", "k_half": "f16", "k_bf16": "bf16", "k_mixed": None,
                                               "k_atom": "f32", "k_int": "int", "k_generic": "f32"}
    assert t["k_mixed"][1] == "global stores of f32, u32" and t["k_half"][1] == "global stores of b16"
    o = TypeOracle(None, parse_dtype_specs(["7=bf16", "gemm=f16"]))
    assert o.of(7, (3, "k")) == ("bf16", "--dtype 7=bf16")
    assert o.of(8, (3, "sgemm_nt")) == ("f16", "--dtype gemm=f16")
    assert o.of(8, None) == (None, "no writer known")


# ------------------------------------------------------------------------------ replays on the double
def _replay(double, snap, *args, extra_env=None):
    env = dict(double["env"])
    env.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    env.update(extra_env or {})
    return subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snap), *args], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def frac(tmp_path_factory):
    """simprog (its module PTX: saxpy stores st.global.f32) with fractional data, captured."""
    from double import fixtures
    d = fixtures.built_double(tmp_path_factory)
    snap = tmp_path_factory.mktemp("numerics") / "frac.cusnap"
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "capture", "-o", str(snap), "--ring-mb", "16", "--",
                         d["progs"]["simprog"], str(DATA / "kernels.ptx"), "frac"], env=d["env"],
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0 and snap.exists(), cp.stdout + cp.stderr
    return d, snap


SWAP = ["--replace", f"saxpy={DATA / 'kernels.ptx'}"]
LAST_BIT = {"CUDA_DOUBLE_PERTURB": "saxpy:ulp:3"}


def test_swapped_kernel_rounding_otherwise_is_close(frac):
    d, snap = frac
    cp = _replay(d, snap, *SWAP, extra_env=LAST_BIT)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    out = cp.stdout
    assert "numerics: CLOSE within torch.testing's per-type tolerance passes (a swapped-in kernel" in out
    assert "D2H results: 5 EXACT, 1 CLOSE, 0 DIFFERENT" in out, out
    m = re.search(r"CLOSE: call #\d+ cuMemcpyDtoH_v2 \(last written by #\d+ saxpy\): float32 \(the PTX of saxpy: "
                  r"global stores of f32\): (\d+) of 4096 elements differ, max abs \S+, max rel (\S+), max 1 ULP", out)
    assert m and int(m.group(1)) == (N + 2) // 3, out
    assert float(m.group(2)) < 2.4e-7
    assert "OK: every recorded D2H result reproduced (1 CLOSE within torch.testing's per-type defaults) (exit 0)" in out
    doc = json.loads(_replay(d, snap, *SWAP, "--json", extra_env=LAST_BIT).stdout)
    num = doc["numerics"]
    assert (num["exact"], num["close"], num.get("different", 0), num["max_ulp"]) == (5, 1, 0, 1)
    assert num["close_results"][0]["differing"] == (N + 2) // 3 and num["close_results"][0]["dtype"] == "f32"

    ex = _replay(d, snap, *SWAP, "--exact", extra_env=LAST_BIT)
    assert ex.returncode == 1, ex.stdout + ex.stderr
    assert "numerics: bit-exact (--exact)" in ex.stdout
    assert re.search(r"DIFFERENT: call #\d+ cuMemcpyDtoH_v2: first divergence at byte offset 0 \(element 0\) .*float32 .*max 1 ULP.*"
                     r"CLOSE under torch.testing's default for the type, but bit-exact applies here", ex.stdout), ex.stdout


def test_same_kernels_on_a_gpu_are_bit_exact_by_default(frac):
    """No swap: a last-bit difference is the target's fault by default (exit 1, named); a
    tolerance given accepts it."""
    d, snap = frac
    cp = _replay(d, snap, extra_env=LAST_BIT)
    assert cp.returncode == 1 and "numerics: bit-exact (the same kernels on a GPU)" in cp.stdout, cp.stdout
    assert "D2H results: 5 EXACT, 0 CLOSE, 1 DIFFERENT" in cp.stdout
    assert _replay(d, snap, "--tolerance", "ulp:1", extra_env=LAST_BIT).returncode == 0
    env = dict(LAST_BIT, CUDASNAP_TOLERANCE="torch")
    ok = _replay(d, snap, extra_env=env)
    assert ok.returncode == 0 and "numerics: torch.testing's per-type defaults (CUDASNAP_TOLERANCE)" in ok.stdout
    for args, says in ((["--tolerance", "loose"], "--tolerance 'loose': expected exact, torch"),
                       (["--dtype", "f8"], "--dtype 'f8': expected TYPE, CALL=TYPE or KERNEL=TYPE"),
                       (["--exact", "--tolerance", "torch"], "--exact asks for bit-exact results")):
        bad = _replay(d, snap, *args)
        assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and says in bad.stderr, bad.stderr


@pytest.mark.parametrize("tol", [[], ["--tolerance", "torch"], ["--tolerance", "rtol=1e-2,atol=1e-3"],
                                 ["--tolerance", "ulp:100000"]])
def test_kernel_computing_plus_one_is_different_under_every_tolerance(frac, tol):
    d, snap = frac
    cp = _replay(d, snap, *SWAP, *tol, extra_env={"CUDA_DOUBLE_PERTURB": "saxpy:add:1"})
    assert cp.returncode == 1, cp.stdout + cp.stderr
    m = re.search(r"DIFFERENT: call #\d+ cuMemcpyDtoH_v2: first divergence at byte offset 0 \(element 0\) .*: expected (\S+) got (\S+); "
                  r"float32 \(the PTX of saxpy: global stores of f32\): 4096 of 4096 elements differ", cp.stdout)
    assert m and float(m.group(2)) == pytest.approx(float(m.group(1)) + 1, rel=1e-6), cp.stdout
    assert "FAILED: verification mismatch (exit 1)" in cp.stdout


def test_integer_results_stay_bit_exact(frac):
    """fill's buffer (st.global.u32 in its PTX) is not a float: under any tolerance a changed
    word is DIFFERENT, and says why it was compared bit for bit."""
    d, snap = frac
    cp = _replay(d, snap, *SWAP, "--replace", f"fill={DATA / 'kernels.ptx'}",
                 extra_env={"CUDA_DOUBLE_CORRUPT": "fill:1"})
    assert cp.returncode == 1, cp.stdout
    assert re.search(r"DIFFERENT: call #\d+ cuMemcpyDtoH_v2: first divergence at byte offset 0 .*"
                     r"\(integers: the PTX of fill: global stores of u32: compared bit for bit\)", cp.stdout), cp.stdout


def test_recheck_tells_nondeterminism_from_the_target(frac):
    """Where a result is CLOSE, a second replay: one element that moves from run to run is the
    program's nondeterminism; a swapped kernel that rounds the same way each time is the target's."""
    d, snap = frac
    cp = _replay(d, snap, "--tolerance", "torch", extra_env={"CUDA_DOUBLE_PERTURB": "saxpy:jitter"})
    assert cp.returncode == 0, cp.stdout
    assert re.search(r"recheck: a second replay read other bits than the first at 1 of 1 result\(s\) \(call #\d+\): "
                     r"the program's own results vary from run to run", cp.stdout), cp.stdout
    ex = _replay(d, snap, extra_env={"CUDA_DOUBLE_PERTURB": "saxpy:jitter"})
    assert ex.returncode == 1 and "FAILED: verification mismatch (results vary from run to run: see recheck)" in ex.stdout
    same = _replay(d, snap, *SWAP, extra_env=LAST_BIT)
    assert "recheck: a second replay read the same bits at all 1 result(s) that differ" in same.stdout, same.stdout
    assert "recheck" not in _replay(d, snap, *SWAP, "--no-recheck", extra_env=LAST_BIT).stdout


def test_tolerance_in_campaign_rules_and_envs_and_bisect_envs(tmp_path):
    """[rules] tolerance applies to every env without its own; an env's `tolerance` (campaign and
    bisect alike) reaches its replays as CUDASNAP_TOLERANCE; a bad one is one line naming it."""
    from test_compare import three_kernels
    from cudasnap.campaign.bisect import BisectError, load_envs
    from cudasnap.campaign.plan import PlanError, load_campaign
    snap = three_kernels(tmp_path / "s.cusnap")
    camp = tmp_path / "c.toml"
    camp.write_text(f'rules = {{ tolerance = "torch" }}\nsnapshot = [{{ path = "{snap}" }}]\n'
                    'env = [{ name = "plain" }, { name = "swap", tolerance = "ulp:4" }]\n')
    c = load_campaign(camp)
    assert {e.name: e.vars.get("CUDASNAP_TOLERANCE") for e in c.envs} == {"plain": "torch", "swap": "ulp:4"}
    camp.write_text(f'rules = {{ tolerance = "near" }}\nsnapshot = [{{ path = "{snap}" }}]\nenv = [{{ name = "a" }}]\n')
    with pytest.raises(PlanError, match=r"\[rules\] tolerance 'near': expected exact, torch"):
        load_campaign(camp)
    envs = tmp_path / "e.toml"
    envs.write_text('[[env]]\nname = "a"\n[[env]]\nname = "b"\ntolerance = "rtol=1e-5,atol=1e-8"\n')
    assert [e.vars for e in load_envs(envs)] == [{}, {"CUDASNAP_TOLERANCE": "rtol=1e-5,atol=1e-8"}]
    envs.write_text('[[env]]\nname = "a"\ntolerance = 3\n[[env]]\nname = "b"\n')
    with pytest.raises(BisectError, match=r"\(a\): tolerance must be a string"):
        load_envs(envs)


def test_python_api_takes_a_tolerance_and_reports_numerics(frac):
    """cudasnap.replay.replay(path, tolerance=..., exact=...) returns the same outcome counts."""
    d, snap = frac
    code = ("import json, sys; from cudasnap.replay import replay\n"
            f"a = replay({str(snap)!r}, tolerance='ulp:1', recheck=False)\n"
            f"b = replay({str(snap)!r}, exact=True)\n"
            "print(json.dumps([a.exit_code, a.numerics.get('close'), b.exit_code, b.numerics.get('different')]))\n")
    env = dict(d["env"], **LAST_BIT)
    env.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    cp = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout.strip().splitlines()[-1]) == [0, 1, 1, 1]


def test_ptx_jit_where_the_recording_ran_sass_is_a_reason_to_round_otherwise():
    """An image with SASS for another GPU and PTX: the driver JITs here what ran as SASS when
    recorded (a reason for torch's defaults); SASS for this GPU, or PTX only, is the same code."""
    from test_retarget import cubin, fatbin
    from cudasnap.replay.archcheck import jit_needed
    from cudasnap.replay.numerics import Policy
    ptx = b".version 8.0\n.target sm_80\n.address_size 64\n"
    assert jit_needed(fatbin([(2, 80, cubin(80), ""), (1, 80, ptx, "")]), (9, 0))
    assert not jit_needed(fatbin([(2, 90, cubin(90), ""), (1, 80, ptx, "")]), (9, 0))
    assert not jit_needed(fatbin([(1, 80, ptx, "")]), (9, 0))
    pol = Policy()
    assert pol.tol.exact and "bit-exact (the same kernels on a GPU)" in pol.line()
    pol.add_reason("PTX JIT-compiled for sm_90")
    assert pol.tol.kind == "torch" and "(PTX JIT-compiled for sm_90)" in pol.line()


def test_bisect_times_a_close_environment_and_names_its_numerics(double, tmp_path):
    """bisect: an environment whose rebuilt add_one is slower and rounds otherwise is the first
    bad one as a timing regression, its numerics in its reason; with --tolerance exact the same
    environment is a correctness break."""
    from test_compare import THREE_PTX, three_kernels
    snap = three_kernels(tmp_path / "t.cusnap", image=THREE_PTX)
    rebuilt = tmp_path / "add_one.ptx"
    rebuilt.write_bytes(THREE_PTX)
    # planted times (the double's virtual clock): the verdict cannot move with the machine's load
    steady = 'CUDA_DOUBLE_SLOW = "*:1", CUDA_DOUBLE_SLOW_FLOOR_US = "2000", CUDA_DOUBLE_CLOCK = "virtual"'
    swap = (f'CUDA_DOUBLE_SLOW = "*:1,add_one:3", CUDA_DOUBLE_SLOW_FLOOR_US = "2000", CUDA_DOUBLE_CLOCK = "virtual", '
            f'CUDASNAP_REPLACE = "add_one={rebuilt}", CUDA_DOUBLE_PERTURB = "add_one:ulp:2"')
    envs = tmp_path / "envs.toml"
    envs.write_text("".join(f'[[env]]\nname = "{n}"\nvars = {{ {v} }}\n'
                            for n, v in (("a", steady), ("b", steady), ("c", swap), ("d", swap))))
    env = dict(double["env"])
    env.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)

    def bisect(*more):
        cp = subprocess.run([sys.executable, "-m", "cudasnap", "bisect", str(snap), "--envs", str(envs), "--repeat",
                             "5", "--warmup", "1", "--threshold", "15", "--json", *more], env=env,
                            capture_output=True, text=True, timeout=300)
        assert cp.returncode == 1, cp.stdout + cp.stderr
        return json.loads(cp.stdout)

    res = bisect()
    assert res["first_bad"]["name"] == "c" and res["kind"] == "timing regression", res
    c = next(e for e in res["envs"] if e["name"] == "c")
    assert c["numerics"]["outcome"] == "CLOSE" and "numerics CLOSE: max rel" in c["reason"], c
    strict = bisect("--tolerance", "exact")
    assert strict["first_bad"]["name"] == "c" and strict["kind"] == "correctness break", strict


def _half_snapshot(path, conv: str, word: int, recorded_word: int, n: int = 64):
    """fill(p, v, n) recorded with a module whose PTX converts to `conv` and stores 16-bit
    halves (so the buffer is read as that type); the double fills `word`, the recording holds
    `recorded_word` in every 4th word."""
    from synth import Synth
    ptx = (".version 8.0\n.target sm_80\n.address_size 64\n"
           ".visible .entry fill(.param .u64 fill_param_0, .param .u32 fill_param_1, .param .u32 fill_param_2)\n"
           f"{{ cvt.rn.{conv}.f32 %rs1, %f1; st.global.b16 [%rd1], %rs1; ret; }}\n").encode()
    s = Synth(path)
    f_fill, buf = 0x55570002, 0x200000000000
    s.double_prologue("fill", f_fill, [[0, 8], [8, 4], [12, 4]], image=ptx)
    s.call("cuMemAlloc_v2", {"dptr": buf, "bytesize": n * 4})
    s.launch(f_fill, struct.pack("<QIi", buf, word, n), block=n)
    s.call("cuCtxSynchronize", {})
    rec = [recorded_word if i % 4 == 0 else word for i in range(n)]
    s.call("cuMemcpyDtoH_v2", {"dstHost": 0x7F0000200000, "srcDevice": buf, "ByteCount": n * 4},
           x={"dstHost": s.blob(struct.pack(f"<{n}I", *rec))})
    s.double_epilogue([buf])
    return path


@pytest.mark.parametrize("conv,word,recorded,name,rel", [
    ("f16", 0x3C003C00, 0x3C013C00, "float16", 2 ** -10),      # 1.0 vs 1.0 + 1 ULP of float16
    ("bf16", 0x3F803F80, 0x3F813F80, "bfloat16", 2 ** -7)])    # 1.0 vs 1.0 + 1 ULP of bfloat16
def test_half_buffers_are_judged_in_their_own_type_end_to_end(double, tmp_path, conv, word, recorded, name, rel):
    """A buffer whose writer's PTX converts to float16 / bfloat16 is judged element by element
    in that type: 1 ULP of it is CLOSE under its defaults; read as float32 the same bytes are
    DIFFERENT (the high half moved)."""
    snap = _half_snapshot(tmp_path / f"{conv}.cusnap", conv, word, recorded)
    cp = _replay(double, snap, "--tolerance", "torch")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    m = re.search(rf"CLOSE: call #\d+ cuMemcpyDtoH_v2 \(last written by #\d+ fill\): {name} \(the PTX of fill: "
                  rf"global stores of b16\): 16 of 128 elements differ, max abs \S+, max rel (\S+), max 1 ULP", cp.stdout)
    assert m and float(m.group(1)) == pytest.approx(rel, rel=1e-2), cp.stdout
    as_f32 = _replay(double, snap, "--tolerance", "torch", "--dtype", "fill=f32")
    assert as_f32.returncode == 1 and "float32 (--dtype fill=f32): 16 of 64 elements differ" in as_f32.stdout, as_f32.stdout


@needs_sim
def test_simulator_fused_saxpy_is_close_to_the_unfused_recording(frac):
    """The double computes saxpy unfused (two roundings), the simulator's fma.rn.f32 fuses: with
    fractional data their last bits differ. A simulator is a target that may round otherwise:
    CLOSE in float32 (read from saxpy's PTX), exit 0, stated in one line; --exact: exit 1."""
    d, snap = frac

    def sim(*more):
        return subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snap), "--sim", "gpgpu-sim",
                               "--sim-path", SIM, *more], capture_output=True, text=True, timeout=300)
    rp = sim()
    assert rp.returncode == 0, rp.stdout + rp.stderr
    assert "numerics: CLOSE within torch.testing's per-type tolerance passes (a simulator)" in rp.stdout
    assert "D2H results: 5 EXACT, 1 CLOSE, 0 DIFFERENT" in rp.stdout, rp.stdout
    m = re.search(r"CLOSE: call #\d+ cuMemcpyDtoH_v2 \(last written by #\d+ saxpy\): float32 \(the PTX of saxpy: "
                  r"global stores of f32\): (\d+) of 4096 elements differ, max abs \S+, max rel (\S+), max 1 ULP", rp.stdout)
    assert m and 0 < int(m.group(1)) < N and float(m.group(2)) < 1.3e-6, rp.stdout
    assert "recheck" not in rp.stdout                   # a simulator is deterministic: not replayed twice
    ex = sim("--exact")
    assert ex.returncode == 1 and "DIFFERENT: call #" in ex.stdout and "but bit-exact applies here" in ex.stdout, ex.stdout
