"""Bad inputs over every command's options, as classes (tests/option_sweep.py makes them from
the CLI itself): no traceback, the exit code of the class, no input changed in bytes or
metadata (SQLite -wal/-shm included), no output made by a refusal, a refusal that names what
is wrong, no inert option accepted silently. A sample of every class here (in-process, a few
seconds); bench/sweep_bad_inputs.py runs them all."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import option_sweep as sweep  # noqa: E402

# every case of the classes at the heart of issue 46, every k-th of the larger ones
STRIDE = {"number": 8, "inert": 1, "selection": 3, "path": 4, "filetype": 4, "file": 3, "spec": 4, "program": 1,
          # issue 60's classes: sampled by tests/test_fault_matrix.py
          "special": 16, "identity": 8, "longname": 8, "environment": 8, "small": 4}


@pytest.fixture(scope="module")
def work(double, tmp_path_factory):
    return sweep.prepare(tmp_path_factory.mktemp("sweep"), double["env"], double["progs"]["direct"])


def test_every_class_of_bad_input_is_refused_cleanly(work, record_property):
    cases = sweep.all_cases()
    assert set(cases) == set(STRIDE)
    assert sum(map(len, cases.values())) >= 700           # the full sweep (bench) is at least this
    outcomes = []
    for cls, every in STRIDE.items():
        assert cases[cls], cls
        for c in cases[cls][::every]:
            outcomes.append(sweep.run_case(work, c))
    t = sweep.tally(outcomes)
    record_property("ci_summary", sweep.summary_line(t))
    bad = [f"{' '.join(o.case.args)}: {'; '.join(o.problems)} | {o.stderr.strip()[:160]}"
           for o in outcomes if o.problems]
    assert not bad, "\n".join(bad[:20])
    assert len(outcomes) >= 100


def test_an_inert_option_given_where_it_acts_is_not_refused(work):
    """The declared Inert table does not refuse what works: the same options with what makes
    them act are past the check (they fail later, on the driver-less runner, for another reason)."""
    for args, opt in ((["capture", "--window", "kernel:add_one", "--context", "2", "-o", "", "--", "true"], "--context"),
                      (["capture", "--flight-recorder", "5", "--trigger", "any", "-o", "", "--", "true"], "--trigger"),
                      (["replay", "snap.cusnap", "--profile", "isolated", "--repeat", "3", "--check-repeats",
                        "--out", ""], "--repeat"),
                      (["replay", "snap.cusnap", "--profile", "graph", "--timeline-check", "--out", ""],
                       "--timeline-check"),
                      (["bisect", "snap.cusnap", "--envs", "envs.toml", "--gpus", "2", "--address", "auto",
                        "--html", ""], "--address")):
        o = sweep.run_case(work, sweep.Case("control", args, ""))
        assert o.code == 2 and "is empty" in o.stderr and f"{opt} has no effect" not in o.stderr, (args, o.stderr)


def test_a_campaign_that_cannot_reach_ray_leaves_no_store(work, monkeypatch):
    """Ray's start fails: the store is not made (nor a run row a next run would resume), and an
    existing store keeps its bytes."""
    import cudasnap.campaign.engine as engine

    def refuse(*a, **k):
        raise engine.EngineError("cannot start or reach the Ray cluster at ray://nowhere:1: refused")
    monkeypatch.setattr(engine, "Engine", refuse)
    before = sweep.state(work)
    for out in ("fresh.sqlite", "store.sqlite"):
        o = sweep.run_case(work, sweep.Case("ray", ["campaign", "run", "camp.toml", "-o", out], "ray://nowhere"))
        assert o.code == 2 and not o.problems, (o.problems, o.stderr)
    assert sweep.state(work) == before


def test_issue_cases_that_need_the_driver(double, work, tmp_path):
    """The cases of issue 46 that reach a replay, on the test double, in one batch."""
    import os
    env = double["env"]
    (tmp_path / "bad.cubin").write_text("not a cubin\n")
    snap = str(work / "snap.cusnap")
    cases = [(["advise", snap, "--graphs", "0", "--replace", f"add_one={tmp_path / 'bad.cubin'}"], 2,
              "CUDA_ERROR_INVALID_IMAGE"),
             (["advise", snap, "--device", "7"], 2, "--device 7"),
             (["replay", snap, "--profile", "metrics", "--out", str(tmp_path / "m.json")], 2, "metrics"),
             (["capture", "--window", "kernel:add_one#-1", "-o", str(tmp_path / "w.cusnap"), "--",
               double["progs"]["direct"]], 2, "#K counts from 1")]
    before = sweep.state(work)
    for args, code, says in cases:
        cp = subprocess.run([sys.executable, "-m", "cudasnap", *args], env=env, capture_output=True, text=True,
                            timeout=120)
        assert cp.returncode == code and says in cp.stdout + cp.stderr and "Traceback" not in cp.stderr, (args, cp.stderr)
    assert not os.path.exists(tmp_path / "m.json") and not list(tmp_path.glob("w*.cusnap"))
    assert sweep.state(work) == before
