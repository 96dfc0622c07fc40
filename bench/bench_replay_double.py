"""Replay CPU overhead on the test-double driver (no GPU): the numbers behind
bench/bench_replay_gpu.py's two targets, as far as a CPU can show them.

  1. launch rate: bench/launch_loop_double.c (N launches of the double's add_one with n=0,
     entry points from cuGetProcAddress_v2) natively, then captured and replayed: us per
     replayed launch (first to last replayed launch / launches), for the launch fast path
     modes CUDASNAP_FASTPATH=0 (per-launch Python path), python (batches through
     cuda-bindings) and 1 (native batches), plus the whole replay's wall time;
  2. time to first replayed kernel of a snapshot holding H2D_MB (1024) MiB of device memory
     (launch_loop_double 1 H2D_MB): from starting `cudasnap replay` to its first launch;
  3. the framework-like mix of bench/mixed_double.c (per step a context switch, two launches,
     event record + wait, async memset and D2D copy, a verified D2H every 10 steps; ~142k
     calls): native us per call against replay us per call excluding start-up (the replay
     loop: result's loop_end_mono - loop_start_mono, over the calls), as a ratio (goal <= 3x),
     per CUDASNAP_FASTPATH mode, with the start-up (reading, planning) beside it; native and
     replay runs alternate, ratios are medians of pairs.

Usage: python bench/bench_replay_double.py [--launches 100000] [--h2d-mb 1024] [--steps 20000] [--reps 3]
                                          [--modes 0,python,1] [--json OUT]"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests" / "double"))
from build import build  # noqa: E402


def sh(cmd, env, **kw) -> subprocess.CompletedProcess:
    cp = subprocess.run(cmd, env=env, capture_output=True, text=True, **kw)
    if cp.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed ({cp.returncode}):\n{cp.stdout[-2000:]}\n{cp.stderr[-2000:]}")
    return cp


def replay(snap: Path, env, mode: str) -> tuple[dict, float, float]:
    e = dict(env, CUDASNAP_FASTPATH=mode)
    t0 = time.time()
    cp = sh([sys.executable, "-m", "cudasnap", "replay", str(snap), "--json"], e)
    wall = time.time() - t0
    return json.loads(cp.stdout), t0, wall


def mixed(args, tmp: Path, d, env, out: dict) -> None:
    """Native and replay runs alternate (the host is noisy): per rep a native run, then one
    replay per mode; ratios are taken per pair, medians reported."""
    prog = tmp / "mixed_double"
    sh(["cc", "-O2", "-I", d["include"], "-o", str(prog), str(HERE / "mixed_double.c"), "-ldl"], env)
    snap = tmp / "mixed.cusnap"
    sh([sys.executable, "-m", "cudasnap", "capture", "-q", "-f", "-o", str(snap), "--", str(prog), str(args.steps)], env)
    modes = args.modes.split(",")
    nat, calls = [], 0
    per = {m: [] for m in modes}
    ratio = {m: [] for m in modes}
    start = {m: [] for m in modes}
    for _ in range(args.reps):
        o = sh([str(prog), str(args.steps)], env).stdout
        native = float(re.search(r"us_per_call ([\d.]+)", o).group(1))
        calls = int(re.search(r"CALLS (\d+)", o).group(1))
        nat.append(native)
        for mode in modes:
            rj, _t0, _wall = replay(snap, env, mode)
            assert rj["exit_code"] == 0 and rj["d2h_verified"] == args.steps // 10, rj["errors"]
            loop = rj["loop_end_mono"] - rj["loop_start_mono"]
            us = loop / rj["total_calls"] * 1e6
            per[mode].append(us)
            ratio[mode].append(us / native)
            start[mode].append(rj["elapsed_s"] - loop)
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    out["mixed_native_us_per_call"] = med(nat)
    print(f"mixed pattern on the double ({calls} calls in the loop): native {med(nat):.3f} us/call "
          f"(runs {', '.join(f'{x:.3f}' for x in nat)})")
    for mode in modes:
        out[f"mixed_replay_us_per_call_fastpath_{mode}"] = med(per[mode])
        out[f"mixed_ratio_fastpath_{mode}"] = med(ratio[mode])
        out[f"mixed_startup_s_fastpath_{mode}"] = med(start[mode])
        print(f"  CUDASNAP_FASTPATH={mode:6s}: {med(per[mode]):8.3f} us per replayed call, {med(ratio[mode]):6.1f}x native "
              f"(median of pairs; goal <= 3x); start-up {med(start[mode]):.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--launches", type=int, default=100000)
    ap.add_argument("--h2d-mb", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--modes", default="0,python,1")
    ap.add_argument("--steps", type=int, default=20000, help="mixed pattern steps (0: skip)")
    ap.add_argument("--json")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="cudasnap-dbench-"))
    d = build(tmp / "double")
    env = dict(os.environ, LD_LIBRARY_PATH=d["libdir"])
    prog = tmp / "launch_loop_double"
    sh(["cc", "-O2", "-I", d["include"], "-o", str(prog), str(HERE / "launch_loop_double.c"), "-ldl"], env)
    out: dict = {}

    nat = [float(re.search(r"us_per_launch ([\d.]+)", sh([str(prog), str(args.launches)], env).stdout).group(1))
           for _ in range(args.reps)]
    out["native_us"] = sorted(nat)[len(nat) // 2]
    snap = tmp / "loop.cusnap"
    sh([sys.executable, "-m", "cudasnap", "capture", "-q", "-f", "-o", str(snap), "--", str(prog), str(args.launches)], env)
    print(f"launch loop on the double: native {out['native_us']:.3f} us/launch ({args.launches} launches)")
    for mode in args.modes.split(","):
        pers, walls = [], []
        for _ in range(args.reps):
            rj, _t0, wall = replay(snap, env, mode)
            n = rj["launches"]
            assert n == args.launches and rj["exit_code"] == 0, rj
            pers.append((rj["last_launch_mono"] - rj["first_launch_mono"]) / max(1, n - 1) * 1e6)
            walls.append(wall)
        per, wall = sorted(pers)[len(pers) // 2], sorted(walls)[len(walls) // 2]
        out[f"replay_us_fastpath_{mode}"] = per
        out[f"replay_wall_s_fastpath_{mode}"] = wall
        print(f"  CUDASNAP_FASTPATH={mode:6s}: {per:8.3f} us per replayed launch, replay wall {wall:.2f} s")

    if args.steps:
        mixed(args, tmp, d, env, out)
    if args.h2d_mb:
        big = tmp / "big.cusnap"
        sh([sys.executable, "-m", "cudasnap", "capture", "-q", "-f", "-o", str(big), "--", str(prog), "1", str(args.h2d_mb)], env)
        firsts = []
        for _ in range(args.reps):
            rj, t0, wall = replay(big, env, "1")
            assert rj["exit_code"] == 0 and rj["launches"] == 1, rj
            firsts.append(rj["first_launch_unix"] - t0)
        out["first_kernel_s"] = sorted(firsts)[len(firsts) // 2]
        out["big_snapshot_bytes"] = big.stat().st_size
        print(f"first kernel: {out['first_kernel_s']:.2f} s after starting replay of a "
              f"{big.stat().st_size / 2**30:.2f} GiB snapshot ({args.h2d_mb} MiB H2D) (runs: "
              f"{', '.join(f'{x:.2f}' for x in firsts)})")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
