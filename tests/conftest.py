"""Shared fixtures: the test-double driver (tests/double) and a capture runner."""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from double.fixtures import built_double  # noqa: E402

double = pytest.fixture(scope="session")(built_double)

# Tests that compare times measured on the double (its kernels run on host CPU time): under
# pytest-xdist (`-n 2`, what CI runs) each takes the CPU alone, fixtures included, the others
# sharing it: a readers-writer lock over the workers, held through each test's whole protocol.
TIMED_MODULES = {"test_advise.py", "test_campaign.py", "test_compare.py", "test_gapmodel.py", "test_graph_profile.py",
                 "test_graph_scale.py", "test_isolated_stats.py", "test_profile.py", "test_profile_names.py",
                 "test_replay_fast.py"}


def pytest_collection_modifyitems(session, config, items):
    # the timed modules first, together: one exclusive stretch at the start of the run instead of
    # a wait for a long shared test before each timed one (order within a module is kept; every
    # xdist worker sorts the same collection the same way)
    items.sort(key=lambda it: it.path.name not in TIMED_MODULES)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        yield
        return
    # in the run's own temporary directory (the workers' basetemps share it): nothing left in /tmp
    lock = item.config._tmp_path_factory.getbasetemp().parent / f"cudasnap-timed-tests-{run}.lock"
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if item.path.name in TIMED_MODULES else fcntl.LOCK_SH)
        yield


# What the code under test keeps in the temporary directory by default (Ray's session files, the
# campaign's GPU-keeper pid files) goes into one directory per test process, removed at its end:
# the suite leaves nothing behind.
_SCRATCH = None


def pytest_configure(config):
    global _SCRATCH
    import tempfile
    _SCRATCH = tempfile.mkdtemp(prefix="cs-")      # short: Ray's socket paths must fit 107 bytes
    os.environ.setdefault("RAY_TMPDIR", _SCRATCH)
    os.environ.setdefault("CUDASNAP_KEEPER_DIR", os.path.join(_SCRATCH, "keepers"))


def pytest_unconfigure(config):
    import shutil
    if _SCRATCH:
        shutil.rmtree(_SCRATCH, ignore_errors=True)


# Counts a test reports for CI's log (record_property("ci_summary", LINE)), printed at the end of
# the run: under xdist a worker's own prints are not shown.
_CI_SUMMARIES: list = []


def pytest_runtest_logreport(report):
    if report.when == "call":
        _CI_SUMMARIES.extend(v for k, v in report.user_properties if k == "ci_summary")


def pytest_terminal_summary(terminalreporter):
    for line in _CI_SUMMARIES:
        terminalreporter.write_line(line)


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
