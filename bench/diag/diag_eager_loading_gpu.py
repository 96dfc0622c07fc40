"""Is CUDA_MODULE_LOADING=EAGER slower than lazy loading natively, kernel by kernel?

A campaign (bench/campaign_gpu.sh) confirmed 7 short kernels 12-42% slower when the snapshot
was replayed under eager module loading (CuPy's cub reductions and segmented sort, a PyTorch
reduction, a JAX fusion). This runs the same programs natively, without cudasnap, under CUPTI
(tests/gpu/cupti_native.py), alternating lazy and eager runs, and compares each kernel's median
duration. A kernel that is slower natively too is a property of the environment, which the
campaign reported rightly; one that is not points at the replay.

    python3 bench/diag/diag_eager_loading_gpu.py [--rounds 3] [--only cupy_libs,torch_eager] [--json OUT.json]

Per kernel: the median of its launches in each run, then the median over rounds per mode; the
ratio eager/lazy, and the lazy rounds' own spread (max/min of their medians). Kernels whose ratio
is beyond --threshold (10%) and beyond twice that spread are listed. Exit 0 when every program
ran in both modes, 2 when one could not (its line says why)."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
W = ROOT / "tests" / "gpu" / "workloads"
PROGRAMS = {
    "cupy_libs": [str(W / "cupy_libs.py")],
    "torch_eager": [str(W / "torch_eager.py")],
    "jax_jit": [str(W / "jax_jit.py")],
    "jax_train": [str(W / "jax_train.py")],
}


def run_once(prog: list, mode: str, out: Path) -> dict:
    env = {**os.environ, "CUDA_MODULE_LOADING": mode}
    cp = subprocess.run([sys.executable, str(ROOT / "tests" / "gpu" / "cupti_native.py"), str(out), *prog],
                        env=env, capture_output=True, text=True, timeout=600)
    if cp.returncode != 0 or not out.exists():
        raise RuntimeError(f"{prog[0]} under {mode}: exit {cp.returncode}: {cp.stderr.strip()[-300:]}")
    return {k: statistics.median(v) for k, v in json.loads(out.read_text())["kernels"].items() if v}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="")
    ap.add_argument("--threshold", type=float, default=10.0, help="percent")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    names = [n for n in (a.only.split(",") if a.only else PROGRAMS) if n]
    report = {}
    failed = []
    unknown = [n for n in names if n not in PROGRAMS]
    if unknown:
        print(f"unknown program(s): {', '.join(unknown)}; known: {', '.join(PROGRAMS)}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            runs = {"LAZY": [], "EAGER": []}
            try:
                for r in range(a.rounds):
                    for mode in (("LAZY", "EAGER") if r % 2 == 0 else ("EAGER", "LAZY")):   # alternate the order
                        runs[mode].append(run_once(PROGRAMS[name], mode, Path(tmp) / f"{name}.{mode}.{r}.json"))
            except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError) as e:
                print(f"== {name}: not compared: {e}")
                failed.append(name)
                continue
            rows = []
            common = set.intersection(*(set(m) for m in runs["LAZY"] + runs["EAGER"]))
            for k in sorted(common):
                lazy = [m[k] for m in runs["LAZY"]]
                eager = [m[k] for m in runs["EAGER"]]
                lz, eg = statistics.median(lazy), statistics.median(eager)
                if lz <= 0:
                    continue
                diff = (eg / lz - 1) * 100
                spread = (max(lazy) / min(lazy) - 1) * 100 if min(lazy) > 0 else float("inf")
                rows.append({"kernel": k, "lazy_us": lz, "eager_us": eg, "diff_pct": diff, "lazy_spread_pct": spread,
                             "moved": abs(diff) > a.threshold and abs(diff) > 2 * spread})
            report[name] = rows
            moved = [r for r in rows if r["moved"]]
            print(f"== {name}: {len(rows)} kernels in every run, {len(moved)} moved beyond {a.threshold:g}% "
                  f"and twice the lazy runs' spread ({a.rounds} rounds each)")
            for r in sorted(moved, key=lambda r: -abs(r["diff_pct"])):
                print(f"  {r['diff_pct']:+6.1f}%  {r['lazy_us']:9.2f} -> {r['eager_us']:9.2f} us  "
                      f"(lazy spread {r['lazy_spread_pct']:.1f}%)  {r['kernel'][:100]}")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
