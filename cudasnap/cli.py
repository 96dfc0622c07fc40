"""The `cudasnap` command line. Each command's work lives in its part; this file only wires."""
from __future__ import annotations

import sys
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
    threads: int = typer.Option(4, "--threads", help="Compression threads per process."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No summary lines."),
):
    """Run COMMAND with the shim preloaded and write a snapshot for each process that used CUDA."""
    from cudasnap.capture.run import run_capture

    if ring_mb < 1 or ring_mb > 65536:
        _fail("--ring-mb must be between 1 and 65536")
    if not 1 <= level <= 22:
        _fail("--level must be between 1 and 22")
    raise typer.Exit(run_capture(list(command), output, ring_mb, level, max(0, threads), quiet))


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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
