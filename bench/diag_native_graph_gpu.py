#!/usr/bin/env python3
"""Do kernels run differently inside a CUDA graph than launched one by one, with no replay
involved?  The GPT training step of tests/gpu/workloads/prof_gpt_graph.py (AdamW capturable=True,
so its eager loop and a CUDA graph of its step run the same kernels) runs STEPS times eager and
STEPS times as one captured graph, in one process, traced by CUPTI; prints per-kernel medians of
both and their difference for kernels of --min-us or more.

    python bench/diag_native_graph_gpu.py [--steps 60] [--min-us 5] [--replay] [--json OUT]

--replay also captures the eager loop (`cudasnap capture`) and replays the snapshot under
--profile timeline and --profile graph, and prints four columns per kernel: native eager,
timeline replay, native graph, graph-mode replay.  Graph mode is right when it agrees with the
native graph, and timeline mode when it agrees with native eager; where the native graph differs
from native eager, graph and timeline modes must differ alike."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from diag_profile import profile_medians

WORKLOAD = Path(__file__).resolve().parent.parent / "tests" / "gpu" / "workloads" / "prof_gpt_graph.py"


def run_native(steps: int, work: Path) -> dict:
    out = work / "native.json"
    cp = subprocess.run([sys.executable, str(WORKLOAD), "native", str(out), str(steps)], capture_output=True, text=True)
    if cp.returncode != 0:
        sys.exit(f"native run failed ({cp.returncode}): {cp.stderr[-1500:]}")
    return json.loads(out.read_text())


def replay_medians(steps: int, work: Path) -> dict:
    """Capture the eager loop and replay it under timeline and graph modes: per-kernel medians
    (by CUPTI name) of each."""
    snap = work / "eager.cusnap"
    env = {**os.environ, "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "capture", "-f", "-o", str(snap), "--",
                         sys.executable, str(WORKLOAD), "eager", str(steps)], env=env, capture_output=True, text=True)
    if cp.returncode != 0:
        sys.exit(f"capture failed ({cp.returncode}): {cp.stderr[-1500:]}")
    return {mode: profile_medians(snap, mode, work / f"{mode}.json") for mode in ("timeline", "graph")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--min-us", type=float, default=5.0)
    ap.add_argument("--replay", action="store_true", help="also capture the eager loop and replay it")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cs-natgraph-"))
    nat = run_native(a.steps, work)
    rows = []
    for k in sorted(set(nat["eager"]) & set(nat["graph"])):
        me, mg = statistics.median(nat["eager"][k]), statistics.median(nat["graph"][k])
        if max(me, mg) >= a.min_us:
            rows.append({"name": k, "eager_us": round(me, 3), "graph_us": round(mg, 3),
                         "diff_pct": round((mg - me) / me * 100, 2), "n": [len(nat["eager"][k]), len(nat["graph"][k])]})
    rows.sort(key=lambda r: -abs(r["diff_pct"]))
    print(f"device: {nat['device']}; kernel records carrying a graph id: {nat['graph_records']}")
    print("native eager / native graph median us (graph vs eager)")
    for r in rows:
        print(f"  {r['eager_us']:8.3f} / {r['graph_us']:8.3f} ({r['diff_pct']:+6.2f}%) n={r['n']}  {r['name'][:90]}")
    print(f"{len(rows)} kernels of >= {a.min_us} us in both; {sum(abs(r['diff_pct']) > 5 for r in rows)} differ by more than 5%")
    if a.replay:
        rm = replay_medians(a.steps, work)
        pct = lambda x, y: round((x - y) / y * 100, 2) if x is not None and y else None
        f = lambda v: f"{v:8.3f}" if v is not None else "       -"
        print("native eager / timeline replay / native graph / graph-mode replay, median us;"
              " (timeline vs native eager, graph mode vs native graph, graph mode vs timeline)")
        for r in rows:
            t, gm = rm["timeline"].get(r["name"]), rm["graph"].get(r["name"])
            r.update(timeline_us=t, graphmode_us=gm, timeline_vs_eager_pct=pct(t, r["eager_us"]),
                     graphmode_vs_graph_pct=pct(gm, r["graph_us"]), graphmode_vs_timeline_pct=pct(gm, t))
            print(f"  {r['eager_us']:8.3f} / {f(t)} / {r['graph_us']:8.3f} / {f(gm)}  ({r['timeline_vs_eager_pct']}%,"
                  f" {r['graphmode_vs_graph_pct']}%, {r['graphmode_vs_timeline_pct']}%)  {r['name'][:70]}")
        for key, what in (("timeline_vs_eager_pct", "timeline replay vs native eager"),
                          ("graphmode_vs_graph_pct", "graph-mode replay vs native graph"),
                          ("graphmode_vs_timeline_pct", "graph-mode replay vs timeline replay")):
            v = [abs(r[key]) for r in rows if r.get(key) is not None]
            print(f"{what}: {len(v)} kernels, worst {max(v, default=0):.2f}%, {sum(x > 5 for x in v)} outside 5%")
    if a.json:
        Path(a.json).write_text(json.dumps({"device": nat["device"], "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
