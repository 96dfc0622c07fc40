"""Findings from a timeline profile alone (no hardware counters): each with its evidence (the
numbers it rests on) and the time at stake, in microseconds of the profiled span.

- launch-bound stretches: runs of kernels the GPU finishes faster than they are launched
  (kernels under the tiny threshold, or shorter than the idle gap before them), the idle time
  between them and its share of the stretch;
- host-side gaps: idle stretches of the GPU much longer than the usual gap between kernels
  (the host between steps: data loading, Python, a synchronization), named by the NVTX ranges
  around them when the recording has some;
- the heaviest kernels by share of kernel time;
- hand-written kernels whose names say GEMM, convolution, reduction..., that a library
  (cuBLAS, cuDNN, CUB) serves, and that are not already a library's;
- repeated small memsets and copies."""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from cudasnap.formats.vocab import in_class
from cudasnap.replay.names import short_name
from cudasnap.replay.profile.modes import for_advise


@dataclass
class Limits:
    tiny_us: float = 5.0            # a kernel shorter than this is launch-bound by itself
    min_run: int = 8                # kernels in a launch-bound stretch, at least
    min_idle_pct: float = 25.0      # idle share of a stretch, at least
    outlier_factor: float = 20.0    # a kernel in a stretch runs at most this many times its neighbours
    host_gap_us: float = 500.0      # a host-side gap is at least this long ...
    host_gap_factor: float = 10.0   # ... and this many times the median gap between kernels
    heavy_pct: float = 10.0         # a heavy kernel's share of kernel time, at least
    small_bytes: int = 64 << 10     # a small memset or copy moves at most this much
    min_repeats: int = 8            # a repeated small memset or copy, at least this many


def finding(kind: str, title: str, at_stake_us: float, evidence: Dict[str, Any], advice: str,
             basis: str, **more) -> Dict[str, Any]:
    d = {"kind": kind, "title": title, "at_stake_us": round(max(at_stake_us, 0.0), 3), "basis": basis,
         "evidence": evidence, "advice": advice}
    d.update(more)
    return d


class Timeline:
    """The profile's timed kernels in start order, with the idle gap before each (the time
    no kernel, copy or memset of any stream ran)."""

    def __init__(self, profile: Dict[str, Any], device_ops: List[Dict[str, Any]]):
        rows = [r for r in profile["launches"] if isinstance(r.get("start_ns"), int) and isinstance(r.get("end_ns"), int)]
        self.kernels = sorted(rows, key=lambda r: (r["start_ns"], r["end_ns"]))
        self.ops = sorted(device_ops, key=lambda r: r["start_ns"])
        self.start = self.kernels[0]["start_ns"]
        self.end = max(r["end_ns"] for r in self.kernels)
        self.span_us = (self.end - self.start) / 1e3
        self.kernel_us = sum(r["end_ns"] - r["start_ns"] for r in self.kernels) / 1e3
        # busy-until before each kernel, over kernels and device copies/memsets
        allw = sorted([(r["start_ns"], r["end_ns"], "k", i) for i, r in enumerate(self.kernels)]
                      + [(o["start_ns"], o["end_ns"], "o", i) for i, o in enumerate(self.ops)])
        self.gap_before: List[float] = [0.0] * len(self.kernels)
        busy = None
        for s, e, what, i in allw:
            if what == "k":
                self.gap_before[i] = 0.0 if busy is None else max(0.0, (s - busy) / 1e3)
            busy = e if busy is None else max(busy, e)
        gaps = [g for g in self.gap_before[1:]]
        self.median_gap_us = statistics.median(gaps) if gaps else 0.0

    def busy_us(self, t0: int, t1: int) -> float:
        """Time within [t0, t1] some kernel, copy or memset ran."""
        iv = sorted((max(r["start_ns"], t0), min(r["end_ns"], t1)) for r in self.kernels + self.ops
                    if r["end_ns"] > t0 and r["start_ns"] < t1)
        busy, cur = 0, None
        for s, e in iv:
            if cur is None or s > cur[1]:
                if cur:
                    busy += cur[1] - cur[0]
                cur = [s, e]
            else:
                cur[1] = max(cur[1], e)
        if cur:
            busy += cur[1] - cur[0]
        return busy / 1e3

    def dur_us(self, i: int) -> float:
        return (self.kernels[i]["end_ns"] - self.kernels[i]["start_ns"]) / 1e3

    def host_gap_min(self, lim: Limits) -> float:
        return max(lim.host_gap_us, lim.host_gap_factor * self.median_gap_us)


def nvtx_around(nvtx: List[Dict[str, Any]], t0: int, t1: int) -> List[str]:
    """Names of the innermost NVTX ranges around [t0, t1]: the range the gap lies in, or the
    ranges it falls between."""
    inside = [r for r in nvtx if r["start_ns"] <= t0 and r["end_ns"] >= t1]
    if inside:
        return [min(inside, key=lambda r: r["end_ns"] - r["start_ns"])["name"]]
    # a range's ends are its host calls' replay times: one may close before its last kernel ends
    before = [r for r in nvtx if r["end_ns"] <= t1 and r["start_ns"] < t0]
    after = [r for r in nvtx if r["start_ns"] >= t0 and r["end_ns"] > t1]
    out = []
    if before:
        out.append(max(before, key=lambda r: (r["end_ns"], r["start_ns"]))["name"])
    if after:
        out.append(min(after, key=lambda r: (r["start_ns"], -r["end_ns"]))["name"])
    return out


def launch_bound(tl: Timeline, lim: Limits) -> List[Dict[str, Any]]:
    long_gap = tl.host_gap_min(lim)
    n = len(tl.kernels)
    durs_all = [tl.dur_us(i) for i in range(n)]
    bound = []
    for i in range(n):
        # judged over a window of 5, so one kernel stretched by a preemption does not split a stretch
        lo, hi = max(0, i - 2), min(n, i + 3)
        md = statistics.median(durs_all[lo:hi])
        mg = statistics.median([g for g in tl.gap_before[max(1, lo):hi] if g < long_gap] or [0.0])
        bound.append((md < lim.tiny_us or mg > md) and durs_all[i] <= lim.outlier_factor * max(lim.tiny_us, md))
    runs: List[Tuple[int, int]] = []
    i = 0
    while i < n:
        if not bound[i]:
            i += 1
            continue
        j = i
        while j + 1 < n and bound[j + 1] and tl.gap_before[j + 1] < long_gap:
            j += 1
        runs.append((i, j))
        i = j + 1
    out = []
    for a, b in runs:
        k = b - a + 1
        if k < lim.min_run:
            continue
        ks = tl.kernels[a:b + 1]
        span = (max(r["end_ns"] for r in ks) - ks[0]["start_ns"]) / 1e3
        idle = span - tl.busy_us(ks[0]["start_ns"], max(r["end_ns"] for r in ks))
        if span <= 0 or idle / span * 100 < lim.min_idle_pct:
            continue
        durs = [tl.dur_us(x) for x in range(a, b + 1)]
        seqs = [r.get("seq") for r in ks if isinstance(r.get("seq"), int)]
        names: Dict[str, int] = {}
        for r in ks:
            nm = short_name(r.get("name") or "?")
            names[nm] = names.get(nm, 0) + 1
        ev = {"kernels": k, "under_tiny_us": sum(1 for d in durs if d < lim.tiny_us), "tiny_us": lim.tiny_us,
              "span_us": round(span, 3), "kernel_us": round(sum(durs), 3), "idle_us": round(idle, 3),
              "idle_pct": round(idle / span * 100, 1), "median_kernel_us": round(statistics.median(durs), 3),
              "median_gap_us": round(statistics.median(tl.gap_before[a + 1:b + 1]), 3),
              "first_seq": min(seqs) if seqs else None, "last_seq": max(seqs) if seqs else None,
              "top_kernels": sorted(names.items(), key=lambda kv: -kv[1])[:5],
              "share_of_span_pct": round(span / tl.span_us * 100, 1) if tl.span_us else None}
        out.append(finding(
            "launch-bound", f"launch-bound stretch: {k} kernels, GPU idle {ev['idle_pct']:.0f}% of {span / 1e3:.2f} ms",
            idle, ev, "Launch the stretch as a CUDA graph (torch.cuda.graphs, cudaStreamBeginCapture), or fuse its "
            "small kernels.", "estimate: the idle time between its kernels",
            select={"first_seq": ev["first_seq"], "last_seq": ev["last_seq"]}))
    return out


def host_gaps(tl: Timeline, lim: Limits, nvtx: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    thr = tl.host_gap_min(lim)
    gaps = [(tl.gap_before[i], i) for i in range(1, len(tl.kernels)) if tl.gap_before[i] >= thr]
    if not gaps:
        return []
    total = sum(g for g, _ in gaps)
    largest = []
    for g, i in sorted(gaps, reverse=True)[:5]:
        prev = max(tl.kernels[:i], key=lambda r: r["end_ns"])
        cur = tl.kernels[i]
        d = {"gap_us": round(g, 3), "after_seq": prev.get("seq"), "after": short_name(prev.get("name") or "?"),
             "before_seq": cur.get("seq"), "before": short_name(cur.get("name") or "?")}
        if nvtx:
            d["nvtx"] = nvtx_around(nvtx, prev["end_ns"], cur["start_ns"])
        largest.append(d)
    ev = {"gaps": len(gaps), "idle_us": round(total, 3), "share_of_span_pct": round(total / tl.span_us * 100, 1),
          "threshold_us": round(thr, 3), "median_gap_us": round(tl.median_gap_us, 3), "largest": largest}
    return [finding("host-gap", f"host-side gaps: {len(gaps)} idle stretch{'es' if len(gaps) > 1 else ''} of >= {thr / 1e3:.2f} ms, "
                     f"{ev['share_of_span_pct']:.0f}% of the span", total, ev,
                     "The GPU waits for the host between steps: overlap data loading and host work with the GPU "
                     "(pinned memory, non_blocking copies, a prefetching loader), drop synchronizations.",
                     "the idle time itself")]


def heavy_kernels(profile: Dict[str, Any], lim: Limits, top: int = 3) -> List[Dict[str, Any]]:
    out = []
    for k in (profile.get("kernels") or [])[:top]:
        share = k.get("share_pct") or 0.0
        if share < lim.heavy_pct or not k.get("total_us"):
            continue
        ev = {k2: (round(k[k2], 3) if isinstance(k.get(k2), float) else k.get(k2))
              for k2 in ("launches", "total_us", "median_us", "min_us", "max_us", "share_pct")}
        out.append(finding("heavy-kernel", f"heavy kernel: {short_name(k['name'])}, {share:.0f}% of kernel time",
                            k["total_us"], ev, f"Where the time goes: profile it (--profile {for_advise('variant').name}; "
                            "Nsight Compute under `replay --wrap ncu`), then measure a rebuild with advise --replace.",
                            "the kernel's whole time", kernel=k["name"]))
    return out


# hand-written work a library does: (pattern on the lower-case function name, operation, library call)
LIBRARY_OPS = [
    (r"gemm|matmul|mat_?mul|(^|_)mm(_|$)|batched_?mm", "matrix multiply", "cuBLAS cublasGemmEx / cublasLt"),
    (r"gemv|matvec", "matrix-vector product", "cuBLAS cublasSgemv"),
    (r"(^|_|s|d|h)axpy", "axpy", "cuBLAS cublasSaxpy (or fuse it)"),
    (r"(^|_)(dot|sdot|ddot)(_|$)", "dot product", "cuBLAS cublasSdot"),
    (r"conv(olution)?(\d?d)?(_|$)|im2col|winograd", "convolution", "cuDNN cudnnConvolutionForward"),
    (r"reduc|(^|_)sum(_|$)|argmax|argmin", "reduction", "CUB cub::DeviceReduce"),
    (r"scan|prefix_?sum", "scan", "CUB cub::DeviceScan"),
    (r"(^|_)sort|radix", "sort", "CUB cub::DeviceRadixSort"),
    (r"transpose", "transpose", "cuBLAS cublasSgeam / cuTENSOR"),
    (r"softmax", "softmax", "cuDNN softmax"),
]
# names of kernels that are a library's already
LIBRARY_NAMES = re.compile(r"cublas|cudnn|cutlass|cute::|nvjet|xmma|cub::|thrust::|at::|c10::|triton|flash|"
                           r"^(sm\d+|ampere|volta|turing|hopper|maxwell|kepler)_|gemv2[nt]_kernel|gemmk1|gemmsn|"
                           r"splitkreduce|cusparse|cufft|curand|nccl|magma|cuTENSOR", re.I)


def library_candidates(profile: Dict[str, Any]) -> List[Dict[str, Any]]:
    out = []
    for k in profile.get("kernels") or []:
        name = k.get("name") or ""
        full = k.get("demangled") or name
        if LIBRARY_NAMES.search(full) or LIBRARY_NAMES.search(name):
            continue
        fn = short_name(name).lower()
        for rx, op, call in LIBRARY_OPS:
            if re.search(rx, fn):
                ev = {"operation": op, "library": call, "launches": k.get("launches"),
                      "total_us": round(k.get("total_us") or 0.0, 3), "share_pct": round(k.get("share_pct") or 0.0, 1)}
                out.append(finding("library", f"hand-written {op}: {short_name(name)} (a library call could serve it)",
                                    k.get("total_us") or 0.0, ev,
                                    f"Try {call}; measure the rebuilt program's kernel with advise --replace.",
                                    "upper bound: the kernel's whole time", kernel=name))
                break
    return out


def small_transfers(tl: Timeline, lim: Limits, recorded: Optional[List[Dict[str, Any]]] = None) -> List[Dict[str, Any]]:
    """Repeated small memsets and copies: from the trace's device times, else from the
    recording (the host time of the calls)."""
    ops = tl.ops if tl.ops else (recorded or [])
    basis = "their device time" if tl.ops else "the recorded host time of the calls"
    groups: Dict[Tuple[str, Any], List[Dict[str, Any]]] = {}
    for o in ops:
        b = o.get("bytes")
        if isinstance(b, int) and b <= lim.small_bytes:
            groups.setdefault((o["kind"], o.get("name")), []).append(o)
    out = []
    for (kind, name), os_ in groups.items():
        if len(os_) < lim.min_repeats:
            continue
        t = sum(max(o["end_ns"] - o["start_ns"], 0) for o in os_) / 1e3
        sizes = sorted({o["bytes"] for o in os_})
        ev = {"what": name, "count": len(os_), "bytes": sizes[:8], "total_us": round(t, 3),
              "median_us": round(statistics.median([(o["end_ns"] - o["start_ns"]) / 1e3 for o in os_]), 3)}
        out.append(finding("small-transfers", f"{len(os_)} small {kind}s ({name}, <= {max(sizes)} B each)", t, ev,
                            "Batch them: one memset over a contiguous range, one copy of a packed buffer "
                            "(cuMemcpyBatchAsync), or fold them into a kernel or a graph.", basis))
    return out


def recorded_transfers(snapshot: Optional[str]) -> List[Dict[str, Any]]:
    """Memsets and copies from the recording: kind, API, bytes, recorded host times."""
    if not snapshot:
        return []
    try:
        from cudasnap.formats import SnapshotReader
        out = []
        for r in SnapshotReader(snapshot).records(("c",)):
            f = r.get("f") or ""
            a = r.get("a") or {}
            if not isinstance(r.get("t0"), int) or not isinstance(r.get("t1"), int):
                continue
            if in_class(f, "memset_group"):
                width = 4 if "D32" in f else 2 if "D16" in f else 1
                n = a.get("N")
                b = n * width if isinstance(n, int) else None
                kind = "memset"
            elif in_class(f, "copy_group"):
                b, kind = a.get("ByteCount"), "copy"
            else:
                continue
            out.append({"kind": kind, "name": f, "bytes": b, "start_ns": r["t0"], "end_ns": r["t1"]})
        return out
    except Exception:
        return []
