"""GPU suite, command x workload matrix (tests/gpu/matrix.py): every command on every workload
of the stress set, each cell recorded to $CUDASNAP_GPU_RESULTS. bench/matrix_gpu.py runs the same
matrix over every GPU of the machine and prints it as a table."""
from __future__ import annotations

import pytest

from gpuutil import WORK, record_result
import subprocess

from matrix import JOBS, WORKLOADS, run_workload

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_matrix(name):
    if name in JOBS:
        n = len(subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip().splitlines())
        if n < JOBS[name]:
            pytest.skip(f"{name} needs {JOBS[name]} GPUs, this machine has {n} (bench/matrix_gpu.py on a multi-GPU machine)")
    cells = run_workload(name, WORK / "matrix" / name)
    record_result({"test": "matrix", "workload": name, "cells": cells})
    failed = {k: v["detail"] for k, v in cells.items() if v["ok"] is False}
    assert not failed, failed
    assert "compare" in cells, cells          # the matrix ran to its last command
