"""GPU suite, capture: real programs captured on the GPU machine.

For each workload: output identical with and without capture, launches recorded equal
launches made (counted independently by CUPTI), no kernel with an unknown parameter
layout, every module captured."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from cudasnap.formats import SnapshotReader

from gpuutil import HERE, WORK, record_result

pytestmark = pytest.mark.gpu
PY = sys.executable
W = HERE / "workloads"
DETERMINISTIC = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "XLA_FLAGS": "--xla_gpu_deterministic_ops=true",
                 "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}

WORKLOADS = {
    "torch_eager": ([PY, str(W / "torch_eager.py")], {}),
    "torch_eager_vmm": ([PY, str(W / "torch_eager.py")], {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    "torch_eager_async": ([PY, str(W / "torch_eager.py")], {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}),
    "torch_compile": ([PY, str(W / "torch_compile.py")], {}),
    "triton_kernel": ([PY, str(W / "triton_kernel.py")], {}),
    "cupy": ([PY, str(W / "cupy_work.py")], {}),
    "jax_jit": ([PY, str(W / "jax_jit.py")], {}),
    "nvcc_ptrs": (None, {}),
    "torch_graph": ([PY, str(W / "torch_graph.py")], {}),
}

LOADS = ("cuModuleLoad", "cuLibraryLoad", "cuLinkAdd")


def check_snapshot(path: Path) -> dict:
    r = SnapshotReader(path)
    calls = [c for c in r.records() if c["k"] == "c"]
    fns = {f["h"]: f for f in r.records(kinds=["fn"])}
    launches = [c for c in calls if c["f"].startswith("cuLaunch") and "Host" not in c["f"]]
    no_params, unknown_fn = [], []
    for c in launches:
        h = c["a"].get("f")
        if "params" not in c.get("x", {}):
            no_params.append(c["s"])
        if h not in fns:
            unknown_fn.append(c["s"])
    modules = [c for c in calls if c["f"].startswith(LOADS) and c.get("r") == 0]
    missing_modules = [c["s"] for c in modules
                       if not any(isinstance(v, dict) and v.get("blob") for v in c.get("x", {}).values())]
    notes = [n["msg"] for n in r.records(kinds=["note"])]
    return {"calls": len(calls), "launches": len(launches), "no_params": no_params, "unknown_fn": unknown_fn,
            "modules": len(modules), "missing_modules": missing_modules, "notes": notes[:20],
            "truncated": r.truncated, "file_bytes": path.stat().st_size}


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_capture_workload(name, runner, ptrs_binary, tmp_path):
    cmd, env = WORKLOADS[name]
    if cmd is None:
        cmd = [str(ptrs_binary)]
    env = {**DETERMINISTIC, **env}
    nat, nat_count = runner.native(cmd, env)
    assert nat.returncode == 0, nat.stderr[-3000:]
    snap = WORK / "snaps" / f"{name}.cusnap"
    snap.parent.mkdir(parents=True, exist_ok=True)
    cap, cap_count = runner.capture(cmd, snap, env)
    info = check_snapshot(snap) if snap.exists() else {}
    row = {"test": "capture", "workload": name, "native_rc": nat.returncode, "capture_rc": cap.returncode,
           "output_identical": nat.stdout == cap.stdout, "cupti_launches_native": nat_count,
           "cupti_launches_capture": cap_count, **info, "summary": cap.stderr.strip().splitlines()[-3:]}
    record_result(row)
    assert cap.returncode == 0, cap.stderr[-3000:]
    assert nat.stdout == cap.stdout, (nat.stdout, cap.stdout)
    assert snap.exists()
    assert info["launches"] == cap_count, row
    assert not info["no_params"] and not info["unknown_fn"], row
    assert not info["missing_modules"], row
    assert not info["truncated"]
