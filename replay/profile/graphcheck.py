"""Graph mode's check against timeline mode: the same snapshot and selection replayed once more
under `--profile timeline` (in a child process: a second replayer needs its own address space),
and the per-kernel medians of both compared (kernels of at least MIN_US in both)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, List

from .progress import PhaseProgress

MIN_US = 5.0
LIMIT_PCT = 5.0


def timeline_argv(snapshot, cfg, opts) -> List[str]:
    """`cudasnap replay` arguments that replay what this graph run replayed, under timeline."""
    argv = [sys.executable, "-m", "cudasnap", "replay", os.fspath(snapshot), "--profile", "timeline", "-q",
            "--device", str(opts.device)]
    for flag, v in (("--calls", cfg.calls), ("--kernels", cfg.kernels), ("-k", cfg.kernel_name),
                    ("-c", cfg.launch_count), ("--launch", cfg.launch), ("--devices", opts.devices),
                    ("--jit", opts.jit), ("--launch-override", opts.launch_override), ("--watchdog", opts.watchdog)):
        if v is not None:
            argv += [flag, str(v)]
    if cfg.kernel_name is not None:
        argv += ["--kernel-name-base", cfg.kernel_name_base]
    if cfg.launch_skip:
        argv += ["-s", str(cfg.launch_skip)]
    for r in opts.replace:
        argv.append(f"--replace={r}")
    return argv


def compare(graph_report: Dict[str, Any], timeline_report: Dict[str, Any]) -> Dict[str, Any]:
    from .report import compare_kernel_medians
    cmp = compare_kernel_medians(graph_report, timeline_report, MIN_US)
    out = [c for c in cmp if abs(c["diff_pct"]) > LIMIT_PCT]
    return {"min_us": MIN_US, "limit_pct": LIMIT_PCT, "compared": len(cmp), "outside": out,
            "within": not out if cmp else None}


def add_timeline_check(report: Dict[str, Any], snapshot, cfg, opts) -> None:
    """Runs the timeline replay and puts the comparison in report["summary"]["timeline_check"]
    (or a warning saying why there is none). Default: on when graph mode timed nodes by CUPTI."""
    s = report.setdefault("summary", {})
    on = cfg.timeline_check
    if on is None:
        on = s.get("backend") == "cupti" and bool(s.get("launches_timed") or s.get("graph_launches_timed"))
    if not on:
        return
    with tempfile.TemporaryDirectory(prefix="cudasnap-graphcheck-") as d:
        path = os.path.join(d, "timeline.json")
        argv = timeline_argv(snapshot, cfg, opts) + ["--out", path]
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
    s["timeline_check"] = c
