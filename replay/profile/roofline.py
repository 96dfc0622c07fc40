"""Roofline per kernel: arithmetic intensity (FLOP per DRAM byte) against the card's peaks.

FLOP: SASS thread instructions add + mul + 2 x fma per precision (fp32, fp64, fp16), as ncu's
roofline counts them, and tensor-core operations per input precision (tensor_fp16, _bf16, _tf32,
_fp8, _fp64) as ncu's tensor roofline counts them (metrics_sections.flops).  Bytes: DRAM bytes read + written.  A kernel's
point: intensity = FLOP / bytes, achieved = FLOP / duration (gpu__time_duration).  Its roof:
min(peak FLOP/s of its dominant precision, intensity x peak DRAM bytes/s); it is memory-bound
left of the ridge point (peak FLOP/s / peak bytes/s) and compute-bound right of it.

Peaks, in order of preference:
1. from the counters, as ncu's SpeedOfLight_RooflineChart draws them: the per-cycle peak of
   each precision's fma (x 2 FLOP), of its dense tensor operations, and of dram__bytes, times the cycles per second measured
   during the kernel (sm__cycles_elapsed.avg.per_second, dram__cycles_elapsed.avg.per_second):
   the hardware's peaks at the clocks the kernel ran at;
2. measured on the card (measured_peaks) where the chip's CUPTI lacks those metrics: a device
   copy of 256 MiB timed with CUDA events (bytes read + written over the best of 5 times) and
   an FMA kernel per precision (PTX: 8 independent fma chains per thread, 2048 threads per SM,
   FLOP = threads x iterations x 16 over the best of 3 times).  Measured once per GPU and
   driver and cached in $XDG_CACHE_HOME/cudasnap/peaks.json (~/.cache); these are attainable
   peaks, a few percent under the hardware's.

write_html draws the roofline (plotly, self-contained HTML): one ceiling per precision with a
known peak, the DRAM slope, a point per kernel (its size: its share of the time)."""
from __future__ import annotations

import json
import os
import statistics
from typing import Any, Dict, List, Optional

from . import metrics_sections as ms


def point(flop: Dict[str, Optional[float]], dram_bytes: Optional[float], duration_ns: Optional[float],
          peaks: Dict[str, Optional[float]]) -> Dict[str, Any]:
    """One roofline point: intensity, achieved FLOP/s and bytes/s, the roof, bound, % of roof."""
    known = {k: v for k, v in flop.items() if v is not None}
    d: Dict[str, Any] = {"flop": known, "dram_bytes": dram_bytes, "peaks": peaks}
    if not known or dram_bytes is None or not duration_ns:
        d["error"] = "FLOP counters, DRAM bytes or the duration missing"
        return d
    total = sum(known.values())
    secs = duration_ns * 1e-9
    d["flop_total"] = total
    d["dominant"] = max(known, key=lambda k: known[k]) if total > 0 else None
    d["achieved_flops"] = total / secs
    d["achieved_bytes_per_s"] = dram_bytes / secs
    d["intensity"] = total / dram_bytes if dram_bytes > 0 else None
    bw = peaks.get("dram_bytes_per_s")
    if bw:
        d["pct_of_dram_peak"] = d["achieved_bytes_per_s"] / bw * 100.0
    pf = peaks.get(f"{d['dominant']}_flops") if d["dominant"] else None
    if d["dominant"] is None:
        d["bound"] = "memory"                   # no floating-point work: only the DRAM roof applies
        d["pct_of_roof"] = d.get("pct_of_dram_peak")
        return d
    if pf:
        d["pct_of_flop_peak"] = d["achieved_flops"] / pf * 100.0
    if pf and bw:
        d["ridge"] = pf / bw
        if d["intensity"] is None:             # FLOP without DRAM traffic: all in caches
            d["bound"], d["roof_flops"] = "compute", pf
        else:
            d["roof_flops"] = min(pf, d["intensity"] * bw)
            d["bound"] = "memory" if d["intensity"] < d["ridge"] else "compute"
        d["pct_of_roof"] = d["achieved_flops"] / d["roof_flops"] * 100.0
    return d


def launch_point(values: Dict[str, float], fallback: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    return point(ms.flops(values), ms.dram_bytes(values), values.get("gpu__time_duration.sum"),
                 peaks_of(values, fallback))


def peaks_of(values: Dict[str, float], fallback: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """Peaks from the counters, each missing one from the measured fallback; `source` says
    which ("counters", "measured" or both)."""
    p: Dict[str, Any] = dict(ms.metric_peaks(values))
    used = set()
    for k in list(p):
        if p[k] is None and fallback and fallback.get(k):
            p[k] = fallback[k]
            used.add("measured")
        elif p[k] is not None:
            used.add("counters")
    p["source"] = "+".join(s for s in ("counters", "measured") if s in used) or None
    return p


def kernel_roofline(rows: List[Dict[str, Any]], fallback: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """A kernel's point over its profiled launches: FLOP, bytes and time summed (intensity of
    the whole work, not a mean of ratios); peaks: the medians of its launches'."""
    flop: Dict[str, Optional[float]] = {}
    dram, dur = 0.0, 0.0
    peaks: List[Dict[str, Any]] = []
    for r in rows:
        v = r["metrics"]
        for k, f in ms.flops(v).items():
            if f is not None:
                flop[k] = (flop.get(k) or 0.0) + f
        b = ms.dram_bytes(v)
        dram += b or 0.0
        dur += v.get("gpu__time_duration.sum") or 0.0
        peaks.append(peaks_of(v, fallback))
    med: Dict[str, Any] = {}
    for k in dict.fromkeys(k for p in peaks for k in p if k != "source"):
        vals = [p[k] for p in peaks if p.get(k)]
        med[k] = statistics.median(vals) if vals else None
    med["source"] = peaks[0].get("source") if peaks else None
    d = point(flop, dram if any(ms.dram_bytes(r["metrics"]) is not None for r in rows) else None, dur or None, med)
    d["launches"] = len(rows)
    return d


# ------------------------------------------------------------------ measured peaks
_FMA_PTX = """
.version 6.0
.target sm_52
.address_size 64
.visible .entry cudasnap_peak_{T}(.param .u64 out, .param .u32 iters)
{{
    .reg .pred %p;
    .reg .b32 %i, %n, %tid;
    .reg .b64 %o;
    .reg .{T} %a<9>, %b, %c, %s;
    ld.param.u64 %o, [out];
    ld.param.u32 %n, [iters];
    mov.u32 %tid, %tid.x;
    cvt.rn.{T}.u32 %a1, %tid;
    add.{T} %a2, %a1, {ONE};  add.{T} %a3, %a2, {ONE};  add.{T} %a4, %a3, {ONE};
    add.{T} %a5, %a4, {ONE};  add.{T} %a6, %a5, {ONE};  add.{T} %a7, %a6, {ONE};  add.{T} %a8, %a7, {ONE};
    mov.{T} %b, {B};
    mov.{T} %c, {C};
    mov.u32 %i, 0;
LOOP:
{BODY}
    add.u32 %i, %i, 1;
    setp.lt.u32 %p, %i, %n;
    @%p bra LOOP;
    add.{T} %s, %a1, %a2;  add.{T} %s, %s, %a3;  add.{T} %s, %s, %a4;
    add.{T} %s, %s, %a5;  add.{T} %s, %s, %a6;  add.{T} %s, %s, %a7;  add.{T} %s, %s, %a8;
    setp.neu.{T} %p, %s, {MAGIC};
    @%p bra END;
    st.global.{T} [%o], %s;
END:
    ret;
}}
"""
FMA_UNROLL = 8          # passes over the 8 chains per loop iteration: 64 fma per thread per iteration


def fma_ptx(t: str) -> bytes:
    one, b, c, magic = (("0f3F800000", "0f3F7FFFEF", "0f3A83126F", "0f7F7FFFFF") if t == "f32" else
                        ("0d3FF0000000000000", "0d3FEFFFFFDE7210BE", "0d3F50624DD2F1A9FC", "0d7FEFFFFFFFFFFFFF"))
    body = "\n".join(f"    fma.rn.{t} %a{j}, %a{j}, %b, %c;" for _ in range(FMA_UNROLL) for j in range(1, 9))
    return _FMA_PTX.format(T=t, ONE=one, B=b, C=c, MAGIC=magic, BODY=body).encode()


def _cache_path() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "cudasnap", "peaks.json")


def _gpu_key(rv) -> str:
    cu, dev = rv.driver, rv.device
    parts = []
    try:
        r = cu.cuDeviceGetName(256, dev)
        parts.append(bytes(r[1]).split(b"\0", 1)[0].decode(errors="replace"))
    except Exception:
        parts.append("?")
    try:
        u = cu.cuDeviceGetUuid(dev)
        parts.append(bytes(u[1].bytes).hex())
    except Exception:
        pass
    try:
        parts.append(str(int(cu.cuDriverGetVersion()[1])))
    except Exception:
        pass
    return "|".join(parts)


def measured_peaks(rv, refresh: bool = False) -> Dict[str, Any]:
    """DRAM bytes/s and FLOP/s (fp32, fp64) measured on the replay's GPU (see the module doc),
    from the cache when this GPU and driver were measured before."""
    key = _gpu_key(rv)
    path = _cache_path()
    cache: Dict[str, Any] = {}
    try:
        with open(path) as f:
            cache = json.load(f)
    except (OSError, ValueError):
        cache = {}
    if not refresh and isinstance(cache.get(key), dict):
        return dict(cache[key], cached=True)
    got = _measure(rv)
    got["gpu"] = key
    cache[key] = got
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        from cudasnap.formats.outputs import write_atomic
        write_atomic(path, json.dumps(cache, indent=1))
    except OSError:
        pass
    return dict(got, cached=False)


def _timed(rv, stream, fn, runs: int) -> float:
    """Best time in seconds of `runs` runs of fn(stream), each between two CUDA events."""
    best = None
    e0, e1 = rv.call("cuEventCreate", 0), rv.call("cuEventCreate", 0)
    try:
        fn(stream)                                    # warm up
        for _ in range(runs):
            rv.call("cuEventRecord", e0, stream)
            fn(stream)
            rv.call("cuEventRecord", e1, stream)
            rv.call("cuEventSynchronize", e1)
            t = float(rv.call("cuEventElapsedTime", e0, e1)) / 1e3
            best = t if best is None else min(best, t)
    finally:
        for e in (e0, e1):
            try:
                rv.driver.cuEventDestroy(e)
            except Exception:
                pass
    return best or 0.0


def _measure(rv) -> Dict[str, Any]:
    cu = rv.driver
    stream = cu.CUstream(0)
    rv.call("cuCtxSynchronize")
    out: Dict[str, Any] = {"method": "measured: a 256 MiB device copy and FMA kernels, best of several runs"}
    n = 256 << 20
    a = int(rv.call("cuMemAlloc", n))
    b = int(rv.call("cuMemAlloc", n))
    try:
        rv.call("cuMemsetD8", a, 1, n)
        t = _timed(rv, stream, lambda s: rv.call("cuMemcpyDtoDAsync", b, a, n, s), 5)
        out["dram_bytes_per_s"] = 2 * n / t if t > 0 else None
        sms = int(rv.call("cuDeviceGetAttribute", cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, rv.device))
        from ..params import LaunchParams
        iters = 4096
        for t_name, key in (("f32", "fp32_flops"), ("f64", "fp64_flops")):
            mod = rv.call("cuModuleLoadData", fma_ptx(t_name) + b"\0")
            try:
                fn = rv.call("cuModuleGetFunction", mod, f"cudasnap_peak_{t_name}".encode())
                p = LaunchParams(b.to_bytes(8, "little") + iters.to_bytes(4, "little") + bytes(4))
                grid, block = sms * 8, 256
                secs = _timed(rv, stream, lambda s: rv.call("cuLaunchKernel", fn, grid, 1, 1, block, 1, 1, 0, s, None,
                                                          p.extra_ptr), 3)
                flop = grid * block * iters * FMA_UNROLL * 8 * 2
                out[key] = flop / secs if secs > 0 else None
            finally:
                rv.call("cuModuleUnload", mod)
        out["fp16_flops"] = None
    finally:
        for p_ in (a, b):
            try:
                rv.call("cuMemFree", p_)
            except Exception:
                pass
    return out


# ------------------------------------------------------------------ HTML
def _fmt(v: Optional[float], unit: str) -> str:
    if v is None:
        return "-"
    for div, pre in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.2f} {pre}{unit}"
    return f"{v:.2f} {unit}"


def roofline_figure(kernels: List[Dict[str, Any]], title: str):
    import plotly.graph_objects as go
    pts = [k for k in kernels if (k.get("roofline") or {}).get("intensity") and k["roofline"].get("achieved_flops")]
    peaks: Dict[str, List[float]] = {}
    for k in kernels:
        for name, v in ((k.get("roofline") or {}).get("peaks") or {}).items():
            if isinstance(v, (int, float)) and v:
                peaks.setdefault(name, []).append(float(v))
    pk = {n: statistics.median(v) for n, v in peaks.items()}
    fig = go.Figure()
    xs = [k["roofline"]["intensity"] for k in pts] or [1.0]
    lo, hi = min(xs + [0.01]) / 4, max(xs + [1000.0]) * 4
    bw = pk.get("dram_bytes_per_s")
    colors = {"fp32_flops": "#1f77b4", "fp64_flops": "#d62728", "fp16_flops": "#2ca02c", "tensor_fp16_flops": "#9467bd",
              "tensor_bf16_flops": "#8c564b", "tensor_tf32_flops": "#e377c2", "tensor_fp8_flops": "#7f7f7f",
              "tensor_fp64_flops": "#bcbd22"}
    for name in [n for n in pk if n.endswith("_flops")]:
        pf = pk.get(name)
        if not pf or not bw:
            continue
        ridge = pf / bw
        x = [lo, ridge, hi] if lo < ridge < hi else [lo, hi]
        y = [min(pf, v * bw) for v in x]
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=f"{ms.precision_label(name[:-6])} roof ({_fmt(pf, 'FLOP/s')}, DRAM {_fmt(bw, 'B/s')})",
                                 line={"color": colors.get(name, "#17becf")}))
    total = sum(k.get("total_us") or 0 for k in pts) or 1.0
    from ..names import short_name
    fig.add_trace(go.Scatter(
        x=[k["roofline"]["intensity"] for k in pts], y=[k["roofline"]["achieved_flops"] for k in pts],
        mode="markers", name="kernels",
        marker={"size": [8 + 30 * ((k.get("total_us") or 0) / total) ** 0.5 for k in pts], "opacity": 0.75},
        text=[f"{short_name(k['name'], 80)}<br>{k['roofline'].get('bound', '?')}-bound, "
              f"{(k['roofline'].get('pct_of_roof') or 0):.1f}% of roof<br>{k.get('launches')} launch(es)"
              for k in pts], hoverinfo="text+x+y"))
    fig.update_xaxes(type="log", title="arithmetic intensity (FLOP / DRAM byte)")
    fig.update_yaxes(type="log", title="FLOP/s")
    fig.update_layout(title=title, height=620, legend={"orientation": "h", "y": -0.2})
    return fig


def write_html(report: Dict[str, Any], path: str) -> None:
    import html as H
    from ..names import short_name
    kernels = report.get("kernels") or []
    fig = roofline_figure(kernels, f"roofline: {os.path.basename(str(report.get('snapshot') or ''))}")
    rows = []
    for k in kernels:
        r = k.get("roofline") or {}
        rows.append("<tr>" + "".join(f"<td>{H.escape(str(v))}</td>" for v in (
            short_name(k["name"], 90), k.get("launches"), f"{k.get('total_us') or 0:.1f}",
            f"{r['intensity']:.3g}" if r.get("intensity") else "-", _fmt(r.get("achieved_flops"), "FLOP/s"),
            _fmt(r.get("achieved_bytes_per_s"), "B/s"), r.get("bound", "-"),
            f"{r['pct_of_roof']:.1f}%" if r.get("pct_of_roof") is not None else "-",
            (r.get("peaks") or {}).get("source") or "-")) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("kernel", "launches", "time (us)", "FLOP/byte", "achieved", "DRAM",
                                             "bound", "of roof", "peaks from"))
    doc = ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>cudasnap roofline</title><style>"
           "body{font-family:system-ui,sans-serif;margin:24px} table{border-collapse:collapse;font-size:13px}"
           "td,th{border:1px solid #ddd;padding:3px 8px} th{background:#f4f4f4}</style></head><body>"
           + fig.to_html(full_html=False, include_plotlyjs=True, config={"displaylogo": False})
           + f"<table><tr>{head}</tr>{''.join(rows)}</table>"
           + "<p>FLOP: add + mul + 2 x fma SASS thread instructions per precision; bytes: DRAM read + write; "
             "peaks: per-cycle peak metrics x the measured clock (as ncu), or measured on the card.</p>"
           + "</body></html>")
    from cudasnap.formats.outputs import write_atomic
    write_atomic(path, doc)
