"""Shared fixtures: the test-double driver (tests/double) and a capture runner."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from double.fixtures import built_double  # noqa: E402

double = pytest.fixture(scope="session")(built_double)


def cudasnap_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "cudasnap", *args]


@pytest.fixture
def capture(double, tmp_path):
    """capture(prog, *args, out=None) -> (CompletedProcess, snapshot Path)."""

    def run(prog: str, *args: str, out: Path | None = None, timeout: float = 120, extra_env=None):
        out = out or tmp_path / f"{Path(prog).name}.cusnap"
        env = dict(double["env"])
        env.update(extra_env or {})
        cp = subprocess.run(
            cudasnap_cmd("capture", "-o", str(out), "--ring-mb", "16", "--", prog, *args),
            env=env, capture_output=True, text=True, timeout=timeout,
        )
        return cp, out

    return run


@pytest.fixture
def native(double):
    def run(prog: str, *args: str, timeout: float = 60):
        return subprocess.run([prog, *args], env=double["env"], capture_output=True, text=True, timeout=timeout)

    return run
