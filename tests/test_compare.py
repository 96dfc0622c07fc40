"""compare, bisect and replay --replace on the CUDA test double.

The double's kernels are host functions timed by CUDA events that read the host clock;
CUDA_DOUBLE_SLOW gives every kernel a steady floor (`*:1`) and slows a named one by a factor.
The host is shared, so SAME checks use a threshold above its scheduling noise (the verdict
logic itself is checked exactly in the unit tests below)."""
from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from cudasnap.compare.core import SAME, SLOWER, FASTER, compare, verdict, weighted_median
from synth import Synth
from double.fixtures import VIRTUAL_CLOCK as VIRTUAL

STEADY = {"CUDA_DOUBLE_SLOW": "*:1", "CUDA_DOUBLE_SLOW_FLOOR_US": "2000", **VIRTUAL}
SLOW_FILL = {"CUDA_DOUBLE_SLOW": "*:1,fill:2", "CUDA_DOUBLE_SLOW_FLOOR_US": "2000", **VIRTUAL}


# the module as PTX: add_one stores floats, so its results are judged as float32
THREE_PTX = b"""
.version 8.0
.target sm_80
.address_size 64
.visible .entry incr(.param .u64 incr_param_0, .param .u32 incr_param_1) { st.global.u32 [%rd1], %r1; ret; }
.visible .entry fill(.param .u64 fill_param_0, .param .u32 fill_param_1, .param .u32 fill_param_2)
{ st.global.u32 [%rd1], %r1; ret; }
.visible .entry add_one(.param .u64 add_one_param_0, .param .u32 add_one_param_1)
{ ld.global.f32 %f1, [%rd1]; add.f32 %f2, %f1, 0f3F800000; st.global.f32 [%rd1], %f2; ret; }
"""


def three_kernels(path, n=64, reps=3, image=None):
    """fill, incr and add_one launched `reps` times each; every result checked by a D2H. image:
    the module as PTX (synth.double_prologue)."""
    s = Synth(path)
    ctx, mod = 0x55550000, 0x55560000
    f_incr, f_fill, f_add = 0x55570005, 0x55570002, 0x55570001
    s.w.write({"k": "proc", "driver_version": 13000,
               "gpus": [{"index": 0, "name": "cudasnap test double", "uuid": "GPU-0", "cc": [9, 0], "mem": 1 << 36}]})
    s.double_prologue("incr", f_incr, [[0, 8], [8, 4]], ctx, mod, image=image)
    s.call("cuModuleGetFunction", {"hfunc": f_fill, "hmod": mod, "name": "fill"})
    s.fn(f_fill, "fill", mod, [[0, 8], [8, 4], [12, 4]])
    s.call("cuModuleGetFunction", {"hfunc": f_add, "hmod": mod, "name": "add_one"})
    s.fn(f_add, "add_one", mod, [[0, 8], [8, 4]])
    I, F, A = 0x200000000000, 0x200000001000, 0x200000002000
    for p in (I, F, A):
        s.call("cuMemAlloc_v2", {"dptr": p, "bytesize": n * 4})
    for p in (I, A):
        s.call("cuMemcpyHtoD_v2", {"dstDevice": p, "srcHost": 0x7F0000100000, "ByteCount": n * 4},
               x={"srcHost": s.blob(bytes(n * 4))})
    for r in range(reps):
        s.launch(f_fill, struct.pack("<QIi", F, 7 + r, n), block=n)
        s.launch(f_incr, struct.pack("<Qi", I, n), block=n)
        s.launch(f_add, struct.pack("<Qi", A, n), block=n)
    s.call("cuCtxSynchronize", {})
    for p, data in ((I, struct.pack(f"<{n}i", *([reps] * n))), (F, struct.pack(f"<{n}I", *([6 + reps] * n))),
                    (A, struct.pack(f"<{n}f", *([float(reps)] * n)))):
        s.call("cuMemcpyDtoH_v2", {"dstHost": 0x7F0000200000, "srcDevice": p, "ByteCount": n * 4},
               x={"dstHost": s.blob(data)})
    for p in (I, F, A):
        s.call("cuMemFree_v2", {"dptr": p})
    s.call("cuDevicePrimaryCtxRelease_v2", {"dev": 0})
    s.w.write({"k": "end", "exit": 0, "signal": None, "partial": False})
    s.close()
    return path


def _cli(double, *args, env=None, timeout=180):
    e = dict(double["env"])
    e.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "cudasnap", *map(str, args)], env=e, capture_output=True,
                          text=True, timeout=timeout)


def _profile(double, snap, out, env, mode="isolated"):
    args = ["replay", snap, "--profile", mode, "--out", out, "-q"]
    if mode == "isolated":
        args += ["--repeat", "5", "--warmup", "1"]
    cp = _cli(double, *args, env=env)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    return out


@pytest.fixture(scope="module")
def profiles(double, tmp_path_factory):
    d = tmp_path_factory.mktemp("cmp")
    snap = three_kernels(d / "three.cusnap")
    return {"snap": snap, "dir": d,
            "a": _profile(double, snap, d / "a.json", STEADY),
            "b": _profile(double, snap, d / "b.json", STEADY),
            "slow": _profile(double, snap, d / "slow.json", SLOW_FILL),
            "tl": _profile(double, snap, d / "tl.json", STEADY, mode="timeline")}


# --------------------------------------------------------------------------- profile facts
def test_profile_json_carries_run_facts(profiles):
    run = json.loads(Path(profiles["a"]).read_text())["run"]
    assert run["gpu"]["name"] == "cudasnap test double" and run["gpu"]["cc"] == [9, 0]
    assert run["driver_version"] == 13000 and run["cuda_version"] == "13.0"
    assert len(run["snapshot_id"]) == 32 and run["snapshot"].endswith("three.cusnap")
    assert run["captured"]["gpus"][0]["name"] == "cudasnap test double"
    assert run["profile"]["mode"] == "isolated" and run["profile"]["repeat"] == 5
    assert run["command"].startswith("cudasnap replay ") and "--profile isolated" in run["command"]
    assert run["env"]["CUDA_DOUBLE_SLOW"] == "*:1" and run["exit_code"] == 0
    assert run["libcuda"] and run["libcuda"].endswith("libcuda.so.1")


# --------------------------------------------------------------------------- compare
def test_compare_same_snapshot_twice_is_same(double, profiles):
    cp = _cli(double, "compare", profiles["a"], profiles["b"], "--threshold", "15")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "SLOWER" not in cp.stdout and "OK: no significant difference" in cp.stdout
    cp = _cli(double, "compare", profiles["a"], profiles["b"], "--threshold", "15", "--json")
    res = json.loads(cp.stdout)
    assert {k["name"] for k in res["kernels"]} == {"fill", "incr", "add_one"}
    assert all(k["verdict"] == SAME and k["paired"] for k in res["kernels"])
    assert res["total"]["verdict"] == SAME and res["exit_code"] == 0
    assert len(res["launches"]) == 9 and all(r["base_noise_pct"] is not None for r in res["launches"])


def test_compare_one_kernel_slowed(double, profiles, tmp_path):
    html = tmp_path / "r.html"
    cp = _cli(double, "compare", profiles["a"], profiles["slow"], "--threshold", "15", "--html", html)
    assert cp.returncode == 1, cp.stdout + cp.stderr
    lines = [ln for ln in cp.stdout.splitlines() if ln.startswith(("fill ", "incr ", "add_one "))]
    assert len(lines) == 3
    verdicts = {ln.split()[0]: ln.split()[-1] for ln in lines}
    assert verdicts == {"fill": SLOWER, "incr": SAME, "add_one": SAME}, cp.stdout
    assert "REGRESSION: 1 kernel(s) SLOWER: fill" in cp.stdout
    res = json.loads(_cli(double, "compare", profiles["a"], profiles["slow"], "--threshold", "15", "--json").stdout)
    fill = next(k for k in res["kernels"] if k["name"] == "fill")
    assert 1.7 < fill["ratio"] < 2.3 and res["slower"] == ["fill"]
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "plotly" in page.lower() and len(page) > 1_000_000  # js embedded
    for text in ("Top regressions", "fill", "cudasnap test double", "CUDA_DOUBLE_SLOW=*:1,fill:2",
                 "cudasnap replay ", "cudasnap compare "):
        assert text in page, text


def test_compare_refuses_runs_that_differ(double, profiles, tmp_path):
    cp = _cli(double, "compare", profiles["a"], profiles["tl"])
    assert cp.returncode == 2 and cp.stdout == ""
    err = cp.stderr.strip().splitlines()
    assert len(err) == 1 and "profile modes differ (isolated vs timeline)" in err[0] and "--force" in err[0]
    d = json.loads(Path(profiles["b"]).read_text())
    d["run"]["gpu"]["name"] = "NVIDIA H200"
    d["run"]["snapshot_id"] = "0" * 32
    other = tmp_path / "other.json"
    other.write_text(json.dumps(d))
    cp = _cli(double, "compare", profiles["a"], other)
    assert cp.returncode == 2 and "GPUs differ" in cp.stderr and "snapshots differ" in cp.stderr
    cp = _cli(double, "compare", profiles["a"], other, "--force", "--threshold", "15", "--json")
    assert cp.returncode in (0, 1), cp.stderr
    res = json.loads(cp.stdout)
    assert res["forced"] and any("GPUs differ" in x for x in res["differences"])
    cp = _cli(double, "compare", profiles["a"], other, "--force", "--threshold", "15")
    assert "WARNING: " in cp.stdout and "compared anyway (--force)" in cp.stdout
    for bad, msg in ((tmp_path / "none.json", "no such file"), (Path(profiles["dir"]) / "three.cusnap", "not a profile")):
        cp = _cli(double, "compare", profiles["a"], bad)
        assert cp.returncode == 2 and msg in cp.stderr


def test_compare_timeline_profiles(double, profiles, tmp_path):
    slow = _profile(double, profiles["snap"], tmp_path / "tl_slow.json", SLOW_FILL, mode="timeline")
    res = json.loads(_cli(double, "compare", profiles["tl"], slow, "--threshold", "15", "--json").stdout)
    v = {k["name"]: k["verdict"] for k in res["kernels"]}
    assert v["fill"] == SLOWER and v["incr"] != SLOWER and v["add_one"] != SLOWER
    assert res["exit_code"] == 1


# --------------------------------------------------------------------------- verdict logic
def _prof(times, mode="isolated", name="k", noise_key=True):
    launches = []
    for i, ts in enumerate(times):
        r = {"seq": 10 + i, "index": i, "name": name}
        if mode == "isolated":
            r.update(times_us=ts, median_us=sorted(ts)[len(ts) // 2])
        else:
            r["time_us"] = ts
        launches.append(r)
    return {"summary": {"mode": mode}, "kernels": [], "launches": launches,
            "run": {"snapshot_id": "s", "gpu": {"name": "G"}}, "_path": "x.json"}


def test_verdict_needs_both_threshold_and_noise():
    assert verdict(1.04, 1.0, 5.0)[0] == SAME                # within the threshold
    assert verdict(1.10, 1.0, 5.0)[0] == SLOWER
    assert verdict(0.90, 1.0, 5.0)[0] == FASTER
    v, why = verdict(1.10, 12.0, 5.0)                        # beyond the threshold, within the noise
    assert v == SAME and "noise" in why
    v, why = verdict(1.10, None, 5.0)                        # one sample each: the threshold alone
    assert v == SLOWER and "noise unknown" in why
    assert verdict(1.02, 0.1, 0.0)[0] == SLOWER              # threshold 0: the noise alone bounds SAME


def test_compare_statistics():
    steady = [[100.0, 101.0, 99.0, 100.5, 99.5]] * 4
    res = compare(_prof(steady), _prof([[t * 1.2 for t in ts] for ts in steady]), threshold=5)
    k = res["kernels"][0]
    assert k["verdict"] == SLOWER and abs(k["ratio"] - 1.2) < 1e-9 and res["exit_code"] == 1
    # noisy repeats (+-30%): a 20% difference is inside the combined noise
    noisy = [[70.0, 100.0, 130.0, 85.0, 115.0]] * 4
    res = compare(_prof(noisy), _prof([[t * 1.2 for t in ts] for ts in noisy]), threshold=5)
    assert res["kernels"][0]["verdict"] == SAME and res["exit_code"] == 0
    # one launch disturbed in the candidate does not decide the kernel
    cand = [list(ts) for ts in steady]
    cand[0] = [t * 5 for t in cand[0]]
    res = compare(_prof(steady), _prof(cand), threshold=5)
    assert res["kernels"][0]["verdict"] == SAME
    # timeline: ratio from the launches' ratios, noise from their spread
    base = _prof([100.0, 200.0, 300.0, 400.0], mode="timeline")
    res = compare(base, _prof([150.0, 300.0, 450.0, 600.0], mode="timeline"), threshold=5)
    assert res["kernels"][0]["verdict"] == SLOWER and abs(res["kernels"][0]["ratio"] - 1.5) < 1e-9
    # launches that do not pair up (other calls of the snapshot): medians compared
    other = _prof([250.0, 250.0], mode="timeline")
    for r in other["launches"]:
        r["seq"] += 100
    res = compare(base, other, threshold=5)
    assert res["kernels"][0]["paired"] is False and any("do not pair up" in n for n in res["notes"])


def test_short_kernel_floor_and_collectives():
    """Two replays of one snapshot moved 1 us kernels by 0.1 us (11%) on an H200, and a NCCL
    kernel's time by 21% (it waits for the other rank): neither is a regression."""
    base = _prof([0.9] * 5, mode="timeline", name="loop_multiply_fusion")
    res = compare(base, _prof([1.0] * 5, mode="timeline", name="loop_multiply_fusion"), threshold=5)
    k = res["kernels"][0]
    assert k["verdict"] == SAME and "floor" in k["why"] and res["exit_code"] == 0
    res = compare(base, _prof([1.0] * 5, mode="timeline", name="loop_multiply_fusion"), threshold=5, min_diff_us=0)
    assert res["kernels"][0]["verdict"] == SLOWER
    # a real slowdown of a short kernel passes the floor
    res = compare(base, _prof([1.8] * 5, mode="timeline", name="loop_multiply_fusion"), threshold=5)
    assert res["kernels"][0]["verdict"] == SLOWER and res["exit_code"] == 1
    nccl = "_Z31ncclDevKernel_Broadcast_RING_LL24ncclDevKernelArgsStorageILm4096EE"
    res = compare(_prof([20.0] * 4, mode="timeline", name=nccl), _prof([24.2] * 4, mode="timeline", name=nccl))
    assert res["kernels"][0]["verdict"] == SAME and res["exit_code"] == 0
    assert any("collective" in n for n in res["notes"])
    res = compare(_prof([20.0] * 4, mode="timeline", name=nccl), _prof([24.2] * 4, mode="timeline", name=nccl),
                  judge_collectives=True)
    assert res["kernels"][0]["verdict"] == SLOWER


@pytest.mark.parametrize("steady, once, same, slow, why", [
    # a cuRAND kernel launched once moved 5.7% (16.4 -> 17.3 us) where kernels of its duration
    # moved under 1%: one sample against one is judged at twice the bar
    ([16.0 + (i % 8) * 0.01 for i in range(80)], 16.4, 17.3, 20.0, "one launch in each run"),
    # a 1.4 us cuRAND kernel launched once took 1.8 us while the launches around it kept their
    # ratios at 1.000 (their noise reads +-0.2%): one sample meets twice the per-launch floor
    ([1.4] * 60 + [2.7] * 60, 1.4, 1.8, 2.4, "0.6 us floor"),
], ids=["bar", "floor"])
def test_a_kernel_launched_once_is_judged_at_twice_the_bar_and_floor(steady, once, same, slow, why):
    """Two timeline replays of one snapshot on an H200 (cases above); a real slowdown of a
    once-launched kernel is still SLOWER."""
    def run(once_us):
        p = _prof(steady, mode="timeline", name="steady")
        p["launches"].append({"seq": 500, "index": len(steady), "name": "once", "time_us": once_us})
        return p
    res = compare(run(once), run(same), threshold=5)
    k = next(k for k in res["kernels"] if k["name"] == "once")
    assert k["verdict"] == SAME and why in k["why"] and res["exit_code"] == 0, k
    res = compare(run(once), run(slow), threshold=5)
    k = next(k for k in res["kernels"] if k["name"] == "once")
    assert k["verdict"] == SLOWER and res["exit_code"] == 1, k


def test_weighted_median():
    assert weighted_median([(1, 1), (2, 1), (3, 1)]) == 2
    assert weighted_median([(1, 1), (2, 1)]) == 1.5
    assert weighted_median([(1, 10), (5, 1), (6, 1)]) == 1
    assert weighted_median([(1, 1), (5, 5), (6, 1)]) == 5


# --------------------------------------------------------------------------- bisect
def _envs_toml(path, double, names, slow_from, driver=True):
    lib = Path(double["libdir"]) / "libcuda.so.1"
    parts = []
    for i, name in enumerate(names):
        v = SLOW_FILL if i + 1 >= slow_from else STEADY
        vars_ = ", ".join(f'{k} = "{x}"' for k, x in v.items())
        parts.append(f'[[env]]\nname = "{name}"\n' + (f'driver = "{lib}"\n' if driver else "") + f"vars = {{ {vars_} }}\n")
    path.write_text("\n".join(parts))
    return path


def _no_double_on_path(double):
    """The double's env without its libdir on LD_LIBRARY_PATH: each env's driver= supplies it."""
    e = dict(double["env"])
    e["LD_LIBRARY_PATH"] = ":".join(p for p in e.get("LD_LIBRARY_PATH", "").split(":") if p and p != double["libdir"])
    return e


def test_bisect_names_the_first_slow_environment(double, profiles, tmp_path):
    names = ["r1", "r2", "r3", "r4", "r5", "r6"]
    envs = _envs_toml(tmp_path / "envs.toml", double, names, slow_from=4)
    html, keep = tmp_path / "bisect.html", tmp_path / "keep"
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "bisect", str(profiles["snap"]), "--envs", str(envs),
                         "--repeat", "5", "--warmup", "1", "--threshold", "15", "--json", "--html", str(html),
                         "--keep", str(keep)], env=_no_double_on_path(double), capture_output=True, text=True,
                        timeout=300)
    assert cp.returncode == 1, cp.stdout + cp.stderr     # a regression, as compare exits
    res = json.loads(cp.stdout)
    assert res["first_bad"]["name"] == "r4" and res["last_good"]["name"] == "r3"
    assert res["kind"] == "timing regression"
    assert [k["name"] for k in res["regressed_kernels"]] == ["fill"]
    assert 1.7 < res["regressed_kernels"][0]["ratio"] < 2.3
    assert res["replays"] <= math.ceil(math.log2(len(names))) + 2
    tested = [e for e in res["envs"] if e["tested"]]
    assert len(tested) == res["replays"] and tested[0]["name"] == "r1"
    # every replay verified and loaded the environment's driver
    for e in tested:
        assert e["replay_exit"] == 0 and e["facts"]["libcuda"].startswith(double["libdir"])
    assert len(list(keep.glob("env*.json"))) == res["replays"]
    page = html.read_text()
    for text in ("first bad environment: &#x27;r4&#x27;", "Top regressions", "CUDA_DOUBLE_SLOW=*:1,fill:2",
                 "cudasnap replay", "plotly"):
        assert text in page, text
    # the terminal form names it too, with the statistics table
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "bisect", str(profiles["snap"]), "--envs", str(envs),
                         "--repeat", "5", "--warmup", "1", "--threshold", "15"], env=_no_double_on_path(double),
                        capture_output=True, text=True, timeout=300)
    assert cp.returncode == 1, cp.stdout + cp.stderr     # a regression, as compare exits
    assert "first bad environment: 'r4' (4 of 6)" in cp.stdout and "fill" in cp.stdout


def test_bisect_without_regression_exits_0(double, profiles, tmp_path):
    envs = _envs_toml(tmp_path / "envs.toml", double, ["a", "b", "c"], slow_from=99)
    cp = _cli(double, "bisect", profiles["snap"], "--envs", envs,       # --repeat/--warmup: isolated only
              "--threshold", "15", "--profile", "timeline")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "no regression between 'a' and 'c'" in cp.stdout and "replays: 2 of 3" in cp.stdout


def test_bisect_errors_are_one_line(double, profiles, tmp_path):
    bad = tmp_path / "bad.toml"
    for text, msg in (('[[env]]\nvars = {}\n', "needs a name"),
                      ('[[env]]\nname = "a"\n', "at least two environments"),
                      ('[[env]]\nname = "a"\ndriver = "/nonexistent/libcuda.so.1"\n[[env]]\nname = "b"\n', "no such file"),
                      ('[[env]]\nname = "a"\ncolour = 1\n[[env]]\nname = "b"\n', "unknown key"),
                      ('[[env]\n', "not valid TOML")):
        bad.write_text(text)
        cp = _cli(double, "bisect", profiles["snap"], "--envs", bad)
        assert cp.returncode == 2 and msg in cp.stderr and len(cp.stderr.strip().splitlines()) == 1, (text, cp.stderr)
    # a first environment whose replay cannot run stops the bisection
    bad.write_text('[[env]]\nname = "a"\nvars = { CUDASNAP_REPLACE = "nosuch=x" }\n[[env]]\nname = "b"\n')
    (tmp_path / "x").write_text("CUDADOUBLE\n")
    cp = _cli(double, "bisect", profiles["snap"], "--envs", bad)
    assert cp.returncode == 2 and "the first environment 'a' must be good" in cp.stderr


# --------------------------------------------------------------------------- replay --replace
def _mismatched_snapshot(path):
    """incr recorded as if built with (int*, long): an 8-byte second parameter."""
    s = Synth(path)
    f = 0x55570005
    s.double_prologue("incr", f, [[0, 8], [8, 8]])
    s.call("cuMemAlloc_v2", {"dptr": 0x200000000000, "bytesize": 64})
    s.launch(f, struct.pack("<Qq", 0x200000000000, 16), block=16)
    s.call("cuCtxSynchronize", {})
    s.call("cuDevicePrimaryCtxRelease_v2", {"dev": 0})
    s.close()
    return path


def test_replace_refuses_a_mismatched_parameter_layout(double, tmp_path):
    snap = _mismatched_snapshot(tmp_path / "m.cusnap")
    img = tmp_path / "incr.cudadouble"
    img.write_text("CUDADOUBLE\nkernel incr\n")
    assert _cli(double, "replay", snap, "-q").returncode == 0
    for spec in (f"incr={img}", f"module:incr={img}", f"0x55560000={img}"):
        cp = _cli(double, "replay", snap, "-q", "--replace", spec)
        assert cp.returncode == 2, cp.stdout + cp.stderr
        assert "parameter layout of kernel incr differs: recorded 2 parameter(s) [0:8, 8:8], " \
               "the new image has 2 [0:8, 8:4]" in cp.stderr, cp.stderr
    cp = _cli(double, "replay", snap, "-q", env={"CUDASNAP_REPLACE": f"incr={img}"})
    assert cp.returncode == 2 and "parameter layout of kernel incr differs" in cp.stderr


def test_replace_swaps_kernels_and_modules(double, profiles, tmp_path):
    snap = profiles["snap"]
    img = tmp_path / "new.cudadouble"
    img.write_text("CUDADOUBLE\nkernel fill\nkernel incr\nkernel add_one\n")
    cp = _cli(double, "replay", snap, "--replace", f"fill={img}")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert f"--replace: kernel fill from {img}; its parameter layout matches the recording" in cp.stdout
    cp = _cli(double, "replay", snap, "--replace", f"module:incr={img}")
    assert cp.returncode == 0 and "module 0x55560000 loaded from" in cp.stdout, cp.stdout + cp.stderr
    # a module image without one of the recorded kernels, an unknown kernel, a missing file
    part = tmp_path / "part.cudadouble"
    part.write_text("CUDADOUBLE\nkernel fill\n")
    for spec, msg in ((f"module:fill={part}", "the new image has no kernel"),
                      (f"nosuch={img}", "no recorded kernel of that name (recorded kernels: add_one, fill, incr)"),
                      (f"fill={tmp_path / 'missing'}", "no such file"),
                      ("fill", "expected KERNEL=FILE")):
        cp = _cli(double, "replay", snap, "-q", "--replace", spec)
        assert cp.returncode == 2 and msg in cp.stderr, (spec, cp.stderr)
    # the profile says what was replaced (environment and option)
    out = tmp_path / "p.json"
    cp = _cli(double, "replay", snap, "--profile", "timeline", "--out", out, "-q", "--replace", f"fill={img}",
              env={"CUDASNAP_REPLACE": f"incr={img}"})
    assert cp.returncode == 0, cp.stderr
    assert json.loads(out.read_text())["run"]["replace"] == [f"incr={img}", f"fill={img}"]


def _library_snapshot(path, layout):
    """The CUDA 12+ runtime's way: cuLibraryLoadData, cuLibraryGetKernel, launches of the CUkernel
    (its fn record: kind kernel, no module)."""
    s = Synth(path)
    ctx, lib, k = 0x55550000, 0x55580000, 0x55590001
    s.call("cuInit", {"Flags": 0})
    s.call("cuDeviceGet", {"device": 0, "ordinal": 0})
    s.call("cuDevicePrimaryCtxRetain", {"pctx": ctx, "dev": 0})
    s.call("cuCtxSetCurrent", {"ctx": ctx})
    s.call("cuLibraryLoadData", {"library": lib, "code": 0x7F0000001000, "numJitOptions": 0,
                                 "numLibraryOptions": 0}, x={"image": s.blob(b"CUDADOUBLE\nkernel incr\nkernel fill\n\0")})
    s.call("cuLibraryGetKernel", {"pKernel": k, "library": lib, "name": "incr"})
    s.fn(k, "incr", 0, layout, kind="kernel")
    D = 0x200000000000
    s.call("cuMemAlloc_v2", {"dptr": D, "bytesize": 64})
    s.call("cuMemsetD32_v2", {"dstDevice": D, "ui": 0, "N": 16})
    s.launch(k, struct.pack("<Qi", D, 16), block=16)
    s.call("cuCtxSynchronize", {})
    s.call("cuMemcpyDtoH_v2", {"dstHost": 0x7F0000200000, "srcDevice": D, "ByteCount": 64},
           x={"dstHost": s.blob(struct.pack("<16i", *([1] * 16)))})
    s.call("cuDevicePrimaryCtxRelease_v2", {"dev": 0})
    s.close()
    return path


def test_replace_library_kernels(double, tmp_path):
    img = tmp_path / "lib.cudadouble"
    img.write_text("CUDADOUBLE\nkernel incr\nkernel fill\n")
    ok = _library_snapshot(tmp_path / "lib.cusnap", [[0, 8], [8, 4]])
    for spec in (f"incr={img}", f"module:incr={img}", f"0x55580000={img}"):
        cp = _cli(double, "replay", ok, "--replace", spec)
        assert cp.returncode == 0 and "--replace" in cp.stdout, (spec, cp.stdout + cp.stderr)
    bad = _library_snapshot(tmp_path / "bad.cusnap", [[0, 8], [8, 4], [12, 4]])
    for spec in (f"incr={img}", f"module:incr={img}"):
        cp = _cli(double, "replay", bad, "-q", "--replace", spec)
        assert cp.returncode == 2 and "recorded 3 parameter(s) [0:8, 8:4, 12:4], the new image has 2" in cp.stderr, \
            (spec, cp.stderr)


def test_bisect_search_and_correctness_breaks(tmp_path):
    """The search itself, with replays stood in for: every first-bad position of 2..12
    environments is found within ceil(log2 n) + 2 replays; a replay that stops reproducing the
    results (exit 1) is a correctness break, not a timing verdict."""
    from cudasnap.campaign.bisect import Bisector, Env, Outcome

    class Fake(Bisector):
        def __init__(self, n, bad_from, kind="slower"):
            super().__init__(tmp_path / "x.cusnap", [Env(i, f"e{i + 1}") for i in range(n)], workdir=str(tmp_path))
            self.bad_from, self.kind = bad_from, kind

        def run_env(self, i):
            if i in self.done:
                return self.done[i]
            bad = i >= self.bad_from
            o = Outcome(self.envs[i], len(self.done) + 1, 1 if bad and self.kind == "correctness" else 0, 0.1,
                        f"p{i}.json", "cmd")
            steady = [[100.0, 101.0, 99.0, 100.5, 99.5]] * 3
            o.profile = _prof([[t * (2 if bad and self.kind == "slower" else 1) for t in ts] for ts in steady])
            if o.rc == 1:
                o.status, o.reason = "correctness", "the replay no longer reproduces the recorded results"
            self.done[i] = o
            return o

    for n in range(2, 13):
        for k in range(1, n):
            res = Fake(n, k).run()
            assert res["first_bad"]["index"] == k and res["last_good"]["index"] == k - 1, (n, k)
            assert res["replays"] <= math.ceil(math.log2(n)) + 2 and res["replays"] <= res["max_replays"], (n, k)
            assert res["rounds"] == res["replays"] and res["gpus"] == 1, (n, k)    # one replay a round
            assert res["kind"] == "timing regression" and res["regressed_kernels"][0]["name"] == "k"
    res = Fake(6, 3, kind="correctness").run()
    assert res["first_bad"]["name"] == "e4" and res["kind"] == "correctness break" and "regressed_kernels" not in res
    assert res["exit_code"] == 1                # a regression, as compare exits
    res = Fake(5, 99).run()
    assert res["exit_code"] == 0 and "first_bad" not in res and res["replays"] == 2


def test_a_replay_that_ran_fewer_launches_pairs_the_ones_both_ran():
    """The candidate stopped early: its kernel ran its first 12 launches, all slow ones of the
    base's warm-up shape. Medians of different launches would call it 1.5x SLOWER; the 12 launches
    both ran pair up and are the same."""
    base = _prof([30.0] * 4 + [20.0] * 36, mode="timeline")
    cand = _prof([30.0] * 4 + [20.0] * 8, mode="timeline")
    res = compare(base, cand, threshold=5.0)
    k = res["kernels"][0]
    assert k["paired"] and k["paired_launches"] == 12 and k["verdict"] == SAME, k
    assert any("compared on the launches both replays ran" in n for n in res["notes"])
    other = dict(cand, run={"snapshot_id": "t", "gpu": {"name": "G"}})     # another snapshot: no pairing
    k = compare(base, other, threshold=5.0, force=True)["kernels"][0]
    assert not k["paired"] and "paired_launches" not in k


def test_timeline_kernels_run_once_borrow_the_noise_of_similar_launches():
    """Two timeline replays of one snapshot: short kernels run once jitter well past the
    threshold; judged alone they would read as regressions. A kernel with few launches takes the
    noise of paired launches of similar duration, so jitter is SAME and a real slowdown is not."""
    import random
    rnd = random.Random(7)

    def prof(rows, mode="timeline"):
        return {"summary": {"mode": mode}, "kernels": [], "launches": rows,
                "run": {"snapshot_id": "s", "gpu": {"name": "G"}}, "_path": "x.json"}
    base, cand = [], []
    for i in range(40):                         # 40 single-launch kernels of 2-4 us, +-15% jitter
        t = 2.0 + (i % 3)
        base.append({"seq": i, "index": i, "name": f"k{i}", "time_us": t * (1 + rnd.uniform(-0.15, 0.15))})
        cand.append({"seq": i, "index": i, "name": f"k{i}", "time_us": t * (1 + rnd.uniform(-0.15, 0.15))})
    base.append({"seq": 100, "index": 100, "name": "jitter", "time_us": 2.5})
    cand.append({"seq": 100, "index": 100, "name": "jitter", "time_us": 2.5 * 1.2})
    base.append({"seq": 101, "index": 101, "name": "slowed", "time_us": 3.0})
    cand.append({"seq": 101, "index": 101, "name": "slowed", "time_us": 3.0 * 2.5})
    res = compare(prof(base), prof(cand), threshold=5)
    by = {k["name"]: k for k in res["kernels"]}
    assert by["jitter"]["verdict"] == SAME and "similar duration" in by["jitter"]["noise_from"], by["jitter"]
    assert by["slowed"]["verdict"] == SLOWER, by["slowed"]
    assert [k["name"] for k in res["kernels"] if k["verdict"] == SLOWER] == ["slowed"]


def test_bisect_k_ary_only_where_it_pays(tmp_path):
    """--gpus 4 without --address: the first replay's time decides. Fast replays: Ray's start
    (8 s) would cost more than the rounds saved, so the binary search runs here and Ray never
    starts; slow replays: the 4-ary search, in fewer rounds. The result says which and why."""
    from cudasnap.campaign.bisect import Bisector, Env, Outcome

    class Pool:
        slots = 4
        started = 0

        def run(self, jobs):
            return [(0, "", 0.0)] * len(jobs)

    class Fake(Bisector):
        def __init__(self, n, bad_from, replay_s):
            def start():
                Pool.started += 1
                return Pool()
            super().__init__(tmp_path / "x.cusnap", [Env(i, f"e{i + 1}") for i in range(n)], workdir=str(tmp_path),
                             gpus=4, start_pool=start)
            self.bad_from, self.replay_s = bad_from, replay_s

        def run_env(self, i):
            if i not in self.done:
                o = Outcome(self.envs[i], len(self.done) + 1, 0, self.replay_s, f"p{i}.json", "cmd")
                o.profile = _prof([[t * (2 if i >= self.bad_from else 1) for t in (100.0, 101.0, 99.0, 100.5, 99.5)]])
                self.done[i] = o
            return self.done[i]

    for bad in range(1, 8):
        Pool.started = 0
        res = Fake(8, bad, 0.5).run()
        assert res["first_bad"]["index"] == bad and Pool.started == 0, bad
        assert res["strategy"]["name"] == "binary" and "would not pay" in res["strategy"]["why"]
        assert res["gpus"] == 1 and res["rounds"] == res["replays"] <= 5
        res = Fake(8, bad, 20.0).run()
        assert res["first_bad"]["index"] == bad and Pool.started == 1, bad
        assert res["strategy"]["name"] == "4-ary" and "Ray's start" in res["strategy"]["why"]
        assert res["gpus"] == 4 and res["rounds"] <= 4, res["rounds"]      # binary: up to 5
    # the two ends alone: nothing to search, never worth Ray
    Pool.started = 0
    assert Fake(2, 1, 60.0).run()["strategy"]["name"] == "binary" and Pool.started == 0


def test_bisect_gpus_on_fast_replays_runs_the_plain_search(double, profiles, tmp_path):
    """8 environments, --gpus 4, no --address, replays of a second or two on the double: the
    binary search, here, without starting Ray (which has no GPU to give on this machine)."""
    names = [f"r{i}" for i in range(1, 9)]
    envs = _envs_toml(tmp_path / "envs.toml", double, names, slow_from=6)
    env = dict(_no_double_on_path(double), CUDASNAP_BISECT_RAY_START_S="600", CUDA_VISIBLE_DEVICES="0,1,2,3")
    keep = tmp_path / "keep"
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "bisect", str(profiles["snap"]), "--envs", str(envs),
                         "--repeat", "5", "--warmup", "1", "--threshold", "15", "--gpus", "4", "--keep", str(keep)],
                        env=env, capture_output=True, text=True, timeout=300)
    assert cp.returncode == 1, cp.stdout + cp.stderr
    assert "first bad environment: 'r6' (6 of 8)" in cp.stdout
    assert "search: binary (a replay takes" in cp.stdout and "would not pay" in cp.stdout
    # each replay saw one GPU, as it would on Ray (all four visible made every start slower)
    seen = {json.loads(p.read_text())["run"]["env"].get("CUDA_VISIBLE_DEVICES") for p in keep.glob("*.json")}
    assert seen == {"0"}, seen
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "bisect", str(profiles["snap"]), "--envs", str(envs),
                         "--gpus", "4"], env=dict(env, CUDASNAP_BISECT_RAY_START_S="nan"),
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 2 and "CUDASNAP_BISECT_RAY_START_S='nan'" in cp.stderr
