"""Every bad input tests/option_sweep.py generates over every command's options (numbers,
inert and contradictory options, selections, paths, wrong-type files, bad campaign/ENVS
files, specs, programs), run in-process on the test double, with a table by class: no
traceback, the exit code of the class, no input changed in bytes or metadata (SQLite -wal/-shm
included), no output made by a refusal, a refusal naming what is wrong, no inert option
accepted silently. CI runs a sample of each class (tests/test_option_sweep.py).

Usage: python bench/sweep_bad_inputs.py [--json OUT.json] [--show N]
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
    a = ap.parse_args()
    import build as double_build
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
        wall = time.monotonic() - t0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cols = ["cases", "tracebacks", "inputs changed", "wrong exit codes", "outputs on refusal",
            "messages not naming it", "inert accepted silently"]
    print("| class | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for cls, t in rows + [("all", total)]:
        print(f"| {cls} | " + " | ".join(str(t[c]) for c in cols) + " |")
    print(f"\n{sweep.summary_line(total)} ({wall:.1f} s)")
    bad = [o for o in outcomes if o.problems]
    for o in bad[:a.show]:
        print(f"  {' '.join(o.case.args)}: {'; '.join(o.problems)} | {o.stderr.strip()[:200]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump([{"class": o.case.cls, "args": o.case.args, "env": o.case.env, "exit": o.code,
                        "problems": o.problems, "stderr": o.stderr[-500:]} for o in outcomes], f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    os.environ.pop("CUDASNAP_REPLACE", None)
    sys.exit(main())
