"""Where advise's numbers come from: a timeline profile (taken here by a replay in a child
process, or read from a profile JSON), the replay's Kineto trace when there is one (copies,
memsets, NVTX ranges on the replay's time axis) and the snapshot's records (the calls a stretch
holds)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from cudasnap.formats.vocab import in_class, is_launch, is_sync
from cudasnap.replay.profile.modes import for_advise


class AdviseError(Exception):
    """Input advise cannot use (one line, exit 2)."""


@dataclass
class Source:
    profile: Dict[str, Any]
    snapshot: Optional[str]              # the snapshot what-ifs replay, when there is one
    no_snapshot_why: Optional[str]       # why what-ifs cannot be measured
    trace: Optional[Dict[str, Any]] = None
    taken: Optional[Dict[str, Any]] = None   # the replay advise ran for the profile
    notes: List[str] = field(default_factory=list)


def run_replay(doc: Dict[str, Any], timeout: Optional[float]) -> subprocess.CompletedProcess:
    """A replay (a typed document, replay/invocation.py) in a child process: its GPU state,
    crashes and exit code stay its own."""
    from cudasnap.replay.invocation import command
    cmd = command(sys.executable, doc)
    try:
        # a process of its own: a what-if (another launch size, a rebuilt kernel) may fault, and a
        # sticky error ends the context of its process; a hang ends at --timeout
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"timed out after {timeout:g} s")


def last_error(cp: subprocess.CompletedProcess) -> str:
    lines = [l.strip() for l in (cp.stderr or "").splitlines() if l.strip()]
    errs = [l for l in lines if "error" in l.lower() or l.startswith("cudasnap")]
    line = (errs or lines or [f"exit {cp.returncode}"])[-1]
    return re.sub(r"^cudasnap: (error: )?", "", line)     # quoted inside advise's own line


def is_profile_json(path: str) -> bool:
    with open(path, "rb") as f:
        head = f.read(64).lstrip()
    return head.startswith(b"{")


def check_profile(p: Any, where: str) -> Dict[str, Any]:
    want = for_advise("profile").name
    if not isinstance(p, dict) or not isinstance(p.get("summary"), dict) or not isinstance(p.get("launches"), list):
        raise AdviseError(f"{where}: not a cudasnap profile (expected the JSON of `replay --profile {want} --out`)")
    from cudasnap.replay.profile.report import shape_problem
    why = shape_problem(p)
    if why:
        raise AdviseError(f"{where}: not a profile as cudasnap writes it: {why}")
    mode = p["summary"].get("mode")
    if mode != want:
        counters = for_advise("counters").name
        raise AdviseError(f"{where}: the profile is in {mode or 'an unknown'} mode; advise reads {want} profiles "
                          f"(`cudasnap replay SNAPSHOT --profile {want} --out P.json`)"
                          + (f"; give a {counters} profile with --metrics" if mode == counters else ""))
    timed = [r for r in p["launches"] if isinstance(r, dict) and isinstance(r.get("start_ns"), int)
             and isinstance(r.get("end_ns"), int)]
    if not timed:
        raise AdviseError(f"{where}: the profile holds no timed kernel")
    return p


def read_profile(path: str) -> Source:
    try:
        with open(path, encoding="utf-8") as f:
            p = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise AdviseError(f"{path}: not a cudasnap profile ({type(e).__name__}: {e})") from None
    check_profile(p, path)
    snap = (p.get("run") or {}).get("snapshot") or p.get("snapshot")
    why = None
    if not snap:
        why = "the profile names no snapshot"
    elif not os.path.isfile(snap):
        why = f"the profile's snapshot {snap} is not there"
    return Source(p, snap if why is None else None, why)


def take_profile(snapshot: str, pace: str, timeout: Optional[float], device: int) -> Source:
    """`cudasnap replay SNAPSHOT --profile timeline --pace PACE --out P.json --trace T.json` (the
    mode advise reads, modes.py)."""
    mode = for_advise("profile").name
    with tempfile.TemporaryDirectory(prefix="cudasnap-advise-") as d:
        out, tr = os.path.join(d, f"{mode}.json"), os.path.join(d, "trace.json")
        from cudasnap.replay.invocation import document
        doc = document(snapshot, {"pace": pace, "device": device}, {"mode": mode, "out": out, "trace": tr})
        cp = run_replay(doc, timeout)
        if cp.returncode == 2:        # the replay's own error (no such GPU...), not what its profile lacks
            raise AdviseError(f"the {mode} replay of {snapshot} failed: {last_error(cp)}")
        if not os.path.isfile(out):
            raise AdviseError(f"the {mode} replay of {snapshot} gave no profile (exit {cp.returncode}: "
                              f"{last_error(cp)})")
        with open(out, encoding="utf-8") as f:
            p = json.load(f)
        trace = None
        if os.path.isfile(tr):
            with open(tr, encoding="utf-8") as f:
                trace = json.load(f)
    check_profile(p, f"the {mode} replay of {snapshot}")
    src = Source(p, snapshot, None, trace=trace,
                 taken={"command": shown_command(doc), "exit_code": cp.returncode, "pace": pace})
    if cp.returncode != 0:
        src.notes.append(f"the {mode} replay exited {cp.returncode} ({last_error(cp)}): its times stand, "
                         "its results did not all verify")
    return src


def shown_command(doc: Dict[str, Any]) -> List[str]:
    """The command a replay stands for, without its temporary output files."""
    from cudasnap.replay.invocation import command_line
    d = dict(doc, profile=dict(doc["profile"] or {}, out=None, trace=None))
    return command_line(d)


def trace_device_ops(trace: Optional[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Copies and memsets of the trace, times in ns on the profile's clock."""
    if not trace:
        return []
    t0 = (trace.get("otherData") or {}).get("clock_origin_ns") or 0
    out = []
    for ev in trace.get("traceEvents") or []:
        if ev.get("ph") != "X" or ev.get("cat") not in ("gpu_memcpy", "gpu_memset"):
            continue
        a = ev.get("args") or {}
        start = t0 + int(round(ev["ts"] * 1e3))
        out.append({"kind": "memset" if ev["cat"] == "gpu_memset" else "copy", "name": ev.get("name"),
                    "seq": a.get("seq"), "bytes": a.get("bytes"), "start_ns": start,
                    "end_ns": start + int(round(ev.get("dur", 0) * 1e3))})
    return out


def trace_nvtx(trace: Optional[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The recording's NVTX ranges as the trace placed them on the replay's time axis."""
    if not trace:
        return []
    t0 = (trace.get("otherData") or {}).get("clock_origin_ns") or 0
    out, opened = [], {}
    for ev in trace.get("traceEvents") or []:
        if ev.get("cat") != "nvtx":
            continue
        ts = t0 + int(round(ev.get("ts", 0) * 1e3))
        if ev.get("ph") == "X":
            out.append({"name": ev.get("name"), "start_ns": ts, "end_ns": ts + int(round(ev.get("dur", 0) * 1e3))})
        elif ev.get("ph") == "b":
            opened[ev.get("id")] = (ev.get("name"), ts)
        elif ev.get("ph") == "e" and ev.get("id") in opened:
            name, s = opened.pop(ev.get("id"))
            out.append({"name": name, "start_ns": s, "end_ns": ts})
    return out


def snapshot_calls(snapshot: Optional[str], first: int, last: int) -> Optional[Dict[str, Any]]:
    """What the recorded calls first..last hold besides launches: synchronizations and
    device-to-host copies (a graph of the stretch holds neither), and their span on the
    program's own clock (recorded_span_us)."""
    if not snapshot:
        return None
    try:
        from cudasnap.formats import SnapshotReader
        syncs = d2h = launches = 0
        t_first = t_last = None
        for r in SnapshotReader(snapshot).records(("c",)):
            s = r.get("s")
            if not isinstance(s, int) or s < first:
                continue
            if s > last:
                continue
            t0, t1 = r.get("t0"), r.get("t1")
            if isinstance(t0, int) and (t_first is None or t0 < t_first):
                t_first = t0
            if isinstance(t1, int) and (t_last is None or t1 > t_last):
                t_last = t1
            f = r.get("f") or ""
            if is_launch(f):
                launches += 1
            elif is_sync(f) or in_class(f, "polls"):
                syncs += 1
            elif "DtoH" in f:
                d2h += 1
        out = {"launches": launches, "syncs": syncs, "d2h": d2h}
        if t_first is not None and t_last is not None and t_last > t_first:
            out["recorded_span_us"] = round((t_last - t_first) / 1e3, 3)   # as the program ran, under capture
        return out
    except Exception:          # a fact for the evidence; the finding stands without it
        return None
