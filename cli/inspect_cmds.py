"""`cudasnap info`, `dump` and `repair`: read-only views of a snapshot (and its repair).

Each run_* function returns the process exit code; errors print one line
'cudasnap: error: <msg>' to stderr and return 2 (never a traceback).
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

from rich.markup import escape

from cudasnap.console import console, print_table
from cudasnap.formats import SnapshotError, SnapshotReader, cu_result_name, parse_callset, repair
from cudasnap.formats import callset as cs
from cudasnap.formats import native
from cudasnap.formats.container import record_list
from cudasnap.formats.summary import Summary


def _err(msg: str) -> int:
    msg = " ".join(str(msg).split())
    print(f"cudasnap: error: {msg}", file=sys.stderr)
    return 2


# ============================================================================ info

def summarize(r: SnapshotReader) -> Dict[str, Any]:
    """Everything `info` shows, as a JSON-able dict: from the index's summary when the file
    has one (no record is read), else from a scan of every record (same arithmetic)."""
    hdr = r.header
    proc = hdr.get("proc") if isinstance(hdr.get("proc"), dict) else {}
    sm = r.summary()
    if sm is None:
        acc = Summary(lambda bid: r.blob_size(bid) if r.has_blob(bid) else None)
        native.summarize(r, acc)
        return _render(r, hdr, proc, acc.to_map())
    r.check_records()           # damage shows even though no record is decoded
    try:
        return _render(r, hdr, proc, sm)
    except (TypeError, KeyError, ValueError, AttributeError, IndexError) as e:
        raise SnapshotError(f"{r.path}: index summary is malformed ({type(e).__name__}: {e}); "
                            f"`cudasnap repair` rebuilds the index") from None


def _render(r: SnapshotReader, hdr: Mapping[str, Any], proc: Mapping[str, Any], sm: Mapping[str, Any]) -> Dict[str, Any]:
    st = r.stats
    gpus = proc.get("gpus") if isinstance(proc.get("gpus"), list) else []
    t0, t1 = sm.get("t0"), sm.get("t1")
    calls = Counter(sm["calls"])
    kernels = Counter(sm["kernels"])
    return {
        "file": r.path,
        "format_version": r.version,
        "schema": hdr.get("schema"),
        "tool_version": hdr.get("tool_version"),
        "process": {"argv": hdr.get("argv"), "pid": hdr.get("pid"), "host": hdr.get("host"),
                    "cwd": hdr.get("cwd"), "created": hdr.get("created")},
        "driver_version": proc.get("driver_version"),
        "display_driver": display_driver(hdr),
        "gpus": [g for g in gpus if isinstance(g, dict)],
        "duration_s": (t1 - t0) / 1e9 if t0 is not None and t1 is not None and t1 >= t0 else None,
        "records": sm["records"],
        "record_kinds": dict(sm["kinds"]),
        "calls": {"total": sum(calls.values()), "errors": sm["errors"], "unreturned": sm["unreturned"],
                  "collapsed": sm["collapsed"],
                  "by_name": dict(calls.most_common()),
                  "replay_unhandled": _unhandled(calls)},
        "kernels": {"launches": sum(kernels.values()), "distinct": len(kernels),
                    "by_name": dict(kernels.most_common())},
        "memory": {k: {"count": v[0], "bytes": v[1]} for k, v in sorted(sm["memory"].items())},
        "nvtx": sm.get("nvtx"),
        "modules": dict(sm["modules"]),
        "module_images": _module_images(r, sm),
        "blobs": {"count": st["blobs"], "logical_bytes": st["blob_logical_bytes"],
                  "unique_bytes": st["blob_unique_bytes"], "stored_bytes": st["blob_stored_bytes"],
                  "dedup_ratio": st["dedup_ratio"]},
        "file_size": st["file_size"],
        "compression_ratio": st["compression_ratio"],
        "truncated": r.truncated,
        "lost_bytes": r.lost_bytes,
        "recovered_frames": r.recovered_frames,
        "repaired": sm.get("repaired") or None,
        "notes": dict(sm["notes"]),
        "warnings": list(sm["warnings"]),
        "end": sm.get("end"),
        "loss": sm.get("loss"),
        "window": _window_info(hdr, sm.get("window_state"), sm.get("state_calls") or 0, sm.get("trigger")),
        "set_by_environment": _from_env(hdr),
    }


def _from_env(hdr: Mapping[str, Any]) -> Optional[Dict[str, str]]:
    """The shim's variables that were set in the capture's environment (they change what is
    recorded), the window's among them; None when none was."""
    opts = hdr.get("options") if isinstance(hdr.get("options"), dict) else {}
    out = {str(k): str(v) for k, v in (opts.get("environment") or {}).items()} \
        if isinstance(opts.get("environment"), dict) else {}
    w = opts.get("window")
    if isinstance(w, dict) and isinstance(w.get("from"), str):
        out["window"] = w["from"]
    return out or None


def _unhandled(calls: Mapping[str, int]) -> Optional[Dict[str, int]]:
    """Recorded calls no replay handler replays (replay refuses the snapshot, naming them);
    None where the replayer cannot be loaded here."""
    try:
        from cudasnap.replay import dispatch
        return {f: n for f, n in calls.items() if isinstance(f, str) and dispatch.unhandled(f)}
    except ImportError:
        return None


def _window_info(hdr: Mapping[str, Any], state, state_calls: int, trigger) -> Optional[Dict[str, Any]]:
    """A windowed or flight-recorder snapshot: its window, the state written at its start."""
    w = hdr.get("window") if isinstance(hdr.get("window"), dict) else None
    if w is None:
        return None
    out = {"spec": w.get("spec"), "n": w.get("n"), "opened_by": w.get("why"), "launch": w.get("launch")}
    if state:
        out.update(state_bytes=state["bytes"], state_ranges=state["ranges"], state_records=state_calls)
    if trigger:
        out["trigger"] = trigger.get("why")
    return out


class _SummaryRecords:
    """A reader whose records are the summary's module loads and lookups, fn records and one
    launch per launched handle: all that module_loads reads, without the other records."""

    def __init__(self, r: SnapshotReader, sm: Mapping[str, Any]):
        self._sm, self.has_blob, self.blob_size, self.blob = sm, r.has_blob, r.blob_size, r.blob

    def records(self, kinds=None):
        for h, name, module in self._sm["fns"]:
            yield {"k": "fn", "h": h, "name": name, "module": module}
        yield from self._sm["modrecs"]
        for h in self._sm["launched"]:
            yield {"k": "c", "f": "cuLaunchKernel", "a": {"f": h}, "r": 0}


def _module_images(r: SnapshotReader, sm: Mapping[str, Any]) -> list:
    """Each module/library load with the code its image carries (SASS architectures, PTX)."""
    try:
        from cudasnap.formats.jitptx import kept_ptx
        from cudasnap.replay.retarget import module_loads
        loads = module_loads(_SummaryRecords(r, sm))
        kept = kept_ptx(r) if (sm.get("kinds") or {}).get("ptx") else {}
    except SnapshotError:
        return []
    image = {rec.get("s"): ((rec.get("x") or {}).get("image") or {}).get("blob") for rec in sm["modrecs"]}

    def source(ld) -> Optional[str]:
        """Where the simulator's PTX for the module comes from: its image, what a capture kept
        beside it (a JIT cache), or nowhere (None)."""
        if ld["info"].ptx:
            return "image"
        k = kept.get(image.get(ld["seq"]) or "")
        return k["from"] if k else None
    return [{"seq": ld["seq"], "call": ld["call"], "result": ld["r"], "bytes": ld["size"],
             "format": ld["info"].format, "sass": ["sm_%d" % a for a in ld["info"].sass],
             "ptx": ["compute_%d" % a for a in ld["info"].ptx], "ptx_from": source(ld),
             "compressed": sorted({e.compressed for e in ld["info"].entries if e.compressed}),
             "kernels": len(ld["kernels"]), "launched": sorted(ld.get("launched") or ())} for ld in loads]


def _v(x: Any, none: str = "-") -> str:
    """A value for people: never Python's None."""
    return none if x is None or x == "" else str(x)


def display_driver(hdr: Mapping[str, Any]) -> Optional[str]:
    """The NVIDIA display driver version recorded at capture (header `display_driver`, or
    in the capture options), None when the capturing host had none."""
    v = hdr.get("display_driver")
    opts = hdr.get("options")
    if v is None and isinstance(opts, dict):
        v = opts.get("display_driver")
    return v if isinstance(v, str) and v else None


def _driver(v: Any, display: Optional[str] = None) -> str:
    """'580.159.04 (CUDA 13.0)': the display driver ('-' when not recorded) and the CUDA
    version its libcuda reported."""
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        cuda = "CUDA unknown"
    else:
        cuda = f"CUDA {v // 1000}.{v % 1000 // 10}"
    return f"{display or '-'} ({cuda})"


def _repair_line(rp: Optional[Mapping[str, Any]]) -> Optional[str]:
    if not rp:
        return None
    if not rp["lost_bytes"] and not rp["lost_blobs"]:
        return "repaired : nothing lost (index rebuilt)"
    return (f"repaired : [red]PARTIAL[/red], {rp['lost_bytes']} bytes of damaged data dropped in "
            f"{rp['gap_count']} stretch(es): {_lost_what(rp)}")


def _lost_what(s: Mapping[str, Any]) -> str:
    """Records (a lower bound when a stretch's kind is unknown) and blobs a repair lost."""
    what = f"{'at least ' if s['unknown_gaps'] else ''}{s['lost_records']} records"
    if s["unknown_gaps"]:
        what += f" ({s['unknown_gaps']} stretch(es) of unknown content)"
    if s["lost_blobs"]:
        what += f", {s['lost_blobs']} blob(s)"
    return what


def _end_line(e: Optional[Mapping[str, Any]]) -> str:
    if e is None:
        return "end      : [yellow]no end record[/yellow] (process did not finish cleanly?)"
    parts = [f"exit {_v(e.get('exit'))}"]
    if e.get("signal"):
        parts.append(f"killed by signal {e['signal']}")
    if e.get("partial"):
        parts.append("[red]partial[/red]")
    return "end      : " + ", ".join(parts)


def _human(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _partial_line(loss: Any) -> str:
    """What the end record says the snapshot misses (formats/SCHEMA.md, `end`)."""
    if loss is None:
        return "unknown (no end record)"
    lost = loss["lost"]
    n = loss["calls_missing"]
    parts = []

    def count(k: int, what: str) -> str:
        return f"{k} {what}{'' if k == 1 else 's'}"

    if n:
        parts.append(count(n, "call") + " missing" + (f" of {loss['seq_issued']}" if loss.get("seq_issued") else ""))
    if lost.get("payload_bytes") or lost.get("payloads"):
        parts.append(f"{_human(lost.get('payload_bytes', 0))} of payloads missing ({count(lost.get('payloads', 0), 'payload')})")
    if lost.get("dropped_records"):
        parts.append(count(lost["dropped_records"], "record") + f" dropped ({_human(lost.get('dropped_bytes', 0))})")
    if lost.get("unpublished_records"):
        parts.append(count(lost["unpublished_records"], "record") + " left half-written by the dying process "
                     f"({_human(lost.get('unpublished_bytes', 0))})")
    if lost.get("unread_bytes"):
        parts.append(f"{_human(lost['unread_bytes'])} of the ring unreadable")
    if lost.get("undecodable_records"):
        parts.append(count(lost["undecodable_records"], "record") + " undecodable")
    if lost.get("repeated_seqs"):
        parts.append(count(lost["repeated_seqs"], "call record") + " repeated")
    if not loss["partial"] and not parts:
        return "no"
    if not parts:
        return "[red]YES[/red] (amount not known: see the warnings)"
    return "[red]YES[/red], " + ", ".join(parts)


def run_info(path: Path, json_out: bool) -> int:
    try:
        with SnapshotReader(path) as r:
            s = summarize(r)
            from cudasnap.formats.integrity import damaged_frames
            s["damaged_frames"] = [{"offset": o, "kind": k, "problem": why} for o, k, why in damaged_frames(r)]
    except SnapshotError as e:
        return _err(str(e))
    if json_out:
        print(json.dumps(s, default=_json_default, sort_keys=False))
        return 0
    con = console()
    p = s["process"]
    con.print(f"[bold]{escape(s['file'])}[/bold]  (format {_v(s['format_version'])}, schema "
              f"{escape(_v(s['schema']))}, cudasnap {escape(_v(s['tool_version']))})")
    argv = p.get("argv")
    argv_s = " ".join(map(str, argv)) if isinstance(argv, list) else _v(argv)
    con.print(f"process  : {argv_s or '-'}  pid {_v(p.get('pid'))} on {_v(p.get('host'))}", markup=False)
    con.print(f"driver   : {_driver(s['driver_version'], s['display_driver'])}", markup=False)
    for g in s["gpus"]:
        cc = g.get("cc")
        cc_s = ".".join(map(str, cc)) if isinstance(cc, list) else "?"
        con.print(f"gpu {_v(g.get('index'))}    : {_v(g.get('name'), '?')}  cc {cc_s}  {_human(g.get('mem'))}  "
                  f"{_v(g.get('uuid'), '')}".rstrip(), markup=False)
    dur = s["duration_s"]
    con.print(f"duration : {dur:.6f} s" if dur is not None else "duration : -")
    c = s["calls"]
    rep = f", {c['collapsed']} identical queries counted, not stored" if c.get("collapsed") else ""
    con.print(f"calls    : {c['total']}  (errors {c['errors']}, never returned {c['unreturned']}{rep})")
    if c.get("replay_unhandled"):
        con.print("replay   : [red]refused[/red] (where one of these calls succeeded): calls it does not replay: "
                  + escape(", ".join(f"{f} ({n})" for f, n in list(c["replay_unhandled"].items())[:6])))
    state = "no" if not s["truncated"] else f"[red]YES[/red], {s['lost_bytes']} bytes lost, {s['recovered_frames']} frames recovered"
    con.print(f"truncated: {state}")
    w = s.get("window")
    if w:
        st = (f", state {_human(w['state_bytes'])} in {w['state_ranges']} ranges" if "state_bytes" in w
              else ", state: none (from the program's start)")
        trig = f", written on {w['trigger']}" if w.get("trigger") else ""
        con.print(f"window   : {w.get('spec')} #{_v(w.get('n'))} (opened by {_v(w.get('opened_by'))}"
                  f"{', launch ' + str(w['launch']) if w.get('launch') is not None else ''}){st}{trig}", markup=False)
    env = s.get("set_by_environment")
    if env:
        con.print("settings : set by the environment: " + "; ".join(
            v if k == "window" else f"{k}={v}" for k, v in env.items()), markup=False)
    line = _repair_line(s["repaired"])
    if line:
        con.print(line)
    con.print(f"partial  : {_partial_line(s['loss'])}")
    if s["damaged_frames"]:
        d = s["damaged_frames"]
        con.print(f"damaged  : [red]YES[/red], {len(d)}{'+' if len(d) >= 8 else ''} frame(s) fail their checksum: "
                  + escape("; ".join(f"{x['kind']} at offset {x['offset']} ({x['problem']})" for x in d[:3])
                           + " (replay, export and extract refuse it; `cudasnap repair` keeps every frame that "
                             "still reads)"))
    b = s["blobs"]
    con.print(f"file     : {_human(s['file_size'])}, compression {s['compression_ratio']}x, "
              f"blobs {b['count']} ({_human(b['logical_bytes'])} logical, {_human(b['unique_bytes'])} unique, "
              f"dedup {b['dedup_ratio']}x)")
    con.print(f"modules  : {s['modules']['loads']} loaded, {_human(s['modules']['image_bytes'])} of images")
    notes = s["notes"]
    con.print(f"notes    : {sum(notes.values())} ({notes.get('warning', 0)} warnings)")
    for m in s["warnings"]:
        con.print(f"  warning: {m}", markup=False)
    con.print(_end_line(s["end"]))

    rows = [(name, n) for name, n in list(c["by_name"].items())[:40]]
    if len(c["by_name"]) > 40:
        rows.append((f"... {len(c['by_name']) - 40} more", ""))
    print_table(con, ["function", ("count", "right")], rows, title="API calls")
    imgs = s.get("module_images") or []
    if s["kernels"]["by_name"]:
        ptx: Dict[str, str] = {}           # kernel -> where its PTX comes from (the simulator runs PTX)
        for m in imgs:
            for k in m["launched"]:
                ptx.setdefault(k, {None: "none", "image": "image"}.get(m["ptx_from"], f"kept: {m['ptx_from']}"))
        print_table(con, ["kernel", ("launches", "right"), "PTX"],
                    [(k, n, ptx.get(k, "?")) for k, n in list(s["kernels"]["by_name"].items())[:30]],
                    title="Kernels by launches")
    if imgs:
        rows = [(f"#{m['seq']}", m["call"], _human(m["bytes"]), m["format"], " ".join(m["sass"]) or "-",
                 " ".join(m["ptx"]) or (f"kept: {m['ptx_from']}" if m["ptx_from"] else "-"), m["kernels"])
                for m in imgs[:40]]
        if len(imgs) > 40:
            rows.append((f"... {len(imgs) - 40} more", "", "", "", "", "", ""))
        print_table(con, ["call", "load", ("image", "right"), "format", "SASS", "PTX", ("kernels", "right")], rows,
                    title="Modules: the code each image carries")
    if s["memory"]:
        print_table(con, ["kind", ("calls", "right"), ("bytes", "right")],
                    [(k, v["count"], _human(v["bytes"])) for k, v in s["memory"].items()], title="Memory traffic")
    nv = s["nvtx"]
    if nv:
        rows = []
        for row in nv["by_name"][:30]:
            name = _v(row["name"], "(no message)") + ("  [mark]" if row["kind"] == "mark" else "")
            avg = row["total_ns"] / row["closed"] / 1e3 if row["closed"] else None
            rows.append((name, _v(row["domain"]), row["count"],
                         f"{row['total_ns'] / 1e3:.1f}" if row["closed"] else "-", f"{avg:.1f}" if avg is not None else "-"))
        if len(nv["by_name"]) > 30:
            rows.append((f"... {len(nv['by_name']) - 30} more", "", "", "", ""))
        print_table(con, ["NVTX range", "domain", ("count", "right"), ("total us", "right"), ("avg us", "right")],
                    rows, title=f"NVTX ranges recorded ({nv['ranges']} ranges, {nv['marks']} marks)")
    return 0


# ============================================================================ dump

def _fmt_val(v: Any, blobs: bool, depth: int = 0) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return hex(v) if v > 0xFFFF else str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return v if v and all(ch.isalnum() or ch in "_.:/-" for ch in v) else json.dumps(v)
    if isinstance(v, (bytes, bytearray)):
        lim = len(v) if blobs else 32
        tail = "" if len(v) <= lim else "..."
        return f"<{len(v)}B {bytes(v[:lim]).hex()}{tail}>"
    if depth > 6:
        return "..."
    if isinstance(v, dict):
        if set(v) == {"blob"} or ("blob" in v and isinstance(v.get("blob"), str) and len(v) <= 2):
            return f"blob:{str(v['blob'])[:12]}"
        return "{" + ", ".join(f"{k}={_fmt_val(x, blobs, depth + 1)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        items = [_fmt_val(x, blobs, depth + 1) for x in v[:16]]
        if len(v) > 16:
            items.append(f"...{len(v) - 16} more")
        return "[" + ", ".join(items) + "]"
    return repr(v)


class _Memo(dict):
    """Formatted pieces of call records by their value (dump): calls repeat the same arguments,
    so most lines are assembled from strings made once. Cleared when it grows large."""

    def keep(self, key, value):
        if len(self) > 200_000:
            self.clear()
        self[key] = value
        return value

    def piece(self, key, make):
        try:
            got = self.get(key)
        except TypeError:               # an unhashable value (nested map): not kept
            return make()
        if got is None:
            if len(self) > 200_000:
                self.clear()
            got = self[key] = make()
        return got


def _call_body(f: str, a: Mapping[str, Any], rv: Any, blobs: bool) -> str:
    res = f"{cu_result_name(rv)} ({rv})" if rv is not None else "<never returned>"
    return f"{f}({', '.join(f'{n}={_fmt_val(v, blobs)}' for n, v in a.items())}) -> {res}"


def _fmt_text(rec: Dict[str, Any], fn_names: Dict[Any, str], blobs: bool, r: SnapshotReader,
              memo: Optional[_Memo] = None) -> str:
    k = rec.get("k")
    memo = _Memo() if memo is None else memo
    if k == "c":
        f = rec.get("f")
        if type(f) is not str:
            f = "?"
        a = rec.get("a")
        if type(a) is not dict:
            a = {}
        rv = rec.get("r")
        # types are part of the key: 1, 1.0 and True are equal but print differently
        key = (f, tuple(a), tuple(a.values()), tuple(map(type, a.values())), rv, type(rv), blobs)
        try:
            body = memo[key]
        except KeyError:
            body = memo.keep(key, _call_body(f, a, rv, blobs))
        except TypeError:               # an unhashable value (nested map): made each time
            body = _call_body(f, a, rv, blobs)
        t0, t1 = rec.get("t0"), rec.get("t1")
        dur = ""
        if type(t0) is int and type(t1) is int and t1 >= t0 >= 0:
            dt = t1 - t0
            dur = memo.get(dt)          # durations repeat too (int keys meet no other key)
            if dur is None:
                us = dt / 1000
                dur = memo.keep(dt, f" [{us:.1f} us]" if us < 1000 else f" [{us / 1000:.2f} ms]")
        sq, tid = rec.get("s"), rec.get("tid")
        line = f"#{'?' if sq is None or sq == '' else sq}  {'?' if tid is None or tid == '' else tid}  {body}{dur}"
        if cs.is_launch(f):
            h = a.get("f")              # the usual handle argument (launch_function_handle's first)
            if type(h) is int:
                kn = fn_names.get(h) if fn_names else None
            else:
                kn = cs.kernel_name(rec, fn_names)
            if kn:
                line += f"  kernel={kn}"
        x = rec.get("x")
        if isinstance(x, dict) and x:
            line += "  x=" + memo.piece(("x", tuple(x.items()), tuple(map(type, x.values())), blobs),
                                        lambda: _fmt_x(x, blobs, r))
        return line
    if k == "b":
        ch = rec.get("chunks")
        return f"[b] id={_v(rec.get('id'))} size={_v(rec.get('size'))} chunks={len(ch) if isinstance(ch, list) else '?'}"
    if k == "fn":
        return (f"[fn] h={_fmt_val(rec.get('h'), False)} name={_v(rec.get('name'))} kind={_v(rec.get('kind'))} "
                f"module={_fmt_val(rec.get('module'), False)} params={_fmt_val(rec.get('params'), False)}")
    if k == "note":
        return f"[note {_v(rec.get('level'))}] {_v(rec.get('msg'))}"
    if k == "rep" and isinstance(rec.get("calls"), list):
        reps = ", ".join(f"{_v(e.get('f'), '?')} x{_v(e.get('n'), '?')} (as #{_v(e.get('of'), '?')})"
                         for e in rec["calls"] if isinstance(e, dict))
        return f"[repeats] {_v(rec.get('tid'), '?')}  {reps}"
    if k == "nvtx":
        dom = f"  domain={_fmt_val(rec.get('domain'), False)}" if rec.get("domain") is not None else ""
        return (f"[nvtx {_v(rec.get('op'), '?')}] {_v(rec.get('tid'), '?')}  {_fmt_val(rec.get('name'), False)}{dom}"
                f"  id={_v(rec.get('id'))}  t={_v(rec.get('t'))}")
    if k == "region":
        return (f"[region] base={_fmt_val(rec.get('base'), False)} size={_fmt_val(rec.get('size'), False)} "
                f"purpose={_v(rec.get('purpose'))}")
    if k == "end":
        return "[end] " + " ".join(f"{n}={_fmt_val(rec.get(n), False)}" for n in ("exit", "signal", "partial")
                                   if rec.get(n) is not None)
    rest = {kk: vv for kk, vv in rec.items() if kk != "k"}
    return f"[{k}] " + json.dumps(_jsonable(rest, blobs, None), separators=(",", ":"), default=str)


def _fmt_x(x: Dict[str, Any], blobs: bool, r: SnapshotReader) -> str:
    parts = []
    for n, v in x.items():
        if isinstance(v, dict) and isinstance(v.get("blob"), str):
            bid = v["blob"]
            size = r.blob_size(bid) if r.has_blob(bid) else "?"
            s = f"{n}=blob:{bid[:12]}({size}B)"
            if blobs and r.has_blob(bid):
                s += " " + _blob_preview(r, bid)[0]
            parts.append(s)
        else:
            parts.append(f"{n}={_fmt_val(v, blobs)}")
    return "{" + ", ".join(parts) + "}"


_PREVIEW = 256


def _blob_preview(r: SnapshotReader, bid: str):
    for chunk in r.blob_reader(bid):
        return bytes(chunk[:_PREVIEW]).hex(), r.blob_size(bid) > _PREVIEW
    return "", False


def _jsonable(v: Any, blobs: bool, r: Optional[SnapshotReader], depth: int = 0) -> Any:
    if isinstance(v, (bytes, bytearray)):
        lim = len(v) if blobs else 64
        out = {"hex": bytes(v[:lim]).hex(), "len": len(v)}
        if len(v) > lim:
            out["truncated"] = True
        return out
    if depth > 32:
        return "..."
    if isinstance(v, dict):
        out = {str(k): _jsonable(x, blobs, r, depth + 1) for k, x in v.items()}
        bid = v.get("blob")
        if r is not None and isinstance(bid, str) and r.has_blob(bid):
            out["size"] = r.blob_size(bid)
            if blobs:
                out["hex"], trunc = _blob_preview(r, bid)
                if trunc:
                    out["truncated"] = True
        return out
    if isinstance(v, list):
        return [_jsonable(x, blobs, r, depth + 1) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def _json_piece(v: Any, blobs: bool, r: SnapshotReader, depth: int = 1) -> str:
    return json.dumps(_jsonable(v, blobs, r, depth), separators=(",", ":"), default=str)


def _json_line(rec: Dict[str, Any], blobs: bool, r: SnapshotReader, memo: "_Memo") -> str:
    """json.dumps(_jsonable(rec)) of a record, assembled from pieces made once: records repeat
    their keys and value types (one %-template per such shape, ints formatted by it), and calls
    their maps of arguments."""
    vals = list(rec.values())
    types = tuple(map(type, vals))
    shape = (tuple(rec), types)
    ent = memo.get(shape)
    if ent is None:
        if "blob" in rec or not all(type(k) is str for k in shape[0]):
            ent = memo.keep(shape, False)
        else:
            tmpl = "{" + ",".join(json.dumps(k).replace("%", "%%") + (":%d" if t is int else ":%s")
                                  for k, t in zip(shape[0], types)) + "}"
            ent = memo.keep(shape, (tmpl, [i for i, t in enumerate(types) if t is not int]))
    if ent is False:                       # non-str keys, or a top-level blob reference
        return _json_piece(rec, blobs, r, 0)
    tmpl, conv = ent
    for i in conv:
        v, t = vals[i], types[i]
        if t is str:
            enc = memo.get(v)               # plain str keys cannot meet the tuple keys
            if enc is None:
                enc = memo.keep(v, json.dumps(v))
            vals[i] = enc
        elif t is dict:
            # value types are part of the key (1, 1.0 and True are equal), no floats (-0.0 == 0.0);
            # only maps with str keys are kept, so a map found has str keys too
            vt = tuple(map(type, v.values()))
            mk = ("j", tuple(v), tuple(v.values()), vt) if float not in vt else None
            try:
                enc = memo.get(mk) if mk is not None else None
            except TypeError:               # an unhashable value (nested list)
                enc = mk = None
            if enc is None:
                enc = _json_piece(v, blobs, r)
                if mk is not None and all(type(k) is str for k in v):
                    memo.keep(mk, enc)
            vals[i] = enc
        elif v is None or t is bool:
            vals[i] = "null" if v is None else "true" if v else "false"
        else:
            vals[i] = _json_piece(v, blobs, r)
    return tmpl % tuple(vals)


def _json_default(o: Any) -> Any:
    if isinstance(o, (bytes, bytearray)):
        return {"hex": bytes(o[:64]).hex(), "len": len(o)}
    return str(o)


class _Dump:
    """The lines `dump` prints for reader r's records frames, fed one at a time (frame).
    Lines are made in C where the module is there (formats/native.py); the Python path
    (one) is the reference, and takes every record the C walk hands over."""

    def __init__(self, r, fmt: str, blobs: bool, calls: Optional[str], out, use_native: bool = True):
        """calls: a call-set spec run_dump has checked (parse_terms raised nothing for it)."""
        self.r, self.text, self.blobs, self.out = r, fmt == "text", blobs, out
        self.pred = parse_callset(calls) if calls else None
        terms = (cs.parse_terms(calls) if str(calls).strip() else []) if calls else None
        self.walk = native.dump_walk(r, self.text, blobs, terms) if use_native else None
        self.fn_names: Dict[Any, str] = {}
        self.memo = _Memo()
        self.lines: list = []       # written in blocks; what was read before an error still shows
        self.shown = 0              # lines written

    def one(self, rec: Dict[str, Any]) -> bool:
        """One record the Python way; True when the C walk cannot follow the file from here."""
        off = False
        if rec.get("k") == "fn" and isinstance(rec.get("name"), str):
            try:
                self.fn_names[rec.get("h")] = rec["name"]
            except TypeError:
                pass
            if self.walk is not None:
                off = self.walk.fn(rec.get("h"), rec["name"])
        if self.pred is None or self.pred(rec, self.fn_names):
            if self.text:
                self.lines.append(_fmt_text(rec, self.fn_names, self.blobs, self.r, self.memo) + "\n")
            else:
                self.lines.append(_json_line(rec, self.blobs, self.r, self.memo) + "\n")
            if len(self.lines) >= 4096:
                self.flush()
        return off

    def frame(self, off: int, count: int, payload: bytes, recs, checked: bool = False) -> None:
        w = self.walk
        if recs is None and (w is None or not w.run(payload, count, self.r.path, off, self.one, w.need,
                                                    out=self.lines.append, checked=checked)):
            recs = record_list(payload, count, self.r.path, off)
        for rec in recs or ():
            self.one(rec)
        self.flush()

    def flush(self) -> None:
        text = "".join(self.lines)
        self.shown += len(self.lines)
        self.lines.clear()
        self.out.write(text)


def run_dump(path: Path, calls: Optional[str], fmt: str, blobs: bool) -> int:
    fmt = (fmt or "text").lower()
    if fmt not in ("text", "jsonl", "json"):
        return _err(f"unknown --format {fmt!r} (use text or jsonl)")
    if calls is not None:
        from cudasnap.replay.selection import check as check_selection
        bad = check_selection(calls=calls) if str(calls).strip() else "--calls is empty: give SET"
        if bad:                             # replay's parser and words, before the file is opened
            return _err(bad)
    d = None
    try:
        with SnapshotReader(path) as r:
            d = _Dump(r, fmt, blobs, calls, sys.stdout)
            for frame in r.record_payloads():
                d.frame(*frame)
            d.flush()
            from cudasnap.formats.integrity import damage_warning
            damaged = damage_warning(r)
            if damaged:
                print(f"cudasnap: warning: {damaged}", file=sys.stderr)
            if r.truncated:
                print(f"cudasnap: warning: {r.path} is truncated: {r.lost_bytes} bytes after the last "
                      f"complete frame were lost (run `cudasnap repair`)", file=sys.stderr)
            if calls and not d.shown:           # as replay refuses a selection of nothing
                return _err(f"--calls {calls}: no call of {r.path} is among those (`cudasnap dump {r.path}` "
                            f"lists them all)")
    except SnapshotError as e:
        if d is not None and d.lines:
            try:
                d.flush()
            except BrokenPipeError:
                pass
        return _err(str(e))
    except BrokenPipeError:  # `cudasnap dump x | head`
        try:
            sys.stdout = None  # type: ignore[assignment]
        except Exception:
            pass
        return 0
    return 0


# ============================================================================ repair

def run_repair(path: Path, output: Optional[Path], force: bool = False) -> int:
    if output is not None:
        from cudasnap.formats.outputs import OutputError, check_output
        try:
            check_output(output, force, "file", [path])
        except OutputError as e:
            hint = " (or leave out -o to repair in place, keeping the original as .orig)" if "is the input" in str(e) else ""
            return _err(f"{e}{hint}")
    try:
        s = repair(path, output)
    except SnapshotError as e:
        return _err(str(e))
    except OSError as e:
        return _err(f"{path}: {e.strerror or e}")
    if s["intact"]:
        print(f"{s['path']}: intact, nothing to do")
        return 0
    segs = f", with the chunks of {s['segments']} segment file(s) folded in" if s["segments"] else ""
    print(f"{s['path']}: kept {s['frames']} frames ({s['records']} records, {s['blobs']} blobs, "
          f"{s['chunks']} chunks{segs})")
    for line in _repair_losses(s):
        print(line)
    kept = f"; the original is kept as {s['orig']}" if s["orig"] else ""
    print(f"wrote {s['out']} ({s['bytes_after']} bytes, with index){kept}")
    return 0


_GAPS_SHOWN = 10


def _repair_losses(s: Mapping[str, Any]) -> list:
    """What repair dropped and why: one line per damaged stretch (the first few), then totals."""
    gaps = s["gaps"]
    data = [g for g in gaps if g["kind"] != "index"]
    lines = []
    for g in gaps[:_GAPS_SHOWN]:
        if g["kind"] == "index":
            what = "the old index (rebuilt)"
        elif g["kind"] == "records":
            what = f"a records frame of {g['records']} records"
        elif g["kind"] is not None:
            what = f"a {g['kind']} frame"
        else:
            what = "data of unknown kind"
        lines.append(f"  skipped {g['length']} bytes at offset {g['offset']}: {what}: {g['reason']}")
    if len(gaps) > _GAPS_SHOWN:
        lines.append(f"  ... and {len(gaps) - _GAPS_SHOWN} more stretch(es)")
    if s["lost_blobs"]:
        lines.append(f"  {s['lost_blobs']} blob(s) left out: a chunk of theirs was in a damaged stretch")
    if data or s["lost_blobs"]:
        lines.insert(0, f"lost {s['lost_bytes']} bytes of damaged data in {len(data)} stretch(es): "
                        f"{_lost_what(s)}; the repaired file keeps a note of this loss for `info`")
    else:
        lines.insert(0, "nothing lost" + (" (the index was rebuilt)" if gaps else ""))
    return lines
