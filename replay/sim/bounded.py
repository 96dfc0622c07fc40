"""Bounded performance simulation (`replay --sim ... --sim-mode performance --sim-max-ctas N`):
a launch of more than N CTAs is timed on two samples of its first CTAs, N/2 and N (its grid cut
in launch order), and its cycles extrapolated to the whole grid. Two models bracket the answer:
the line through the two samples (right once the samples fill the GPU: each further wave costs
what the last one did) and the larger sample scaled by CTAs (right when the samples run as
waves of the same size as the rest). The estimate is their mean; the stated error, half their
difference. The samples' results are partial: the verdict comes from a functional pass with the
same cap, judged on what it wrote (below)."""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple


def sample_grid(grid: Tuple[int, int, int], n: int) -> Tuple[Tuple[int, int, int], int]:
    """A grid of about the first n CTAs of grid in launch order (x fastest): (grid, its CTAs)."""
    gx, gy, gz = grid
    if n <= gx:
        g = (max(n, 1), 1, 1)
    elif n <= gx * gy:
        g = (gx, -(-n // gx), 1)
    else:
        g = (gx, gy, min(gz, -(-n // (gx * gy))))
    return g, g[0] * g[1] * g[2]


def estimate(total: int, n1: int, c1: int, n2: int, c2: int) -> Dict[str, Any]:
    """Cycles of a whole launch of `total` CTAs from samples (n1 CTAs: c1 cycles, n2: c2)."""
    slope = (c2 - c1) / (n2 - n1) if n2 > n1 else 0.0
    linear = c2 + max(slope, 0.0) * (total - n2)
    scaled = c2 * total / n2
    lo, hi = min(linear, scaled), max(linear, scaled)
    return {"ctas": total, "sampled_ctas": [n1, n2], "sampled_cycles": [c1, c2], "cycles": round((lo + hi) / 2),
            "error_cycles": round((hi - lo) / 2), "error_pct": (hi - lo) / (hi + lo) * 100 if hi + lo else 0.0,
            "linear": round(linear), "scaled": round(scaled)}


def fold(cycles: List[Tuple[str, int]], sampled: List[Dict[str, Any]]) -> List[Tuple[str, int, Optional[Dict]]]:
    """The simulator's kernels in order, each sampled launch's two runs made one estimate:
    [(name, cycles, estimate or None)]."""
    at = {s["at"]: s for s in sampled}
    out: List[Tuple[str, int, Optional[Dict]]] = []
    j = 0
    while j < len(cycles):
        s = at.get(j)
        if s is not None and j + 1 < len(cycles):
            e = estimate(s["total"], s["ctas"][0], cycles[j][1], s["ctas"][1], cycles[j + 1][1])
            out.append((cycles[j][0], e["cycles"], e))
            j += 2
        else:
            out.append((cycles[j][0], cycles[j][1], None))
            j += 1
    return out


# ------------------------------------------------------------------ bounded functional verdict
# `replay --sim ... --sim-max-ctas N` in functional mode (and the verdict pass of performance
# mode): a launch of more than N CTAs runs only its first N in launch order, the grid cut as
# sample_grid cuts it. The first N, not N spread over the grid: the simulator numbers a launch's
# CTAs from 0, so only a prefix keeps every sampled CTA's %ctaid what it was on the GPU.
# Which bytes the sample wrote: every allocation is read before and after the sampled launch and
# the bytes that changed are the ones judged. A CTA storing the value a byte already held is
# invisible to this (that byte is not judged, never counted EXACT), and so is a wrong result that
# left a byte unchanged. Any later launch may read what the unsimulated CTAs would have written:
# after it nothing is judged; a copy or memset into judged bytes unjudges them.
# Kernels the cut would change run whole: one that reads %nctaid (its grid size: a grid-stride
# loop would do other work) or combines CTAs' results through global atomics (partial sums).
# Memory is read into this process twice (before and after, one allocation at a time after):
# at most SAMPLE_BUDGET bytes of allocations in all ($CUDASNAP_SIM_SAMPLE_MB sets it in MiB),
# in address order; what the sample writes in those left out is not judged (counted so).
SAMPLE_MAX_ALLOC = 1 << 30       # allocations larger than this are not read: never judged
SAMPLE_BUDGET = 2 << 30


def sample_budget() -> int:
    """How many bytes of allocations a bounded verdict reads before a sampled launch."""
    import os
    v = os.environ.get("CUDASNAP_SIM_SAMPLE_MB")
    try:
        return max(int(v), 0) << 20 if v else SAMPLE_BUDGET
    except ValueError:
        return SAMPLE_BUDGET

_WHOLE = ((re.compile(r"%nctaid\b"), "it reads its grid size (%nctaid)"),
          (re.compile(r"\b(?:atom|red)(?!\.shared)(?:\.[a-z0-9]+)+\s"), "its CTAs combine results through global atomics"))


def unsampled(body: str) -> Optional[str]:
    """Why a kernel's PTX body cannot be judged on a sample of its CTAs, or None."""
    for rx, why in _WHOLE:
        if rx.search(body):
            return why
    return None


def memory_diff(before: Dict[int, bytes], after: Dict[int, bytes]) -> Dict[int, Any]:
    """allocation base -> numpy bool mask of the bytes that changed (only where some did)."""
    import numpy as np
    out: Dict[int, Any] = {}
    for base, b in before.items():
        a = after.get(base)
        if a is None or len(a) != len(b):
            continue
        m = np.frombuffer(a, dtype=np.uint8) != np.frombuffer(b, dtype=np.uint8)
        if m.any():
            out[base] = m
    return out


def _n(v: int) -> str:
    return f"{v:,}"


def verdict_line(s: Dict[str, Any], outcome: str) -> str:
    """The verdict of a bounded replay: what was judged, on how much of the launch."""
    pct = 100.0 * s["ctas"] / s["of"] if s["of"] else 0.0
    line = (f"{outcome} on {_n(s['ctas'])} of {_n(s['of'])} CTAs of {s['kernel']} ({pct:.1f}% of the launch; "
            f"{_n(s['checked'])} of {_n(s['read'])} result bytes checked, {_n(s['read'] - s['checked'])} not judged")
    if s.get("unjudged"):
        line += f"; {s['unjudged']} D2H result(s) wholly unjudged"
    if s.get("unread"):
        line += (f"; {_n(s['unread'])} bytes of allocations past the memory budget not read "
                 f"(CUDASNAP_SIM_SAMPLE_MB)")
    if s.get("later"):
        line += f"; {s['later']} later launch(es) may read what the unsimulated CTAs write: nothing after them judged"
    return line + ")"
