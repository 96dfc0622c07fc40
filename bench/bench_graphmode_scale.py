"""Graph mode's wall time against timeline mode's, at several snapshot sizes.

    python bench/bench_graphmode_scale.py                      # the test double: 1k, 4k, 16k launches
    python bench/bench_graphmode_scale.py --sizes 2000,20000   # other sizes on the double
    python bench/bench_graphmode_scale.py SNAP.cusnap [...]     # real snapshots (on a GPU)
    python bench/bench_graphmode_scale.py SNAP.cusnap -- --repeat 5   # more `cudasnap replay` options

Each snapshot is replayed under `--profile timeline` and `--profile graph` (defaults otherwise:
graph mode's timeline check runs where CUPTI is there, its reference the graph's own replay), in
alternating order, each in its own process, wall time measured around the process.  Printed per snapshot: launches, both
wall times, graph/timeline, graph mode's phases (seconds) and its own work per launch (phases
other than the timeline check).  --json FILE writes the rows.

On the double, the snapshots are synthetic training loops (loop_program): per step, a
stream-ordered scratch allocation, a memset, launches on two streams, a device-to-device and a
host-to-device copy and a free, the operations graph mode must reproduce."""
from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
CHECK_PHASE = "checking against a timeline replay"        # recorded graph launches: a second replay
NOT_OWN = (CHECK_PHASE, "replaying (up to the last selected launch)")   # graph mode's own work: the rest


def loop_program(path, launches: int, per_step: int = 8, n: int = 16) -> Dict[str, Any]:
    """A synthetic training loop of `launches` launches on the double (per_step a step: one on
    the step's scratch memory, the rest on D, on two streams).  D2H results: D holds the count
    of launches on it, E the scratch after its one increment."""
    from synth import Synth
    s = Synth(path)
    ctx, mod, f_incr = 0x55550000, 0x55560000, 0x55570005
    D, E, H, S = 0x200000000000, 0x200000100000, 0x200000200000, 0x200000400000
    side = 0x5000
    s.double_prologue("incr", f_incr, [[0, 8], [8, 4]], ctx, mod)
    s.call("cuStreamCreate", {"phStream": side, "Flags": 0})
    for p in (D, E, H):
        s.call("cuMemAlloc_v2", {"dptr": p, "bytesize": n * 4})
    zeros = s.blob(bytes(n * 4))
    s.call("cuMemcpyHtoD_v2", {"dstDevice": D, "srcHost": 0x7F0000100000, "ByteCount": n * 4}, x={"srcHost": zeros})
    pd, ps = struct.pack("<Qi", D, n), struct.pack("<Qi", S, n)
    steps = -(-launches // per_step)
    on_d = 0
    done = 0
    for step in range(steps):
        s.call("cuMemAllocAsync", {"dptr": S, "bytesize": n * 4, "hStream": 0})
        s.call("cuMemsetD32Async", {"dstDevice": S, "ui": 0, "N": n, "hStream": 0})
        s.launch(f_incr, ps, block=n, stream=0)
        done += 1
        for k in range(min(per_step, launches - done + 1) - 1):
            s.launch(f_incr, pd, block=n, stream=side if k % 2 else 0)
            on_d += 1
            done += 1
        s.call("cuMemcpyDtoDAsync_v2", {"dstDevice": E, "srcDevice": S, "ByteCount": n * 4, "hStream": 0})
        s.call("cuMemcpyHtoD_v2", {"dstDevice": H, "srcHost": 0x7F0000300000, "ByteCount": n * 4},
               x={"srcHost": s.blob(struct.pack(f"<{n}i", *([step] * n)))})
        s.call("cuMemFreeAsync", {"dptr": S, "hStream": 0})
        if done >= launches:
            break
    s.expect_d2h(D, [on_d] * n)
    s.expect_d2h(E, [1] * n)
    s.double_epilogue(frees=[D, E, H])
    return {"launches": done, "on_d": on_d, "steps": step + 1}


def _run(argv: List[str], env: Dict[str, str], timeout: float) -> Dict[str, Any]:
    t0 = time.monotonic()
    cp = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    return {"rc": cp.returncode, "wall_s": time.monotonic() - t0, "stderr": cp.stderr[-1500:]}


def measure(snap: Path, env: Dict[str, str], extra: List[str], timeout: float, rounds: int = 1) -> Dict[str, Any]:
    """Timeline and graph replays of snap, alternating; the fastest of `rounds` of each."""
    tmp = Path(tempfile.mkdtemp(prefix="graphscale-"))
    base = [sys.executable, "-m", "cudasnap", "replay", str(snap), "-q"]
    tl_runs, gr_runs = [], []
    rep: Dict[str, Any] = {}
    for i in range(rounds):
        tl = _run(base + ["--profile", "timeline", "--out", str(tmp / f"tl{i}.json"), *extra], env, timeout)
        gr = _run(base + ["--profile", "graph", "--out", str(tmp / f"gr{i}.json"), *extra], env, timeout)
        tl_runs.append(tl)
        gr_runs.append(gr)
        if gr["rc"] == 0 and (tmp / f"gr{i}.json").exists():
            rep = json.loads((tmp / f"gr{i}.json").read_text())
    s = rep.get("summary") or {}
    phases = s.get("phases_s") or {}
    own = sum(v for k, v in phases.items() if k not in NOT_OWN)
    tl_best = min(r["wall_s"] for r in tl_runs)
    gr_best = min(r["wall_s"] for r in gr_runs)
    launches = s.get("launches") or 0
    return {"snapshot": str(snap), "launches": launches, "nodes": s.get("nodes"), "backend": s.get("backend"),
            "rc": [tl_runs[-1]["rc"], gr_runs[-1]["rc"]], "timeline_wall_s": round(tl_best, 3),
            "graph_wall_s": round(gr_best, 3), "ratio": round(gr_best / tl_best, 2) if tl_best else None,
            "phases_s": phases, "graph_own_s": round(own, 3),
            "outside_phases_s": round(gr_best - sum(phases.values()), 3),   # start, load, report, output
            "own_us_per_launch": round(own / launches * 1e6, 2) if launches else None,
            "launch_gated": s.get("launch_gated"), "launch_gate": s.get("launch_gate"),
            "timed_runs": s.get("timed_runs"), "runs_note": s.get("runs_note"),
            "node_check_within_5pct": (s.get("check") or {}).get("within_5pct"),
            "timeline_check": {k: v for k, v in (s.get("timeline_check") or {}).items() if k != "outside"} or None,
            "timeline_outside": [(c.get("name", "")[:80], round(c.get("diff_pct", 0.0), 2))
                                 for c in (s.get("timeline_check") or {}).get("outside", [])],
            "error": s.get("error") or (gr_runs[-1]["stderr"] if gr_runs[-1]["rc"] else None)}


def _double_env() -> Dict[str, str]:
    sys.path.insert(0, str(ROOT / "tests" / "double"))
    sys.path.insert(0, str(ROOT / "tests"))              # the synthetic snapshot writer (tests/synth.py)
    import build  # the test double's builder
    out = Path(os.environ.get("CUDASNAP_DOUBLE_BUILD_DIR") or tempfile.mkdtemp(prefix="cudadouble-"))
    env = dict(build.env_for(build.build(out)))
    env.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    return env


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("snapshots", nargs="*", type=Path, help="real snapshots (default: synthetic loops on the double)")
    ap.add_argument("--sizes", default="1000,4000,16000", help="launch counts of the synthetic loops")
    ap.add_argument("--rounds", type=int, default=1, help="replays of each mode per snapshot (the fastest counts)")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--json", type=Path, help="write the rows here")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:cut])
    extra = argv[cut + 1:]                  # after --: more `cudasnap replay` options
    for p in a.snapshots:
        if not p.is_file():
            print(f"bench_graphmode_scale: error: {p}: no such snapshot", file=sys.stderr)
            return 2
    rows = []
    if a.snapshots:
        env = dict(os.environ)
        snaps = list(a.snapshots)
    else:
        try:
            sizes = [int(x) for x in a.sizes.split(",") if x.strip()]
        except ValueError:
            print(f"bench_graphmode_scale: error: --sizes {a.sizes!r}: comma-separated launch counts", file=sys.stderr)
            return 2
        env = _double_env()
        d = Path(tempfile.mkdtemp(prefix="graphscale-snaps-"))
        snaps = []
        for n in sizes:
            snaps.append(d / f"loop{n}.cusnap")
            loop_program(snaps[-1], n)
    print(f"{'launches':>9} {'timeline s':>10} {'graph s':>8} {'ratio':>6} {'own s':>7} {'own us/launch':>13} "
          f"{'other s':>7}  phases (s)")
    for snap in snaps:
        r = measure(snap, env, extra, a.timeout, a.rounds)
        rows.append(r)
        ph = ", ".join(f"{k} {v:.2f}" for k, v in r["phases_s"].items())
        print(f"{r['launches']:>9,} {r['timeline_wall_s']:>10.2f} {r['graph_wall_s']:>8.2f} {r['ratio'] or 0:>6.2f} "
              f"{r['graph_own_s']:>7.2f} {r['own_us_per_launch'] or 0:>13.1f} {r['outside_phases_s']:>7.2f}  {ph}"
              + (f"  ERROR {r['error'][-200:]}" if r["error"] else ""))
        sys.stdout.flush()
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2))
    return 0 if all(r["rc"] == [0, 0] and not r["error"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
