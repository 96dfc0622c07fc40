"""Campaign engine throughput: cells per hour on K GPUs, the engine's overhead per cell, and
the store's size per 1,000 cells.

Runs a campaign (SNAPSHOTS x 2 environments that differ by one unused variable, no reruns or
confirmations, so every cell is one replay) through cudasnap.campaign's engine on a local Ray
runtime with K GPUs, then reads the store:
  - cells per hour: cells / campaign wall time (Ray start-up excluded) x 3600;
  - per cell: the replay process's wall time (attempts.proc_s), of which process start (the
    interpreter and cudasnap's import: `python -m cudasnap --version`, median of 3) and the
    replay's own time (the rest); the engine's overhead: GPU-slot time outside any replay
    process ((wall x K - sum of proc_s) / cells: scheduling, snapshot lookup, results to the
    driver, the store) plus process start;
  - the store's size per 1,000 cells (after a WAL checkpoint).

On the CUDA test double (no GPU; K fake GPUs): python bench/bench_campaign.py --double --gpus 2
                                                [--launches 1000 --workers kept]
On a GPU machine: python bench/bench_campaign.py --gpus 4 --snapshots 'DIR/*.cusnap'
Options: --cells-per-snapshot is fixed at 2 (two envs); --copies C replays each snapshot file C
times under other env names (more cells); --repeat (isolated repeats); --workers fresh|warm|kept
([rules] workers; the campaign's fixed cost per replay and per cell are printed); --json OUT."""
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

ROOT = Path(__file__).resolve().parents[1]


def _double_env(work: Path, n_snaps: int, launches: int = 0) -> str:
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT / "bench"))
    from double.fixtures import _load_build_module
    from test_compare import three_kernels
    from bench_graphmode_scale import loop_program
    b = _load_build_module()
    paths = b.build(work / "double")
    os.environ["LD_LIBRARY_PATH"] = b.env_for(paths)["LD_LIBRARY_PATH"]
    snaps = work / "snaps"
    snaps.mkdir()
    for i in range(n_snaps):
        if launches:             # a training loop of that many launches
            loop_program(snaps / f"s{i:03d}.cusnap", launches + i)
        else:
            three_kernels(snaps / f"s{i:03d}.cusnap", n=64 + 32 * i)
    return str(snaps / "*.cusnap")


def process_start() -> float:
    ts = []
    for _ in range(3):
        t = time.monotonic()
        subprocess.run([sys.executable, "-m", "cudasnap", "--version"], capture_output=True, check=True)
        ts.append(time.monotonic() - t)
    return statistics.median(ts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--double", action="store_true", help="the CUDA test double and synthetic snapshots")
    ap.add_argument("--snapshots", default=None, help="a glob of snapshots (GPU machine)")
    ap.add_argument("--n-snapshots", type=int, default=8, help="--double: how many synthetic snapshots")
    ap.add_argument("--copies", type=int, default=1, help="environments per snapshot = 2 x copies")
    ap.add_argument("--launches", type=int, default=0, help="--double: synthetic training loops of this many "
                    "launches (bench_graphmode_scale.loop_program) instead of three-kernel programs")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--mode", default="isolated", choices=["isolated", "timeline"])
    ap.add_argument("--pairs", type=int, default=None, help="[rules] pairs: rounds of baseline and candidates a cell")
    ap.add_argument("--workers", default=None, choices=["fresh", "warm", "kept"], help="[rules] workers")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if not a.double and not a.snapshots:
        ap.error("give --double or --snapshots GLOB")
    work = Path(tempfile.mkdtemp(prefix="cudasnap-bench-campaign-"))
    glob = _double_env(work, a.n_snapshots, a.launches) if a.double else os.path.abspath(a.snapshots)
    steady = 'CUDA_DOUBLE_SLOW = "*:1", CUDA_DOUBLE_SLOW_FLOOR_US = "200", ' if a.double else ""
    envs = "".join(f'[[env]]\nname = "e{i}"\nvars = {{ {steady}CUDASNAP_BENCH_ENV = "{i}" }}\n'
                   for i in range(2 * a.copies))
    camp_path = work / "bench.toml"
    camp_path.write_text(f'name = "bench"\nbaseline = "e0"\n[rules]\nrepeats = {a.repeat}\nwarmup = 1\n'
                         f'threshold = 50\nmax_reruns = 0\nconfirm = false\nretries = 1\n'
                         + (f'workers = "{a.workers}"\n' if a.workers else "")
                         + (f'pairs = {a.pairs}\n' if a.pairs else "") +
                         f'[[snapshot]]\npath = "{glob}"\nprofile = "{a.mode}"\n{envs}')

    import ray
    from cudasnap import __version__
    from cudasnap.campaign import Store, load_campaign
    from cudasnap.campaign.engine import Engine
    camp = load_campaign(camp_path)
    store = Store(work / "bench.sqlite")
    run_id, _ = store.open_run(camp, __version__, None, fresh=True)
    init = {"num_cpus": max(2, a.gpus), "num_gpus": a.gpus}
    if a.double:
        init["resources"] = {"gpu_model:TEST": a.gpus}
    t0 = time.monotonic()
    ray.init(address="local", include_dashboard=False, log_to_driver=False, **init)
    ray_start = time.monotonic() - t0
    eng = Engine(camp, store, run_id, on_event=None)
    t0 = time.monotonic()
    counts = eng.run({})
    wall = time.monotonic() - t0
    store.close_run(run_id, "done", eng.hosts, 0)
    eng.shutdown()
    db = store.db
    cells = counts["ran"]
    # a shared baseline replay is written under every cell it served: each replay once
    proc = [r[-1] for r in db.execute("SELECT DISTINCT started, ended, node_id, visible_devices, proc_s "
                                     "FROM attempts WHERE proc_s IS NOT NULL")]
    attempts = len(proc)
    bad = db.execute("SELECT COUNT(*) FROM cells WHERE status<>'ok'").fetchone()[0]
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    size = os.path.getsize(work / "bench.sqlite")
    start = process_start()
    slot_idle = (wall * a.gpus - sum(proc)) / max(1, attempts)
    res = {"gpus": a.gpus, "double": a.double, "cells": cells, "attempts": attempts, "failed_cells": bad,
           "ray_start_s": round(ray_start, 2), "wall_s": round(wall, 2),
           "cells_per_hour": round(cells / wall * 3600) if wall > 0 else None,
           "replay_process_s_median": round(statistics.median(proc), 3) if proc else None,
           "process_start_s": round(start, 3),
           "replay_own_s_median": round(statistics.median(proc) - start, 3) if proc else None,
           "engine_slot_overhead_s_per_cell": round(slot_idle, 3),
           "engine_overhead_s_per_cell": round(slot_idle + start, 3),
           "store_bytes_per_1000_cells": round(size / max(1, cells) * 1000), "store_bytes": size,
           # the campaign's own account: time outside the replays' launches, per replay and cell
           **{k: (counts.get("cost") or {}).get(k) for k in ("workers", "fixed_s_per_replay", "fixed_s_per_cell", "fixed_s_per_cell_started",
                                                              "replays_per_cell")},
           "work": str(work)}
    for k, v in res.items():
        print(f"{k}: {v}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0 if bad == 0 else 2


if __name__ == "__main__":
    sys.exit(main())
