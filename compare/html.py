"""Self-contained HTML reports (plotly.js embedded): per-kernel ratio bars with noise bands,
the top regressions, both environments and the commands that reproduce each run."""
from __future__ import annotations

import html
import shlex
from typing import Any, Dict, List, Optional

from .core import FASTER, SAME, SLOWER
from .render import describe, pct, ratio, us

COLORS = {SLOWER: "#d62728", FASTER: "#2ca02c", SAME: "#1f77b4", "-": "#999999"}

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:22px} h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:right;vertical-align:top}
td.l,th.l{text-align:left} th{background:#f4f4f4}
.SLOWER{color:#d62728;font-weight:bold} .FASTER{color:#2ca02c;font-weight:bold} .SAME{color:#1f77b4}
.banner{padding:10px 14px;border-radius:6px;margin:10px 0;font-size:15px}
.bad{background:#fde2e2} .good{background:#e2f5e2} .warn{background:#fff4d6}
pre{background:#f6f8fa;padding:8px 10px;overflow-x:auto;font-size:12px;white-space:pre-wrap;word-break:break-all}
code{font-size:12px}
"""


def need_plotly() -> Optional[str]:
    """None when plotly is importable, else the one-line reason."""
    try:
        import plotly  # noqa: F401  (present?)
        return None
    except Exception:
        return "the HTML report needs plotly: pip install 'cudasnap[report]' (or pip install plotly)"


def e(v: Any) -> str:
    return html.escape("" if v is None else str(v))


def table(cols: List[str], rows: List[List[Any]], left: int = 1, raw_cols=()) -> str:
    head = "".join(f"<th class='{'l' if i < left else ''}'>{e(c)}</th>" for i, c in enumerate(cols))
    body = []
    for r in rows:
        cells = []
        for i, v in enumerate(r):
            cls = "l" if i < left else ""
            if isinstance(v, str) and v in (SLOWER, FASTER, SAME):
                cls += f" {v}"
            cells.append(f"<td class='{cls}'>{v if i in raw_cols else e(v)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


class Page:
    def __init__(self, title: str):
        self.title = title
        self.parts: List[str] = []
        self._js = False

    def add(self, s: str) -> None:
        self.parts.append(s)

    def figure(self, fig) -> None:
        self.parts.append(fig.to_html(full_html=False, include_plotlyjs=not self._js,
                                      config={"displaylogo": False}))
        self._js = True

    def write(self, path) -> None:
        doc = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{e(self.title)}</title>"
               f"<style>{CSS}</style></head><body><h1>{e(self.title)}</h1>{''.join(self.parts)}</body></html>")
        from cudasnap.formats.outputs import write_atomic
        write_atomic(path, doc)


def ratio_figure(res: Dict[str, Any], title: str, limit: int = 60):
    """Bars: each kernel's difference in percent; error bars: the combined noise; dashed
    lines: the threshold."""
    import plotly.graph_objects as go
    ks = [k for k in res["kernels"] if k.get("ratio") is not None][:limit]
    names = [k["name"] if len(k["name"]) <= 50 else k["name"][:47] + "..." for k in ks]
    fig = go.Figure(go.Bar(
        x=names, y=[k["diff_pct"] for k in ks],
        marker_color=[COLORS.get(k["verdict"], "#999") for k in ks],
        error_y={"type": "data", "array": [k.get("noise_pct") or 0 for k in ks], "visible": True,
                 "color": "#444", "thickness": 1.2},
        customdata=[[k["name"], k["verdict"], k["ratio"], k.get("noise_pct") or 0, us(k.get("base_us")),
                     us(k.get("candidate_us"))] for k in ks],
        hovertemplate="%{customdata[0]}<br>%{customdata[1]}: %{customdata[2]:.3f}x (%{y:+.1f}%)"
                      "<br>noise +-%{customdata[3]:.1f}%<br>%{customdata[4]} -> %{customdata[5]}<extra></extra>"))
    th = res["threshold_pct"]
    for y in (th, -th):
        fig.add_hline(y=y, line_dash="dash", line_color="#888", annotation_text=f"{y:+g}%",
                      annotation_position="right")
    fig.update_layout(title=title, yaxis_title="candidate vs base (%)", height=460, bargap=0.25,
                      margin={"l": 60, "r": 40, "t": 50, "b": 140}, plot_bgcolor="white")
    fig.update_yaxes(gridcolor="#eee", zerolinecolor="#444")
    return fig


def kernels_table(res: Dict[str, Any], only=None, limit: int = 200) -> str:
    cols = ["kernel", "launches", "base median", "cand median", "base total", "cand total", "spread b/c",
            "noise b/c", "ratio", "diff", "noise band", "verdict", "why"]
    rows = []
    for k in res["kernels"]:
        if only and k["verdict"] not in only:
            continue
        lb, lc = k.get("launches_base", 0), k.get("launches_candidate", 0)
        rows.append([k["name"], lb if lb == lc else f"{lb}/{lc}", us(k.get("base_median_us")),
                     us(k.get("candidate_median_us")), us(k.get("base_us")), us(k.get("candidate_us")),
                     f"{pct(k.get('base_spread_pct'))} / {pct(k.get('candidate_spread_pct'))}",
                     f"{pct(k.get('base_noise_pct'))} / {pct(k.get('candidate_noise_pct'))}",
                     ratio(k.get("ratio")), pct(k.get("diff_pct"), True),
                     "-" if k.get("noise_pct") is None else f"+-{k['noise_pct']:.1f}%", k["verdict"], k["why"]])
        if len(rows) >= limit:
            break
    if not rows:
        return "<p>none</p>"
    return table(cols, rows)


def env_block(title: str, f: Dict[str, Any]) -> str:
    rows = [["profile", f.get("path")], ["measured", describe(f)], ["snapshot", f.get("snapshot")],
            ["snapshot id", f.get("snapshot_id")], ["GPU", f"{f.get('gpu')} (cc {f.get('cc')}, {f.get('gpu_uuid')})"],
            ["CUDA (driver API)", f.get("cuda_version")], ["NVIDIA driver", f.get("nvidia_driver")],
            ["libcuda", f.get("libcuda")], ["host", f.get("host")], ["time", f.get("time")],
            ["profile settings", ", ".join(f"{k}={v}" for k, v in (f.get("profile") or {}).items() if v is not None)],
            ["replaced", "; ".join(f.get("replace") or []) or "-"],
            ["tools", ", ".join(f"{k} {v}" for k, v in (f.get("tools") or {}).items())],
            ["replay exit", f.get("exit_code")]]
    env = f.get("env") or {}
    rows.append(["variables", "<br>".join(e(f"{k}={v}") for k, v in env.items()) or "-"])
    body = "".join(f"<tr><th class='l'>{e(a)}</th><td class='l'>{b if a == 'variables' else e(b)}</td></tr>"
                   for a, b in rows)
    return f"<h3>{e(title)}</h3><table>{body}</table>"


def repro_command(f: Dict[str, Any], vars_only: Optional[Dict[str, str]] = None) -> Optional[str]:
    cmd = f.get("command")
    if not cmd:
        return None
    env = vars_only if vars_only is not None else {k: v for k, v in (f.get("env") or {}).items()
                                                    if not k.startswith("LD_PRELOAD")}
    pre = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in env.items())
    return (pre + " " if pre else "") + cmd


def correlation_section(page: Page, c: Dict[str, Any]) -> None:
    from .correlate import figure
    page.add(f"<h2>Silicon vs simulator (GPGPU-Sim {e(c.get('config'))})</h2><p>simulated time at {e(c['clock'])}; "
             f"{c['n']} kernel(s) both measured and simulated"
             + ("" if c.get("pearson") is None else
                f": Pearson {c['pearson']:.3f}, Spearman {c['spearman']:.3f}, mean error {c['mean_error_pct']:+.1f}%, "
                f"mean absolute error {c['mean_abs_error_pct']:.1f}%") + ".</p>")
    if c["kernels"]:
        page.figure(figure(c))
        page.add(table(["kernel", "launches", "measured", "cycles", "simulated", "error"],
                       [[r["name"], r["launches"], us(r["measured_us"]), f"{r['cycles']:.0f}", us(r["simulated_us"]),
                         pct(r["error_pct"], True)] for r in c["kernels"]]))


def compare_sections(page: Page, res: Dict[str, Any], heading: str = "") -> None:
    t = res["total"]
    if res.get("correlation"):
        correlation_section(page, res["correlation"])
    page.figure(ratio_figure(res, f"{heading}per-kernel difference, candidate vs base (bars: noise band)"))
    page.add("<h2>Top regressions</h2>" + kernels_table(res, only=(SLOWER,), limit=30))
    page.add("<h2>All kernels</h2>" + kernels_table(res))
    moved = [r for r in res.get("launches", []) if r.get("verdict") in (SLOWER, FASTER)]
    if res.get("launches"):
        rows = [[r["name"], r.get("seq"), r.get("index"), us(r.get("base_us")), us(r.get("candidate_us")),
                 f"{pct(r.get('base_noise_pct'))} / {pct(r.get('candidate_noise_pct'))}", ratio(r.get("ratio")),
                 "-" if r.get("noise_pct") is None else f"+-{r['noise_pct']:.1f}%", r["verdict"]]
                for r in sorted(moved, key=lambda r: -abs((r.get("ratio") or 1) - 1))[:200]]
        page.add(f"<h2>Launches that moved ({len(moved)} of {len(res['launches'])} paired launches)</h2>"
                 + (table(["kernel", "call #", "launch #", "base", "candidate", "noise b/c", "ratio", "noise band",
                           "verdict"], rows) if rows else "<p>none</p>"))
    page.add("<h2>Total</h2>" + table(
        ["measure", "base", "candidate", "ratio", "diff", "noise band", "verdict", "why"],
        [[t["what"], us(t.get("base_us")), us(t.get("candidate_us")), ratio(t.get("ratio")),
          pct(t.get("diff_pct"), True), "-" if t.get("noise_pct") is None else f"+-{t['noise_pct']:.1f}%",
          t["verdict"], t["why"]]]))
    if res.get("notes"):
        page.add("<ul>" + "".join(f"<li>{e(n)}</li>" for n in res["notes"]) + "</ul>")


def write_compare_html(res: Dict[str, Any], path, compare_cmd: Optional[str] = None) -> None:
    from .render import summary_line
    page = Page("cudasnap compare")
    cls = "bad" if res["regressed"] else "good"
    page.add(f"<div class='banner {cls}'>{e(summary_line(res))}</div>")
    page.add(f"<p>base <code>{e(res['base'].get('path'))}</code> ({e(describe(res['base']))}) vs candidate "
             f"<code>{e(res['candidate'].get('path'))}</code> ({e(describe(res['candidate']))}); threshold "
             f"{res['threshold_pct']:g}%; a difference within the combined noise of both runs "
             f"(sqrt(noise_b&sup2; + noise_c&sup2;)) is SAME.</p>")
    if res.get("forced"):
        page.add(f"<div class='banner warn'>The runs differ: {e('; '.join(res['differences']))}. "
                 f"Compared anyway (--force).</div>")
    compare_sections(page, res)
    page.add("<h2>Environments</h2>" + env_block("base", res["base"]) + env_block("candidate", res["candidate"]))
    cmds = []
    for who in ("base", "candidate"):
        c = repro_command(res[who])
        cmds.append(f"# {who}\n{c}" if c else f"# {who}: replayed through the Python API (no command recorded)")
    if compare_cmd:
        cmds.append(f"# compare\n{compare_cmd}")
    page.add("<h2>Reproduce</h2><pre>" + e("\n\n".join(cmds)) + "</pre>")
    page.write(path)
