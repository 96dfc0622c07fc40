"""Pytest helpers for the cudasnap CUDA driver TEST DOUBLE (tests/double).

`built_double(tmp_path_factory)` is a plain function; test files wrap it:

    from double.fixtures import built_double          # or load this file by path
    double = pytest.fixture(scope="session")(built_double)

It builds the double and the test programs once per process (every wrapper shares
the result; pytest-xdist's workers share one build of the run) and returns build()'s
dict of paths plus "env": an environment whose LD_LIBRARY_PATH finds the double first.
Set CUDASNAP_DOUBLE_BUILD_DIR to build into (and reuse across runs) a fixed directory
instead of a pytest tmp dir.
"""
from __future__ import annotations

import fcntl
import importlib.util
import os
from pathlib import Path

# Events read the double's own device clock (CUDA_DOUBLE_CLOCK, README.md): the slowed kernels'
# times are planted, with planted noise, so a verdict about times is the same on a loaded machine.
VIRTUAL_CLOCK = {"CUDA_DOUBLE_CLOCK": "virtual"}
_HERE = Path(__file__).resolve().parent
_cache: dict | None = None


def _load_build_module():
    spec = importlib.util.spec_from_file_location("cudasnap_tests_double_build", _HERE / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def built_double(tmp_path_factory) -> dict:
    global _cache
    if _cache is None:
        b = _load_build_module()
        fixed = os.environ.get("CUDASNAP_DOUBLE_BUILD_DIR")
        run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
        if fixed:
            paths = b.build(Path(fixed))
        elif run:
            # pytest-xdist's workers share one build in the run's temporary directory: the first
            # builds it, the others find it up to date (build() compiles only what is stale)
            outdir = tmp_path_factory.getbasetemp().parent / f"cuda_double-{run}"
            with open(f"{outdir}.lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                paths = b.build(outdir)
        else:
            paths = b.build(tmp_path_factory.mktemp("cuda_double"))
        paths["env"] = b.env_for(paths)
        _cache = paths
    return dict(_cache)
