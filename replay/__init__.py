"""cudasnap.replay: re-execute a snapshot on a GPU (through cuda-python) and verify it.

    from cudasnap.replay import replay
    result = replay("x.cusnap", device=0)
    result.exit_code   # 0 verified, 1 mismatch, 2 could not proceed
"""
from __future__ import annotations

import os
from typing import Optional

from .options import ReplayOptions, ReplayResult

__all__ = ["replay", "ReplayOptions", "ReplayResult", "Replayer", "run_replay_cli"]


def __getattr__(name):
    if name == "Replayer":
        from .engine import Replayer
        return Replayer
    raise AttributeError(name)


def replay(snapshot, driver=None, **kw) -> ReplayResult:
    """Replay `snapshot`; keyword arguments are ReplayOptions fields (device, calls, kernels,
    rtol, atol, dtype, continue_on_error, watchdog, sync_after_launch, threads, ...)."""
    from .engine import Replayer
    opts = ReplayOptions(**kw)
    return Replayer(snapshot, opts, driver=driver).run()


def run_replay_cli(snapshot, opts: ReplayOptions, as_json: bool = False, out=None) -> int:
    """The `cudasnap replay` command: replay, print the summary, return the exit code."""
    import sys
    from .engine import Replayer
    from .summary import render
    out = out or sys.stdout
    if opts.dtype and opts.dtype not in ("f32", "f16", "bf16", "f64"):
        sys.stderr.write(f"cudasnap: error: --dtype must be one of f32, f16, bf16, f64\n")
        return 2
    if not os.path.exists(snapshot):
        sys.stderr.write(f"cudasnap: error: {snapshot}: no such file\n")
        return 2
    rp = Replayer(snapshot, opts)
    try:
        res = rp.run()
    except KeyboardInterrupt:
        sys.stderr.write("cudasnap: replay interrupted\n")
        return 2
    if not opts.quiet or as_json:
        render(res, rp.mismatch_text, os.fspath(snapshot), out, as_json)
    elif res.exit_code:
        for e in (res.errors or rp.mismatch_text)[:1]:
            sys.stderr.write(f"cudasnap: {e}\n")
    return res.exit_code
