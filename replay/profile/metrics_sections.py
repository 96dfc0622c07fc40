"""What `--profile metrics` collects: sections named as Nsight Compute names them, each a list
of ncu metric names (the names CUPTI's profiler host API evaluates), and the figures derived
from them.  Pure Python: no CUDA, no CUPTI (the command line checks --section here).

Sections (`--section NAME`, repeatable; default: all four):
  SpeedOfLight               compute (SM) and memory throughput in % of peak, DRAM throughput,
                             duration
  Occupancy                  achieved occupancy (counters); theoretical occupancy and its limiter
                             (registers, shared memory, warps, blocks) from the launch
                             configuration and the function's attributes (metrics.py)
  MemoryWorkloadAnalysis     L1/TEX and L2 hit rates, DRAM bytes read and written
  SpeedOfLight_RooflineChart FLOP counts by precision (SASS add, mul and fma per thread, fma
                             counting 2) and the peak rates ncu's roofline uses (per-cycle peak
                             x cycles per second); roofline.py turns them into a roofline
`--metrics a,b` adds raw metric names (any the chip's CUPTI knows)."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

# the SpeedOfLight and Occupancy figures other modules read by name (advise, the table)
SM_PCT = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
MEM_PCT = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
DRAM_PCT = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
L1_PCT = "l1tex__throughput.avg.pct_of_peak_sustained_active"
L2_PCT = "lts__throughput.avg.pct_of_peak_sustained_elapsed"
WARPS_PCT = "sm__warps_active.avg.pct_of_peak_sustained_active"
# short labels of the table (metrics_report) for the SpeedOfLight figures
SOL_COLUMNS = (("SM %", SM_PCT), ("mem %", MEM_PCT), ("DRAM %", DRAM_PCT), ("L1 %", L1_PCT), ("L2 %", L2_PCT))

TENSOR: List[Tuple[str, List[Tuple[str, ...]], List[str]]] = [
    # tensor-core math, FLOP counted as ncu's tensor roofline counts them (a multiply-add is 2:
    # an fp16 GEMM of 8192^3 read 1.117e12 on an H200, 2 x 8192 x 8192 x 8320 with its
    # 320-row tiles); the counter and peak names differ by chip, so each is a list of
    # candidates, the first the chip knows is used and the others are dropped quietly
    ("tensor_fp16", [("sm__ops_path_tensor_src_fp16.sum",),
                     ("sm__ops_path_tensor_src_fp16_dst_fp16.sum", "sm__ops_path_tensor_src_fp16_dst_fp32.sum")],
     ["sm__ops_path_tensor_op_hgmma_src_fp16_sparsity_off.sum.peak_sustained",
      "sm__ops_path_tensor_src_fp16_dst_fp32_sparsity_off.sum.peak_sustained",
      "sm__ops_path_tensor_src_fp16_dst_fp32.sum.peak_sustained"]),
    ("tensor_bf16", [("sm__ops_path_tensor_src_bf16_dst_fp32.sum",)],
     ["sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32_sparsity_off.sum.peak_sustained",
      "sm__ops_path_tensor_src_bf16_dst_fp32_sparsity_off.sum.peak_sustained",
      "sm__ops_path_tensor_src_bf16_dst_fp32.sum.peak_sustained"]),
    ("tensor_tf32", [("sm__ops_path_tensor_src_tf32_dst_fp32.sum",)],
     ["sm__ops_path_tensor_op_hgmma_src_tf32_dst_fp32_sparsity_off.sum.peak_sustained",
      "sm__ops_path_tensor_src_tf32_dst_fp32_sparsity_off.sum.peak_sustained",
      "sm__ops_path_tensor_src_tf32_dst_fp32.sum.peak_sustained"]),
    ("tensor_fp8", [("sm__ops_path_tensor_src_fp8.sum",)],
     ["sm__ops_path_tensor_src_fp8_sparsity_off.sum.peak_sustained",
      "sm__ops_path_tensor_src_fp8.sum.peak_sustained"]),
    ("tensor_fp64", [("sm__ops_path_tensor_src_fp64.sum",)],
     ["sm__ops_path_tensor_src_fp64.sum.peak_sustained"]),
]

# (metric, label, unit)
SECTIONS: Dict[str, List[Tuple[str, str, str]]] = {
    "SpeedOfLight": [
        (SM_PCT, "Compute (SM) Throughput", "%"),
        (MEM_PCT, "Memory Throughput", "%"),
        (DRAM_PCT, "DRAM Throughput", "%"),
        (L1_PCT, "L1/TEX Cache Throughput", "%"),
        (L2_PCT, "L2 Cache Throughput", "%"),
        ("gpu__time_duration.sum", "Duration", "ns"),
    ],
    "Occupancy": [
        (WARPS_PCT, "Achieved Occupancy", "%"),
    ],
    "MemoryWorkloadAnalysis": [
        ("l1tex__t_sector_hit_rate.pct", "L1/TEX Hit Rate", "%"),
        ("lts__t_sector_hit_rate.pct", "L2 Hit Rate", "%"),
        ("dram__bytes_read.sum", "DRAM Bytes Read", "byte"),
        ("dram__bytes_write.sum", "DRAM Bytes Written", "byte"),
    ],
    "SpeedOfLight_RooflineChart": [
        (f"sm__sass_thread_inst_executed_op_{p}{op}_pred_on.sum", f"{p.upper()}{op.upper()} (thread instructions)", "inst")
        for p in ("f", "d", "h") for op in ("add", "mul", "fma")
    ] + [
        ("dram__bytes_read.sum", "DRAM Bytes Read", "byte"),
        ("dram__bytes_write.sum", "DRAM Bytes Written", "byte"),
        ("gpu__time_duration.sum", "Duration", "ns"),
        # the peaks ncu's roofline chart draws: per-cycle peak x cycles per second
        ("sm__sass_thread_inst_executed_op_ffma_pred_on.sum.peak_sustained", "FFMA peak per cycle", "inst/cycle"),
        ("sm__sass_thread_inst_executed_op_dfma_pred_on.sum.peak_sustained", "DFMA peak per cycle", "inst/cycle"),
        ("sm__sass_thread_inst_executed_op_hfma_pred_on.sum.peak_sustained", "HFMA peak per cycle", "inst/cycle"),
        ("sm__cycles_elapsed.avg.per_second", "SM Frequency", "cycle/s"),
        ("dram__bytes.sum.peak_sustained", "DRAM peak per cycle", "byte/cycle"),
        ("dram__cycles_elapsed.avg.per_second", "DRAM Frequency", "cycle/s"),
    ] + [(m, f"{name[7:].upper()} tensor ({'peak per cycle' if '.peak_' in m else 'operations'})",
          "op/cycle" if ".peak_" in m else "op")
         for name, counters, peaks in TENSOR for m in [c for group in counters for c in group] + peaks],
}
# names of the tensor candidates: a chip that lacks one is no reason to warn
OPTIONAL = frozenset(m for _n, counters, peaks in TENSOR for m in [c for g in counters for c in g] + peaks)
DEFAULT_SECTIONS = ("SpeedOfLight", "Occupancy", "MemoryWorkloadAnalysis", "SpeedOfLight_RooflineChart")
ALIASES = {"sol": "SpeedOfLight", "speedoflight": "SpeedOfLight", "occupancy": "Occupancy",
           "memoryworkload": "MemoryWorkloadAnalysis", "memoryworkloadanalysis": "MemoryWorkloadAnalysis",
           "memory": "MemoryWorkloadAnalysis", "roofline": "SpeedOfLight_RooflineChart",
           "speedoflight_rooflinechart": "SpeedOfLight_RooflineChart", "flop": "SpeedOfLight_RooflineChart",
           "flops": "SpeedOfLight_RooflineChart"}
PRECISIONS = (("fp32", "f"), ("fp64", "d"), ("fp16", "h"))


def section_name(name: str) -> Optional[str]:
    """The section a user's name means (case-insensitive; ncu's identifiers and short aliases),
    or None."""
    key = name.strip()
    if key in SECTIONS:
        return key
    return ALIASES.get(key.lower().replace("-", "").replace(" ", ""))


def split_metrics(text: Optional[str]) -> List[str]:
    return [m.strip() for m in (text or "").split(",") if m.strip()]


def check(sections: Sequence[str], metrics: Optional[str]) -> Optional[str]:
    """An error message for --section/--metrics, or None."""
    bad = [s for s in sections if section_name(s) is None]
    if bad:
        return (f"--section {bad[0]}: not a section (one of {', '.join(SECTIONS)}; or roofline, memory, "
                f"sol)")
    for m in split_metrics(metrics):
        if not all(c.isalnum() or c in "_.:" for c in m):
            return f"--metrics: {m!r} is not a metric name (comma-separated names as ncu --metrics takes them)"
    return None


def plan(sections: Sequence[str], metrics: Optional[str]) -> Tuple[List[str], List[str]]:
    """(section names, metric names to collect in order, each once).  No --section and no
    --metrics: every section; --metrics alone: only those metrics."""
    names = [section_name(s) for s in sections]
    raw = split_metrics(metrics)
    if not names and not raw:
        names = list(DEFAULT_SECTIONS)
    names = list(dict.fromkeys(n for n in names if n))
    out: List[str] = []
    for n in names:
        out += [m for m, _l, _u in SECTIONS[n]]
    out += raw
    return names, list(dict.fromkeys(out))


def labels() -> Dict[str, Tuple[str, str]]:
    """metric -> (label, unit) for every section metric."""
    d: Dict[str, Tuple[str, str]] = {}
    for rows in SECTIONS.values():
        for m, lab, unit in rows:
            d.setdefault(m, (lab, unit))
    return d


def alternative(metric: str) -> Optional[str]:
    """Another spelling of a metric some chips' CUPTI knows instead: SASS instruction counts per
    SM (sm__sass_*) are also summed per SM sub-partition (smsp__sass_*), the same totals."""
    if metric.startswith("sm__sass_"):
        return "smsp__" + metric[len("sm__"):]
    return None


# ------------------------------------------------------------------ derived figures
def _first(values: Dict[str, float], candidates) -> Optional[float]:
    """The sum of the first candidate group whose every metric was collected."""
    for group in candidates:
        got = [values.get(m) for m in group]
        if all(isinstance(v, (int, float)) for v in got):
            return float(sum(got))
    return None


def flops(values: Dict[str, float]) -> Dict[str, Optional[float]]:
    """FLOP per precision as ncu's rooflines count them: SASS add + mul + 2 x fma (per thread),
    None where a counter is missing; and tensor-core FLOP per input precision (tensor_fp16 ...),
    present only where the chip counted them."""
    out: Dict[str, Optional[float]] = {}
    for name, p in PRECISIONS:
        parts = [values.get(f"sm__sass_thread_inst_executed_op_{p}{op}_pred_on.sum") for op in ("add", "mul", "fma")]
        if any(v is None for v in parts):
            out[name] = None
            continue
        out[name] = float(parts[0]) + float(parts[1]) + 2.0 * float(parts[2])
    for name, counters, _peaks in TENSOR:
        v = _first(values, counters)
        if v is not None:
            out[name] = v
    return out


def precision_label(name: Optional[str]) -> str:
    """fp32 -> fp32; tensor_fp16 -> fp16 tensor."""
    if not name:
        return ""
    return f"{name[7:]} tensor" if name.startswith("tensor_") else name


def metric_peaks(values: Dict[str, float]) -> Dict[str, Optional[float]]:
    """Peak FLOP/s per precision and DRAM bytes/s from the peak metrics (per-cycle peak x the
    measured cycles per second of the kernel's run: the hardware's peaks at its clock then)."""
    sm_hz = values.get("sm__cycles_elapsed.avg.per_second")
    out: Dict[str, Optional[float]] = {}
    for name, p in PRECISIONS:
        per_cycle = values.get(f"sm__sass_thread_inst_executed_op_{p}fma_pred_on.sum.peak_sustained")
        out[f"{name}_flops"] = 2.0 * per_cycle * sm_hz if per_cycle and sm_hz else None
    for name, _counters, peaks in TENSOR:       # tensor peaks count operations (FLOP) already
        per_cycle = _first(values, [(m,) for m in peaks])
        if per_cycle and sm_hz:
            out[f"{name}_flops"] = per_cycle * sm_hz
    bpc = values.get("dram__bytes.sum.peak_sustained")
    dram_hz = values.get("dram__cycles_elapsed.avg.per_second")
    out["dram_bytes_per_s"] = bpc * dram_hz if bpc and dram_hz else None
    return out


def dram_bytes(values: Dict[str, float]) -> Optional[float]:
    r, w = values.get("dram__bytes_read.sum"), values.get("dram__bytes_write.sum")
    if r is None and w is None:
        return None
    return float(r or 0.0) + float(w or 0.0)


# ------------------------------------------------------------------ theoretical occupancy
def occupancy_limits(block_threads: int, regs_per_thread: int, smem_per_block: int, dev: Dict[str, int]) -> Dict[str, Optional[int]]:
    """Blocks per SM each resource allows (as the CUDA occupancy calculator and ncu's
    launch__occupancy_limit_* count them): warps, registers, shared memory, the SM's block
    slots.  dev: max_threads_per_sm, max_blocks_per_sm, regs_per_sm, smem_per_sm, warp_size,
    reg_alloc_unit (registers per warp are allocated in units of this, 256), smem_alloc_unit
    (128 on sm_80+; shared memory per block includes the driver's reserved bytes)."""
    ws = dev.get("warp_size") or 32
    warps = max(1, -(-block_threads // ws))
    max_warps = (dev.get("max_threads_per_sm") or 0) // ws
    out: Dict[str, Optional[int]] = {}
    out["warps"] = max_warps // warps if max_warps else None
    out["blocks"] = dev.get("max_blocks_per_sm") or None
    regs_sm = dev.get("regs_per_sm") or 0
    if regs_per_thread and regs_sm:
        unit = dev.get("reg_alloc_unit") or 256
        per_warp = -(-regs_per_thread * ws // unit) * unit
        # registers are handed out per warp: whole warps, then whole blocks
        out["registers"] = (regs_sm // per_warp) // warps
    else:
        out["registers"] = None
    smem_sm = dev.get("smem_per_sm") or 0
    if smem_per_block > 0 and smem_sm:
        unit = dev.get("smem_alloc_unit") or 128
        per_block = -(-smem_per_block // unit) * unit
        out["shared_memory"] = smem_sm // per_block
    else:
        out["shared_memory"] = None
    return out


def theoretical_occupancy(active_blocks: Optional[int], block_threads: int, limits: Dict[str, Optional[int]],
                          dev: Dict[str, int]) -> Dict[str, object]:
    """Theoretical occupancy (% of the SM's warps) from the driver's active blocks per SM
    (cuOccupancyMaxActiveBlocksPerMultiprocessor) or, without it, the smallest limit; the
    limiter: every resource whose limit equals that number of blocks."""
    ws = dev.get("warp_size") or 32
    warps = max(1, -(-block_threads // ws))
    max_warps = (dev.get("max_threads_per_sm") or 0) // ws
    known = {k: v for k, v in limits.items() if v is not None}
    blocks = active_blocks if active_blocks is not None else (min(known.values()) if known else None)
    d: Dict[str, object] = {"active_blocks_per_sm": blocks, "block_limits": limits,
                            "source": "driver" if active_blocks is not None else "estimate"}
    if blocks is None or not max_warps:
        d["theoretical_pct"] = None
        d["limiter"] = []
        return d
    d["theoretical_warps_per_sm"] = blocks * warps
    d["theoretical_pct"] = min(100.0, blocks * warps / max_warps * 100.0)
    d["limiter"] = sorted(k for k, v in known.items() if v == min(known.values())) if known else []
    return d
