"""The human summary of a replay."""
from __future__ import annotations

import json
import os
import sys
from typing import List

from .options import ReplayResult


def _hum(n: int) -> str:
    for u in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or u == "GiB":
            return f"{n:.0f} {u}" if u == "B" else f"{n:.1f} {u}"
        n /= 1024
    return str(n)


def json_document():
    """--json owns stdout: what else reaches file descriptor 1 during the replay (a kernel's
    printf, which the driver writes there; a library's messages) goes to stderr instead, and the
    JSON document is written to the original stdout."""
    from cudasnap.formats.console import pipe_safe_text
    sys.stdout.flush()
    doc = pipe_safe_text(os.dup(1), encoding=getattr(sys.stdout, "encoding", None), report_as=1)
    os.dup2(2, 1)
    return doc


def close_text(c) -> str:
    """One CLOSE result (numerics.summarize's row), for a line of text."""
    from .numerics import TYPE_NAMES
    w = f" (last written by #{c['writer'][0]} {c['writer'][1]})" if c.get("writer") else ""
    return (f"call #{c['seq']} {c['call']}{w}: {TYPE_NAMES.get(c.get('dtype') or '', '?')} ({c.get('dtype_source')}): "
            f"{c['differing']} of {c['elements']} elements differ, max abs {_g(c['max_abs'])}, "
            f"max rel {_g(c['max_rel'])}, max {c['max_ulp']} ULP")


def _g(v) -> str:
    return f"{v:.3g}" if isinstance(v, (int, float)) else str(v)


def render(res: ReplayResult, mismatch_text: List[str], path: str, out=None, as_json: bool = False) -> None:
    out = out or sys.stdout
    if as_json:
        d = res.to_dict()
        d["snapshot"] = path
        d["mismatch_text"] = mismatch_text
        out.write(json.dumps(d, indent=2, default=str) + "\n")
        out.flush()                     # now: a failed write is seen before the exit code is chosen
        return
    from cudasnap.formats.console import console, print_table
    con = console(file=out)
    rows = [(f"calls: {fam}", n) for fam, n in sorted(res.by_family.items())]
    rows += [("calls replayed", f"{res.calls} of {res.total_calls}"),
             ("queries / ignored (skipped)", res.skipped)]
    if res.filtered:
        rows.append(("left out by the selection", res.filtered))
    rows += [("launches", res.launches), ("recorded errors recurred", res.errors_recurred),
             ("D2H verified", f"{res.d2h_verified} ({_hum(res.d2h_bytes)})")]
    if res.d2h_unverified:
        rows.append(("D2H without a recorded result", res.d2h_unverified))
    if res.d2h_left_out:
        rows.append(("D2H not compared (selection)", res.d2h_left_out))
    rows += [("mismatches", len(res.mismatches)), ("time", f"{res.elapsed_s:.3f} s"), ("pace", res.pace)]
    print_table(con, ["what", ("count", "right")], rows, title=f"cudasnap replay: {path}")

    def emit(line: str = "") -> None:
        con.print(line, markup=False)

    emit(f"placement: {res.placed} placed at recorded address, {res.fell_back} fell back")
    for fb in res.fallbacks:
        emit(f"  fell back: {fb['rec_base']} ({fb['size']} bytes, call #{fb['seq']}) -> {fb['new_base']}: {fb['reason']}")
    if res.params_relocated:
        emit(f"  {res.params_relocated} kernel parameter(s) relocated into moved allocations")
    for p in res.payload_stale:
        emit(f"  call #{p['seq']} {p['call']}: H2D payload holds {p['count']} stale recorded address(es) "
             f"(first {p['value']} at offset {p['first_offset']}){' - rewritten' if p['rewritten'] else ''}")
    pr = res.profiler or {}
    if pr.get("range") == "workload":
        if pr.get("starts"):
            emit(f"profiler range: cuProfilerStart before call #{pr.get('first_seq', '?')}, cuProfilerStop after "
                 f"call #{pr.get('last_seq', '?')} (the workload)"
                 + (f"; {pr['ignored']} recorded cuProfilerStart/Stop ignored" if pr.get("ignored") else ""))
        else:
            emit("profiler range: no workload call replayed; cuProfilerStart was not called")
    elif pr.get("starts") or pr.get("stops"):
        emit(f"profiler range: recorded cuProfilerStart x{pr.get('starts', 0)}, cuProfilerStop x{pr.get('stops', 0)} "
             f"called as recorded")
    from .endstate import summary_line
    if summary_line(res.endstate):
        emit(summary_line(res.endstate))
    for a in res.arch:
        emit(f"architecture: {a}")
    for w in res.warnings:
        emit(f"note: {w}")
    num = res.numerics or {}
    if res.d2h_verified and num.get("line"):
        emit(num["line"])
        emit(f"D2H results: {num.get('exact', 0)} EXACT, {num.get('close', 0)} CLOSE, {num.get('different', 0)} DIFFERENT")
    for c in num.get("close_results") or []:
        emit(f"CLOSE: {close_text(c)}")
    if num.get("close", 0) > len(num.get("close_results") or []):
        emit(f"CLOSE: ... and {num['close'] - len(num['close_results'])} more")
    if num.get("recheck"):
        emit(f"recheck: {num['recheck']['text']}")
    if res.rounding_mismatches:
        emit(f"note: {res.rounding_mismatches} D2H result(s) differ as float rounding does (below): "
             f"the replay went on past them and still exits 1")
    for m in mismatch_text:
        emit(f"{'MISMATCH' if m.startswith('end state') else 'DIFFERENT'}: {m}")
    for e in res.errors:
        emit(f"ERROR: {e}")
    notes = ""
    if num.get("close"):
        notes += f" ({num['close']} CLOSE within {num.get('tolerance', 'the tolerance')})"
    if res.d2h_left_out:
        notes += (f"; {res.d2h_left_out} D2H result(s) not compared: they depend on work the selection left "
                  f"out{' (the selection replays only part of the snapshot)' if not res.d2h_verified else ''}")
    ok = ("OK: every recorded D2H result reproduced" if res.d2h_verified and not res.d2h_unverified
          and not res.d2h_left_out and not res.filtered else
          f"OK: {res.calls} calls replayed; {res.d2h_verified} D2H result(s) verified, "
          f"{res.d2h_unverified} without a recorded result") + notes
    if res.sample is not None:
        from .sim.bounded import verdict_line
        word = ("NOT JUDGED" if not res.sample["checked"] else "DIFFERENT" if res.mismatches else
                "CLOSE" if num.get("close") else "EXACT")
        emit(f"sample: {verdict_line(res.sample, word)}")
        if res.sample["checked"]:
            ok = (f"OK on a sample: {res.sample['checked']:,} of {res.sample['read']:,} result bytes checked, "
                  f"on {res.sample['ctas']:,} of {res.sample['of']:,} CTAs") + notes
    vary = " (results vary from run to run: see recheck)" if (num.get("recheck") or {}).get("nondeterministic") else ""
    verdict = {0: ok, 1: f"FAILED: verification mismatch{vary}", 2: "FAILED: replay could not proceed"}[res.exit_code]
    emit(f"{verdict} (exit {res.exit_code})")
