"""`cudasnap advise SNAPSHOT|PROFILE.json`: ranked findings from a timeline profile, each with
its evidence and the time at stake, and what-ifs measured by replays.

Given a snapshot, advise replays it under `--profile timeline` (a child process, with a trace
for copies, memsets and NVTX ranges); given a profile JSON it reads it and replays the snapshot
the profile names for the what-ifs, or says why it cannot. Findings come from the timeline
(advise/findings.py) and, given a metrics profile (--metrics), from counters
(advise/counters.py); what-ifs (advise/whatif.py) are replays of their own: a launch-bound
stretch as a CUDA graph, a rebuilt kernel (--replace), another launch size (--launch-override).

Python API:

    from cudasnap.advise import AdviseConfig, advise
    result = advise("x.cusnap", AdviseConfig(top=5))
    result["findings"][0]["at_stake_us"], result["findings"][0].get("what_if")
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from cudasnap.formats.console import tool_version
from cudasnap.replay.names import short_name as short_kernel
from cudasnap.replay.profile.modes import for_advise

from .counters import block_size_candidate, counter_findings, read_metrics
from .findings import (Limits, Timeline, heavy_kernels, host_gaps, launch_bound, library_candidates,
                       recorded_transfers, small_transfers)
from .source import AdviseError, Source, is_profile_json, read_profile, snapshot_calls, take_profile, \
    trace_device_ops, trace_nvtx
from .whatif import graph_whatif, launch_selection, replace_selection, variant_whatif

__all__ = ["AdviseConfig", "AdviseError", "advise"]


@dataclass
class AdviseConfig:
    top: int = 10
    what_if: bool = True
    graph_stretches: int = 3            # launch-bound stretches measured as graphs, largest first
    replace: List[str] = field(default_factory=list)
    launch_override: List[str] = field(default_factory=list)   # specs as `replay --launch-override`
    block_sizes: int = 2                # low-occupancy kernels whose better block size is measured
    pace: str = "recorded"              # the timeline replay keeps the program's host gaps
    device: int = 0
    repeat: int = 10
    warmup: int = 3
    timeout: Optional[float] = None     # per replay
    limits: Limits = field(default_factory=Limits)
    metrics: Optional[str] = None       # a metrics profile's JSON: bound and occupancy findings (counters.py)


def _load(path: str, cfg: AdviseConfig) -> Source:
    try:
        profile = is_profile_json(path)
    except OSError as e:
        raise AdviseError(f"{path}: {e.strerror or e}") from None
    if profile:
        from cudasnap.formats.group import is_manifest
        if is_manifest(path):
            raise AdviseError(f"{path}: a job's group manifest; advise takes one rank's snapshot or its profile")
        return read_profile(path)
    low = path.lower()
    if low.endswith(".csv"):
        raise AdviseError(f"{path}: advise reads a profile's JSON (`replay --profile {for_advise('profile').name} "
                          f"--out P.json`), not its CSV")
    if low.endswith(".json"):
        raise AdviseError(f"{path}: not a cudasnap profile (expected the JSON of `replay --profile "
                          f"{for_advise('profile').name} --out`)")
    from cudasnap.replay.preflight import snapshot_problem
    problem = snapshot_problem(path)
    if problem:
        raise AdviseError(problem)
    return take_profile(path, cfg.pace, cfg.timeout, cfg.device)


def advise(path: str, cfg: Optional[AdviseConfig] = None, progress=None) -> Dict[str, Any]:
    """Findings for a snapshot or a timeline profile JSON; raises AdviseError for bad input.
    progress(msg): told before each replay."""
    cfg = cfg or AdviseConfig()
    say = progress or (lambda msg: None)
    t_start = time.monotonic()
    counters = read_metrics(cfg.metrics) if cfg.metrics else None     # bad input before any replay
    if not is_profile_json_safe(path):
        say(f"replaying under --profile {for_advise('profile').name}")
    src = _load(path, cfg)
    p = src.profile
    ops = trace_device_ops(src.trace)
    nvtx = trace_nvtx(src.trace)
    tl = Timeline(p, ops)
    lim = cfg.limits
    snap_for_records = src.snapshot
    stretches = launch_bound(tl, lim)
    for f in stretches:
        held = snapshot_calls(snap_for_records, f["evidence"]["first_seq"] or 0, f["evidence"]["last_seq"] or -1)
        if held:
            f["evidence"]["holds"] = held
    findings = (stretches + host_gaps(tl, lim, nvtx) + heavy_kernels(p, lim) + library_candidates(p)
                + small_transfers(tl, lim, None if ops else recorded_transfers(snap_for_records)))
    if counters is not None:
        findings += counter_findings(counters)
    whatifs: List[Dict[str, Any]] = []
    why_not = None
    if not cfg.what_if:
        why_not = "--no-what-if"
    elif src.snapshot is None:
        why_not = f"no snapshot to replay: {src.no_snapshot_why}"
    if why_not is None:
        ranked = sorted(stretches, key=lambda f: -f["at_stake_us"])
        for f in ranked[cfg.graph_stretches:]:
            f["what_if"] = {"kind": "graph", "measured": False,
                            "why": f"not among the {cfg.graph_stretches} largest stretches (--graphs)"}
        for f in ranked[:cfg.graph_stretches]:
            say(f"what-if: stretch {f['evidence']['first_seq']}-{f['evidence']['last_seq']} as a CUDA graph")
            w = graph_whatif(src.snapshot, f, cfg.device, cfg.repeat, cfg.warmup, cfg.timeout)
            f["what_if"] = w
            if w.get("measured"):
                f["estimate_us"] = f["at_stake_us"]
                f["at_stake_us"] = max(w["gain_us"], 0.0)
                f["basis"] = "measured: the stretch's span minus its graph's time"
        baselines: Dict[tuple, Dict[str, Any]] = {}
        low_occ = [f for f in findings if f["kind"] == "occupancy"] if counters is not None else []
        for f in low_occ[cfg.block_sizes:]:
            f["what_if"] = {"kind": "launch", "measured": False,
                            "why": f"not among the {cfg.block_sizes} heaviest low-occupancy kernels (--block-sizes)"}
        for f in low_occ[:cfg.block_sizes]:
            cand, why = block_size_candidate(counters, f["kernel"])
            if cand is None:
                f["what_if"] = {"kind": "launch", "measured": False, "why": why}
                continue
            say(f"what-if: {short_kernel(f['kernel'])} at block {cand['block']}")
            w = variant_whatif(src.snapshot, "launch", f"--launch-override {cand['spec']}",
                               {"launch_override": cand["spec"]}, launch_selection(cand["spec"]), cfg.device,
                               cfg.repeat, cfg.warmup, cfg.timeout, baselines)
            w["occupancy"] = cand
            f["what_if"] = w
            if w.get("measured") and w.get("verified"):
                f["estimate_us"] = f["at_stake_us"]
                f["at_stake_us"] = max(w["gain_us"], 0.0)
                f["basis"] = f"measured: isolated replays at block {cand['block']}"
        variants = ([("replace", "--replace", spec, {"replace": [spec]}, replace_selection(spec)) for spec in cfg.replace]
                    + [("launch", "--launch-override", spec, {"launch_override": spec}, launch_selection(spec))
                       for spec in cfg.launch_override])
        for kind, flag, spec, variant, sel in variants:
            say(f"what-if: {flag} {spec}")
            w = variant_whatif(src.snapshot, kind, f"{flag} {spec}", variant, sel, cfg.device,
                               cfg.repeat, cfg.warmup, cfg.timeout, baselines)
            # a rebuilt kernel that does not load is bad input, as replay says (exit 2); a launch
            # size the kernel does not allow is a what-if's answer ("applied to no launch")
            if kind == "replace" and (w.get("replay") or {}).get("exit_code") == 2:
                raise AdviseError(f"{flag} {spec}: the replay with the change failed: "
                                  f"{' '.join(str(w['replay'].get('error') or 'exit 2').split())}")
            whatifs.append(w)
    else:
        for f in stretches:
            f["what_if"] = {"kind": "graph", "measured": False, "why": why_not}
    for w in whatifs:                  # a measured change is a finding of its own
        if w.get("measured"):
            findings.append({"kind": w["kind"], "title": f"what-if {w['what']}: "
                             + ("faster" if w["gain_us"] > 0 else "no faster") + " by measurement",
                             "at_stake_us": round(max(w["gain_us"], 0.0), 3), "basis": "measured: isolated replays",
                             "evidence": {"kernels": w["kernels"][:10], "verified": w["verified"]},
                             "advice": "Keep the change" if w["gain_us"] > 0 and w["verified"] else
                             "The change does not pay" if w["verified"] else "The change breaks the results",
                             "what_if": w})
    for f in findings:
        f["share_of_span_pct"] = round(f["at_stake_us"] / tl.span_us * 100, 1) if tl.span_us else None
    findings.sort(key=lambda f: -f["at_stake_us"])
    for i, f in enumerate(findings, 1):
        f["rank"] = i
    run = p.get("run") or {}
    return {
        "tool": {"cudasnap": tool_version()},
        "input": path,
        "snapshot": src.snapshot or run.get("snapshot") or p.get("snapshot"),
        "profile": {"taken": src.taken, "backend": p["summary"].get("backend"),
                    "gpu": (run.get("gpu") or {}).get("name") if isinstance(run.get("gpu"), dict) else None,
                    "trace": src.trace is not None, "nvtx_ranges": len(nvtx), "copies_memsets": len(ops),
                    "counters": cfg.metrics},
        "timeline": {"kernels": len(tl.kernels), "span_us": round(tl.span_us, 3), "kernel_us": round(tl.kernel_us, 3),
                     "idle_us": round(tl.span_us - tl.busy_us(tl.start, tl.end), 3), "median_gap_us": round(tl.median_gap_us, 3),
                     "busy_pct": round(tl.kernel_us / tl.span_us * 100, 1) if tl.span_us else None},
        "what_ifs": {"run": why_not is None, "why_not": why_not, "other": whatifs},
        "findings": findings[:cfg.top] if cfg.top else findings,
        "findings_total": len(findings),
        "limits": vars(lim),
        "notes": src.notes,
        "elapsed_s": round(time.monotonic() - t_start, 2),
    }


def is_profile_json_safe(path: str) -> bool:
    try:
        return is_profile_json(path)
    except OSError:
        return False
