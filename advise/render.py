"""advise's outputs: the ranked table (rich at a terminal, plain lines elsewhere), JSON, and a
self-contained HTML page (plotly.js embedded) with the findings and the timeline's stretches."""
from __future__ import annotations

import json
from typing import Any, Dict, List

from cudasnap.formats.console import console, print_table
from cudasnap.replay.profile.metrics_sections import precision_label
from cudasnap.replay.profile.report import fmt_us


def evidence_line(f: Dict[str, Any]) -> str:
    e = f["evidence"]
    k = f["kind"]
    if k == "launch-bound":
        s = (f"calls {e['first_seq']}-{e['last_seq']}: {e['kernels']} kernels ({e['under_tiny_us']} under "
             f"{e['tiny_us']:g} us, median {fmt_us(e['median_kernel_us'])}), idle {fmt_us(e['idle_us'])} of "
             f"{fmt_us(e['span_us'])}, median gap {fmt_us(e['median_gap_us'])}")
        h = e.get("holds")
        if h and (h["syncs"] or h["d2h"]):
            s += f"; holds {h['syncs']} synchronizations, {h['d2h']} D2H copies (a graph leaves them out)"
        return s
    if k == "host-gap":
        big = e["largest"][0]
        s = (f"{e['gaps']} gap{'s' if e['gaps'] > 1 else ''}, {fmt_us(e['idle_us'])} idle; largest {fmt_us(big['gap_us'])} after call "
             f"{big['after_seq']} ({big['after']})")
        if big.get("nvtx"):
            s += f", NVTX: {' -> '.join(big['nvtx'])}"
        return s
    if k == "heavy-kernel":
        return f"{e['launches']} launches, {fmt_us(e['total_us'])}, median {fmt_us(e['median_us'])}"
    if k == "library":
        return f"{e['launches']} launches, {fmt_us(e['total_us'])} ({e['share_pct']:.1f}% of kernel time); try {e['library']}"
    if k in ("memory-bound", "compute-bound", "compute-and-memory-bound", "latency-bound", "occupancy"):
        parts = [f"{e['launches']} launches, {fmt_us(e['total_us'])} ({e['share_pct']:.1f}% of kernel time)"]
        for key, lab in (("sm_pct", "SM"), ("memory_pct", "memory"), ("dram_pct", "DRAM"), ("l2_pct", "L2"),
                         ("l1tex_pct", "L1/TEX"), ("achieved_occupancy_pct", "occupancy achieved"),
                         ("theoretical_occupancy_pct", "theoretical")):
            if isinstance(e.get(key), (int, float)):
                parts.append(f"{lab} {e[key]:.1f}%")
        if isinstance(e.get("intensity"), (int, float)):
            ridge = f", ridge {e['ridge']:.3g}" if isinstance(e.get("ridge"), (int, float)) else ""
            parts.append(f"{e['intensity']:.3g} FLOP/B ({precision_label(e.get('precision')) or 'FLOP'}{ridge})")
        return ", ".join(parts)
    if k == "small-transfers":
        return f"{e['count']} x {e['what']}, sizes {e['bytes']} B, {fmt_us(e['total_us'])} in all"
    if k in ("replace", "launch"):
        ks = e["kernels"][:2]
        return "; ".join(f"{r['kernel']}: {fmt_us(r['before_us'])} -> {fmt_us(r['after_us'])} ({r['change_pct']:+.1f}%)"
                         for r in ks) + ("" if e["verified"] else " (results differ)")
    return json.dumps(e, default=str)[:160]


def whatif_line(w: Dict[str, Any]) -> str:
    if not w:
        return "-"
    if not w.get("measured"):
        return f"not measured: {w.get('why')}"
    if w["kind"] == "graph":
        faster = f", {w['speedup']:g}x faster" if w.get("speedup") else ""
        base = w.get("baseline_us", w["timeline_span_us"])
        where = "as the program ran" if "recorded" in (w.get("baseline") or "") else "on the timeline"
        line = (f"as a CUDA graph {fmt_us(w['graph_us'])} vs {fmt_us(base)} {where}: "
                f"saves {fmt_us(w['gain_us'])} ({w['gain_pct']:.1f}%{faster}), graph replay exit {w['replay']['exit_code']}")
        return line + (f" ({w['note']})" if w.get("note") else "")
    if w["kind"] == "launch" and w.get("occupancy"):
        c = w["occupancy"]
        ks = w.get("kernels") or []
        t = f": {fmt_us(ks[0]['before_us'])} -> {fmt_us(ks[0]['after_us'])} ({ks[0]['change_pct']:+.1f}%)" if ks else ""
        return (f"block {c['recorded']['block']} -> {c['block']} (grid {c['recorded']['grid']} -> {c['grid']}), "
                f"theoretical occupancy {c['from_pct']:g}% -> {c['occupancy_pct']:g}%{t}, "
                + ("results verified" if w.get("verified") else "results differ: the kernel depends on its block size"))
    return f"measured, {fmt_us(w['gain_us'])} saved, replay exit {w['replay']['exit_code']}"


def render_text(res: Dict[str, Any], out) -> None:
    con = console(file=out)
    t = res["timeline"]
    pr = res["profile"]
    head = (f"advise: {res['input']}: {t['kernels']} kernels over {fmt_us(t['span_us'])}, GPU busy "
            f"{t['busy_pct']}% (kernels {fmt_us(t['kernel_us'])}), median gap {fmt_us(t['median_gap_us'])}")
    if pr.get("taken"):
        head += f"; timeline replayed at --pace {pr['taken']['pace']}"
    out.write(head + "\n")
    rows: List[List[Any]] = []
    for f in res["findings"]:
        rows.append([f["rank"], fmt_us(f["at_stake_us"]), f"{f['share_of_span_pct']}%"
                     if f.get("share_of_span_pct") is not None else "-", f["title"], f["basis"]])
    if rows:
        print_table(con, ["#", ("at stake", "right"), ("of span", "right"), "finding", "basis"], rows)
    else:
        out.write("no findings: nothing launch-bound, no long gaps, no heavy or library-shaped kernel\n")
    for f in res["findings"]:
        out.write(f"{f['rank']}. {f['title']}\n   evidence: {evidence_line(f)}\n")
        if f.get("what_if"):
            out.write(f"   what-if: {whatif_line(f['what_if'])}\n")
        out.write(f"   advice: {f['advice']}\n")
    w = res["what_ifs"]
    if not w["run"]:
        out.write(f"what-ifs not measured: {w['why_not']}\n")
    for w2 in w["other"]:
        if not w2.get("measured"):
            out.write(f"what-if {w2['what']}: not measured: {w2.get('why')}\n")
    for n in res.get("notes") or []:
        out.write(f"note: {n}\n")
    if res["findings_total"] > len(res["findings"]):
        out.write(f"({res['findings_total'] - len(res['findings'])} more findings: --top)\n")


def write_html(res: Dict[str, Any], path: str) -> None:
    import plotly.graph_objects as go
    from cudasnap.compare.html import Page, e, table

    page = Page(f"cudasnap advise: {res['input']}")
    t = res["timeline"]
    page.add(f"<p>{t['kernels']} kernels over {e(fmt_us(t['span_us']))}; GPU busy {e(t['busy_pct'])}%; "
             f"median gap between kernels {e(fmt_us(t['median_gap_us']))}. Snapshot: <code>{e(res['snapshot'])}</code></p>")
    fs = res["findings"]
    if fs:
        fig = go.Figure(go.Bar(x=[f["at_stake_us"] / 1e3 for f in fs][::-1],
                               y=[f"{f['rank']}. {f['title'][:70]}" for f in fs][::-1], orientation="h",
                               marker_color=["#2ca02c" if (f.get("what_if") or {}).get("measured") else "#1f77b4"
                                             for f in fs][::-1],
                               hovertext=[f["basis"] for f in fs][::-1]))
        fig.update_layout(title="time at stake (ms); green: measured by a replay", height=120 + 32 * len(fs),
                          margin=dict(l=420, r=20, t=40, b=40))
        page.figure(fig)
    rows = [[f["rank"], e(f["title"]), fmt_us(f["at_stake_us"]), e(f["basis"]), e(evidence_line(f)),
             e(whatif_line(f.get("what_if"))), e(f["advice"])] for f in fs]
    page.add("<h2>Findings</h2>" + table(["#", "finding", "at stake", "basis", "evidence", "what-if", "advice"],
                                         rows, left=7, raw_cols=(1, 3, 4, 5, 6)))
    w = res["what_ifs"]
    if not w["run"]:
        page.add(f"<div class='banner warn'>What-ifs not measured: {e(w['why_not'])}</div>")
    page.add("<h2>Result</h2><details><summary>the JSON advise --out writes</summary><pre>"
             + e(json.dumps(res, indent=1, default=str)) + "</pre></details>")
    page.write(path)
