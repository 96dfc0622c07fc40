"""The `export` and `extract` commands: run, print the summary, return the exit code."""
from __future__ import annotations

import os
import sys
from typing import Optional

from .emit import ExportError


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= (1 << 20) else f"{n} B"


def run_export_cli(snapshot, outdir, calls: Optional[str] = None, out=None) -> int:
    from .emit import export_snapshot
    out = out or sys.stdout
    if not os.path.exists(snapshot):
        sys.stderr.write(f"cudasnap: error: {snapshot}: no such file\n")
        return 2
    try:
        r = export_snapshot(snapshot, outdir, calls)
    except ExportError as e:
        sys.stderr.write(f"cudasnap export: error: {e}\n")
        return 2
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


def run_extract_cli(snapshot, output, launch=None, kernel=None, calls=None, memory="reachable", device=0,
                    out=None) -> int:
    from .extract import extract
    out = out or sys.stdout
    if not os.path.exists(snapshot):
        sys.stderr.write(f"cudasnap: error: {snapshot}: no such file\n")
        return 2
    try:
        r = extract(snapshot, output, launch=launch, kernel=kernel, calls=calls, memory=memory, device=device)
    except ExportError as e:
        sys.stderr.write(f"cudasnap extract: error: {e}\n")
        return 2
    sel = r.selected
    what = (f"call #{sel[0]}" if len(sel) == 1 else f"calls #{sel[0]}-#{sel[-1]} ({len(sel)} calls)")
    kern = f" ({', '.join(sorted(set(r.kernels))[:3])}{'...' if len(set(r.kernels)) > 3 else ''})" if r.kernels else ""
    pct = 100.0 * r.size / r.original_size if r.original_size else 0.0
    out.write(f"extracted {what}{kern} from {os.fspath(snapshot)} into {r.output}: {_mib(r.size)} "
              f"({pct:.2f}% of {_mib(r.original_size)}) in {r.elapsed_s:.2f} s\n")
    how = ("every live allocation" if r.memory == "all" else
           "the allocations the selection's parameters point into, what pointer scanning found in them, and module globals")
    out.write(f"  memory restored: {len(r.restored)} range(s), {_mib(r.restored_bytes)}: {how}\n")
    out.write(f"  expected results: {r.expected} range(s), {_mib(r.expected_bytes)} (read back after replaying the "
              f"selection); state-building calls kept: {r.prefix_calls}; module loads kept {r.modules_kept}, "
              f"left out {r.modules_dropped}\n")
    for n in r.notes:
        out.write(f"  note: {n}\n")
    out.write(f"  verify: cudasnap replay {r.output}\n")
    return 0
