"""Bounded performance simulation (`replay --sim ... --sim-mode performance --sim-max-ctas N`):
a launch of more than N CTAs is timed on two samples of its first CTAs, N/2 and N (its grid cut
in launch order), and its cycles extrapolated to the whole grid. Two models bracket the answer:
the line through the two samples (right once the samples fill the GPU: each further wave costs
what the last one did) and the larger sample scaled by CTAs (right when the samples run as
waves of the same size as the rest). The estimate is their mean; the stated error, half their
difference. The samples' results are partial: the verdict comes from a functional pass over
every CTA (replay/sim/__init__.py)."""
from __future__ import annotations

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
