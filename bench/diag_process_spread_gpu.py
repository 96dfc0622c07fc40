#!/usr/bin/env python3
"""How much does a kernel's median move from one replay process to the next?  Replays one
snapshot N times under each given profile mode (each run its own process, so its own physical
memory behind the same recorded addresses) and prints, per kernel of --min-us or more, the
median of every run side by side and the spread across runs.

    python bench/diag_process_spread_gpu.py SNAPSHOT [--runs 4] [--modes timeline,graph] [--json OUT]

A kernel whose medians move between runs of the same mode by more than the difference between
modes cannot be compared across two processes, whichever modes they are."""
from __future__ import annotations

import argparse
import json
import tempfile
from collections import defaultdict
from pathlib import Path

from diag_profile import profile_medians


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("snapshot")
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--modes", default="timeline,graph")
    ap.add_argument("--min-us", type=float, default=5.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cs-spread-"))
    runs = defaultdict(list)
    for i in range(a.runs):
        for mode in a.modes.split(","):
            runs[mode].append(profile_medians(a.snapshot, mode, work / f"{mode}{i}.json"))
    names = sorted({k for m in runs.values() for r in m for k, v in r.items() if v >= a.min_us})
    rows = []
    for k in names:
        row = {"name": k}
        for mode, rs in runs.items():
            v = [r[k] for r in rs if k in r]
            row[mode] = [round(x, 3) for x in v]
            row[mode + "_spread_pct"] = round((max(v) - min(v)) / min(v) * 100, 2) if v else None
        rows.append(row)
    rows.sort(key=lambda r: -max((r.get(m + "_spread_pct") or 0) for m in runs))
    for r in rows:
        print("  " + "  ".join(f"{m}: {r[m]} ({r[m + '_spread_pct']}%)" for m in runs) + f"  {r['name'][:60]}")
    for m in runs:
        sp = [r[m + "_spread_pct"] for r in rows if r.get(m + "_spread_pct") is not None]
        print(f"{m}: {len(sp)} kernels, run-to-run spread of medians: worst {max(sp, default=0):.2f}%, "
              f"{sum(x > 5 for x in sp)} over 5%")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
