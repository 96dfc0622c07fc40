"""What a campaign store says: the matrix of a run (snapshot x env), each kernel's history
across runs, and every regression attributed to its kernel, to what differs from the last good
cell (driver, a variable, a rebuilt kernel, the GPU model) and to the first run where it
appeared. Each verdict is shown beside the noise it had to exceed; the controls' false-verdict
rate is stated. Exit: 2 when the run has infrastructure failures or a verdict in a control env
("noise exceeds the rules"), else 1 on a regression, else 0."""
from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, List, Optional

from .rules import FASTER_, INFRA, INCOMPARABLE, MISMATCH, REGRESSIONS, SLOWER_, UNCONFIRMED
from .wording import NOISE_EXCEEDS, confirm_text, controls_line, numerics_text, p_text, pct



class ReportError(Exception):
    """A report that cannot be made (one line)."""


def parse_since(s: str) -> str:
    m = re.fullmatch(r"(\d{4}-\d{2}-\d{2})(?:[T ](\d{2}:\d{2}(?::\d{2})?))?Z?", s.strip())
    if not m:
        raise ReportError(f"--since {s!r}: a date is YYYY-MM-DD or YYYY-MM-DDTHH:MM (UTC)")
    t = m.group(2) or "00:00:00"
    if len(t) == 5:
        t += ":00"
    import datetime
    try:
        datetime.datetime.strptime(f"{m.group(1)}T{t}", "%Y-%m-%dT%H:%M:%S")
    except ValueError as e:
        raise ReportError(f"--since {s!r}: not a date ({e})")
    return f"{m.group(1)}T{t}Z"


def _env(row) -> Dict[str, Any]:
    try:
        return json.loads(row["env_json"])
    except (TypeError, ValueError):
        return {}


def env_differences(good: Dict[str, Any], bad: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The dimensions in which two cells' environments differ."""
    out: List[Dict[str, Any]] = []
    if good.get("driver") != bad.get("driver") or good.get("driver_digest") != bad.get("driver_digest"):
        out.append({"dimension": "driver", "what": "driver library", "good": good.get("driver") or "(system)",
                    "bad": bad.get("driver") or "(system)"})
    elif good.get("driver_version") != bad.get("driver_version") and good.get("driver_version") and bad.get("driver_version"):
        out.append({"dimension": "driver", "what": "driver version", "good": good.get("driver_version"),
                    "bad": bad.get("driver_version")})
    gv = {k: v for k, v in (good.get("vars") or {}).items() if k != "CUDASNAP_REPLACE"}
    bv = {k: v for k, v in (bad.get("vars") or {}).items() if k != "CUDASNAP_REPLACE"}
    for k in sorted(set(gv) | set(bv)):
        if gv.get(k) != bv.get(k):
            out.append({"dimension": "variable", "what": k, "good": gv.get(k), "bad": bv.get(k)})
    gr, br = good.get("replace") or {}, bad.get("replace") or {}
    for k in sorted(set(gr) | set(br)):
        if gr.get(k) != br.get(k):
            out.append({"dimension": "rebuilt kernel", "what": k,
                        "good": "recorded build" if k not in gr else f"build {str(gr[k])[:12]}",
                        "bad": "recorded build" if k not in br else f"build {str(br[k])[:12]}"})
    if good.get("gpu_model") and bad.get("gpu_model") and good["gpu_model"] != bad["gpu_model"]:
        out.append({"dimension": "gpu", "what": "GPU model", "good": good["gpu_model"], "bad": bad["gpu_model"]})
    return out


def _kernels(db, cell_id: int) -> List[Dict[str, Any]]:
    return db.kernel_results(cell_id)


def _history(db, cell, kernel: Optional[str], upto_run: int) -> List[Dict[str, Any]]:
    """This snapshot x env (x kernel) in every run up to upto_run, oldest first."""
    rows = db.cell_history(cell["snapshot_digest"], cell["env"], cell["mode"], cell["kernels"], upto_run)
    out = []
    for r in rows:
        k = None
        if kernel is not None:
            k = db.kernel_result(r["id"], kernel)
        out.append({"run": r["run_id"], "started": r["run_started"], "cell": r, "kernel": dict(k) if k else None})
    return out


def _kernel_bad(h) -> bool:
    if h["cell"]["verdict"] == MISMATCH:
        return True
    return h["kernel"] is not None and h["kernel"]["verdict"] == "SLOWER"


def attribute(db, cell, kernel: Optional[str]) -> Dict[str, Any]:
    """Why this cell (and kernel) regressed: the last good cell and what differs from it, and
    the first run of the streak of bad runs that ends here."""
    hist = _history(db, cell, kernel, cell["run_id"])
    first = cell["run_id"]
    for h in reversed(hist):
        if h["cell"]["run_id"] == cell["run_id"] and h["cell"]["id"] != cell["id"]:
            continue
        if _kernel_bad(h):
            first = h["run"]
        else:
            break
    good = None
    for h in reversed(hist):
        if h["run"] < cell["run_id"] and not _kernel_bad(h) and h["cell"]["status"] == "ok":
            good = h["cell"]
            break
    source = "an earlier run of this environment"
    if good is None and not cell["is_baseline"]:
        good = (db.cell_row(cell["baseline_cell_id"]) if cell["baseline_cell_id"] is not None else
                # a paired cell may finish before its run's baseline cell: the same snapshot's
                db.baseline_cell_of(cell["run_id"], cell["snapshot_digest"], cell["mode"], cell["kernels"]))
        source = "the baseline environment in this run"
    a: Dict[str, Any] = {"first_run": first, "last_good": None, "differences": []}
    if good is not None:
        a["last_good"] = {"cell": good["id"], "run": good["run_id"], "env": good["env"], "source": source}
        a["differences"] = env_differences(_env(good), _env(cell))
    return a


def build_report(store, run: Optional[int] = None, since: Optional[str] = None, ending: bool = False) -> Dict[str, Any]:
    """ending: the run's own session reports as it ends (its row still says running)."""
    db = store                  # its methods: every query the report makes (campaign/store.py)
    why = store.value_problem()
    if why:
        raise ReportError(f"{store.path}: a damaged campaign store: {why}")
    runs = store.runs(since)
    if not runs:
        raise ReportError(f"{store.path}: no campaign run" + (f" since {since}" if since else ""))
    if run is None:
        cur = runs[-1]
    else:
        cur = next((r for r in runs if r["id"] == run), None)
        if cur is None:
            raise ReportError(f"{store.path}: no run {run}" + (f" since {since}" if since else ""))
    cells = db.run_cells(cur["id"])
    envs: List[str] = []
    snaps: Dict[str, str] = {}
    for c in sorted(cells, key=lambda c: not c["is_baseline"]):    # the baseline's column first
        if c["env"] not in envs:
            envs.append(c["env"])
        snaps.setdefault(c["snapshot_digest"] + "/" + c["mode"] + "/" + (c["kernels"] or ""),
                         os.path.basename(c["snapshot"]))
    matrix = []
    for sk, name in snaps.items():
        row = {"snapshot": name, "digest": sk.split("/")[0], "cells": {}}
        for c in cells:
            if c["snapshot_digest"] + "/" + c["mode"] + "/" + (c["kernels"] or "") == sk:
                ks = _kernels(db, c["id"])
                row["cells"][c["env"]] = {"verdict": c["verdict"], "status": c["status"], "cell": c["id"],
                                          "slower": [k["kernel"] for k in ks if k["verdict"] == "SLOWER"],
                                          "faster": [k["kernel"] for k in ks if k["verdict"] == "FASTER"],
                                          "attempts": c["attempts"], "reruns": c["reruns"], "error": c["error"],
                                          "control": bool(c["control"]), "gpu": c["gpu"],
                                          "confirm_gpu": c["confirm_gpu"], "confirm_note": c["confirm_note"],
                                          "numerics": cell_numerics_of(c)}
        matrix.append(row)
    regressions = []
    for c in cells:
        if c["verdict"] not in REGRESSIONS:
            continue
        names = [k["kernel"] for k in _kernels(db, c["id"]) if k["verdict"] == "SLOWER"]
        if c["verdict"] == MISMATCH:
            names = [None]
        for k in names or [None]:
            kr = db.kernel_result(c["id"], k) if k else None
            reg = {"snapshot": os.path.basename(c["snapshot"]), "snapshot_digest": c["snapshot_digest"],
                   "env": c["env"], "kernel": k, "cell": c["id"],
                   "kind": "correctness break" if c["verdict"] == MISMATCH else "timing regression",
                   "ratio": kr["ratio"] if kr else None, "diff_pct": kr["diff_pct"] if kr else None,
                   "noise_pct": kr["campaign_noise_pct"] if kr else None, "bar_pct": kr["bar_pct"] if kr else None,
                   "p_value": kr["p_value"] if kr else None, "why": kr["why"] if kr else c["error"],
                   "confirmed": c["confirmed"], "confirm_note": c["confirm_note"], "gpu": c["gpu"],
                   "confirm_gpu": c["confirm_gpu"], "control": bool(c["control"]),
                   "numerics": cell_numerics_of(c)}
            reg.update(attribute(db, c, k))
            regressions.append(reg)
    infra = [{"snapshot": os.path.basename(c["snapshot"]), "env": c["env"], "cell": c["id"], "status": c["status"],
              "attempts": c["attempts"], "error": c["error"]}
             for c in cells if c["verdict"] in (INFRA, INCOMPARABLE) or c["status"] in ("infra", "error")]
    aside: Dict[str, str] = {}
    for c in cells:
        if c["status"] == "n/a":
            aside.setdefault(os.path.basename(c["snapshot"]), c["error"] or "set aside")
    history = _kernel_history(db, [r["id"] for r in runs])
    if cur["status"] in ("failed", "interrupted") or (cur["status"] == "running" and not ending):
        why = {"interrupted": "was interrupted", "failed": "failed",
               "running": "has not ended (it is still running, or its process was killed)"}[cur["status"]]
        infra.append({"snapshot": "-", "env": "-", "cell": None, "status": cur["status"], "attempts": 0,
                      "error": f"the run {why} before every cell was done: an infrastructure failure, not a "
                               f"verdict; run the same campaign again to finish it"})
    verdicts = _verdicts(db, cells)
    controls = _controls(db, cells)
    offsets = _gpu_offsets(db, cells)
    code = 2 if infra or controls["noise_exceeds"] else (1 if regressions else 0)
    reason = ("infrastructure failures" if infra else NOISE_EXCEEDS if controls["noise_exceeds"] else
              "a regression" if regressions else None)
    return {"store": store.path, "run": dict(cur), "runs": [dict(r) for r in runs], "envs": envs, "matrix": matrix,
            "regressions": regressions, "infra_failures": infra, "history": history, "exit_code": code,
            "exit_reason": reason, "verdicts": verdicts, "controls": controls, "gpu_offsets": offsets,
            "set_aside": [{"snapshot": k, "why": v} for k, v in aside.items()],
            "verdict_counts": _counts(cells)}


def _gpu_offsets(db, cells) -> List[Dict[str, Any]]:
    """The baseline's offset between the run's GPUs, per snapshot and kernel: its medians on each
    GPU (baseline cells, and the baseline replays beside each paired cell), max - min over their
    median, percent. Pairing cancels it; it says how far unpaired cells would have been off."""
    per: Dict[tuple, Dict[str, List[float]]] = {}
    for c in cells:
        if c["status"] != "ok" or not c["gpu"]:
            continue
        for k in _kernels(db, c["id"]):
            m = k["median_us"] if c["is_baseline"] else k["base_median_us"]
            if m:
                per.setdefault((os.path.basename(c["snapshot"]), k["kernel"]), {}).setdefault(c["gpu"], []).append(m)
    out = []
    for (snap, kernel), gpus in per.items():
        meds = sorted(sorted(v)[len(v) // 2] for v in gpus.values())
        if len(meds) > 1 and meds[len(meds) // 2] > 0:
            out.append({"snapshot": snap, "kernel": kernel, "gpus": len(meds),
                        "offset_pct": (meds[-1] - meds[0]) / meds[len(meds) // 2] * 100})
    return sorted(out, key=lambda o: -o["offset_pct"])


def _verdicts(db, cells) -> List[Dict[str, Any]]:
    """Every kernel judged SLOWER, FASTER or UNCONFIRMED in the run, beside the noise it had to
    exceed and its confirmation: the evidence of each verdict."""
    out = []
    for c in cells:
        for k in _kernels(db, c["id"]):
            if k["verdict"] not in (SLOWER_, FASTER_, UNCONFIRMED):
                continue
            out.append({"snapshot": os.path.basename(c["snapshot"]), "env": c["env"], "cell": c["id"],
                        "control": bool(c["control"]), "kernel": k["kernel"], "verdict": k["verdict"],
                        "diff_pct": k["diff_pct"], "bar_pct": k["bar_pct"], "campaign_noise_pct": k["campaign_noise_pct"],
                        "cell_noise_pct": _rss(k["noise_pct"], k["base_noise_pct"]), "p_value": k["p_value"],
                        "gpu_offset_pct": k["gpu_offset_pct"], "gpu": c["gpu"], "confirm_gpu": c["confirm_gpu"],
                        "confirm_diff_pct": k["confirm_diff_pct"], "confirm_p_value": k["confirm_p_value"],
                        "confirm_note": c["confirm_note"], "attempts": c["attempts"], "why": k["why"],
                        "runs": _runs_of(db, c), "numerics": cell_numerics_of(c)})
    return out


def cell_numerics_of(cell) -> Optional[Dict[str, Any]]:
    """The cell's numerics (rules.cell_numerics), None where the store predates them."""
    raw = cell["numerics"] if "numerics" in cell.keys() else None
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def _runs_of(db, cell) -> List[Dict[str, Any]]:
    """The replays a cell's verdict rests on: side, round, purpose, GPU, outcome and times."""
    return db.cell_attempts(cell["run_id"], cell["cell_key"])


def _rss(a, b):
    if a is None and b is None:
        return None
    return ((a or 0.0) ** 2 + (b or 0.0) ** 2) ** 0.5


def _controls(db, cells) -> Dict[str, Any]:
    """The false-verdict rate the controls measure: their kernel comparisons, and how many of
    them ended in a verdict (a verdict in a control: noise exceeds the rules)."""
    ctl = [c for c in cells if c["control"]]
    comps = verdicts = withdrawn = 0
    bad = []
    for c in ctl:
        ks = [k for k in _kernels(db, c["id"]) if k["verdict"] not in (None, "-")]
        comps += len(ks)
        nv = sum(k["verdict"] in (SLOWER_, FASTER_) for k in ks)
        verdicts += nv
        withdrawn += sum(k["verdict"] == UNCONFIRMED for k in ks)
        if c["verdict"] in (SLOWER_, FASTER_):
            bad.append({"snapshot": os.path.basename(c["snapshot"]), "env": c["env"], "cell": c["id"],
                        "verdict": c["verdict"], "kernels": nv})
    return {"envs": sorted({c["env"] for c in ctl}), "cells": len(ctl), "comparisons": comps, "verdicts": verdicts,
            "withdrawn": withdrawn, "rate": verdicts / comps if comps else None, "noise_exceeds": bad}




def _counts(cells) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for c in cells:
        out[c["verdict"]] = out.get(c["verdict"], 0) + 1
    return out


def _kernel_history(db, run_ids: List[int]) -> List[Dict[str, Any]]:
    """Per snapshot x env x kernel: its median in each run (oldest first)."""
    if not run_ids:
        return []
    series: Dict[tuple, Dict[str, Any]] = {}
    for r in db.kernel_medians(run_ids):
        key = (r["snapshot_digest"], r["mode"], r["env"], r["kernel"])
        s = series.setdefault(key, {"snapshot": os.path.basename(r["snapshot"]), "env": r["env"],
                                    "kernel": r["kernel"], "points": []})
        s["points"].append({"run": r["run_id"], "median_us": r["median_us"], "noise_pct": r["noise_pct"],
                            "verdict": r["verdict"], "numerics": cell_numerics_of(r)})
    return list(series.values())


def _us(v) -> str:
    if v is None:
        return "-"
    return f"{v / 1000:.2f} ms" if v >= 1000 else f"{v:.2f} us"


def _rel(point) -> str:
    """' (CLOSE, rel 1.2e-07)' where that night's results were not bit-exact: numerics drifting."""
    n = point.get("numerics") or {}
    if n.get("outcome") in (None, "EXACT"):
        return ""
    rel = n.get("max_rel")
    return f" ({n['outcome']}" + (f", rel {rel:.1g})" if isinstance(rel, (int, float)) else ")")


def render_text(rep: Dict[str, Any], out) -> None:
    from cudasnap.formats.console import console, print_table
    con = console(file=out)
    r = rep["run"]
    w = out.write
    w(f"run {r['id']} of campaign {r['campaign']!r}: started {r['started']}, {r['status']}"
      f"{', ended ' + r['ended'] if r.get('ended') else ''}; hosts {', '.join(json.loads(r['hosts'] or '[]'))}\n")
    envs = rep["envs"]
    rows = []
    for m in rep["matrix"]:
        cells = []
        for e in envs:
            c = m["cells"].get(e)
            if c is None:
                cells.append("(not run)")
            else:
                nt = numerics_text(c.get("numerics"))
                cells.append(c["verdict"] + (f" ({', '.join(c['slower'][:3])})" if c["slower"] else "")
                             + (f"; {nt}" if nt else ""))
        rows.append([m["snapshot"]] + cells)
    print_table(con, ["snapshot"] + envs, rows, title="matrix (verdict against the baseline):")
    if rep.get("verdicts"):
        w("verdicts, beside the noise they exceeded (bar: max(threshold, sigmas x the campaign's noise)):\n")
        for v in rep["verdicts"]:
            w(f"* {v['snapshot']} {'control ' if v['control'] else ''}env {v['env']!r} kernel {v['kernel']}: "
              f"{v['verdict']} {pct(v['diff_pct'], True)} vs bar +-{pct(v['bar_pct'])} "
              f"(campaign noise {pct(v['campaign_noise_pct'])}, cell noise {pct(v['cell_noise_pct'])}, "
              f"GPU offset {pct(v['gpu_offset_pct'])}, p={p_text(v['p_value'])}) on {v['gpu'] or '?'}; "
              f"{confirm_text(v)}" + (f"; {numerics_text(v.get('numerics'))}" if numerics_text(v.get("numerics")) else "")
              + "\n")
    w(controls_line(rep["controls"]) + "\n")
    if rep.get("gpu_offsets"):
        o = rep["gpu_offsets"][0]
        w(f"GPU offset of the baseline between GPUs (pairing cancels it): up to {o['offset_pct']:.1f}% "
          f"({o['snapshot']} {o['kernel']}, {o['gpus']} GPUs)\n")
    if rep["regressions"]:
        w(f"{len(rep['regressions'])} regression(s):\n")
        for g in rep["regressions"]:
            what = f"kernel {g['kernel']}" if g["kernel"] else g["kind"]
            d = f" {g['diff_pct']:+.1f}%" if g.get("diff_pct") is not None else ""
            if g.get("bar_pct") is not None:
                d += f" (bar +-{g['bar_pct']:.1f}%, p={p_text(g.get('p_value'))}; {g.get('confirm_note') or 'no confirmation'})"
            nt = numerics_text(g.get("numerics"))
            w(f"- {g['snapshot']} in env {g['env']!r}: {what}{d}{'; ' + nt if nt else ''}; first seen in run {g['first_run']}\n")
            lg = g.get("last_good")
            if lg:
                diffs = "; ".join(f"{x['dimension']} {x['what']}: {x['good']} -> {x['bad']}" for x in g["differences"]) \
                    or "no difference in the environment recorded (the snapshot or the machine changed)"
                w(f"    vs the last good cell (env {lg['env']!r}, run {lg['run']}, {lg['source']}): {diffs}\n")
            trend = next((h for h in rep["history"] if h["env"] == g["env"] and h["kernel"] == g["kernel"]
                          and h["snapshot"] == g["snapshot"]), None)
            if trend and len(trend["points"]) > 1:
                w("    history: " + ", ".join(f"run {p['run']} {_us(p['median_us'])}{_rel(p)}"
                                        for p in trend["points"][-8:]) + "\n")
    elif any(f["cell"] is None for f in rep["infra_failures"]):
        w("no regression in the cells done (not every cell was run)\n")
    else:
        w("no regression\n")
    for b in rep["controls"]["noise_exceeds"]:
        w(f"{NOISE_EXCEEDS}: control env {b['env']!r} judged {b['verdict']} on {b['snapshot']} "
          f"({b['kernels']} kernel verdict(s)); it changes nothing, so the verdicts of this run are not to be trusted\n")
    for a in rep.get("set_aside", []):
        w(f"{a['snapshot']}: {a['why']} (its cells are N/A, not counted in the verdict)\n")
    for f in rep["infra_failures"]:
        if f["cell"] is None:
            w(f"run {r['id']} {f['status']}: {f['error']}\n")
            continue
        w(f"infrastructure failure: {f['snapshot']} in env {f['env']!r} ({f['status']}, {f['attempts']} tries): "
          f"{f['error']}\n")


def write_html(rep: Dict[str, Any], path) -> None:
    from .report_html import html_report
    from cudasnap.formats.outputs import write_atomic
    write_atomic(path, html_report(rep))
