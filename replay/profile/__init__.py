"""Per-kernel profiling on replay (`cudasnap replay SNAPSHOT --profile MODE`).

Profilers are replay subscribers (replay/events.py); they never patch the engine.

- timeline  replay as recorded (asynchronous); kernel and copy times from CUPTI activity
            records (cupti-python) or, without CUPTI, CUDA events around each launch.
- isolated  each selected launch runs warmup + repeat more times, its memory restored to the
            pre-launch contents before every run (like Nsight Compute's kernel replay); kernel
            durations from CUPTI, CUDA events without it.
- graph     the selected launches (with the memsets and device copies between them) are
            stream-captured into one CUDA graph and replayed from the pre-sequence memory.
- metrics   hardware counters per launch (CUPTI's range profiler), Nsight Compute's sections
            (--section) or raw metric names (--metrics), each launch replayed from restored
            memory once per pass; occupancy and a roofline (metrics.py).

Selection (which launches are profiled; every call still runs), replay/selection.py:
-k/--kernel-name NAME|regex:RX on --kernel-name-base, -s/--launch-skip N, -c/--launch-count N
(as Nsight Compute), --kernels REGEX, --calls SET (call-set syntax of `dump`), --launch N (the
launch with call sequence number N).

Python API:

    from cudasnap.replay.profile import ProfileConfig, profile_replay
    run = profile_replay("x.cusnap", ProfileConfig(mode="isolated", repeat=20), hooks=[MyHook()])
    run.report["kernels"]     # per-kernel rows; run.report["launches"]: per-launch rows
    run.result.exit_code      # the replay's own verdict (verification still runs)
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from ..options import ReplayOptions, ReplayResult
from ..selection import LaunchSelection  # noqa: F401  (re-exported)
from ..selection import check as check_selection
from .common import Selection  # noqa: F401  (re-exported)

from .modes import MODES as _REGISTRY, mode as profile_mode

MODES = tuple(_REGISTRY)        # the modes, each described once in modes.py


@dataclass
class ProfileConfig:
    mode: Optional[str] = None          # timeline | isolated | graph | metrics | None (hooks/NVTX only)
    repeat: int = 10
    warmup: int = 3
    flush_l2: bool = True           # isolated: start every run from a flushed L2 (as ncu does)
    kernels: Optional[str] = None
    calls: Optional[str] = None
    launch: Optional[int] = None
    kernel_name: Optional[str] = None   # -k NAME | regex:RX (replay/selection.py)
    kernel_name_base: str = "function"
    launch_skip: int = 0
    launch_count: Optional[int] = None
    out: Optional[str] = None           # .json or .csv
    trace: Optional[str] = None         # Chrome trace JSON (timeline mode)
    hooks: List[str] = field(default_factory=list)
    nvtx: Optional[bool] = None         # None: on when an NVTX tool is attached (nsys, ncu)
    backend: str = "auto"               # auto | cupti | events (timing source of timeline/graph)
    check_repeats: bool = False         # isolated: hash written memory after every run
    top: int = 20
    save_limit: int = 256 << 20         # isolated/graph: save every live allocation when all fit
    timeline_check: Optional[bool] = None   # graph: also time the selection under timeline (None: with CUPTI)
    sections: List[str] = field(default_factory=list)   # metrics: Nsight Compute section names
    metrics: Optional[str] = None       # metrics: raw metric names, comma-separated
    html: Optional[str] = None          # metrics: roofline plot (HTML)


def check_config(cfg: ProfileConfig) -> Optional[str]:
    """An error message for a bad configuration, or None."""
    if cfg.mode is not None and cfg.mode not in MODES:
        return f"--profile must be one of {', '.join(MODES)}"
    if cfg.repeat < 1:
        return "--repeat must be >= 1"
    if cfg.warmup < 0:
        return "--warmup must be >= 0"
    if cfg.backend not in ("auto", "cupti", "events"):
        return "backend must be auto, cupti or events"
    if cfg.out and not cfg.out.lower().endswith((".json", ".csv")):
        return "--out must name a .json or .csv file"
    if cfg.trace and cfg.mode != "timeline":
        return "--trace needs --profile timeline"
    if cfg.trace and not cfg.trace.lower().endswith((".json", ".json.gz")):
        return "--trace must name a .json or .json.gz file"
    if (cfg.sections or cfg.metrics or cfg.html) and cfg.mode != "metrics":
        return "--section, --metrics and --html need --profile metrics"
    if cfg.mode == "metrics":
        from .metrics_sections import check as check_metrics
        bad = check_metrics(cfg.sections, cfg.metrics)
        if bad:
            return bad
        if cfg.html and not cfg.html.lower().endswith((".html", ".htm")):
            return "--html must name a .html file"
    return check_selection(cfg.kernels, cfg.calls, cfg.kernel_name, cfg.kernel_name_base or "function",
                           cfg.launch_skip or 0, cfg.launch_count)


def make_profiler(cfg: ProfileConfig, warn: Callable[[str], None]):
    m = profile_mode(cfg.mode)
    return m.profiler(cfg, warn) if m is not None else None


def _since_process_start() -> Optional[float]:
    """Seconds since this process started (Linux), None elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
        return max(0.0, up - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


_replays_here = 0          # profiled replays this process has run (a kept worker runs many)


def phase_timings(res, t_entry: float, report_s: Optional[float] = None) -> Dict[str, Optional[float]]:
    """Where a profiled replay's wall time went, in seconds: process start to the profile's
    start (interpreter, imports; a process's first replay only), reading and planning (with its
    prescan, the architecture check: a new process's cuInit, the driver's load and the profiler's
    start), the driver's start-up (cuInit, then the placement reservation), the loop up to the
    first launch (contexts, modules, memory), the launches to the loop's end (profiling
    included), and what followed until the report (the end-state check, the profiler's end:
    CUPTI's records read, the report built). loop.FAMILY:
    the calls replayed one by one, by handler family (module loads, contexts, memory and its
    staging, launches); count.*: modules loaded and their bytes, allocated and H2D bytes, and
    whether the plan was reused (made by a kept worker's earlier replay, or a warm server ahead)."""
    global _replays_here
    def span(a, b):
        return round(b - a, 4) if isinstance(a, (int, float)) and isinstance(b, (int, float)) else None
    now = time.monotonic()
    since = _since_process_start() if _replays_here == 0 else None
    _replays_here += 1
    ls, le, fl = res.loop_start_mono, res.loop_end_mono, res.first_launch_mono
    ph = res.phases or {}
    out = {"to_start": round(since - (now - t_entry), 4) if since is not None else None,
           "read_and_plan": span(t_entry, ls), "driver_init": res.init_s,
           "to_first_launch": span(ls, fl), "launches": span(fl, le), "after_loop": span(le, now),
           **{f"read_and_plan.{k}": v for k, v in (res.startup_s or {}).items()}}
    if isinstance(ph.get("cuinit"), float):
        out["driver_init.cuinit"] = ph["cuinit"]
        if isinstance(res.init_s, float):
            out["driver_init.placement"] = round(max(0.0, res.init_s - ph["cuinit"]), 4)
    for k in ("end_state", "profile_end"):
        if isinstance(ph.get(k), float):
            out[f"after_loop.{k}"] = ph[k]
    if report_s is not None:
        out["after_loop.report"] = round(report_s, 4)
    for k, v in sorted(ph.items()):
        if k.startswith("calls."):
            out["loop." + k[6:]] = round(v, 4)
        elif k.startswith("count."):
            out[k] = v
    return out


@dataclass
class ProfileRun:
    result: ReplayResult
    report: Optional[Dict[str, Any]]
    replayer: Any
    warnings: List[str]
    hooks: List[Any]
    written: List[Any] = None             # (what, path) of each output written


def profile_replay(snapshot, cfg: ProfileConfig, options: Optional[ReplayOptions] = None, driver=None,
                   hooks: Optional[List[Any]] = None, out=None) -> ProfileRun:
    """Replay `snapshot` with the profiler of cfg.mode, hooks (objects, or 'module:object'
    specs) and NVTX ranges.  Writes cfg.out and cfg.trace when set."""
    from ..engine import Replayer
    from ..hooks import HookAdapter, load_hook
    t_entry = time.monotonic()
    err = check_config(cfg)
    if err:
        raise ValueError(err)
    opts = options or ReplayOptions()
    rp = Replayer(snapshot, opts, driver=driver, out=out)
    from .. import arch_check                 # as a plain replay: refused before the GPU does anything
    rp.preflight = arch_check(opts, out or sys.stdout, sys.stderr)
    override = None
    if opts.launch_override:      # before the profiler: it times the launches as overridden
        from ..override import LaunchOverride
        override = LaunchOverride(opts.launch_override)
        rp.subscribers.append(override)
    warnings: List[str] = []

    def warn(msg: str) -> None:
        warnings.append(msg)
        rp.view.warn(msg)

    nv = cfg.nvtx
    if nv is None:
        nv = bool(os.environ.get("NVTX_INJECTION64_PATH") or os.environ.get("NSYS_PROFILING_SESSION_ID"))
    if nv:
        from .nvtx import NvtxEmitter
        rp.subscribers.append(NvtxEmitter(warn))
    hook_objs = [load_hook(h) if isinstance(h, str) else h for h in list(cfg.hooks) + list(hooks or [])]
    for h in hook_objs:
        rp.subscribers.append(HookAdapter(h, warn))
    prof = make_profiler(cfg, warn)
    if prof is not None:
        rp.subscribers.append(prof)
    res = rp.run()
    sel = getattr(prof, "sel", None)
    # a rank of a job may hold none of the launches the job's selection names
    from ..group import ENV_RANK
    in_job = bool(os.environ.get(ENV_RANK))
    why = sel.nothing(rp.view) if sel is not None and rp.view.snapshot is not None and not res.errors and not in_job else None
    if why:                               # a profile of nothing is no profile: nothing is written
        rp.empty_selection = why
        res.errors.append(why)
        res.exit_code = 2
    report = None
    written = []
    if prof is not None and not rp.refused:
        from .report import build_report, write_out
        t_report = time.monotonic()
        report = build_report(prof, cfg)
        if hasattr(prof, "finish_report"):
            prof.finish_report(report)
        report["snapshot"] = os.fspath(snapshot)
        report["warnings"] = list(dict.fromkeys(warnings))
        try:
            from .report import run_info
            report["run"] = run_info(rp.view, cfg, opts, snapshot)
            report["run"]["exit_code"] = res.exit_code
            report["run"]["numerics"] = res.numerics
            # the report: its rows and kernels built, the run's facts (written after this)
            report["run"]["timings_s"] = phase_timings(res, t_entry, time.monotonic() - t_report)
            if override is not None:
                report["run"]["launch_override"] = override.summary()
        except Exception as e:  # facts for comparisons; never a reason to lose the profile
            report["warnings"].append(f"run facts unavailable: {type(e).__name__}: {e}")
        failure = profile_failure(report, cfg)
        if failure and res.exit_code == 0:     # replayed, but the profile asked for was not taken
            warn(failure)
            report["warnings"] = list(dict.fromkeys(warnings))
            res.errors.append(failure)
            res.exit_code = 2
            report.setdefault("run", {})["exit_code"] = 2
        if cfg.mode == "graph" and report.get("launches") and res.exit_code == 0:
            from .graphcheck import add_timeline_check      # recorded graph launches only: a captured
            add_timeline_check(report, snapshot, cfg, opts)  # sequence checked against its own replay
        taken = not why and not failure       # a profile not taken (exit 2) leaves no file claiming one
        if cfg.out and taken:
            profile_mode(cfg.mode).write_out(report, cfg.out)
            written.append(("profile", cfg.out))
        if cfg.html and taken:
            from .roofline import write_html
            write_html(report, cfg.html)
            written.append(("roofline", cfg.html))
        if cfg.trace and taken:
            from .trace import write_trace
            write_trace(prof, cfg.trace, os.fspath(snapshot))
            written.append(("trace", cfg.trace))
    return ProfileRun(res, report, rp, warnings, hook_objs, written)


def profile_failure(report: Dict[str, Any], cfg: ProfileConfig) -> Optional[str]:
    """Why the profile this run asked for was not taken, or None: a profiler's own error, or
    graph mode that timed none of its launches per node (exit 2: a profile of nothing is no
    profile, even when the replay verified)."""
    s = report.get("summary") or {}
    if s.get("error"):
        return f"{cfg.mode}: {s['error']}"
    if cfg.mode == "graph" and s.get("path") != "recorded graph launches":
        n = s.get("launches") or 0
        if n and not s.get("launches_timed"):
            why = next((w for w in report.get("warnings") or [] if w.startswith("graph")), None)
            return (f"graph: none of the {n} launches in the graph got a per-node time"
                    + (f" ({why})" if why else "") + (f"; {s['hint']}" if s.get("hint") else ""))
    return None


def run_profile_cli(snapshot, opts: ReplayOptions, cfg: ProfileConfig, as_json: bool = False, out=None,
                    checked: bool = False, driver=None) -> int:
    """`cudasnap replay --profile/--hook/...`: replay, print the replay summary and the profile table.
    checked: the caller has run the preflight check on this snapshot (a campaign's replay server)."""
    import json
    from cudasnap.formats import SnapshotError
    from ..preflight import damaged, snapshot_problem
    from ..summary import json_document, render
    out = out or sys.stdout
    err = check_config(cfg)
    if err:
        sys.stderr.write(f"cudasnap: error: {err}\n")
        return 2
    problem = None if checked else snapshot_problem(snapshot)
    if problem:
        sys.stderr.write(f"cudasnap: error: {problem}\n")
        return 2
    doc = json_document() if as_json and out is sys.stdout else out
    try:
        run = profile_replay(snapshot, cfg, opts, driver=driver, out=out)
    except Exception as e:  # a hook that cannot be loaded, a damaged frame after the first call
        sys.stderr.write(f"cudasnap: error: {damaged(e) if isinstance(e, SnapshotError) else e}\n")
        return 2
    res = run.result
    if run.replayer.refused:                  # said on stderr; nothing was replayed
        return 2
    if run.replayer.empty_selection:
        sys.stderr.write(f"cudasnap: error: {run.replayer.empty_selection}\n")
        return 2
    if as_json:
        d = res.to_dict()
        d["snapshot"] = os.fspath(snapshot)
        d["mismatch_text"] = run.replayer.ctx.mismatch_text
        d["profile"] = run.report
        doc.write(json.dumps(d, indent=2, default=str) + "\n")
        doc.flush()
        _exit_if_gpu_hung(run, res.exit_code, out)
        return res.exit_code
    if not opts.quiet:
        render(res, run.replayer.ctx.mismatch_text, os.fspath(snapshot), out, False)
    elif res.exit_code:
        for e in (res.errors or run.replayer.ctx.mismatch_text)[:1]:
            sys.stderr.write(f"cudasnap: {e}\n")
    if run.report is not None:
        profile_mode(cfg.mode).render_table(run.report, out, cfg.top)
        for what, p in run.written or ():
            out.write(f"{what} written to {p}\n")
    _exit_if_gpu_hung(run, res.exit_code, out)
    return res.exit_code


def _exit_if_gpu_hung(run: ProfileRun, code: int, out) -> None:
    """A graph run that never finished keeps the GPU busy: interpreter shutdown (context
    teardown) would wait for it.  Results are written; leave now."""
    if run.report and (run.report.get("summary") or {}).get("hung"):
        for f in (out, sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:
                pass
        os._exit(code or 2)
