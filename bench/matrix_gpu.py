"""Command x workload matrix on every GPU of this machine: each workload of tests/gpu/matrix.py
runs all commands pinned to one GPU (CUDA_VISIBLE_DEVICES), workloads spread over the GPUs, the
whole matrix --runs times. Prints a markdown table (the one bench/RESULTS.md keeps) and writes
every cell to --json.

    python3 bench/matrix_gpu.py [--runs 2] [--only torch_eager,jax_jit] [--gpus 0,1,2] [--slots 3] [--json OUT.json]
Exit 0 when every applicable cell of every workload passed, 1 otherwise (a workload left out by
--deadline included)."""
from __future__ import annotations

import argparse
import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
from matrix import JOBS, WORKLOADS, GpuGate, run_workload, sim_coverage, table  # noqa: E402


def gpus() -> list:
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,name", "--format=csv,noheader"],
                         capture_output=True, text=True, check=True).stdout.strip().splitlines()
    return [l.split(",", 1) for l in out]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--only", default="")
    ap.add_argument("--json", default="")
    ap.add_argument("--work", default="/tmp/cudasnap-matrix")
    ap.add_argument("--gpus", default="", help="GPU indices to use, e.g. 0,1,2 (default: all)")
    ap.add_argument("--slots", type=int, default=1, help="workloads run at once on each GPU (a machine of "
                    "one GPU); their timeline profiles, metrics and advise still run alone on it")
    ap.add_argument("--deadline", type=float, default=0, help="seconds: start no workload that would end after "
                    "this (by its usual time), so the table is printed before an outer time limit")
    a = ap.parse_args()
    names = [n for n in (a.only.split(",") if a.only else WORKLOADS) if n]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        print(f"unknown workload(s): {', '.join(unknown)}; known: {', '.join(WORKLOADS)}", file=sys.stderr)
        return 2
    cards = gpus()
    if a.gpus:
        keep = set(a.gpus.split(","))
        cards = [c for c in cards if c[0].strip() in keep]
    print(f"{len(cards)} GPU(s): " + "; ".join(f"{i}:{n.strip()}" for i, n in cards), flush=True)
    jobs: "queue.Queue" = queue.Queue()
    multi = [(run, n) for run in range(1, a.runs + 1) for n in names if n in JOBS]
    # longest workloads first (seconds per workload on an H200), so no GPU starts a long one last
    cost = {"torch_train_compile": 120, "torch_compile": 110, "torch_libs": 80, "torch_eager": 71, "cupy_libs": 62,
            "jax_train": 50, "torch_graph": 47, "triton_kernel": 42, "jax_jit": 36, "nvcc_mt_launch": 30, "nvcc_samples": 30,
            "nvcc_ptrs": 25, "ddp_nccl": 190, "hf_generate": 108, "vision_amp_train": 100, "pyg_gnn": 84}
    singles = [(run, n) for run in range(1, a.runs + 1) for n in names if n not in JOBS]
    for run, n in sorted(singles, key=lambda x: (-cost.get(x[1], 60), x[0])):
        jobs.put((run, n))
    rows, lock = [], threading.Lock()
    # --slots: the workloads sharing a GPU run their measurements (timeline, metrics, advise) alone
    gates = {i: GpuGate() for i, _ in cards} if a.slots > 1 else {}
    start = time.monotonic()

    def late(n: str) -> bool:
        """--deadline: would workload n end after it? Then it is recorded as not run."""
        if not a.deadline or time.monotonic() - start + cost.get(n, 60 if n not in JOBS else 180) <= a.deadline:
            return False
        return True

    def write_logs():
        """The command logs of workloads with a failed cell, beside the JSON; for a failed compare,
        the two timeline profiles it read too (the evidence of a verdict between identical replays)."""
        failed = sorted({(r["run"], r["workload"], c) for r in rows for c, v in r["cells"].items() if v["ok"] is False})
        files = []
        for run, n, c in failed:
            d = Path(a.work) / f"r{run}" / n
            files.append((d / "commands.log", f"r{run}_{n}.log"))
            if c == "compare":
                files += [(p, f"r{run}_{n}.{p.name}") for p in sorted(d.glob("t[12]*.json"))]
        files = sorted({(p, name) for p, name in files if p.exists()})
        if files:
            import tarfile
            with tarfile.open(Path(a.json).with_suffix(".logs.tar.xz"), "w:xz") as t:
                for p, name in files:
                    t.add(p, arcname=name)

    def one(run: int, n: str, gpu: str):
        if late(n):
            with lock:
                rows.append({"run": run, "workload": n, "gpu": gpu, "s": 0, "cells": {}, "not_run": "deadline"})
            print(f"[gpu{gpu} r{run}] {n}: not started (--deadline {a.deadline:g} s)", flush=True)
            return
        t0 = time.monotonic()
        cells = run_workload(n, Path(a.work) / f"r{run}" / n, {"CUDA_VISIBLE_DEVICES": gpu},
                             log=lambda s, g=gpu, r=run: print(f"[gpu{g} r{r}] {s}", flush=True), gate=gates.get(gpu))
        with lock:
            rows.append({"run": run, "workload": n, "gpu": gpu, "s": round(time.monotonic() - t0, 1), "cells": cells})
            if a.json:      # after every workload: a run cut short still leaves its rows and logs
                Path(a.json).write_text(json.dumps({"cards": cards, "rows": rows}, indent=1))
                if any(v["ok"] is False for v in cells.values()):
                    write_logs()

    def worker(gpu: str):
        while True:
            try:
                run, n = jobs.get_nowait()
            except queue.Empty:
                return
            one(run, n, gpu)

    def job_lane(gpus_: list):
        """Several-GPU workloads first on the last GPUs, then those GPUs take single ones."""
        for run, n in multi:
            if len(gpus_) < JOBS[n]:
                with lock:
                    rows.append({"run": run, "workload": n, "gpu": "", "s": 0, "cells": {
                        "capture": {"ok": False, "s": 0, "detail": f"needs {JOBS[n]} GPUs, this machine has {len(cards)}"}}})
                continue
            one(run, n, ",".join(gpus_[:JOBS[n]]))
        ws = [threading.Thread(target=worker, args=(g,)) for g in gpus_]
        for w in ws:
            w.start()
        for w in ws:
            w.join()


    t0 = time.monotonic()
    ids = [i for i, _ in cards]
    k = max([JOBS[n] for _, n in multi], default=0)
    lane = ids[-k:] if multi and len(ids) >= k else (ids if multi else [])
    ts = [threading.Thread(target=worker, args=(i,)) for i in ids if i not in lane for _ in range(max(1, a.slots))]
    ts.append(threading.Thread(target=job_lane, args=(lane,)))
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    rows.sort(key=lambda r: (r["run"], names.index(r["workload"])))
    print(f"\nmatrix: {len(rows)} workload runs in {time.monotonic() - t0:.0f} s on {len(cards)} GPU(s) "
          f"({cards[0][1].strip()})\n")
    print(table(rows))
    cov = sim_coverage(rows)
    if cov:
        print("simulator coverage (sim column: kernels that can run on GPGPU-Sim / all, their share of GPU time):\n" + cov)
    bad = [(r["run"], r["workload"], k, v["detail"]) for r in rows for k, v in r["cells"].items() if v["ok"] is False]
    for b in bad:
        print("FAIL", *b)
    graph = [(r["workload"], r["cells"]["graph"]["detail"]) for r in rows if r["cells"].get("graph", {}).get("ok")]
    for w, d in graph:
        print(f"graph {w}: {d}")
    if a.json:
        Path(a.json).write_text(json.dumps({"cards": cards, "rows": rows}, indent=1))
        write_logs()
    skipped = [(r["run"], r["workload"]) for r in rows if r.get("not_run")]
    if skipped:
        print(f"not run (--deadline): {len(skipped)} workload run(s): " + ", ".join(f"{w} (run {k})" for k, w in skipped))
    return 1 if bad or skipped else 0


if __name__ == "__main__":
    sys.exit(main())
