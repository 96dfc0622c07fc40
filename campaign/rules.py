"""The campaign's rules: what a cell's measurements mean and what runs next.

- A kernel whose difference from the baseline lies within noise_factor x its noise of the
  threshold (||diff| - threshold| <= noise_factor x noise) is borderline: the cell and its
  baseline are replayed again, up to max_reruns, and each side's measurements are pooled
  (each launch's repeats together; the baseline's extra replays serve this cell alone).
- A regression (a kernel or the total SLOWER) stands only when a confirmation replay, judged
  alone against the baseline, finds the same kernel SLOWER.
- A replay that crashes, times out, loses its worker or node, or cannot run (exit 2) is tried
  again on another worker, up to retries more times; after the last it is an infrastructure
  failure of the cell. A replay that no longer reproduces its results (exit 1) is a
  correctness break (MISMATCH), never retried into a pass."""
from __future__ import annotations

import copy
import statistics
from typing import Any, Dict, List, Optional, Tuple

from cudasnap.compare.core import SLOWER, compare, launch_key, launch_noise, launch_time, rel_std, weighted_noise

# verdicts of a cell
BASELINE, SAME_, FASTER_, SLOWER_ = "BASELINE", "SAME", "FASTER", "SLOWER"
MISMATCH, INFRA, NO_BASELINE, INCOMPARABLE, UNCONFIRMED = "MISMATCH", "INFRA", "NO-BASELINE", "INCOMPARABLE", "UNCONFIRMED"
NOT_TIMED = "N/A"           # a snapshot with no kernel launch (a compiler worker's): set aside when planned
REGRESSIONS = (SLOWER_, MISMATCH)

RETRYABLE = ("crash", "timeout", "lost", "error")


def outcome_of(rc: Optional[int], has_profile: bool) -> str:
    if rc == 0:
        return "ok" if has_profile else "error"
    if rc == 1:
        return "mismatch"
    if rc == 124:
        return "timeout"
    if rc is not None and rc < 0:
        return "crash"
    return "error"


def _times(r: Dict[str, Any]) -> List[float]:
    ts = r.get("times_us")
    if isinstance(ts, list) and ts:
        return [float(t) for t in ts if isinstance(t, (int, float))]
    t = launch_time(r)
    return [t] if t is not None else []


def merge_profiles(profiles: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One profile holding every run's measurements: each launch's times pooled, its median
    and the per-kernel summary recomputed. One profile is returned as it is."""
    if len(profiles) == 1:
        return profiles[0]
    out = copy.deepcopy(profiles[0])
    pooled: Dict[Tuple, Dict[str, Any]] = {}
    order: List[Tuple] = []
    for p in profiles:
        seen: Dict[Tuple, int] = {}
        for r in p.get("launches") or []:
            if not isinstance(r, dict):
                continue
            k = launch_key(r)
            n = seen[k] = seen.get(k, 0) + 1
            kk = k + (n,)
            if kk not in pooled:
                pooled[kk] = copy.deepcopy(r)
                pooled[kk]["times_us"] = []
                order.append(kk)
            pooled[kk]["times_us"] += _times(r)
    launches = []
    for kk in order:
        r = pooled[kk]
        ts = r["times_us"]
        if ts:
            m = statistics.median(ts)
            r.update(median_us=m, min_us=min(ts), max_us=max(ts), mean_us=sum(ts) / len(ts),
                     spread_pct=(max(ts) - min(ts)) / m * 100 if m > 0 else 0.0, noise_pct=rel_std(ts))
            r.pop("time_us", None)
        launches.append(r)
    out["launches"] = launches
    kernels = []
    for name in dict.fromkeys(r.get("name") for r in launches):
        rows = [r for r in launches if r.get("name") == name and launch_time(r) is not None]
        ts = [launch_time(r) for r in rows]
        if not ts:
            continue
        m = statistics.median(ts)
        kernels.append({"name": name, "launches": len(rows), "timed": len(rows), "total_us": sum(ts), "median_us": m,
                        "min_us": min(ts), "max_us": max(ts),
                        "spread_pct": max((r.get("spread_pct") or 0.0) for r in rows),
                        "noise_pct": weighted_noise([(launch_time(r), launch_noise(r)) for r in rows])})
    out["kernels"] = kernels
    s = out.setdefault("summary", {})
    s["runs_pooled"] = len(profiles)
    s["repeat"] = max(len(r["times_us"]) for r in launches) if launches else s.get("repeat")
    return out


def borderline(res: Dict[str, Any], threshold: float, factor: float) -> List[str]:
    """Kernels (and 'total') whose difference lies within factor x noise of the threshold."""
    out = []
    rows = [(k["name"], k) for k in res.get("kernels") or []] + [("total", res.get("total") or {})]
    for name, k in rows:
        d, n = k.get("diff_pct"), k.get("noise_pct")
        if d is None:
            continue
        if abs(abs(d) - threshold) <= factor * (n or 0.0):
            out.append(name)
    return out


def slower(res: Dict[str, Any]) -> List[str]:
    names = [k["name"] for k in res.get("kernels") or [] if k.get("verdict") == SLOWER]
    if (res.get("total") or {}).get("verdict") == SLOWER:
        names.append("total")
    return names


def judge(base: Dict[str, Any], cand: Dict[str, Any], threshold: float) -> Dict[str, Any]:
    return compare(base, cand, threshold=threshold)


def kernel_rows(res: Optional[Dict[str, Any]], profile: Optional[Dict[str, Any]],
                unconfirmed: Tuple[str, ...] = ()) -> List[Dict[str, Any]]:
    """The store's per-kernel rows: from the comparison when there is one, else the profile's own."""
    rows: List[Dict[str, Any]] = []
    if res is not None:
        for k in res["kernels"]:
            v = k.get("verdict")
            if v == SLOWER and k["name"] in unconfirmed:
                v = UNCONFIRMED
            rows.append({"kernel": k["name"], "launches": k.get("launches_candidate"),
                         "median_us": k.get("candidate_median_us"), "noise_pct": k.get("candidate_noise_pct"),
                         "base_median_us": k.get("base_median_us"), "base_noise_pct": k.get("base_noise_pct"),
                         "ratio": k.get("ratio"), "diff_pct": k.get("diff_pct"), "verdict": v, "why": k.get("why")})
        return rows
    for k in (profile or {}).get("kernels") or []:
        if isinstance(k, dict) and k.get("name") is not None:
            rows.append({"kernel": k["name"], "launches": k.get("launches"), "median_us": k.get("median_us"),
                         "noise_pct": k.get("noise_pct"), "verdict": None, "why": None})
    return rows
