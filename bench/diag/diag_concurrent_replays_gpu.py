"""Why is a replay slower when every GPU of the machine runs one at once?

A campaign on 4 GPUs spent 2.25 s per replay process against 1.68 s on 1 GPU (the same cells),
which kept it under 3x. This replays each snapshot alone on GPU 0, then one copy per GPU at
the same moment, alternating, and compares the phases each profile reports
(run.timings_s: process start, reading and planning, cuInit and placement, the loop to the
first launch, the launches, the rest) and the process's wall time.

    python3 bench/diag/diag_concurrent_replays_gpu.py SNAP... [--rounds 3] [--mode timeline] [--json OUT]

Exit 0 when every replay exited 0, 2 otherwise (its line says why)."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PHASES = ("to_start", "read_and_plan", "read_and_plan.prescan", "read_and_plan.driver_load",
          "read_and_plan.profiler_start", "driver_init", "to_first_launch", "launches", "after_loop")


def gpu_count() -> int:
    cp = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return len([ln for ln in cp.stdout.splitlines() if ln.startswith("GPU ")]) if cp.returncode == 0 else 0


def start(snap: str, gpu: int, out: Path, mode: str):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
    cmd = [sys.executable, "-m", "cudasnap", "replay", snap, "--profile", mode, "--out", str(out), "-q", "--no-progress"]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), time.monotonic()


def finish(p, t0: float, out: Path, failures: list) -> dict:
    _, err = p.communicate(timeout=600)
    wall = time.monotonic() - t0
    if p.returncode != 0 or not out.exists():
        failures.append(f"{out.name}: exit {p.returncode}: {err.strip()[-300:]}")
        return {}
    t = dict((json.loads(out.read_text()).get("run") or {}).get("timings_s") or {})
    t["wall"] = wall
    return t


def mean_rows(rows: list) -> dict:
    keys = PHASES + ("wall",)
    return {k: statistics.mean(r[k] for r in rows if isinstance(r.get(k), (int, float)))
            for k in keys if any(isinstance(r.get(k), (int, float)) for r in rows)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("snapshots", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mode", default="timeline")
    ap.add_argument("--gpus", type=int, default=0, help="GPUs for the concurrent runs (default: all)")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    n = a.gpus or gpu_count()
    if n < 2:
        print(f"needs at least 2 GPUs; found {n}", file=sys.stderr)
        return 2
    failures: list = []
    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        for si, snap in enumerate(a.snapshots):
            alone, together = [], []
            for r in range(a.rounds):
                for phase in (("alone", "together") if r % 2 == 0 else ("together", "alone")):
                    if phase == "alone":
                        out = Path(tmp) / f"s{si}a{r}.json"
                        alone.append(finish(*start(snap, 0, out, a.mode), out, failures))
                    else:
                        outs = [Path(tmp) / f"s{si}t{r}_{g}.json" for g in range(n)]
                        procs = [start(snap, g, outs[g], a.mode) for g in range(n)]
                        together += [finish(p, t0, o, failures) for (p, t0), o in zip(procs, outs)]
            ma, mt = mean_rows([x for x in alone if x]), mean_rows([x for x in together if x])
            report[snap] = {"alone": ma, "together": mt, "gpus": n, "rounds": a.rounds}
            print(f"== {Path(snap).name}: mean seconds per replay, alone on GPU 0 vs {n} at once ({a.rounds} rounds)")
            for k in PHASES + ("wall",):
                if k in ma and k in mt:
                    print(f"  {k:30s} {ma[k]:8.3f} {mt[k]:8.3f}  {mt[k] - ma[k]:+7.3f}")
    for f in failures:
        print(f"failed: {f}")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    return 2 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
