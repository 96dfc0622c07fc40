#!/usr/bin/env python3
"""Does a kernel's time in graph mode depend on how much of the loop the graph holds?  The
snapshot's loop is cut at its context synchronizations (one per step in a training loop); graph
mode replays graphs of the middle 1, N/10 and all steps (`--calls FIRST-LAST`), and timeline
mode the whole snapshot; prints per-kernel medians side by side.

    python bench/diag_graph_size_gpu.py SNAPSHOT [--min-us 5] [--json OUT]"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from cudasnap.formats.abi import base_name
from cudasnap.formats.reader import SnapshotReader
from diag_profile import profile_medians


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("snapshot")
    ap.add_argument("--min-us", type=float, default=5.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    syncs = [r["s"] for r in SnapshotReader(a.snapshot).records(("c",))
             if base_name(r.get("f") or "") == "cuCtxSynchronize" and r.get("s") is not None]
    steps = len(syncs) - 1
    if steps < 2:
        sys.exit(f"{a.snapshot}: {len(syncs)} context synchronizations; need a loop of steps")
    work = Path(tempfile.mkdtemp(prefix="cs-gsize-"))
    cols = {}
    cols["timeline"] = profile_medians(a.snapshot, "timeline", work / "timeline.json")
    for n in sorted({1, max(1, steps // 10), steps}):
        i = max(0, (steps - n) // 2)
        rng = f"{syncs[i] + 1}-{syncs[i + n] - 1}"
        cols[f"graph {n} step(s)"] = profile_medians(a.snapshot, "graph", work / f"graph{n}.json", "--calls", rng)
    names = sorted(k for k, v in cols["timeline"].items() if v >= a.min_us)
    print(" / ".join(cols) + " (median us)")
    rows = []
    for k in names:
        rows.append({"name": k, **{c: round(v[k], 3) if k in v else None for c, v in cols.items()}})
        print("  " + " / ".join(f"{rows[-1][c]:8.3f}" if rows[-1][c] is not None else "       -" for c in cols)
              + f"  {k[:70]}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
