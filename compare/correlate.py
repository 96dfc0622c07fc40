"""Silicon against a simulator (`compare GPU.json SIM.json`, SIM from `replay --sim ...
--sim-mode performance --out`): per kernel the measured time, the simulated cycles and their time
at the silicon's clock (where the GPU profile recorded it, else the model's, saying why), and
across kernels the correlation (Pearson, Spearman) and the mean error: how a simulator is judged."""
from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Optional, Tuple


def _ranks(xs: List[float]) -> List[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1          # ties share their mean rank
        i = j + 1
    return r


def pearson(xs: List[float], ys: List[float]) -> Optional[float]:
    if len(xs) < 3:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sx = math.sqrt(sum((x - mx) ** 2 for x in xs))
    sy = math.sqrt(sum((y - my) ** 2 for y in ys))
    if sx == 0 or sy == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / (sx * sy)


def _p_values(xs: List[float], ys: List[float]) -> Dict[str, Optional[float]]:
    """Two-sided p-values of both coefficients (scipy, where installed: the campaign extra)."""
    try:
        from scipy import stats
    except ImportError:
        return {"pearson_p": None, "spearman_p": None}
    try:
        return {"pearson_p": float(stats.pearsonr(xs, ys)[1]), "spearman_p": float(stats.spearmanr(xs, ys)[1])}
    except Exception:
        return {"pearson_p": None, "spearman_p": None}


def _cycles(prof: Dict[str, Any]) -> Dict[str, List[int]]:
    out: Dict[str, List[int]] = {}
    for r in prof.get("launches") or []:
        if isinstance(r.get("cycles"), int) and r.get("name"):
            out.setdefault(r["name"], []).append(r["cycles"])
    return out


def _measured(prof: Dict[str, Any]) -> Dict[str, List[float]]:
    out: Dict[str, List[float]] = {}
    for r in prof.get("launches") or []:
        t = r.get("time_us")
        if isinstance(t, (int, float)) and t > 0 and r.get("name"):
            out.setdefault(r["name"], []).append(float(t))
    return out


def clock_of(silicon: Dict[str, Any], model_mhz: Optional[float]) -> Tuple[Optional[float], str]:
    """The clock simulated cycles are turned into time at, and what it is."""
    gpu = (silicon.get("run") or {}).get("gpu") or {}
    mhz = gpu.get("clock_mhz")
    if isinstance(mhz, (int, float)) and mhz > 0:
        return float(mhz), f"the silicon's {mhz:g} MHz ({gpu.get('clock_source') or 'recorded with its profile'})"
    if model_mhz:
        return model_mhz, (f"the model's {model_mhz:g} MHz core clock: the GPU profile records no clock "
                           f"(profiles written before clocks were recorded)")
    return None, "no clock: neither the GPU profile nor the model says one"


def correlate(base: Dict[str, Any], cand: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """None unless exactly one profile is simulated (with cycles) and the other measured."""
    sims = [p for p in (base, cand) if (p.get("run") or {}).get("simulated")]
    if len(sims) != 1:
        return None
    sim = sims[0]
    silicon = cand if sim is base else base
    model = (sim.get("run") or {}).get("simulated") or {}
    mhz, clock = clock_of(silicon, model.get("core_clock_mhz"))
    cyc, meas = _cycles(sim), _measured(silicon)
    rows = []
    for name in sorted(set(cyc) & set(meas)):
        c = statistics.median(cyc[name])
        m = statistics.median(meas[name])
        s = c / mhz if mhz else None
        rows.append({"name": name, "launches": min(len(cyc[name]), len(meas[name])), "measured_us": m, "cycles": c,
                     "simulated_us": s, "error_pct": (s - m) / m * 100 if s is not None else None})
    only = sorted(set(meas) - set(cyc))
    res: Dict[str, Any] = {"config": model.get("config"), "model_mhz": model.get("core_clock_mhz"), "clock_mhz": mhz,
                           "clock": clock, "kernels": rows, "n": len(rows), "not_simulated": only,
                           "silicon_gpu": ((silicon.get("run") or {}).get("gpu") or {}).get("name")}
    xs = [r["measured_us"] for r in rows if r["simulated_us"] is not None]
    ys = [r["simulated_us"] for r in rows if r["simulated_us"] is not None]
    res["pearson"] = pearson(xs, ys)
    res["spearman"] = pearson(_ranks(xs), _ranks(ys)) if len(xs) >= 3 else None
    res.update(_p_values(xs, ys) if len(xs) >= 3 else {"pearson_p": None, "spearman_p": None})
    errs = [r["error_pct"] for r in rows if r["error_pct"] is not None]
    res["mean_abs_error_pct"] = statistics.fmean(abs(e) for e in errs) if errs else None
    res["mean_error_pct"] = statistics.fmean(errs) if errs else None
    if len(xs) < 3:
        res["why_no_correlation"] = f"{len(xs)} kernel(s) both measured and simulated: a correlation needs 3 or more"
    return res


def render(c: Dict[str, Any], out) -> None:
    """The text view: one line per kernel, then the correlation."""
    w = out.write
    w(f"silicon ({c.get('silicon_gpu')}) vs simulator (GPGPU-Sim {c.get('config')}): simulated time at {c['clock']}\n")
    w(f"  {'kernel':<48} {'measured':>12} {'cycles':>12} {'simulated':>12} {'error':>8}\n")
    for r in c["kernels"]:
        name = r["name"] if len(r["name"]) <= 48 else r["name"][:45] + "..."
        s = "-" if r["simulated_us"] is None else f"{r['simulated_us']:.2f} us"
        e = "-" if r["error_pct"] is None else f"{r['error_pct']:+.0f}%"
        w(f"  {name:<48} {r['measured_us']:>9.2f} us {r['cycles']:>12.0f} {s:>12} {e:>8}\n")
    if c.get("pearson") is not None:
        p = "" if c.get("pearson_p") is None else f" (p {c['pearson_p']:.2g})"
        sp = "" if c.get("spearman_p") is None else f" (p {c['spearman_p']:.2g})"
        w(f"correlation over {c['n']} kernels: Pearson {c['pearson']:.3f}{p}, Spearman {c['spearman']:.3f}{sp}; "
          f"mean error {c['mean_error_pct']:+.1f}%, mean absolute error {c['mean_abs_error_pct']:.1f}%\n")
    else:
        w(f"correlation: none ({c.get('why_no_correlation') or 'the times do not vary'})"
          + (f"; mean absolute error {c['mean_abs_error_pct']:.1f}%" if c.get("mean_abs_error_pct") is not None else "")
          + "\n")
    if c["not_simulated"]:
        w(f"  measured but not simulated: {len(c['not_simulated'])} kernel(s) ({', '.join(c['not_simulated'][:4])}"
          f"{' ...' if len(c['not_simulated']) > 4 else ''})\n")


def figure(c: Dict[str, Any]):
    """Scatter, log-log: measured time against simulated time per kernel, the y = x line."""
    import plotly.graph_objects as go
    rows = [r for r in c["kernels"] if r["simulated_us"] is not None]
    fig = go.Figure(go.Scatter(
        x=[r["measured_us"] for r in rows], y=[r["simulated_us"] for r in rows], mode="markers",
        marker={"size": 9, "color": "#3366cc"}, customdata=[[r["name"], r["cycles"], r["error_pct"]] for r in rows],
        hovertemplate="%{customdata[0]}<br>measured %{x:.2f} us<br>simulated %{y:.2f} us "
                      "(%{customdata[1]:.0f} cycles, %{customdata[2]:+.0f}%)<extra></extra>"))
    vals = [v for r in rows for v in (r["measured_us"], r["simulated_us"]) if v > 0]
    if vals:
        lo, hi = min(vals) / 1.5, max(vals) * 1.5
        fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", line={"dash": "dash", "color": "#888"},
                                 name="y = x", hoverinfo="skip"))
    t = "simulated vs measured time per kernel"
    if c.get("pearson") is not None:
        t += f" (Pearson {c['pearson']:.3f}, Spearman {c['spearman']:.3f}, mean abs error {c['mean_abs_error_pct']:.0f}%)"
    fig.update_layout(title=t, xaxis_title=f"measured on {c.get('silicon_gpu')} (us)",
                      yaxis_title=f"GPGPU-Sim {c.get('config')} (us)", xaxis_type="log", yaxis_type="log",
                      height=520, showlegend=False, plot_bgcolor="white")
    fig.update_xaxes(gridcolor="#eee")
    fig.update_yaxes(gridcolor="#eee")
    return fig
