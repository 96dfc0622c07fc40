#!/usr/bin/env python3
"""Do kernels run differently inside a CUDA graph than launched one by one, with no replay
involved?  The GPT training step of bench/gpt_step.py (AdamW capturable=True in both, so both
run the same kernels) runs STEPS times eager and STEPS times as one captured CUDA graph, in one
process, traced by CUPTI concurrent-kernel records; prints per-kernel median durations of both
and their difference for kernels of --min-us or more.

    python bench/diag_native_graph_gpu.py [--steps 60] [--min-us 5] [--json OUT]

If graph-mode replay's per-kernel medians differ from timeline replay's as this program's graph
differs from its eager loop, the difference belongs to graph execution, not to the replay."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F
from cupti import cupti

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "gpu" / "workloads"))
from prof_gpt_train import GPT, B, T, V  # noqa: E402

phase = {"name": None}
durs = {"eager": defaultdict(list), "graph": defaultdict(list)}
graph_ids = {"eager": 0, "graph": 0}


def _req():
    return 8 << 20, 0


def _done(acts):
    for a in acts:
        if a.kind in (cupti.ActivityKind.CONCURRENT_KERNEL, cupti.ActivityKind.KERNEL) and phase["name"]:
            durs[phase["name"]][str(a.name)].append((int(a.end) - int(a.start)) / 1e3)
            graph_ids[phase["name"]] += int(getattr(a, "graph_id", 0) or 0) != 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--min-us", type=float, default=5.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    model = GPT().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, capturable=True)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=dev), 1)
    data = torch.randint(0, V, (B, T + 1), device=dev)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            logits = model(data[:, :-1], mask)
        loss = F.cross_entropy(logits.float().view(-1, V), data[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        return loss

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    torch.cuda.synchronize()
    cupti.activity_register_callbacks(_req, _done)
    cupti.activity_enable(cupti.ActivityKind.CONCURRENT_KERNEL)
    for name, run in (("eager", step), ("graph", g.replay), ("eager", step), ("graph", g.replay)):
        for _ in range(5):                       # warm, untimed
            run()
        torch.cuda.synchronize()
        cupti.activity_flush_all(1)
        phase["name"] = name
        for _ in range(a.steps // 2):
            run()
            torch.cuda.synchronize()
        cupti.activity_flush_all(1)
        phase["name"] = None
    rows = []
    for k in sorted(set(durs["eager"]) & set(durs["graph"])):
        e, gr = durs["eager"][k], durs["graph"][k]
        me, mg = statistics.median(e), statistics.median(gr)
        if max(me, mg) >= a.min_us:
            rows.append({"name": k, "eager_us": round(me, 3), "graph_us": round(mg, 3),
                         "diff_pct": round((mg - me) / me * 100, 2), "n": [len(e), len(gr)]})
    rows.sort(key=lambda r: -abs(r["diff_pct"]))
    print(f"device: {torch.cuda.get_device_name()}; kernels in graph records: {graph_ids}")
    print("eager / graph median us (graph vs eager)")
    for r in rows:
        print(f"  {r['eager_us']:8.3f} / {r['graph_us']:8.3f} ({r['diff_pct']:+6.2f}%) n={r['n']}  {r['name'][:90]}")
    bad = [r for r in rows if abs(r["diff_pct"]) > 5]
    print(f"{len(rows)} kernels of >= {a.min_us} us in both; {len(bad)} differ by more than 5%")
    only = sorted(set(durs["eager"]) ^ set(durs["graph"]))
    if only:
        print(f"{len(only)} kernel name(s) in one mode only: {[n[:60] for n in only[:6]]}")
    if a.json:
        Path(a.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
