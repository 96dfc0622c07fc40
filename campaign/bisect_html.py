"""The bisection's HTML report: every environment and its outcome, the first bad one against
the first (and against the last good one), their environments and the commands to rerun."""
from __future__ import annotations

import shlex
from typing import Any, Dict

from cudasnap.compare.html import Page, compare_sections, e, env_block, table
from cudasnap.compare.render import describe


def _total_figure(res: Dict[str, Any]):
    """Total time of each replayed environment relative to the first, with its noise."""
    import plotly.graph_objects as go
    xs, ys, err, colors, text = [], [], [], [], []
    for env in res["envs"]:
        if not env.get("tested"):
            continue
        xs.append(f"{env['index'] + 1}. {env['name']}")
        if env["index"] == 0:
            ys.append(0.0)
            err.append(0.0)
        else:
            t = (env.get("vs_first") or {}).get("total") or {}
            ys.append(t.get("diff_pct") or 0.0)
            err.append(t.get("noise_pct") or 0.0)
        colors.append({"good": "#1f77b4", "slower": "#d62728", "correctness": "#9467bd"}.get(env.get("status"), "#999"))
        text.append(env.get("status"))
    fig = go.Figure(go.Bar(x=xs, y=ys, marker_color=colors, text=text, textposition="outside",
                           error_y={"type": "data", "array": err, "visible": True, "color": "#444"}))
    th = res["threshold_pct"]
    for y in (th, -th):
        fig.add_hline(y=y, line_dash="dash", line_color="#888")
    fig.update_layout(title="total kernel time of each replayed environment vs the first (bars: noise band)",
                      yaxis_title="vs first (%)", height=380, plot_bgcolor="white",
                      margin={"l": 60, "r": 40, "t": 50, "b": 100})
    fig.update_yaxes(gridcolor="#eee", zerolinecolor="#444")
    return fig


def write_bisect_html(res: Dict[str, Any], path) -> None:
    page = Page("cudasnap bisect")
    code = res["exit_code"]
    cls = "bad" if code == 1 else ("good" if code == 0 else "warn")
    page.add(f"<div class='banner {cls}'>{e(res.get('message') or '')} (exit {code})</div>")
    page.add(f"<p>snapshot <code>{e(res['snapshot'])}</code>; profile {e(res['mode'])}"
             + (f" x{res['repeat']}" if res.get("repeat") else "")
             + (f", kernels matching <code>{e(res['kernels'])}</code>" if res.get("kernels") else "")
             + f"; threshold {res['threshold_pct']:g}%; {res['replays']} replays for {len(res['envs'])} environments "
             f"(at most {res['max_replays']}: both ends, then a binary search).</p>")
    rows = []
    for env in res["envs"]:
        vars_ = "<br>".join(e(f"{k}={v}") for k, v in (env.get("vars") or {}).items()) or "-"
        f = env.get("facts") or {}
        rows.append([e(f"{env['index'] + 1}. {env['name']}"), vars_, e(env.get("driver") or "-"),
                     e(describe(f) if f else "-"), e(env.get("order") or "not replayed"),
                     e(env.get("status") or "-"), e(env.get("reason") or "")])
    page.add("<h2>Environments</h2>" + table(["environment", "variables", "driver", "measured", "replay #",
                                              "outcome", "why"], rows, left=7, raw_cols=range(7)))
    if any(env.get("vs_first") for env in res["envs"]):
        page.figure(_total_figure(res))
    fb = res.get("first_bad")
    if fb and res.get("vs_first"):
        page.add(f"<h2>First bad: {e(fb['name'])} vs the first environment {e(res['envs'][0]['name'])}</h2>")
        compare_sections(page, res["vs_first"], heading=f"{fb['name']}: ")
        if res.get("vs_last_good"):
            lg = res["last_good"]["name"]
            page.add(f"<h2>First bad {e(fb['name'])} vs last good {e(lg)}</h2>")
            compare_sections(page, res["vs_last_good"], heading=f"{fb['name']} vs {lg}: ")
        page.add("<h2>Measured on</h2>" + env_block(f"first: {res['envs'][0]['name']}", res["vs_first"]["base"])
                 + env_block(f"first bad: {fb['name']}", res["vs_first"]["candidate"]))
    elif fb:
        page.add(f"<h2>Correctness break in {e(fb['name'])}</h2><pre>{e(res.get('correctness') or fb['reason'])}</pre>")
    cmds = []
    if res["commands"].get("bisect"):
        cmds.append("# this bisection\n" + res["commands"]["bisect"])
    for name, c in res["commands"].get("replays", {}).items():
        cmds.append(f"# replay in {name}\n{c}")
    if fb and res.get("vs_first"):
        a = res["envs"][0].get("profile")
        b = next((x.get("profile") for x in res["envs"] if x["name"] == fb["name"]), None)
        if a and b:
            cmds.append("# compare the two (profiles kept with --keep DIR)\n"
                        f"cudasnap compare {shlex.quote(a)} {shlex.quote(b)} --threshold {res['threshold_pct']:g}")
    page.add("<h2>Reproduce</h2><pre>" + e("\n\n".join(cmds)) + "</pre>")
    page.write(path)
