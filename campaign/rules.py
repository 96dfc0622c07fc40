"""The campaign's rules: what a cell's measurements mean and what runs next.

- A kernel whose difference from the baseline lies within noise_factor x its noise of the
  threshold, or of a paired cell's bar (||diff| - bar| <= noise_factor x noise), is borderline: the cell and its
  baseline are replayed again, up to max_reruns, and each side's measurements are pooled
  (each launch's repeats together; the baseline's extra replays serve this cell alone).
- A candidate is judged against its baseline replayed on the same GPU, close in time: one task
  replays them A B A B (`pairs` rounds). A kernel is SLOWER or FASTER only when Mann-Whitney U
  on its timed runs (each run's launches of it summed) gives p <= alpha and its ratio of
  medians lies beyond the bar: max(threshold, noise_sigmas x the campaign's noise), the noise
  being the spread of the null ratios the campaign measures across its GPUs and runs (noise.py).
- A verdict (SLOWER or FASTER) stands only when a confirmation task on another GPU (another
  node where the cluster has one), judged alone, finds the same kernel the same way. With one
  GPU it stands unconfirmed ("unconfirmed: one GPU").
- A cell judged against an earlier run (`baseline = "run:N"`), or against a baseline env that
  asks for another GPU model, cannot be paired: it is compared with the baseline's profile as
  `cudasnap compare` does, reruns replaying the baseline again, a regression confirmed by one
  more replay.
- A replay that crashes, times out, loses its worker or node, or cannot run (exit 2) is tried
  again on another worker, up to retries more times; after the last it is an infrastructure
  failure of the cell. A replay that no longer reproduces its results (exit 1) is a
  correctness break (MISMATCH), never retried into a pass."""
from __future__ import annotations

import copy
import math
import statistics
from typing import Any, Callable, Dict, List, Optional, Tuple

from cudasnap.compare.core import (FASTER, MIN_DIFF_US, SAME, SLOWER, compare, launch_key, launch_noise, launch_time,
                                   rel_std, weighted_noise)

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
        bar = k.get("bar_pct") or threshold          # a paired cell's bar (judge_paired)
        if abs(abs(d) - bar) <= factor * (n or 0.0):
            out.append(name)
    return out


def slower(res: Dict[str, Any]) -> List[str]:
    names = [k["name"] for k in res.get("kernels") or [] if k.get("verdict") == SLOWER]
    if (res.get("total") or {}).get("verdict") == SLOWER:
        names.append("total")
    return names


def faster(res: Dict[str, Any]) -> List[str]:
    names = [k["name"] for k in res.get("kernels") or [] if k.get("verdict") == FASTER]
    if (res.get("total") or {}).get("verdict") == FASTER:
        names.append("total")
    return names


def judge(base: Dict[str, Any], cand: Dict[str, Any], threshold: float) -> Dict[str, Any]:
    return compare(base, cand, threshold=threshold)


# --------------------------------------------------------------------------- paired judgement
TOTAL = "total"


def samples(profile: Dict[str, Any], name: Optional[str]) -> List[float]:
    """One replay's samples of a kernel (name None: every kernel, the total): with repeats, one
    per timed run, its launches of the kernel summed; without, each launch's time."""
    rows = [r for r in profile.get("launches") or []
            if isinstance(r, dict) and (name is None or r.get("name") == name)]
    ts = [t for t in (_times(r) for r in rows) if t]
    if not ts:
        return []
    n = min(len(t) for t in ts)
    if n >= 2:
        return [sum(t[j] for t in ts) for j in range(n)]
    return [t[0] for t in ts] if name is not None else [sum(t[0] for t in ts)]


def replay_medians(profile: Dict[str, Any]) -> Dict[str, float]:
    """kernel (and 'total') -> the median of its samples in one replay."""
    out: Dict[str, float] = {}
    names = dict.fromkeys(r.get("name") for r in profile.get("launches") or []
                          if isinstance(r, dict) and r.get("name") is not None)
    for n in list(names) + [None]:
        xs = samples(profile, n)
        if xs:
            out[TOTAL if n is None else n] = statistics.median(xs)
    return out


def pooled(profiles: List[Dict[str, Any]], name: Optional[str]) -> List[float]:
    return [x for p in profiles for x in samples(p, name)]


def _min_p(n1: int, n2: int) -> float:
    """The smallest two-sided p-value Mann-Whitney U can give samples of n1 and n2, 2 / C(n1+n2, n1),
    in logs: a timeline profile's kernel has thousands of samples, whose C() no float holds."""
    log_c = math.lgamma(n1 + n2 + 1) - math.lgamma(n1 + 1) - math.lgamma(n2 + 1)
    return 2.0 * math.exp(-log_c) if log_c < 700 else 0.0


def decide(base: List[float], cand: List[float], threshold: float, noise_pct: Optional[float],
           sigmas: float = 3.0, alpha: float = 0.01) -> Dict[str, Any]:
    """The verdict on two small samples of one kernel's time, measured paired (same GPU, close in
    time): SLOWER or FASTER when Mann-Whitney U rejects equal distributions at alpha AND the
    ratio of medians lies beyond max(threshold, sigmas x noise_pct); else SAME. verdict None:
    too few samples for the test to ever reach alpha."""
    from scipy.stats import mannwhitneyu
    bar = max(threshold, sigmas * (noise_pct or 0.0))
    out: Dict[str, Any] = {"bar_pct": bar, "noise_pct": noise_pct, "n": (len(base), len(cand))}
    if not base or not cand:
        return dict(out, verdict=None, why="not timed in both")
    mb, mc = statistics.median(base), statistics.median(cand)
    ratio = mc / mb if mb > 0 else None
    out["ratio"] = ratio
    out["diff_pct"] = diff = (ratio - 1) * 100 if ratio is not None else None
    if ratio is None:
        return dict(out, verdict=None, why="a baseline time of 0")
    if _min_p(len(base), len(cand)) > alpha:
        return dict(out, verdict=None, p_value=None,
                    why=f"{len(base)} and {len(cand)} samples: too few for Mann-Whitney at alpha {alpha:g}")
    p = float(mannwhitneyu(cand, base, alternative="two-sided").pvalue)
    out["p_value"] = p
    what = (f"max(threshold {threshold:g}%, {sigmas:g} x noise {noise_pct:.1f}%)" if noise_pct is not None
            else f"threshold {threshold:g}%")
    if abs(diff) <= bar:
        return dict(out, verdict=SAME, why=f"{diff:+.1f}% is within +-{bar:.1f}% = {what} (p={p:.2g})")
    if p > alpha:
        return dict(out, verdict=SAME, why=f"{diff:+.1f}% is not significant: Mann-Whitney p={p:.2g} > {alpha:g}")
    return dict(out, verdict=SLOWER if diff > 0 else FASTER,
                why=f"{diff:+.1f}% beyond +-{bar:.1f}% = {what}; Mann-Whitney p={p:.2g}")


def judge_paired(base: List[Dict[str, Any]], cand: List[Dict[str, Any]], threshold: float,
                 noise_of: Callable[[str], Optional[float]], sigmas: float = 3.0, alpha: float = 0.01
                 ) -> Dict[str, Any]:
    """The comparison of a candidate's replays with its baseline's replays on the same GPU: the
    pooled profiles compared as `cudasnap compare` does (pairing launches, collectives and
    per-launch floors), each timed kernel and the total then decided by decide() on its
    samples, against the campaign's noise noise_of(kernel or 'total')."""
    res = compare(merge_profiles(base), merge_profiles(cand), threshold=threshold)
    rows = [(k["name"], k) for k in res["kernels"]] + [(TOTAL, res["total"])]
    for name, k in rows:
        if k.get("ratio") is None or k.get("collective"):
            continue
        sb, sc = pooled(base, None if name == TOTAL else name), pooled(cand, None if name == TOTAL else name)
        cn = noise_of(name)
        d = decide(sb, sc, threshold, cn, sigmas, alpha)
        k["campaign_noise_pct"], k["bar_pct"], k["p_value"] = cn, d["bar_pct"], d.get("p_value")
        if d["verdict"] is None:
            # too few samples for the test (one launch, no repeats): compare's verdict, within the bar
            if k["verdict"] in (SLOWER, FASTER) and abs(k.get("diff_pct") or 0.0) <= d["bar_pct"]:
                k["verdict"] = SAME
                k["why"] = f"{k['diff_pct']:+.1f}% is within the campaign's bar (+-{d['bar_pct']:.1f}%); {d['why']}"
            continue
        k["ratio"], k["diff_pct"], k["verdict"], k["why"] = d["ratio"], d["diff_pct"], d["verdict"], d["why"]
        per = abs(statistics.median(sc) - statistics.median(sb)) / max(1, k.get("launches_base") or 1)
        if name != TOTAL and k["verdict"] != SAME and per < MIN_DIFF_US:
            k["verdict"] = SAME
            k["why"] += f"; but {per:.2f} us per launch is under the {MIN_DIFF_US:g} us floor"
    res["slower"] = [k["name"] for k in res["kernels"] if k["verdict"] == SLOWER]
    res["faster"] = [k["name"] for k in res["kernels"] if k["verdict"] == FASTER]
    res["regressed"] = bool(res["slower"]) or res["total"].get("verdict") == SLOWER
    res["exit_code"] = 1 if res["regressed"] else 0
    return res


def kernel_rows(res: Optional[Dict[str, Any]], profile: Optional[Dict[str, Any]],
                unconfirmed: Tuple[str, ...] = (), conf: Optional[Dict[str, Any]] = None,
                gpu_offset: Optional[Callable[[str], Optional[float]]] = None) -> List[Dict[str, Any]]:
    """The store's per-kernel rows: from the comparison when there is one, else the profile's own
    (conf: the confirmation's comparison; gpu_offset: the baseline's spread across GPUs)."""
    rows: List[Dict[str, Any]] = []
    if res is not None:
        ck = {k["name"]: k for k in (conf or {}).get("kernels") or []}
        for k in res["kernels"]:
            v = k.get("verdict")
            if v in (SLOWER, FASTER) and k["name"] in unconfirmed:
                v = UNCONFIRMED
            c = ck.get(k["name"]) or {}
            rows.append({"kernel": k["name"], "launches": k.get("launches_candidate"),
                         "median_us": k.get("candidate_median_us"), "noise_pct": k.get("candidate_noise_pct"),
                         "base_median_us": k.get("base_median_us"), "base_noise_pct": k.get("base_noise_pct"),
                         "ratio": k.get("ratio"), "diff_pct": k.get("diff_pct"), "verdict": v, "why": k.get("why"),
                         "p_value": k.get("p_value"), "campaign_noise_pct": k.get("campaign_noise_pct"),
                         "bar_pct": k.get("bar_pct"), "gpu_offset_pct": gpu_offset(k["name"]) if gpu_offset else None,
                         "confirm_diff_pct": c.get("diff_pct"), "confirm_p_value": c.get("p_value")})
        return rows
    for k in (profile or {}).get("kernels") or []:
        if isinstance(k, dict) and k.get("name") is not None:
            rows.append({"kernel": k["name"], "launches": k.get("launches"), "median_us": k.get("median_us"),
                         "noise_pct": k.get("noise_pct"), "verdict": None, "why": None})
    return rows


def cell_numerics(profiles: List[Optional[Dict[str, Any]]]) -> Optional[Dict[str, Any]]:
    """A cell's numerics from its replays' (replay/numerics.py counts in each profile's run):
    EXACT, CLOSE (with the largest relative error and ULP distance) or DIFFERENT; None when no
    replay said (a replay of an older cudasnap)."""
    nums = [((p or {}).get("run") or {}).get("numerics") for p in profiles]
    nums = [n for n in nums if isinstance(n, dict) and n]
    if not nums:
        return None
    out: Dict[str, Any] = {"outcome": "EXACT", "tolerance": nums[-1].get("tolerance")}
    if any(n.get("different") for n in nums):
        out["outcome"] = "DIFFERENT"
    elif any(n.get("close") for n in nums):
        out["outcome"] = "CLOSE"
    rels = [n["max_rel"] for n in nums if isinstance(n.get("max_rel"), (int, float))]
    ulps = [n["max_ulp"] for n in nums if isinstance(n.get("max_ulp"), int)]
    if rels:
        out["max_rel"] = max(rels)
    if ulps:
        out["max_ulp"] = max(ulps)
    out["close"] = max(n.get("close", 0) for n in nums)
    if any((n.get("recheck") or {}).get("nondeterministic") for n in nums):
        out["nondeterministic"] = True
    return out

