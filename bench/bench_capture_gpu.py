"""Capture overhead on the GPU machine, measured side by side in one run.

  1. added cost per launch: C loop of 100k empty-kernel launches (x5), alternated native and
     captured processes
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


def run(cmd, capture_to: Path | None = None, capture_args=(), env=None):
    if capture_to is not None:
        cmd = [sys.executable, "-m", "cudasnap", "capture", "-q", "-f", "-o", str(capture_to), *capture_args, "--", *cmd]
    t0 = time.perf_counter()
    cp = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if cp.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{cp.stdout}\n{cp.stderr}")
    return cp.stdout, wall


def replay_result(cp: subprocess.CompletedProcess) -> dict:
    """The JSON of a `cudasnap replay --json` run; a failed replay ends the benchmark."""
    try:
        res = json.loads(cp.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"replay failed ({cp.returncode}):\n{cp.stdout[-2000:]}\n{cp.stderr[-2000:]}")
    if cp.returncode != 0:
        raise SystemExit(f"replay exit {cp.returncode}: {res.get('message')} {res.get('errors')}")
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--launches", type=int, default=100000)
    ap.add_argument("--parts", default="launch,torch,h2d", help="comma-separated subset of launch,torch,h2d")
    ap.add_argument("--launch-pairs", type=int, default=8)
    ap.add_argument("--torch-runs", type=int, default=8)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="cudasnap-bench-"))
    res: dict = {"card": card()}

    # a process's launch rate moves by up to 15% from one process to the next (seen natively):
    # alternate native and captured processes; the added cost is the median of the pairs'
    # differences (each process: median of its 5 loops)
    parts = set(args.parts.split(","))
    loop = nvcc(HERE / "launch_loop.cu", tmp / "launch_loop")
    per: dict = {"native": [], "capture": []}
    for i in range(args.launch_pairs if "launch" in parts else 0):
        for mode in per:
            snap = tmp / f"launch{i}.cusnap" if mode == "capture" else None
            out, _ = run([str(loop), str(args.launches), "5"], snap)
            per[mode].append(statistics.median(float(x) for x in re.findall(r"us_per_launch ([\d.]+)", out)))
            if snap is not None:
                res["launch_snapshot_bytes"] = snap.stat().st_size
                snap.unlink()
    if per["native"]:
        res["launch_us_per_process"] = per
        res["launch_us_native"] = nat = statistics.median(per["native"])
        res["launch_us_capture"] = cap = statistics.median(per["capture"])
        res["launch_added_us"] = statistics.median(c - n for n, c in zip(per["native"], per["capture"]))

    # the loop's wall time moves by +-30% from process to process on the same host (seen
    # natively): alternate native and captured processes; each reports its best of 3 loops.
    # Captured with the default lazy draining, and with --drain eager. numpy's OpenBLAS pool
    # (loaded with torch) spins on every core for the whole run: one BLAS thread in all modes.
    tl = HERE / "torch_loop.py"
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    t: dict = {"native": [], "capture": [], "eager": []}
    for i in range(args.torch_runs if "torch" in parts else 0):
        for mode in t:
            cargs = ("--drain", "eager") if mode == "eager" else ()
            out, _ = run([sys.executable, str(tl), "20000", "3"], tmp / f"t{mode}{i}.cusnap" if mode != "native" else None,
                         capture_args=cargs, env=env)
            t[mode].append(float(re.search(r"LOOP_S ([\d.]+)", out).group(1)))
    if t["native"]:
        res["torch_loop_runs"] = t
        for mode in ("native", "capture", "eager"):
            res[f"torch_loop_s_{mode}"] = min(t[mode])
        for mode, key in (("capture", ""), ("eager", "_eager")):
            res[f"torch_loop{key}_ratio"] = min(t[mode]) / min(t["native"])
            res[f"torch_loop{key}_ratio_median"] = statistics.median(t[mode]) / statistics.median(t["native"])

    h2d = nvcc(HERE / "h2d_loop.cu", tmp / "h2d_loop")
    # GB/s the program sees, and end to end: 2 GiB over the whole capture, from start until
    # the snapshot is complete on disk (process start and recorder drain included)
    # "unique_ram": the same unique data into a snapshot on /dev/shm (RAM), where the disk
    # does not bound it; "unique_ring4g": with a 4 GiB ring (--ring-mb 4096) that holds the burst
    ram = Path("/dev/shm")
    ram_ok = ram.is_dir() and os.statvfs(ram).f_bavail * os.statvfs(ram).f_frsize > (6 << 30)
    # "unique_oneseg": --segments 0, every chunk into the one snapshot file (the kernel
    # serializes buffered writes to one file: bench/diag/diag_storage.py); "unique_seg4": 4 segments (default 8)
    # "unique_long": 32 copies (8 GiB), sustained rather than a burst
    modes = [("unique", tmp, ()), ("same", tmp, ()), ("unique_oneseg", tmp, ("--segments", "0")),
             ("unique_seg4", tmp, ("--segments", "4")), ("unique_long", tmp, ()),
             ("unique_ring4g", tmp, ("--ring-mb", "4096"))]
    modes += [("unique_ram", ram, ())] if ram_ok else []
    for mode, where, cargs in (modes if "h2d" in parts else []):
        arg = mode.split("_")[0]
        iters = "32" if mode == "unique_long" else "8"
        out_n, _ = run([str(h2d), iters, arg])
        snap = where / f"cudasnap-bench-h2d_{mode}.cusnap"
        out_c, wall_c = run([str(h2d), iters, arg], snap, capture_args=cargs)
        res[f"h2d_{mode}_copies"] = int(iters)
        res[f"h2d_{mode}_gbps_native"] = float(re.search(r"= ([\d.]+) GB/s", out_n).group(1))
        res[f"h2d_{mode}_gbps_capture"] = float(re.search(r"= ([\d.]+) GB/s", out_c).group(1))
        res[f"h2d_{mode}_capture_wall_s"] = wall_c
        res[f"h2d_{mode}_snapshot_bytes"] = snap.stat().st_size
        snap.unlink()
    if "h2d" in parts:
        sys.path.insert(0, str(HERE / "diag"))
        import diag_storage
        res["disk_pwrite_gbps"] = diag_storage.run(tmp, diag_storage.source(128), files=1, threads=4, direct=False)

    print(f"capture overhead on {res['card']}")
    if "launch_added_us" in res:
        print(f"  C launch loop ({args.launch_pairs} native/captured process pairs x 5 x {args.launches} launches): "
              f"native {nat:.3f} us/launch, captured {cap:.3f} us/launch (medians); added "
              f"{res['launch_added_us']:+.3f} us, median of the pairs (target <= 0.3); pairs: "
              f"{' '.join(f'{c - n:+.3f}' for n, c in zip(per['native'], per['capture']))}")
    if "torch_loop_ratio" in res:
        print(f"  PyTorch loop (40k launches, best of {args.torch_runs} processes x 3 loops): native {res['torch_loop_s_native']:.3f} s, "
              f"captured {res['torch_loop_s_capture']:.3f} s: {res['torch_loop_ratio']:.3f}x, medians {res['torch_loop_ratio_median']:.3f}x "
              f"(target <= 1.05); --drain eager {res['torch_loop_s_eager']:.3f} s: {res['torch_loop_eager_ratio']:.3f}x, "
              f"medians {res['torch_loop_eager_ratio_median']:.3f}x")
    for mode in ("unique", "same", "unique_oneseg", "unique_seg4", "unique_long", "unique_ram", "unique_ring4g"):
        if f"h2d_{mode}_gbps_native" not in res:
            continue
        print(f"  H2D {res[f'h2d_{mode}_copies']:2d} x 256 MiB {mode:13s}: native {res[f'h2d_{mode}_gbps_native']:.1f} GB/s, captured {res[f'h2d_{mode}_gbps_capture']:.1f} GB/s "
              f"as the program sees it (target >= 10); whole capture {res[f'h2d_{mode}_capture_wall_s']:.2f} s, "
              f"snapshot {res[f'h2d_{mode}_snapshot_bytes'] / 2**20:.0f} MiB")
    if "disk_pwrite_gbps" in res:
        print(f"  disk: 2 GiB of 4 MiB buffered pwrites from 4 threads into one file in the snapshot directory: "
              f"{res['disk_pwrite_gbps']:.1f} GB/s (bench/diag/diag_storage.py compares ways of writing)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
