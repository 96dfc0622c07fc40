"""Which kernels of a snapshot can run on the simulator, and why the others cannot
(`cudasnap info SNAP --sim [--timeline P.json]`). Read from the snapshot alone, by the checks
`replay --sim` makes before it simulates anything (plan, pointer_findings, gap_calls): no
simulator build is needed. A GPU timeline of the same snapshot adds each kernel's share of
GPU time. The fields are described in replay/sim/COVERAGE.md."""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, List, Optional, Tuple


class CoverageProblem(Exception):
    """A one-line reason coverage cannot be given (exit 2)."""


def load_timeline(path: str, sid: Optional[str]) -> Dict[str, Any]:
    """A GPU profile of this snapshot written by `replay --profile timeline --out P.json`
    (isolated and graph profiles time launches too)."""
    from cudasnap.replay.profile.report import ProfileFileError, read_profile_file
    try:
        d = read_profile_file(path)
    except ProfileFileError as e:
        raise CoverageProblem(f"--timeline {e}")
    run = d.get("run") if isinstance(d.get("run"), dict) else {}
    if run.get("simulated") or d["summary"].get("simulated"):
        raise CoverageProblem(f"--timeline {path}: a simulated profile; give the GPU's timeline of this snapshot")
    if not _times(d):
        raise CoverageProblem(f"--timeline {path}: no launch of it has a time (a profile that was not taken)")
    other = run.get("snapshot_id")
    if sid and isinstance(other, str) and other != sid:
        raise CoverageProblem(f"--timeline {path}: a profile of another snapshot ({run.get('snapshot') or '?'}, "
                              f"id {other[:12]}; this one is {sid[:12]})")
    return d


def _times(prof: Dict[str, Any]) -> Dict[str, Tuple[float, int]]:
    """Kernel -> (GPU time in us, launches timed)."""
    out: Dict[str, Tuple[float, int]] = {}
    for r in prof.get("launches") or []:
        t = r.get("median_us", r.get("time_us"))
        if isinstance(r.get("name"), str) and isinstance(t, (int, float)) and not isinstance(t, bool):
            us, n = out.get(r["name"], (0.0, 0))
            out[r["name"]] = (us + float(t), n + 1)
    return out


def _params(reader, rec) -> bytes:
    p = (rec.get("x") or {}).get("params")
    if isinstance(p, (bytes, bytearray)):
        return bytes(p)
    if isinstance(p, dict) and isinstance(p.get("blob"), str) and reader.has_blob(p["blob"]):
        return reader.blob(p["blob"])
    return b""


def coverage(reader, timeline: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Per kernel: runnable on the simulator or not with the reasons, launches, PTX source and,
    with a timeline, GPU time and share; the gaps no single kernel owns; the summary."""
    import struct
    from cudasnap.formats.vocab import is_launch
    from cudasnap.replay.names import demangle
    from cudasnap.replay.options import ReplayOptions
    from . import gap_calls, gap_line, kernel_names, kernel_problems, plan, pointer_findings
    names = kernel_names(reader)
    p = plan(reader, ReplayOptions(), [])
    handles: Dict[Any, str] = {h: n for h, n in names.items() if isinstance(h, int) and h}
    kernels: Dict[str, Dict[str, Any]] = {}
    reach: Dict[str, List[int]] = {}            # kernel -> 8-byte words of its parameters
    for rec in reader.records(("c",)):
        f = rec.get("f") or ""
        if not is_launch(f) or rec.get("r", 0) != 0 or "r" not in rec:
            continue
        h = (rec.get("a") or {}).get("f")
        name = names.get(h) or (f"<unnamed function {h:#x}>" if isinstance(h, int) else "<unnamed function>")
        k = kernels.setdefault(name, {"name": name, "launches": 0, "first": rec.get("s")})
        k["launches"] += 1
        raw = _params(reader, rec)
        if raw and len(reach.setdefault(name, [])) < 4096:
            reach[name] += [w for (w,) in struct.iter_unpack("<Q", raw[:len(raw) // 8 * 8])]
    times = _times(timeline) if timeline else {}
    for name in times:
        kernels.setdefault(name, {"name": name, "launches": 0, "first": None})    # a graph node's kernel
    for name, k in kernels.items():
        why, warn = kernel_problems(p, name, k["first"] if k["first"] is not None else "?")
        k.update(demangled=demangle(name) if not name.startswith("<") else name, ptx=p.source.get(name),
                 image=p.image.get(name),
                 reasons=[{"reason": s, "detail": d} for s, d in why],
                 warnings=[{"warning": s, "detail": d} for s, d in warn])
    gaps: List[str] = []                        # what no single kernel owns
    for f, recs in gap_calls(reader).items():
        by: Dict[str, List[Dict[str, Any]]] = {}
        rest = []
        for rec in recs:
            mine = {handles[v] for v in (rec.get("a") or {}).values() if isinstance(v, int) and v in handles}
            for n in mine:
                by.setdefault(n, []).append(rec)
            if not mine:
                rest.append(rec)
        for n, rs in by.items():
            if n in kernels:
                kernels[n]["reasons"].append({"reason": f"call gap: {f}", "detail": gap_line(f, rs)})
        if rest:
            gaps.append(gap_line(f, rest))
    gaps += p.global_gaps
    for line, buf in pointer_findings(reader):
        hit = [n for n, ws in reach.items() if buf and any(buf[0] <= w < buf[0] + buf[1] for w in ws)]
        for n in hit:
            kernels[n]["reasons"].append({"reason": "pointer problem", "detail": line})
        if not hit:
            gaps.append(line)
    total = sum(t for t, _n in times.values())
    rows = sorted(kernels.values(), key=lambda k: (-times.get(k["name"], (0.0, 0))[0], k["first"] or 0))
    for k in rows:
        k["runnable"] = not k["reasons"]
        if timeline:
            t, n = times.get(k["name"], (0.0, 0))
            k.update(time_us=t, timed=n, share_pct=t / total * 100 if total > 0 else None)
    na: Dict[str, int] = {}
    for k in rows:
        for r in {r["reason"] for r in k["reasons"]}:
            na[r] = na.get(r, 0) + 1
    run = [k for k in rows if k["runnable"]]
    summary = {"kernels": len(rows), "runnable": len(run), "launches": sum(k["launches"] for k in rows),
               "runnable_launches": sum(k["launches"] for k in run),
               "na": dict(sorted(na.items(), key=lambda kv: -kv[1])), "snapshot_gaps": len(gaps)}
    if timeline:
        summary.update(gpu_time_us=total, runnable_time_us=sum(k["time_us"] for k in run),
                       runnable_time_pct=sum(k["time_us"] for k in run) / total * 100 if total > 0 else None)
    return {"snapshot": reader.path, "summary": summary, "kernels": rows, "snapshot_gaps": gaps}


def summary_line(doc: Dict[str, Any]) -> str:
    """'K of N kernels (X% of GPU time) can run on the simulator; n/a: reason counts'."""
    s = doc["summary"]
    pct = s.get("runnable_time_pct")
    t = f" ({pct:.1f}% of GPU time)" if pct is not None else ""
    na = "; n/a: " + ", ".join(f"{n} {r}" for r, n in s["na"].items()) if s["na"] else ""
    return f"{s['runnable']} of {s['kernels']} kernels{t} can run on the simulator{na}"


def run_coverage_cli(snapshot, timeline_path: Optional[str], json_out: bool) -> int:
    """`cudasnap info SNAP --sim [--timeline P.json]`: 0, or 2 with one line."""
    from cudasnap.formats import SnapshotError, SnapshotReader
    from cudasnap.replay.profile.report import snapshot_id

    def fail(msg: str) -> int:
        sys.stderr.write(f"cudasnap: error: {' '.join(str(msg).split())}\n")
        return 2
    try:
        with SnapshotReader(os.fspath(snapshot)) as reader:
            prof = load_timeline(timeline_path, snapshot_id(reader.raw_header)) if timeline_path else None
            doc = coverage(reader, prof)
    except (SnapshotError, CoverageProblem) as e:
        return fail(str(e))
    if timeline_path:
        doc["timeline"] = os.path.abspath(timeline_path)
    doc["summary"]["line"] = summary_line(doc)
    if json_out:
        print(json.dumps(doc))
        return 0
    _print(doc, timeline_path is not None)
    return 0


def _short(s: str, n: int = 70) -> str:
    return s if len(s) <= n else s[:n - 3] + "..."


def _print(doc: Dict[str, Any], timed: bool) -> None:
    from cudasnap.formats.console import console, print_table
    con = console()
    rows = []
    for k in doc["kernels"]:
        warned = " (warned: " + ", ".join(w["warning"] for w in k["warnings"]) + ")" if k["warnings"] else ""
        verdict = "runnable" + warned if k["runnable"] else "n/a: " + "; ".join(r["reason"] for r in k["reasons"])
        share = k.get("share_pct")
        rows.append((_short(k["demangled"] or k["name"]), k["launches"],
                     *((f"{k['time_us']:.1f}", f"{share:.1f}%" if share is not None else "-") if timed else ()),
                     k["ptx"] or "none", verdict))
    cols = ["kernel", ("launches", "right")] + ([("GPU us", "right"), ("share", "right")] if timed else []) + \
        ["PTX", "simulator"]
    print_table(con, cols, rows, title="Simulator coverage, per kernel")
    why = [(k["name"], r["detail"]) for k in doc["kernels"] for r in k["reasons"]]
    if why:
        con.file.write("why not:\n" + "".join(f"  - {d}\n" for _n, d in why))
    if doc["snapshot_gaps"]:
        con.file.write(f"a replay of the whole snapshot also meets {len(doc['snapshot_gaps'])} gap(s) no kernel's "
                       f"launch names (an extract of a kernel, `extract --kernel RX#K`, keeps only the calls its "
                       f"work needs):\n" + "".join(f"  - {g}\n" for g in doc["snapshot_gaps"]))
    con.file.write(doc["summary"]["line"] + "\n")
