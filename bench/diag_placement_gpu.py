#!/usr/bin/env python3
"""Does a kernel's time depend on where its tensors lie, with no replay involved?  Runs the GPT
step of tests/gpu/workloads/prof_gpt_graph.py natively (eager steps and replays of its own CUDA
graph, CUPTI) once per padding: PAD MiB allocated before the model, which moves every tensor of
the program and nothing else.  Prints, per kernel of --min-us or more, its eager and graph medians
at each padding and their spread (max - min) / min over the paddings.

    python bench/diag_placement_gpu.py [--pads 0,1,3,7,20,64] [--steps 40] [--min-us 5] [--json OUT]

A kernel whose medians spread more than a few percent over paddings cannot be held to a few
percent between two processes of the same program (a capture and its replay, or a native run
and a replay of another capture): its time belongs to the placement, not to the tool."""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WORKLOAD = Path(__file__).resolve().parent.parent / "tests" / "gpu" / "workloads" / "prof_gpt_graph.py"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pads", default="0,1,3,7,20,64", help="paddings in MiB, comma-separated")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--min-us", type=float, default=5.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    pads = [int(p) for p in a.pads.split(",") if p.strip()]
    work = Path(tempfile.mkdtemp(prefix="cs-placement-"))
    runs = {}
    for pad in pads:
        out = work / f"pad{pad}.json"
        cp = subprocess.run([sys.executable, str(WORKLOAD), "native", str(out), str(a.steps), str(pad)],
                            capture_output=True, text=True)
        if cp.returncode != 0:
            sys.exit(f"native run with {pad} MiB padding failed ({cp.returncode}): {cp.stderr[-1500:]}")
        runs[pad] = json.loads(out.read_text())
        print(f"padding {pad:3d} MiB: done", flush=True)
    device = runs[pads[0]]["device"]
    rows = []
    for mode in ("eager", "graph"):
        names = set.intersection(*(set(r[mode]) for r in runs.values()))
        for k in sorted(names):
            meds = [statistics.median(runs[p][mode][k]) for p in pads]
            if max(meds) < a.min_us:
                continue
            rows.append({"mode": mode, "name": k, "medians_us": [round(m, 3) for m in meds],
                         "spread_pct": round((max(meds) - min(meds)) / min(meds) * 100, 2)})
    rows.sort(key=lambda r: -r["spread_pct"])
    print(f"device: {device}; paddings (MiB): {pads}; medians in us, then spread (max - min) / min")
    for r in rows:
        print(f"  {r['mode']:5s} {' '.join(f'{m:7.3f}' for m in r['medians_us'])}  {r['spread_pct']:6.2f}%  {r['name'][:80]}")
    for mode in ("eager", "graph"):
        sp = [r["spread_pct"] for r in rows if r["mode"] == mode]
        print(f"{mode}: {len(sp)} kernels, worst spread {max(sp, default=0):.2f}%, {sum(s > 5 for s in sp)} over 5%")
    if a.json:
        Path(a.json).write_text(json.dumps({"device": device, "pads": pads, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
