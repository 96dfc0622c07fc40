"""Chrome trace / Perfetto JSON of a timeline replay (opens in ui.perfetto.dev and
chrome://tracing): one track per recorded stream, kernels and copies as complete ("X")
slices, times in microseconds from the first timed operation.  NVTX ranges recorded at
capture time would appear on a host track; current snapshots carry none."""
from __future__ import annotations

import json
from typing import Any, Dict, List

PID = 1


def _track(stream: int) -> str:
    return "default stream" if not stream else (f"per-thread default stream" if stream == 2 else
                                                 ("legacy stream" if stream == 1 else f"stream {stream:#x}"))


def trace_events(slices: List[Dict[str, Any]], title: str = "cudasnap replay") -> Dict[str, Any]:
    timed = [s for s in slices if "start_ns" in s and "end_ns" in s]
    t0 = min((s["start_ns"] for s in timed), default=0)
    tids: Dict[int, int] = {}
    evs: List[Dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "args": {"name": title}}]
    for s in timed:
        st = s.get("stream") or 0
        if st not in tids:
            tids[st] = len(tids) + 1
            evs.append({"ph": "M", "name": "thread_name", "pid": PID, "tid": tids[st], "args": {"name": _track(st)}})
            evs.append({"ph": "M", "name": "thread_sort_index", "pid": PID, "tid": tids[st],
                        "args": {"sort_index": tids[st]}})
        args = {k: s[k] for k in ("seq", "grid", "block", "shmem", "bytes", "call", "cupti_name") if k in s}
        evs.append({"ph": "X", "name": s.get("name") or "?", "cat": s.get("kind", "kernel"), "pid": PID,
                    "tid": tids[st], "ts": (s["start_ns"] - t0) / 1e3,
                    "dur": max(s["end_ns"] - s["start_ns"], 0) / 1e3, "args": args})
    return {"traceEvents": evs, "displayTimeUnit": "ns", "otherData": {"tool": "cudasnap", "title": title}}


def write_trace(prof, path: str, snapshot: str = "") -> None:
    data = trace_events(getattr(prof, "slices", []), f"cudasnap replay {snapshot}".strip())
    with open(path, "w") as f:
        json.dump(data, f)
