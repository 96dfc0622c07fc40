#!/usr/bin/env python3
"""Why do some kernels time shorter in graph mode than in timeline mode?

Replays one snapshot with `--profile timeline` (and its trace) and `--profile graph`, takes the
kernels whose medians differ by more than 5% (kernels of 5 us or more), and prints for each,
from the timeline trace: what ran just before it on its stream and how long the GPU had been
idle on that stream, what overlapped it on other streams, and its median split by those. Each
timeline instance is also matched to the graph run's time of the same launch.

    python bench/diag_graph_outliers_gpu.py SNAPSHOT [--native SCRIPT.py ARGS...] [--json OUT]

--native also times the recorded program's kernels natively (CUPTI, tests/gpu/cupti_native.py),
so each compared kernel shows native / timeline / graph medians side by side.
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

from cudasnap.replay.profile.report import compare_kernel_medians


def replay(snap: str, work: Path, mode: str, *extra: str) -> dict:
    out = work / f"{mode}{len(extra)}.json"
    cp = subprocess.run(["cudasnap", "replay", snap, "--profile", mode, "--out", str(out), *extra],
                        capture_output=True, text=True)
    if cp.returncode != 0:
        sys.exit(f"replay --profile {mode} failed ({cp.returncode}): {cp.stderr[-1500:]}")
    return json.loads(out.read_text())


def med(v):
    return round(statistics.median(v), 3) if v else None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("snapshot")
    ap.add_argument("--json", default=None)
    ap.add_argument("--min-us", type=float, default=5.0)
    ap.add_argument("--native", nargs=argparse.REMAINDER, default=None, help="the Python program and its arguments")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cs-outliers-"))
    trace_path = work / "timeline.trace.json.gz"
    replay(a.snapshot, work, "timeline", "--trace", str(trace_path))      # call by call: for the gaps
    tl = replay(a.snapshot, work, "timeline")                               # batched, as usually run
    gr = replay(a.snapshot, work, "graph", "--repeat", "10", "--warmup", "3")
    gr1 = replay(a.snapshot, work, "graph", "--repeat", "1", "--warmup", "0")  # the graph's first run only
    one = {c["name"]: c["graph_us"] for c in compare_kernel_medians(gr1, tl, a.min_us)}
    rows = sorted((r for r in tl.get("launches", []) if r.get("start_ns") and r.get("end_ns")),
                  key=lambda r: r["start_ns"])
    bgaps = sorted((b["start_ns"] - a_["end_ns"]) / 1e3 for a_, b in zip(rows, rows[1:]))
    if bgaps:
        q = lambda f: round(bgaps[min(len(bgaps) - 1, int(len(bgaps) * f))], 2)
        print(f"batched timeline: GPU idle between kernels (us): p10 {q(.1)} median {q(.5)} p90 {q(.9)};"
              f" {sum(g < 1 for g in bgaps)} of {len(bgaps)} under 1 us")
    cmp = compare_kernel_medians(gr, tl, a.min_us)
    for c in cmp:
        c["graph_first_run_us"] = one.get(c["name"])
    if a.native:
        nat_out = work / "native.json"
        cp = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "tests" / "gpu" / "cupti_native.py"),
                             str(nat_out), *a.native], capture_output=True, text=True)
        if cp.returncode != 0:
            sys.exit(f"native run failed ({cp.returncode}): {cp.stderr[-1500:]}")
        nat = json.loads(nat_out.read_text())["kernels"]
        print("kernel: native / timeline / graph median us (timeline, graph vs native %)")
        for c in cmp:
            n = nat.get(c["name"])
            if n:
                c["native_us"] = statistics.median(n)
                tl_pct = (c["other_us"] - c["native_us"]) / c["native_us"] * 100
                gr_pct = (c["graph_us"] - c["native_us"]) / c["native_us"] * 100
                print(f"  {c['native_us']:8.3f} / {c['other_us']:8.3f} / {c['graph_us']:8.3f} (first run {c['graph_first_run_us'] or 0:.3f})"
                      f"  ({tl_pct:+5.1f}%, {gr_pct:+5.1f}%)  {c['name'][:70]}")
    bad = [c for c in cmp if abs(c["diff_pct"]) > 5.0]
    print(f"{len(cmp)} kernels of >= {a.min_us} us compared; {len(bad)} outside 5%")
    with gzip.open(trace_path, "rt") as f:
        evs = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    by_stream = defaultdict(list)
    for e in evs:
        by_stream[e["tid"]].append(e)
    for v in by_stream.values():
        v.sort(key=lambda e: e["ts"])
    gaps = sorted(e["ts"] - (v[i - 1]["ts"] + v[i - 1]["dur"]) for v in by_stream.values()
                  for i, e in enumerate(v) if i and e.get("cat") == "kernel")
    if gaps:
        q = lambda f: round(gaps[min(len(gaps) - 1, int(len(gaps) * f))], 2)
        print(f"timeline: idle before a kernel on its stream (us): p10 {q(.1)} median {q(.5)} p90 {q(.9)}"
              f" max {q(1.0)}; {sum(g > 20 for g in gaps)} of {len(gaps)} over 20 us")
    graph_time = {r.get("seq"): r.get("median_us") for r in gr.get("launches", [])}
    rows = []
    for c in bad:
        name = c["name"]
        inst = []
        for tid, v in by_stream.items():
            for i, e in enumerate(v):
                if (e["args"].get("cupti name") or e["args"].get("mangled")) != name and e["name"] != name:
                    continue
                prev = v[i - 1] if i else None
                gap = (e["ts"] - (prev["ts"] + prev["dur"])) if prev else None
                t0, t1 = e["ts"], e["ts"] + e["dur"]
                over = [o["name"][:60] for t2, w in by_stream.items() if t2 != tid for o in w
                        if o["ts"] < t1 and o["ts"] + o["dur"] > t0]
                inst.append({"dur": e["dur"], "gap": gap, "prev": (prev["name"][:80] if prev else None),
                             "overlap": over, "graph": graph_time.get(e["args"].get("seq"))})
        if not inst:
            continue
        near = [x["dur"] for x in inst if x["gap"] is not None and x["gap"] < 1.0]
        far = [x["dur"] for x in inst if x["gap"] is not None and x["gap"] >= 1.0]
        lone = [x["dur"] for x in inst if not x["overlap"]]
        row = {"name": name[:120], "graph_us": round(c["graph_us"], 3), "timeline_us": round(c["other_us"], 3),
               "diff_pct": round(c["diff_pct"], 2), "n": len(inst),
               "timeline_after_gap_lt_1us": [med(near), len(near)], "timeline_after_gap_ge_1us": [med(far), len(far)],
               "timeline_no_overlap": [med(lone), len(lone)],
               "gap_us": med([x["gap"] for x in inst if x["gap"] is not None]),
               "previous": Counter(x["prev"] for x in inst).most_common(3),
               "overlapping": Counter(o for x in inst for o in x["overlap"]).most_common(3),
               "graph_same_launches_us": med([x["graph"] for x in inst if x["graph"] is not None])}
        rows.append(row)
        print(json.dumps(row, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps({"compared": cmp[:30], "outliers": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
