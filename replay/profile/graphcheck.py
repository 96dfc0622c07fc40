"""Graph mode's check against timeline mode: each kernel's median time in the graph against its
median as the replay ran it eagerly, kernels of at least MIN_US in both, those more than
LIMIT_PCT apart listed.

The reference comes from the same replay (TimelineReference): up to the last selected launch,
graph mode's replay is profiled as timeline mode profiles a replay (a TimelineProfiler that
sees the same events: CUPTI activity records, the launches the C executor ran matched in issue
order as in timeline mode; CUDA events around each launch without CUPTI).  It is closed before
graph mode builds its graph, so nothing of the graph's runs enters it, and the kernels it times
are the selected ones of the sequence.  No second replay.

Graph mode on the program's own graphs (recorded graph launches, graphunits.py) times them at
their cuGraphLaunch while the replay runs: its reference is a timeline replay of its own in a
child process (add_timeline_check)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

from ..child import command
from .progress import PhaseProgress

MIN_US = 5.0
LIMIT_PCT = 5.0
REFERENCE = "the graph's own replay, timed as timeline mode times it"
# the events a timeline profiler takes from the replay (before_call/after_call go to graph mode)
_FORWARD = frozenset({"before_launch", "after_launch", "batch", "before_copy", "copy", "before_graph_launch",
                      "graph_launch", "sync", "teardown"})


class TimelineReference:
    """Timeline profiling of graph mode's own replay, up to the sequence's last launch."""

    def __init__(self, cfg):
        from .timeline import TimelineProfiler
        self.messages: List[str] = []
        self.tl = TimelineProfiler(cfg, self.messages.append)
        self.rows: Optional[List[Dict[str, Any]]] = None     # after finish()
        self.seconds = 0.0                                    # finish()'s time

    @classmethod
    def start(cls, cfg, warn: Callable[[str], None], ev) -> Optional["TimelineReference"]:
        """On replay start.  None when the check is off: --no-timeline-check, or by default
        without CUPTI (CUDA events around every launch would slow the replay)."""
        if cfg.timeline_check is False:
            return None
        ref = cls(cfg)
        try:
            ref.tl.on_event("start", ev)
        except Exception as e:
            warn(f"graph: timeline check not available ({type(e).__name__}: {e})")
            return None
        if ref.tl.backend != "cupti" and cfg.timeline_check is None:
            ref.close()
            return None
        for m in ref.messages:
            warn(f"graph: timeline check: {m}")
        return ref

    @property
    def backend(self) -> str:
        return self.tl.backend

    @property
    def batch_ok(self) -> bool:
        return self.tl.batch_ok

    def on_event(self, kind: str, ev) -> None:
        if self.rows is None and kind in _FORWARD:
            self.tl.on_event(kind, ev)

    def finish(self, first_seq: Optional[int], last_seq: Optional[int]) -> List[Dict[str, Any]]:
        """Stop timing (all work so far waited for) and keep the kernel rows of the sequence."""
        if self.rows is not None:
            return self.rows
        t0 = time.monotonic()
        self.rows = []
        tl = self.tl
        try:
            if tl.rv is not None:
                tl.rv.call("cuCtxSynchronize")
            tl.on_event("teardown", None)        # CUDA events: resolved and released
            tl.on_event("end", None)             # CUPTI: flushed, closed, records matched to the launches
            lo = first_seq if first_seq is not None else -1
            hi = last_seq if last_seq is not None else -1
            for r in tl.launch_rows():
                s = r.get("seq")
                if r.get("time_us") is not None and isinstance(s, int) and lo <= s <= hi:
                    self.rows.append({"seq": s, "name": r.get("name"), "cupti_name": r.get("cupti_name"),
                                      "time_us": r["time_us"]})
        finally:
            tl.slices, tl.by_ext = [], {}
            self.seconds = time.monotonic() - t0
        return self.rows

    def close(self) -> None:
        """Stop without rows (the graph was never built): CUPTI released."""
        if self.rows is None:
            self.rows = []
            c = self.tl.cupti
            if c is not None:
                try:
                    c.close()
                except Exception:
                    pass


def compare(graph_report: Dict[str, Any], timeline_report: Dict[str, Any]) -> Dict[str, Any]:
    from .report import compare_kernel_medians
    cmp = compare_kernel_medians(graph_report, timeline_report, MIN_US)
    out = [c for c in cmp if abs(c["diff_pct"]) > LIMIT_PCT]
    return {"min_us": MIN_US, "limit_pct": LIMIT_PCT, "compared": len(cmp), "outside": out,
            "within": not out if cmp else None}


def reference_check(graph_rows: List[Dict[str, Any]], ref: TimelineReference) -> Dict[str, Any]:
    """The check of a captured sequence against its own replay's timeline rows."""
    c = compare({"launches": graph_rows}, {"launches": ref.rows or []})
    c["timeline_backend"] = ref.backend
    c["reference"] = REFERENCE
    c["reference_launches"] = len(ref.rows or [])
    return c


# ----------------------------------------------------------------------------- recorded graph launches
def timeline_document(snapshot, cfg, opts, out: str) -> Dict[str, Any]:
    """The replay that replays what this graph run replayed, under timeline, as a typed document
    (replay/invocation.py): the same selection, device, replacements and overrides."""
    import dataclasses
    o = dataclasses.replace(opts, quiet=True, progress=False)
    c = dataclasses.replace(cfg, mode="timeline", out=out, trace=None, hooks=[], html=None, timeline_check=None,
                            check_repeats=False, sections=[], metrics=None)
    return {"snapshot": os.fspath(snapshot), "replay": dataclasses.asdict(o), "profile": dataclasses.asdict(c)}


def add_timeline_check(report: Dict[str, Any], snapshot, cfg, opts) -> None:
    """Recorded graph launches (no captured sequence): a timeline replay in a child process and
    the comparison in report["summary"]["timeline_check"] (or a warning saying why there is
    none).  Default: on when CUPTI timed the graphs' kernels."""
    s = report.setdefault("summary", {})
    if s.get("path") != "recorded graph launches":
        return                                  # a captured sequence checks against its own replay
    on = cfg.timeline_check
    if on is None:
        on = s.get("backend") == "cupti" and bool(s.get("graph_launches_timed"))
    if not on:
        return
    with tempfile.TemporaryDirectory(prefix="cudasnap-graphcheck-") as d:
        path = os.path.join(d, "timeline.json")
        # a process of its own: this run's replay still holds the recorded addresses (its
        # replayer goes back to the caller open) and its CUPTI session; the reference needs both
        argv = command(sys.executable, timeline_document(snapshot, cfg, opts, path))
        prog = PhaseProgress("graph", opts.progress, opts.quiet)
        try:
            limit = max(600.0, 20 * opts.watchdog) if opts.watchdog else None   # the child has the watchdog too
            with prog.phase("checking against a timeline replay"):
                cp = subprocess.run(argv, capture_output=True, text=True, timeout=limit)
        except (OSError, subprocess.SubprocessError) as e:
            report.setdefault("warnings", []).append(f"timeline check not run: {type(e).__name__}: {e}")
            return
        finally:
            prog.close()
            s.setdefault("phases_s", {}).update({k: round(v, 3) for k, v in prog.times.items()})
        if cp.returncode != 0 or not os.path.exists(path):
            why = (cp.stderr or cp.stdout).strip().splitlines()[-1:] or [f"exit {cp.returncode}"]
            report.setdefault("warnings", []).append(f"timeline check failed (exit {cp.returncode}): {why[0]}")
            return
        with open(path) as f:
            tl = json.load(f)
    c = compare(report, tl)
    c["timeline_backend"] = (tl.get("summary") or {}).get("backend")
    c["reference"] = "a timeline replay in a second process"
    s["timeline_check"] = c
