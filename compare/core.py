"""Compare two profiles (`replay --profile MODE --out X.json`) kernel by kernel.

A launch's time is the median of its repeats (isolated, graph) or its one timeline
duration. When a kernel's launches pair up (same snapshot: the same launches by call
sequence number, graph node and unit) its ratio candidate/base is the median of its
launches' ratios weighted by their times (the smaller of a launch's two, which a stray slow
run does not inflate; with one or two launches: the ratio of their sums), so a stray launch
does not decide it while the launches that take the time do (per-launch rows show launches
that moved alone). The total's ratio is the kernels' ratios weighted by their times (the sums
are reported beside it). Where one replay of the same snapshot ran fewer of a kernel's
launches (it stopped early, or selected fewer), the launches both ran pair up. Unpaired
kernels compare the medians of their launch times.

Noise (nvbench's measure, the relative standard deviation of a time, estimated robustly as
1.4826 x median absolute deviation / median, since medians are compared):
- with repeats: a launch's noise is that of its repeats; a kernel's is the time-weighted
  mean of its launches' (as if their noise were correlated: the cautious reading);
- timeline, launches paired: that of the per-launch ratios candidate/base, which holds both
  runs' noise (it is reported as the combined noise);
- timeline, unpaired: that of the kernel's launch times;
- timeline, a kernel with fewer than eight paired launches: so few ratios cannot show the
  run's jitter (a segment of the run moves its launches together), so three times the noise of
  the ratios of every paired launch of similar duration (half to twice its own, widened until 8
  are found) is taken where it is larger: a few samples lie anywhere in that spread, and a run
  compares hundreds of such kernels. Short
  kernels run once differ by 10-40% between two replays of one snapshot; judged by the
  threshold alone they read as regressions that are not there.
The combined noise of a comparison is sqrt(noise_base^2 + noise_candidate^2).

Verdict: SAME when |ratio - 1| is within the threshold or within the combined noise
(whichever is larger), else SLOWER or FASTER; a kernel launched once in each timeline run
only beyond twice that band (ONE_SAMPLE_BAR). Noise alone therefore never gives a verdict,
and a one-sample comparison (noise unknown) is judged by the threshold alone, which the row
says."""
from __future__ import annotations

import math
import os
import statistics
from typing import Any, Dict, List, Optional, Tuple

from cudasnap.formats.vocab import is_collective_kernel

SAME, SLOWER, FASTER = "SAME", "SLOWER", "FASTER"


class CompareError(Exception):
    """A profile that cannot be compared (one line)."""


def load_profile(path) -> Dict[str, Any]:
    p = str(path)
    if p.lower().endswith(".csv"):
        raise CompareError(f"{p}: a CSV profile carries no run facts; write the profile with --out FILE.json")
    from cudasnap.replay.profile.report import ProfileFileError, read_profile_file
    try:
        d = read_profile_file(p)
    except ProfileFileError as e:
        raise CompareError(str(e))
    d["_path"] = p
    return d


# --------------------------------------------------------------------------- facts
def facts(prof: Dict[str, Any]) -> Dict[str, Any]:
    """What a profile was measured on, for the report and the refusal checks."""
    run = prof.get("run") or {}
    s = prof.get("summary") or {}
    gpu = run.get("gpu") or {}
    return {"path": prof.get("_path"), "mode": s.get("mode"), "backend": s.get("backend"),
            "repeat": s.get("repeat"), "snapshot": run.get("snapshot") or prof.get("snapshot"),
            "snapshot_id": run.get("snapshot_id"), "gpu": gpu.get("name"), "gpu_uuid": gpu.get("uuid"),
            "cc": gpu.get("cc"), "driver_version": run.get("driver_version"), "cuda_version": run.get("cuda_version"),
            "nvidia_driver": run.get("nvidia_driver"), "libcuda": run.get("libcuda"), "host": run.get("host"),
            "time": run.get("time"), "command": run.get("command"), "env": run.get("env") or {},
            "replace": run.get("replace") or [], "tools": run.get("tools") or {}, "exit_code": run.get("exit_code"),
            "profile": run.get("profile") or {}, "simulated": run.get("simulated")}


def differences(a: Dict[str, Any], b: Dict[str, Any]) -> List[str]:
    """Why two runs should not be compared: another GPU model, snapshot or profile mode."""
    out = []
    if a.get("mode") != b.get("mode"):
        out.append(f"profile modes differ ({a.get('mode')} vs {b.get('mode')})")
    if a.get("snapshot_id") and b.get("snapshot_id"):
        if a["snapshot_id"] != b["snapshot_id"]:
            out.append(f"snapshots differ ({a.get('snapshot')} id {a['snapshot_id'][:12]} vs "
                       f"{b.get('snapshot')} id {b['snapshot_id'][:12]})")
    elif a.get("snapshot") and b.get("snapshot") and os.path.basename(a["snapshot"]) != os.path.basename(b["snapshot"]):
        out.append(f"snapshots differ ({a['snapshot']} vs {b['snapshot']}; no snapshot id recorded)")
    if a.get("gpu") and b.get("gpu") and a["gpu"] != b["gpu"] and not (a.get("simulated") or b.get("simulated")):
        out.append(f"GPUs differ ({a['gpu']} vs {b['gpu']})")     # silicon vs a simulator is the point, not a refusal
    return out


def simulator_note(a: Dict[str, Any], b: Dict[str, Any]) -> Optional[str]:
    """What a comparison with a simulated run compares (replay --sim ... --sim-mode performance)."""
    sims = [x for x in (a, b) if x.get("simulated")]
    if not sims:
        return None
    def what(x):
        s = x.get("simulated") or {}
        return (f"{x.get('gpu')}: simulated cycles at its {s.get('core_clock_mhz')} MHz core clock" if s
                else f"{x.get('gpu')}: measured")
    kind = "simulator vs simulator" if len(sims) == 2 else "silicon vs simulator"
    return f"{kind}: base {what(a)}; candidate {what(b)}"


# --------------------------------------------------------------------------- statistics
def rel_std(xs: List[float]) -> Optional[float]:
    """Relative standard deviation in percent, estimated robustly: 1.4826 x the median absolute
    deviation over the median (equal to stdev/mean for normal samples), so one stray sample
    widens it only as much as it moves the median."""
    if len(xs) < 2:
        return None
    m = statistics.median(xs)
    if m <= 0:
        return None
    return 1.4826 * statistics.median([abs(x - m) for x in xs]) / m * 100


def launch_time(r: Dict[str, Any]) -> Optional[float]:
    t = r.get("median_us", r.get("time_us"))
    return float(t) if isinstance(t, (int, float)) and t >= 0 else None


def launch_noise(r: Dict[str, Any]) -> Optional[float]:
    ts = r.get("times_us")
    if isinstance(ts, list) and len(ts) >= 2:
        return rel_std([float(t) for t in ts if isinstance(t, (int, float))])
    if isinstance(r.get("noise_pct"), (int, float)):
        return float(r["noise_pct"])
    return None


def launch_key(r: Dict[str, Any]) -> Tuple:
    return (r.get("seq"), r.get("node"), r.get("unit"), r.get("name"))


def _timed(rows: List[Dict[str, Any]]) -> Dict[Tuple, Dict[str, Any]]:
    out: Dict[Tuple, Dict[str, Any]] = {}
    seen: Dict[Tuple, int] = {}
    for r in rows:
        if not isinstance(r, dict) or launch_time(r) is None:
            continue
        k = launch_key(r)
        n = seen[k] = seen.get(k, 0) + 1
        out[k + (n,)] = r
    return out


MIN_OWN_RATIOS = 8        # fewer paired launches than this: the noise of so few ratios is itself noise; the
                          # kernel also borrows its class's (a whole run's segment moves its launches together)
MIN_CLASS_RATIOS = 8
ONE_SAMPLE_SIGMAS = 3.0
# A kernel launched once in each timeline run is one sample against one: its time there also
# follows what ran just before it and the clock of that moment (a cuRAND kernel after its 0.6 ms
# init moved 5.7% between two replays of one snapshot on an H200, where kernels of its duration
# moved under 1%). It is judged SLOWER or FASTER beyond this many times the usual bar.
ONE_SAMPLE_BAR = 2.0
# A kernel whose time per launch moved by less than this is SAME whatever the ratio: two replays
# of one snapshot shift 1-3 us kernels by 0.1-0.3 us (the GPU clock's state, the timestamps'
# resolution), which is 5-20% of them. --min-diff-us sets it; 0 judges by ratio alone. A kernel
# launched once in each run meets ONE_SAMPLE_BAR times the floor: a median of many launches
# damps that jitter, one sample does not (a 1.4 us cuRAND kernel launched once took 1.8 us in
# the next replay of one snapshot on an H200, while its neighbours' ratios stayed at 1.000).
MIN_DIFF_US = 0.3
# Collective kernels (NCCL) wait for the other ranks inside the kernel: one rank's time says how
# long its peers took to arrive, not how fast the kernel is. They are reported, not judged.


def class_noise(all_pairs: List[Tuple[float, float, Any]], t: float, name: Any) -> Optional[float]:
    """Noise of the ratios of other kernels' paired launches whose duration is near t
    (all_pairs: (duration, ratio, kernel)), widening the band until MIN_CLASS_RATIOS are in it."""
    for f in (2.0, 4.0, 16.0, math.inf):
        rs = [r for d, r, n in all_pairs if t / f <= d <= t * f and n != name]
        if len(rs) >= MIN_CLASS_RATIOS:
            return rel_std(rs)
    return None


def combine(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None and b is None:
        return None
    return math.sqrt((a or 0.0) ** 2 + (b or 0.0) ** 2)


def verdict(ratio: Optional[float], noise: Optional[float], threshold: float) -> Tuple[str, str]:
    """(verdict, why): SAME within max(threshold, combined noise), else SLOWER or FASTER."""
    if ratio is None:
        return "-", "not timed in both runs"
    diff = (ratio - 1) * 100
    band = max(threshold, noise or 0.0)
    if abs(diff) <= band:
        if noise is not None and noise > threshold and abs(diff) > threshold:
            return SAME, f"{diff:+.1f}% is within the noise (+-{noise:.1f}%)"
        return SAME, f"{diff:+.1f}% is within the threshold ({threshold:g}%)"
    v = SLOWER if diff > 0 else FASTER
    why = f"{diff:+.1f}% beyond the threshold ({threshold:g}%)"
    why += f" and the noise (+-{noise:.1f}%)" if noise is not None else " (noise unknown: one sample each)"
    return v, why


def weighted_median(vw: List[Tuple[float, float]]) -> Optional[float]:
    """The value at half the total weight (values sorted; a tie between two halves averages)."""
    vw = sorted((v, max(w, 0.0)) for v, w in vw)
    total = sum(w for _, w in vw)
    if not vw:
        return None
    if total <= 0:
        return statistics.median(v for v, _ in vw)
    acc = 0.0
    for i, (v, w) in enumerate(vw):
        acc += w
        if acc > total / 2 + 1e-12 * total:
            return v
        if abs(acc - total / 2) <= 1e-12 * total and i + 1 < len(vw):
            return (v + vw[i + 1][0]) / 2
    return vw[-1][0]


def weighted_noise(pairs: List[Tuple[float, Optional[float]]]) -> Optional[float]:
    """Time-weighted mean of noises (None entries skipped)."""
    num = sum(t * n for t, n in pairs if n is not None)
    den = sum(t for t, n in pairs if n is not None)
    return num / den if den > 0 else None


def _stats(times: List[float]) -> Dict[str, Any]:
    if not times:
        return {}
    med = statistics.median(times)
    return {"median_us": med, "min_us": min(times), "max_us": max(times), "total_us": sum(times),
            "spread_pct": (max(times) - min(times)) / med * 100 if med > 0 else 0.0}


# --------------------------------------------------------------------------- the comparison
def _floor(row: Dict[str, Any], min_diff_us: float, judge_collectives: bool) -> None:
    """SAME for a difference under the per-launch floor, and for collectives (see MIN_DIFF_US)."""
    if row["verdict"] not in (SLOWER, FASTER):
        return
    if is_collective_kernel(row.get("name")) and not judge_collectives:
        row["verdict"], row["collective"] = SAME, True
        row["why"] += "; not judged: a collective's time includes waiting for the other ranks"
        return
    n = row.get("paired_launches") or row.get("launches_base") or 1
    b, c = row.get("base_us"), row.get("candidate_us")
    if row.get("paired") and isinstance(b, (int, float)) and isinstance(c, (int, float)):
        per = abs(c - b) / max(1, n)
    elif isinstance(row.get("base_median_us"), (int, float)) and isinstance(row.get("candidate_median_us"), (int, float)):
        per = abs(row["candidate_median_us"] - row["base_median_us"])
    else:
        return
    if per < min_diff_us:
        row["verdict"] = SAME
        row["why"] += f"; but {per:.2f} us per launch is under the {min_diff_us:g} us floor"


def compare(base: Dict[str, Any], cand: Dict[str, Any], threshold: float = 5.0, force: bool = False,
            min_diff_us: float = MIN_DIFF_US, judge_collectives: bool = False) -> Dict[str, Any]:
    """The comparison of two loaded profiles (see the module doc); raises CompareError when the
    runs differ in GPU, snapshot or mode and force is False."""
    fa, fb = facts(base), facts(cand)
    diffs = differences(fa, fb)
    if diffs and not force:
        raise CompareError("runs differ: " + "; ".join(diffs) + " (--force compares them anyway)")
    for prof in (base, cand):
        why = _no_times(prof)
        if why:
            raise CompareError(why)
    mode = fa.get("mode")
    has_repeats = any(isinstance(r.get("times_us"), list) and len(r["times_us"]) > 1 for r in base["launches"]
                      if isinstance(r, dict))
    lb, lc = _timed(base["launches"]), _timed(cand["launches"])
    same_snapshot = bool(fa.get("snapshot_id")) and fa.get("snapshot_id") == fb.get("snapshot_id")
    names = []
    for d in (lb, lc):
        for r in d.values():
            if r.get("name") not in names:
                names.append(r.get("name"))
    launches: List[Dict[str, Any]] = []
    kernels: List[Dict[str, Any]] = []
    all_pairs = [(min(launch_time(lb[k]), launch_time(lc[k])), launch_time(lc[k]) / launch_time(lb[k]),
                  lb[k].get("name")) for k in lb if k in lc and launch_time(lb[k]) > 0 and launch_time(lc[k]) > 0]
    for name in names:
        kb = {k: r for k, r in lb.items() if r.get("name") == name}
        kc = {k: r for k, r in lc.items() if r.get("name") == name}
        tb = [launch_time(r) for r in kb.values()]
        tc = [launch_time(r) for r in kc.values()]
        row: Dict[str, Any] = {"name": name, "launches_base": len(kb), "launches_candidate": len(kc)}
        sb, sc = _stats(tb), _stats(tc)
        for pre, st, prof in (("base_", sb, base), ("candidate_", sc, cand)):
            for k, v in st.items():
                row[pre + k] = v
            if has_repeats:     # spread of the repeats (the profile's), not of the launches' sizes
                kr = next((x for x in prof.get("kernels") or [] if isinstance(x, dict) and x.get("name") == name), {})
                if isinstance(kr.get("spread_pct"), (int, float)):
                    row[pre + "spread_pct"] = kr["spread_pct"]
        paired = bool(kb) and set(kb) == set(kc)
        if not paired and same_snapshot and kb and kc and (set(kb) <= set(kc) or set(kc) <= set(kb)):
            # one replay ran fewer of these launches (it stopped early, or selected fewer): the
            # launches both ran pair up, where medians of different launches would not compare
            common = set(kb) & set(kc)
            kb = {k: r for k, r in kb.items() if k in common}
            kc = {k: r for k, r in kc.items() if k in common}
            row["paired_launches"] = len(common)
            paired = True
        row["paired"] = paired
        if paired:
            pairs = []
            for k in kb:
                b, c = kb[k], kc[k]
                t0, t1 = launch_time(b), launch_time(c)
                n0, n1 = launch_noise(b), launch_noise(c)
                ratio = t1 / t0 if t0 > 0 else None
                pairs.append((t0, t1, n0, n1, ratio))
                lrow = {"seq": b.get("seq"), "index": b.get("index"), "node": b.get("node"), "unit": b.get("unit"),
                        "name": name, "base_us": t0, "candidate_us": t1, "base_noise_pct": n0,
                        "candidate_noise_pct": n1, "ratio": ratio}
                lrow["noise_pct"] = combine(n0, n1)
                lrow["verdict"], lrow["why"] = verdict(ratio, lrow["noise_pct"], threshold)
                launches.append(lrow)
            vb, vc = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
            row["base_us"], row["candidate_us"] = vb, vc
            row["ratio"] = vc / vb if vb > 0 else None
            rs = [p[4] for p in pairs if p[4] is not None]
            if len(rs) >= 3:
                row["ratio"] = weighted_median([(p[4], min(p[0], p[1])) for p in pairs if p[4] is not None])
                row["ratio_of_sums"] = vc / vb if vb > 0 else None
            if has_repeats:
                row["base_noise_pct"] = weighted_noise([(p[0], p[2]) for p in pairs])
                row["candidate_noise_pct"] = weighted_noise([(p[1], p[3]) for p in pairs])
                row["noise_pct"] = combine(row["base_noise_pct"], row["candidate_noise_pct"])
                row["noise_from"] = "repeats"
            else:
                row["base_noise_pct"] = rel_std(tb)
                row["candidate_noise_pct"] = rel_std(tc)
                row["noise_pct"] = rel_std(rs)
                row["noise_from"] = "per-launch ratios" if len(rs) >= 2 else "one sample"
                row["one_sample"] = len(rs) == 1
                if len(rs) < MIN_OWN_RATIOS:
                    cn = class_noise(all_pairs, min(vb, vc) / max(1, len(pairs)), name)
                    if cn is not None and ONE_SAMPLE_SIGMAS * cn > (row["noise_pct"] or 0.0):
                        row["noise_pct"] = ONE_SAMPLE_SIGMAS * cn
                        row["noise_from"] = (f"{ONE_SAMPLE_SIGMAS:g}x the noise of launches of similar duration "
                                             f"({len(rs)} own ratio(s))")
        elif kb and kc:
            row["base_us"], row["candidate_us"] = sb["median_us"], sc["median_us"]
            row["ratio"] = sc["median_us"] / sb["median_us"] if sb["median_us"] > 0 else None
            if has_repeats:
                row["base_noise_pct"] = weighted_noise([(launch_time(r), launch_noise(r)) for r in kb.values()])
                row["candidate_noise_pct"] = weighted_noise([(launch_time(r), launch_noise(r)) for r in kc.values()])
            else:
                row["base_noise_pct"], row["candidate_noise_pct"] = rel_std(tb), rel_std(tc)
            row["noise_pct"] = combine(row["base_noise_pct"], row["candidate_noise_pct"])
            row["noise_from"] = "medians of unpaired launches"
        else:
            row["ratio"] = None
            row["noise_pct"] = None
            row["only_in"] = "base" if kb else "candidate"
        if row.get("ratio") is not None:
            row["diff_pct"] = (row["ratio"] - 1) * 100
        row["verdict"], row["why"] = verdict(row.get("ratio"), row.get("noise_pct"), threshold)
        one = row.pop("one_sample", False)
        if one and row["verdict"] in (SLOWER, FASTER):
            bar = ONE_SAMPLE_BAR * max(threshold, row.get("noise_pct") or 0.0)
            if abs(row["diff_pct"]) <= bar:
                row["verdict"] = SAME
                row["why"] = (f"{row['diff_pct']:+.1f}%: one launch in each run, judged at {ONE_SAMPLE_BAR:g}x the bar "
                              f"(+-{bar:.1f}%); --profile isolated repeats it")
        if row.get("only_in"):
            row["why"] = f"launched only in the {row['only_in']} run"
        _floor(row, min_diff_us * (ONE_SAMPLE_BAR if one else 1.0), judge_collectives)
        kernels.append(row)

    total = _total(base, cand, kernels, threshold, min_diff_us, judge_collectives)
    order = {SLOWER: 0, FASTER: 1, SAME: 2, "-": 3}
    kernels.sort(key=lambda k: (order.get(k["verdict"], 3),
                                -(k.get("diff_pct") or 0) if k["verdict"] == SLOWER else
                                (k.get("diff_pct") or 0) if k["verdict"] == FASTER else -(k.get("base_us") or 0)))
    slower = [k for k in kernels if k["verdict"] == SLOWER]
    faster = [k for k in kernels if k["verdict"] == FASTER]
    regressed = bool(slower) or total.get("verdict") == SLOWER
    notes = []
    for f, who in ((fa, "base"), (fb, "candidate")):
        if f.get("exit_code") not in (None, 0):
            notes.append(f"the {who} replay did not verify (exit {f['exit_code']}): its results differed or it stopped")
    if not has_repeats and mode == "timeline":
        notes.append("timeline profiles: one time per launch; noise is read from the spread of paired launches' ratios")
    if not kernels:
        notes.append("no per-kernel times in these profiles (graph mode without CUPTI times the graph whole): "
                     "the total alone is compared")
    coll = [k["name"] for k in kernels if k.get("collective")]
    if coll:
        notes.append(f"{len(coll)} collective kernel(s) moved but are not judged (their time includes waiting for "
                     f"the other ranks; --judge-collectives judges them)")
    partly = [k["name"] for k in kernels if k.get("paired_launches") is not None]
    if partly:
        notes.append(f"{len(partly)} kernel(s) compared on the launches both replays ran (one ran fewer: it stopped "
                     f"early or selected fewer)")
    unpaired = [k["name"] for k in kernels if not k.get("paired") and not k.get("only_in")]
    if unpaired:
        notes.append(f"launches do not pair up for {len(unpaired)} kernel(s) ({', '.join(unpaired[:5])}): "
                     f"their medians are compared")
    sim = simulator_note(fa, fb)
    if sim:
        notes.insert(0, sim)
        if fa.get("gpu") != fb.get("gpu"):
            # silicon beside a model of another chip (or two models): a side by side, not a verdict
            regressed = False
            notes.insert(1, "side by side: the runs are of different devices, so no regression is judged (exit 0)")
    from .correlate import correlate
    return {"threshold_pct": threshold, "min_diff_us": min_diff_us, "base": fa, "candidate": fb, "differences": diffs, "forced": bool(diffs),
            "correlation": correlate(base, cand),
            "mode": mode, "kernels": kernels, "launches": launches, "total": total,
            "slower": [k["name"] for k in slower], "faster": [k["name"] for k in faster],
            "regressed": regressed, "exit_code": 1 if regressed else 0, "notes": notes}


def _no_times(prof: Dict[str, Any]) -> Optional[str]:
    """Why a profile holds nothing to compare (no timed launch and no whole-graph time), or None."""
    g = (prof.get("summary") or {}).get("graph")
    if _timed(prof.get("launches") or []) or (isinstance(g, dict) and g.get("median_us")):
        return None
    return (f"{prof.get('_path', 'a profile')}: no kernel times in this profile (its replay profiled no launch): "
            f"nothing to compare")


def _total(base, cand, kernels, threshold, min_diff_us: float = 0.0, judge_collectives: bool = True) -> Dict[str, Any]:
    both: List[Dict[str, Any]] = []
    gb, gc = (base.get("summary") or {}).get("graph"), (cand.get("summary") or {}).get("graph")
    if isinstance(gb, dict) and isinstance(gc, dict) and gb.get("median_us") and gc.get("median_us"):
        # graph mode: the whole graph's replays are the measurement
        sb, sc = base["summary"].get("graph_times_us"), cand["summary"].get("graph_times_us")
        t = {"what": "graph replay (median)", "base_us": gb["median_us"], "candidate_us": gc["median_us"],
             "base_noise_pct": rel_std(sb) if isinstance(sb, list) and len(sb) > 1 else gb.get("noise_pct"),
             "candidate_noise_pct": rel_std(sc) if isinstance(sc, list) and len(sc) > 1 else gc.get("noise_pct")}
        t["noise_pct"] = combine(t["base_noise_pct"], t["candidate_noise_pct"])
    else:
        both = [k for k in kernels if k.get("ratio") is not None and k.get("base_us") is not None
                and (judge_collectives or not is_collective_kernel(k.get("name")))]
        vb = sum(k["base_us"] for k in both)
        vc = sum(k["candidate_us"] for k in both)
        t = {"what": f"kernel time, {len(both)} kernel(s) timed in both", "base_us": vb, "candidate_us": vc,
             "base_noise_pct": weighted_noise([(k["base_us"], k.get("base_noise_pct")) for k in both]),
             "candidate_noise_pct": weighted_noise([(k["candidate_us"], k.get("candidate_noise_pct")) for k in both]),
             "noise_pct": weighted_noise([(k["base_us"], k.get("noise_pct")) for k in both])}
    t["ratio"] = t["candidate_us"] / t["base_us"] if t.get("base_us") else None
    if "graph" not in t["what"] and any(k.get("ratio_of_sums") is not None for k in both):
        # the kernels' own (robust) ratios, weighted by their time: a stray launch inside a
        # kernel moves the total no more than it moves that kernel
        w = [(k["ratio"], min(k["base_us"], k["candidate_us"])) for k in both]
        if sum(x for _, x in w) > 0:
            t["ratio_of_sums"] = t["ratio"]
            t["ratio"] = sum(r * x for r, x in w) / sum(x for _, x in w)
            t["what"] += " (ratio: their ratios, time-weighted)"
    if t["ratio"] is not None:
        t["diff_pct"] = (t["ratio"] - 1) * 100
    t["verdict"], t["why"] = verdict(t["ratio"], t.get("noise_pct"), threshold)
    n = sum(k.get("launches_base") or 1 for k in both)
    if t["verdict"] in (SLOWER, FASTER) and both and t.get("base_us"):
        per = abs(t["ratio"] - 1) * t["base_us"] / max(1, n)
        if per < min_diff_us:
            t["verdict"] = SAME
            t["why"] += f"; but {per:.2f} us per launch is under the {min_diff_us:g} us floor"
    return t
