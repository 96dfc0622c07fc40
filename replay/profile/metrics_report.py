"""`--profile metrics` results: the terminal table, --out JSON or CSV, --html (roofline), and
the rows of the CUDASNAP_KERNEL_METRICS table (`cudasnap stats SNAP --out X.sqlite
--kernel-metrics PROFILE.json`).

JSON: the report of every mode ({"summary", "kernels", "launches", "warnings", "run"}) plus
"sections" (each section's metrics, labels and units) and "summary.sm_limits" (the SM's
threads, blocks, registers and shared memory, for occupancy at other block sizes).  A launch row adds "metrics" ({ncu
metric name: value}), "passes", "occupancy" (theoretical_pct, active_blocks_per_sm,
block_limits, limiter, registers_per_thread, smem_per_block) and "roofline"; a kernel row the
medians of its launches' metrics, its occupancy and its roofline (FLOP, bytes and time summed).

CSV: one row per launch (row_type=launch), then one per kernel (row_type=kernel); a column per
metric (its ncu name), then occupancy and roofline columns.

CUDASNAP_KERNEL_METRICS (SQLite, beside the tables nsys names; one row per launch and value):
  correlationId  the launch's call sequence number: joins CUPTI_ACTIVITY_KIND_KERNEL.correlationId
  launchIndex    0-based ordinal among the replayed launches
  kernelName     the recorded (mangled) name
  section        the section the value belongs to (ncu's section identifier), or "raw" for
                 --metrics names
  metricName     the ncu metric name; values cudasnap derives are named cudasnap__* (theoretical
                 occupancy, block limits, roofline figures)
  value          REAL (NULL for a text value)
  textValue      TEXT: the occupancy limiter, the roofline's bound
  unit           as ncu gives it: %, ns, byte, inst, FLOP/s, byte/s, ...
  source         counter (CUPTI range profiler) | derived
  passes         replay passes the launch took"""
from __future__ import annotations

import csv
import json
from typing import Any, Dict, List, Optional, Tuple

from ..names import short_name
from . import metrics_sections as ms
from . import report as base_report
from .report import fmt_us

TABLE = "CUDASNAP_KERNEL_METRICS"
TABLE_COLUMNS = [("correlationId", "INTEGER"), ("launchIndex", "INTEGER"), ("kernelName", "TEXT"), ("section", "TEXT"),
                 ("metricName", "TEXT"), ("value", "REAL"), ("textValue", "TEXT"), ("unit", "TEXT"),
                 ("source", "TEXT"), ("passes", "INTEGER")]
OCC_COLS = ["theoretical_pct", "active_blocks_per_sm", "limiter", "registers_per_thread", "smem_per_block"]
ROOF_COLS = ["flop_total", "dram_bytes", "intensity", "achieved_flops", "achieved_bytes_per_s", "bound", "pct_of_roof"]


def _section_of(metric: str, sections: List[str]) -> str:
    for n in sections:
        if any(m == metric for m, _l, _u in ms.SECTIONS.get(n, [])):
            return n
    return "raw"


# ------------------------------------------------------------------ SQLite rows
def table_rows(report: Dict[str, Any]) -> List[Tuple[Any, ...]]:
    """CUDASNAP_KERNEL_METRICS rows of a metrics report (the module doc names the columns)."""
    sections = list(report.get("summary", {}).get("sections") or [])
    lab = ms.labels()
    out: List[Tuple[Any, ...]] = []
    for r in report.get("launches") or []:
        if "metrics" not in r:
            continue
        base = (r.get("seq"), r.get("index"), r.get("name"))
        passes = r.get("passes")
        for m, v in r["metrics"].items():
            out.append(base + (_section_of(m, sections), m, v, None, lab.get(m, ("", ""))[1] or None, "counter", passes))
        occ = r.get("occupancy") or {}
        if occ and "error" not in occ:
            out.append(base + ("Occupancy", "cudasnap__occupancy_theoretical_pct", occ.get("theoretical_pct"), None,
                               "%", "derived", passes))
            out.append(base + ("Occupancy", "cudasnap__occupancy_active_blocks_per_sm",
                               occ.get("active_blocks_per_sm"), None, "block", "derived", passes))
            for k, v in (occ.get("block_limits") or {}).items():
                out.append(base + ("Occupancy", f"cudasnap__occupancy_limit_{k}", v, None, "block", "derived", passes))
            out.append(base + ("Occupancy", "cudasnap__occupancy_limiter", None, ",".join(occ.get("limiter") or []),
                               None, "derived", passes))
        roof = r.get("roofline") or {}
        if roof and "error" not in roof:
            units = {"flop_total": "FLOP", "intensity": "FLOP/byte", "achieved_flops": "FLOP/s",
                     "achieved_bytes_per_s": "byte/s", "pct_of_roof": "%", "roof_flops": "FLOP/s", "ridge": "FLOP/byte"}
            for k, u in units.items():
                if roof.get(k) is not None:
                    out.append(base + ("SpeedOfLight_RooflineChart", f"cudasnap__roofline_{k}", roof[k], None, u,
                                       "derived", passes))
            for k, v in (roof.get("flop") or {}).items():
                out.append(base + ("SpeedOfLight_RooflineChart", f"cudasnap__roofline_flop_{k}", v, None, "FLOP",
                                   "derived", passes))
            for k, v in (roof.get("peaks") or {}).items():
                if isinstance(v, (int, float)):
                    out.append(base + ("SpeedOfLight_RooflineChart", f"cudasnap__roofline_peak_{k}", v, None,
                                       "byte/s" if k.startswith("dram") else "FLOP/s", "derived", passes))
            if roof.get("bound"):
                out.append(base + ("SpeedOfLight_RooflineChart", "cudasnap__roofline_bound", None, roof["bound"], None,
                                   "derived", passes))
    return out


def sqlite_table(report: Dict[str, Any]) -> Dict[str, Tuple[List[Tuple[str, str]], List[Tuple[Any, ...]]]]:
    """{table name: (column definitions, rows)} for the stats export."""
    return {TABLE: (TABLE_COLUMNS, table_rows(report))}


def load_profile(path: str) -> Dict[str, Any]:
    """A `--profile metrics --out X.json` report; ValueError when it is not one."""
    with open(path) as f:
        rep = json.load(f)
    if not isinstance(rep, dict) or (rep.get("summary") or {}).get("mode") != "metrics":
        raise ValueError(f"{path} is not a metrics profile (cudasnap replay SNAP --profile metrics --out X.json)")
    return rep


# ------------------------------------------------------------------ files
def write_out(report: Dict[str, Any], path: str) -> None:
    from cudasnap.formats.outputs import atomic_file
    if not path.lower().endswith(".csv"):
        base_report.write_out(report, path)          # JSON, as every mode writes it
        return
    metrics = list(report.get("summary", {}).get("metrics") or [])
    for r in report.get("launches") or []:
        metrics += [m for m in (r.get("metrics") or {}) if m not in metrics]
    cols = (["row_type", "seq", "index", "name", "demangled", "launches", "grid", "block", "shmem", "passes", "time_us",
             "total_us", "error"] + metrics + [f"occupancy.{c}" for c in OCC_COLS] + [f"roofline.{c}" for c in ROOF_COLS])

    def flat(kind: str, r: Dict[str, Any]) -> Dict[str, Any]:
        d: Dict[str, Any] = {"row_type": kind}
        for c in cols:
            if c in r and not isinstance(r[c], dict):
                d[c] = json.dumps(r[c]) if isinstance(r[c], list) else r[c]
        d.update(r.get("metrics") or {})
        occ = r.get("occupancy") or {}
        for c in OCC_COLS:
            v = occ.get(c)
            d[f"occupancy.{c}"] = ",".join(v) if isinstance(v, list) else v
        roof = r.get("roofline") or {}
        for c in ROOF_COLS:
            d[f"roofline.{c}"] = roof.get(c)
        d["row_type"] = kind
        return d

    with atomic_file(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in report.get("launches") or []:
            w.writerow(flat("launch", r))
        for k in report.get("kernels") or []:
            w.writerow(flat("kernel", k))


# ------------------------------------------------------------------ terminal
def _pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.1f}%"


def _num(v: Optional[float], unit: str = "") -> str:
    if v is None:
        return "-"
    for div, pre in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.2f} {pre}{unit}".rstrip()
    return f"{v:.3g} {unit}".rstrip()


def _bound(roof: Dict[str, Any]) -> str:
    """memory, or compute with the precision that dominates (compute, fp16 tensor)."""
    b = roof.get("bound") or "-"
    return f"{b}, {ms.precision_label(roof['dominant'])}" if b == "compute" and roof.get("dominant") else b


def render_table(report: Dict[str, Any], out, top: int = 20) -> None:
    from cudasnap.formats.console import console, is_tty, print_table
    s = report.get("summary") or {}
    ks = [k for k in report.get("kernels") or [] if k.get("metrics")]
    sections = list(s.get("sections") or [])
    head = (f"profile (metrics, {s.get('backend')}{', ' + s['chip'] if s.get('chip') else ''}): "
            f"{s.get('launches_profiled', 0)} launches, {s.get('passes') or '?'} pass(es) each, "
            f"sections: {', '.join(sections) or '-'}")
    if s.get("error"):
        head += f" -- {s['error']}"
    cols: List[Any] = [("kernel", "left"), ("launches", "right"), ("duration", "right")]
    get: List[Any] = [lambda k: fmt_us((k["metrics"].get("gpu__time_duration.sum") or 0) / 1e3
                                       if "gpu__time_duration.sum" in k["metrics"] else None)]
    if "SpeedOfLight" in sections:
        for label, m in ms.SOL_COLUMNS:
            cols.append((label, "right"))
            get.append(lambda k, m=m: _pct(k["metrics"].get(m)))
    if "Occupancy" in sections:
        cols += [("occ achieved", "right"), ("occ theor.", "right"), ("limiter", "left")]
        get.append(lambda k: _pct(k["metrics"].get(ms.WARPS_PCT)))
        get.append(lambda k: _pct((k.get("occupancy") or {}).get("theoretical_pct")))
        get.append(lambda k: ",".join((k.get("occupancy") or {}).get("limiter") or []) or "-")
    if "MemoryWorkloadAnalysis" in sections:
        cols += [("L1 hit", "right"), ("L2 hit", "right"), ("DRAM rd", "right"), ("DRAM wr", "right")]
        get.append(lambda k: _pct(k["metrics"].get("l1tex__t_sector_hit_rate.pct")))
        get.append(lambda k: _pct(k["metrics"].get("lts__t_sector_hit_rate.pct")))
        get.append(lambda k: _num(k["metrics"].get("dram__bytes_read.sum"), "B"))
        get.append(lambda k: _num(k["metrics"].get("dram__bytes_write.sum"), "B"))
    if "SpeedOfLight_RooflineChart" in sections:
        cols += [("FLOP", "right"), ("FLOP/B", "right"), ("bound", "left"), ("of roof", "right")]
        get.append(lambda k: _num((k.get("roofline") or {}).get("flop_total")))
        get.append(lambda k: _num((k.get("roofline") or {}).get("intensity")))
        get.append(lambda k: _bound(k.get("roofline") or {}))
        get.append(lambda k: _pct((k.get("roofline") or {}).get("pct_of_roof")))
    known = {m for rows in ms.SECTIONS.values() for m, _l, _u in rows}
    raw = [m for m in s.get("metrics") or [] if m not in known]
    for m in raw:
        cols.append((m, "right"))
        get.append(lambda k, m=m: _num(k["metrics"].get(m)))
    width = 60 if is_tty(out) else None
    rows = [[short_name(k["name"], width), str(k["launches"])] + [g(k) for g in get] for k in ks[:top]]
    con = console(file=out)
    print_table(con, cols, rows, title=head)
    if len(ks) > top:
        con.print(f"({len(ks) - top} more kernels; --out FILE for all)", markup=False)
    if s.get("collected_as"):
        con.print("collected as: " + ", ".join(f"{a} -> {b}" for a, b in s["collected_as"].items()), markup=False)
    if s.get("not_collected"):
        con.print("not collected (unknown to this chip's CUPTI): " + ", ".join(s["not_collected"]), markup=False)
    if s.get("captured_launches"):
        con.print(f"not profiled: {s['captured_launches']} launch(es) recorded into a stream capture (graph nodes, "
                  f"run by the program's graph launches; --profile isolated or timeline times them)", markup=False)
    if s.get("collective_launches"):
        con.print(f"not profiled: {s['collective_launches']} collective launch(es) (they wait for their peers)",
                  markup=False)
