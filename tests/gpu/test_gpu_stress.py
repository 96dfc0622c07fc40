"""GPU suite, stress: every workload captured N times back to back, then its last snapshot
replayed.

test_stress_capture[W]: one native run of W (exit code, stdout, CUPTI launch count), then N
captures (N = $CUDASNAP_STRESS_N, default 5). Each capture must: exit with the native exit code
and not die of a signal, print exactly the native stdout, hold as many launches as CUPTI counted
under capture, and leave a snapshot that opens, is not truncated, passes a full frame check and
names every launched kernel's parameters and every loaded module. All N runs happen before
anything is asserted; one row per workload (counts of crashes, timeouts, exit-code, stdout and
launch-count mismatches, unreadable/truncated/incomplete snapshots, times) goes to
$CUDASNAP_GPU_RESULTS.

test_stress_replay[W]: the last snapshot of W replayed (as test_gpu_replay.py does): exit 0,
0 fell back, D2H results verified, no mismatch.

Workloads: the capture suite's (test_gpu_capture.WORKLOADS) plus jax_train, torch_train_compile,
cupy_libs, torch_libs and mt_launch. Running it (bench/gpu_suite.sh leaves this file out unless
SUITE_FILES names it):

    SUITE_FILES=gpu/test_gpu_stress.py SKIP_BENCH=1 SKIP_EXAMPLE=1 SUITE_TIMEOUT=580 \
        bash bench/gpu_suite.sh "torch_eager or torch_graph or triton"               # ~5 min
    ... bash bench/gpu_suite.sh "torch_compile or torch_train_compile or torch_libs"    # ~6.5 min
    ... bash bench/gpu_suite.sh "jax or cupy or ptrs or mt_launch"                      # ~5.5 min
    CUDASNAP_STRESS_N=2 ... bash bench/gpu_suite.sh "stress_capture and torch_libs"

Tests run in workload order, capture[W] then replay[W]. The full run at N=5 is estimated at
about 16-17 minutes with warm caches (the estimate for the selected tests is printed first;
the first run on a fresh machine is slower: torch.compile/Triton, CuPy and driver JIT caches
are cold and XLA autotunes from scratch); the three -k groups above split it into runs of
5-7 minutes. $CUDASNAP_STRESS_TIMEOUT (default 300) bounds each run in seconds: a run past it
is killed with its process group and counted as a timeout."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from cudasnap.formats import SnapshotReader

import gpuutil
from gpuutil import HERE, WORK, record_result
from test_gpu_capture import DETERMINISTIC, WORKLOADS, check_snapshot

pytestmark = pytest.mark.gpu
PY = sys.executable
W = HERE / "workloads"
N = int(os.environ.get("CUDASNAP_STRESS_N", "5"))
RUN_TIMEOUT = int(os.environ.get("CUDASNAP_STRESS_TIMEOUT", "300"))
STRESS_DIR = WORK / "stress"

STRESS_WORKLOADS = {
    **WORKLOADS,
    # XLA autotuning on: XLA_FLAGS without --xla_gpu_deterministic_ops (which selects the first
    # candidate instead of timing them)
    "jax_train": ([PY, str(W / "jax_train.py")], {"XLA_FLAGS": "--xla_gpu_autotune_level=4"}),
    "torch_train_compile": ([PY, str(W / "torch_train_compile.py")], {}),
    "cupy_libs": ([PY, str(W / "cupy_libs.py")], {}),
    "torch_libs": ([PY, str(W / "torch_libs.py")], {}),
    "mt_launch": (None, {}),
}
# workloads that are nvcc programs: the fixture that builds each (cmd None above)
BINARIES = {"nvcc_ptrs": "ptrs_binary", "mt_launch": "mt_launch_binary"}

# Rough native wall time of each workload on the H100/H200 machine, seconds (interpreter start,
# imports and CUDA start-up included; compile caches warm). Only for the time estimate.
EST_NATIVE_S = {
    "torch_eager": 6, "torch_eager_vmm": 6, "torch_eager_async": 6, "torch_compile": 12, "triton_kernel": 5,
    "cupy": 3, "jax_jit": 5, "nvcc_ptrs": 1, "torch_graph": 5, "jax_train": 15, "torch_train_compile": 20,
    "cupy_libs": 6, "torch_libs": 10, "mt_launch": 1,
}
CAPTURE_FACTOR, CAPTURE_EXTRA_S = 1.3, 2.0     # capture: native time x factor + snapshot finishing
REPLAY_BASE_S, REPLAY_FACTOR = 3.0, 0.5


def est_capture_test(name: str) -> float:
    t = EST_NATIVE_S.get(name, 10)
    return t + N * (t * CAPTURE_FACTOR + CAPTURE_EXTRA_S)


def est_replay_test(name: str) -> float:
    return REPLAY_BASE_S + REPLAY_FACTOR * EST_NATIVE_S.get(name, 10)


def mt_launch_build() -> Path:
    src = W / "mt_launch.cu"
    out = WORK / "mt_launch"
    return gpuutil._build(src, out, ["nvcc", "-O2", "-std=c++17", "-cudart", "static", "-arch=sm_90",
                                     "-Xcompiler", "-pthread", "-o", str(out), str(src)])


@pytest.fixture(scope="session")
def mt_launch_binary() -> Path:
    return mt_launch_build()


def _say(config, msg: str) -> None:
    """A line on the terminal now (past pytest's output capture), else on captured stdout."""
    tr = config.pluginmanager.get_plugin("terminalreporter")
    capman = config.pluginmanager.get_plugin("capturemanager")
    if tr is None or capman is None:
        print(msg)
        return
    with capman.global_and_fixture_disabled():
        tr.write_line(msg)


@pytest.fixture(scope="module", autouse=True)
def _stress_plan(request):
    """Print the estimated time of the stress tests selected for this pytest run."""
    cap, rep = [], []
    for it in request.session.items:
        if getattr(it, "module", None) is not request.module or not hasattr(it, "callspec"):
            continue
        name = it.callspec.params.get("name")
        (cap if it.originalname == "test_stress_capture" else rep).append(name)
    total = sum(est_capture_test(n) for n in cap) + sum(est_replay_test(n) for n in rep)
    lines = [f"stress: N={N} captures per workload, per-run timeout {RUN_TIMEOUT} s; "
             f"{len(cap)} capture and {len(rep)} replay tests, estimated {total / 60:.1f} min"]
    for n in dict.fromkeys(cap + rep):
        lines.append(f"  {n:<22} native ~{EST_NATIVE_S.get(n, 10):>3} s"
                     + (f"  capture test ~{est_capture_test(n):>5.0f} s" if n in cap else "")
                     + (f"  replay test ~{est_replay_test(n):>4.0f} s" if n in rep else ""))
    _say(request.config, "\n".join(lines))
    yield


@dataclass
class Run:
    rc: int
    stdout: str
    stderr: str
    count: int | None
    seconds: float
    timed_out: bool


def run_counted(runner, cmd: list[str], count_file: Path, env: dict, timeout: float = RUN_TIMEOUT) -> Run:
    """Run cmd with the CUPTI counter injected (runner.env), in a new process session so a run past
    the timeout is killed with every process it started."""
    count_file.unlink(missing_ok=True)
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=runner.env(env, count_file), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    timed_out = False
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = p.communicate()
    secs = time.monotonic() - t0
    text = count_file.read_text().strip() if count_file.exists() else ""
    return Run(p.returncode, out, err, int(text) if text.isdigit() else None, secs, timed_out)


def crashed(rc: int, native_rc: int) -> bool:
    """Died of a signal: negative status from subprocess, or the shell-style 128+N."""
    return rc < 0 or (rc > 128 and rc != native_rc)


def check_snapshot_full(path: Path) -> dict:
    """check_snapshot (records, launches, modules, truncation) plus a check of every frame."""
    try:
        info = check_snapshot(path)
    except Exception as e:  # SnapshotError or anything the reader raises on a bad file
        return {"unreadable": f"{type(e).__name__}: {e}"[:300]}
    try:
        with SnapshotReader(path) as r:
            r.verify()
    except Exception as e:
        info["unreadable"] = f"verify: {type(e).__name__}: {e}"[:300]
    return info


def workload_cmd(name: str, request) -> tuple[list[str], dict]:
    cmd, env = STRESS_WORKLOADS[name]
    if cmd is None:
        cmd = [str(request.getfixturevalue(BINARIES[name]))]
    return cmd, {**DETERMINISTIC, **env}


def last_snapshot(name: str) -> Path:
    return STRESS_DIR / name / f"{name}.cusnap"


def first_diff(a: str, b: str) -> str:
    al, bl = a.splitlines(), b.splitlines()
    for i, (x, y) in enumerate(zip(al, bl)):
        if x != y:
            return f"line {i + 1}: native {x[:200]!r} capture {y[:200]!r}"
    return f"native {len(al)} lines, capture {len(bl)} lines"


@pytest.mark.parametrize("name", list(STRESS_WORKLOADS), scope="module")   # capture[W] then replay[W]
def test_stress_capture(name, runner, request, tmp_path):
    cmd, env = workload_cmd(name, request)
    nat = run_counted(runner, cmd, tmp_path / "native.count", env)
    assert not nat.timed_out, f"native run of {name} past {RUN_TIMEOUT} s"
    assert nat.rc == 0, nat.stderr[-3000:]
    counts = dict.fromkeys(("crashes", "timeouts", "rc_mismatches", "stdout_mismatches", "count_mismatches",
                            "no_count", "no_snapshot", "unreadable", "truncated", "incomplete"), 0)
    failures: list[str] = []
    per_run: list[dict] = []
    native_rerun_identical = None
    d = STRESS_DIR / name
    for i in range(N):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        snap = d / f"{name}.cusnap"
        full = [PY, "-m", "cudasnap", "capture", "-o", str(snap), "--", *cmd]
        cap = run_counted(runner, full, tmp_path / f"capture{i}.count", env)
        info = check_snapshot_full(snap) if snap.exists() else {}
        run = {"i": i, "rc": cap.rc, "s": round(cap.seconds, 2), "cupti": cap.count, "launches": info.get("launches"),
               "calls": info.get("calls"), "modules": info.get("modules"), "file_bytes": info.get("file_bytes"),
               "summary": cap.stderr.strip().splitlines()[-2:]}
        bad = []
        if cap.timed_out:
            counts["timeouts"] += 1
            bad.append(f"timed out after {RUN_TIMEOUT} s")
        elif crashed(cap.rc, nat.rc):
            counts["crashes"] += 1
            bad.append(f"crashed (status {cap.rc})")
        if cap.rc != nat.rc:
            counts["rc_mismatches"] += 1
            bad.append(f"exit {cap.rc} != native {nat.rc}: {cap.stderr[-500:]}")
        if cap.stdout != nat.stdout:
            counts["stdout_mismatches"] += 1
            bad.append("stdout differs: " + first_diff(nat.stdout, cap.stdout))
            if native_rerun_identical is None:   # is it the workload itself? one more native run, once
                again = run_counted(runner, cmd, tmp_path / "native2.count", env)
                native_rerun_identical = again.stdout == nat.stdout
        if cap.count is None:
            counts["no_count"] += 1
            bad.append("no CUPTI count under capture")
        if not snap.exists():
            counts["no_snapshot"] += 1
            bad.append("no snapshot")
        elif "unreadable" in info:
            counts["unreadable"] += 1
            bad.append("unreadable: " + info["unreadable"])
        else:
            if info["truncated"]:
                counts["truncated"] += 1
                bad.append("truncated")
            if cap.count is not None and info["launches"] != cap.count:
                counts["count_mismatches"] += 1
                bad.append(f"snapshot launches {info['launches']} != CUPTI {cap.count}")
            if info["no_params"] or info["unknown_fn"] or info["missing_modules"]:
                counts["incomplete"] += 1
                bad.append(f"launches without params {info['no_params'][:5]}, unknown functions "
                           f"{info['unknown_fn'][:5]}, modules without image {info['missing_modules'][:5]}")
        run["ok"] = not bad
        per_run.append(run)
        failures += [f"capture {i}: {b}" for b in bad]
    cap_s = [r["s"] for r in per_run]
    row = {"test": "stress_capture", "workload": name, "n": N, "native_rc": nat.rc, "native_s": round(nat.seconds, 2),
           "cupti_launches_native": nat.count, **counts, "failed_runs": sum(not r["ok"] for r in per_run),
           "native_rerun_identical": native_rerun_identical, "capture_s": cap_s,
           "est_s": round(est_capture_test(name)), "runs": per_run, "failures": failures[:10]}
    record_result(row)
    _say(request.config, f"stress {name}: native {nat.seconds:.1f} s, {N} captures {sum(cap_s):.1f} s "
                         f"(max {max(cap_s, default=0):.1f} s; estimated test {est_capture_test(name):.0f} s), "
                         f"{row['failed_runs']} of {N} runs failed")
    assert not failures, json.dumps({k: v for k, v in row.items() if k != "runs"}, indent=1, default=str)[:6000]


@pytest.mark.parametrize("name", list(STRESS_WORKLOADS), scope="module")   # capture[W] then replay[W]
def test_stress_replay(name, runner, request):
    snap = last_snapshot(name)
    if not snap.exists():   # the capture test was not run (or left nothing): capture once now
        cmd, env = workload_cmd(name, request)
        shutil.rmtree(snap.parent, ignore_errors=True)
        snap.parent.mkdir(parents=True)
        cap, _ = runner.capture(cmd, snap, env)
        assert cap.returncode == 0, cap.stderr[-2000:]
    t0 = time.monotonic()
    row, res, rc = gpuutil.replay_snapshot(snap, "stress_replay", name)
    row["s"] = round(time.monotonic() - t0, 2)
    record_result(row)
    _say(request.config, f"stress {name}: replay {row['s']:.1f} s (estimated {est_replay_test(name):.0f} s), "
                         f"rc {rc}, fell back {row['fell_back']}, D2H verified {row['d2h_verified']}")
    assert rc == 0, row
    assert res["fell_back"] == 0, row
    assert res["d2h_verified"] > 0 and not res["mismatches"], row
