"""Terminal output of a comparison: a top-N table (plain aligned rows when not a terminal)."""
from __future__ import annotations

from typing import Any, Dict, Optional

from cudasnap.replay.profile.report import fmt_us as us

from .core import FASTER, SAME, SLOWER




def pct(v, sign: bool = False) -> str:
    if v is None:
        return "-"
    return f"{v:+.1f}%" if sign else f"{v:.1f}%"


def ratio(v) -> str:
    return "-" if v is None else f"{v:.3f}x"


def describe(f: Dict[str, Any]) -> str:
    """One line: mode, GPU, driver of a run."""
    from cudasnap.replay.profile.modes import names
    parts = [f.get("mode") or "?"]
    if f.get("mode") in names(repeats=True) and f.get("repeat"):
        parts[0] += f" x{f['repeat']}"
    if f.get("gpu"):
        parts.append(f["gpu"])
    drv = []
    if f.get("cuda_version"):
        drv.append(f"CUDA {f['cuda_version']}")
    if f.get("nvidia_driver"):
        drv.append(f"driver {f['nvidia_driver']}")
    if drv:
        parts.append(" ".join(drv))
    return ", ".join(parts)


def verdict_cell(v: str, tty: bool) -> str:
    if not tty:
        return v
    color = {SLOWER: "red", FASTER: "green", SAME: "blue"}.get(v)
    return f"[bold {color}]{v}[/]" if color else v


def kernel_rows(res: Dict[str, Any], top: int, tty: bool, cut: bool = False):
    from rich.markup import escape
    e = escape if tty else (lambda s: s)
    rows = []
    for k in res["kernels"][:top]:
        name = k["name"] or "?"
        if cut and len(name) > 60:
            name = name[:57] + "..."
        lb, lc = k.get("launches_base", 0), k.get("launches_candidate", 0)
        rows.append([e(name), str(lb) if lb == lc else f"{lb}/{lc}", e(us(k.get("base_median_us"))),
                     e(us(k.get("candidate_median_us"))),
                     e(f"{pct(k.get('base_spread_pct'))}/{pct(k.get('candidate_spread_pct'))}"),
                     e(f"{pct(k.get('base_noise_pct'))}/{pct(k.get('candidate_noise_pct'))}"),
                     e(ratio(k.get("ratio"))), e(pct(k.get("diff_pct"), True)),
                     e("-" if k.get("noise_pct") is None else f"+-{k['noise_pct']:.1f}%"),
                     verdict_cell(k["verdict"], tty)])
    return rows


COLUMNS = [("kernel", "left"), ("launches", "right"), ("base median", "right"), ("cand median", "right"),
           ("spread b/c", "right"), ("noise b/c", "right"), ("ratio", "right"), ("diff", "right"),
           ("noise", "right"), ("verdict", "left")]


def render_text(res: Dict[str, Any], out, top: int = 20, title: Optional[str] = None) -> None:
    from cudasnap.formats.console import console, is_tty, print_table
    tty = is_tty(out)
    con = console(file=out)
    b, c = res["base"], res["candidate"]
    w = out.write
    if title is None:
        w(f"compare: base {b.get('path')} ({describe(b)})\n"
          f"    vs candidate {c.get('path')} ({describe(c)})\n")
    else:
        w(title + "\n")
    if res.get("forced"):
        w("WARNING: " + "; ".join(res["differences"]) + " -- compared anyway (--force)\n")
    w(f"threshold {res['threshold_pct']:g}%; a difference within the combined noise of both runs is SAME\n")
    print_table(con, COLUMNS, kernel_rows(res, top, tty, cut=tty), markup=tty)
    if len(res["kernels"]) > top:
        w(f"({len(res['kernels']) - top} more kernels; --json or --html for all)\n")
    t = res["total"]
    w(f"total: {t['what']}: {us(t.get('base_us'))} -> {us(t.get('candidate_us'))} "
      f"({ratio(t.get('ratio'))}, {pct(t.get('diff_pct'), True)}, noise "
      f"{'-' if t.get('noise_pct') is None else '+-%.1f%%' % t['noise_pct']}): {t['verdict']}\n")
    if res.get("correlation"):
        from .correlate import render
        render(res["correlation"], out)
    for n in res.get("notes", []):
        w(f"note: {n}\n")
    w(summary_line(res) + "\n")


def summary_line(res: Dict[str, Any]) -> str:
    slow = [k for k in res["kernels"] if k["verdict"] == SLOWER]
    fast = [k for k in res["kernels"] if k["verdict"] == FASTER]
    parts = []
    if slow:
        parts.append(f"{len(slow)} kernel(s) SLOWER: " + ", ".join(
            f"{k['name']} {k['ratio']:.2f}x" for k in slow[:5]) + (" ..." if len(slow) > 5 else ""))
    if fast:
        parts.append(f"{len(fast)} FASTER")
    if res["total"].get("verdict") == SLOWER:
        parts.append(f"total SLOWER ({res['total']['ratio']:.2f}x)")
    if not parts:
        parts.append("no significant difference")
    if not res["regressed"] and res["exit_code"] == 0 and any("side by side" in n for n in res.get("notes", [])):
        return "SIDE BY SIDE: " + "; ".join(parts).replace("SLOWER", "slower").replace("FASTER", "faster") + " (exit 0)"
    return ("REGRESSION: " if res["regressed"] else "OK: ") + "; ".join(parts) + f" (exit {res['exit_code']})"
