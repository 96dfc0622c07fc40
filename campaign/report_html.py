"""The campaign report as one self-contained HTML file (plotly.js embedded): the matrix, every
verdict beside its noise and linked to its evidence (the replays, their GPUs and sides), the
regressions with their attribution, infrastructure failures, and each snapshot's kernel trends
across runs: the TOP kernels plotted (regressed ones first, then by time), the rest in a table.
Kernel names are demangled and shortened (replay/names.short_name), the full name in a tooltip."""
from __future__ import annotations

import json
import zlib
from typing import Any, Dict, List

from cudasnap.compare.html import Page, e, table
from cudasnap.replay.names import demangle, short_name
from .wording import numerics_text

TOP = 8                   # kernels plotted per snapshot; the others are listed under the chart
NAME_WIDTH = 60


def kname(name: str) -> str:
    """A kernel's short name, its full demangled name on hover."""
    return f"<span title='{e(demangle(name))}'>{e(short_name(name, NAME_WIDTH))}</span>"


def legend_name(name: str, width: int = 40) -> str:
    """A kernel's name for a chart's legend: short_name without the function's namespaces."""
    s = short_name(name)
    depth, cut = 0, 0
    for i, ch in enumerate(s):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0 and s.startswith("::", i):
            cut = i + 2
    s = s[cut:]
    if len(s) > width > 8:
        tail = width // 3
        s = s[:width - tail - 1] + "…" + s[-tail:]
    return s


def anchor(v: Dict[str, Any]) -> str:
    return f"v{v['cell']}-{zlib.crc32(v['kernel'].encode()):08x}"

COLORS = {"SLOWER": "#d62728", "MISMATCH": "#8c1c13", "SAME": "#2ca02c", "FASTER": "#1f77b4",
          "BASELINE": "#666", "INFRA": "#ff7f0e", "UNCONFIRMED": "#bcbd22"}


def _cell(c: Dict[str, Any], links: Dict[int, str]) -> str:
    if c is None:
        return "<span style='color:#999'>(not run)</span>"
    col = COLORS.get(c["verdict"], "#444")
    extra = (f"<br><small>{', '.join(kname(k) for k in c['slower'][:4])}</small>" if c.get("slower") else "")
    nt = numerics_text(c.get("numerics"))
    if nt:
        extra += f"<br><small class='numerics'>{e(nt)}</small>"
    tip = e(c.get("error") or f"{c['attempts']} attempt(s), {c['reruns']} rerun(s)")
    word = e(c["verdict"])
    if c.get("cell") in links:
        word = f"<a href='#{links[c['cell']]}'>{word}</a>"
    return f"<b style='color:{col}' title='{tip}'>{word}</b>{extra}"


def trend_figure(series: List[Dict[str, Any]], title: str, limit: int = 40):
    import plotly.graph_objects as go
    fig = go.Figure()
    for s in series[:limit]:
        pts = s["points"]
        fig.add_trace(go.Scatter(
            x=[p["run"] for p in pts], y=[p["median_us"] for p in pts], mode="lines+markers",
            name=f"{s['env']}: {legend_name(s['kernel'])}",
            error_y={"type": "data", "visible": True, "thickness": 1,
                     "array": [(p["noise_pct"] or 0) * (p["median_us"] or 0) / 100 for p in pts]},
            marker={"color": [COLORS.get(p["verdict"] or "BASELINE", "#666") for p in pts], "size": 8},
            customdata=[[p["verdict"] or "-"] for p in pts],
            hovertemplate=f"{e(short_name(s['kernel']))} ({e(s['env'])})<br>run %{{x}}: %{{y:.2f}} us<br>%{{customdata[0]}}<extra></extra>"))
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
    links: Dict[int, str] = {}
    for v in rep.get("verdicts") or []:
        links.setdefault(v["cell"], anchor(v))
    rows = [[m["snapshot"]] + [_cell(m["cells"].get(x), links) for x in envs] for m in rep["matrix"]]
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
             "p", "GPU", "confirmation", "numerics", "why"],
            [[e(v["snapshot"]), e(v["env"] + (" (control)" if v["control"] else "")), kname(v["kernel"]),
              f"<a href='#{anchor(v)}'>{e(v['verdict'])}</a>",
              e(pct(v["diff_pct"], True)), e(pct(v["bar_pct"])), e(pct(v["campaign_noise_pct"])),
              e(pct(v["cell_noise_pct"])), e(pct(v["gpu_offset_pct"])), e(p_text(v["p_value"])), e(v["gpu"] or "-"),
              e(confirm_text(v)), e(numerics_text(v.get("numerics")) or ("EXACT" if v.get("numerics") else "-")), e(v["why"] or "")]
             for v in rep["verdicts"]], raw_cols=set(range(14))))
        page.add("<h2>Evidence</h2>" + "".join(_evidence(v) for v in rep["verdicts"]))
    page.add("<h2>Regressions</h2>")
    if rep["regressions"]:
        rr = []
        for g in rep["regressions"]:
            lg = g.get("last_good") or {}
            diffs = "; ".join(f"{x['dimension']} {x['what']}: {x['good']} -> {x['bad']}" for x in g["differences"])
            rr.append([g["snapshot"], g["env"], g["kernel"] or g["kind"],
                       f"{g['diff_pct']:+.1f}%" if g.get("diff_pct") is not None else "-",
                       f"env {lg.get('env')} (run {lg.get('run')})" if lg else "-", diffs or "-",
                       g["first_run"], numerics_text(g.get("numerics")) or "-", g.get("why") or ""])
        page.add(table(["snapshot", "env", "kernel", "diff", "last good", "what differs", "first run", "numerics",
                        "why"], rr))
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
        # regressed kernels first, then the longest-running; the top ones plotted, the rest listed
        series.sort(key=lambda s: ((snap, s["env"], s["kernel"]) not in bad,
                                   -max((p["median_us"] or 0) for p in s["points"])))
        kernels = list(dict.fromkeys(s["kernel"] for s in series))
        top = set(kernels[:TOP])
        shown = [s for s in series if s["kernel"] in top]
        page.figure(trend_figure(shown, f"{snap}: kernel medians per run (top {len(top)} of {len(kernels)} kernels)",
                                 limit=len(shown)))
        rest = [s for s in series if s["kernel"] not in top]
        if rest:
            page.add(f"<details><summary>{len(kernels) - len(top)} more kernel(s) of {e(snap)}</summary>" + table(
                ["kernel", "env", "latest median (us)", "noise", "verdict"],
                [[kname(s["kernel"]), e(s["env"]), e(f"{s['points'][-1]['median_us']:.2f}" if s["points"][-1]["median_us"]
                                                     is not None else "-"),
                  e(pct(s["points"][-1]["noise_pct"])), e(s["points"][-1]["verdict"] or "-")] for s in rest],
                raw_cols={0, 1, 2, 3, 4}) + "</details>")
    return _render(page)


def _evidence(v: Dict[str, Any]) -> str:
    """A verdict's evidence: the numbers it had to beat and every replay it rests on."""
    from .wording import confirm_text, p_text, pct
    head = (f"<h3 id='{anchor(v)}'>{e(v['snapshot'])}, env {e(v['env'])}: {kname(v['kernel'])} {e(v['verdict'])} "
            f"{e(pct(v['diff_pct'], True))}</h3>"
            f"<p>bar {e(pct(v['bar_pct']))} = max(threshold, sigmas x campaign noise {e(pct(v['campaign_noise_pct']))}); "
            f"cell noise {e(pct(v['cell_noise_pct']))}; GPU offset {e(pct(v['gpu_offset_pct']))}; "
            f"Mann-Whitney {e(p_text(v['p_value']))}; on {e(v['gpu'] or '-')}; {e(confirm_text(v))}"
            + (f"; {e(numerics_text(v.get('numerics')))}" if numerics_text(v.get("numerics")) else "") + "</p>")
    runs = v.get("runs") or []
    rows = [[r["n"], r["purpose"], r.get("side") or "-", r.get("round") or "-", r["outcome"],
             f"{r.get('host') or '?'}:{r.get('visible_devices') or '-'}", r.get("gpu_uuid") or "-",
             f"{r['proc_s']:.2f}" if r.get("proc_s") is not None else "-", r.get("started") or "-"] for r in runs]
    return head + (table(["#", "purpose", "side", "round", "outcome", "GPU", "GPU uuid", "replay s", "started"], rows)
                   if rows else "<p>no replay recorded</p>")


def _render(page: Page) -> str:
    from cudasnap.compare.html import CSS
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{e(page.title)}</title>"
            f"<style>{CSS}</style></head><body><h1>{e(page.title)}</h1>{''.join(page.parts)}</body></html>")
