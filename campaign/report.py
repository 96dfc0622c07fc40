"""What a campaign store says: the matrix of a run (snapshot x env), each kernel's history
across runs, and every regression attributed to its kernel, to what differs from the last good
cell (driver, a variable, a rebuilt kernel, the GPU model) and to the first run where it
appeared. Exit: 2 when the run has infrastructure failures, else 1 on a regression, else 0."""
from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, List, Optional

from .rules import INFRA, INCOMPARABLE, MISMATCH, REGRESSIONS



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
    return [dict(r) for r in db.execute("SELECT * FROM kernel_results WHERE cell_id=? ORDER BY id", (cell_id,))]


def _history(db, cell, kernel: Optional[str], upto_run: int) -> List[Dict[str, Any]]:
    """This snapshot x env (x kernel) in every run up to upto_run, oldest first."""
    rows = db.execute("SELECT c.*, r.started AS run_started FROM cells c JOIN runs r ON r.id=c.run_id"
                      " WHERE c.snapshot_digest=? AND c.env=? AND c.mode=? AND c.kernels IS ? AND c.run_id<=?"
                      " ORDER BY c.run_id, c.id", (cell["snapshot_digest"], cell["env"], cell["mode"], cell["kernels"],
                                                    upto_run)).fetchall()
    out = []
    for r in rows:
        k = None
        if kernel is not None:
            k = db.execute("SELECT * FROM kernel_results WHERE cell_id=? AND kernel=?", (r["id"], kernel)).fetchone()
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
    if good is None and cell["baseline_cell_id"] is not None:
        good = db.execute("SELECT * FROM cells WHERE id=?", (cell["baseline_cell_id"],)).fetchone()
        source = "the baseline environment in this run"
    a: Dict[str, Any] = {"first_run": first, "last_good": None, "differences": []}
    if good is not None:
        a["last_good"] = {"cell": good["id"], "run": good["run_id"], "env": good["env"], "source": source}
        a["differences"] = env_differences(_env(good), _env(cell))
    return a


def build_report(store, run: Optional[int] = None, since: Optional[str] = None) -> Dict[str, Any]:
    db = store.db
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
    cells = db.execute("SELECT * FROM cells WHERE run_id=? ORDER BY id", (cur["id"],)).fetchall()
    envs: List[str] = []
    snaps: Dict[str, str] = {}
    for c in cells:
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
                                          "attempts": c["attempts"], "reruns": c["reruns"], "error": c["error"]}
        matrix.append(row)
    regressions = []
    for c in cells:
        if c["verdict"] not in REGRESSIONS:
            continue
        names = [k["kernel"] for k in _kernels(db, c["id"]) if k["verdict"] == "SLOWER"]
        if c["verdict"] == MISMATCH:
            names = [None]
        for k in names or [None]:
            kr = db.execute("SELECT * FROM kernel_results WHERE cell_id=? AND kernel=?", (c["id"], k)).fetchone() \
                if k else None
            reg = {"snapshot": os.path.basename(c["snapshot"]), "snapshot_digest": c["snapshot_digest"],
                   "env": c["env"], "kernel": k, "cell": c["id"],
                   "kind": "correctness break" if c["verdict"] == MISMATCH else "timing regression",
                   "ratio": kr["ratio"] if kr else None, "diff_pct": kr["diff_pct"] if kr else None,
                   "noise_pct": None, "why": kr["why"] if kr else c["error"], "confirmed": c["confirmed"]}
            reg.update(attribute(db, c, k))
            regressions.append(reg)
    infra = [{"snapshot": os.path.basename(c["snapshot"]), "env": c["env"], "cell": c["id"], "status": c["status"],
              "attempts": c["attempts"], "error": c["error"]}
             for c in cells if c["verdict"] in (INFRA, INCOMPARABLE) or c["status"] in ("infra", "error")]
    history = _kernel_history(db, [r["id"] for r in runs])
    if cur["status"] in ("failed", "interrupted"):
        infra.append({"snapshot": "-", "env": "-", "cell": None, "status": cur["status"], "attempts": 0,
                      "error": f"the run {'stopped' if cur['status'] == 'interrupted' else 'failed'} before every "
                               f"cell was done: run the same campaign again to finish it"})
    code = 2 if infra else (1 if regressions else 0)
    return {"store": store.path, "run": dict(cur), "runs": [dict(r) for r in runs], "envs": envs, "matrix": matrix,
            "regressions": regressions, "infra_failures": infra, "history": history, "exit_code": code,
            "verdict_counts": _counts(cells)}


def _counts(cells) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for c in cells:
        out[c["verdict"]] = out.get(c["verdict"], 0) + 1
    return out


def _kernel_history(db, run_ids: List[int]) -> List[Dict[str, Any]]:
    """Per snapshot x env x kernel: its median in each run (oldest first)."""
    if not run_ids:
        return []
    q = ("SELECT c.run_id, c.snapshot, c.snapshot_digest, c.env, c.mode, k.kernel, k.median_us, k.noise_pct, k.verdict"
         " FROM kernel_results k JOIN cells c ON c.id=k.cell_id"
         f" WHERE c.run_id IN ({','.join('?' * len(run_ids))}) ORDER BY c.run_id, c.id, k.id")
    series: Dict[tuple, Dict[str, Any]] = {}
    for r in db.execute(q, run_ids):
        key = (r["snapshot_digest"], r["mode"], r["env"], r["kernel"])
        s = series.setdefault(key, {"snapshot": os.path.basename(r["snapshot"]), "env": r["env"],
                                    "kernel": r["kernel"], "points": []})
        s["points"].append({"run": r["run_id"], "median_us": r["median_us"], "noise_pct": r["noise_pct"],
                            "verdict": r["verdict"]})
    return list(series.values())


def _us(v) -> str:
    if v is None:
        return "-"
    return f"{v / 1000:.2f} ms" if v >= 1000 else f"{v:.2f} us"


def render_text(rep: Dict[str, Any], out) -> None:
    from cudasnap.console import console, print_table
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
                cells.append(c["verdict"] + (f" ({', '.join(c['slower'][:3])})" if c["slower"] else ""))
        rows.append([m["snapshot"]] + cells)
    print_table(con, ["snapshot"] + envs, rows, title="matrix (verdict against the baseline):")
    if rep["regressions"]:
        w(f"{len(rep['regressions'])} regression(s):\n")
        for g in rep["regressions"]:
            what = f"kernel {g['kernel']}" if g["kernel"] else g["kind"]
            d = f" {g['diff_pct']:+.1f}%" if g.get("diff_pct") is not None else ""
            w(f"- {g['snapshot']} in env {g['env']!r}: {what}{d}; first seen in run {g['first_run']}\n")
            lg = g.get("last_good")
            if lg:
                diffs = "; ".join(f"{x['dimension']} {x['what']}: {x['good']} -> {x['bad']}" for x in g["differences"]) \
                    or "no difference in the environment recorded (the snapshot or the machine changed)"
                w(f"    vs the last good cell (env {lg['env']!r}, run {lg['run']}, {lg['source']}): {diffs}\n")
            trend = next((h for h in rep["history"] if h["env"] == g["env"] and h["kernel"] == g["kernel"]
                          and h["snapshot"] == g["snapshot"]), None)
            if trend and len(trend["points"]) > 1:
                w("    history: " + ", ".join(f"run {p['run']} {_us(p['median_us'])}" for p in trend["points"][-8:]) + "\n")
    else:
        w("no regression\n")
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
