"""Size of `cudasnap extract` against its snapshot, on the test-double driver (no GPU).

Captures test-double programs (tests/double/progs): manymods (8 modules, one a fatbin for four
architectures; 4 MiB of unrelated buffers; a VMM mapping; two streams and an event), carve and
launch_forms;
extracts selections of each with `--check`, and prints one markdown row per extract: the
snapshot's bytes, the extract's bytes and share, the state-building calls kept, and whether
its replay verified. The rows of bench/RESULTS.md's extract table come from it.

Usage: python bench/extract_share_double.py [--cudasnap CMD] [--keep DIR [--reuse]]
  --cudasnap: the command to run (default: this interpreter's `-m cudasnap`), e.g. another
  install's `.../bin/cudasnap` to measure an older version the same way; --reuse: extract from
  the snapshots an earlier run left in DIR (both versions then extract the same snapshots)."""
from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SELECTIONS = {"manymods": ["add_one#10", "chase", "saxpy#4"], "carve": ["saxpy"], "launch_forms": ["add_one#3"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cudasnap", default=f"{shlex.quote(sys.executable)} -m cudasnap")
    ap.add_argument("--keep", help="write the snapshots and extracts here (default: a temporary directory)")
    ap.add_argument("--reuse", action="store_true", help="extract from the snapshots already in --keep")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "tests" / "double"))
    import build as double_build

    cmd = shlex.split(args.cudasnap)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.keep or tmp)
        work.mkdir(parents=True, exist_ok=True)
        paths = double_build.build(work / "double")
        env = double_build.env_for(paths)
        print("| snapshot | bytes | selection | extract bytes | share | state calls kept | check |")
        print("|---|---|---|---|---|---|---|")
        for prog, sels in SELECTIONS.items():
            snap = work / f"{prog}.cusnap"
            cp = None if args.reuse and snap.exists() else subprocess.run(
                cmd + ["capture", "-f", "-o", str(snap), "--ring-mb", "16", "--", paths["progs"][prog]],
                env=env, capture_output=True, text=True, timeout=300)
            if cp is not None and cp.returncode != 0:
                print(f"capture of {prog} failed: {cp.stderr.strip()[-300:]}", file=sys.stderr)
                return 1
            for sel in sels:
                out = work / f"{prog}.{re.sub(r'[^A-Za-z0-9_]', '_', sel)}.x.cusnap"
                ex = subprocess.run(cmd + ["extract", str(snap), "-o", str(out), "--kernel", sel, "--check", "-f"],
                                    env=env, capture_output=True, text=True, timeout=600)
                kept = re.search(r"state-building calls kept: (\d+)", ex.stdout)
                size = out.stat().st_size if out.exists() else 0
                ok = "verified" if ex.returncode == 0 and "verified (" in ex.stdout else f"exit {ex.returncode}"
                print(f"| {prog} | {snap.stat().st_size:,} | `{sel}` | {size:,} | "
                      f"{100.0 * size / snap.stat().st_size:.2f}% | {kept.group(1) if kept else '?'} | {ok} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
