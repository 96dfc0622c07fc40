"""Profile results: per-launch and per-kernel rows, the terminal table, JSON and CSV files.

JSON: {"summary": {...}, "kernels": [...], "launches": [...], "warnings": [...], "run": {...}}.
`run` says what was measured where (`cudasnap compare` refuses runs that differ): the
snapshot (path, id, what it was captured on), the GPU replayed on, the driver (CUDA version
it supports, NVIDIA version, libcuda path), tool versions, the profile settings, the replay
command and the CUDA-related environment; `timings_s`, where the replay's wall time went
(profile/__init__.py phase_timings).
CSV: one row per launch (row_type=launch) then one per kernel name (row_type=kernel).
`name` is the kernel's recorded (mangled) name, `demangled` its C++ name (replay/names.py)."""
from __future__ import annotations

import csv
import json
import statistics
from typing import Any, Dict, List, Optional

from ..names import demangle, short_name

KERNEL_COLS = ["name", "demangled", "launches", "total_us", "median_us", "min_us", "max_us", "mean_us", "share_pct",
               "spread_pct", "max_spread_pct", "iqr_pct", "noise_pct"]
LAUNCH_COLS = ["seq", "index", "name", "demangled", "stream", "grid", "block", "shmem", "time_us", "start_ns", "end_ns",
               "median_us", "min_us", "max_us", "mean_us", "spread_pct", "iqr_pct", "noise_pct", "saved_bytes",
               "repeats_identical", "node", "unit", "timing", "error"]


_NUMBER_COLS = {"launches", "total_us", "median_us", "min_us", "max_us", "mean_us", "share_pct", "spread_pct",
                "max_spread_pct", "iqr_pct", "noise_pct", "seq", "index", "stream", "shmem", "time_us", "start_ns",
                "end_ns", "saved_bytes", "node"}
_MAP_KEYS = {"run": ("gpu", "env", "tools", "profile", "timings_s"), "summary": ()}


class ProfileFileError(ValueError):
    """A profile file that cannot be read as one: the message is one line that starts with its path."""


def read_profile_file(path: str) -> Dict[str, Any]:
    """A profile written by `replay --profile ... --out FILE.json`, read and checked (special
    files refused by type, JSON, the shape `shape_problem` asks) for every reader: compare,
    the simulator's coverage. Raises ProfileFileError."""
    from cudasnap.formats.inputs import input_problem
    why = input_problem(path)
    if why:
        raise ProfileFileError(why)
    try:
        with open(path) as f:
            d = json.load(f)
    except FileNotFoundError:
        raise ProfileFileError(f"{path}: no such file")
    except RecursionError:
        raise ProfileFileError(f"{path}: not a profile JSON (nested too deeply)")
    except (OSError, ValueError) as e:
        raise ProfileFileError(f"{path}: not a profile JSON ({type(e).__name__}: {str(e)[:200]})")
    if not isinstance(d, dict) or not isinstance(d.get("summary"), dict) or not isinstance(d.get("launches"), list):
        raise ProfileFileError(f"{path}: not a profile written by `cudasnap replay --profile ... --out FILE.json`")
    why = shape_problem(d)
    if why:
        raise ProfileFileError(f"{path}: not a profile as cudasnap writes it: {why}")
    return d


def shape_problem(report: Any) -> Optional[str]:
    """Why a JSON document is not a profile as `--out` writes it (the first wrong-typed part:
    "launches[3].median_us is a list, not a number"), or None. Readers (compare, advise) check
    it before use, so a damaged or hand-edited file is one line, never a traceback."""
    def kind(v) -> str:
        return {dict: "a map", list: "a list", str: "a string", bool: "a boolean"}.get(type(v), type(v).__name__)

    if not isinstance(report, dict):
        return f"the document is {kind(report)}, not a map"
    for key in ("summary", "run"):
        v = report.get(key)
        if key in report and not isinstance(v, dict):
            return f"{key} is {kind(v)}, not a map"
        for sub in _MAP_KEYS[key]:
            if isinstance(v, dict) and v.get(sub) is not None and not isinstance(v[sub], dict):
                return f"{key}.{sub} is {kind(v[sub])}, not a map"
    for key in ("launches", "kernels", "warnings"):
        if key in report and not isinstance(report[key], list):
            return f"{key} is {kind(report[key])}, not a list"
    for key in ("launches", "kernels"):
        for i, r in enumerate(report.get(key) or []):
            if not isinstance(r, dict):
                return f"{key}[{i}] is {kind(r)}, not a map"
            for col, v in r.items():
                if v is None:
                    continue
                if col in _NUMBER_COLS and (isinstance(v, bool) or not isinstance(v, (int, float))):
                    return f"{key}[{i}].{col} is {kind(v)}, not a number"
                if col in ("name", "demangled") and not isinstance(v, str):
                    return f"{key}[{i}].{col} is {kind(v)}, not a string"
                if col in ("grid", "block") and not (isinstance(v, list) and all(
                        isinstance(x, int) and not isinstance(x, bool) for x in v)):
                    return f"{key}[{i}].{col} is not a list of sizes"
                if col in ("metrics", "occupancy", "roofline") and not isinstance(v, dict):
                    return f"{key}[{i}].{col} is {kind(v)}, not a map"
            lim = (r.get("occupancy") or {}).get("limiter")
            if lim is not None and not (isinstance(lim, list) and all(isinstance(x, str) for x in lim)):
                return f"{key}[{i}].occupancy.limiter is not a list of names"
    return None


def _launch_time(r: Dict[str, Any]):
    """One number per launch: its timeline duration, or the median of its repeats."""
    if "median_us" in r:
        return r["median_us"]
    return r.get("time_us")


def aggregate(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    by: Dict[str, List[Dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r.get("name") or "?", []).append(r)
    out = []
    for name, rs in by.items():
        ts = [t for t in (_launch_time(r) for r in rs) if t is not None]
        k: Dict[str, Any] = {"name": name, "launches": len(rs), "timed": len(ts)}
        if ts:
            k.update(total_us=sum(ts), median_us=statistics.median(ts), min_us=min(ts), max_us=max(ts),
                     mean_us=statistics.fmean(ts))
        sp = [r["spread_pct"] for r in rs if "spread_pct" in r]
        if sp:
            k["spread_pct"] = statistics.median(sp)
            k["max_spread_pct"] = max(sp)
        for key in ("iqr_pct", "noise_pct"):
            vals = [r[key] for r in rs if key in r]
            if vals:
                k[key] = statistics.median(vals)
        out.append(k)
    total = sum(k.get("total_us", 0.0) for k in out)
    for k in out:
        k["share_pct"] = (k.get("total_us", 0.0) / total * 100) if total > 0 else 0.0
    out.sort(key=lambda k: -k.get("total_us", 0.0))
    return out


def build_report(prof, cfg) -> Dict[str, Any]:
    rows = prof.launch_rows()
    for r in rows:
        if isinstance(r.get("name"), str):
            r["demangled"] = demangle(r["name"])
    kernels = aggregate(rows)
    for k in kernels:
        k["demangled"] = demangle(k["name"])
    summary = prof.summary()
    summary.setdefault("kernel_time_us", sum(k.get("total_us", 0.0) for k in kernels))
    return {"summary": summary, "kernels": kernels, "launches": rows}


ENV_PREFIXES = ("CUDA", "CUPTI", "NVIDIA", "LD_LIBRARY_PATH", "LD_PRELOAD")   # "CUDA" covers CUDA_* and CUDASNAP_*


def snapshot_id(header: Dict[str, Any]) -> str:
    """A capture's identity: the xxh3-128 of its header (host, pid, creation time, command
    line, environment), the same for every copy of the file."""
    import xxhash
    return xxhash.xxh3_128_hexdigest(json.dumps(header, sort_keys=True, default=str).encode())


_libcuda: Optional[str] = None


def _libcuda_path() -> Any:
    """The libcuda this process loaded (once loaded, never another: remembered)."""
    global _libcuda
    if _libcuda is not None:
        return _libcuda
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.split(None, 5)[-1].strip()
                if "/libcuda.so" in p:
                    _libcuda = p
                    return p
    except OSError:
        pass
    return None


_static: Optional[tuple] = None


def static_facts() -> tuple:
    """(the kernel module's version, the tools' versions): the same for every replay of this
    process, read once (a kept campaign worker replays hundreds of times)."""
    global _static
    if _static is not None:
        return _static
    import platform
    nvidia = None
    try:
        with open("/proc/driver/nvidia/version") as f:
            first = f.readline()
        import re
        m = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9][0-9.]+)", first)
        nvidia = m.group(1) if m else first.strip()
    except OSError:
        pass
    from importlib.metadata import PackageNotFoundError, version
    tools = {"python": platform.python_version()}
    for pkg in ("cudasnap", "cuda-python", "cuda-bindings", "cupti-python"):
        try:
            tools[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    _static = (nvidia, tools)
    return _static


def run_info(rv, cfg, opts, snapshot) -> Dict[str, Any]:
    """Facts about one profiled replay (see the module doc); fields that cannot be learned
    are None."""
    import os
    import platform
    import time
    from cudasnap.formats.console import invoked_command
    d: Dict[str, Any] = {"snapshot": os.path.abspath(os.fspath(snapshot)), "snapshot_id": None,
                         "captured": None, "gpu": None, "driver_version": None, "cuda_version": None,
                         "nvidia_driver": None, "libcuda": _libcuda_path(), "host": platform.node(),
                         "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    rd = rv.snapshot if rv is not None else None
    try:
        if rd is not None:
            h = rd.header
            d["snapshot_id"] = snapshot_id(rd.raw_header)
            proc = h.get("proc") or {}
            d["captured"] = {"host": h.get("host"), "argv": h.get("argv"), "created": h.get("created"),
                             "gpus": [{k: g.get(k) for k in ("name", "uuid", "cc")} for g in proc.get("gpus") or []],
                             "driver_version": proc.get("driver_version")}
    except Exception:
        pass
    cu = rv.driver if rv is not None else None
    if cu is not None and rv.initialized and rv.device is not None:
        try:
            r = cu.cuDeviceGetName(256, rv.device)
            gpu: Dict[str, Any] = {"index": opts.device if opts is not None else None,
                                   "name": bytes(r[1]).split(b"\0", 1)[0].decode(errors="replace")}
            if rv.device_cc:
                gpu["cc"] = list(rv.device_cc)
            try:
                u = cu.cuDeviceGetUuid(rv.device)
                if int(u[0]) == 0:
                    b = bytes(u[1].bytes)
                    x = b.hex()
                    gpu["uuid"] = f"GPU-{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:32]}"
            except Exception:
                pass
            try:     # the clock simulated cycles are compared at (compare/correlate.py)
                a = cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CLOCK_RATE, rv.device)
                if int(a[0]) == 0 and int(a[1]) > 0:
                    gpu["clock_mhz"] = int(a[1]) / 1000
                    gpu["clock_source"] = "the driver's peak SM clock"
            except Exception:
                pass
            d["gpu"] = gpu
        except Exception:
            pass
        try:
            r = cu.cuDriverGetVersion()
            if int(r[0]) == 0:
                v = int(r[1])
                d["driver_version"] = v
                d["cuda_version"] = f"{v // 1000}.{v % 1000 // 10}"
        except Exception:
            pass
    d["nvidia_driver"], tools = static_facts()
    d["tools"] = dict(tools)
    d["profile"] = {k: getattr(cfg, k, None) for k in ("mode", "repeat", "warmup", "flush_l2", "kernels", "calls",
                                                       "launch", "kernel_name", "kernel_name_base", "launch_skip",
                                                       "launch_count", "backend")}
    if opts is not None:
        from ..replace import effective_specs
        d["replace"] = effective_specs(opts)
    d["command"] = invoked_command()
    d["env"] = {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}
    return d


def write_out(report: Dict[str, Any], path: str) -> None:
    from cudasnap.formats.outputs import atomic_file
    if path.lower().endswith(".csv"):
        cols = ["row_type"] + LAUNCH_COLS + [c for c in KERNEL_COLS if c not in LAUNCH_COLS] + ["launches"]
        cols = list(dict.fromkeys(cols))
        with atomic_file(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
            w.writeheader()
            for r in report["launches"]:
                w.writerow({"row_type": "launch", **{k: (json.dumps(v) if isinstance(v, list) else v)
                                                     for k, v in r.items()}})
            for k in report["kernels"]:
                w.writerow({"row_type": "kernel", **k})
        return
    with atomic_file(path, "w") as f:
        f.write(_json_text(report))


def _json_text(report: Dict[str, Any]) -> str:
    """The report as JSON, long row lists one row a line: json's C encoder serves only compact,
    one-shot dumps, and indenting 20,000 launch rows in Python takes most of a second."""
    parts = []
    enc = json.JSONEncoder(default=str).encode      # one encoder for every row (C, compact)
    for k, v in report.items():
        if isinstance(v, list) and len(v) > 20:
            rows = ",\n  ".join(map(enc, v))
            parts.append(f"{json.dumps(k)}: [\n  {rows}\n ]")
        else:
            parts.append(f"{json.dumps(k)}: " + json.dumps(v, indent=1, default=str).replace("\n", "\n "))
    return "{\n " + ",\n ".join(parts) + "\n}\n"


def fmt_us(v) -> str:
    """A time in microseconds, in the unit that reads best ("-" when unknown)."""
    if v is None:
        return "-"
    if v >= 1e6:
        return f"{v / 1e6:.2f} s"
    if v >= 1e3:
        return f"{v / 1e3:.2f} ms"
    return f"{v:.1f} us"


def render_table(report: Dict[str, Any], out, top: int = 20) -> None:
    s = report["summary"]
    ks = report["kernels"]
    isolated = s.get("mode") == "isolated" or any("spread_pct" in k for k in ks)
    head = f"profile ({s.get('mode')}, {s.get('backend')})"
    if s.get("mode") == "graph" and s.get("path") == "recorded graph launches" and "total_us" in s:
        head += (f": the program's own graphs, {s.get('graph_launches_timed')} cuGraphLaunch call(s) "
                 f"({s.get('launches')} kernels), {fmt_us(s['total_us'])} (medians of {s.get('repeat')})")
    elif s.get("mode") == "graph" and "total_us" in s:
        extra = s.get("copies", 0) + s.get("memsets", 0)
        head += (f": graph of {s.get('launches', s.get('nodes'))} launches"
                 + (f" (+{extra} copies/memsets)" if extra else "")
                 + f", {fmt_us(s['total_us'])} per replay (median of {s.get('repeat')})")
    elif s.get("mode") == "timeline" and ("span_us" in s or s.get("graph_launch_us")):
        parts = []
        if "span_us" in s:
            parts.append(f"{s.get('launches_timed')} launches timed, span {fmt_us(s['span_us'])}, "
                         f"kernels {fmt_us(s['kernel_time_us'])}")
        if s.get("graph_kernels_timed"):
            parts.append(f"{s['graph_kernels_timed']} of them kernels run by {s['graph_launches']} cuGraphLaunch "
                         f"call(s) of the program")
        if s.get("graph_launch_us"):
            t = s["graph_launch_us"]
            parts.append(f"{len(t)} cuGraphLaunch call(s) of the program timed whole, {fmt_us(sum(t))} in all")
        head += ": " + "; ".join(parts)
    elif s.get("mode") == "isolated":
        head += f": {s.get('launches_profiled', 0)} launches"
        if s.get("graph_launches_profiled"):
            head += f" + {s['graph_launches_profiled']} graph launches"
        head += f" x {s.get('repeat')} repeats (+{s.get('warmup')} warmup)"
        if s.get("error"):
            head += f" -- {s['error']}"
    notes = graph_notes(s) if s.get("mode") == "graph" else []
    from cudasnap.formats.console import console, is_tty, print_table
    cols = [("kernel", "left"), ("launches", "right"), ("total", "right"), ("median", "right"),
            ("min", "right"), ("max", "right")]
    if isolated:
        cols += [("spread", "right"), ("noise", "right")]
    cols.append(("share", "right"))
    # demangled and shortened (replay/names.short_name); cut to 80 characters at a terminal,
    # never cut nor wrapped in logs and pipes; JSON and CSV keep the recorded name
    width = 80 if is_tty(out) else None
    rows = []
    for k in ks[:top]:
        name = short_name(k["name"], width)
        row = [name, str(k["launches"]), fmt_us(k.get("total_us")), fmt_us(k.get("median_us")), fmt_us(k.get("min_us")),
               fmt_us(k.get("max_us"))]
        if isolated:
            row.append(f"{k['spread_pct']:.1f}%" if "spread_pct" in k else "-")
            row.append(f"{k['noise_pct']:.1f}%" if "noise_pct" in k else "-")
        row.append(f"{k.get('share_pct', 0):.1f}%")
        rows.append(row)
    con = console(file=out)
    print_table(con, cols, rows, title=head)
    if len(ks) > top:
        con.print(f"({len(ks) - top} more kernels; --out FILE for all)", markup=False)
    for line in notes:
        con.print(line, markup=False)


def graph_notes(s: Dict[str, Any]) -> List[str]:
    """Graph mode (captured sequence): how per-node times were taken, the nodes that are not
    recorded launches, and the check of per-node times against the graph's time."""
    lines = []
    if s.get("path") != "recorded graph launches":
        n, timed = s.get("launches", 0), s.get("launches_timed", 0)
        if not timed:
            if "total_us" in s:
                lines.append("per-node times: none (only the graph's time)")
            return lines
        how = f" ({s['node_mapping']})" if s.get("node_mapping") else ""
        lines.append(f"per-node times: {s.get('per_node_method')}{how}; {timed} of {n} launches timed")
    other = s.get("other_nodes") or []
    if other:
        lines.append("memset/copy nodes: " + ", ".join(
            f"{d['kind']} x{d['nodes']} ({fmt_us(d['us_per_run'])} per run)" for d in other))
    un = s.get("unrecorded") or []
    if un:
        lines.append("not a recorded launch (CUPTI records of no captured operation), per run: " + ", ".join(
            f"{short_name(e['name'], 50)} x{e['per_run']:g} ({fmt_us(e['us_per_run'])})" for e in un[:5])
            + (" ..." if len(un) > 5 else ""))
    c = s.get("check")
    if c and c.get("diff_pct") is not None:
        parts = [f"kernels {fmt_us(c['kernels_us'])}"]
        if c.get("other_nodes_us"):
            parts.append(f"memset/copy nodes {fmt_us(c['other_nodes_us'])}")
        if c.get("unrecorded_us"):
            parts.append(f"not recorded {fmt_us(c['unrecorded_us'])}")
        if c.get("overlap_us"):
            parts[0] += f" (less {fmt_us(c['overlap_us'])} of concurrent nodes)"
        if c.get("between_nodes_us"):
            parts.append(f"between nodes {fmt_us(c['between_nodes_us'])}")
        g = c.get("gap_model")
        if g and c.get("tracing_us"):
            lines.append(f"tracing: {g['tracing_per_node_us'] * 1e3:.0f} ns per node that CUPTI adds to durations and gaps "
                         f"(a chain of {g['nodes']} empty kernels: {fmt_us(g['chain_untraced_us'])} untraced, "
                         f"{fmt_us(g['chain_traced_span_us'])} traced), taken off")
        verdict = "within 5%" if c["within_5pct"] else f"NOT within 5%: gap {fmt_us(abs(c['sum_us'] - c['graph_us']))}"
        less = f" - tracing {fmt_us(c['tracing_us'])}" if c.get("tracing_us") else ""
        line = (f"check: {' + '.join(parts)}{less} = {fmt_us(c['sum_us'])} vs the graph's {fmt_us(c['graph_us'])} "
                f"({c['diff_pct']:+.1f}%, {verdict}); kernels are {c['kernel_share_pct']:.1f}% of the graph's time")
        lines.append(line)
        if not c["within_5pct"] and c.get("event_span_us"):
            lines.append(f"  (per-node runs, with an event record node after every node: "
                         f"{fmt_us(c['event_span_us'])} from first to last event; the graph alone, CUDA events "
                         f"around its launch: {fmt_us(c['graph_us'])})")
        elif not c["within_5pct"]:
            lines.append("  (the CUPTI-traced runs differ from the graph's timed runs: tracing overhead, or time "
                         "around the nodes that no record covers)")
        if not c["within_5pct"] and c.get("bounds_us"):
            lo, hi = c["bounds_us"]
            why = ("the tracing cost per node, calibrated on the empty-kernel chain, does not fit this graph"
                   if c["within_bounds"] else "per-node times miss or double-count work")
            lines.append(f"  the graph's time {'lies' if c['within_bounds'] else 'does NOT lie'} between its nodes "
                         f"with no gap ({fmt_us(lo)}) and with the gaps as traced ({fmt_us(hi)}), within 5%: {why}")
    t = s.get("timeline_check")
    if t:
        if not t["compared"]:
            lines.append(f"check against timeline mode: no kernel of >= {t['min_us']:g} us in both")
        else:
            verdict = (f"all within {t['limit_pct']:g}%" if t["within"] else
                       f"{len(t['outside'])} outside {t['limit_pct']:g}%")
            src = "the same replay" if t.get("reference") else "a second replay"
            lines.append(f"check against timeline mode ({src}, {t.get('timeline_backend')}): "
                         f"{t['compared']} kernels of >= {t['min_us']:g} us, {verdict}")
            for c2 in t["outside"][:10]:
                lines.append(f"  {short_name(c2['name'], 60)}: graph {fmt_us(c2['graph_us'])}, timeline "
                             f"{fmt_us(c2['other_us'])} ({c2['diff_pct']:+.1f}%)")
            if t["outside"]:
                lines.append("  (kernels can run a few percent apart back to back inside a graph and launched one "
                             "by one on a stream; a program's own CUDA graph shows it too: graph mode times the graph)")
    return lines


def kernel_medians(report: Dict[str, Any]) -> Dict[str, float]:
    """Median time per kernel of a report's launch rows (any mode), by CUPTI name where the row
    has one, else by name."""
    by: Dict[str, List[float]] = {}
    for r in report.get("launches", []):
        t = _launch_time(r)
        if t is not None:
            by.setdefault(r.get("cupti_name") or r.get("name") or "?", []).append(t)
    return {k: statistics.median(v) for k, v in by.items()}


def compare_kernel_medians(graph_report: Dict[str, Any], other_report: Dict[str, Any],
                           min_us: float = 5.0) -> List[Dict[str, Any]]:
    """Per-kernel medians of a graph-mode report against another mode's (a timeline run of the
    same snapshot), for kernels whose median is at least min_us in both; kernels are matched by
    their CUPTI name where both rows have one, else by name."""
    g, o = kernel_medians(graph_report), kernel_medians(other_report)
    out = []
    for name, gm in g.items():
        om = o.get(name)
        if om is None or gm < min_us or om < min_us:
            continue
        out.append({"name": name, "graph_us": gm, "other_us": om, "diff_pct": (gm - om) / om * 100})
    out.sort(key=lambda d: -abs(d["diff_pct"]))
    return out
