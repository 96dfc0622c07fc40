"""Capture overhead on the GPU machine, measured side by side in one run.

  1. added cost per launch: C loop of 100k empty-kernel launches (x5), native vs captured
  2. a launch-bound PyTorch loop: wall time captured / native
  3. 256 MiB host-to-device copies: GB/s captured into the snapshot

Usage: python bench/bench_capture_gpu.py [--json OUT.json]  (needs nvcc and a GPU)"""
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


def card() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True).stdout.strip().splitlines()[0]
    except (OSError, IndexError):
        return "unknown GPU"


def nvcc(src: Path, out: Path) -> Path:
    subprocess.run(["nvcc", "-O2", "-arch=sm_90", "-o", str(out), str(src)], check=True)
    return out


def run(cmd, capture_to: Path | None = None):
    if capture_to is not None:
        cmd = [sys.executable, "-m", "cudasnap", "capture", "-q", "-o", str(capture_to), "--", *cmd]
    t0 = time.perf_counter()
    cp = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if cp.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{cp.stdout}\n{cp.stderr}")
    return cp.stdout, wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--launches", type=int, default=100000)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="cudasnap-bench-"))
    res: dict = {"card": card()}

    loop = nvcc(HERE / "launch_loop.cu", tmp / "launch_loop")
    per = {}
    for mode in ("native", "capture", "native2", "capture2"):
        out, _ = run([str(loop), str(args.launches), "5"], tmp / f"{mode}.cusnap" if mode.startswith("capture") else None)
        per[mode] = [float(x) for x in re.findall(r"us_per_launch ([\d.]+)", out)]
    nat = statistics.median(per["native"] + per["native2"])
    cap = statistics.median(per["capture"] + per["capture2"])
    res["launch_us_native"] = nat
    res["launch_us_capture"] = cap
    res["launch_added_us"] = cap - nat
    res["launch_snapshot_bytes"] = (tmp / "capture.cusnap").stat().st_size

    tl = HERE / "torch_loop.py"
    t = {}
    for mode in ("native", "capture", "native2", "capture2"):
        out, _ = run([sys.executable, str(tl), "20000"], tmp / f"t{mode}.cusnap" if mode.startswith("capture") else None)
        t[mode] = float(re.search(r"LOOP_S ([\d.]+)", out).group(1))
    res["torch_loop_s_native"] = min(t["native"], t["native2"])
    res["torch_loop_s_capture"] = min(t["capture"], t["capture2"])
    res["torch_loop_ratio"] = res["torch_loop_s_capture"] / res["torch_loop_s_native"]

    h2d = nvcc(HERE / "h2d_loop.cu", tmp / "h2d_loop")
    for mode in ("unique", "same"):
        out_n, _ = run([str(h2d), "8", mode])
        out_c, wall_c = run([str(h2d), "8", mode], tmp / f"h2d_{mode}.cusnap")
        res[f"h2d_{mode}_gbps_native"] = float(re.search(r"= ([\d.]+) GB/s", out_n).group(1))
        res[f"h2d_{mode}_gbps_capture"] = float(re.search(r"= ([\d.]+) GB/s", out_c).group(1))
        res[f"h2d_{mode}_snapshot_bytes"] = (tmp / f"h2d_{mode}.cusnap").stat().st_size

    print(f"capture overhead on {res['card']}")
    print(f"  C launch loop      : native {nat:.3f} us/launch, captured {cap:.3f} us/launch, added {cap - nat:+.3f} us (target <= 0.3)")
    print(f"  PyTorch loop (40k) : native {res['torch_loop_s_native']:.3f} s, captured {res['torch_loop_s_capture']:.3f} s, ratio {res['torch_loop_ratio']:.3f}x (target <= 1.05)")
    for mode in ("unique", "same"):
        print(f"  H2D 8 x 256 MiB {mode:6s}: native {res[f'h2d_{mode}_gbps_native']:.1f} GB/s, captured {res[f'h2d_{mode}_gbps_capture']:.1f} GB/s into the snapshot (target >= 10)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
