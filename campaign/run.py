"""A campaign run, start to end: the checks before anything is written, Ray's start, the
engine over every cell not finished earlier, the run's row closed with its exit code, and the
report; Ctrl-C or SIGTERM leaves whole cells and a run marked interrupted (exit 130). The
command line (cli/campaign_cmd.py) parses options and calls run_campaign."""
from __future__ import annotations

import json
import signal
import sys
import time
from typing import Any, Dict, List, Optional

from cudasnap.formats.console import is_tty


class CampaignError(Exception):
    """A campaign that cannot start (one line, exit 2)."""


def _stop(msg: str):
    raise CampaignError(msg)


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
                from cudasnap.formats.console import console
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


def run_campaign(camp, store, address, fresh: bool, ship: bool, json_out: bool, quiet: bool,
                 init_kwargs: Optional[dict] = None) -> int:
    from cudasnap.campaign.engine import stdout_while_ray
    with stdout_while_ray() as real:
        return _run_campaign(camp, store, address, fresh, ship, json_out, quiet, init_kwargs, real)


def _run_campaign(camp, store, address, fresh: bool, ship: bool, json_out: bool, quiet: bool,
                  init_kwargs: Optional[dict], out) -> int:
    from cudasnap.campaign.engine import Engine, EngineError
    from cudasnap.campaign.report import build_report, render_text

    from cudasnap.formats.console import __version__ as version
    base_run = None
    # every check and Ray's start before the store is written: a campaign that cannot start
    # leaves the store as it was (no run row that the next one would resume)
    earlier = None if fresh else store.latest_run(camp)
    if camp.baseline.startswith("run:"):
        base_run = store.resolve_run(camp.baseline, camp.name, -1 if earlier is None else earlier)
        if base_run is None:
            _stop(f"baseline {camp.baseline}: no such earlier run of campaign {camp.name!r} in {store.path}")
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
            _stop(str(e))
        ray_s = time.monotonic() - t0
    run_id, resumed = store.open_run(camp, version, address, fresh)
    status, code = "failed", 2
    from cudasnap.formats import signals as _signals
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    for s, h in old.items():          # the command line has these already; the Python API gets them here
        if h in (signal.SIG_DFL, None):
            signal.signal(s, _interrupt)
    hold = _signals.patient()
    hold.__enter__()
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
        code = _signals.exit_code()
        _signals.acknowledge()        # this line is the report
        store.close_run(run_id, "interrupted", eng.hosts if eng else [], code)
        by = "" if code == 130 else f" by {signal.Signals(code - 128).name}"
        sys.stderr.write(f"cudasnap: interrupted{by}: {n} of {len(camp.cells)} cells are in {store.path}, the run "
                         f"marked interrupted; run the same command again to finish the others\n")
        if eng:
            eng.shutdown()
        store.close()                 # the last connection: no -wal/-shm left
        return code
    except BaseException:       # no run is left "running" by a process that has gone
        store.close_run(run_id, "failed", eng.hosts if eng else [], 2)
        if eng:
            eng.shutdown()
        raise
    finally:
        hold.__exit__(None, None, None)
        for s, h in old.items():
            if h is not None:
                signal.signal(s, h)
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
            sys.stdout.write(f"fixed cost: {cost['fixed_s_per_cell']:.3f} s per cell ({cost['fixed_s_per_cell_started']:.3f} "
                             f"once the servers are up), {cost['fixed_s_per_replay']:.3f} s "
                             f"per replay ({cost['replays_per_cell']:g} replays a cell, {cost['workers']} workers)\n")
        for line in phase_lines(cost.get("phases_by_snapshot") or {}):
            sys.stdout.write(line + "\n")
        if cost.get("replays_per_verdict"):
            sys.stdout.write("replays per verdict: " + ", ".join(f"{v} {n:g}" for v, n in cost["replays_per_verdict"].items())
                             + "\n")
        render_text(rep, sys.stdout)
    return code


def phase_lines(by_snap: Dict[str, Dict[str, float]]) -> List[str]:
    """Where each snapshot's replays spent their time, mean seconds a replay (run.timings_s):
    the phases of a millisecond or more, longest first, then what was loaded and copied."""
    if not by_snap:
        return []
    out = ["where each replay's time went (mean s a replay, by snapshot):"]
    for snap, ph in by_snap.items():
        secs = sorted(((k, v) for k, v in ph.items() if not k.startswith("count.") and v >= 0.001),
                      key=lambda kv: -kv[1])
        n = ph.get("count.modules_loaded")
        counts = (f"; {n:g} module loads ({ph.get('count.module_bytes', 0) / 1e6:.1f} MB), "
                  f"{ph.get('count.h2d_bytes', 0) / 1e6:.1f} MB H2D" if n is not None else "")
        if ph.get("count.plan_reused"):
            counts += f"; plan reused in {100 * ph['count.plan_reused']:.0f}%"
        out.append(f"  {snap}: " + ", ".join(f"{k} {v:.3f}" for k, v in secs) + counts)
    return out


class _NoEngine:
    hosts: set = set()

    def slots(self) -> int:
        return 0

    def shutdown(self) -> None:
        pass


def _interrupt(signum, frame):
    from cudasnap.formats import signals
    signals.on_signal(signum, frame)   # SIGTERM/SIGHUP stop a campaign as Ctrl-C does: whole cells kept


