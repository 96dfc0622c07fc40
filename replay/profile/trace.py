"""The trace of a timeline replay, laid out as the PyTorch profiler (Kineto) writes its
traces, so Perfetto (ui.perfetto.dev), chrome://tracing, TensorBoard's profiler plugin and
Holistic Trace Analysis read it as they read a PyTorch trace. `--trace FILE.json` or
`FILE.json.gz` (gzip).

Chrome trace event format, times in microseconds (`ts`, `dur`) from the first timed event
(`otherData` names the clock, CUPTI's or CLOCK_MONOTONIC, and its value at ts 0):
- device work: complete events (`ph` "X") in process `pid` = the device ordinal replayed on,
  thread `tid` = the stream (CUPTI's stream id; without CUPTI, streams numbered from 1 in
  order of first use). Categories `kernel`, `gpu_memcpy`, `gpu_memset`. Args: `correlation`
  (the call's sequence number, as `dump` shows it), `device`, `stream`, and for kernels
  `grid`, `block`, `shared memory`, `mangled` (the recorded name; the event is named by the
  demangled one).
- host: the replayed driver calls (category `cuda_driver`) in process `pid` = the recorded
  process id, thread `tid` = the recorded thread id; each call that enqueued device work
  starts a flow (`ph` "s", category `ac2g`, id = correlation) that ends (`ph` "f", binding
  point "e") at that work.
- NVTX ranges the program made while it was recorded (`nvtx` records), each on a track of
  its recorded thread (`tid` = thread id + 2^22, named "NVTX (thread N)"), placed on the replay's
  time axis by the calls they enclosed: a range opens where the first call made after it
  opened was replayed and closes where the last call made before it closed ended (a range that
  enclosed no call is an instant). push/pop ranges are complete events, start/end ranges
  async events (`ph` "b"/"e"), marks instant events; category `nvtx`, args `domain` and
  `recorded_dur_us`.
Metadata events name the processes ("GPU N", the recorded command) and threads.
Top level, as Kineto writes it: `distributedInfo` (the rank and world size; a rank of a job
replay knows its own, a single process is rank 0 of 1), `deviceProperties`, and
`baseTimeNanoseconds` (Unix time in ns of ts 0: ts * 1000 + base is the wall-clock time).
"""
from __future__ import annotations

import bisect
import gzip
import json
import os
import time
from typing import Any, Dict, Iterable, List, Optional, Tuple

from ..names import demangle

PID = 1                          # device pid when none is known (tests, the Python API)
TID_SPACE = 1 << 22              # above every Linux thread id (pid_max <= 2^22)
CATEGORY = {"kernel": "kernel", "copy": "gpu_memcpy", "memset": "gpu_memset", "graph": "cuda_graph"}


def _stream_name(stream: int) -> str:
    return ("default stream" if not stream else "per-thread default stream" if stream == 2 else
            "legacy stream" if stream == 1 else f"recorded stream {stream:#x}")


def _us(ns: float) -> float:
    return round(ns / 1e3, 3)


class _CallTimes:
    """Replay times of recorded calls, to place the recording's NVTX ranges: per recorded
    thread, the calls in recorded order (recorded enter/exit, replayed enter/exit)."""

    def __init__(self, calls: Iterable[list]):
        by: Dict[Any, List[Tuple[int, int, int, int]]] = {}
        for seq, _f, tid, rt0, rt1, t0, t1 in calls:
            if isinstance(rt0, int) and isinstance(t0, int) and isinstance(t1, int):
                by.setdefault(tid, []).append((rt0, rt1 if isinstance(rt1, int) else rt0, t0, t1))
        every = sorted(x for v in by.values() for x in v)
        self.by = {tid: self._index(sorted(v)) for tid, v in by.items()}
        self.every = self._index(every)

    @staticmethod
    def _index(rows):
        return ([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows],
                _running_max([r[1] for r in rows]))

    def _of(self, tid):
        ix = self.by.get(tid)
        return ix if ix is not None and ix[0] else self.every

    def opened(self, tid, t: int) -> Optional[int]:
        """Replay time where something recorded at t opens: the replay start of the first call
        that began at or after t (the end of the last call when none did)."""
        rt0, _rt1, t0, t1, _ = self._of(tid)
        if not rt0:
            return None
        i = bisect.bisect_left(rt0, t)
        return t0[i] if i < len(rt0) else t1[-1]

    def closed(self, tid, t: int) -> Optional[int]:
        """Replay time where something recorded at t closes: the replay end of the last call
        that ended at or before t (the start of the first call when none did)."""
        rt0, _rt1, t0, t1, rmax = self._of(tid)
        if not rt0:
            return None
        i = bisect.bisect_right(rmax, t) - 1           # calls ended by t (ends are not sorted: running max)
        return t1[i] if i >= 0 else t0[0]


def _running_max(v: List[int]) -> List[int]:
    out, m = [], None
    for x in v:
        m = x if m is None or x > m else m
        out.append(m)
    return out


def _nvtx_events(nvtx: Iterable[Dict[str, Any]], times: _CallTimes, pid: int, t0: int) -> List[Dict[str, Any]]:
    evs: List[Dict[str, Any]] = []
    ranges: List[Tuple[tuple, Dict[str, Any]]] = []   # push/pop ranges, put in opening order below
    stacks: Dict[Tuple[Any, Any], List[Dict[str, Any]]] = {}
    started: Dict[Any, Dict[str, Any]] = {}
    tracks: Dict[Any, int] = {}

    def track(tid) -> int:
        t = tracks.get(tid)
        if t is None:
            t = tracks[tid] = TID_SPACE + (tid if isinstance(tid, int) and 0 <= tid < TID_SPACE else len(tracks))
            evs.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": t, "args": {"name": f"NVTX (thread {tid})"}})
            evs.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": t, "args": {"sort_index": t}})
        return t

    for r in nvtx:
        op, tid, t = r.get("op"), r.get("tid"), r.get("t")
        if not isinstance(t, int):
            continue
        name = r.get("name") if isinstance(r.get("name"), str) else "(no message)"
        dom = r.get("domain")
        if op in ("push", "start"):
            at = times.opened(tid, t)
            if at is None:
                continue
            ent = {"name": name, "domain": dom, "at": at, "t": t, "tid": tid}
            if op == "push":
                st = stacks.setdefault((tid, dom), [])
                ent["depth"] = sum(len(v) for k, v in stacks.items() if k[0] == tid)
                st.append(ent)
            else:
                started[r.get("id")] = ent
        elif op in ("pop", "end"):
            st = stacks.get((tid, dom)) if op == "pop" else None
            ent = (st.pop() if st else None) if op == "pop" else started.pop(r.get("id"), None)
            if ent is None:
                continue
            end = times.closed(tid, t)
            end = max(end if end is not None else ent["at"], ent["at"])
            args = {"domain": ent["domain"], "recorded_dur_us": _us(t - ent["t"])}
            tk = track(ent["tid"])
            if op == "pop":
                ev = {"ph": "X", "cat": "nvtx", "name": ent["name"], "pid": pid, "tid": tk,
                      "ts": _us(ent["at"] - t0), "dur": _us(end - ent["at"]), "args": args}
                # an outer range first where two open at the same time (readers nest by order)
                ranges.append(((ev["ts"], -ev["dur"], ent["depth"], len(ranges)), ev))
            else:
                rid = f"nvtx{r.get('id')}"
                evs.append({"ph": "b", "cat": "nvtx", "name": ent["name"], "id": rid, "pid": pid, "tid": tk,
                            "ts": _us(ent["at"] - t0), "args": args})
                evs.append({"ph": "e", "cat": "nvtx", "name": ent["name"], "id": rid, "pid": pid, "tid": tk,
                            "ts": _us(end - t0)})
        elif op == "mark":
            at = times.opened(tid, t)
            if at is not None:
                evs.append({"ph": "i", "s": "t", "cat": "nvtx", "name": name, "pid": pid, "tid": track(tid),
                            "ts": _us(at - t0), "args": {"domain": dom}})
    return evs + [ev for _k, ev in sorted(ranges, key=lambda kv: kv[0])]


def trace_events(slices: List[Dict[str, Any]], title: str = "cudasnap replay", calls: Optional[List[list]] = None,
                 nvtx: Optional[Iterable[Dict[str, Any]]] = None, device: Optional[int] = None,
                 host_pid: Optional[int] = None, gpu: Optional[Dict[str, Any]] = None,
                 clock: str = "monotonic", rank: int = 0, world_size: int = 1,
                 unix_offset_ns: Optional[int] = None) -> Dict[str, Any]:
    """The trace (a JSON-able dict). slices: TimelineProfiler.slices (kind, seq, name, stream,
    start_ns, end_ns, ...); calls: TimelineProfiler.calls; nvtx: the recording's nvtx records;
    unix_offset_ns: Unix time minus the clock's time, for baseTimeNanoseconds (left out when None)."""
    timed = [s for s in slices if "start_ns" in s and "end_ns" in s]
    calls = [c for c in (calls or []) if isinstance(c[5], int) and isinstance(c[6], int)]
    starts = [s["start_ns"] for s in timed] + [c[5] for c in calls]
    t0 = min(starts, default=0)
    dev = PID if device is None else int(device)
    hpid = host_pid if isinstance(host_pid, int) and host_pid >= 0 else 0
    if hpid == dev or hpid < 64:
        hpid += TID_SPACE                         # a container's pid 1 must not pass for GPU 1
    evs: List[Dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": dev, "tid": 0, "args": {"name": f"GPU {dev}"}},
        {"ph": "M", "name": "process_labels", "pid": dev, "tid": 0,
         "args": {"labels": (gpu or {}).get("name") or f"GPU {dev}"}},
        {"ph": "M", "name": "process_sort_index", "pid": dev, "tid": 0, "args": {"sort_index": 5000000 + dev}},
    ]
    tids: Dict[Any, int] = {}
    device_ops: Dict[Any, Dict[str, Any]] = {}
    for s in timed:
        rec_stream = s.get("stream") or 0
        sid = s.get("stream_id")
        key = ("cupti", sid) if isinstance(sid, int) else ("rec", rec_stream)
        tid = tids.get(key)
        if tid is None:
            tid = sid if isinstance(sid, int) else len([k for k in tids if k[0] == "rec"]) + 1
            tids[key] = tid
            evs.append({"ph": "M", "name": "thread_name", "pid": dev, "tid": tid,
                        "args": {"name": f"stream {tid} ({_stream_name(rec_stream)})"}})
            evs.append({"ph": "M", "name": "thread_sort_index", "pid": dev, "tid": tid, "args": {"sort_index": tid}})
        kind = s.get("kind", "kernel")
        seq = s.get("seq")
        args: Dict[str, Any] = {"correlation": seq, "device": dev, "stream": tid, "seq": seq,
                                "recorded stream": f"{rec_stream:#x}" if isinstance(rec_stream, int) else rec_stream}
        if kind == "kernel":
            mangled = s.get("name") or "?"
            name = demangle(mangled) or mangled
            args.update({"grid": s.get("grid"), "block": s.get("block"), "shared memory": s.get("shmem"),
                         "mangled": mangled})
            if s.get("cupti_name") and s["cupti_name"] != mangled:
                args["cupti name"] = s["cupti_name"]
        elif kind == "graph":                 # a cuGraphLaunch timed whole (CUDA events)
            name = f"cuGraphLaunch #{seq}"
        elif kind == "memset":
            name = "Memset (Device)"
            args["bytes"] = s.get("bytes")
        else:
            name = f"Memcpy {s.get('direction') or ''}".rstrip()
            args["bytes"] = s.get("bytes")
        if s.get("graph_node_id") is not None:
            args["graph node"] = s["graph_node_id"]
        if kind != "kernel" and s.get("bytes") and s["end_ns"] > s["start_ns"]:
            args["memory bandwidth (GB/s)"] = round(s["bytes"] / (s["end_ns"] - s["start_ns"]), 3)
        ev = {"ph": "X", "cat": CATEGORY.get(kind, kind), "name": name, "pid": dev, "tid": tid,
              "ts": _us(s["start_ns"] - t0), "dur": _us(max(s["end_ns"] - s["start_ns"], 0)), "args": args}
        evs.append(ev)
        if seq is not None and seq not in device_ops:
            device_ops[seq] = ev
    if calls:
        evs.append({"ph": "M", "name": "process_name", "pid": hpid, "tid": 0, "args": {"name": title}})
        evs.append({"ph": "M", "name": "process_sort_index", "pid": hpid, "tid": 0, "args": {"sort_index": hpid}})
        threads = set()
        for seq, f, tid, _rt0, _rt1, c0, c1 in calls:
            ht = tid if isinstance(tid, int) and 0 <= tid < TID_SPACE else 0
            if ht not in threads:
                threads.add(ht)
                evs.append({"ph": "M", "name": "thread_name", "pid": hpid, "tid": ht,
                            "args": {"name": f"thread {ht} (recorded)"}})
            ev = {"ph": "X", "cat": "cuda_driver", "name": f, "pid": hpid, "tid": ht, "ts": _us(c0 - t0),
                  "dur": _us(max(c1 - c0, 0)), "args": {"correlation": seq, "seq": seq}}
            evs.append(ev)
            dv = device_ops.get(seq)
            if dv is not None:
                evs.append({"ph": "s", "id": seq, "pid": hpid, "tid": ht, "ts": ev["ts"], "cat": "ac2g", "name": "ac2g"})
                evs.append({"ph": "f", "id": seq, "pid": dv["pid"], "tid": dv["tid"], "ts": dv["ts"], "cat": "ac2g",
                            "name": "ac2g", "bp": "e"})
        if nvtx is not None:
            evs.extend(_nvtx_events(nvtx, _CallTimes(calls), hpid, t0))
    out: Dict[str, Any] = {"schemaVersion": 1, "traceName": title, "displayTimeUnit": "ms", "traceEvents": evs,
                           "otherData": {"tool": "cudasnap", "title": title, "clock": clock,
                                         "clock_origin_ns": t0},
                           "distributedInfo": {"rank": int(rank), "world_size": max(int(world_size), 1)}}
    if unix_offset_ns is not None:
        out["baseTimeNanoseconds"] = int(t0 + unix_offset_ns)
    if gpu:
        out["deviceProperties"] = [{"id": dev, **gpu}]
    return out


def _rank() -> Tuple[int, int]:
    """(rank, world size): a rank of a job replay is told by the coordinator's environment."""
    from ..group import ENV_NRANKS, ENV_RANK
    try:
        return int(os.environ.get(ENV_RANK, "0")), int(os.environ.get(ENV_NRANKS, "1"))
    except ValueError:
        return 0, 1


def _unix_offset(collector, cupti: bool) -> Optional[int]:
    """Unix time minus the trace clock's time, sampled side by side (best of 5 by the gap
    between the two Unix reads); None when the CUPTI clock cannot be read."""
    best = None
    for _ in range(5):
        try:
            a = time.time_ns()
            c = int(collector.timestamp()) if cupti else time.monotonic_ns()
            b = time.time_ns()
        except Exception:
            return None
        if best is None or b - a < best[0]:
            best = (b - a, (a + b) // 2 - c)
    return best[1] if best else None


def write_trace(prof, path: str, snapshot: str = "") -> None:
    rv = getattr(prof, "rv", None)
    nvtx = None
    host_pid = None
    gpu = None
    if rv is not None and rv.snapshot is not None:
        try:
            host_pid = rv.snapshot.header.get("pid")
            nvtx = list(rv.snapshot.records(("nvtx",)))
        except Exception:
            nvtx = None
        try:
            from .report import run_info
            g = (run_info(rv, None, None, snapshot) or {}).get("gpu") or {}
            gpu = {k: g[k] for k in ("name", "uuid") if g.get(k)}
            if g.get("cc"):
                gpu["computeMajor"], gpu["computeMinor"] = g["cc"][0], g["cc"][1]
        except Exception:
            gpu = None
    title = f"cudasnap replay {os.path.basename(snapshot)}".strip() if snapshot else "cudasnap replay"
    cupti = getattr(prof, "backend", None) == "cupti"
    rank, world = _rank()
    data = trace_events(getattr(prof, "slices", []), title, calls=getattr(prof, "calls", None), nvtx=nvtx,
                        device=getattr(prof, "device", None), host_pid=host_pid, gpu=gpu,
                        clock="cupti" if cupti else "monotonic", rank=rank, world_size=world,
                        unix_offset_ns=_unix_offset(getattr(prof, "cupti", None) if cupti else None, cupti))
    from cudasnap.formats.outputs import atomic_path
    opener = gzip.open if path.lower().endswith(".gz") else open
    with atomic_path(path) as tmp, opener(tmp, "wt") as f:
        json.dump(data, f)
