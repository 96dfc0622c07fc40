"""Replay performance on the GPU machine, side by side with the native program in one run.
Every row names the card and gives ratios against native measured in the same run.

  1. training loop (bench/gpt_step.py: a small bf16 GPT with AdamW, ~250 launches a step, one
     torch.cuda.synchronize per step): per-step time (median of steps 10..N)
       native eager, in-process;
       plain replay: between the step synchronizations' returns (the result's sync_mono);
       replay --profile timeline: the same;
       the same step as one CUDA graph, natively (the GPU-bound time);
     goals: plain <= 1.0x native, plain <= 1.5x graph, timeline <= 1.1x plain.  Native and
     replay runs alternate (REPS pairs); medians are reported.
  2. launch rate: a launch-bound C loop (100k empty-kernel launches) natively vs replayed
     (time per launch between the first and the last replayed launch); goal <= 1.1x
  3. big snapshot (bench/bench_bigsnap_gpu.py): a 6 GiB snapshot replayed end to end: GB/s of
     snapshot (goal >= 3), first kernel (<= 3 s), peak host memory over the largest allocation (<= +2 GiB).

  --against SITE: the training loop's plain replay also by the cudasnap installed under SITE (another
  build of this tool, e.g. `pip install --target SITE` of an older revision), with its own capture,
  in the same rounds: native, this build, that build. Its rows: the other build's step, its ratio to
  native, and this build over that one per round (the tool's own speed, machine cancelled).

Usage: python bench/bench_replay_gpu.py [--json OUT.json] [--steps 60] [--reps 3] [--skip ROWS] [--against SITE]
(needs nvcc, PyTorch and a GPU; ROWS: comma list of train,launch,big)"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_capture_gpu import card, nvcc, replay_result, run  # noqa: E402


def replay_json(snap: Path, *extra: str, env: dict | None = None) -> tuple[dict, float]:
    t0 = time.time()
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snap), "--json", *extra],
                        capture_output=True, text=True, env=env)
    res = replay_result(cp)
    return res, t0


def step_syncs(snap: Path, steps: int) -> list:
    """Call numbers of the loop's step synchronizations (bench/gpt_step.py): after the first two
    cuCtxSynchronize calls with no launch or memory call between them, the next `steps`; the
    second of the pair opens the first step."""
    from cudasnap.formats import SnapshotReader
    prev, start, seqs = None, None, []
    for r in SnapshotReader(snap).records("c"):
        f = r.get("f") or ""
        if f.startswith("cuCtxSynchronize"):
            if start is None and prev is not None:
                start = r["s"]
                seqs = [start]
            elif start is not None:
                seqs.append(r["s"])
                if len(seqs) == steps + 1:
                    return seqs
            prev = r["s"]
        elif f.startswith(("cuLaunch", "cuMem", "cuGraph")):
            prev = None
    raise SystemExit(f"{snap}: the loop's {steps} step synchronizations were not found")


def replay_step_ms(rj: dict, seqs: list) -> float:
    t = {int(q): x for q, x in rj["sync_mono"]}
    missing = [q for q in seqs if q not in t]
    if missing:
        raise SystemExit(f"replay result lacks sync times of calls {missing[:5]} (pace {rj.get('pace')})")
    d = [(t[b] - t[a]) * 1e3 for a, b in zip(seqs, seqs[1:])]
    return statistics.median(d[10:] or d)


def gpt(mode: str, steps: int) -> float:
    out, _ = run([sys.executable, str(HERE / "gpt_step.py"), mode, str(steps)])
    return float(re.search(r"step_ms ([\d.]+)", out).group(1))


def site_env(site: str) -> dict:
    """The environment that imports cudasnap from SITE first (another build of the tool). A SITE
    without one would import this build again and compare it with itself: refused."""
    root = Path(site).resolve()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root)] + [p for p in [env.get("PYTHONPATH")] if p])
    cp = subprocess.run([sys.executable, "-c", "import cudasnap; print(cudasnap.__file__)"],
                        capture_output=True, text=True, env=env)
    where = Path(cp.stdout.strip() or ".").resolve()
    if cp.returncode != 0 or root not in where.parents:
        raise SystemExit(f"--against {site}: no cudasnap there (it imports {cp.stdout.strip() or cp.stderr.strip()[-300:]})")
    return env


def training_row(tmp: Path, steps: int, reps: int, against: str = "") -> dict:
    other = site_env(against) if against else None
    snap = tmp / "gpt.cusnap"
    run([sys.executable, str(HERE / "gpt_step.py"), "eager", str(steps)], snap)
    seqs = step_syncs(snap, steps)
    if other is not None:
        snap_o = tmp / "gpt_other.cusnap"
        run([sys.executable, str(HERE / "gpt_step.py"), "eager", str(steps)], snap_o, env=other)
        seqs_o = step_syncs(snap_o, steps)
    nat, plain, tl, graph, plain_o = [], [], [], [], []
    calls = launches = native_calls = tl_native = 0
    backend = None
    for _ in range(reps):
        nat.append(gpt("eager", steps))
        rj, _ = replay_json(snap)
        plain.append(replay_step_ms(rj, seqs))
        calls, launches, native_calls = rj["total_calls"], rj["launches"], rj.get("native_calls", 0)
        if other is not None:
            oj, _ = replay_json(snap_o, env=other)
            plain_o.append(replay_step_ms(oj, seqs_o))
        tj, _ = replay_json(snap, "--profile", "timeline")
        tl.append(replay_step_ms(tj, seqs))
        backend = ((tj.get("profile") or {}).get("summary") or {}).get("backend")
        tl_native = tj.get("native_calls", 0)
        graph.append(gpt("graph", steps))
    m = statistics.median
    r = {"train_native_ms": m(nat), "train_plain_ms": m(plain), "train_timeline_ms": m(tl), "train_graph_ms": m(graph),
         "train_runs": {"native": nat, "plain": plain, "timeline": tl, "graph": graph},
         "train_calls": calls, "train_launches": launches, "train_native_calls": native_calls,
         "train_timeline_backend": backend, "train_timeline_native_calls": tl_native}
    r["train_plain_vs_native"] = r["train_plain_ms"] / r["train_native_ms"]
    r["train_plain_vs_graph"] = r["train_plain_ms"] / r["train_graph_ms"]
    r["train_timeline_vs_plain"] = r["train_timeline_ms"] / r["train_plain_ms"]
    if other is not None:
        r.update(train_other_site=against, train_other_plain_ms=m(plain_o), train_runs_other=plain_o,
                 train_other_plain_vs_native=m(plain_o) / r["train_native_ms"],
                 train_this_vs_other_per_round=[a / b for a, b in zip(plain, plain_o)])
    return r


def launch_row(tmp: Path, launches: int) -> dict:
    loop = nvcc(HERE / "launch_loop.cu", tmp / "launch_loop")
    out, _ = run([str(loop), str(launches), "3"])
    native = sorted(float(x) for x in re.findall(r"us_per_launch ([\d.]+)", out))[1]
    snap = tmp / "loop.cusnap"
    run([str(loop), str(launches), "1"], snap)
    rj, _ = replay_json(snap)
    n = rj["launches"]
    per = (rj["last_launch_mono"] - rj["first_launch_mono"]) / max(1, n - 1) * 1e6
    return dict(launch_us_native=native, launch_us_replay=per, launch_ratio=per / native, replay_launches=n,
                replay_placed=rj["placed"], replay_fell_back=rj["fell_back"])


def big_snapshot_row(tmp: Path) -> dict:
    """The 6 GiB row (bench/bench_bigsnap_gpu.py): replay GB/s end to end, first kernel, peak
    host memory over the largest allocation; main() prints it and keeps it under "big_*" keys."""
    from bench_bigsnap_gpu import bigsnap_row, print_row
    r = bigsnap_row(tmp, reps=1)
    print_row(r)
    return {f"big_{k}": v for k, v in r.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--launches", type=int, default=100000)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--skip", default="")
    ap.add_argument("--against", default="", metavar="SITE", help="also replay the training loop with the cudasnap under SITE")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    tmp = Path(tempfile.mkdtemp(prefix="cudasnap-rbench-"))
    res: dict = {"card": card()}
    print(f"replay performance on {res['card']}", flush=True)
    if "train" not in skip:
        r = training_row(tmp, args.steps, args.reps, args.against)
        res.update(r)
        print(f"  training loop (bf16 GPT, AdamW; {r['train_launches']} launches, {r['train_calls']} calls, "
              f"{r['train_native_calls']} in the C executor), per step, median of {args.reps} runs:")
        print(f"    native {r['train_native_ms']:.3f} ms | plain replay {r['train_plain_ms']:.3f} ms "
              f"({r['train_plain_vs_native']:.2f}x native, goal <= 1.0; {r['train_plain_vs_graph']:.2f}x graph, goal <= 1.5)")
        print(f"    replay --profile timeline {r['train_timeline_ms']:.3f} ms ({r['train_timeline_vs_plain']:.2f}x plain, "
              f"goal <= 1.1; backend {r['train_timeline_backend']}, {r['train_timeline_native_calls']} calls in the "
              f"C executor) | CUDA graph (GPU-bound) {r['train_graph_ms']:.3f} ms", flush=True)
        if args.against:
            per = ", ".join(f"{x:.2f}" for x in r["train_this_vs_other_per_round"])
            print(f"    the build under {args.against}: plain replay {r['train_other_plain_ms']:.3f} ms "
                  f"({r['train_other_plain_vs_native']:.2f}x native) {r['train_runs_other']}; this build over it "
                  f"per round: {per}", flush=True)
    if "launch" not in skip:
        r = launch_row(tmp, args.launches)
        res.update(r)
        print(f"  launch rate   : native {r['launch_us_native']:.3f} us/launch, replay {r['launch_us_replay']:.3f} "
              f"us/launch, ratio {r['launch_ratio']:.2f}x (goal <= 1.1)", flush=True)
    if "big" not in skip:
        r = big_snapshot_row(tmp)
        res.update(r)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
