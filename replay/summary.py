"""The human summary of a replay."""
from __future__ import annotations

import json
import sys
from typing import List

from .options import ReplayResult


def _hum(n: int) -> str:
    for u in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or u == "GiB":
            return f"{n:.0f} {u}" if u == "B" else f"{n:.1f} {u}"
        n /= 1024
    return str(n)


def render(res: ReplayResult, mismatch_text: List[str], path: str, out=None, as_json: bool = False) -> None:
    out = out or sys.stdout
    if as_json:
        d = res.to_dict()
        d["snapshot"] = path
        d["mismatch_text"] = mismatch_text
        out.write(json.dumps(d, indent=2, default=str) + "\n")
        return
    lines = []
    try:
        from rich.console import Console
        from rich.table import Table
        con = Console(file=out, highlight=False, soft_wrap=True)
        t = Table(title=f"cudasnap replay: {path}", show_header=True)
        t.add_column("what")
        t.add_column("count", justify="right")
        for fam, n in sorted(res.by_family.items()):
            t.add_row(f"calls: {fam}", str(n))
        t.add_row("calls replayed", f"{res.calls} of {res.total_calls}")
        t.add_row("queries / ignored (skipped)", str(res.skipped))
        if res.filtered:
            t.add_row("left out by --calls/--kernels", str(res.filtered))
        t.add_row("launches", str(res.launches))
        t.add_row("recorded errors recurred", str(res.errors_recurred))
        t.add_row("D2H verified", f"{res.d2h_verified} ({_hum(res.d2h_bytes)})")
        if res.d2h_unverified:
            t.add_row("D2H without a recorded result", str(res.d2h_unverified))
        t.add_row("mismatches", str(len(res.mismatches)))
        t.add_row("time", f"{res.elapsed_s:.3f} s")
        con.print(t)
        emit = con.print
    except Exception:  # rich missing: plain text
        emit = lambda s="": out.write(str(s) + "\n")  # noqa: E731
        emit(f"cudasnap replay: {path}: {res.calls}/{res.total_calls} calls, {res.launches} launches, "
             f"{res.d2h_verified} D2H verified ({_hum(res.d2h_bytes)}), {len(res.mismatches)} mismatches, "
             f"{res.elapsed_s:.3f} s")
    emit(f"placement: {res.placed} placed at recorded address, {res.fell_back} fell back")
    for fb in res.fallbacks:
        emit(f"  fell back: {fb['rec_base']} ({fb['size']} bytes, call #{fb['seq']}) -> {fb['new_base']}: {fb['reason']}")
    if res.params_relocated:
        emit(f"  {res.params_relocated} kernel parameter(s) relocated into moved allocations")
    for p in res.payload_stale:
        emit(f"  call #{p['seq']} {p['call']}: H2D payload holds {p['count']} stale recorded address(es) "
             f"(first {p['value']} at offset {p['first_offset']}){' - rewritten' if p['rewritten'] else ''}")
    for a in res.arch:
        emit(f"architecture: {a}")
    for w in res.warnings:
        emit(f"note: {w}")
    for m in mismatch_text:
        emit(f"MISMATCH: {m}")
    for e in res.errors:
        emit(f"ERROR: {e}")
    verdict = {0: "OK: every recorded D2H result reproduced", 1: "FAILED: verification mismatch",
               2: "FAILED: replay could not proceed"}[res.exit_code]
    emit(f"{verdict} (exit {res.exit_code})")
