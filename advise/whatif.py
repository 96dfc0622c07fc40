"""What-ifs measured by replays, never guessed: each runs `cudasnap replay` in a child process
and keeps its command, exit code and the numbers it measured.

- graph: a launch-bound stretch replayed as one CUDA graph (`--profile graph --calls A-B`);
  the gain is the stretch's span on the timeline minus the graph's median time.
- replace: `--replace K=FILE`, the rebuilt kernel against the recorded one, both timed in
  isolated mode over the same launches, one replay each; the replay's verification says
  whether the rebuilt kernel still computes the recorded results.
- launch: `--launch-override grid=..,block=..[,kernel=RX]`, another launch size measured the
  same way; verification says whether the kernel allows it (a grid-stride loop does)."""
from __future__ import annotations

import json
import os
import re
import tempfile
from typing import Any, Dict, Optional

from cudasnap.replay.profile.modes import for_advise

from .source import last_error, run_replay, shown_command


def _timed(use: str, repeat: int, warmup: int, **sel) -> Dict[str, Any]:
    """ProfileConfig fields of the mode advise takes for `use` (modes.py), repeats where it repeats."""
    m = for_advise(use)
    return dict(mode=m.name, **(dict(repeat=repeat, warmup=warmup) if m.repeats else {}), **sel)


def _profile_run(snapshot: str, replay: Dict[str, Any], profile: Dict[str, Any],
                 timeout: Optional[float]) -> Dict[str, Any]:
    """A profiled replay (replay= ReplayOptions fields, profile= ProfileConfig fields) in a child
    process: its report and how it ran."""
    from cudasnap.replay.invocation import document
    with tempfile.TemporaryDirectory(prefix="cudasnap-whatif-") as d:
        out = os.path.join(d, "p.json")
        doc = document(snapshot, replay, dict(profile, out=out))
        cp = run_replay(doc, timeout)
        rep = None
        if os.path.isfile(out):
            with open(out, encoding="utf-8") as f:
                rep = json.load(f)
    run = {"command": shown_command(doc), "exit_code": cp.returncode}
    if cp.returncode != 0:
        run["error"] = last_error(cp)
    return {"run": run, "report": rep}


def graph_whatif(snapshot: str, finding: Dict[str, Any], device: int, repeat: int, warmup: int,
                 timeout: Optional[float]) -> Dict[str, Any]:
    ev = finding["evidence"]
    a, b = ev.get("first_seq"), ev.get("last_seq")
    sel = {"calls": f"{a}-{b}"} if isinstance(a, int) and isinstance(b, int) else {}
    r = _profile_run(snapshot, {"device": device}, _timed("stretch", repeat, warmup, timeline_check=False, **sel),
                     timeout)
    w: Dict[str, Any] = {"kind": "graph", "what": "the stretch as one CUDA graph", "replay": r["run"]}
    rep = r["report"]
    s = (rep or {}).get("summary") or {}
    g = s.get("total_us")
    if r["run"]["exit_code"] != 0 or not isinstance(g, (int, float)):
        w["measured"] = False
        w["why"] = r["run"].get("error") or "the graph replay gave no graph time"
        return w
    # the baseline: the stretch as the program ran it (its recorded calls' span), since a
    # replay's own launch pace is not the program's; the replay's timeline span without it
    rec_span = (ev.get("holds") or {}).get("recorded_span_us")
    span = rec_span if isinstance(rec_span, (int, float)) and rec_span > 0 else ev["span_us"]
    st = s.get("graph") or {}
    w.update(measured=True, launches=s.get("launches"), graph_us=round(g, 3), timeline_span_us=ev["span_us"],
             baseline_us=span, baseline=("the program's recorded span (under capture)" if span is rec_span
                                         else "the replay's timeline span"),
             gain_us=round(span - g, 3), gain_pct=round((span - g) / span * 100, 1) if span else None,
             speedup=round(span / g, 2) if g > 0 else None, noise_pct=st.get("noise_pct"),
             graph_times_us=[round(x, 3) for x in (s.get("graph_times_us") or [])][:50],
             memsets=s.get("memsets"), copies=s.get("copies"))
    if s.get("launches") != ev.get("kernels"):
        w["note"] = (f"the graph holds {s.get('launches')} launches, the stretch {ev.get('kernels')}: calls {a}-{b} "
                     "hold other work too (another thread or stream)")
    return w


def _medians(rep: Optional[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    return {k["name"]: k for k in (rep or {}).get("kernels") or [] if k.get("median_us") is not None}


def variant_whatif(snapshot: str, kind: str, what: str, variant: Dict[str, Any], sel: Dict[str, Any], device: int,
                   repeat: int, warmup: int, timeout: Optional[float],
                   baselines: Optional[Dict[tuple, Dict[str, Any]]] = None) -> Dict[str, Any]:
    """The kernels of `sel` (ProfileConfig fields) timed in isolated mode as recorded and with
    the variant (ReplayOptions fields: replace, launch_override). baselines: as-recorded replays
    by their selection, shared by what-ifs of one selection."""
    common = _timed("variant", repeat, warmup, **sel)
    key = tuple(sorted(common.items())) + (device,)
    baselines = {} if baselines is None else baselines
    if key not in baselines:
        baselines[key] = _profile_run(snapshot, {"device": device}, common, timeout)
    base = baselines[key]
    var = _profile_run(snapshot, dict(variant, device=device), common, timeout)
    w: Dict[str, Any] = {"kind": kind, "what": what, "replay": var["run"], "baseline_replay": base["run"]}
    if base["run"]["exit_code"] != 0 or base["report"] is None:
        w.update(measured=False, why=f"the baseline replay failed: {base['run'].get('error')}")
        return w
    if var["report"] is None:
        w.update(measured=False, why=f"the replay with the change failed: {var['run'].get('error')}")
        return w
    bm, vm = _medians(base["report"]), _medians(var["report"])
    rows = []
    for name, k in bm.items():
        v = vm.get(name)
        if v is None:
            continue
        b_us, v_us = k["median_us"], v["median_us"]
        rows.append({"kernel": name, "launches": k.get("launches"), "before_us": round(b_us, 3),
                     "after_us": round(v_us, 3), "change_pct": round((v_us - b_us) / b_us * 100, 1) if b_us else None,
                     "before_total_us": round(k.get("total_us") or 0, 3), "after_total_us": round(v.get("total_us") or 0, 3),
                     "noise_pct": max(k.get("noise_pct") or 0, v.get("noise_pct") or 0)})
    rows.sort(key=lambda r: -abs(r["before_total_us"] - r["after_total_us"]))
    gain = sum(r["before_total_us"] - r["after_total_us"] for r in rows)
    vrun = var["report"].get("run") or {}
    applied = vrun.get("launch_override") if kind == "launch" else list(vrun.get("replace") or [])
    w.update(measured=bool(rows), kernels=rows, gain_us=round(gain, 3),
             verified=var["run"]["exit_code"] == 0, applied=applied)
    if kind == "launch" and isinstance(applied, dict) and not applied.get("applied"):
        refused = "; ".join(f"{k}: {why}" for k, why in (applied.get("refused") or {}).items())
        w.update(measured=False, why="the new size applied to no launch" + (f" ({refused})" if refused else ""))
    elif not rows:
        w["why"] = "no kernel was timed in both replays"
    if var["run"]["exit_code"] == 1:
        w["note"] = "the replay with the change does not reproduce the recorded results"
    return w


def launch_selection(spec: str) -> Dict[str, Any]:
    """The launches a --launch-override SPEC concerns: its kernel=REGEX, or every launch."""
    from cudasnap.replay.override import parse
    kern = parse(spec)[2]
    return {"kernels": kern} if kern else {}


def replace_selection(spec: str) -> Dict[str, Any]:
    """The launches a --replace TARGET=FILE concerns: a kernel's, a module's (all), a handle's (all)."""
    target = spec.rpartition("=")[0].strip()
    if target.startswith("module:") or re.match(r"^0x[0-9a-fA-F]+$", target):
        return {}
    return {"kernels": f"^{re.escape(target)}$"}
