"""The `cudasnap` command line. Each command's work lives in its part; this file only wires."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="CUDA snapshot-and-replay: capture a workload's driver calls, inspect, replay, verify.",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _fail(msg: str, code: int = 2) -> None:
    typer.echo(f"cudasnap: error: {msg}", err=True)
    raise typer.Exit(code)


@app.command(context_settings={"allow_interspersed_args": False})
def capture(
    command: List[str] = typer.Argument(..., help="The program and its arguments, after --."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Snapshot path (default ./PROGRAM.cusnap; other processes get PROGRAM.PID.cusnap)."),
    ring_mb: int = typer.Option(256, "--ring-mb", help="Shared-memory ring per process, MiB (a larger ring absorbs bursts)."),
    level: int = typer.Option(3, "--level", help="zstd compression level (1 fastest .. 19)."),
    threads: Optional[int] = typer.Option(None, "--threads", help="Compression/writing threads per process (default: half the CPUs, at most 8)."),
    placement: str = typer.Option("region", "--placement", help="region: put device allocations in a tool-owned address zone so replay can place them exactly (VMM memory); off: leave addresses to the driver."),
    all_queries: bool = typer.Option(False, "--all-queries", help="Record every pure query (cuCtxGetDevice...); by default a repeat identical to the thread's last recorded one is only counted."),
    copy_threads: Optional[int] = typer.Option(None, "--copy-threads", help="Helper threads in the program that digest and copy payloads of 8 MiB or more (default: half the CPUs, at most 8; 0: the calling thread alone)."),
    segments: int = typer.Option(8, "--segments", help="Side files that large payload chunks spill into while the snapshot file is busy, folded into it when the process ends (one file takes 3-4 GB/s of buffered writes, several in parallel far more); 0: write everything into the snapshot file."),
    drain: str = typer.Option("lazy", "--drain", help="lazy: the recorder leaves records in the ring until it is a quarter full, 5 s pass or the process exits, so its work does not run beside the program's; eager: drain continuously (the snapshot file keeps up with the program)."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No summary lines."),
):
    """Run COMMAND with the shim preloaded and write a snapshot for each process that used CUDA."""
    from cudasnap.capture.run import run_capture

    if ring_mb < 1 or ring_mb > 65536:
        _fail("--ring-mb must be between 1 and 65536")
    if not 1 <= level <= 22:
        _fail("--level must be between 1 and 22")
    if placement not in ("region", "off"):
        _fail("--placement must be region or off")
    if threads is not None and threads < 0:
        _fail("--threads must be >= 0")
    if copy_threads is not None and not 0 <= copy_threads <= 32:
        _fail("--copy-threads must be between 0 and 32")
    if drain not in ("lazy", "eager"):
        _fail("--drain must be lazy or eager")
    if not 0 <= segments <= 16:
        _fail("--segments must be between 0 and 16")
    raise typer.Exit(run_capture(list(command), output, ring_mb, level, threads, quiet, placement,
                                 all_queries=all_queries, copy_threads=copy_threads, drain=drain,
                                 segments=segments))


@app.command()
def info(
    snapshot: Path = typer.Argument(..., help="A .cusnap file."),
    json_out: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
):
    """Summarize a snapshot: process, GPU, calls, kernels, memory, modules, blobs."""
    from cudasnap.inspect_cmds import run_info

    raise typer.Exit(run_info(snapshot, json_out))


@app.command()
def dump(
    snapshot: Path = typer.Argument(..., help="A .cusnap file."),
    calls: Optional[str] = typer.Option(
        None, "--calls", help="Call set: '100-200', '5,7,9-', 'launches', 'memcpy', a kernel or API name; join with ','."
    ),
    fmt: str = typer.Option("text", "--format", help="text or jsonl."),
    blobs: bool = typer.Option(False, "--blobs", help="Show blob contents (hex preview) instead of references."),
):
    """Print every record (or a selected set) of a snapshot."""
    from cudasnap.inspect_cmds import run_dump

    raise typer.Exit(run_dump(snapshot, calls, fmt, blobs))


@app.command()
def repair(
    snapshot: Path = typer.Argument(..., help="A .cusnap file left without an index (crash, kill)."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Write here instead of in place."),
):
    """Rewrite a truncated snapshot with an index, keeping every complete frame."""
    from cudasnap.inspect_cmds import run_repair

    raise typer.Exit(run_repair(snapshot, output))


@app.command()
def api(
    status: Optional[str] = typer.Option(None, "--status", help="Only: replay, record, refused."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """List every driver entry point and whether it is recorded, replayable or refused."""
    from cudasnap.shim.api_cmd import run_api

    raise typer.Exit(run_api(status, json_out))


@app.command()
def replay(
    snapshot: Path = typer.Argument(..., help="A .cusnap file."),
    device: int = typer.Option(0, "--device", help="GPU ordinal to replay on."),
    calls: Optional[str] = typer.Option(None, "--calls", help="Only these launches/copies (call-set syntax as in dump); state-building calls always run."),
    kernels: Optional[str] = typer.Option(None, "--kernels", help="Only launches of kernels matching this regex."),
    rtol: float = typer.Option(0.0, "--rtol", help="Relative tolerance for D2H verification (with --dtype)."),
    atol: float = typer.Option(0.0, "--atol", help="Absolute tolerance for D2H verification (with --dtype)."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="Element type for tolerances: f32, f16, bf16, f64."),
    continue_on_error: bool = typer.Option(False, "--continue-on-error", help="Keep going past failures; report them all."),
    watchdog: Optional[float] = typer.Option(None, "--watchdog", help="Seconds a driver call may take before replay gives up (exit 2)."),
    sync_after_launch: bool = typer.Option(False, "--sync-after-launch", help="Synchronize after every launch (pins failures to a kernel)."),
    threads: bool = typer.Option(False, "--threads", help="Replay each recorded thread on its own thread (recorded order kept)."),
    relocate_payloads: bool = typer.Option(False, "--relocate-payloads", help="Rewrite stale recorded addresses found in H2D payloads after a fallback."),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress", help="Progress bar on stderr (default: on for long replays on a terminal)."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No summary; the first problem only."),
    profile: Optional[str] = typer.Option(None, "--profile", help="Per-kernel profiling: timeline, isolated or graph. With it, --kernels/--calls/--launch choose the launches profiled and every call still runs."),
    repeat: int = typer.Option(10, "--repeat", help="isolated/graph: timed runs per launch (per graph)."),
    warmup: int = typer.Option(3, "--warmup", help="isolated/graph: untimed runs before the timed ones."),
    flush_l2: bool = typer.Option(True, "--flush-l2/--no-flush-l2", help="isolated: flush the L2 cache before every run (as Nsight Compute does by default), so each run starts from the same cache state."),
    launch: Optional[int] = typer.Option(None, "--launch", help="Profile only the launch with this call sequence number (as dump shows)."),
    out_file: Optional[Path] = typer.Option(None, "--out", help="Write per-launch and per-kernel rows to FILE.json or FILE.csv."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="Write a Chrome trace / Perfetto JSON of the timeline (with --profile timeline)."),
    hook: List[str] = typer.Option([], "--hook", help="A hook MODULE:OBJECT[?key=value&...] (repeatable); see replay/hooks.py."),
    nvtx: Optional[bool] = typer.Option(None, "--nvtx/--no-nvtx", help="Emit NVTX ranges named after recorded calls and kernels (default: when nsys/ncu is attached)."),
    check_repeats: bool = typer.Option(False, "--check-repeats", help="isolated: check that every repeat writes the same memory."),
):
    """Re-execute a snapshot on a GPU, placing memory at recorded addresses, and verify every D2H result.
    Exit 0: all verified; 1: a verification mismatch; 2: replay could not proceed."""
    from cudasnap.replay import ReplayOptions, run_replay_cli

    if watchdog is not None and watchdog <= 0:
        _fail("--watchdog must be > 0 seconds")
    profiling = bool(profile or hook or out_file or trace or nvtx or launch is not None)
    if profiling and not profile and (out_file or trace or launch is not None):
        profile = "timeline"
    opts = ReplayOptions(device=device, calls=None if profile else calls, kernels=None if profile else kernels,
                         rtol=rtol, atol=atol, dtype=dtype,
                         continue_on_error=continue_on_error, watchdog=watchdog, sync_after_launch=sync_after_launch,
                         threads=threads, progress=progress, relocate_payloads=relocate_payloads, quiet=quiet)
    if profiling:
        from cudasnap.replay.profile import ProfileConfig, run_profile_cli
        cfg = ProfileConfig(mode=profile, repeat=repeat, warmup=warmup, flush_l2=flush_l2,
                            kernels=kernels if profile else None, calls=calls if profile else None, launch=launch,
                            out=str(out_file) if out_file else None, trace=str(trace) if trace else None,
                            hooks=list(hook), nvtx=nvtx, check_repeats=check_repeats)
        raise typer.Exit(run_profile_cli(snapshot, opts, cfg, json_out))
    raise typer.Exit(run_replay_cli(snapshot, opts, json_out))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
