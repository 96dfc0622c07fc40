"""`cudasnap replay --profile metrics` side by side with Nsight Compute on the same program.

    python3 metrics_vs_ncu.py --name NAME [--json OUT.json] [--min-us 20] [-c N] -- CMD ...

Captures CMD, replays the snapshot with `--profile metrics --section SpeedOfLight --section
Occupancy` (and METRICS_EXTRA, comma-separated raw metrics), runs `ncu --csv --page raw` with
the same metrics on CMD twice (the second run gives
ncu's own run-to-run spread), and compares per-kernel medians for kernels of at least --min-us
(by ncu's duration): gpu__time_duration, SM, memory and DRAM throughput, achieved occupancy,
and theoretical occupancy (ncu's sm__maximum_warps_per_active_cycle_pct against cudasnap's
from the launch configuration).

Both sides run under the same conditions: clocks not locked (ncu --clock-control none;
cudasnap never locks them), caches flushed before every pass (ncu --cache-control all;
cudasnap's --flush-l2, on by default), kernels named by their mangled names (ncu
--print-kernel-base mangled; cudasnap keeps the recorded name).  A figure agrees when it is
within 5% of ncu's mean of its two runs, or within ncu's own spread (|run 1 - run 2|) when that
is larger; percentages under 10% also agree within 0.5 points (5% of a near-zero share is
below the counters' resolution).  Prints a table; exit 0 when everything compared agrees, 1
otherwise, 2 when a side could not run."""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

PY = sys.executable
COMPARED = [
    ("gpu__time_duration.sum", "duration"),
    ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "SM %"),
    ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", "mem %"),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM %"),
    ("l1tex__throughput.avg.pct_of_peak_sustained_active", "L1/TEX %"),
    ("lts__throughput.avg.pct_of_peak_sustained_elapsed", "L2 %"),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "occ achieved"),
]
# METRICS_EXTRA=a,b: more raw metrics compared side by side (cudasnap collects them with --metrics)
COMPARED += [(m, m.split(".")[0].replace("lts__t_sectors_", "L2 ").replace("srcunit_", "")[:24]) for m in os.environ.get("METRICS_EXTRA", "").split(",") if m.strip()]
THEORETICAL = "sm__maximum_warps_per_active_cycle_pct"


def _num(s: str) -> Optional[float]:
    s = (s or "").strip().replace(",", "")
    try:
        return float(s)
    except ValueError:
        return None


def parse_ncu_csv(text: str, metrics: List[str]) -> Dict[str, Dict[str, List[float]]]:
    """ncu --csv --page raw output (program output interleaved) -> {kernel: {metric: [values]}}."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    out: Dict[str, Dict[str, List[float]]] = {}
    if not lines:
        return out
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    head = rows[0]
    idx = {h: i for i, h in enumerate(head)}
    kcol = idx.get("Kernel Name")
    if kcol is None:
        return out
    for r in rows[1:]:
        if len(r) != len(head) or not r[idx.get("ID", 0)].strip().isdigit():
            continue                                   # the units row, or a malformed line
        k = out.setdefault(r[kcol], {})
        for m in metrics:
            if m in idx:
                v = _num(r[idx[m]])
                if v is not None:
                    k.setdefault(m, []).append(v)
    return out


def run_ncu(cmd: List[str], metrics: List[str], env: dict, count: Optional[int], timeout: int) -> Dict[str, Dict[str, List[float]]]:
    ncu = shutil.which("ncu")
    full = [ncu, "--csv", "--page", "raw", "--print-units", "base", "--print-kernel-base", "mangled",
            "--clock-control", "none", "--cache-control", "all", "--target-processes", "all",
            "--metrics", ",".join(metrics)] + (["-c", str(count)] if count else []) \
        + os.environ.get("NCU_EXTRA", "").split() + ["--", *cmd]
    cp = subprocess.run(full, env=env, capture_output=True, text=True, timeout=timeout)
    got = parse_ncu_csv(cp.stdout, metrics)
    if cp.returncode != 0 or not got:
        raise RuntimeError(f"ncu exit {cp.returncode}: {(cp.stderr or cp.stdout)[-1500:]}")
    return got


def run_cudasnap(snap: Path, out: Path, count: Optional[int], timeout: int) -> dict:
    cp = subprocess.run([PY, "-m", "cudasnap", "replay", str(snap), "--profile", "metrics", "--section", "SpeedOfLight",
                         "--section", "Occupancy", "--out", str(out), "-f", "--watchdog", "300",
                         *(["--metrics", os.environ["METRICS_EXTRA"]] if os.environ.get("METRICS_EXTRA") else []),
                         *(["-c", str(count)] if count else [])], capture_output=True, text=True, timeout=timeout)
    if cp.returncode != 0 or not out.exists():
        raise RuntimeError(f"cudasnap replay --profile metrics exit {cp.returncode}: {(cp.stderr + cp.stdout)[-2000:]}")
    return json.loads(out.read_text())


def capture(cmd: List[str], snap: Path, env: dict, timeout: int) -> None:
    cp = subprocess.run([PY, "-m", "cudasnap", "capture", "-f", "-o", str(snap), "--", *cmd], env=env,
                        capture_output=True, text=True, timeout=timeout)
    if cp.returncode != 0:
        raise RuntimeError(f"capture exit {cp.returncode}: {cp.stderr[-1500:]}")


def compare(report: dict, ncu_runs: List[Dict[str, Dict[str, List[float]]]], min_us: float) -> List[dict]:
    ours = {k["name"]: k for k in report.get("kernels", []) if k.get("metrics")}
    rows = []
    for name, k in ours.items():
        runs = [r.get(name) for r in ncu_runs]
        if any(r is None for r in runs):
            continue
        dur = [statistics.median(r["gpu__time_duration.sum"]) for r in runs if r.get("gpu__time_duration.sum")]
        if not dur or statistics.mean(dur) < min_us * 1e3:
            continue
        pairs = [(m, label, k["metrics"].get(m)) for m, label in COMPARED]
        pairs.append((THEORETICAL, "occ theor.", (k.get("occupancy") or {}).get("theoretical_pct")))
        for m, label, mine in pairs:
            vals = [statistics.median(r[m]) for r in runs if r.get(m)]
            if mine is None or len(vals) < len(runs):
                continue
            mean = statistics.mean(vals)
            spread = max(vals) - min(vals)
            limit = max(0.05 * abs(mean), spread)
            if m.endswith("pct") or "pct_of_peak" in m:
                if abs(mean) < 10.0:
                    limit = max(limit, 0.5)
            diff = mine - mean
            rows.append({"kernel": name, "metric": m, "label": label, "cudasnap": mine, "ncu": vals,
                         "ncu_mean": mean, "diff": diff, "diff_pct": diff / mean * 100 if mean else None,
                         "limit": limit, "ok": abs(diff) <= limit})
    return rows


def short(name: str, width: int = 48) -> str:
    return name if len(name) <= width else name[:width - 3] + "..."


def print_table(name: str, rows: List[dict]) -> None:
    print(f"\n== {name}: cudasnap --profile metrics vs ncu (2 runs), per-kernel medians")
    print(f"{'kernel':50} {'metric':13} {'cudasnap':>12} {'ncu run 1':>12} {'ncu run 2':>12} {'diff':>8} {'limit':>9}  ok")
    for r in rows:
        unit = 1e3 if r["metric"] == "gpu__time_duration.sum" else 1.0       # ns -> us
        f = (lambda v: f"{v / unit:12.2f}")
        d = f"{r['diff_pct']:+7.1f}%" if r["diff_pct"] is not None else "      -"
        lim = f"{r['limit'] / unit:9.2f}"
        n1, n2 = (r["ncu"] + [None])[:2]
        print(f"{short(r['kernel'], 50):50} {r['label']:13} {f(r['cudasnap'])} {f(n1)} "
              f"{f(n2) if n2 is not None else '           -'} {d} {lim}  {'yes' if r['ok'] else 'NO'}")
    bad = [r for r in rows if not r["ok"]]
    print(f"{len(rows)} figures compared, {len(rows) - len(bad)} agree" + (f", {len(bad)} do NOT" if bad else ""))


def side_by_side(name: str, cmd: List[str], work: Path, env: Optional[dict] = None, count: Optional[int] = None,
                 min_us: float = 20.0, timeout: int = 1800) -> dict:
    env = dict(env or os.environ)
    work.mkdir(parents=True, exist_ok=True)
    snap = work / f"{name}.cusnap"
    capture(cmd, snap, env, timeout)
    rep = run_cudasnap(snap, work / f"{name}.metrics.json", count, timeout)
    metrics = [m for m, _l in COMPARED] + [THEORETICAL]
    runs = [run_ncu(cmd, metrics, env, count, timeout) for _ in range(2)]
    rows = compare(rep, runs, min_us)
    return {"name": name, "rows": rows, "summary": rep.get("summary"), "warnings": rep.get("warnings", [])[:10],
            "ncu_kernels": len(runs[0]), "cudasnap_kernels": len(rep.get("kernels", []))}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--json")
    ap.add_argument("--work", default=os.environ.get("CUDASNAP_GPU_WORK", "/tmp/cudasnap-gpu") + "/metrics")
    ap.add_argument("--min-us", type=float, default=20.0)
    ap.add_argument("-c", "--launch-count", type=int)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd or not shutil.which("ncu"):
        print("need a command and ncu on PATH", file=sys.stderr)
        return 2
    try:
        res = side_by_side(a.name, cmd, Path(a.work), count=a.launch_count, min_us=a.min_us)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"{a.name}: {e}", file=sys.stderr)
        return 2
    print_table(a.name, res["rows"])
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(res) + "\n")
    if not res["rows"]:
        print(f"{a.name}: no kernel of >= {a.min_us} us in both", file=sys.stderr)
        return 2
    return 0 if all(r["ok"] for r in res["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
