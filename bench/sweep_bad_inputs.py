"""Every bad input tests/option_sweep.py generates over every command's options (numbers,
inert and contradictory options, selections, paths, wrong-type files, bad campaign/ENVS
files, specs, programs; special files, inputs reached by links, long names, window variables),
run in-process on the test double, with a table by class: no traceback, the exit code of the
class, no input changed in bytes or metadata (SQLite -wal/-shm included), no output made by a
refusal, a refusal naming what is wrong, no inert option accepted silently. Then the faults
of tests/fault_cases.py, each a `cudasnap` process: stdout full, closed or read-only, stdin
closed, stderr full for every command with a verdict; SIGTERM, SIGHUP and SIGINT for every
long command; two writers at once. CI runs a sample of each class (tests/test_option_sweep.py,
tests/test_fault_matrix.py).

Usage: python bench/sweep_bad_inputs.py [--json OUT.json] [--show N] [--no-processes]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent / "tests" / "double"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write every case and its outcome here")
    ap.add_argument("--show", type=int, default=20, help="cases with a problem shown (default 20)")
    ap.add_argument("--no-processes", action="store_true", help="the in-process classes only")
    a = ap.parse_args()
    import signal
    import build as double_build
    import fault_cases as fc
    import option_sweep as sweep

    tmp = Path(tempfile.mkdtemp(prefix="cudasnap-sweep-"))
    try:
        paths = double_build.build(tmp / "double")
        env = double_build.env_for(paths)
        work = sweep.prepare(tmp, env, paths["progs"]["direct"])
        cases = sweep.all_cases()
        rows, outcomes, t0 = [], [], time.monotonic()
        for cls, cs in cases.items():
            got = [sweep.run_case(work, c) for c in cs]
            outcomes += got
            rows.append((cls, sweep.tally(got)))
        total = sweep.tally(outcomes)
        procs = []
        if not a.no_processes:
            fenv = dict(env)
            fenv.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
            w = fc.prepare(tmp / "faults", fenv, str(Path(paths["libdir"]) / "libcuda.so.1"),
                           paths["progs"]["simprog"])
            procs = fc.run_stream_cases(w)
            procs += fc.run_signal_cases(w, sigs=(signal.SIGTERM, signal.SIGHUP, signal.SIGINT))
            procs += fc.run_concurrent_writers(w, paths["progs"]["direct"], captures=3, repairs=10)
        wall = time.monotonic() - t0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cols = ["cases", "tracebacks", "inputs changed", "wrong exit codes", "outputs on refusal",
            "messages not naming it", "inert accepted silently"]
    print("| class | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for cls, t in rows + [("all", total)]:
        print(f"| {cls} | " + " | ".join(str(t[c]) for c in cols) + " |")
    by = fc.tally(procs)
    if by:
        print("\n| fault class (a process each) | cases | failed |\n|---|---|---|")
        for cls, t in by.items():
            print(f"| {cls} | {t['cases']} | {t['failed']} |")
    n_all = len(outcomes) + len(procs)
    failed = sum(1 for o in outcomes if o.problems) + sum(1 for r in procs if r.problems)
    print(f"\n{sweep.summary_line(total)}; {len(procs)} fault cases in processes, "
          f"{sum(1 for r in procs if r.problems)} failed; {n_all} cases in all, {failed} failed ({wall:.1f} s)")
    bad = [o for o in outcomes if o.problems]
    for o in bad[:a.show]:
        print(f"  {' '.join(o.case.args)}: {'; '.join(o.problems)} | {o.stderr.strip()[:200]}")
    for r in [r for r in procs if r.problems][:a.show]:
        print(f"  {r.cls} {r.name}: {'; '.join(r.problems)} | {r.stderr.strip()[-200:]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump([{"class": o.case.cls, "args": o.case.args, "env": o.case.env, "exit": o.code,
                        "problems": o.problems, "stderr": o.stderr[-500:]} for o in outcomes], f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.pop("CUDASNAP_REPLACE", None)
    sys.exit(main())
