"""Findings from hardware counters: a metrics profile (`replay --profile metrics --out M.json`)
says, per heavy kernel, what bounds it, with the figures Nsight Compute's SpeedOfLight and
Occupancy sections show:

- memory-bound: the memory system near its peak (>= 60%) and at least 10 points above the
  SMs, named by its unit (DRAM, L2 or L1/TEX: the one whose throughput is nearest the memory
  throughput, as ncu's breakdown names the sub-unit);
- compute-bound: the SMs near their peak and at least 10 points above memory, with the
  dominant precision's share of its FLOP peak (tensor cores included);
- compute- and memory-bound: both near their peaks within 10 points of each other (a tuned
  GEMM), each figure named;
- latency-bound: neither near its peak (a kernel that cannot keep the GPU busy), explained by
  its achieved and theoretical occupancy;
- low theoretical occupancy, named by its limiter (registers, shared memory, block size).
The thresholds are those of Nsight Compute's SpeedOfLight bottleneck rule (60% near a peak,
10 points balanced).

The time at stake of a bound finding is the kernel's time beyond its roof: what it would save
running its binding unit at 100% of peak (an upper bound no change reaches)."""
from __future__ import annotations

import json
import math
import re
from typing import Any, Dict, List, Optional, Tuple

from cudasnap.replay.names import short_name
from cudasnap.replay.profile import metrics_sections as ms
from cudasnap.replay.profile.metrics_sections import precision_label
from cudasnap.replay.profile.modes import for_advise
from cudasnap.replay.profile.report import shape_problem

from .findings import finding
from .source import AdviseError

SM, MEM, DRAM, L2, L1, WARPS = ms.SM_PCT, ms.MEM_PCT, ms.DRAM_PCT, ms.L2_PCT, ms.L1_PCT, ms.WARPS_PCT
NEAR_PEAK = 60.0            # a unit at or above this % of its peak binds the kernel
BALANCED = 10.0             # SM and memory closer than this (points): both bind
LOW_OCCUPANCY = 50.0        # theoretical occupancy below this % is a finding of its own
LIMITERS = {"registers": "registers per thread", "shared_memory": "shared memory per block",
            "smem": "shared memory per block", "block_size": "threads per block", "warps": "warps per SM",
            "blocks": "blocks per SM"}


def read_metrics(path: str) -> Dict[str, Any]:
    """A metrics profile's JSON; AdviseError (one line) for anything else."""
    try:
        with open(path, encoding="utf-8") as f:
            p = json.load(f)
    except OSError as e:
        raise AdviseError(f"--metrics {path}: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise AdviseError(f"--metrics {path}: not a cudasnap profile ({type(e).__name__}: {e})") from None
    if not isinstance(p, dict) or not isinstance(p.get("summary"), dict):
        raise AdviseError(f"--metrics {path}: not a cudasnap profile")
    why = shape_problem(p)
    if why:
        raise AdviseError(f"--metrics {path}: not a profile as cudasnap writes it: {why}")
    mode, want = p["summary"].get("mode"), for_advise("counters").name
    if mode != want:
        raise AdviseError(f"--metrics {path}: the profile is in {mode or 'an unknown'} mode; --metrics takes the JSON of "
                          f"`replay --profile {want} --out M.json`")
    if not [k for k in p.get("kernels") or [] if isinstance(k, dict) and k.get("metrics")]:
        raise AdviseError(f"--metrics {path}: the profile holds no kernel with counters"
                          + (f" ({p['summary']['error']})" if p["summary"].get("error") else ""))
    return p


def _pct(m: Dict[str, Any], name: str) -> Optional[float]:
    v = m.get(name)
    return float(v) if isinstance(v, (int, float)) else None


def counter_findings(p: Dict[str, Any], top: int = 5, min_share_pct: float = 5.0) -> List[Dict[str, Any]]:
    """Bound and occupancy findings for the heaviest kernels of a metrics profile."""
    ks = [k for k in p.get("kernels") or [] if isinstance(k, dict) and k.get("metrics")]
    total = sum(k.get("total_us") or 0.0 for k in ks) or 1.0
    ks.sort(key=lambda k: -(k.get("total_us") or 0.0))
    out: List[Dict[str, Any]] = []
    for k in ks[:top]:
        t = k.get("total_us") or 0.0
        share = t / total * 100
        if share < min_share_pct and out:
            continue
        m, name = k["metrics"], k.get("name") or "?"
        sm, mem, dram, warps = _pct(m, SM), _pct(m, MEM), _pct(m, DRAM), _pct(m, WARPS)
        if sm is None and mem is None:
            continue
        occ = k.get("occupancy") or {}
        roof = k.get("roofline") or {}
        units = {u: v for u, v in (("DRAM", dram), ("L2", _pct(m, L2)), ("L1/TEX", _pct(m, L1))) if v is not None}
        unit = min(units, key=lambda u: abs(units[u] - mem)) if units and mem is not None else None
        ev: Dict[str, Any] = {"launches": k.get("launches"), "total_us": round(t, 3), "share_pct": round(share, 1),
                              "sm_pct": sm, "memory_pct": mem, "dram_pct": dram, "l2_pct": units.get("L2"),
                              "l1tex_pct": units.get("L1/TEX"), "memory_unit": unit,
                              "achieved_occupancy_pct": warps,
                              "theoretical_occupancy_pct": occ.get("theoretical_pct"),
                              "limiter": occ.get("limiter")}
        if roof.get("intensity") is not None or roof.get("dominant"):
            ev.update(intensity=roof.get("intensity"), ridge=roof.get("ridge"),
                      flop_pct_of_peak=roof.get("pct_of_flop_peak"), precision=roof.get("dominant"))
        top_pct = max(x for x in (sm, mem) if x is not None)
        beyond = t * (1 - min(top_pct, 100.0) / 100)
        short = short_name(name)
        fl = (f", {roof['pct_of_flop_peak']:.0f}% of the {precision_label(roof.get('dominant'))} FLOP peak"
              if isinstance(roof.get("pct_of_flop_peak"), (int, float)) else "")
        mem_unit = f"{unit} throughput {units[unit]:.0f}% of peak" if unit else f"memory throughput {mem or 0:.0f}% of peak"
        if unit and unit != "DRAM" and dram is not None:
            mem_unit += f", DRAM {dram:.0f}%"
        if top_pct < NEAR_PEAK:
            why = (f"achieved occupancy {warps:.0f}%" if warps is not None else "occupancy unknown")
            if isinstance(occ.get("theoretical_pct"), (int, float)):
                why += f" of a theoretical {occ['theoretical_pct']:.0f}%"
            out.append(finding("latency-bound", f"latency-bound: {short}, SM {sm or 0:.0f}% and memory "
                                f"{mem or 0:.0f}% of peak ({why})", beyond, ev,
                                "Neither the SMs nor memory are near their peak: the kernel waits (too few warps to "
                                "hide latency, dependent loads, a small grid). More parallel work per launch or a "
                                "higher occupancy are what help.", "the kernel's time beyond its nearest roof",
                                kernel=name))
        elif sm is not None and mem is not None and abs(sm - mem) < BALANCED:
            out.append(finding("compute-and-memory-bound", f"compute- and memory-bound: {short}, SM throughput "
                                f"{sm:.0f}% and {mem_unit}{fl}", beyond, ev,
                                f"The SMs and the memory system ({unit or 'memory'}) both run near their peaks: only "
                                "less work helps, fewer instructions (tensor cores, lower precision) and fewer bytes "
                                f"through {unit or 'memory'} (larger tiles, more reuse in registers and shared memory).",
                                "the kernel's time beyond its nearer roof", kernel=name))
        elif mem is not None and mem >= (sm or 0):
            out.append(finding("memory-bound", f"memory-bound: {short}, {mem_unit}", beyond, ev,
                                "The kernel moves bytes as fast as the memory allows: cut the bytes (fuse it with "
                                "its neighbours, a narrower data type, reuse through shared memory or L2).",
                                "the kernel's time beyond its memory roof", kernel=name))
        else:
            out.append(finding("compute-bound", f"compute-bound: {short}, SM throughput {sm:.0f}% of peak{fl}",
                                beyond, ev, "The SMs are busy: fewer or cheaper instructions (tensor cores, lower "
                                "precision, less index arithmetic) are what remain.",
                                "the kernel's time beyond its compute roof", kernel=name))
        th = occ.get("theoretical_pct")
        if isinstance(th, (int, float)) and th < LOW_OCCUPANCY:
            lim = ", ".join(LIMITERS.get(x, x) for x in occ.get("limiter") or []) or "unknown"
            out.append(finding("occupancy", f"low occupancy: {short}, theoretical {th:.0f}%, limited by {lim}",
                                t * (1 - th / 100) * (1 - top_pct / 100), ev,
                                f"Raise the limit ({lim}): fewer registers (__launch_bounds__, -maxrregcount), "
                                "less shared memory per block, or another block size; --launch-override measures "
                                "other sizes.", "the kernel's unoccupied time below its roof (upper bound)",
                                kernel=name))
    return out


def block_size_candidate(p: Dict[str, Any], kernel: str, min_gain_pct: float = 10.0) -> Tuple[Optional[Dict[str, Any]], str]:
    """Another block size for a kernel of a metrics profile that raises its theoretical occupancy
    by min_gain_pct points or more, with its registers and static shared memory as measured:
    ({"spec": a --launch-override keeping the threads launched, "occupancy_pct", ...}, "") or
    (None, why not)."""
    row = next((k for k in p.get("kernels") or [] if isinstance(k, dict) and k.get("name") == kernel), None)
    occ = (row or {}).get("occupancy") or {}
    dev = (p.get("summary") or {}).get("sm_limits")
    regs, th = occ.get("registers_per_thread"), occ.get("theoretical_pct")
    if not isinstance(dev, dict) or not isinstance(regs, int) or not isinstance(th, (int, float)):
        return None, "the profile lacks the kernel's registers or the SM's limits (profiled by an older cudasnap)"
    if occ.get("dynamic_smem"):
        return None, "it takes dynamic shared memory, which is often sized by the block"
    shapes = {(tuple(r.get("grid") or ()), tuple(r.get("block") or ())) for r in p.get("launches") or []
              if isinstance(r, dict) and r.get("name") == kernel}
    if len(shapes) != 1:
        return None, f"its launches have {len(shapes)} different sizes; give one with --launch-override"
    (grid, block), = shapes
    if len(grid) != 3 or len(block) != 3 or grid[1:] != (1, 1) or block[1:] != (1, 1):
        return None, "its grid or block is not 1-D; give a size with --launch-override"
    smem = int(occ.get("smem_per_block") or 0)
    ws = int(dev.get("warp_size") or 32)
    occ_at = {}
    for b in {32, 64, 128, 256, 512, 1024, block[0] // 2, block[0] * 2}:
        if ws <= b <= 1024 and b % ws == 0 and b != block[0]:
            o = ms.theoretical_occupancy(None, b, ms.occupancy_limits(b, regs, smem, dev), dev).get("theoretical_pct")
            if isinstance(o, (int, float)):
                occ_at[b] = o
    if not occ_at or max(occ_at.values()) < th + min_gain_pct:
        return None, (f"no block size raises its theoretical occupancy ({th:.0f}%) by {min_gain_pct:g} points "
                      f"(best {max(occ_at.values()):.0f}%)" if occ_at else "no block size to try")
    # near the best occupancy (5 points), the size nearest the recorded one: the least change
    top = max(occ_at.values())
    b = min((b for b, o in occ_at.items() if o >= top - 5.0), key=lambda b: (abs(math.log2(b / block[0])), -b))
    g = -(-grid[0] * block[0] // b)
    return ({"spec": f"grid={g},block={b},kernel=^{re.escape(kernel)}$", "occupancy_pct": round(occ_at[b], 1),
             "from_pct": round(float(th), 1), "block": b, "grid": g, "recorded": {"grid": grid[0], "block": block[0]}},
            "")
