"""Graph mode on programs whose selected kernels run only inside their own CUDA graphs: the
recorded cuGraphLaunch calls that hold them are timed as units (graphunits.py).  A part of
GraphProfiler (graphmode.py), held as its `recorded` once it finds such launches."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

from .common import stats


class RecordedGraphUnits:
    def __init__(self, cfg, rv, sel, info: Dict[str, Any], warn: Callable[[str], None],
                 open_cupti: Callable[[], Any]):
        self.cfg, self.rv, self.sel = cfg, rv, sel      # the profiler's options, replay view, selection
        self.info, self.warn = info, warn               # the profiler's summary and warnings
        self.open_cupti = open_cupti
        self.backend = "events"                         # "cupti" once a unit's kernels got records
        self.graphs: Any = None
        self.unit_seqs: set = set()
        self._pending_unit: Optional[Any] = None
        self.unit_rows: List[Dict[str, Any]] = []
        self.units: List[Dict[str, Any]] = []

    # ------------------------------------------------------------------ the program's graph launches
    def start(self) -> bool:
        """No selected launch outside recorded captures: time the recorded graph launches that
        hold selected kernels.  True when there is one."""
        from .graphunits import RecordedGraphs
        try:
            g = RecordedGraphs(self.rv)
        except Exception as e:
            self.warn(f"graph: could not scan the recording's graphs ({type(e).__name__}: {e})")
            return False
        seqs = {r.get("s") for r in g.launches if g.records_of(r) and g.selected(self.sel, r)}
        if not seqs:
            return False
        self.graphs, self.unit_seqs = g, seqs
        self.info["path"] = "recorded graph launches"
        self.warn(f"graph: the selected kernels run only inside the program's own CUDA graphs: timing its "
                  f"{len(seqs)} recorded cuGraphLaunch call(s) as they are")
        return True

    def on_event(self, kind: str, ev) -> None:
        from .graphunits import GraphUnit, is_graph_launch
        if kind == "before_call" and ev.seq in self.unit_seqs and is_graph_launch(ev.call):
            rv = self.rv
            if rv.capturing:
                return
            rec = ev.rec
            saver = self.graphs.saver(rec, self.cfg.save_limit)
            if not saver.ranges:
                self.units.append({"seq": ev.seq, "error": "memory the graph writes is not known"})
                return
            try:
                saver.save()
                self._pending_unit = GraphUnit(rv, rec, saver, self.graphs.kernel_names(rec))
            except Exception as e:
                saver.free()
                self.units.append({"seq": ev.seq, "error": f"not prepared: {type(e).__name__}: {e}"})
        elif kind == "after_call" and self._pending_unit is not None and ev.seq == self._pending_unit.seq:
            unit, self._pending_unit = self._pending_unit, None
            self._run_unit(unit)
        elif kind == "end" and self._pending_unit is not None:
            self._pending_unit.saver.free()
            self._pending_unit = None

    def _run_unit(self, unit) -> None:
        from .graphunits import unit_rows
        cfg = self.cfg
        info: Dict[str, Any] = {"seq": unit.seq, "kernels_recorded": len(unit.names)}
        cupti = None
        try:
            times = unit.run_events(cfg.warmup, cfg.repeat)
            info["graph_times_us"] = times
            info["launch_gated"] = getattr(unit, "gated", False)
            if times:
                info["graph_us"] = stats(times)["median_us"]
            cupti = self.open_cupti()
            if cupti is not None:
                runs = unit.run_cupti(cupti, 0, cfg.repeat)
                cupti.close()
                cupti = None
                rows, cinfo = unit_rows(unit, runs, cfg.repeat, "graph")
                info.update({k: v for k, v in cinfo.items() if k != "seq"})
                if self.sel.name_filter:
                    rows = [r for r in rows if self.sel.matches_name(r["name"])] or rows
                if rows:
                    self.backend = "cupti"
                    self.unit_rows.extend(rows)
                else:
                    info["cupti"] = "no kernel record"
                    self.warn(f"graph: call #{unit.seq} cuGraphLaunch: CUPTI gave no kernel record for its runs; "
                              f"only the graph's time (CUDA events) is reported")
            if "graph_us" in info and not any(r.get("graph_seq") == unit.seq for r in self.unit_rows):
                self.unit_rows.append({"seq": unit.seq, "name": f"cuGraphLaunch #{unit.seq}", "unit": "graph",
                                       "times_us": times, **stats(times)})
        except Exception as e:
            self.warn(f"graph: call #{unit.seq} cuGraphLaunch: {type(e).__name__}: {e}")
            info["error"] = str(e)
            try:
                self.rv.call("cuCtxSynchronize")
            except Exception:
                pass
        finally:
            if cupti is not None:
                try:
                    cupti.close()
                except Exception:
                    pass
            unit.saver.free()
        self.units.append(info)

    def summary(self) -> Dict[str, Any]:
        ok = [u for u in self.units if "graph_us" in u]
        d: Dict[str, Any] = {"mode": "graph", "backend": self.backend, "path": "recorded graph launches",
                             "repeat": self.cfg.repeat, "warmup": self.cfg.warmup,
                             "graph_launches": len(self.unit_seqs), "graph_launches_timed": len(ok),
                             "launches": sum(u.get("kernels_recorded", 0) for u in ok),
                             "nodes": sum(u.get("kernels_recorded", 0) for u in ok),
                             "units": [{k: v for k, v in u.items() if k != "graph_times_us"} for u in self.units[:50]]}
        if ok:
            d["launch_gated"] = all(u.get("launch_gated") for u in ok)
            d["total_us"] = sum(u["graph_us"] for u in ok)
            d["graph_times_us"] = [u["graph_us"] for u in ok]
            if d["launches"]:
                d["per_launch_us"] = d["total_us"] / d["launches"]
            spans = [u["span_us"] for u in ok if "span_us" in u]
            if spans:
                d["cupti_span_us"] = sum(spans)
            with_rows = [u for u in ok if "span_us" in u and "covered_us" in u]
            if with_rows:          # kernel nodes of the program's graphs can run concurrently
                graph_us = sum(u["graph_us"] for u in with_rows)
                kernels = sum(u["kernel_us"] for u in with_rows)
                overlap = sum(max(0.0, u["kernel_us"] - u["covered_us"]) for u in with_rows)
                between = sum(max(0.0, u["span_us"] - u["covered_us"]) for u in with_rows)
                total = kernels - overlap + between
                c = {"graph_us": graph_us, "kernels_us": kernels, "overlap_us": overlap, "between_nodes_us": between,
                     "other_nodes_us": 0.0, "unrecorded_us": 0.0, "sum_us": total,
                     "kernel_share_pct": kernels / graph_us * 100 if graph_us > 0 else None,
                     "diff_pct": (total - graph_us) / graph_us * 100 if graph_us > 0 else None}
                c["within_5pct"] = c["diff_pct"] is not None and abs(c["diff_pct"]) <= 5.0
                d["check"] = c
        else:
            errs = [u["error"] for u in self.units if u.get("error")]
            d["error"] = "no recorded graph launch was timed" + (f" ({errs[0]})" if errs else "")
        return d
