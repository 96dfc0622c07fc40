"""`cudasnap advise SNAPSHOT|PROFILE.json`: ranked findings with measured what-ifs (the work is
in cudasnap.advise)."""
from __future__ import annotations

import json
import re
import sys
from enum import Enum
from pathlib import Path
from typing import List, Optional

import typer

from cudasnap.console import is_tty
from cudasnap.formats.limits import MAX_RUNS
from cudasnap.typer_base import Inert, fail as _fail, needs

_WHAT_IF = lambda p: not p.get("no_what_if")  # noqa: E731


class Pace(str, Enum):
    recorded = "recorded"
    fast = "fast"


@needs(*(Inert(o, "with --no-what-if", _WHAT_IF, f"leave out --no-what-if or --{o.replace('_', '-')}")
         for o in ("replace", "launch_override", "repeat", "warmup", "graphs")),
       Inert("block_sizes", "without --metrics", lambda p: p.get("metrics") is not None and not p.get("no_what_if"),
             "give --metrics M.json (and no --no-what-if), or leave --block-sizes out"),
       Inert("force", "without --out or --html", lambda p: p.get("out") is not None or p.get("html") is not None,
             warn=True))
def advise(
    source: Path = typer.Argument(..., metavar="SNAPSHOT|PROFILE.json", help="A .cusnap file (replayed under --profile timeline here), or the JSON of `replay --profile timeline --out` (its snapshot is replayed for the what-ifs when it is still there)."),
    out: Optional[Path] = typer.Option(None, "--out", metavar="A.json", help="Write the findings as JSON (an existing file only with -f)."),
    html: Optional[Path] = typer.Option(None, "--html", metavar="A.html", help="Write a self-contained HTML page (needs plotly: pip install 'cudasnap[report]')."),
    json_out: bool = typer.Option(False, "--json", help="Print the findings as JSON."),
    top: int = typer.Option(10, "--top", metavar="N", min=1, help="Findings shown, highest time at stake first."),
    no_what_if: bool = typer.Option(False, "--no-what-if", help="Findings only: run no what-if replay."),
    replace: List[str] = typer.Option([], "--replace", metavar="K=FILE", help="What-if: the kernel K (a recorded name, module:K or 0xMODULE as replay takes it) from a rebuilt FILE, timed in isolated mode against the recorded one (repeatable)."),
    launch_override: List[str] = typer.Option([], "--launch-override", metavar="SPEC", help="What-if: grid=X,Y,Z and/or block=X,Y,Z[,kernel=REGEX] as `replay --launch-override` takes it, timed in isolated mode against the recorded sizes; the replay's verification says whether the kernel allows it (repeatable)."),
    block_sizes: int = typer.Option(2, "--block-sizes", metavar="N", min=0, help="With --metrics: for the N heaviest low-occupancy kernels, the block size that raises theoretical occupancy most (keeping the threads launched) is replayed and measured; 0: none."),
    pace: Pace = typer.Option(Pace.recorded, "--pace", metavar="recorded|fast", help="The timeline replay's pace: recorded keeps the program's host gaps (launch-bound stretches and host gaps are the program's), fast shows the replayer's."),
    graphs: int = typer.Option(3, "--graphs", metavar="N", min=0, help="Launch-bound stretches measured as CUDA graphs, largest first."),
    repeat: int = typer.Option(10, "--repeat", metavar="N", min=1, max=MAX_RUNS, help="What-ifs: timed runs per graph or launch."),
    warmup: int = typer.Option(3, "--warmup", metavar="N", min=0, max=MAX_RUNS, help="What-ifs: untimed runs first."),
    tiny_us: float = typer.Option(5.0, "--tiny-us", metavar="US", min=0.0, help="Kernels shorter than this count as launch-bound (so do longer ones that ran for less time than the GPU idled around them)."),
    device: int = typer.Option(0, "--device", metavar="N", min=0, help="GPU ordinal to replay on."),
    timeout: Optional[float] = typer.Option(None, "--timeout", metavar="SECONDS", min=1.0, help="Give up on a replay that runs longer."),
    metrics: Optional[Path] = typer.Option(None, "--metrics", metavar="M.json", help="A metrics profile of the same snapshot (`replay --profile metrics --out M.json`): what bounds each heavy kernel (memory, compute, latency) and low occupancy, with ncu's SpeedOfLight and Occupancy figures."),
    force: bool = typer.Option(False, "-f", "--force-overwrite", help="Replace an existing --out or --html file (by default refused, before any work)."),
):
    """Rank what the time of a replayed run is spent on, with the evidence for each finding and
    the time at stake: launch-bound stretches, host-side gaps, the heaviest kernels, hand-written
    kernels a library call could serve, repeated small memsets and copies; with --metrics, what
    bounds each heavy kernel (memory, compute, latency) and low occupancy, from its counters.

    What-ifs are measured by replays, not estimated: a launch-bound stretch replayed as one CUDA
    graph (`replay --profile graph --calls A-B`) against its span on the timeline; with --replace,
    the kernel as rebuilt against the recorded one; with --launch-override, another launch size;
    with --metrics, a low-occupancy kernel at the block size that raises its occupancy.

    Exit 0: findings made (a what-if that could not be measured says why); 2: bad input (not a
    snapshot or a timeline profile, a profile with no kernels, a replay that fails, a --replace file
    that does not load, an unwritable output)."""
    from cudasnap.advise import AdviseConfig, AdviseError, advise as run_advise
    from cudasnap.advise.findings import Limits
    from cudasnap.formats.outputs import OutputError, check_output

    if not source.exists():
        _fail(f"{source}: no such file")
    if source.is_dir():
        _fail(f"{source}: a directory, not a snapshot or a profile")
    seen = {}
    for p, what, ext in ((out, "--out", ".json"), (html, "--html", (".html", ".htm"))):
        if p is None:
            continue
        if not str(p).lower().endswith(ext):
            _fail(f"{what} must name a {ext if isinstance(ext, str) else ext[0]} file")
        try:
            a = check_output(p, force, "file", [source], what)
        except OutputError as e:
            _fail(str(e))
        if a in seen:
            _fail(f"{what} {p} is also {seen[a]}: give each output its own file")
        seen[a] = what
    if html is not None:
        from cudasnap.compare.html import need_plotly
        why = need_plotly()
        if why:
            _fail(why)
    if replace and not no_what_if:
        from types import SimpleNamespace
        from cudasnap.replay.replace import check_specs
        why = check_specs(SimpleNamespace(replace=list(replace)))
        if why:
            _fail(why)
    if launch_override and not no_what_if:
        from cudasnap.replay.override import parse as parse_override
        for spec in launch_override:
            try:
                parse_override(spec)
            except (ValueError, re.error) as e:
                _fail(f"--launch-override {spec}: {e}" if isinstance(e, re.error) else str(e))
    cfg = AdviseConfig(top=top, what_if=not no_what_if, graph_stretches=graphs, replace=list(replace),
                       launch_override=list(launch_override), block_sizes=block_sizes,
                       pace=pace.value, device=device, repeat=repeat, warmup=warmup,
                       timeout=timeout, limits=Limits(tiny_us=tiny_us), metrics=str(metrics) if metrics else None)
    tty = is_tty(sys.stderr) and not json_out

    def progress(msg: str) -> None:
        if tty:
            sys.stderr.write(f"advise: {msg}...\n")

    try:
        res = run_advise(str(source), cfg, progress)
    except AdviseError as e:
        _fail(str(e))
    from cudasnap.formats.outputs import write_atomic
    if out is not None:
        write_atomic(out, json.dumps(res, indent=1, default=str) + "\n")
    if html is not None:
        from cudasnap.advise.render import write_html
        write_html(res, str(html))
    if json_out:
        sys.stdout.write(json.dumps(res, indent=1, default=str) + "\n")
    else:
        from cudasnap.advise.render import render_text
        render_text(res, sys.stdout)
        for p, what in ((out, "findings"), (html, "report")):
            if p is not None:
                sys.stdout.write(f"{what} written to {p}\n")
    raise typer.Exit(0)


def register(app, command_cls) -> None:
    app.command(name="advise", cls=command_cls)(advise)
