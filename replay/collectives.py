"""Collective kernels across ranks: how long each rank waited for its peers, and how long the
collective took once the last rank was in.

An NCCL kernel starts when its rank's stream reaches it and ends when the collective is done on
every rank, so its duration holds the wait for the slowest peer. That wait follows the ranks'
host timing, which differs from run to run (native runs included); the time after the last rank
arrived is the collective's own cost. Instances are matched across ranks by kernel name and
order (the k-th `ncclDevKernel_AllReduce...` of every rank is one collective: ranks issue the
collectives of a communicator in the same order). Times must be on one clock for every rank
(CUPTI's, or the host's: ranks of one machine share it).

The time after the last arrival also depends on which rank came last: in a ring, each rank's
time follows its distance from the last one. Run-to-run comparisons of a rank's time are
therefore made per collective kernel and last-arriving rank (`by_last`); where two runs share no
arrival order, a rank's time at each ring distance from the last rank (in rank order: NCCL's
rings on one node follow it, measured on 4 GPUs) is compared with the other run's time at that
distance, whichever rank held it there (`by_hop`)."""
from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from cudasnap.formats.vocab import COLLECTIVE_KERNEL as COLLECTIVE  # noqa: E402,F401
from cudasnap.formats.vocab import is_collective_kernel as is_collective  # noqa: E402,F401


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
    by_last: Dict[int, Dict[Tuple[str, int], List[float]]] = defaultdict(lambda: defaultdict(list))
    by_hop: Dict[int, Dict[Tuple[str, int], List[float]]] = defaultdict(lambda: defaultdict(list))
    job_hop: Dict[Tuple[str, int], List[float]] = defaultdict(list)
    pos = {r: i for i, r in enumerate(rank_ids)}
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
                by_last[r][nm, last_rank].append(own[r][-1])
                hop = (pos[r] - pos[last_rank]) % len(rank_ids)
                by_hop[r][nm, hop].append(own[r][-1])
                job_hop[nm, hop].append(own[r][-1])
    med = (lambda v: statistics.median(v) if v else None)
    return {"matched": matched, "unmatched": unmatched, "matched_by": "kernel name and order",
            "span_us": med(spans),
            "by_hop": [{"kernel": k, "hop": h, "n": len(v), "collective_us": med(v)}
                       for (k, h), v in sorted(job_hop.items())],
            "ranks": {r: {"n": len(raw[r]), "kernel_us": med(raw[r]), "wait_us": med(waits[r]),
                          "collective_us": med(own[r]),
                          "by_last": [{"kernel": k, "last": lr, "n": len(v), "collective_us": med(v)}
                                      for (k, lr), v in sorted(by_last[r].items())],
                          "by_hop": [{"kernel": k, "hop": h, "n": len(v), "collective_us": med(v)}
                                     for (k, h), v in sorted(by_hop[r].items())]}
                      for r in rank_ids}}


def compare_ranks(run: Dict[str, Any], base: Dict[str, Any], min_n: int = 5) -> Dict[int, Dict[str, Any]]:
    """Per rank, run against base (two split_waits results of one job): the collective time of
    each kernel compared within each last-arriving rank both runs saw at least min_n times, or,
    where they share none, at each ring distance from the last rank against base's time at that
    distance (any rank's). Returns {rank: {"by":
    "last rank" | "ring distance" | None, "cells": [(kernel, key, base us, run us, diff %)],
    "worst_pct": largest |diff|}}."""
    out: Dict[int, Dict[str, Any]] = {}
    for r, v in (run.get("ranks") or {}).items():
        b = (base.get("ranks") or {}).get(r) or {}
        res: Dict[str, Any] = {"by": None, "cells": [], "worst_pct": None}
        for by, field, key, src in (("last rank", "by_last", "last", b), ("ring distance", "by_hop", "hop", base)):
            have = {(c["kernel"], c[key]): c for c in src.get(field) or () if c["n"] >= min_n and c["collective_us"]}
            cells = [(c["kernel"], c[key], have[c["kernel"], c[key]]["collective_us"], c["collective_us"],
                      (c["collective_us"] - have[c["kernel"], c[key]]["collective_us"])
                      / have[c["kernel"], c[key]]["collective_us"] * 100)
                     for c in v.get(field) or () if c["n"] >= min_n and (c["kernel"], c[key]) in have]
            if cells:
                res = {"by": by, "cells": cells, "worst_pct": max(abs(x[4]) for x in cells)}
                break
        out[r] = res
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
    if c.get("span_us") is not None:
        line = f"  job: last arrival to the last rank's end {c['span_us']:.1f} us"
        hops = [h for h in c.get("by_hop") or () if h["n"]]
        if hops:       # the busiest kernel's times by ring distance from the last rank
            top = max({h["kernel"] for h in hops}, key=lambda k: sum(h["n"] for h in hops if h["kernel"] == k))
            line += "; by ring distance from the last rank: " + ", ".join(
                f"{h['hop']}: {h['collective_us']:.1f} us" for h in hops if h["kernel"] == top)
        out.append(line)
    for r, v in sorted(c["ranks"].items()):
        if v["n"]:
            out.append(f"  rank {r}: {v['n']} kernels: kernel {v['kernel_us']:.1f} us, waiting {v['wait_us']:.1f} us, "
                       f"collective {v['collective_us']:.1f} us")
    return out
