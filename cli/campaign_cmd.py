"""`cudasnap campaign run|report`: options and calls; the run is campaign/run.py, the report campaign/report.py."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from cudasnap.typer_base import Command as _Command, Inert, fail as _fail, needs


campaign_app = typer.Typer(
    add_completion=False, no_args_is_help=True, rich_markup_mode=None,
    help="Regression campaigns: every snapshot x every environment, one replay per GPU, on Ray; results kept in an SQLite store.",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})


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
    why = _store_problem(output, campaign)
    if why:
        _fail(why)
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
    from cudasnap.campaign.run import CampaignError, run_campaign
    try:
        code = run_campaign(camp, store, address, fresh, ship, json_out, quiet)
    except CampaignError as e:
        _fail(str(e))
    raise typer.Exit(code)


def _store_problem(output: Path, campaign: Path) -> Optional[str]:
    """Why the store cannot be written, found before Ray starts: the rule of every output (a
    missing directory, a dangling link, a name too long, a directory that cannot be written),
    an existing store that cannot be written, a disk without room for its first cells."""
    import os
    from cudasnap.formats.outputs import OutputError, check_output
    exists = os.path.isfile(output)
    try:
        check_output(output, force=exists, inputs=[campaign], what="-o")
    except OutputError as e:
        return str(e)
    if exists and not os.access(output, os.R_OK | os.W_OK):
        return f"-o {output}: the store cannot be written (permission denied)"
    try:
        st = os.statvfs(os.path.dirname(os.path.abspath(output)))
        if st.f_bavail * st.f_frsize < (1 << 20):
            return f"-o {output}: no space left on the device that holds it (under 1 MiB free)"
    except OSError:
        pass
    return None


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
