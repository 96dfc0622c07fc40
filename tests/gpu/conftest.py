"""GPU-suite fixtures: run workloads natively and under capture, counting launches with an
independent CUPTI injection library. Results also go to $CUDASNAP_GPU_RESULTS (JSON lines)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpuutil  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if gpuutil.have_gpu():
        return
    for it in items:
        if "gpu" in it.keywords:
            it.add_marker(pytest.mark.skip(reason="no NVIDIA GPU here: the gpu suite runs on the GPU machine (bench/gpu_suite.sh)"))


@pytest.fixture(scope="session")
def cupti_counter() -> Path:
    return gpuutil.cupti_counter()


@pytest.fixture(scope="session")
def ptrs_binary() -> Path:
    return gpuutil.ptrs_binary()


@pytest.fixture
def runner(cupti_counter, tmp_path):
    return gpuutil.Runner(cupti_counter, tmp_path)


def pytest_configure(config):
    # the suite also runs from a copy outside the repository, without pyproject.toml's markers
    config.addinivalue_line("markers", "gpu: needs a real NVIDIA GPU")
