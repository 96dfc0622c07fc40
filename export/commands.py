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
