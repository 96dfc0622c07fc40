"""How long CI's two workers take, modelled from the per-test times of a run.

    python bench/ci_schedule.py DURATIONS.log [--scale SUBSTR=FACTOR ...]

DURATIONS.log: the output of `pytest -n 2 -m "not gpu" --durations=0 tests` (each test's setup,
call and teardown). The model takes the tests in the order tests/conftest.py gives them (from
`pytest --collect-only`), deals them out as pytest-xdist's `load` and `worksteal` policies do, and
holds each test to the suite's lock (a timed test alone, the others together; a waiting timed
test goes first). It prints both makespans and each worker's time spent waiting on the lock.
--scale multiplies the times of the tests whose id contains SUBSTR (what a change measured in
isolation would save). A test missing from the log counts 2 ms. No GPU; runs in seconds.
"""
from __future__ import annotations

import argparse
import heapq
import importlib.util
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def durations(log: Path) -> dict:
    out: dict = defaultdict(float)
    for line in log.read_text(errors="replace").splitlines():
        m = re.match(r"^([\d.]+)s (setup|call|teardown)\s+(.+?)\s*$", line.strip())
        if m:
            out[m[3]] += float(m[1])
    return out


def collected() -> list:
    cp = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                         "-m", "not gpu", "tests"], cwd=ROOT, capture_output=True, text=True)
    ids = [ln.strip() for ln in cp.stdout.splitlines() if "::" in ln]
    if not ids:
        sys.exit(f"ci_schedule: pytest collected nothing: {cp.stderr.strip()[-300:]}")
    return ids


def timed_rule():
    sys.path.insert(0, str(ROOT / "tests"))
    spec = importlib.util.spec_from_file_location("_ci_conftest", ROOT / "tests" / "conftest.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)

    def timed(test_id: str) -> bool:
        path, name = test_id.split("::", 1)
        mod = path.rsplit("/", 1)[-1]
        return mod in conf.TIMED or f"{mod}::{name.split('[', 1)[0]}" in conf.TIMED
    return timed


def simulate(ids: list, dur, timed, policy: str, workers: int = 2):
    n = len(ids)
    pending = list(range(n))
    queue: list = [[] for _ in range(workers)]
    if policy == "load":           # xdist LoadScheduling: chunks, refilled as a worker runs low
        chunk = max(n // workers // 4, 2)
        for w in range(workers):
            queue[w], pending = pending[:chunk], pending[chunk:]
    else:                          # WorkStealingScheduling: equal halves, an idle worker takes half
        for w in range(workers):   # of the longest queue's tail
            k = len(pending) // (workers - w)
            queue[w], pending = pending[:k], pending[k:]

    def refill(w: int, last: float) -> None:
        nonlocal pending
        if policy == "load":
            if pending:
                lo, hi = max(2, len(pending) // workers // 4), max(2, len(pending) // workers // 2)
                if len(queue[w]) < lo and not (last >= 0.1 and len(queue[w]) >= 2):
                    k = hi - len(queue[w])
                    queue[w] += pending[:k]
                    pending = pending[k:]
        elif len(queue[w]) < 2:
            o = max(range(workers), key=lambda i: len(queue[i]))
            k = min(len(queue[o]) // 2, max(0, len(queue[o]) - 2))
            if k:
                queue[w] += queue[o][-k:]
                del queue[o][-k:]

    holders: dict = {}
    waiting: list = []
    events: list = []
    waited = [0.0] * workers
    done = [False] * workers
    end = [0.0] * workers

    def start(w: int, now: float) -> None:
        if not queue[w]:
            done[w] = True
            return
        mode = "EX" if timed(ids[queue[w][0]]) else "SH"
        free = not holders if mode == "EX" else all(m == "SH" for m in holders.values())
        writer_waits = any(m == "EX" for x, m, _ in waiting if x != w)
        if free and not (mode == "SH" and writer_waits):
            i = queue[w].pop(0)
            holders[w] = mode
            heapq.heappush(events, (now + dur(ids[i]), w, dur(ids[i])))
        else:
            waiting.append((w, mode, now))

    for w in range(workers):
        start(w, 0.0)
    while events:
        now, w, last = heapq.heappop(events)
        holders.pop(w, None)
        end[w] = now
        refill(w, last)
        for x, _m, since in sorted(waiting, key=lambda e: e[1] != "EX"):
            waiting.remove((x, _m, since))
            waited[x] += now - since
            start(x, now)
        start(w, now)
        for x in range(workers):
            if done[x]:
                refill(x, 0.0)
                if queue[x]:
                    done[x] = False
                    start(x, now)
    return max(end), waited


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", type=Path)
    ap.add_argument("--scale", action="append", default=[], metavar="SUBSTR=FACTOR")
    a = ap.parse_args()
    if not a.log.is_file():
        sys.exit(f"ci_schedule: {a.log}: no such file")
    times = durations(a.log)
    scale = []
    for s in a.scale:
        sub, _, f = s.rpartition("=")
        try:
            scale.append((sub, float(f)))
        except ValueError:
            sys.exit(f"ci_schedule: --scale {s!r}: expected SUBSTR=FACTOR")

    def dur(test_id: str) -> float:
        t = times.get(test_id, 0.002)
        for sub, f in scale:
            if sub in test_id:
                t *= f
        return t
    ids = collected()
    total = sum(dur(i) for i in ids)
    print(f"{len(ids)} tests, {total:.0f} s of test time, {total / 2:.0f} s on 2 workers at best")
    for policy in ("load", "worksteal"):
        span, waited = simulate(ids, dur, timed_rule(), policy)
        print(f"{policy:9s}: {span:.0f} s; waiting on the lock {' / '.join(f'{x:.0f}' for x in waited)} s")


if __name__ == "__main__":
    main()
