"""`cudasnap campaign run|report`: regression campaigns on Ray (the work is in cudasnap.campaign)."""
from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional

import typer
from cudasnap.console import is_tty
from cudasnap.typer_base import Command as _Command, Inert, fail as _fail, needs


campaign_app = typer.Typer(
    add_completion=False, no_args_is_help=True, rich_markup_mode=None,
    help="Regression campaigns: every snapshot x every environment, one replay per GPU, on Ray; results kept in an SQLite store.",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})


class _Progress:
    """A live bar of cells done, running and failed with an ETA at a terminal; one line per
    finished cell elsewhere."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.tty = is_tty(sys.stderr) and not quiet
        self.bar = None
        self.total = self.done = self.failed = self.regressed = 0
        self.slots = 1
        self.inflight = 0

    def __call__(self, kind: str, info: Dict[str, Any]) -> None:
        if kind == "start":
            self.total = info["cells"] - info["skipped"]
            self.slots = info["slots"]
            if not self.quiet:
                sys.stderr.write(f"campaign: {info['cells']} cells, {self.total} to run, {info['skipped']} finished "
                                 f"earlier (skipped), {self.slots} GPU(s)\n")
            if self.tty:
                from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                           TimeRemainingColumn)
                from cudasnap.console import console
                self.bar = Progress(TextColumn("cells"), BarColumn(), MofNCompleteColumn(),
                                    TextColumn("{task.fields[state]}"), TimeElapsedColumn(), TextColumn("ETA"),
                                    TimeRemainingColumn(), console=console(stderr=True), transient=False)
                self.task = self.bar.add_task("cells", total=self.total, state="")
                self.bar.start()
            self._update()
        elif kind == "submit":
            self.inflight += 1
        elif kind == "attempt":
            self.inflight -= 1
            if info["outcome"] not in ("ok", "mismatch") and not self.quiet and not self.tty:
                sys.stderr.write(f"  {info['cell'].label}: {info['purpose']} attempt {info['outcome']}: "
                                 f"{(info.get('error') or '').splitlines()[-1:] or ''}\n")
        elif kind == "cell":
            self.done += 1
            if info["status"] in ("infra", "error"):
                self.failed += 1
            if not self.quiet and not self.tty:
                extra = f" ({', '.join(info['slower'])})" if info.get("slower") else ""
                err = f": {info['error']}" if info.get("error") and info["status"] != "ok" else ""
                sys.stderr.write(f"[{self.done}/{self.total}] {info['cell'].label}: {info['verdict']}{extra}{err}\n")
            self._update()
        elif kind == "tick":
            self.inflight = info["inflight"]
            self._update()

    def _update(self) -> None:
        if self.bar is not None:
            running = min(self.inflight, self.slots)
            self.bar.update(self.task, completed=self.done,
                            state=f"done {self.done}  running {running}  queued {self.inflight - running}  "
                                  f"failed {self.failed}")

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


@campaign_app.command("run", cls=_Command)
def run(
    ctx: typer.Context,
    campaign: Path = typer.Argument(..., metavar="CAMPAIGN.toml", help="[[snapshot]] and [[env]] tables, a baseline and [rules]."),
    output: Path = typer.Option(Path("campaign.sqlite"), "-o", "--output", metavar="STORE.sqlite", help="The store (created, or appended to: history accumulates)."),
    address: Optional[str] = typer.Option(None, "--address", metavar="auto|ray://HOST:PORT", help="A Ray cluster to run on (default: a local Ray runtime using every GPU of this machine)."),
    fresh: bool = typer.Option(False, "--fresh", help="A new campaign run even when this campaign file already ran in the store (nightly runs); by default its finished cells are skipped."),
    ship: bool = typer.Option(False, "--ship", help="Send snapshots through Ray's object store even where a node sees the same path."),
    json_out: bool = typer.Option(False, "--json", help="Print the run's counts and report as JSON."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress, only the report."),
):
    """Replay every snapshot in every environment, one replay per GPU, and judge each against
    the baseline replayed beside it on the same GPU (A B A B; reruns near the bar, a
    confirmation on another GPU before a verdict).

    Each cell is written to the store as it finishes; running the same campaign file on the
    same store again runs only the cells not finished (Ctrl-C leaves the store consistent).
    Exit 0: no regression; 1: a regression; 2: infrastructure failures, a verdict in a control
    env (noise exceeds the rules), or bad input."""
    from cudasnap.campaign.plan import PlanError, load_campaign
    from cudasnap.campaign.store import Store, StoreError

    try:
        camp = load_campaign(campaign)
    except PlanError as e:
        _fail(str(e))
    try:
        store = Store(output, defer=True)     # made on the first write: after Ray has started
    except StoreError as e:
        _fail(str(e))
    ctx.call_on_close(store.close)            # the last connection to a WAL store removes -wal/-shm
    try:
        import ray  # noqa: F401
    except ImportError:
        _fail("campaigns run on Ray, which is not installed: pip install 'cudasnap[campaign]'")
    try:
        import scipy.stats  # noqa: F401
    except ImportError:
        _fail("campaigns judge with scipy, which is not installed: pip install 'cudasnap[campaign]'")
    raise typer.Exit(run_campaign(camp, store, address, fresh, ship, json_out, quiet))


def run_campaign(camp, store, address, fresh: bool, ship: bool, json_out: bool, quiet: bool,
                 init_kwargs: Optional[dict] = None) -> int:
    # Ray's threads print their notices (a node lost, a worker killed) on stdout: while Ray
    # runs, stdout is stderr, so that the run's own output (--json above all) stays whole
    real = sys.stdout
    sys.stdout = sys.stderr
    try:
        return _run_campaign(camp, store, address, fresh, ship, json_out, quiet, init_kwargs, real)
    finally:
        sys.stdout = real


def _run_campaign(camp, store, address, fresh: bool, ship: bool, json_out: bool, quiet: bool,
                  init_kwargs: Optional[dict], out) -> int:
    from cudasnap.campaign.engine import Engine, EngineError
    from cudasnap.campaign.report import build_report, render_text

    from cudasnap import __version__ as version
    base_run = None
    # every check and Ray's start before the store is written: a campaign that cannot start
    # leaves the store as it was (no run row that the next one would resume)
    earlier = None if fresh else store.latest_run(camp)
    if camp.baseline.startswith("run:"):
        base_run = store.resolve_run(camp.baseline, camp.name, -1 if earlier is None else earlier)
        if base_run is None:
            _fail(f"baseline {camp.baseline}: no such earlier run of campaign {camp.name!r} in {store.path}")
    skip = store.finished_keys(earlier) if earlier is not None else {}
    prog = _Progress(quiet or json_out)
    eng = None
    t0 = time.monotonic()
    ray_s = 0.0
    if len(skip) < len(camp.cells):
        try:
            eng = Engine(camp, store, None, address=address, init_kwargs=init_kwargs, ship=ship, on_event=prog)
        except EngineError as e:
            prog.stop()
            _fail(str(e))
        ray_s = time.monotonic() - t0
    run_id, resumed = store.open_run(camp, version, address, fresh)
    status, code = "failed", 2
    old = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        if eng is None:      # nothing left: no need for Ray
            counts = {"cells": len(camp.cells), "skipped": len(skip), "ran": 0, "failed": 0, "regressed": 0,
                      "set_aside": 0}
            eng = _NoEngine()
        else:
            eng.run_id = run_id
            eng.set_baseline_run(base_run)
            counts = eng.run(skip)
        prog.stop()
        status = "done"
    except KeyboardInterrupt:
        prog.stop()
        n = len(store.finished_keys(run_id))
        store.close_run(run_id, "interrupted", eng.hosts if eng else [], 130)
        sys.stderr.write(f"cudasnap: interrupted: {n} of {len(camp.cells)} cells are in {store.path}, the run "
                         f"marked interrupted; run the same command again to finish the others\n")
        if eng:
            eng.shutdown()
        return 130
    except BaseException:       # no run is left "running" by a process that has gone
        store.close_run(run_id, "failed", eng.hosts if eng else [], 2)
        if eng:
            eng.shutdown()
        raise
    finally:
        signal.signal(signal.SIGTERM, old)
    rep = build_report(store, run=run_id, ending=True)
    code = rep["exit_code"]
    store.close_run(run_id, status, eng.hosts, code)
    rep["run"] = dict(store.run_row(run_id))
    eng.shutdown()
    sys.stdout = out
    wall = time.monotonic() - t0
    summary = {"run": run_id, "resumed": resumed, "cells": counts["cells"], "ran": counts["ran"], "set_aside": counts.get("set_aside", 0),
               "skipped": counts["skipped"], "failed": counts["failed"], "gpus": eng.slots(),
               "wall_s": round(wall, 3), "ray_start_s": round(ray_s, 3), "cells_wall_s": round(wall - ray_s, 3),
               "store": store.path, "cost": counts.get("cost")}
    if json_out:
        sys.stdout.write(json.dumps(dict(summary, report=rep), indent=1, default=str) + "\n")
    else:
        sys.stdout.write(f"campaign run {run_id}{' (resumed)' if resumed else ''}: ran {counts['ran']} cells, "
                         f"skipped {counts['skipped']} finished earlier, {counts['failed']} failed, "
                         f"{str(counts.get('set_aside')) + ' set aside (nothing to time), ' if counts.get('set_aside') else ''}"
                         f"{wall:.1f} s on {eng.slots()} GPU(s) (Ray start {ray_s:.1f} s); store {store.path}\n")
        cost = counts.get("cost") or {}
        if cost.get("fixed_s_per_cell") is not None:
            sys.stdout.write(f"fixed cost: {cost['fixed_s_per_cell']:.3f} s per cell, {cost['fixed_s_per_replay']:.3f} s "
                             f"per replay ({cost['replays_per_cell']:g} replays a cell, {cost['workers']} workers)\n")
        render_text(rep, sys.stdout)
    return code


class _NoEngine:
    hosts: set = set()

    def slots(self) -> int:
        return 0

    def shutdown(self) -> None:
        pass


def _interrupt(signum, frame):
    raise KeyboardInterrupt       # SIGTERM stops a campaign as Ctrl-C does: whole cells kept


@campaign_app.command("report", cls=_Command)
@needs(Inert("force", "without --html", lambda p: p.get("html") is not None, warn=True))
def report(
    ctx: typer.Context,
    store_path: Path = typer.Argument(..., metavar="STORE", help="A campaign store (campaign run -o)."),
    html: Optional[Path] = typer.Option(None, "--html", metavar="R.html", help="Write a self-contained HTML report with each kernel's trend plotted (needs plotly)."),
    since: Optional[str] = typer.Option(None, "--since", metavar="DATE", help="Only runs started on or after DATE (YYYY-MM-DD or YYYY-MM-DDTHH:MM)."),
    run_id: Optional[int] = typer.Option(None, "--run", metavar="N", min=1, help="The run whose matrix is shown (default: the latest)."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    force: bool = typer.Option(False, "-f", "--force-overwrite", help="Replace an existing HTML report."),
):
    """The matrix of the latest run (snapshot x env, with verdicts), each kernel's history across
    runs, and every regression attributed: its kernel, what differs from the last good cell
    (driver, a variable, a rebuilt kernel), the first run where it appeared.

    Exit 0: no regression; 1: a regression; 2: infrastructure failures, a verdict in a control
    env (noise exceeds the rules), or bad input."""
    from cudasnap.campaign.report import ReportError, build_report, parse_since, render_text, write_html
    from cudasnap.campaign.store import Store, StoreError

    try:
        st = Store(store_path, create=False)
    except StoreError as e:
        _fail(str(e))
    ctx.call_on_close(st.close)   # the last connection to a WAL store removes -wal/-shm
    try:
        since_iso = parse_since(since) if since else None
    except ReportError as e:
        _fail(str(e))
    if html is not None:
        from cudasnap.compare.html import need_plotly
        from cudasnap.formats.outputs import OutputError, check_output
        why = need_plotly()
        if why:
            _fail(why)
        try:
            check_output(html, force=force, inputs=[store_path], what="--html")
        except OutputError as e:
            _fail(str(e))
    try:
        rep = build_report(st, run=run_id, since=since_iso)
    except ReportError as e:
        _fail(str(e))
    if html is not None:
        try:
            write_html(rep, html)
        except OSError as e:
            _fail(f"cannot write {html}: {e.strerror or e}")
        rep["html"] = str(html)
    if json_out:
        sys.stdout.write(json.dumps(rep, indent=1, default=str) + "\n")
    else:
        render_text(rep, sys.stdout)
        if html is not None:
            sys.stdout.write(f"report written to {html}\n")
    raise typer.Exit(rep["exit_code"])
