"""The `cudasnap` command line. Each command's work lives in its part; this file only wires."""
from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any, Dict, List, Optional, Type

import os
import sys

import typer
from cudasnap.formats.limits import MAX_RUNS
from cudasnap.typer_base import Command, Group, Inert, fail, help_width, needs


_Command, _fail = Command, fail


app = typer.Typer(
    cls=Group,
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,          # plain help: no boxes, no <bool> type column, fine in a pipe
    help="CUDA snapshot-and-replay: capture a workload's driver calls, inspect, replay, verify.",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100,
                      "terminal_width": help_width()},
)


class Placement(str, Enum):
    region = "region"
    off = "off"


class Drain(str, Enum):
    lazy = "lazy"
    eager = "eager"


class Trigger(str, Enum):
    sticky = "sticky"
    any = "any"


class DumpFormat(str, Enum):
    text = "text"
    jsonl = "jsonl"


class ApiStatus(str, Enum):
    replay = "replay"
    record = "record"
    refused = "refused"


def _numerics(dtype: List[str], rtol: float, atol: float, tolerance: Optional[str], exact: bool,
              recheck: Optional[bool] = None) -> Dict[str, Any]:
    """The ReplayOptions fields of --dtype/--tolerance/--exact/--rtol/--atol/--recheck."""
    every = [d for d in dtype if "=" not in d]
    return dict(rtol=rtol, atol=atol, dtype=every[-1] if every else None, dtype_for=[d for d in dtype if "=" in d],
                tolerance=tolerance, exact=exact, recheck=recheck)


class ProfileMode(str, Enum):
    timeline = "timeline"
    isolated = "isolated"
    graph = "graph"
    metrics = "metrics"


class NameBase(str, Enum):
    function = "function"
    demangled = "demangled"
    mangled = "mangled"


class ProfilerRange(str, Enum):
    recorded = "recorded"
    workload = "workload"


class Pace(str, Enum):
    fast = "fast"
    recorded = "recorded"


class StatsReport(str, Enum):
    api = "api"
    kernels = "kernels"
    memory = "memory"


class ExtractMemory(str, Enum):
    reachable = "reachable"
    all = "all"


class ExtractRanges(str, Enum):
    exact = "exact"
    segment = "segment"


class ExtractSass(str, Enum):
    device = "device"
    all = "all"


class StatsFormat(str, Enum):
    text = "text"
    csv = "csv"
    json = "json"


def _one_of(choices: Type[Enum]) -> str:
    """The metavar of a choice option: its values, as --help lists them and the parser checks."""
    return "|".join(c.value for c in choices)


def _value(v):
    return v.value if isinstance(v, Enum) else v


_FORCE_HELP = "Replace an existing output (by default refused, before any work)."


def _check_outputs(force: bool, inputs, *outs) -> None:
    """Refuse an output before any work starts: the rule of formats/outputs.py, one line, exit 2.
    outs: (path or None, "file" | "dir", what)."""
    from cudasnap.formats.outputs import OutputError, check_output
    seen = {}
    for path, kind, what in outs:
        if path is None:
            continue
        try:
            a = check_output(path, force, kind, inputs, what)
        except OutputError as e:
            _fail(str(e))
        if a in seen:
            _fail(f"{what} {path} is also {seen[a]}: give each output its own file")
        seen[a] = what


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("cudasnap")
    except PackageNotFoundError:
        from cudasnap import __version__ as v
    try:
        from cudasnap.shim.description import load

        cv = load().doc.get("cuda_version")
        if isinstance(cv, int) and cv > 0:
            return f"cudasnap {v} (driver API description: CUDA {cv // 1000}.{cv % 1000 // 10})"
    except Exception:           # the version alone is still the answer
        pass
    return f"cudasnap {v}"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(_version())
        raise typer.Exit(0)


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                 help="Print the version and exit."),
) -> None:
    pass


def _is(name: str, *values):
    """params -> whether option `name` holds one of values (enum or text)."""
    return lambda p: _value(p.get(name)) in values


_FLIGHT = lambda p: p.get("flight_recorder") is not None  # noqa: E731


@app.command(cls=_Command, context_settings={"allow_interspersed_args": False})
@needs(Inert("context", "without --window kernel:REGEX", lambda p: (p.get("window") or "").startswith("kernel:"),
             "give --window kernel:REGEX[#K] too, or leave --context out"),
       Inert("trigger", "without --flight-recorder", _FLIGHT, "give --flight-recorder too, or leave --trigger out"),
       Inert("hang_timeout", "without --flight-recorder", _FLIGHT,
             "give --flight-recorder too, or leave --hang-timeout out"),
       Inert("keep_ptx", "with --window or --flight-recorder (their snapshots keep no PTX)",
             lambda p: p.get("window") is None and p.get("flight_recorder") is None, "leave --keep-ptx out"))
def capture(
    command: List[str] = typer.Argument(..., metavar="COMMAND", help="The program and its arguments, after --."),
    output: Optional[str] = typer.Option(None, "-o", "--output", metavar="PATH", help="Snapshot path (default ./PROGRAM.cusnap; other processes get STEM.PID.cusnap beside it). Expands %p (the program's pid), %h (host name), %q{VAR} (environment variable VAR), %% (a %)."),
    force: bool = typer.Option(False, "-f", "--force-overwrite", help="Replace an existing snapshot (by default an existing file is refused before the program starts)."),
    ring_mb: int = typer.Option(256, "--ring-mb", metavar="MIB", min=1, max=65536, help="Shared-memory ring per process, MiB (a larger ring absorbs bursts)."),
    level: int = typer.Option(3, "--level", metavar="N", min=1, max=22, help="zstd compression level: 1 fastest .. 22 smallest (20-22 need much more memory)."),
    threads: Optional[int] = typer.Option(None, "--threads", metavar="N", min=0, help="Compression/writing threads per process (default: half the CPUs, at most 8)."),
    placement: Placement = typer.Option(Placement.region, "--placement", metavar=_one_of(Placement), help="region: put device allocations in a tool-owned address zone so replay can place them exactly (VMM memory); off: leave addresses to the driver."),
    all_queries: bool = typer.Option(False, "--all-queries", help="Record every pure query (cuCtxGetDevice...); by default a repeat identical to the thread's last recorded one is only counted."),
    copy_threads: Optional[int] = typer.Option(None, "--copy-threads", metavar="N", min=0, max=32, help="Helper threads in the program that digest and copy payloads of 8 MiB or more (default: half the CPUs, at most 8; 0: the calling thread alone)."),
    segments: int = typer.Option(8, "--segments", metavar="N", min=0, max=16, help="Side files that large payload chunks spill into while the snapshot file is busy, folded into it when the process ends (one file takes 3-4 GB/s of buffered writes, several in parallel far more); 0: write everything into the snapshot file."),
    drain: Drain = typer.Option(Drain.lazy, "--drain", metavar=_one_of(Drain), help="lazy: the recorder leaves records in the ring until it is a quarter full, 5 s pass or the process exits, so its work does not run beside the program's; eager: drain continuously (the snapshot file keeps up with the program)."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No summary lines."),
    window: Optional[str] = typer.Option(None, "--window", metavar="SPEC", help="Record only inside a window, with the state it needs at its start: launches:A-B (launch numbers from 0), nvtx:NAME[#K], kernel:REGEX[#K] (with --context N launches after it), profiler (cuProfilerStart..Stop), time:S-E (seconds), signal (SIGUSR1 to cudasnap opens and closes). Window N is written to STEM.wN.cusnap."),
    context: int = typer.Option(0, "--context", metavar="N", min=0, help="--window kernel: N more launches after the matching one."),
    flight_recorder: Optional[float] = typer.Option(None, "--flight-recorder", metavar="SECONDS", min=0.1, help="Keep the last SECONDS (default 60) replayable through checkpoints; write the snapshot only on a trigger (an error per --trigger, death by a signal, --hang-timeout, SIGUSR2 to cudasnap)."),
    trigger: Trigger = typer.Option(Trigger.sticky, "--trigger", metavar=_one_of(Trigger), help="--flight-recorder: the errors that write the snapshot: sticky (errors that poison the context, such as an illegal address) or any."),
    hang_timeout: Optional[float] = typer.Option(None, "--hang-timeout", metavar="S", min=0.1, help="--flight-recorder: write the snapshot when a synchronization makes no progress for S seconds."),
    keep_ptx: Optional[str] = typer.Option(None, "--keep-ptx", metavar="xla[=DIR]", help="Ask a JIT compiler to keep its PTX and record it with each cubin it loads, for the simulator: xla (JAX) appends --xla_dump_to to XLA_FLAGS (DIR, else a directory removed after; a dump XLA_FLAGS already names is used). Says how many cubins got their PTX. Triton's is kept without asking."),
):
    """Run COMMAND with the shim preloaded; a snapshot for each process that used CUDA.

    Signals INT, TERM, HUP, QUIT, USR1 and USR2 sent to cudasnap are forwarded to the program.

    Exit: the program's own status (killed by a signal, cudasnap dies of the same signal); 2
    when the snapshot cannot be written or exists (checked before the program starts) or, the
    program having succeeded, was not saved completely; 126 when COMMAND is found but cannot
    run (a directory, not executable, not a program) and 127 when it is not found, as a shell."""
    from cudasnap.capture.runner import run_capture
    from cudasnap.capture.window import parse_window_spec

    win = None
    if window is not None and flight_recorder is not None:
        _fail("--window and --flight-recorder exclude each other")
    if window is not None:
        try:
            win = parse_window_spec(window)
        except ValueError as e:
            _fail(str(e))
        win["context"] = context
    elif flight_recorder is not None:
        win = {"mode": "flight", "spec": f"flight-recorder={flight_recorder:g}", "period": flight_recorder,
               "trigger": _value(trigger), "hang_timeout": hang_timeout}
    keep = None
    if keep_ptx is not None:
        what, eq, where = keep_ptx.partition("=")
        if what != "xla" or (eq and not where):
            _fail(f"--keep-ptx takes xla or xla=DIR, not {keep_ptx!r}")
        if where and os.path.exists(where) and not os.path.isdir(where):
            _fail(f"--keep-ptx {keep_ptx}: {where} is not a directory")
        keep = {"xla": where or None}
    raise typer.Exit(run_capture(list(command), output, ring_mb, level, threads, quiet, _value(placement),
                                 all_queries=all_queries, copy_threads=copy_threads, drain=_value(drain),
                                 segments=segments, force=force, window=win, keep_ptx=keep))


@app.command(cls=_Command)
@needs(Inert("timeline", "without --sim", lambda p: bool(p.get("sim")), "add --sim or leave --timeline out"))
def info(
    snapshot: Path = typer.Argument(..., metavar="SNAPSHOT", help="A .cusnap file."),
    json_out: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
    sim: bool = typer.Option(False, "--sim", help="Simulator coverage instead: which kernels can run on GPGPU-Sim (`replay --sim`) and why the others cannot; no simulator build needed."),
    timeline: Optional[Path] = typer.Option(None, "--timeline", metavar="P.json", help="With --sim: a GPU profile of this snapshot (`replay --profile timeline --out P.json`) for each kernel's share of GPU time."),
):
    """Summarize a snapshot: process, GPU, calls, kernels, memory, modules, blobs (a job's
    group manifest: its ranks and links)."""
    from cudasnap.formats.group import is_manifest
    if sim:
        if is_manifest(snapshot):
            _fail(f"{snapshot}: --sim reads one process's snapshot; give a rank's .cusnap")
        from cudasnap.replay.sim.coverage import run_coverage_cli
        raise typer.Exit(run_coverage_cli(snapshot, str(timeline) if timeline else None, json_out))
    if is_manifest(snapshot):
        from cudasnap.formats.group import run_info_group
        raise typer.Exit(run_info_group(snapshot, json_out))
    from cudasnap.inspect_cmds import run_info

    raise typer.Exit(run_info(snapshot, json_out))


@app.command(cls=_Command)
def dump(
    snapshot: Path = typer.Argument(..., metavar="SNAPSHOT", help="A .cusnap file."),
    calls: Optional[str] = typer.Option(
        None, "--calls", metavar="SET", help="Call set: '100-200', '5,7,9-', 'launches', 'memcpy', a kernel or API name; join with ','."
    ),
    fmt: DumpFormat = typer.Option(DumpFormat.text, "--format", metavar=_one_of(DumpFormat), help="text or jsonl."),
    blobs: bool = typer.Option(False, "--blobs", help="Show blob contents (hex preview) instead of references."),
):
    """Print every record (or a selected set) of a snapshot."""
    from cudasnap.inspect_cmds import run_dump

    raise typer.Exit(run_dump(snapshot, calls, _value(fmt), blobs))


@app.command(cls=_Command)
def repair(
    snapshot: Path = typer.Argument(..., metavar="SNAPSHOT", help="A .cusnap file: truncated, left without an index or damaged."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", metavar="PATH", help="Write here instead of in place (never onto SNAPSHOT itself; an existing file only with -f)."),
    force: bool = typer.Option(False, "-f", "--force-overwrite", help=_FORCE_HELP),
):
    """Rewrite a damaged snapshot with an index, keeping every frame that still reads.

    Steps over damaged stretches (reporting each), folds in segment files, keeps the file mode
    and, in place, the original as SNAPSHOT.orig; an intact snapshot is left alone.
    Exit 0: repaired or intact; 2: unreadable (no preamble or header) or not writable."""
    from cudasnap.inspect_cmds import run_repair

    raise typer.Exit(run_repair(snapshot, output, force))


@app.command(cls=_Command)
@needs(Inert("kernel_metrics", "without --out", lambda p: p.get("out") is not None,
             "give --out FILE.sqlite or DIR/ too, or leave --kernel-metrics out"),
       Inert("force", "without --out", lambda p: p.get("out") is not None, warn=True))
def stats(
    snapshot: Path = typer.Argument(..., metavar="SNAPSHOT", help="A .cusnap file."),
    fmt: StatsFormat = typer.Option(StatsFormat.text, "--format", metavar=_one_of(StatsFormat), help="text: tables; csv: one CSV block per report, each after a '# REPORT' line; json."),
    report: List[StatsReport] = typer.Option([], "--report", metavar=_one_of(StatsReport), help="Only these reports (repeatable; default all): api (per entry point), kernels (per kernel), memory (copies and memsets by kind)."),
    out: Optional[str] = typer.Option(None, "--out", metavar="FILE.sqlite|DIR/", help="Also export the calls as tables named as nsys names them (CUPTI_ACTIVITY_KIND_KERNEL, _MEMCPY, _MEMSET, _RUNTIME, StringIds): into an SQLite file, or one CSV per table into a directory."),
    force: bool = typer.Option(False, "-f", "--force-overwrite", help="Replace an existing FILE.sqlite, or write into a non-empty DIR/ (by default refused, before any work)."),
    kernel_metrics: Optional[Path] = typer.Option(None, "--kernel-metrics", metavar="PROFILE.json", help="With --out: add the table CUDASNAP_KERNEL_METRICS from a `replay --profile metrics --out PROFILE.json` of this snapshot (one row per launch and metric; correlationId joins the kernel rows)."),
):
    """Summarize a snapshot's calls, as `nsys stats` does: API time per entry point, launches per
    kernel, memory traffic by kind.

    Times are the host times of the recorded calls (enter to exit); device times come from a
    replay: `cudasnap replay SNAPSHOT --profile timeline --out FILE.csv`. Exit 0; 2: unreadable
    snapshot or export."""
    from cudasnap.stats import run_stats

    raise typer.Exit(run_stats(snapshot, _value(fmt), out, [_value(r) for r in report] or None, force,
                               str(kernel_metrics) if kernel_metrics else None))


@app.command(cls=_Command)
def api(
    status: Optional[ApiStatus] = typer.Option(None, "--status", metavar=_one_of(ApiStatus), help="Only: replay, record, refused."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """List every driver entry point and whether it is recorded, replayable or refused."""
    from cudasnap.api_cmd import run_api

    raise typer.Exit(run_api(_value(status), json_out))


def _mode_has(flag: str):
    """params -> whether --profile's mode has this flag (replay/profile/modes.py, read when checked)."""
    def check(p) -> bool:
        from cudasnap.replay.profile.modes import mode
        m = mode(_value(p.get("profile")))
        return bool(m is not None and getattr(m, flag))
    return check


_TIMED_RUNS = _mode_has("repeats")


@app.command(cls=_Command)
@needs(Inert("repeat", "without --profile isolated or graph", _TIMED_RUNS),
       Inert("warmup", "without --profile isolated or graph", _TIMED_RUNS),
       Inert("flush_l2", "without --profile isolated or metrics", _is("profile", "isolated", "metrics")),
       Inert("check_repeats", "without --profile isolated or graph", _TIMED_RUNS),
       Inert("timeline_check", "without --profile graph", _is("profile", "graph")),
       Inert("section", "without --profile metrics", _is("profile", "metrics")),
       Inert("metrics", "without --profile metrics", _is("profile", "metrics")),
       Inert("html", "without --profile metrics", _is("profile", "metrics")),
       Inert("kernel_name_base", "without -k/--kernel-name", lambda p: p.get("kernel_name") is not None),
       Inert("force", "without --out, --trace or --html",
             lambda p: any(p.get(k) is not None for k in ("out_file", "trace", "html")), warn=True))
def replay(
    ctx: typer.Context,
    snapshot: List[Path] = typer.Argument(..., metavar="SNAPSHOT", help="A .cusnap file; or a job: its group manifest, or all its snapshots (one replayer per rank, together)."),
    device: int = typer.Option(0, "--device", metavar="N", min=0, help="GPU ordinal to replay on."),
    devices: Optional[str] = typer.Option(None, "--devices", metavar="N,N,...", help="A job: the GPU of each rank, in rank order (default: each rank's recorded GPU). One snapshot that drove several GPUs: the GPU of each recorded device (default: the same ordinals when present, else all on --device)."),
    calls: Optional[str] = typer.Option(None, "--calls", metavar="SET", help="Only these launches/copies (call-set syntax as in dump); state-building calls always run."),
    kernels: Optional[str] = typer.Option(None, "--kernels", metavar="REGEX", help="Only launches of kernels whose recorded (mangled) name this regex finds."),
    kernel_name: Optional[str] = typer.Option(None, "-k", "--kernel-name", metavar="NAME|regex:RX", help="Only launches of this kernel, as Nsight Compute's -k: NAME matches the name in --kernel-name-base exactly; regex:RX searches it."),
    kernel_name_base: NameBase = typer.Option(NameBase.function, "--kernel-name-base", metavar=_one_of(NameBase), help="What -k matches: function (the bare function name, as ncu's default), demangled (the full C++ name) or mangled (as recorded)."),
    launch_skip: int = typer.Option(0, "-s", "--launch-skip", metavar="N", min=0, help="Skip the first N launches that pass the filters (counted in recorded order, as ncu's -s)."),
    launch_count: Optional[int] = typer.Option(None, "-c", "--launch-count", metavar="N", min=1, help="Select at most N launches that pass the filters (after --launch-skip, as ncu's -c)."),
    rtol: float = typer.Option(0.0, "--rtol", metavar="F", min=0.0, help="Relative tolerance for D2H verification (as --tolerance rtol=F)."),
    atol: float = typer.Option(0.0, "--atol", metavar="F", min=0.0, help="Absolute tolerance for D2H verification (as --tolerance atol=F)."),
    dtype: List[str] = typer.Option([], "--dtype", metavar="[CALL=|KERNEL=]TYPE", help="Element type of D2H results (f32, f16, bf16, f64, int): of all, of call number CALL, or of buffers last written by a kernel whose name KERNEL (a regex) finds. Repeatable. Default: read from the writing kernel's PTX stores; unknown and int are compared bit for bit."),
    tolerance: Optional[str] = typer.Option(None, "--tolerance", metavar="TOL", help="When a float result is CLOSE enough to pass: exact, torch (torch.testing's per-type rtol/atol), rtol=R,atol=A or ulp:N. Default: bit-exact for the same kernels on a GPU; torch for a simulator, swapped-in kernels (--replace) and PTX JIT. CUDASNAP_TOLERANCE sets it too."),
    exact: bool = typer.Option(False, "--exact", help="Bit-exact results whatever the target (a CLOSE result fails)."),
    recheck: Optional[bool] = typer.Option(None, "--recheck/--no-recheck", help="Where a result is CLOSE, replay again: results that vary from run to run are the program's own nondeterminism, not the target's (default: on a GPU, not on a simulator)."),
    continue_on_error: bool = typer.Option(False, "--continue-on-error", help="Keep going past failures; report them all."),
    watchdog: Optional[float] = typer.Option(None, "--watchdog", metavar="SECONDS", min=0.001, help="Seconds a driver call may take before replay gives up (exit 2)."),
    sync_after_launch: bool = typer.Option(False, "--sync-after-launch", help="Synchronize after every launch (pins failures to a kernel)."),
    threads: bool = typer.Option(False, "--threads", help="Replay each recorded thread on its own thread (recorded order kept)."),
    relocate_payloads: bool = typer.Option(False, "--relocate-payloads", help="Rewrite stale recorded addresses found in H2D payloads after a fallback."),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress", help="Progress bar on stderr (default: on for long replays on a terminal)."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No summary; the first problem only."),
    profile: Optional[ProfileMode] = typer.Option(None, "--profile", metavar=_one_of(ProfileMode), help="Per-kernel profiling: timeline, isolated, graph or metrics (hardware counters, CUPTI's range profiler). With it, -k/-s/-c/--kernels/--calls/--launch choose the launches profiled and every call still runs."),
    repeat: int = typer.Option(10, "--repeat", metavar="N", min=1, max=MAX_RUNS, help="isolated/graph: timed runs per launch (per graph)."),
    warmup: int = typer.Option(3, "--warmup", metavar="N", min=0, max=MAX_RUNS, help="isolated/graph: untimed runs before the timed ones."),
    flush_l2: bool = typer.Option(True, "--flush-l2/--no-flush-l2", help="isolated: flush the L2 cache before every run (as Nsight Compute does by default), so each run starts from the same cache state."),
    launch: Optional[int] = typer.Option(None, "--launch", metavar="SEQ", min=0, help="Profile only the launch with this call sequence number (as dump shows)."),
    out_file: Optional[Path] = typer.Option(None, "--out", metavar="FILE", help="Write per-launch and per-kernel rows to FILE.json or FILE.csv (an existing file only with -f)."),
    trace: Optional[Path] = typer.Option(None, "--trace", metavar="FILE.json[.gz]", help="Write a trace of the timeline as the PyTorch profiler (Kineto) writes one (with --profile timeline): kernels, copies and memsets per device and stream, the replayed driver calls with flow arrows to their kernels, the recording's NVTX ranges; opens in Perfetto, chrome://tracing, TensorBoard, HTA."),
    hook: List[str] = typer.Option([], "--hook", metavar="MODULE:OBJECT", help="A hook MODULE:OBJECT[?key=value&...] (repeatable); see replay/hooks.py."),
    nvtx: Optional[bool] = typer.Option(None, "--nvtx/--no-nvtx", help="Emit NVTX ranges named after recorded calls and kernels (default: when nsys/ncu is attached)."),
    check_repeats: bool = typer.Option(False, "--check-repeats", help="isolated: check that every repeat writes the same memory."),
    section: List[str] = typer.Option([], "--section", metavar="NAME", help="metrics: an Nsight Compute section (repeatable): SpeedOfLight, Occupancy, MemoryWorkloadAnalysis, SpeedOfLight_RooflineChart (default: all four)."),
    metrics: Optional[str] = typer.Option(None, "--metrics", metavar="a,b,...", help="metrics: raw metric names, as ncu --metrics takes them (with --section: added to the sections')."),
    html: Optional[Path] = typer.Option(None, "--html", metavar="FILE.html", help="metrics: write a roofline plot (FLOP per DRAM byte against the card's peaks) and its table."),
    timeline_check: Optional[bool] = typer.Option(None, "--timeline-check/--no-timeline-check", help="graph: time the replayed launches as --profile timeline does (in the same replay) and list kernels of >= 5 us whose medians differ by more than 5% (default: on when CUPTI timed the nodes)."),
    profiler_range: ProfilerRange = typer.Option(ProfilerRange.recorded, "--profiler-range", metavar=_one_of(ProfilerRange), help="recorded: call the recorded cuProfilerStart/Stop; workload: call cuProfilerStart right before the first replayed launch, copy or memset and cuProfilerStop after the last (once its work is done), ignoring recorded ones, so `nsys --capture-range=cudaProfilerApi` and `ncu --profile-from-start off` skip replay set-up."),
    replace: List[str] = typer.Option([], "--replace", metavar="KERNEL=FILE", help="Run KERNEL (a recorded name), module:KERNEL (its whole module) or 0xMODULE (a recorded module handle) from FILE, a rebuilt cubin/fatbin/PTX with the same parameter layout (checked; a mismatch stops with exit 2). Repeatable; CUDASNAP_REPLACE='T=F;T=F' adds more."),
    jit: Optional[str] = typer.Option(None, "--jit", metavar="ptx", help="ptx: load every module from the PTX its image carries (JIT-compiled for this GPU; the JIT time is reported)."),
    pace: Pace = typer.Option(Pace.fast, "--pace", metavar=_one_of(Pace), help="fast: replay as fast as the driver takes the calls; recorded: keep the recorded host gaps between calls (each call starts no earlier than its recorded offset from the first), so a timeline compares with the program's own; in a job every rank keeps its offset from one group start."),
    launch_override: Optional[str] = typer.Option(None, "--launch-override", metavar="SPEC", help="grid=X,Y,Z and/or block=X,Y,Z[,kernel=REGEX]: replay launches with these sizes (a block the kernel cannot take is left as recorded) and verify as usual."),
    force: bool = typer.Option(False, "-f", "--force-overwrite", help="Replace an existing --out or --trace file (by default refused, before any work)."),
    wrap: Optional[str] = typer.Option(None, "--wrap", metavar="'TOOL ARGS'", help="Run the replay under a tool, with these same options: 'compute-sanitizer --tool memcheck' (gets --error-exitcode 1 unless given), 'ncu --section SpeedOfLight', 'nsys profile' (with --profiler-range workload, ncu and nsys are told to see only the replayed work). The tool's exit status is returned; a tool not found is exit 2."),
    preload: Optional[Path] = typer.Option(None, "--preload", metavar="TOOL.so", help="Load this library first in the replay process (LD_PRELOAD; under --wrap, in the replay process, not the tool's): an NVBit tool, an interposer."),
    sim: Optional[str] = typer.Option(None, "--sim", metavar="gpgpu-sim[:CONFIG]", help="Replay on a simulator instead of a GPU: GPGPU-Sim, in one of its configs (default: the one closest to the captured GPU); kernels run from their PTX, D2H results verified (with --sim-max-ctas, only the bytes sampled CTAs wrote)."),
    sim_path: Optional[Path] = typer.Option(None, "--sim-path", metavar="DIR", help="The GPGPU-Sim build (lib/libcudart.so, configs/); default $CUDASNAP_GPGPUSIM."),
    sim_mode: str = typer.Option("functional", "--sim-mode", metavar="functional|performance", help="functional: results only (fast); performance: cycle-level, per-kernel cycles (--out writes them as a timeline profile)."),
    sim_max_ctas: Optional[int] = typer.Option(None, "--sim-max-ctas", metavar="N", help="Bounded simulation: a launch of more than N CTAs runs its first N CTAs and only the result bytes they wrote are judged (the verdict says how much); in performance mode it is also timed on samples of N/2 and N CTAs, its cycles extrapolated with the error stated."),
):
    """Replay a snapshot on a GPU and verify every D2H result.

    Memory is placed at recorded addresses. -k/-s/-c/--kernels/--calls select launches: without
    --profile only those run; with it every call runs and those are profiled.

    Exit 0: calls replayed and every D2H result verified; 1: a verification mismatch; 2: replay
    could not proceed (the snapshot is unreadable, damaged or holds no call to replay; no GPU;
    an unsupported call)."""
    if sim_max_ctas is not None and sim is None:
        _fail("--sim-max-ctas bounds a simulated replay: add --sim gpgpu-sim")
    if sim is not None:
        _replay_sim(sim, sim_path, sim_mode, sim_max_ctas, snapshot, dict(
            device=device, devices=devices, threads=threads, wrap=wrap, preload=preload, jit=jit, trace=trace,
            hook=hook, launch_override=launch_override, pace=_value(pace) != "fast" or None, launch=launch,
            profile=_value(profile) if _value(profile) != "timeline" else None),
            dict(calls=calls, kernels=kernels, kernel_name=kernel_name,
                            kernel_name_base=_value(kernel_name_base), launch_skip=launch_skip,
                            launch_count=launch_count, **_numerics(dtype, rtol, atol, tolerance, exact, recheck),
                            continue_on_error=continue_on_error, watchdog=watchdog, progress=progress,
                            quiet=quiet, replace=list(replace)), json_out, out_file, force,
                    timeline=_value(profile) == "timeline")
    if wrap is not None or preload is not None:
        from cudasnap.wrap import exec_wrapped
        raise typer.Exit(exec_wrapped(ctx, wrap, str(preload) if preload else None,
                                      _value(profiler_range) == "workload"))
    from cudasnap.replay import ReplayOptions, option_problem

    profile = _value(profile)
    num = _numerics(dtype, rtol, atol, tolerance, exact, recheck)
    if watchdog is not None and watchdog <= 0:
        _fail("--watchdog must be > 0 seconds")
    why = option_problem(ReplayOptions(**num, launch_override=launch_override, devices=devices))   # before a job's ranks start too
    if why:
        _fail(why)
    from cudasnap.formats.group import is_manifest
    if len(snapshot) > 1 or is_manifest(snapshot[0]):
        from cudasnap.replay.group import run_group
        _check_outputs(force, snapshot, (trace, "file", "--trace"),
                       *((p, "file", "--out") for p in _rank_outputs(snapshot, out_file)))
        sel = {"--calls": calls, "--kernels": kernels, "-k": kernel_name, "-s": launch_skip or None,
               "-c": launch_count, "--launch": launch}
        chosen = [k for k, v in sel.items() if v is not None]
        if chosen and not profile:
            _fail(f"{', '.join(chosen)}: a job replays every call of every rank (the ranks wait on each other); "
                  "with --profile these choose the launches profiled")
        if device:
            _fail("--device: a job puts each rank on its own GPU; use --devices N,N,... (in rank order)")
        # every per-rank option goes to each rank's replayer as one typed document ({rank} in --out
        # becomes the rank); a rank always profiles: the group's rank hook runs in it
        name_base = _value(kernel_name_base) if kernel_name else "function"
        if jit not in (None, "ptx"):
            _fail("--jit takes ptx")
        from cudasnap.replay.selection import check as check_selection
        bad = check_selection(kernels, calls, kernel_name, name_base, launch_skip or 0, launch_count)
        from cudasnap.replay.replace import check_specs
        opts = ReplayOptions(profiler_range=_value(profiler_range), **num,
                             continue_on_error=continue_on_error, sync_after_launch=sync_after_launch,
                             threads=threads, relocate_payloads=relocate_payloads, quiet=quiet,
                             replace=list(replace), jit=jit, launch_override=launch_override, pace=_value(pace))
        bad = bad or check_specs(opts)
        if bad:
            _fail(bad)
        from cudasnap.replay.profile import ProfileConfig
        cfg = ProfileConfig(mode=profile or ("timeline" if out_file else None),
                            repeat=repeat, warmup=warmup, flush_l2=flush_l2, kernels=kernels, calls=calls,
                            kernel_name=kernel_name, kernel_name_base=name_base, launch_skip=launch_skip or 0,
                            launch_count=launch_count, launch=launch, out=_per_rank(out_file) if out_file else None,
                            hooks=list(hook), nvtx=nvtx, check_repeats=check_repeats, timeline_check=timeline_check,
                            sections=list(section), metrics=metrics, html=str(html) if html else None)
        raise typer.Exit(run_group(snapshot, devices, (opts, cfg), json_out, watchdog, trace=str(trace) if trace else None))
    snapshot = snapshot[0]
    _check_outputs(force, [snapshot], (out_file, "file", "--out"), (trace, "file", "--trace"), (html, "file", "--html"))
    name_base, prange = _value(kernel_name_base), _value(profiler_range)
    if jit not in (None, "ptx"):
        _fail("--jit takes ptx")
    if html:
        from cudasnap.compare.html import need_plotly
        why = need_plotly()
        if why:
            _fail(f"--html: {why}")
    profiling = bool(profile or hook or out_file or trace or nvtx or launch is not None)
    if profiling and not profile and (out_file or trace or launch is not None):
        profile = "timeline"
    pick = dict(calls=calls, kernels=kernels, kernel_name=kernel_name, kernel_name_base=name_base,
                launch_skip=launch_skip, launch_count=launch_count)
    from cudasnap.replay.selection import check as check_selection
    bad = check_selection(kernels, calls, kernel_name, name_base, launch_skip, launch_count)
    if bad:
        _fail(bad)
    opts = ReplayOptions(device=device, **({} if profile else pick), profiler_range=prange,
                         **num,
                         continue_on_error=continue_on_error, watchdog=watchdog, sync_after_launch=sync_after_launch,
                         threads=threads, progress=progress, relocate_payloads=relocate_payloads, quiet=quiet,
                         replace=list(replace), jit=jit, launch_override=launch_override, devices=devices,
                         pace=_value(pace))
    from cudasnap.replay.replace import check_specs
    bad = check_specs(opts)
    if bad:
        _fail(bad)
    from cudasnap.replay.invocation import ReplayRequest, run_request
    cfg = None
    if profiling:
        from cudasnap.replay.profile import ProfileConfig
        cfg = ProfileConfig(mode=profile, repeat=repeat, warmup=warmup, flush_l2=flush_l2,
                            **(pick if profile else {}), launch=launch,
                            out=str(out_file) if out_file else None, trace=str(trace) if trace else None,
                            hooks=list(hook), nvtx=nvtx, check_repeats=check_repeats, timeline_check=timeline_check,
                            sections=list(section), metrics=metrics, html=str(html) if html else None)
    raise typer.Exit(run_request(ReplayRequest(snapshot, opts, cfg, json=json_out)))


def _replay_sim(sim, sim_path, sim_mode, max_ctas, snapshot, not_with, kw, json_out, out_file, force,
                timeline=False) -> None:
    """replay --sim: the simulator backend (replay/sim/) with the replay's selection and checks."""
    used = [k for k, v in not_with.items() if v not in (None, False, 0, [], "")]
    if used:
        _fail(f"--sim: --{used[0].replace('_', '-')} is for a GPU replay, not a simulated one")
    if timeline and not (sim_mode == "performance" and out_file is not None):
        _fail("--profile timeline with --sim: the simulator's timeline is its cycles, written by "
              "--sim-mode performance --out X.json (a profile not taken exits 2)")
    if len(snapshot) > 1:
        _fail("--sim replays one snapshot (a job's ranks need GPUs)")
    from cudasnap.replay import ReplayOptions
    from cudasnap.replay.selection import check as check_selection
    bad = check_selection(kw["kernels"], kw["calls"], kw["kernel_name"], kw["kernel_name_base"],
                          kw["launch_skip"], kw["launch_count"])
    if bad:
        _fail(bad)
    _check_outputs(force, [snapshot[0]], (out_file, "file", "--out"))
    from cudasnap.replay.sim import run_sim_cli
    raise typer.Exit(run_sim_cli(snapshot[0], ReplayOptions(**kw), sim, str(sim_path) if sim_path else None,
                                 sim_mode, json_out, str(out_file) if out_file else None, max_ctas=max_ctas))


def _rank_outputs(snapshots: List[Path], out_file: Optional[Path]) -> List[str]:
    """Each rank's --out file, to check before the job starts (a job that cannot be read is
    reported by the replay itself)."""
    if out_file is None:
        return []
    from cudasnap.replay.group import GroupProblem, load_group
    try:
        ranks = load_group(snapshots)["ranks"]
    except (GroupProblem, OSError, ValueError, KeyError):
        return []
    return [_per_rank(out_file).replace("{rank}", str(r["rank"])) for r in ranks]


def _per_rank(p: Path) -> str:
    """FILE.json -> FILE.rank{rank}.json: each rank of a job writes its own."""
    name = p.name
    stem, dot, ext = name.partition(".")
    return str(p.with_name(f"{stem}.rank{{rank}}{dot}{ext}"))


@app.command(cls=_Command)
@needs(Inert("force_overwrite", "without --html", lambda p: p.get("html") is not None, warn=True))
def compare(
    base: Path = typer.Argument(..., metavar="BASE", help="A profile: `replay --profile MODE --out BASE.json`."),
    candidate: Path = typer.Argument(..., metavar="CANDIDATE", help="The profile to judge against BASE."),
    threshold: float = typer.Option(5.0, "--threshold", metavar="PCT", min=0.0, help="Smallest difference, in percent, that counts (a difference within the runs' combined noise never counts)."),
    html: Optional[Path] = typer.Option(None, "--html", metavar="REPORT.html", help="Write a self-contained HTML report (needs plotly: pip install 'cudasnap[report]'; an existing file only with -f)."),
    json_out: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
    force: bool = typer.Option(False, "--force", help="Compare runs of another GPU model, snapshot or profile mode (the report says so)."),
    top: int = typer.Option(20, "--top", metavar="N", min=1, help="Kernels shown in the table."),
    force_overwrite: bool = typer.Option(False, "-f", "--force-overwrite", help="Replace an existing --html file (by default refused, before any work)."),
    min_diff_us: float = typer.Option(0.3, "--min-diff-us", metavar="US", min=0.0, help="A kernel whose time per launch moved by less than this is SAME whatever the ratio (clock state and timestamp resolution move 1-3 us kernels by 0.1-0.3 us); 0 judges by ratio alone."),
    judge_collectives: bool = typer.Option(False, "--judge-collectives", help="Judge collective (NCCL) kernels too; by default they are reported, not judged, since their time includes waiting for the other ranks."),
):
    """Compare two profiles kernel by kernel: SAME, FASTER or SLOWER, against the threshold and
    the measured noise of both runs.

    Exit 0: no significant regression; 1: a kernel or the total is SLOWER; 2: error (unreadable
    profile; runs of another GPU, snapshot or profile mode without --force)."""
    from cudasnap.compare import run_compare_cli

    _check_outputs(force_overwrite, [base, candidate], (html, "file", "--html"))
    raise typer.Exit(run_compare_cli(str(base), str(candidate), threshold, str(html) if html else None, json_out,
                                     force, top, min_diff_us=min_diff_us, judge_collectives=judge_collectives))


@app.command(cls=_Command)
@needs(Inert("address", "without --gpus K (K > 1)", lambda p: (p.get("gpus") or 1) > 1,
             "give --gpus K too, or leave --address out"),
       Inert("repeat", "without --profile isolated", _TIMED_RUNS),
       Inert("warmup", "without --profile isolated", _TIMED_RUNS),
       Inert("force", "without --html or --keep", lambda p: p.get("html") is not None or p.get("keep") is not None,
             warn=True))
def bisect(
    snapshot: Path = typer.Argument(..., metavar="SNAPSHOT", help="A .cusnap file."),
    envs: Path = typer.Option(..., "--envs", metavar="ENVS.toml", help="[[env]] tables (name, vars, optional driver = path of a libcuda, optional device), the first good, the last bad."),
    profile: str = typer.Option("isolated", "--profile", metavar="isolated|timeline", help="How each environment's replay is timed."),
    kernels: Optional[str] = typer.Option(None, "--kernels", metavar="REGEX", help="Profile only kernels matching this regex (every call still runs)."),
    repeat: int = typer.Option(10, "--repeat", metavar="N", min=1, max=MAX_RUNS, help="isolated: timed runs per launch."),
    warmup: int = typer.Option(3, "--warmup", metavar="N", min=0, max=MAX_RUNS, help="isolated: untimed runs before them."),
    threshold: float = typer.Option(5.0, "--threshold", metavar="PCT", min=0.0, help="Smallest slowdown, in percent, that makes an environment bad (beyond the noise too)."),
    html: Optional[Path] = typer.Option(None, "--html", metavar="REPORT.html", help="Write a self-contained HTML report (needs plotly; an existing file only with -f)."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON (progress on stderr)."),
    keep: Optional[Path] = typer.Option(None, "--keep", metavar="DIR", help="Keep each environment's profile JSON in DIR (default: a temporary directory; created if missing, a non-empty one only with -f)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", metavar="SECONDS", min=1.0, help="Give up on a replay that runs longer."),
    top: int = typer.Option(20, "--top", metavar="N", min=1, help="Kernels shown in the table."),
    force: bool = typer.Option(False, "-f", "--force-overwrite", help="Replace an existing --html file and write into a non-empty --keep DIR (by default refused, before any replay)."),
    gpus: int = typer.Option(1, "--gpus", metavar="K", min=1, help="Replay K environments at once, one per GPU, through Ray (a local runtime, or --address): a K-ary search in fewer rounds (without --address, only where they save more than Ray's start)."),
    address: Optional[str] = typer.Option(None, "--address", metavar="auto|ray://HOST:PORT", help="--gpus: the Ray cluster to run on."),
    tolerance: Optional[str] = typer.Option(None, "--tolerance", metavar="TOL", help="As replay's, for every environment without its own `tolerance` (CLOSE results pass and are timed; DIFFERENT is a correctness break)."),
):
    """Find the first environment (driver, variables, kernel build) where a snapshot's replay
    regressed: both ends, then a binary search, each replay in its own process.

    An environment is bad when a kernel or the total is SLOWER than in the first (as `compare`
    judges), or when its replay no longer reproduces the recorded results (a correctness break).
    Exit 0: no regression between the ends; 1: a regression found (slower or a correctness
    break); 2: error (outputs are checked before the first replay)."""
    from cudasnap.campaign.bisect import run_bisect_cli

    raise typer.Exit(run_bisect_cli(str(snapshot), str(envs), profile, kernels, repeat, warmup, threshold,
                                    str(html) if html else None, json_out, str(keep) if keep else None, timeout, top,
                                    force=force, gpus=gpus, address=address, tolerance=tolerance))


@app.command(cls=_Command)
def export(
    snapshot: Path = typer.Argument(..., metavar="SNAPSHOT", help="A .cusnap file."),
    output: Path = typer.Option(..., "-o", "--output", metavar="DIR", help="Directory for replay.c, its Makefile and data/ (created if missing; its parent must exist)."),
    calls: Optional[str] = typer.Option(None, "--calls", metavar="SET", help="Only these launches/copies (call-set syntax as in dump); state-building calls always run."),
    force: bool = typer.Option(False, "-f", "--force-overwrite", help="Write into a non-empty DIR, replacing the files export writes and keeping every other file (by default refused, before any work)."),
    sim: bool = typer.Option(False, "--sim", help="A program for GPGPU-Sim instead (replay.c, the simulator adapter, the merged PTX, data/, a Makefile: make SIM=DIR; make run SIM=DIR)."),
):
    """Write a standalone C program that replays SNAPSHOT through the CUDA Driver API.

    DIR gets replay.c, a Makefile (CC, CFLAGS, LDFLAGS honoured; links -lcuda) and data/
    (H2D payloads, module images, expected D2H results). The program needs no Python and
    no cudasnap; it verifies every D2H result and prints per-kernel times. Its exit: 0
    verified, 1 a result differs, 2 cannot proceed. Export exits 2 naming a call it cannot
    translate or a snapshot without a call to export."""
    from cudasnap.export.commands import run_export_cli

    raise typer.Exit(run_export_cli(snapshot, output, calls, force=force, sim=sim))


@app.command(cls=_Command)
@needs(Inert("tolerance", "without --check", lambda p: bool(p.get("check")), "give --check too, or leave --tolerance out"))
def extract(
    snapshot: Path = typer.Argument(..., metavar="SNAPSHOT", help="A .cusnap file."),
    output: Path = typer.Option(..., "-o", "--output", metavar="SMALL.cusnap", help="The snapshot to write (never onto SNAPSHOT; an existing file only with -f)."),
    launch: Optional[int] = typer.Option(None, "--launch", metavar="N", min=0, help="The launch with call number N (as dump shows): a kernel launch, or a graph launch with its kernels."),
    kernel: Optional[str] = typer.Option(None, "--kernel", metavar="REGEX[#K]", help="The K-th launch (from 1; default the first) of a kernel whose name matches REGEX."),
    calls: Optional[str] = typer.Option(None, "--calls", metavar="A-B", help="Every call numbered A to B."),
    memory: Optional[ExtractMemory] = typer.Option(None, "--memory", metavar=_one_of(ExtractMemory), help="reachable: restore what the selection's parameters point into, plus what pointer scanning finds there, plus module globals; all: every live allocation, whole. Default: reachable (with --check, all when reachable memory does not verify)."),
    ranges: Optional[ExtractRanges] = typer.Option(None, "--ranges", metavar=_one_of(ExtractRanges), help="exact: within an allocation, restore from each pointer to the next tensor start the snapshot names (plus what the selection writes beyond); segment: whole allocations (for kernels that read beyond their tensors). Default: exact, segment for a graph launch."),
    sass: ExtractSass = typer.Option(ExtractSass.device, "--sass", metavar=_one_of(ExtractSass), help="device: a fatbin module keeps SASS only for the recorded GPUs' architecture (and every PTX entry); all: every architecture's SASS (to replay the extract on GPUs of another architecture)."),
    check: bool = typer.Option(False, "--check", help="Replay the extract right away and exit 1 if it does not verify."),
    device: int = typer.Option(0, "--device", metavar="N", min=0, help="GPU ordinal to replay on."),
    watchdog: Optional[float] = typer.Option(None, "--watchdog", metavar="SECONDS", min=0.001, help="Seconds a driver call may take, in the replay up to the selection and in --check's, before extract gives up (exit 2)."),
    tolerance: Optional[str] = typer.Option(None, "--tolerance", metavar="TOL", help="--check: as replay's --tolerance (exact, torch, rtol=R,atol=A, ulp:N)."),
    force: bool = typer.Option(False, "-f", "--force-overwrite", help=_FORCE_HELP),
):
    """Write a small self-contained snapshot of selected launches, with the memory they read.

    Replays SNAPSHOT up to the selection, reads back the memory it can read, replays it and
    reads back what it could write. SMALL.cusnap holds the state-building calls the selection
    uses (context, placement zone, allocations, streams, the module loads its kernels need, with
    SASS for the recorded GPU and PTX), H2D copies restoring that memory, the selection, and
    D2H copies whose expected results are what was read back:
    `cudasnap replay SMALL.cusnap` verifies against them. Within an allocation (a caching
    allocator's segment holds many tensors) only the bytes from each pointer to the next tensor
    start are restored, plus what the selection writes beyond; a kernel that reads beyond them
    does not verify (--check says so): use --ranges segment. Exit 2: nothing selected, or the
    replay could not reach the selection; exit 1: --check found that the extract does not verify."""
    from cudasnap.export.commands import run_extract_cli

    raise typer.Exit(run_extract_cli(snapshot, output, launch, kernel, calls, _value(memory) if memory else None, device,
                                     ranges=_value(ranges), check=check, force=force, sass=_value(sass),
                                     watchdog=watchdog, tolerance=tolerance))


from cudasnap.campaign_cmd import campaign_app  # noqa: E402
app.add_typer(campaign_app, name="campaign")
from cudasnap.advise_cmd import register as _register_advise  # noqa: E402
_register_advise(app, _Command)


def _flight_default(argv: List[str]) -> List[str]:
    """`--flight-recorder` with no value means 60 s (SECONDS is optional, as `=SECONDS`)."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        out.append(a)
        if a == "--":
            return out + argv[i + 1:]
        if a == "--flight-recorder":
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            try:
                float(nxt)
            except ValueError:
                out.append("60")
        i += 1
    return out


def main() -> None:
    from .exits import finish, install, leave, report_interrupt
    try:
        install()                   # pipes, failed writes and signals never bend the verdict (exits.py)
    except KeyboardInterrupt as e:
        leave(finish(report_interrupt(e)))
    leave(finish(_run()))


def _run() -> int:
    from .exits import report_interrupt, reported
    try:
        from .typer_base import one_line_usage_errors
        one_line_usage_errors()
        sys.argv[1:] = _flight_default(sys.argv[1:])
        app()
    except SystemExit as e:
        from cudasnap.formats import signals
        if e.code == 130 and signals.received() is not None and not reported():
            return report_interrupt(None)   # typer's own silent 130 (a signal while parsing)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else _message_exit(e.code))
    except KeyboardInterrupt as e:  # outside a command's body (while starting): still 130
        return report_interrupt(e)
    except BrokenPipeError:         # a write that bypassed the pipe-safe streams: the verdict is lost
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        return 141                  # as a shell reports a command ended by SIGPIPE, never 0
    except RecursionError as e:     # input nested deeper than any reader follows (a JSON, a TOML)
        typer.echo(f"cudasnap: error: input nested too deeply to read ({' '.join(str(e).split())[:120]})", err=True)
        return 2
    except Exception as e:
        from cudasnap.formats import SnapshotError
        from cudasnap.formats.outputs import OutputError
        if isinstance(e, (OSError, SnapshotError, OutputError)):
            # a file that could not be read or written where no command caught it: one line, exit 2
            msg = f"{e.filename}: {e.strerror}" if isinstance(e, OSError) and e.filename and e.strerror else str(e)
        elif os.environ.get("CUDASNAP_DEBUG"):
            raise
        else:
            msg = internal_error(e)
        typer.echo(f"cudasnap: error: {' '.join(msg.split())}", err=True)
        return 2
    return 0


def _message_exit(msg) -> int:
    typer.echo(str(msg), err=True)
    return 1


def internal_error(e: BaseException) -> str:
    """One line for an error no command expected (a defect, or input no check foresaw): what,
    and where in cudasnap, for a report; CUDASNAP_DEBUG=1 shows the traceback instead."""
    import traceback
    where = ""
    for fr in reversed(traceback.extract_tb(e.__traceback__)):
        if "cudasnap" in fr.filename.replace(os.sep, "/").split("/site-packages/")[-1]:
            where = f" at {fr.filename.replace(os.sep, '/').rsplit('cudasnap/', 1)[-1]}:{fr.lineno}"
            break
    text = str(e)[:300]
    return (f"internal error ({type(e).__name__}{': ' + text if text else ''}{where}); the input may be damaged "
            f"or not foreseen. CUDASNAP_DEBUG=1 shows the traceback")


if __name__ == "__main__":
    main()
