"""The `export` and `extract` commands: run, print the summary, return the exit code."""
from __future__ import annotations

import functools
import os
import shutil
import sys
from typing import Optional

from cudasnap.formats import SnapshotError
from cudasnap.formats.outputs import OutputError, atomic_path, check_output

from .emit import ExportError


def _err(msg: str) -> int:
    sys.stderr.write(f"cudasnap: error: {' '.join(str(msg).split())}\n")
    return 2


def _before_work(snapshot, output, force: bool, kind: str) -> Optional[str]:
    """Why the command must not start: a missing or unusable snapshot, an output the rule refuses."""
    if not os.path.exists(snapshot):
        return f"{snapshot}: no such file"
    try:
        check_output(output, force, kind, [snapshot])
    except OutputError as e:
        return str(e)
    from cudasnap.replay.preflight import snapshot_problem
    return snapshot_problem(snapshot)


def _export_sim(snapshot, outdir, calls, created: bool, out) -> int:
    """export --sim: the program for GPGPU-Sim (replay/sim/export.py)."""
    from cudasnap.replay.sim import SimProblem
    from cudasnap.replay.sim.export import export_sim
    if calls:
        return _err("--calls with --sim: extract the launches first (cudasnap extract), then export the extract")
    try:
        os.makedirs(outdir, exist_ok=True)
        n, launches, checks = export_sim(snapshot, os.fspath(outdir))
    except (SimProblem, SnapshotError, OSError) as e:
        if created and os.path.isdir(outdir):
            shutil.rmtree(outdir, ignore_errors=True)
        return _err(str(e))
    out.write(f"exported {os.fspath(snapshot)} for GPGPU-Sim to {outdir}: {n} calls, {launches} launches, {checks} "
              f"D2H results to verify\n  build: make -C {outdir} SIM=DIR; run: make -C {outdir} run SIM=DIR "
              f"[CONFIG=...] [MODE=performance]\n")
    return 0


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= (1 << 20) else f"{n} B"


def run_export_cli(snapshot, outdir, calls: Optional[str] = None, out=None, force: bool = False,
                   sim: bool = False) -> int:
    from .emit import export_snapshot
    out = out or sys.stdout
    why = _before_work(snapshot, outdir, force, "dir")
    if why:
        return _err(why)
    created = not os.path.lexists(outdir)
    if sim:
        return _export_sim(snapshot, outdir, calls, created, out)
    try:
        r = export_snapshot(snapshot, outdir, calls)
    except (ExportError, SnapshotError, OSError, KeyboardInterrupt) as e:
        if created and os.path.isdir(outdir):     # everything in it is this export's: leave nothing
            shutil.rmtree(outdir, ignore_errors=True)
        if isinstance(e, KeyboardInterrupt):
            from cudasnap.formats.outputs import Interrupted
            raise Interrupted(f"no output was written (the partial {os.fspath(outdir)} was removed)" if created else
                              f"{os.fspath(outdir)} holds part of an export (each file whole): export again "
                              f"with -f") from None
        return _err(_oserror(e))
    skipped = []
    if r.queries_skipped:
        skipped.append(f"{r.queries_skipped} queries")
    if r.failed_skipped:
        skipped.append(f"{r.failed_skipped} calls that failed when recorded")
    if r.no_effect:
        skipped.append(f"{r.no_effect} without effect on the device (hints, host memory)")
    if r.filtered:
        skipped.append(f"{r.filtered} outside --calls")
    out.write(f"exported {os.fspath(snapshot)} to {r.outdir}: {r.calls} calls, {r.launches} launches of "
              f"{r.kernels} kernels, {r.modules} module image(s)\n")
    out.write(f"  data: {r.h2d_files} H2D payload file(s) ({_mib(r.h2d_bytes)}), {r.d2h_files} expected D2H "
              f"result file(s) ({_mib(r.d2h_bytes)}) in {os.path.join(r.outdir, 'data')}\n")
    if skipped:
        out.write(f"  left out: {', '.join(skipped)}\n")
    for n in r.notes:
        out.write(f"  note: {n}\n")
    out.write(f"  build and run: make -C {r.outdir} && {r.program}   ({r.elapsed_s:.2f} s)\n")
    return 0


def _oserror(e: Exception) -> str:
    if isinstance(e, OSError) and e.filename and e.strerror:
        return f"{e.filename}: {e.strerror}"
    return str(e)


def run_extract_cli(snapshot, output, launch=None, kernel=None, calls=None, memory=None, device=0,
                    out=None, ranges=None, check=False, force: bool = False, sass: str = "device",
                    watchdog: Optional[float] = None, tolerance: Optional[str] = None) -> int:
    """memory/ranges None: the defaults (reachable memory, exact ranges or segment for a graph
    launch); with --check, an extract that does not verify is made again with what the user left
    to the defaults widened, one step at a time: whole allocations, then every live allocation
    (explicit --ranges exact is kept: the check then answers for exact ranges)."""
    out = out or sys.stdout
    if tolerance is not None:             # --check's replay judges CLOSE results with it
        from cudasnap.replay.numerics import parse_tolerance
        try:
            parse_tolerance(tolerance)
        except ValueError as e:
            return _err(str(e))
    why = _before_work(snapshot, output, force, "file")
    if why:
        return _err(why)
    try:
        return _extract_checked(snapshot, output, launch, kernel, calls, memory, device, out, ranges, check, sass,
                                watchdog, tolerance)
    except KeyboardInterrupt:
        from cudasnap.formats.outputs import Interrupted, written
        if os.path.abspath(output) in map(os.path.abspath, written()):
            raise Interrupted(f"{os.fspath(output)} was written whole, but its --check did not finish") from None
        raise Interrupted("no output was written") from None


def _extract_checked(snapshot, output, launch, kernel, calls, memory, device, out, ranges, check, sass,
                     watchdog=None, tolerance=None) -> int:
    once = functools.partial(_extract_once, sass=sass, watchdog=watchdog, tolerance=tolerance)
    code, r = once(snapshot, output, launch, kernel, calls, memory or "reachable", device, out, ranges,
                   check, widen=(ranges is None, memory is None and ranges != "exact"))
    if code == 1 and ranges is None and r is not None and r.ranges == "exact" and r.memory == "reachable":
        out.write("  check: exact ranges did not verify; extracting again with --ranges segment (whole allocations)\n")
        code, r = once(snapshot, output, launch, kernel, calls, memory or "reachable", device, out,
                       "segment", check, widen=(False, memory is None))
    if code == 1 and memory is None and ranges != "exact" and r is not None and r.memory == "reachable":
        out.write("  check: the allocations the selection reaches did not verify; extracting again with "
                  "--memory all (every live allocation)\n")
        code, r = once(snapshot, output, launch, kernel, calls, "all", device, out, "segment", check)
    return code


def _extract_once(snapshot, output, launch, kernel, calls, memory, device, out, ranges, check, widen=(False, False),
                  sass="device", watchdog=None, tolerance=None):
    """(exit code, result): one extract written to output, checked when asked. widen: (ranges,
    memory) left to the defaults, so a failed check is followed by a wider extract."""
    from .extract import extract
    try:
        with atomic_path(output) as tmp:        # the extract appears whole or not at all
            r = extract(snapshot, tmp, launch=launch, kernel=kernel, calls=calls, memory=memory, ranges=ranges,
                        device=device, sass=sass, watchdog=watchdog)
    except (ExportError, SnapshotError, OSError) as e:
        return _err(_oserror(e)), None
    r.output = os.fspath(output)
    sel = r.selected
    what = (f"call #{sel[0]}" if len(sel) == 1 else f"calls #{sel[0]}-#{sel[-1]} ({len(sel)} calls)")
    kern = f" ({', '.join(sorted(set(r.kernels))[:3])}{'...' if len(set(r.kernels)) > 3 else ''})" if r.kernels else ""
    pct = 100.0 * r.size / r.original_size if r.original_size else 0.0
    out.write(f"extracted {what}{kern} from {os.fspath(snapshot)} into {r.output}: {_mib(r.size)} "
              f"({pct:.2f}% of {_mib(r.original_size)}) in {r.elapsed_s:.2f} s\n")
    how = ("every live allocation" if r.memory == "all" else
           "from each pointer the selection reaches to the next tensor start (--ranges exact)" if r.ranges == "exact"
           else "the allocations the selection's parameters point into, what pointer scanning found in them, "
                "and module globals")
    out.write(f"  memory restored: {len(r.restored)} range(s), {_mib(r.restored_bytes)}: {how}\n")
    seg_pct = 100.0 * r.restored_bytes / r.segments_bytes if r.segments_bytes else 0.0
    out.write(f"  restored bytes: {r.restored_bytes} of the {r.segments_bytes} in the {r.segments} allocation(s) "
              f"they lie in ({seg_pct:.1f}%); extract file {r.size} B = {pct:.2f}% of the source's "
              f"{r.original_size} B\n")
    if r.written_beyond:
        out.write(f"  written beyond the ranges: {_mib(r.written_beyond)} (restored and verified too)\n")
    out.write(f"  expected results: {r.expected} range(s), {_mib(r.expected_bytes)} (read back after replaying the "
              f"selection); state-building calls kept: {r.prefix_calls}; module loads kept {r.modules_kept} "
              f"({_mib(r.module_bytes)}), left out {r.modules_dropped}\n")
    if r.sass_dropped:
        out.write(f"  module images: SASS for {', '.join(f'sm_{a}' for a in r.sass_dropped)} left out "
                  f"({_mib(r.sass_dropped_bytes)}; the recorded GPU's and every PTX entry kept; --sass all keeps it)\n")
    if r.allocs_dropped or r.lookups_dropped or r.objects_dropped:
        out.write(f"  calls left out: {r.allocs_dropped} allocation(s) the selection cannot reach, with their frees; "
                  f"{r.lookups_dropped} function lookup(s) no kept launch uses; {r.objects_dropped} stream(s) and "
                  f"event(s) no kept call names\n")
    for n in r.notes:
        out.write(f"  note: {n}\n")
    if not check:
        out.write(f"  verify: cudasnap replay {r.output}"
                  + ("   (if it does not verify, extract again with --ranges segment)\n" if r.ranges == "exact" else "\n"))
        return 0, r
    more = (widen[0] and r.ranges == "exact") or (widen[1] and r.memory == "reachable")
    return _check(r, device, out, retry=more, watchdog=watchdog, tolerance=tolerance), r


def _check(r, device: int, out, retry: bool = False, watchdog: Optional[float] = None,
           tolerance: Optional[str] = None) -> int:
    """Replay the extract in a fresh process: 0 when it verifies, 1 when it does not."""
    import subprocess
    from cudasnap.replay.invocation import command, plain
    cmd = command(sys.executable, plain(r.output, device, watchdog, tolerance))
    try:
        # a process of its own: the extract may fault (bytes left out): a sticky error would end the context a widened extract needs
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    except subprocess.TimeoutExpired:
        sys.stderr.write(f"cudasnap extract: check: replay of {r.output} did not finish within an hour\n")
        return 1
    last = [ln.strip() for ln in (cp.stdout + cp.stderr).splitlines() if ln.strip()]
    if cp.returncode == 0:
        out.write(f"  check: replay of {r.output} verified ({last[-1] if last else 'exit 0'})\n")
        return 0
    why = next((ln for ln in last if ln.startswith(("DIFFERENT:", "MISMATCH:", "ERROR:"))), last[-1] if last else "")
    if retry:                     # a fault may come from bytes left out too: widened below
        out.write(f"  check: replay of {r.output} does not verify ({why})\n")
        return 1
    hint = ("replay the extract for details" if cp.returncode != 1 else     # not a mismatch
            "the selection reads bytes beyond the ranges restored with --ranges exact; extract again with "
            "--ranges segment (whole allocations)" if r.ranges == "exact" else
            "the selection reaches memory its parameters do not name; extract again with --memory all"
            if r.memory == "reachable" else "replay the extract for details")
    sys.stderr.write(f"cudasnap extract: check: replay of {r.output} does not verify (exit {cp.returncode}: "
                     f"{why}): {hint}\n")
    return 1
