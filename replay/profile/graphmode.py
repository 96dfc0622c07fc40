"""`--profile graph`: the selected launches, in recorded order, are stream-captured into one
CUDA graph (on one new stream: launches of several recorded streams are serialized) right
after the last selected launch replayed, and the graph is launched warmup + repeat times.

Result: total time per graph launch (CUDA events) and, with CUPTI, per-kernel times.  Memory
the launches could write is saved before the graph runs and restored after, so the replay
continues (and verifies) as recorded.  The launches' buffers must still be allocated after
the last selected launch (true for caching allocators: PyTorch, JAX)."""
from __future__ import annotations

import statistics
from typing import Any, Callable, Dict, List, Optional

from .isolated import MemorySaver, ranges_for, stats
from .timeline import open_cupti


class GraphProfiler:
    mode = "graph"
    label = "graph profiler"

    def __init__(self, cfg, warn: Callable[[str], None]):
        self.cfg = cfg
        self.warn = warn
        self.rp = None
        self.sel = None
        self.last_seq: Optional[int] = None
        self.launches: List[Any] = []
        self.done = False
        self.due = False
        self.total_times_us: List[float] = []
        self.node_times: List[List[float]] = []
        self.backend = "events"
        self.info: Dict[str, Any] = {}

    def on_event(self, kind: str, ev) -> None:
        if kind == "start":
            self._start(ev)
            return
        if self.done:
            return
        capturing = bool(getattr(self.rp, "capturing", None))
        if kind == "before_launch" and self.sel(ev) and not capturing:
            self.launches.append(ev)
        elif kind == "after_launch" and ev.seq == self.last_seq:
            self.due = True
        if kind in ("teardown", "end"):
            self.due = True
        if self.due and self.launches and not capturing and kind in ("after_launch", "copy", "sync", "teardown", "end"):
            self.done = True
            self._run()

    def _start(self, ev) -> None:
        from . import Selection, is_launch_call
        self.rp = rp = ev.replayer
        self.sel = Selection(self.cfg, rp.func_names)
        for rec in rp.reader.records(("c",)):
            f = rec.get("f") or ""
            if not is_launch_call(f) or rec.get("r", 0) != 0 or rec.get("incomplete"):
                continue
            if self.sel.rec(rec, rp.kernel_name_of((rec.get("a") or {}).get("f"))):
                s = rec.get("s")
                if isinstance(s, int) and (self.last_seq is None or s > self.last_seq):
                    self.last_seq = s
        if self.last_seq is None:
            self.warn("graph: no launch selected")

    def _run(self) -> None:
        rp, cfg, cu = self.rp, self.cfg, self.rp.cu
        saver = None
        stream = graph = gexec = None
        evs: List[Any] = []
        cupti = None
        try:
            rp.raw("cuCtxSynchronize")
            saver = MemorySaver(rp, ranges_for(rp, self.launches, cfg.save_limit))
            saver.save()
            stream = rp.raw("cuStreamCreate", 1)          # CU_STREAM_NON_BLOCKING
            mode = getattr(getattr(cu, "CUstreamCaptureMode", None), "CU_STREAM_CAPTURE_MODE_RELAXED", 2)
            rp.raw("cuStreamBeginCapture", stream, mode)
            try:
                for ev in self.launches:
                    ev.ctx.relaunch(stream)
            finally:
                graph = rp.raw("cuStreamEndCapture", stream)
            gexec = rp.raw("cuGraphInstantiate", graph, 0)
            for _ in range(cfg.warmup):
                rp.raw("cuGraphLaunch", gexec, stream)
            rp.raw("cuStreamSynchronize", stream)
            cupti = open_cupti(cfg.backend, self.warn)
            if cupti is not None:
                self.backend = "cupti"
            for i in range(cfg.repeat):
                e0, e1 = rp.raw("cuEventCreate", 0), rp.raw("cuEventCreate", 0)
                evs.append((e0, e1))
                if cupti is not None:
                    cupti.push(i + 1)
                rp.raw("cuEventRecord", e0, stream)
                rp.raw("cuGraphLaunch", gexec, stream)
                rp.raw("cuEventRecord", e1, stream)
                if cupti is not None:
                    cupti.pop()
            rp.raw("cuStreamSynchronize", stream)
            self.total_times_us = [float(rp.raw("cuEventElapsedTime", a, b)) * 1e3 for a, b in evs]
            if cupti is not None:
                cupti.close()
                self._per_node(cupti)
            self.info = {"nodes": len(self.launches)}
        except Exception as e:
            self.warn(f"graph: {type(e).__name__}: {e}")
            self.info["error"] = str(e)
        finally:
            if cupti is not None and not self.node_times:
                try:
                    cupti.close()
                except Exception:
                    pass
            for p in evs:
                for e in p:
                    try:
                        cu.cuEventDestroy(e)
                    except Exception:
                        pass
            if saver is not None:
                try:
                    if saver.copies:
                        if stream is not None:
                            rp.raw("cuStreamSynchronize", stream)
                        saver.restore(cu.CUstream(0))
                        rp.raw("cuCtxSynchronize")
                finally:
                    saver.free()
            for name, h in (("cuGraphExecDestroy", gexec), ("cuGraphDestroy", graph), ("cuStreamDestroy", stream)):
                if h is not None:
                    try:
                        getattr(cu, name)(h)
                    except Exception:
                        pass

    def _per_node(self, cupti) -> None:
        n = len(self.launches)
        runs: Dict[int, List] = {}
        for corr, t0, t1, name, sid in cupti.kernels:
            runs.setdefault(cupti.ext.get(corr, 0), []).append((t0, t1, name))
        self.node_times = [[] for _ in range(n)]
        for run_id, ks in runs.items():
            ks.sort()
            if len(ks) != n:
                continue
            for i, (t0, t1, _name) in enumerate(ks):
                self.node_times[i].append((t1 - t0) / 1e3)

    def launch_rows(self) -> List[Dict[str, Any]]:
        rows = []
        for i, ev in enumerate(self.launches):
            r = {"seq": ev.seq, "index": ev.index, "name": ev.name, "stream": ev.rec_stream, "grid": list(ev.grid),
                 "block": list(ev.block), "shmem": ev.shmem, "node": i}
            if self.node_times and self.node_times[i]:
                r["times_us"] = self.node_times[i]
                r.update(stats(self.node_times[i]))
            rows.append(r)
        return rows

    def summary(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {"mode": "graph", "backend": self.backend, "nodes": len(self.launches),
                             "repeat": self.cfg.repeat, "warmup": self.cfg.warmup, **self.info}
        if self.total_times_us:
            st = stats(self.total_times_us)
            d["total_us"] = st["median_us"]
            d["graph_times_us"] = self.total_times_us
            d["graph"] = st
            if self.launches:
                d["per_launch_us"] = st["median_us"] / len(self.launches)
        return d
