"""The campaign report as one self-contained HTML file (plotly.js embedded): the matrix, the
regressions with their attribution, infrastructure failures, and each kernel's trend across
runs, one plot per snapshot."""
from __future__ import annotations

import json
from typing import Any, Dict, List

from cudasnap.compare.html import Page, e, table

COLORS = {"SLOWER": "#d62728", "MISMATCH": "#8c1c13", "SAME": "#2ca02c", "FASTER": "#1f77b4",
          "BASELINE": "#666", "INFRA": "#ff7f0e", "UNCONFIRMED": "#bcbd22"}


def _cell(c: Dict[str, Any]) -> str:
    if c is None:
        return "<span style='color:#999'>(not run)</span>"
    col = COLORS.get(c["verdict"], "#444")
    extra = f"<br><small>{e(', '.join(c['slower'][:4]))}</small>" if c.get("slower") else ""
    tip = e(c.get("error") or f"{c['attempts']} attempt(s), {c['reruns']} rerun(s)")
    return f"<b style='color:{col}' title='{tip}'>{e(c['verdict'])}</b>{extra}"


def trend_figure(series: List[Dict[str, Any]], title: str, limit: int = 40):
    import plotly.graph_objects as go
    fig = go.Figure()
    for s in series[:limit]:
        pts = s["points"]
        fig.add_trace(go.Scatter(
            x=[p["run"] for p in pts], y=[p["median_us"] for p in pts], mode="lines+markers",
            name=f"{s['env']}: {s['kernel'][:40]}",
            error_y={"type": "data", "visible": True, "thickness": 1,
                     "array": [(p["noise_pct"] or 0) * (p["median_us"] or 0) / 100 for p in pts]},
            marker={"color": [COLORS.get(p["verdict"] or "BASELINE", "#666") for p in pts], "size": 8},
            customdata=[[p["verdict"] or "-"] for p in pts],
            hovertemplate=f"{e(s['kernel'])} ({e(s['env'])})<br>run %{{x}}: %{{y:.2f}} us<br>%{{customdata[0]}}<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="campaign run", yaxis_title="median (us)", height=420,
                      plot_bgcolor="white", margin={"l": 60, "r": 20, "t": 50, "b": 50})
    fig.update_xaxes(dtick=1, gridcolor="#eee")
    fig.update_yaxes(gridcolor="#eee", rangemode="tozero")
    return fig


def html_report(rep: Dict[str, Any]) -> str:
    r = rep["run"]
    page = Page(f"cudasnap campaign {r['campaign']}: run {r['id']}")
    hosts = ", ".join(json.loads(r["hosts"] or "[]"))
    page.add(f"<p>started {e(r['started'])}, {e(r['status'])}{', ended ' + e(r['ended']) if r.get('ended') else ''};"
             f" hosts {e(hosts)}; cudasnap {e(r['cudasnap_version'])}; campaign file hash {e(r['campaign_hash'])};"
             f" exit {rep['exit_code']}</p>")
    envs = rep["envs"]
    rows = [[m["snapshot"]] + [_cell(m["cells"].get(x)) for x in envs] for m in rep["matrix"]]
    page.add("<h2>Matrix</h2>" + table(["snapshot"] + envs, rows, raw_cols=set(range(1, len(envs) + 1))))
    from .wording import NOISE_EXCEEDS, confirm_text, controls_line, p_text, pct
    ctl = rep["controls"]
    page.add(f"<p><b>{e(controls_line(ctl))}</b></p>")
    if rep.get("gpu_offsets"):
        o = rep["gpu_offsets"][0]
        page.add(f"<p>GPU offset of the baseline between GPUs (pairing cancels it): up to {o['offset_pct']:.1f}% "
                 f"({e(o['snapshot'])} {e(o['kernel'])}, {o['gpus']} GPUs)</p>")
    for b in ctl["noise_exceeds"]:
        page.add(f"<p style='color:#d62728'><b>{e(NOISE_EXCEEDS)}</b>: control env {e(b['env'])} judged "
                 f"{e(b['verdict'])} on {e(b['snapshot'])}</p>")
    if rep.get("verdicts"):
        page.add("<h2>Verdicts and their noise</h2>" + table(
            ["snapshot", "env", "kernel", "verdict", "diff", "bar", "campaign noise", "cell noise", "GPU offset",
             "p", "GPU", "confirmation", "why"],
            [[v["snapshot"], v["env"] + (" (control)" if v["control"] else ""), v["kernel"], v["verdict"],
              pct(v["diff_pct"], True), pct(v["bar_pct"]), pct(v["campaign_noise_pct"]), pct(v["cell_noise_pct"]),
              pct(v["gpu_offset_pct"]), p_text(v["p_value"]), v["gpu"] or "-", confirm_text(v), v["why"] or ""]
             for v in rep["verdicts"]]))
    page.add("<h2>Regressions</h2>")
    if rep["regressions"]:
        rr = []
        for g in rep["regressions"]:
            lg = g.get("last_good") or {}
            diffs = "; ".join(f"{x['dimension']} {x['what']}: {x['good']} -> {x['bad']}" for x in g["differences"])
            rr.append([g["snapshot"], g["env"], g["kernel"] or g["kind"],
                       f"{g['diff_pct']:+.1f}%" if g.get("diff_pct") is not None else "-",
                       f"env {lg.get('env')} (run {lg.get('run')})" if lg else "-", diffs or "-",
                       g["first_run"], g.get("why") or ""])
        page.add(table(["snapshot", "env", "kernel", "diff", "last good", "what differs", "first run", "why"], rr))
    else:
        page.add("<p>none</p>")
    if rep["infra_failures"]:
        page.add("<h2>Infrastructure failures</h2>" + table(
            ["snapshot", "env", "status", "tries", "error"],
            [[f["snapshot"], f["env"], f["status"], f["attempts"], f["error"]] for f in rep["infra_failures"]]))
    page.add("<h2>History</h2>")
    by_snap: Dict[str, List[Dict[str, Any]]] = {}
    bad = {(g["snapshot"], g["env"], g["kernel"]) for g in rep["regressions"]}
    for s in rep["history"]:
        by_snap.setdefault(s["snapshot"], []).append(s)
    for snap, series in by_snap.items():
        # regressed kernels first, then the longest-running
        series.sort(key=lambda s: ((snap, s["env"], s["kernel"]) not in bad,
                                   -max((p["median_us"] or 0) for p in s["points"])))
        page.figure(trend_figure(series, f"{snap}: kernel medians per run"))
    return _render(page)


def _render(page: Page) -> str:
    from cudasnap.compare.html import CSS
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{e(page.title)}</title>"
            f"<style>{CSS}</style></head><body><h1>{e(page.title)}</h1>{''.join(page.parts)}</body></html>")
