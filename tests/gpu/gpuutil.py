"""Helpers of the GPU suite (fixtures live in conftest.py)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORK = Path(os.environ.get("CUDASNAP_GPU_WORK", "/tmp/cudasnap-gpu"))


def have_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


def _build(src: Path, out: Path, cmd: list[str]) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        subprocess.run(cmd, check=True)
    return out


def cupti_counter() -> Path:
    out = WORK / "libcupti_counter.so"
    inc = ["-I/usr/local/cuda/include", "-I/usr/local/cuda/extras/CUPTI/include"]
    lib = ["-L/usr/local/cuda/lib64", "-L/usr/local/cuda/extras/CUPTI/lib64", "-l:libcupti.so.13"]
    return _build(HERE / "cupti_counter.c", out, ["gcc", "-shared", "-fPIC", "-O2", *inc, "-o", str(out), str(HERE / "cupti_counter.c"), *lib])


def ptrs_binary() -> Path:
    src = HERE / "workloads" / "ptrs.cu"
    out = WORK / "ptrs"
    return _build(src, out, ["nvcc", "-O2", "-cudart", "static", "-arch=sm_90", "-o", str(out), str(src)])


def record_result(row: dict) -> None:
    path = os.environ.get("CUDASNAP_GPU_RESULTS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


class Runner:
    def __init__(self, counter: Path, tmp: Path):
        self.counter = counter
        self.tmp = tmp

    def env(self, extra=None, count_file=None):
        env = dict(os.environ)
        env["CUDA_INJECTION64_PATH"] = str(self.counter)
        if count_file:
            env["CUPTI_COUNT_FILE"] = str(count_file)
        env.update(extra or {})
        return env

    def native(self, cmd, extra_env=None, timeout=600):
        cf = self.tmp / "native.count"
        cp = subprocess.run(cmd, env=self.env(extra_env, cf), capture_output=True, text=True, timeout=timeout)
        return cp, int(cf.read_text()) if cf.exists() else None

    def capture(self, cmd, out: Path, extra_env=None, timeout=600):
        cf = self.tmp / "capture.count"
        full = [sys.executable, "-m", "cudasnap", "capture", "-f", "-o", str(out), "--", *cmd]
        cp = subprocess.run(full, env=self.env(extra_env, cf), capture_output=True, text=True, timeout=timeout)
        return cp, int(cf.read_text()) if cf.exists() else None




def replay_snapshot(snap: Path, test: str, name: str) -> tuple[dict, dict, int]:
    """`cudasnap replay --json` of a snapshot: (result row, JSON result, exit code)."""
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snap), "--json", "--watchdog", "120"],
                        capture_output=True, text=True, timeout=600)
    try:
        res = json.loads(cp.stdout)
    except json.JSONDecodeError:
        res = {}
    row = {"test": test, "workload": name, "rc": cp.returncode,
           **{k: res.get(k) for k in ("placed", "fell_back", "d2h_verified", "d2h_bytes", "d2h_unverified", "launches",
                                      "calls", "total_calls", "elapsed_s", "message", "stopped_at", "params_relocated")},
           "fallbacks": (res.get("fallbacks") or [])[:5], "mismatches": (res.get("mismatch_text") or [])[:3],
           "errors": (res.get("errors") or [])[:5], "warnings": (res.get("warnings") or [])[:5],
           "stderr": cp.stderr[-1500:]}
    return row, res, cp.returncode
