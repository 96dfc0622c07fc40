"""A kept campaign worker's replays, timed per phase (no GPU: the test double).

    python bench/bench_kept.py [--launches 1000] [--replays 6] [--mode timeline|isolated]
                               [--cprofile OUT.prof] [--json OUT]
    python bench/bench_kept.py --snapshot SNAP ...        # a real snapshot, this machine's GPU

Runs a synthetic training loop of --launches launches (bench_graphmode_scale.loop_program) as a
campaign's kept worker does (campaign/cellserver.py _kept_loop): replay after replay in one
process, each a profiled replay through replay/invocation.run, each given back (close_replays)
before the next. Prints per replay its wall time, the replay's own `launches` time, the fixed
cost (wall minus launches, what a campaign prints) and run.timings_s, then the mean of each
phase over replays 2..N (what a kept worker pays once the first replay has warmed it).
--cprofile: a CPU profile (cProfile) of replays 2..N, its top functions printed."""
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


def _child(a) -> int:
    import cProfile
    import pstats
    from cudasnap.replay.engine import close_replays, track_replays
    from cudasnap.replay.invocation import profiled, run
    from cudasnap.replay.preflight import snapshot_problem
    assert snapshot_problem(a.snap) is None
    track_replays()
    prof = cProfile.Profile() if a.cprofile else None
    rows = []
    for i in range(a.replays):
        out = os.path.join(a.work, f"r{i}.json")
        t0 = time.monotonic()
        if prof is not None and i > 0:
            prof.enable()
        rc = run(profiled(a.snap, out, a.mode, None, a.repeat, 1), checked=True)
        closed = close_replays()
        if prof is not None and i > 0:
            prof.disable()
        wall = time.monotonic() - t0
        t = (json.loads(Path(out).read_text()).get("run") or {}).get("timings_s") or {} if os.path.exists(out) else {}
        rows.append({"rc": rc, "wall_s": round(wall, 4), "timings_s": t, "closed": closed})
    if prof is not None:
        prof.dump_stats(a.cprofile)
        st = pstats.Stats(a.cprofile, stream=sys.stderr)
        st.sort_stats("cumulative").print_stats(30)
        st.sort_stats("tottime").print_stats(20)
    Path(a.rows).write_text(json.dumps(rows))
    return 0


def _snapshot(work: Path, launches: int):
    sys.path.insert(0, str(ROOT / "tests" / "double"))
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT / "bench"))
    import build                                      # the test double's builder
    from bench_graphmode_scale import loop_program
    env = dict(build.env_for(build.build(Path(os.environ.get("CUDASNAP_DOUBLE_BUILD_DIR") or work / "double"))))
    env.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    snap = work / "loop.cusnap"
    loop_program(snap, launches)
    return env, snap


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=1000)
    ap.add_argument("--replays", type=int, default=6)
    ap.add_argument("--mode", default="timeline")
    ap.add_argument("--repeat", type=int, default=3, help="isolated: runs per launch")
    ap.add_argument("--snapshot", help="a real snapshot, replayed on this machine's GPU")
    ap.add_argument("--cprofile", help="write a cProfile of replays 2..N here")
    ap.add_argument("--json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--snap", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--rows", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return _child(a)
    work = Path(tempfile.mkdtemp(prefix="bench-kept-"))
    if a.snapshot:
        env, snap = dict(os.environ), Path(a.snapshot).resolve()
    else:
        env, snap = _snapshot(work, a.launches)
    rows_path = work / "rows.json"
    cmd = [sys.executable, __file__, "--child", "--snap", str(snap), "--work", str(work), "--rows", str(rows_path),
           "--replays", str(a.replays), "--mode", a.mode, "--repeat", str(a.repeat)]
    if a.cprofile:
        cmd += ["--cprofile", os.path.abspath(a.cprofile)]
    # stdout as a kept worker's: nowhere (the profile tables it prints are not read)
    cp = subprocess.run(cmd, env=env, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=1800)
    if cp.returncode != 0 or not rows_path.exists():
        sys.stderr.write(cp.stderr[-3000:])
        return 2
    if a.cprofile:
        Path(a.cprofile + ".txt").write_text(cp.stderr)
    rows = json.loads(rows_path.read_text())
    print(f"{a.mode} replays of {snap.name} in one kept process" + ("" if a.snapshot else f" ({a.launches} launches)"))
    print(f"{'#':>3} {'rc':>3} {'wall_s':>8} {'launches':>9} {'fixed_s':>8}")
    for i, r in enumerate(rows):
        la = r["timings_s"].get("launches") or 0.0
        r["fixed_s"] = round(r["wall_s"] - la, 4)
        print(f"{i + 1:>3} {r['rc']:>3} {r['wall_s']:>8.4f} {la:>9.4f} {r['fixed_s']:>8.4f}")
    later = rows[1:] or rows
    phases = {}
    for r in later:
        for k, v in r["timings_s"].items():
            if isinstance(v, (int, float)):
                phases.setdefault(k, []).append(v)
    means = {k: round(statistics.mean(v), 4) for k, v in phases.items()}
    print(f"\nmean of replays 2..{len(rows)}: wall {statistics.mean(r['wall_s'] for r in later):.4f} s, "
          f"fixed {statistics.mean(r['fixed_s'] for r in later):.4f} s")
    for k, v in means.items():
        print(f"  {k:<32}{v:>9.4f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "phase_means": means}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
