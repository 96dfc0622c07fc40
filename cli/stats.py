"""`cudasnap stats SNAPSHOT`: summaries of a snapshot's recorded calls, as `nsys stats`
gives them for a report, and an export of the calls as the tables nsys exports.

Reports (host side: each call record's enter/exit timestamps, CLOCK_MONOTONIC ns):
  api      per driver entry point: share of API time, total, calls, avg/med/min/max/stddev
  kernels  per kernel: launches, the launch calls' time, distinct grid/block shapes
  memory   per kind of copy (H2D, D2H, D2D, P2P, unified) and memset: calls, bytes

Export (--out FILE.sqlite, or --out DIR/ for one CSV per table), tables named as nsys names
them: CUPTI_ACTIVITY_KIND_RUNTIME (every recorded call), CUPTI_ACTIVITY_KIND_KERNEL
(launches), CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET, StringIds,
ENUM_CUDA_MEMCPY_OPER, ENUM_CUDA_MEM_KIND, and CUDASNAP_META (what the rows are). Their
start/end are the host timestamps of the call that launched the kernel or issued the copy:
device times come from a replay (`cudasnap replay --profile timeline --out`). correlationId
is the call's sequence number, so a kernel or copy row joins its RUNTIME row as in nsys.
Columns a snapshot cannot know (registers, static shared memory, device-side ids) are NULL.
With --kernel-metrics PROFILE.json (a `replay --profile metrics --out` of the snapshot), the
export adds CUDASNAP_KERNEL_METRICS: one row per launch and metric, correlationId the launch's
(columns documented in replay/profile/metrics_report.py).
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import sqlite3
import statistics
import struct
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from cudasnap.formats import SnapshotError, SnapshotReader
from cudasnap.formats import callset as cs
from cudasnap.formats.abi import base_name
from cudasnap.formats.outputs import OutputError, atomic_file, atomic_path, check_output

REPORTS = ("api", "kernels", "memory")
TABLES = ("StringIds", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
          "CUPTI_ACTIVITY_KIND_MEMSET", "ENUM_CUDA_MEMCPY_OPER", "ENUM_CUDA_MEM_KIND", "CUDASNAP_META")
DEVICE_TIMES = "device times: `cudasnap replay SNAPSHOT --profile timeline --out FILE.csv`"

# CUpti_ActivityMemcpyKind / CUpti_ActivityMemoryKind, as nsys's ENUM tables list them
MEMCPY_KINDS = [(0, "CUDA_MEMCPY_KIND_UNKNOWN", "Unknown"), (1, "CUDA_MEMCPY_KIND_HTOD", "Host-to-Device"),
                (2, "CUDA_MEMCPY_KIND_DTOH", "Device-to-Host"), (3, "CUDA_MEMCPY_KIND_HTOA", "Host-to-Array"),
                (4, "CUDA_MEMCPY_KIND_ATOH", "Array-to-Host"), (5, "CUDA_MEMCPY_KIND_ATOA", "Array-to-Array"),
                (6, "CUDA_MEMCPY_KIND_ATOD", "Array-to-Device"), (7, "CUDA_MEMCPY_KIND_DTOA", "Device-to-Array"),
                (8, "CUDA_MEMCPY_KIND_DTOD", "Device-to-Device"), (9, "CUDA_MEMCPY_KIND_HTOH", "Host-to-Host"),
                (10, "CUDA_MEMCPY_KIND_PTOP", "Peer-to-Peer")]
MEM_KINDS = [(0, "CUDA_MEMOPR_MEMORY_KIND_UNKNOWN", "Unknown"), (1, "CUDA_MEMOPR_MEMORY_KIND_PAGEABLE", "Pageable"),
             (2, "CUDA_MEMOPR_MEMORY_KIND_PINNED", "Pinned"), (3, "CUDA_MEMOPR_MEMORY_KIND_DEVICE", "Device"),
             (4, "CUDA_MEMOPR_MEMORY_KIND_ARRAY", "Array"), (5, "CUDA_MEMOPR_MEMORY_KIND_MANAGED", "Managed"),
             (6, "CUDA_MEMOPR_MEMORY_KIND_DEVICE_STATIC", "Device Static"),
             (7, "CUDA_MEMOPR_MEMORY_KIND_MANAGED_STATIC", "Managed Static")]
_TAG_KIND = (("HtoD", 1), ("DtoH", 2), ("HtoA", 3), ("AtoH", 4), ("AtoA", 5), ("AtoD", 6), ("DtoA", 7),
             ("DtoD", 8), ("Peer", 10))
_TYPE_PAIR_KIND = {("H", "D"): 1, ("D", "H"): 2, ("H", "A"): 3, ("A", "H"): 4, ("A", "A"): 5, ("A", "D"): 6,
                   ("D", "A"): 7, ("D", "D"): 8, ("H", "H"): 9}
_MEMTYPE = {1: "H", 2: "D", 3: "A", 4: "U"}
_SIDE_KIND = {"H": 0, "D": 3, "A": 4, "U": 5}          # host memory: pageable or pinned is not known
_DIRECTION = {0: "unified", 1: "H2D", 2: "D2H", 3: "H2D", 4: "D2H", 5: "D2D", 6: "D2D", 7: "D2D", 8: "D2D",
              9: "H2H", 10: "P2P"}
_SIDES = {1: ("H", "D"), 2: ("D", "H"), 3: ("H", "A"), 4: ("A", "H"), 5: ("A", "A"), 6: ("A", "D"), 7: ("D", "A"),
          8: ("D", "D"), 9: ("H", "H"), 10: ("D", "D")}


def _int(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _uint(v: Any) -> Optional[int]:
    v = _int(v)
    return v if v is not None and v >= 0 else None


# ============================================================================ collection

@dataclass
class Launch:
    seq: Optional[int]
    t0: Optional[int]
    t1: Optional[int]
    tid: Optional[int]
    api: str
    handle: Any
    name: Optional[str]
    grid: Tuple[Optional[int], Optional[int], Optional[int]]
    block: Tuple[Optional[int], Optional[int], Optional[int]]
    shmem: Optional[int]
    stream: Any


@dataclass
class Copy:
    seq: Optional[int]
    t0: Optional[int]
    t1: Optional[int]
    tid: Optional[int]
    api: str
    kind: int            # CUpti_ActivityMemcpyKind
    nbytes: int
    stream: Any


@dataclass
class Memset:
    seq: Optional[int]
    t0: Optional[int]
    t1: Optional[int]
    tid: Optional[int]
    api: str
    nbytes: int
    value: Optional[int]
    stream: Any


@dataclass
class Calls:
    """Every call record of a snapshot, as the reports and tables need them."""
    path: str
    pid: Optional[int]
    calls: List[Tuple[Optional[int], Optional[int], Optional[int], Optional[int], str, Optional[int]]] = field(default_factory=list)
    counted: Counter = field(default_factory=Counter)        # identical queries counted at capture
    launches: List[Launch] = field(default_factory=list)
    copies: List[Copy] = field(default_factory=list)
    memsets: List[Memset] = field(default_factory=list)
    truncated: bool = False


def _copy_kind(f: str, a: Mapping[str, Any]) -> int:
    b = base_name(f)
    for tag, kind in _TAG_KIND:
        if tag in b:
            return kind
    c = a.get("pCopy") if isinstance(a.get("pCopy"), dict) else None
    if c is not None:
        pair = (_MEMTYPE.get(c.get("srcMemoryType"), "?"), _MEMTYPE.get(c.get("dstMemoryType"), "?"))
        return _TYPE_PAIR_KIND.get(pair, 0)
    return 0


def _launch_shape(f: str, a: Mapping[str, Any]):
    """(grid, block, dynamic shared memory, stream) of a launch record."""
    grid = tuple(_uint(a.get(k)) for k in ("gridDimX", "gridDimY", "gridDimZ"))
    block = tuple(_uint(a.get(k)) for k in ("blockDimX", "blockDimY", "blockDimZ"))
    shmem, stream = _uint(a.get("sharedMemBytes")), a.get("hStream")
    cfg = a.get("config")
    if isinstance(cfg, (bytes, bytearray)) and len(cfg) >= 40:      # CUlaunchConfig, packed
        gx, gy, gz, bx, by, bz, sm = struct.unpack_from("<7I", cfg, 0)
        (st,) = struct.unpack_from("<Q", cfg, 32)
        grid, block, shmem, stream = (gx, gy, gz), (bx, by, bz), sm, st
    elif isinstance(cfg, dict):
        grid = tuple(_uint(cfg.get(k)) for k in ("gridDimX", "gridDimY", "gridDimZ"))
        block = tuple(_uint(cfg.get(k)) for k in ("blockDimX", "blockDimY", "blockDimZ"))
        shmem, stream = _uint(cfg.get("sharedMemBytes")), cfg.get("hStream")
    return grid, block, shmem, stream


def collect(r: SnapshotReader) -> Calls:
    from cudasnap.formats.summary import copy_bytes as _copy_bytes, memset_bytes as _memset_bytes

    hdr = r.header
    out = Calls(path=r.path, pid=_int(hdr.get("pid")))
    fn_names: Dict[Any, str] = {}
    for rec in r.records():
        k = rec.get("k")
        if k == "fn":
            try:
                cs.learn_kernel_name(fn_names, rec)
            except TypeError:
                pass
        elif k == "rep":
            for e in rec.get("calls") if isinstance(rec.get("calls"), list) else []:
                if isinstance(e, dict) and isinstance(e.get("f"), str) and _uint(e.get("n")):
                    out.counted[e["f"]] += e["n"]
        elif k == "c":
            f = rec.get("f") if isinstance(rec.get("f"), str) else "?"
            a = rec.get("a") if isinstance(rec.get("a"), dict) else {}
            seq, tid = _int(rec.get("s")), _int(rec.get("tid"))
            t0, t1 = _uint(rec.get("t0")), _uint(rec.get("t1"))
            if rec.get("r") is None or rec.get("incomplete"):
                t1 = None                          # never returned: no duration
            out.calls.append((seq, t0, t1, tid, f, _int(rec.get("r"))))
            if cs.names_function(f):                       # a lazily loaded function's fn record has no name
                try:
                    cs.learn_kernel_name(fn_names, rec)
                except TypeError:
                    pass
            elif cs.is_launch(f):
                h = cs.launch_function_handle(rec)
                try:
                    name = fn_names.get(h)
                except TypeError:
                    name = None
                grid, block, shmem, stream = _launch_shape(f, a)
                out.launches.append(Launch(seq, t0, t1, tid, f, h, name, grid, block, shmem, stream))
            elif cs.is_memcpy(f):
                out.copies.append(Copy(seq, t0, t1, tid, f, _copy_kind(f, a), _copy_bytes(a), a.get("hStream")))
            elif cs.is_memset(f):
                value = next((_int(a[v]) for v in ("uc", "us", "ui", "value") if v in a), None)
                out.memsets.append(Memset(seq, t0, t1, tid, f, _memset_bytes(f, a), value, a.get("hStream")))
    for ln in out.launches:          # a function's record may follow its first launch
        if ln.name is None:
            try:
                ln.name = fn_names.get(ln.handle)
            except TypeError:
                pass
            if ln.name is None:
                ln.name = f"<function {ln.handle:#x}>" if isinstance(ln.handle, int) else "<unknown function>"
    out.truncated = bool(r.truncated)
    return out


# ============================================================================ reports

def _dist(values: Sequence[int]) -> Dict[str, Any]:
    if not values:
        return {"avg": None, "med": None, "min": None, "max": None, "stddev": None}
    return {"avg": statistics.fmean(values), "med": float(statistics.median(values)), "min": min(values),
            "max": max(values), "stddev": statistics.stdev(values) if len(values) > 1 else 0.0}


def _dur(t0: Optional[int], t1: Optional[int]) -> Optional[int]:
    return t1 - t0 if t0 is not None and t1 is not None and t1 >= t0 else None


def api_report(c: Calls) -> List[Dict[str, Any]]:
    times: Dict[str, List[int]] = defaultdict(list)
    calls: Counter = Counter()
    for _s, t0, t1, _tid, f, _r in c.calls:
        calls[f] += 1
        d = _dur(t0, t1)
        if d is not None:
            times[f].append(d)
    total = sum(sum(v) for v in times.values())
    rows = []
    for f in set(calls) | set(c.counted):
        tt = sum(times[f])
        row = {"time_pct": tt / total * 100 if total else 0.0, "total_ns": tt, "calls": calls[f],
               "counted": c.counted.get(f, 0)}
        row.update({f"{k}_ns": v for k, v in _dist(times[f]).items()})
        row["name"] = f
        rows.append(row)
    rows.sort(key=lambda r: (-r["total_ns"], -r["calls"], r["name"]))
    return rows


def _shape(t: Tuple[Optional[int], ...]) -> str:
    return "x".join("?" if v is None else str(v) for v in t)


def kernel_report(c: Calls) -> List[Dict[str, Any]]:
    by: Dict[str, List[Launch]] = defaultdict(list)
    for ln in c.launches:
        by[ln.name].append(ln)
    rows = []
    for name, lns in by.items():
        d = [x for x in (_dur(ln.t0, ln.t1) for ln in lns) if x is not None]
        shapes = Counter((_shape(ln.grid), _shape(ln.block)) for ln in lns)
        (grid, block), _ = shapes.most_common(1)[0]
        row = {"launches": len(lns), "api_total_ns": sum(d)}
        row.update({f"api_{k}_ns": v for k, v in _dist(d).items()})
        row.update({"shapes": len(shapes), "grid": grid, "block": block, "name": name})
        rows.append(row)
    rows.sort(key=lambda r: (-r["launches"], -r["api_total_ns"], r["name"]))
    return rows


def memory_report(c: Calls) -> List[Dict[str, Any]]:
    groups: Dict[str, List[Tuple[int, Optional[int]]]] = defaultdict(list)
    for cp in c.copies:
        groups[_DIRECTION.get(cp.kind, "unified")].append((cp.nbytes, _dur(cp.t0, cp.t1)))
    for ms in c.memsets:
        groups["memset"].append((ms.nbytes, _dur(ms.t0, ms.t1)))
    order = ["H2D", "D2H", "D2D", "P2P", "H2H", "unified", "memset"]
    rows = []
    for kind in sorted(groups, key=lambda k: order.index(k) if k in order else len(order)):
        sizes = [n for n, _ in groups[kind]]
        d = [x for _, x in groups[kind] if x is not None]
        row = {"kind": kind, "count": len(sizes), "total_bytes": sum(sizes)}
        row.update({f"{k}_bytes": v for k, v in _dist(sizes).items() if k != "stddev"})
        row["api_total_ns"] = sum(d)
        rows.append(row)
    return rows


_COLUMNS = {
    "api": [("Time (%)", "time_pct"), ("Total Time (ns)", "total_ns"), ("Num Calls", "calls"),
            ("Counted", "counted"), ("Avg (ns)", "avg_ns"), ("Med (ns)", "med_ns"), ("Min (ns)", "min_ns"),
            ("Max (ns)", "max_ns"), ("StdDev (ns)", "stddev_ns"), ("Name", "name")],
    "kernels": [("Launches", "launches"), ("Launch API Total (ns)", "api_total_ns"), ("Avg (ns)", "api_avg_ns"),
                ("Med (ns)", "api_med_ns"), ("Min (ns)", "api_min_ns"), ("Max (ns)", "api_max_ns"),
                ("Shapes", "shapes"), ("Grid", "grid"), ("Block", "block"), ("Name", "name")],
    "memory": [("Kind", "kind"), ("Count", "count"), ("Total (bytes)", "total_bytes"), ("Avg (bytes)", "avg_bytes"),
               ("Med (bytes)", "med_bytes"), ("Min (bytes)", "min_bytes"), ("Max (bytes)", "max_bytes"),
               ("API Total (ns)", "api_total_ns")],
}
_TITLES = {"api": "CUDA Driver API Summary (host time of each call)",
           "kernels": "Kernel Launch Summary (launch calls; host time)",
           "memory": "Memory Operations by Kind (copies and memsets; bytes as recorded)"}


def reports(c: Calls, which: Sequence[str] = REPORTS) -> Dict[str, List[Dict[str, Any]]]:
    make = {"api": api_report, "kernels": kernel_report, "memory": memory_report}
    return {k: make[k](c) for k in which}


def _cell(v: Any, text: bool) -> str:
    if v is None:
        return "-" if text else ""
    if isinstance(v, float):
        if text:
            return f"{v:,.1f}"
        return f"{v:.3f}".rstrip("0").rstrip(".") if math.isfinite(v) else str(v)
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}" if text else str(v)
    return str(v)


def _rows(kind: str, rows: List[Dict[str, Any]], text: bool) -> Tuple[List[str], List[List[str]]]:
    cols = _COLUMNS[kind]
    if kind == "api" and not any(r["counted"] for r in rows):
        cols = [c for c in cols if c[1] != "counted"]
    return [h for h, _ in cols], [[_cell(r.get(k), text) for _h, k in cols] for r in rows]


# ============================================================================ export

def tables(c: Calls) -> Dict[str, Tuple[List[str], List[Tuple[Any, ...]]]]:
    """name -> (columns, rows) for the export."""
    strings: Dict[str, int] = {}

    def sid(s: str) -> int:
        if s not in strings:
            strings[s] = len(strings)
        return strings[s]

    streams: Dict[Any, int] = {}

    def stream_id(h: Any) -> Optional[int]:
        if h is None:
            return None
        key = h if isinstance(h, int) else repr(h)
        if key not in streams:
            streams[key] = len(streams)
        return streams[key]

    gpid = (c.pid & 0xFFFFFF) << 24 if c.pid is not None else None

    def gtid(tid: Optional[int]) -> Optional[int]:
        if gpid is None:
            return None
        return gpid | ((tid or 0) & 0xFFFFFF)

    runtime = [(t0, t1, None, gtid(tid), s, sid(f), r, None) for s, t0, t1, tid, f, r in c.calls]
    kernel = []
    for ln in c.launches:
        n = sid(ln.name)
        kernel.append((ln.t0, ln.t1, None, None, None, stream_id(ln.stream), ln.seq, gpid, n, n, n, None, None,
                       None, *ln.grid, *ln.block, None, ln.shmem, None, None, None, None, None, None))
    memcpy = []
    for cp in c.copies:
        src, dst = _SIDES.get(cp.kind, ("?", "?"))
        memcpy.append((cp.t0, cp.t1, None, None, None, stream_id(cp.stream), cp.seq, gpid, cp.nbytes, cp.kind, None,
                       _SIDE_KIND.get(src, 0), _SIDE_KIND.get(dst, 0), None, None, None, None, None, None, None))
    memset = [(ms.t0, ms.t1, None, None, None, stream_id(ms.stream), ms.seq, gpid, ms.value, ms.nbytes, None, 3)
              for ms in c.memsets]
    meta = [("source", "cudasnap stats"), ("snapshot", c.path),
            ("timestamps", "ns, CLOCK_MONOTONIC of the capturing host: enter and exit of the recorded driver call"),
            ("device_times", DEVICE_TIMES), ("correlationId", "the call's sequence number (s)"),
            ("truncated", "yes" if c.truncated else "no")]
    return {
        "StringIds": (["id", "value"], [(i, s) for s, i in strings.items()]),
        "CUPTI_ACTIVITY_KIND_RUNTIME": (["start", "end", "eventClass", "globalTid", "correlationId", "nameId",
                                         "returnValue", "callchainId"], runtime),
        "CUPTI_ACTIVITY_KIND_KERNEL": (["start", "end", "deviceId", "contextId", "greenContextId", "streamId",
                                        "correlationId", "globalPid", "demangledName", "shortName", "mangledName",
                                        "launchType", "cacheConfig", "registersPerThread", "gridX", "gridY", "gridZ",
                                        "blockX", "blockY", "blockZ", "staticSharedMemory", "dynamicSharedMemory",
                                        "localMemoryPerThread", "localMemoryTotal", "gridId", "sharedMemoryExecuted",
                                        "graphNodeId", "sharedMemoryLimitConfig"], kernel),
        "CUPTI_ACTIVITY_KIND_MEMCPY": (["start", "end", "deviceId", "contextId", "greenContextId", "streamId",
                                        "correlationId", "globalPid", "bytes", "copyKind", "deprecatedSrcId",
                                        "srcKind", "dstKind", "srcDeviceId", "srcContextId", "dstDeviceId",
                                        "dstContextId", "migrationCause", "graphNodeId", "virtualAddress"], memcpy),
        "CUPTI_ACTIVITY_KIND_MEMSET": (["start", "end", "deviceId", "contextId", "greenContextId", "streamId",
                                        "correlationId", "globalPid", "value", "bytes", "graphNodeId", "memKind"],
                                       memset),
        "ENUM_CUDA_MEMCPY_OPER": (["id", "name", "label"], MEMCPY_KINDS),
        "ENUM_CUDA_MEM_KIND": (["id", "name", "label"], MEM_KINDS),
        "CUDASNAP_META": (["name", "value"], meta),
    }


def write_sqlite(c: Calls, path: Path, extra: Optional[Mapping[str, Tuple[List[Tuple[str, str]], List[Any]]]] = None) -> None:
    """The export's tables, and `extra` ones: {name: ([(column, SQL type)], rows)}."""
    with atomic_path(path) as tmp:          # an empty file: SQLite takes it as an empty database
        db = sqlite3.connect(tmp)
        try:
            for name, (cols, rows) in tables(c).items():
                if name == "StringIds":
                    db.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
                else:
                    db.execute(f"CREATE TABLE {name} ({', '.join(f'{col} {_sql_type(name, col)}' for col in cols)})")
                db.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * len(cols))})", rows)
            for name, (defs, rows) in (extra or {}).items():
                db.execute(f"CREATE TABLE {name} ({', '.join(f'{col} {t}' for col, t in defs)})")
                db.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * len(defs))})", rows)
            db.commit()
        finally:
            db.close()


def _sql_type(table: str, col: str) -> str:
    text = col in ("name", "label") or (table == "CUDASNAP_META" and col == "value")
    return "TEXT" if text else "INTEGER"


def write_csv_dir(c: Calls, d: Path, extra: Optional[Mapping[str, Tuple[List[Tuple[str, str]], List[Any]]]] = None) -> List[Path]:
    d.mkdir(exist_ok=True)                  # its parent must exist (checked before the work)
    written = []
    more = {name: ([col for col, _t in defs], rows) for name, (defs, rows) in (extra or {}).items()}
    for name, (cols, rows) in {**tables(c), **more}.items():
        p = d / f"{name}.csv"
        with atomic_file(p, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(cols)
            w.writerows(rows)
        written.append(p)
    return written


def _export_kind(out: str) -> str:
    if out.endswith(("/", os.sep)) or os.path.isdir(out):
        return "dir"
    if out.lower().endswith((".sqlite", ".sqlite3", ".db")):
        return "sqlite"
    return "?"


# ============================================================================ the command

def _err(msg: str) -> int:
    print(f"cudasnap: error: {' '.join(str(msg).split())}", file=sys.stderr)
    return 2


def run_stats(path: Path, fmt: str = "text", out: Optional[str] = None, which: Optional[Sequence[str]] = None,
              force: bool = False, kernel_metrics: Optional[str] = None) -> int:
    which = list(which or REPORTS)
    bad = [w for w in which if w not in REPORTS]
    if bad:
        return _err(f"--report: {', '.join(bad)} is not one of {', '.join(REPORTS)}")
    kind = _export_kind(out) if out else None
    if kind == "?":
        return _err(f"--out {out}: give FILE.sqlite (SQLite) or DIR/ (one CSV per table)")
    if kind is not None:
        try:
            check_output(out, force, "file" if kind == "sqlite" else "dir", [path], "--out")
        except OutputError as e:
            return _err(str(e))
    extra = None
    if kernel_metrics:
        if kind is None:
            return _err("--kernel-metrics needs --out FILE.sqlite or DIR/")
        from cudasnap.replay.profile.metrics_report import load_profile, sqlite_table
        try:
            extra = sqlite_table(load_profile(kernel_metrics))
        except (OSError, ValueError) as e:
            return _err(f"--kernel-metrics {kernel_metrics}: {e}")
    try:
        with SnapshotReader(path) as r:
            c = collect(r)
            from cudasnap.formats.integrity import damage_warning
            damaged = damage_warning(r)
    except SnapshotError as e:
        return _err(str(e))
    if damaged:
        print(f"cudasnap: warning: {damaged}", file=sys.stderr)
    rep = reports(c, which)
    if fmt == "json":
        print(json.dumps({"snapshot": os.fspath(path), "truncated": c.truncated, "timestamps": "host",
                          "device_times": DEVICE_TIMES, **rep}))
    elif fmt == "csv":
        _print_csv(rep)
    else:
        _print_text(c, rep, os.fspath(path))
    if kind is not None:
        try:
            if kind == "sqlite":
                write_sqlite(c, Path(out), extra)
                print(f"cudasnap: wrote {out} (SQLite: {', '.join(TABLES + tuple(extra or ()))})", file=sys.stderr)
            else:
                written = write_csv_dir(c, Path(out), extra)
                print(f"cudasnap: wrote {len(written)} CSV tables into {out}", file=sys.stderr)
        except (OSError, sqlite3.Error) as e:
            return _err(f"cannot write {out} ({e})")
    return 0


def _print_csv(rep: Mapping[str, List[Dict[str, Any]]]) -> None:
    first = True
    for kind, rows in rep.items():
        if not first:
            sys.stdout.write("\n")
        first = False
        head, cells = _rows(kind, rows, text=False)
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        sys.stdout.write(f"# {kind}\n")
        w.writerow(head)
        w.writerows(cells)
        sys.stdout.write(buf.getvalue())


def _print_text(c: Calls, rep: Mapping[str, List[Dict[str, Any]]], path: str) -> None:
    from cudasnap.console import console, print_table

    con = console()
    con.print(f"{path}: {len(c.calls):,} calls recorded, {len(c.launches):,} launches, "
              f"{len(c.copies):,} copies, {len(c.memsets):,} memsets"
              + (" (truncated snapshot: counts cover what was recorded)" if c.truncated else ""), markup=False)
    con.print(f"times are host times of the recorded calls; {DEVICE_TIMES}", markup=False)
    for kind, rows in rep.items():
        head, cells = _rows(kind, rows, text=True)
        con.file.write("\n")
        if not rows:
            con.print(f"{_TITLES[kind]}: none", markup=False)
            continue
        left = {"Name", "Kind", "Grid", "Block"}
        print_table(con, [h if h in left else (h, "right") for h in head], cells, title=_TITLES[kind])
