"""cudasnap.replay: re-execute a snapshot on a GPU (through cuda-python) and verify it.

    from cudasnap.replay import replay
    result = replay("x.cusnap", device=0)
    result.exit_code   # 0 verified, 1 mismatch, 2 could not proceed
"""
from __future__ import annotations

import dataclasses
import os
from typing import Optional

from .options import ReplayOptions, ReplayResult
from .preflight import damaged, snapshot_problem

__all__ = ["replay", "ReplayOptions", "ReplayResult", "Replayer", "run_replay_cli", "snapshot_problem"]


def __getattr__(name):
    if name == "Replayer":
        from .engine import Replayer
        return Replayer
    raise AttributeError(name)


def replay(snapshot, driver=None, **kw) -> ReplayResult:
    """Replay `snapshot`; keyword arguments are ReplayOptions fields (device, calls, kernels,
    tolerance, exact, dtype, dtype_for, recheck, continue_on_error, watchdog, threads, ...).
    result.numerics holds the EXACT / CLOSE / DIFFERENT counts and the tolerance used."""
    from .engine import Replayer
    opts = ReplayOptions(**kw)
    problem = option_problem(opts) or snapshot_problem(snapshot)
    if problem:                           # as the CLI: exit 2 before any GPU work
        return ReplayResult(exit_code=2, errors=[problem], message=problem)
    from cudasnap.formats import SnapshotError
    import io
    rp = Replayer(snapshot, opts, driver=driver)
    rp.preflight = arch_check(opts, io.StringIO())     # a refusal is the result's error
    _want_digests(rp, opts, driver)
    try:
        res = rp.run()
    except SnapshotError as e:
        msg = damaged(e)
        return ReplayResult(exit_code=2, errors=[msg], message=msg)
    finally:
        # the driver state goes back, so that the next replay of this process places its memory
        # at the recorded addresses again (a second replay over the first's spun in the driver
        # on an H200)
        rp.close()
    recheck(snapshot, opts, rp, driver)
    return res


def arch_check(opts: ReplayOptions, out, err=None):
    """The engine's preflight (Replayer.preflight): retarget.preflight on the replay's own
    records, its lines on out (unless quiet), a refusal also on err; returns the refusal."""
    def check(reader) -> Optional[str]:
        import io
        from .retarget import preflight
        e = io.StringIO()
        if not preflight(reader, opts.device, opts.jit, out, quiet=opts.quiet, err=e):
            return None
        text = e.getvalue().strip()
        if err is not None:
            err.write(text + "\n")
        return text.replace("cudasnap: error: ", "", 1)
    return check


def _want_digests(rp, opts, driver) -> None:
    if opts.recheck or (opts.recheck is None and driver is None):
        rp.ctx.digests = {}


def recheck(snapshot, opts: ReplayOptions, rp, driver=None) -> None:
    """Where results were CLOSE (or differed only as rounding does), replay once more and compare
    what the two replays read there: results that vary from run to run are the program's own
    nondeterminism (float atomics, unordered reductions), not the target's doing. Only closed
    replays (rp.close() done) are followed by another."""
    from .engine import Replayer
    res = rp.ctx.res
    first = rp.ctx.digests
    seqs = sorted({c["seq"] for c in res.numerics.get("close_results") or []}
                  | {m["seq"] for m in res.mismatches if m.get("hint") or (m.get("numerics") or {}).get("dtype")})
    if first is None or not seqs or res.errors:
        return
    again = Replayer(snapshot, dataclasses.replace(opts, quiet=True, progress=False, continue_on_error=True),
                     driver=driver)
    again.ctx.digests = {}
    try:
        again.run()
    except Exception as e:              # the first replay's verdict stands; say why none came
        res.numerics["recheck"] = {"text": f"a second replay to check for nondeterminism failed: {e}"}
        return
    finally:
        try:
            again.close()
        except Exception:               # the second replay's state: nothing the verdict needs
            pass
    second = again.ctx.digests            # no digest: equal to the recording this time
    varied = [q for q in seqs if q in first and second.get(q) != first[q]]
    checked = [q for q in seqs if q in first]
    if varied:
        text = (f"a second replay read other bits than the first at {len(varied)} of {len(checked)} result(s) "
                f"(call #{', #'.join(map(str, varied[:5]))}): the program's own results vary from run to run "
                f"(float atomics, unordered reductions), so their difference from the recording is not the "
                f"target's doing")
    else:
        text = (f"a second replay read the same bits at all {len(checked)} result(s) that differ: this target "
                f"computes them deterministically, so the difference is the target's (or the recorded run's "
                f"own nondeterminism, which replays here cannot see)")
    res.numerics["recheck"] = {"varied": varied, "checked": checked, "nondeterministic": bool(varied), "text": text}


def option_problem(opts: ReplayOptions) -> Optional[str]:
    """What is wrong with these options before any work (the CLI and the Python API say the same)."""
    from .numerics import parse_dtype_specs, policy_of
    if opts.rtol < 0 or opts.atol < 0:
        return "--rtol and --atol must be >= 0"
    if opts.exact and (opts.tolerance or opts.rtol or opts.atol):
        return "--exact asks for bit-exact results: leave out --tolerance/--rtol/--atol"
    try:
        parse_dtype_specs(([opts.dtype] if opts.dtype else []) + list(opts.dtype_for or []))
        policy_of(opts)
    except ValueError as e:
        return str(e)
    if opts.devices is not None:
        from .devices import DeviceMapError, parse as parse_devices
        try:
            parse_devices(opts.devices)
        except DeviceMapError as e:
            return str(e)
    if opts.launch_override:
        import re
        from .override import parse as parse_override
        try:
            parse_override(opts.launch_override)
        except (ValueError, re.error) as e:
            return f"--launch-override {opts.launch_override}: {e}" if isinstance(e, re.error) else str(e)
    return None


def run_replay_cli(snapshot, opts: ReplayOptions, as_json: bool = False, out=None, driver=None) -> int:
    """The `cudasnap replay` command: replay, print the summary, return the exit code.
    driver: a Driver API other than the GPU's (the simulator backend, replay/sim/); its own
    preflight has run."""
    import re
    import sys
    from cudasnap.formats import SnapshotError
    from .engine import Replayer
    from .summary import json_document, render
    out = out or sys.stdout
    problem = option_problem(opts) or snapshot_problem(snapshot)
    if problem:
        sys.stderr.write(f"cudasnap: error: {problem}\n")
        return 2
    if opts.jit == "ptx":
        os.environ["CUDA_MODULE_LOADING"] = "EAGER"      # JIT at load, so the load's time is the JIT's
    lines = sys.stderr if as_json else out
    if as_json and out is sys.stdout:
        out = json_document()
    rp = Replayer(snapshot, opts, driver=driver)
    rp.preflight = arch_check(opts, lines, sys.stderr)     # after the pass over the records, before the GPU
    _want_digests(rp, opts, driver)
    if opts.launch_override:
        from .override import LaunchOverride
        try:
            rp.subscribers.append(LaunchOverride(opts.launch_override))
        except (ValueError, re.error) as e:
            sys.stderr.write(f"cudasnap: error: {e}\n")
            return 2
    try:
        res = rp.run()
    except SnapshotError as e:             # a damaged frame after the first call
        sys.stderr.write(f"cudasnap: error: {damaged(e)}\n")
        return 2
    if rp.refused:                         # said on stderr; nothing was replayed
        return 2
    if rp.empty_selection:
        sys.stderr.write(f"cudasnap: error: {rp.empty_selection}\n")
        return 2
    if rp.ctx.digests is not None and not opts.launch_override:
        rp.close()
        recheck(snapshot, opts, rp, driver)
    if not opts.quiet or as_json:
        render(res, rp.ctx.mismatch_text, os.fspath(snapshot), out, as_json)
        out.flush()
    elif res.exit_code:
        for e in (res.errors or rp.ctx.mismatch_text)[:1]:
            sys.stderr.write(f"cudasnap: {e}\n")
    return res.exit_code
