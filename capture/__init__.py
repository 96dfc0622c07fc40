"""Capture: run a program under the interception shim and record one snapshot per process.

    ring.py      the consumer side of the shim's shared-memory ring (layout: shim/ring.h)
    decode.py    raw ring records -> schema records, through the API description
    recorder.py  drains every ring of a session into SnapshotWriters
    runner.py    `cudasnap capture`: output name, the program's start and signals, exit code, summary
    window.py    capture windows (--window, --job-window): a state, the window's calls, its end state
    flight.py    the flight recorder (--flight-recorder): rolling checkpoints, the last seconds kept
    group.py     several processes of one job: the group manifest

From Python:

    import cudasnap
    res = cudasnap.capture.run(["./app", "--size", "1024"], out="app.%p.cusnap")
    res.exit_code, res.returncode, res.snapshots      # CaptureResult
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Sequence, Union

if TYPE_CHECKING:
    from .runner import CaptureResult

__all__ = ["run", "CaptureResult", "expand_output", "run_capture"]


def run(command: Union[Sequence[str], str], out: Union[str, "os.PathLike[str]", None] = None, *,
        force: bool = False, quiet: bool = True, forward_signals: bool = False, **options) -> "CaptureResult":
    """Run `command` (a list of arguments, or one program path) under the shim, as
    `cudasnap capture -o OUT -- COMMAND...` does, and return a CaptureResult: exit_code (what
    the command line would exit with), returncode (the program's status, -N for signal N),
    snapshots (the paths written, the started process's first), unsaved, error. `out` takes
    -o's %p, %h, %q{VAR}, %%; an existing file is refused (result.error, exit_code 2)
    unless force. Other keywords: ring_mb, level, threads, placement, all_queries,
    copy_threads, drain, segments (as the command-line options). Signals sent to the calling
    process are not forwarded to the program unless forward_signals (call it from the main
    thread then). Needs no GPU and no cuda-python."""
    from .runner import capture

    return capture(command, out, force=force, quiet=quiet, forward_signals=forward_signals, **options)


def __getattr__(name: str):
    if name in ("CaptureResult", "expand_output", "run_capture"):
        from . import runner

        return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
