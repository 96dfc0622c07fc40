"""Replay performance on the GPU machine, side by side with the native program in one run.

  1. launch rate: a launch-bound C loop (100k empty-kernel launches) natively vs replayed
     (time per launch between the first and the last replayed launch); target <= 1.3x
  2. time to first replayed kernel for a snapshot holding 1 GiB of device memory (from
     starting `cudasnap replay` to its first launch); target <= 2 s

Usage: python bench/bench_replay_gpu.py [--json OUT.json]  (needs nvcc and a GPU)"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_capture_gpu import card, nvcc, run  # noqa: E402


def replay_json(snap: Path, *extra: str) -> tuple[dict, float]:
    t0 = time.time()
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snap), "--json", *extra],
                        capture_output=True, text=True)
    try:
        res = json.loads(cp.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"replay failed ({cp.returncode}):\n{cp.stdout[-2000:]}\n{cp.stderr[-2000:]}")
    if cp.returncode != 0:
        raise SystemExit(f"replay exit {cp.returncode}: {res.get('message')} {res.get('errors')}")
    return res, t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--launches", type=int, default=100000)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="cudasnap-rbench-"))
    res: dict = {"card": card()}

    loop = nvcc(HERE / "launch_loop.cu", tmp / "launch_loop")
    out, _ = run([str(loop), str(args.launches), "3"])
    native = sorted(float(x) for x in re.findall(r"us_per_launch ([\d.]+)", out))[1]
    snap = tmp / "loop.cusnap"
    run([str(loop), str(args.launches), "1"], snap)
    rj, _ = replay_json(snap)
    n = rj["launches"]
    per = (rj["last_launch_mono"] - rj["first_launch_mono"]) / max(1, n - 1) * 1e6
    res.update(launch_us_native=native, launch_us_replay=per, launch_ratio=per / native, replay_launches=n,
               replay_placed=rj["placed"], replay_fell_back=rj["fell_back"])

    big = nvcc(HERE / "big_mem.cu", tmp / "big_mem")
    bsnap = tmp / "big.cusnap"
    run([str(big)], bsnap)
    bj, t0 = replay_json(bsnap)
    res.update(first_kernel_s=bj["first_launch_unix"] - t0, big_snapshot_bytes=bsnap.stat().st_size,
               big_d2h_verified=bj["d2h_verified"], big_fell_back=bj["fell_back"])

    print(f"replay performance on {res['card']}")
    print(f"  launch rate   : native {native:.3f} us/launch, replay {per:.3f} us/launch, ratio {per / native:.2f}x (target <= 1.3)")
    print(f"  first kernel  : {res['first_kernel_s']:.2f} s after starting replay of a {bsnap.stat().st_size / 2**30:.2f} GiB snapshot with 1 GiB of device memory (target <= 2)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
