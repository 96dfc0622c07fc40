"""Collective kernels across ranks: how long each rank waited for its peers, and how long the
collective took once the last rank was in.

An NCCL kernel starts when its rank's stream reaches it and ends when the collective is done on
every rank, so its duration holds the wait for the slowest peer. That wait follows the ranks'
host timing, which differs from run to run (native runs included); the time after the last rank
arrived is the collective's own cost. Instances are matched across ranks by kernel name and
order (the k-th `ncclDevKernel_AllReduce...` of every rank is one collective: ranks issue the
collectives of a communicator in the same order). Times must be on one clock for every rank
(CUPTI's, or the host's: ranks of one machine share it).

The time after the last arrival also depends on which rank came last: in a ring, the ranks
downstream of it finish later. Run-to-run comparisons of a rank's time are therefore made per
last-arriving rank (`by_last`), so that two runs with different arrival orders still compare."""
from __future__ import annotations

import re
import statistics
from collections import defaultdict
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

COLLECTIVE = re.compile(r"(nccl|rccl)\w*Kernel", re.I)      # demangled or mangled names


def is_collective(name: Optional[str]) -> bool:
    return bool(name) and bool(COLLECTIVE.search(name))


def _base(name: str) -> str:
    return name.split("(", 1)[0]


def split_waits(ranks: Dict[int, Iterable[Tuple[str, int, int]]]) -> Dict[str, Any]:
    """ranks: rank -> (kernel name, start ns, end ns) of its kernels (any order; non-collective
    ones are ignored). Returns {"matched": instances seen on every rank, "unmatched": kernels left
    over, "ranks": {rank: {n, kernel_us, wait_us, collective_us: medians}}, "per_kernel": ...}."""
    per: Dict[int, Dict[str, List[Tuple[int, int]]]] = {}
    for r, rows in ranks.items():
        d: Dict[str, List[Tuple[int, int]]] = defaultdict(list)
        for name, t0, t1 in rows:
            if is_collective(name) and isinstance(t0, (int, float)) and isinstance(t1, (int, float)):
                d[_base(name)].append((t0, t1))
        for v in d.values():
            v.sort()
        per[r] = d
    rank_ids = sorted(per)
    names = set().union(*(set(d) for d in per.values())) if per else set()
    waits: Dict[int, List[float]] = defaultdict(list)
    own: Dict[int, List[float]] = defaultdict(list)
    by_last: Dict[int, Dict[int, List[float]]] = defaultdict(lambda: defaultdict(list))
    spans: List[float] = []
    raw: Dict[int, List[float]] = defaultdict(list)
    matched = unmatched = 0
    for nm in sorted(names):
        counts = [len(per[r].get(nm, ())) for r in rank_ids]
        k = min(counts)
        unmatched += sum(counts) - k * len(rank_ids)
        for i in range(k):
            last, last_rank = max((per[r][nm][i][0], r) for r in rank_ids)
            matched += 1
            spans.append(max(0, max(per[r][nm][i][1] for r in rank_ids) - last) / 1e3)
            for r in rank_ids:
                t0, t1 = per[r][nm][i]
                raw[r].append((t1 - t0) / 1e3)
                waits[r].append(max(0, last - t0) / 1e3)
                own[r].append(max(0, t1 - max(t0, last)) / 1e3)
                by_last[r][last_rank].append(own[r][-1])
    med = (lambda v: statistics.median(v) if v else None)
    return {"matched": matched, "unmatched": unmatched, "matched_by": "kernel name and order",
            "span_us": med(spans),
            "ranks": {r: {"n": len(raw[r]), "kernel_us": med(raw[r]), "wait_us": med(waits[r]),
                          "collective_us": med(own[r]),
                          "by_last": {lr: {"n": len(v), "collective_us": med(v)} for lr, v in sorted(by_last[r].items())}}
                      for r in rank_ids}}


def compare_ranks(run: Dict[str, Any], base: Dict[str, Any], min_n: int = 5) -> Dict[int, Dict[str, Any]]:
    """Per rank, run against base (two split_waits results of one job): the collective time
    compared within each last-arriving rank both runs saw at least min_n times. Returns
    {rank: {"cells": [(last rank, base us, run us, diff %)], "worst_pct": largest |diff|}}."""
    out: Dict[int, Dict[str, Any]] = {}
    for r, v in (run.get("ranks") or {}).items():
        b = (base.get("ranks") or {}).get(r) or {}
        cells = []
        for lr, c in (v.get("by_last") or {}).items():
            bc = (b.get("by_last") or {}).get(lr)
            if bc and c["n"] >= min_n and bc["n"] >= min_n and bc["collective_us"]:
                cells.append((lr, bc["collective_us"], c["collective_us"],
                              (c["collective_us"] - bc["collective_us"]) / bc["collective_us"] * 100))
        out[r] = {"cells": cells, "worst_pct": max((abs(x[3]) for x in cells), default=None)}
    return out


def from_launch_rows(rows_by_rank: Dict[int, Sequence[Dict[str, Any]]]) -> Dict[str, Any]:
    """split_waits over profile launch rows (name, start_ns, end_ns: --profile timeline --out)."""
    return split_waits({r: [((x.get("demangled") or x.get("name") or ""), x.get("start_ns"), x.get("end_ns")) for x in rows]
                        for r, rows in rows_by_rank.items()})


def load_rows(path: str) -> List[Dict[str, Any]]:
    """The launch rows of a --profile --out file (.json or .csv)."""
    if path.lower().endswith(".csv"):
        import csv
        with open(path, newline="") as f:
            rows = [r for r in csv.DictReader(f) if r.get("start_ns") and r.get("end_ns")]
        return [{"name": r.get("name"), "start_ns": int(float(r["start_ns"])), "end_ns": int(float(r["end_ns"]))}
                for r in rows]
    import json
    with open(path) as f:
        return list(json.load(f).get("launches") or [])


def describe(c: Dict[str, Any]) -> List[str]:
    """Summary lines (empty when no collective was matched)."""
    if not c or not c.get("matched"):
        return []
    out = [f"collectives: {c['matched']} matched across ranks by {c['matched_by']}"
           + (f", {c['unmatched']} kernels on some ranks only" if c.get("unmatched") else "")
           + "; per rank, medians of: the kernel, its wait for peers, the collective after the last rank arrived"]
    for r, v in sorted(c["ranks"].items()):
        if v["n"]:
            out.append(f"  rank {r}: {v['n']} kernels: kernel {v['kernel_us']:.1f} us, waiting {v['wait_us']:.1f} us, "
                       f"collective {v['collective_us']:.1f} us")
    return out
