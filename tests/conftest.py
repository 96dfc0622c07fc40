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

# Tests that compare times the double measured on the host's clock (its kernels wait in real
# time; graph mode's own cost; advise's what-ifs; the timeline check; a watchdog, a pace): under
# pytest-xdist (`-n 2`, what CI runs) each takes the CPU alone, fixtures included, the others
# sharing it: a readers-writer lock over the workers, held through each test's whole protocol.
# Modules (or MODULE::TEST). Those whose verdicts about times come from the double's virtual
# clock (CUDA_DOUBLE_CLOCK=virtual: planted times; the campaign, compare and profile tests) need
# no CPU to themselves.
TIMED = {"test_advise.py", "test_graph_profile.py", "test_graph_scale.py",
         "test_replay_fast.py::test_executor_watchdog_names_the_call_in_progress",
         "test_replay_fast.py::test_pace_recorded_keeps_the_recorded_gaps"}


def _timed(item) -> bool:
    return item.path.name in TIMED or f"{item.path.name}::{item.originalname}" in TIMED


# Seconds each module's tests took in a full run (2 workers, 2 cores, 2026-12-08; sim, multiproc,
# fuzz_formats, change_cost, record_fuzz and structure less what was saved since, measured alone),
# the largest first: the run starts with the longest work, so what is left at its end is short
# and both workers finish together (LPT). A module not listed counts as short and keeps its place.
MODULE_SECONDS = {"test_sim.py": 100, "test_campaign.py": 88, "test_multinode.py": 61, "test_fault_matrix.py": 57,
                  "test_cluster.py": 49, "test_multiproc.py": 49, "test_capture_loss.py": 46,
                  "test_fuzz_formats.py": 42, "test_reports_render.py": 42, "test_replay_double.py": 34,
                  "test_change_cost.py": 27, "test_extract.py": 27, "test_selection.py": 26, "test_profile.py": 25,
                  "test_capture.py": 23, "test_compare.py": 23, "test_exit_codes.py": 23, "test_flight.py": 23,
                  "test_pytest_plugin.py": 22, "test_window.py": 22, "test_numerics.py": 20,
                  "test_record_fuzz.py": 20, "test_job_windows.py": 19, "test_plan_native.py": 19,
                  "test_structure.py": 15}


# Modules whose last test counts what the others did in its process (test_fuzz_total): at the
# head of the first worker's queue, which no other worker takes work from.
TOGETHER = {"test_fuzz_formats.py"}


def pytest_collection_modifyitems(session, config, items):
    # the timed tests first, together: one exclusive stretch at the start of the run, while the
    # other worker starts at the short end of the list (`--dist worksteal` gives each worker half
    # and a worker out of work takes the tail of the other's); then the modules kept together;
    # then the longest modules. Order within a module is kept; every xdist worker sorts the same
    # collection the same way.
    items.sort(key=lambda it: (not _timed(it), it.path.name not in TOGETHER, -MODULE_SECONDS.get(it.path.name, 0)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        yield
        return
    # in the run's own temporary directory (the workers' basetemps share it): nothing left in /tmp.
    # A timed test holds the gate while it waits, so no shared test starts before it (flock alone
    # lets shared holders hand the lock on among themselves and keep a timed test waiting).
    base = item.config._tmp_path_factory.getbasetemp().parent
    timed = _timed(item)
    with open(base / f"cudasnap-timed-tests-{run}.gate", "a") as gate, \
            open(base / f"cudasnap-timed-tests-{run}.lock", "a") as f:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(f, fcntl.LOCK_EX if timed else fcntl.LOCK_SH)
        fcntl.flock(gate, fcntl.LOCK_UN)
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
