"""`--profile timeline`: the replay's own timeline, asynchronous as recorded.

Kernel, copy and memset start/end come from CUPTI activity records (cupti-python).  Each
launch, copy and memset is tagged with an external correlation id, so records map to calls
exactly.  Without CUPTI, CUDA events are recorded around each of them (with a warning: an
event pair per operation adds work on the stream and can serialize).

With a trace (--trace) every replayed driver call is timed on the host as well, on the clock
of the device times (CUPTI's timestamp; CLOCK_MONOTONIC with CUDA events, each reference
event anchored to the host time it completed at), so replay/profile/trace.py can draw calls,
kernels and the arrows between them on one time axis."""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from .common import Selection

EVENT_WARNING = ("CUPTI (cupti-python) is not available: timing with CUDA events around each launch, "
                 "which adds serialization; install cupti-python for CUPTI activity timestamps")


class _Deferred:
    """A batch the C executor ran, in the slice list until the replay ends."""
    __slots__ = ("ev",)

    def __init__(self, ev):
        self.ev = ev


# ----------------------------------------------------------------------------- CUPTI
class CuptiCollector:
    """CUPTI activity records: kernels, memcpys, memsets, external correlations.  One per
    process at a time (CUPTI's activity callbacks are process-wide).

    Work run by a CUDA graph carries the ids of the graph and of the graph node that ran it
    (kernel_nodes[i] / copy_nodes[i]: (graph id, graph node id) of kernels[i] / copies[i]; 0, 0
    outside graphs).  Those are ids of the executable graph's nodes, clones of the nodes the
    graph was built with: track_graph_nodes() follows node creation and cloning (CUPTI resource
    callbacks) so that they can be traced back to the nodes made by each captured operation."""

    _active: Optional["CuptiCollector"] = None
    _registered = False

    def __init__(self):
        from cupti import cupti  # raises ImportError (or a load error) without cupti-python/libcupti
        self.c = cupti
        self.kernels: List[Tuple[int, int, int, str, int]] = []      # corr, start, end, name, stream_id
        self.copies: List[Tuple[int, int, int, int, str, int]] = []  # corr, start, end, bytes, kind, stream_id
        self.kernel_nodes: List[Tuple[int, int]] = []               # graph id, graph node id (of kernels[i])
        self.copy_nodes: List[Tuple[int, int]] = []                 # graph id, graph node id (of copies[i])
        self.ext: Dict[int, int] = {}                               # corr -> external id
        self.node_created: Dict[int, Any] = {}                      # node id -> tag current at its creation
        self.node_clones: Dict[int, int] = {}                       # cloned node id -> original node id
        self.node_tag: Any = None
        self._subscriber = None
        A = cupti.ActivityKind
        self._kinds = [A.CONCURRENT_KERNEL, A.MEMCPY, A.MEMSET, A.EXTERNAL_CORRELATION]
        CuptiCollector._active = self
        if not CuptiCollector._registered:
            cupti.activity_register_callbacks(CuptiCollector._requested, CuptiCollector._completed)
            CuptiCollector._registered = True
        for k in self._kinds:
            cupti.activity_enable(k)
        self.ext_kind = cupti.ExternalCorrelationKind.CUSTOM0

    @staticmethod
    def _requested():
        return 8 << 20, 0

    @staticmethod
    def _completed(activities):
        self = CuptiCollector._active
        if self is None:
            return
        A = self.c.ActivityKind
        for a in activities:
            k = a.kind
            try:
                if k in (A.CONCURRENT_KERNEL, A.KERNEL):
                    rec = (int(a.correlation_id), int(a.start), int(a.end), str(a.name), int(a.stream_id))
                    node = _graph_node(a)
                    self.kernels.append(rec)
                    self.kernel_nodes.append(node)
                elif k in (A.MEMCPY, A.MEMSET):
                    rec = (int(a.correlation_id), int(a.start), int(a.end), int(a.bytes),
                           "memcpy" if k == A.MEMCPY else "memset", int(a.stream_id))
                    node = _graph_node(a)
                    self.copies.append(rec)
                    self.copy_nodes.append(node)
                elif k == A.EXTERNAL_CORRELATION:
                    self.ext[int(a.correlation_id)] = int(a.external_id)
            except Exception:
                continue

    def push(self, ext_id: int) -> None:
        self.c.activity_push_external_correlation_id(self.ext_kind, int(ext_id))

    def pop(self) -> None:
        self.c.activity_pop_external_correlation_id(self.ext_kind)

    def flush(self) -> None:
        self.c.activity_flush_all(1)

    def timestamp(self) -> int:
        """Now, on the activity records' clock (cuptiGetTimestamp)."""
        return int(self.c.get_timestamp())

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self.untrack_graph_nodes()
            for k in self._kinds:
                try:
                    self.c.activity_disable(k)
                except Exception:
                    pass
            CuptiCollector._active = None

    def reset(self) -> None:
        self.flush()
        self.kernels, self.copies, self.ext = [], [], {}
        self.kernel_nodes, self.copy_nodes = [], []

    # graph nodes: creation (tagged with node_tag) and cloning (instantiation), by CUPTI node id
    def track_graph_nodes(self) -> bool:
        """Subscribe to CUPTI's graph-node created/cloned callbacks.  False when CUPTI refuses
        (one subscriber per process: a profiler such as Nsight Systems may hold it)."""
        if self._subscriber is not None:
            return True
        c = self.c
        try:
            sub = c.subscribe(self._on_callback, None)
        except Exception:
            return False
        try:
            R = c.CallbackIdResource
            for cbid in (R.GRAPHNODE_CREATED, R.GRAPHNODE_CLONED):
                c.enable_callback(1, sub, c.CallbackDomain.RESOURCE, cbid)
        except Exception:
            try:
                c.unsubscribe(sub)
            except Exception:
                pass
            return False
        self._subscriber = sub
        return True

    def untrack_graph_nodes(self) -> None:
        sub, self._subscriber = self._subscriber, None
        if sub is not None:
            try:
                self.c.unsubscribe(sub)
            except Exception:
                pass

    def _on_callback(self, userdata, domain, cbid, data) -> None:
        c = self.c
        try:
            if int(domain) != int(c.CallbackDomain.RESOURCE):
                return
            R = c.CallbackIdResource
            cbid = int(cbid)
            if cbid not in (int(R.GRAPHNODE_CREATED), int(R.GRAPHNODE_CLONED)):
                return
            if not hasattr(data, "resource_descriptor"):      # a pointer to CUpti_ResourceData
                data = c.ResourceData.from_ptr(int(data), readonly=True)
            g = c.GraphData.from_ptr(int(data.resource_descriptor), readonly=True)
            node = int(c.get_graph_node_id(int(g.node)))
            if cbid == int(R.GRAPHNODE_CREATED):
                self.node_created[node] = self.node_tag
            elif g.original_node:
                self.node_clones[node] = int(c.get_graph_node_id(int(g.original_node)))
        except Exception:
            pass


def _graph_node(a) -> Tuple[int, int]:
    """(graph id, graph node id) of an activity record; 0, 0 for work outside graphs (or a
    CUPTI without the fields)."""
    try:
        return int(getattr(a, "graph_id", 0) or 0), int(getattr(a, "graph_node_id", 0) or 0)
    except Exception:
        return 0, 0


def open_cupti(backend: str, warn: Callable[[str], None]) -> Optional[CuptiCollector]:
    if backend == "events":
        return None
    try:
        return CuptiCollector()
    except Exception as e:
        if backend == "cupti":
            warn(f"CUPTI requested but unavailable ({type(e).__name__}: {e})")
        return None


# ----------------------------------------------------------------------------- CUDA events
class EventClock:
    """Times operations with CUDA event pairs; positions relative to a reference event per
    context.  Resolve at synchronizations (cheap: only completed pairs) and before teardown."""

    def __init__(self, rv):
        self.rv = rv
        self.ref = None
        self.ref_ns = 0              # CLOCK_MONOTONIC when the current reference completed
        self.pending: List[Tuple[Any, Any, Dict[str, Any]]] = []

    def _ev(self):
        return self.rv.call("cuEventCreate", 0)

    def begin(self, stream) -> Any:
        rv = self.rv
        if self.ref is None:
            self.ref = self._ev()
            rv.call("cuEventRecord", self.ref, rv.driver.CUstream(0))
            rv.call("cuEventSynchronize", self.ref)
            self.ref_ns = time.monotonic_ns()   # contexts come and go: each reference has its anchor
        e = self._ev()
        rv.call("cuEventRecord", e, stream)
        return e

    def end(self, e0, stream, slice_: Dict[str, Any]) -> None:
        e1 = self._ev()
        self.rv.call("cuEventRecord", e1, stream)
        self.pending.append((e0, e1, slice_))

    def resolve(self, wait: bool = False) -> None:
        rv = self.rv
        keep = []
        for e0, e1, sl in self.pending:
            if wait:
                try:
                    rv.call("cuEventSynchronize", e1)
                except Exception:
                    pass
            elif int(rv.driver.cuEventQuery(e1)[0]) != 0:
                keep.append((e0, e1, sl))
                continue
            try:
                t0 = float(rv.call("cuEventElapsedTime", self.ref, e0))
                t1 = float(rv.call("cuEventElapsedTime", self.ref, e1))
                sl["start_ns"] = self.ref_ns + int(t0 * 1e6)
                sl["end_ns"] = self.ref_ns + int(t1 * 1e6)
            except Exception:
                sl["lost"] = True
            for e in (e0, e1):
                try:
                    rv.driver.cuEventDestroy(e)
                except Exception:
                    pass
        self.pending = keep

    def drop_ref(self) -> None:
        self.resolve(wait=True)
        if self.ref is not None:
            try:
                self.rv.driver.cuEventDestroy(self.ref)
            except Exception:
                pass
        self.ref = None


# ----------------------------------------------------------------------------- profiler
class TimelineProfiler:
    mode = "timeline"
    label = "timeline profiler"

    def __init__(self, cfg, warn: Callable[[str], None]):
        self.cfg = cfg
        self.warn = warn
        self.rv = None
        self.sel = None
        self.cupti: Optional[CuptiCollector] = None
        self.clock: Optional[EventClock] = None
        self.backend = "none"
        self.slices: List[Dict[str, Any]] = []        # kernels and copies, in issue order
        self.by_ext: Dict[int, Dict[str, Any]] = {}
        self._next_ext = 1
        self.streams: Dict[int, str] = {}
        # --trace: every replayed call timed on the host: [seq, f, tid, recorded t0, t1, t0, t1]
        self.wants_calls = bool(getattr(cfg, "trace", None))
        self.calls: List[list] = []
        self._open_calls: List[list] = []
        self.device: Optional[int] = None
        self._deferred = False                        # slices holds _Deferred batch placeholders
        self.captured_launches = 0                    # launches recorded into a stream capture
        self.graph_slices: List[Dict[str, Any]] = []  # every replayed cuGraphLaunch, in issue order
        self._graphs = None                           # RecordedGraphs, for a selection by kernel
        self._graph_open: Optional[Dict[str, Any]] = None

    @property
    def batch_ok(self) -> bool:
        """Plain calls may run in the replay's C executor: CUPTI times them; their records are
        matched to the slices in issue order (no external correlation id per launch)."""
        return self.cupti is not None and not self.wants_calls and self.sel is not None and self.sel.everything

    # events
    def on_event(self, kind: str, ev) -> None:
        m = getattr(self, "_" + kind, None)
        if m is not None:
            m(ev)

    def _start(self, ev) -> None:
        self.rv = ev.replay
        self.device = getattr(self.rv.options, "device", None)
        self.sel = Selection(self.cfg, self.rv)
        self.cupti = open_cupti(self.cfg.backend, self.warn)
        if self.cupti is not None:
            self.backend = "cupti"
        else:
            self.backend = "events"
            self.clock = EventClock(self.rv)
            self.warn(EVENT_WARNING)

    def _open(self, sl: Dict[str, Any], stream) -> None:
        self.slices.append(sl)
        if self.cupti is not None:
            self._open_ext(sl)
        else:
            sl["_e0"] = self.clock.begin(stream)

    def _open_ext(self, sl: Dict[str, Any]) -> None:
        ext = self._next_ext
        self._next_ext += 1
        sl["ext"] = ext
        self.by_ext[ext] = sl
        self.cupti.push(ext)

    def _close(self, sl: Dict[str, Any], stream) -> None:
        if self.cupti is not None:
            self.cupti.pop()
        else:
            e0 = sl.pop("_e0", None)
            if e0 is not None:
                self.clock.end(e0, stream, sl)

    def _capturing(self) -> bool:
        return self.clock is not None and self.rv is not None and self.rv.capturing

    def _before_launch(self, ev) -> None:
        if not self.sel(ev):
            return
        if self.rv.stream_capturing(ev.rec_stream, ev.stream):
            self.captured_launches += 1             # a node of the program's graph: runs with its cuGraphLaunch
            return
        if self._capturing():                       # events would become graph nodes
            return
        sl = {"kind": "kernel", "seq": ev.seq, "index": ev.index, "name": ev.name, "stream": ev.rec_stream,
              "grid": list(ev.grid), "block": list(ev.block), "shmem": ev.shmem}
        ev.data["timeline"] = sl
        self._open(sl, ev.stream)

    def _batch(self, ev) -> None:
        """Ops the C executor ran: a placeholder in issue order, made into their slices after
        the replay (_expand), so that profiling adds no per-launch Python work to the run."""
        self.slices.append(_Deferred(ev))
        self._deferred = True

    def _expand(self) -> None:
        if not self._deferred:
            return
        out: List[Any] = []
        for sl in self.slices:
            if type(sl) is _Deferred:
                self._batch_slices(sl.ev, out.append)
            else:
                out.append(sl)
        self.slices[:] = out
        self._deferred = False

    def _batch_slices(self, ev, add) -> None:
        """The slices of the ops a batch event ran, in issue order (timed by _match_cupti)."""
        from ..plan import COPY_ASYNC, D2H, LAUNCH_EX, MEMSET8, MEMSET32_ASYNC
        rv = self.rv
        for k, index, rec in ev.ops():
            if index >= 0:
                a = rec["a"]
                if k == LAUNCH_EX:
                    from ..plan import LAUNCH_CONFIG
                    v = LAUNCH_CONFIG.unpack_from(a["config"])
                    grid, block, shm, rs = list(v[0:3]), list(v[3:6]), v[6], v[7]
                else:
                    g = a.get
                    grid = [g("gridDimX", 1), g("gridDimY", 1), g("gridDimZ", 1)]
                    block = [g("blockDimX", 1), g("blockDimY", 1), g("blockDimZ", 1)]
                    shm, rs = g("sharedMemBytes", 0), g("hStream") or 0
                add({"kind": "kernel", "seq": rec["s"], "index": index, "name": rv.kernel_name(a["f"], rec["s"]),
                     "stream": rs, "grid": grid, "block": block, "shmem": shm})
            elif MEMSET8 <= k <= COPY_ASYNC or k == D2H:
                a = rec["a"]
                memset = k <= MEMSET32_ASYNC
                if memset:
                    unit = (1, 2, 4)[(k - MEMSET8) % 3]
                    nb = int(a.get("N") or 0) * unit
                    d = "memset"
                else:
                    nb = int(a.get("ByteCount") or 0)
                    d = "DtoH" if k == D2H else "DtoD" if "DtoD" in rec["f"] else "other"
                add({"kind": "memset" if memset else "copy", "seq": rec["s"], "direction": d,
                     "name": f"{d} {nb} B" if nb else rec["f"], "call": rec["f"], "bytes": nb,
                     "stream": a.get("hStream") or 0})

    # the program's own graphs: their kernels run at cuGraphLaunch, as graph nodes
    def _graph_selected(self, rec) -> bool:
        if self.sel.everything:
            return True
        if self.sel.counting:             # -s/-c count recorded launches; graph nodes are not
            return False
        if self._graphs is None:
            from .graphunits import RecordedGraphs
            self._graphs = RecordedGraphs(self.rv)
        return self._graphs.selected(self.sel, rec)

    def _before_graph_launch(self, ev) -> None:
        """Every replayed cuGraphLaunch gets a slice: CUPTI's records of the graph's work carry
        the launch's correlation id and are matched to these slices in issue order
        (_match_graph_records); with CUDA events a selected launch is timed whole."""
        a = ev.rec.get("a") or {}
        live = self.rv.stream(ev.rec, a.get("hStream"))
        if self._capturing() or self.rv.stream_capturing(a.get("hStream"), live):
            return                          # a child graph of a recorded capture: runs with its graph
        sl = {"kind": "graph", "seq": ev.seq, "name": "cuGraphLaunch", "stream": a.get("hStream") or 0,
              "selected": self._graph_selected(ev.rec)}
        self.graph_slices.append(sl)
        if sl["selected"]:
            self.slices.append(sl)
        if self.cupti is not None:
            self._open_ext(sl)
        elif sl["selected"]:
            sl["_e0"] = self.clock.begin(live)
        else:
            return
        self._graph_open = sl

    def _graph_launch(self, ev) -> None:
        sl, self._graph_open = self._graph_open, None
        if sl is not None and sl["seq"] == ev.seq:
            self._close(sl, self.rv.stream(ev.rec, (ev.rec.get("a") or {}).get("hStream")))

    def _after_launch(self, ev) -> None:
        sl = ev.data.get("timeline")
        if sl is not None:
            self._close(sl, ev.stream)

    def now(self) -> int:
        """Host time on the device times' clock."""
        if self.cupti is not None:
            try:
                return self.cupti.timestamp()
            except Exception:
                pass
        return time.monotonic_ns()

    def _before_call(self, ev) -> None:
        rec = ev.rec or {}
        c = [ev.seq, ev.call, rec.get("tid"), rec.get("t0"), rec.get("t1"), self.now(), None]
        self.calls.append(c)
        self._open_calls.append(c)

    def _after_call(self, ev) -> None:
        t = self.now()
        while self._open_calls:
            c = self._open_calls.pop()
            c[6] = t
            if c[0] == ev.seq:
                break

    def _before_copy(self, ev) -> None:
        if ev.stream is None or self._capturing():
            return
        memset = ev.direction == "memset"
        sl = {"kind": "memset" if memset else "copy", "seq": ev.seq, "direction": ev.direction,
              "name": f"{ev.direction} {ev.nbytes} B" if ev.nbytes else ev.call,
              "call": ev.call, "bytes": ev.nbytes, "stream": ev.rec_stream}
        ev.data["timeline"] = sl
        self._open(sl, ev.stream)

    def _copy(self, ev) -> None:
        sl = ev.data.get("timeline")
        if sl is not None:
            self._close(sl, ev.stream)

    def _sync(self, ev) -> None:
        if self.clock is not None and self.clock.pending:
            self.clock.resolve()

    def _teardown(self, ev) -> None:
        if self.clock is not None:
            try:
                self.rv.call("cuCtxSynchronize")
            except Exception:
                pass
            self.clock.drop_ref()

    def _end(self, ev) -> None:
        t = self.now()
        for c in self._open_calls:          # a call that raised: closed now
            c[6] = t
        self._open_calls = []
        if self.clock is not None:
            try:
                self.clock.resolve(wait=True)
            except Exception:
                pass
        if self.cupti is not None:
            try:
                self.cupti.close()
            finally:
                self._match_cupti()

    def _match_cupti(self) -> None:
        self._expand()
        c = self.cupti
        self._match_graph_records()
        unmatched = []
        kn = getattr(c, "kernel_nodes", None) or []
        for j, (corr, t0, t1, name, sid) in enumerate(c.kernels):
            if kn[j:j + 1] not in ([], [(0, 0)]):
                continue                    # a graph's work: _match_graph_records
            sl = self.by_ext.get(c.ext.get(corr, -1))
            if sl is None or sl["kind"] != "kernel" or "start_ns" in sl:
                # untagged work outside graphs: calls the C executor ran (or no external
                # correlation records at all), matched by issue order below
                if corr not in c.ext:
                    unmatched.append((corr, t0, t1, name, sid))
                continue
            sl["start_ns"], sl["end_ns"], sl["cupti_name"], sl["stream_id"] = t0, t1, name, sid
        if unmatched:
            todo = [s for s in self.slices if s["kind"] == "kernel" and "start_ns" not in s
                    and ("ext" not in s or not c.ext)]
            for sl, (corr, t0, t1, name, sid) in zip(todo, sorted(unmatched)):
                sl["start_ns"], sl["end_ns"], sl["cupti_name"], sl["stream_id"] = t0, t1, name, sid
        loose = []
        cn = getattr(c, "copy_nodes", None) or []
        for j, (corr, t0, t1, nb, kind, sid) in enumerate(c.copies):
            if cn[j:j + 1] not in ([], [(0, 0)]):
                continue
            sl = self.by_ext.get(c.ext.get(corr, -1))
            if sl is not None and sl["kind"] in ("copy", "memset") and "start_ns" not in sl:
                sl["start_ns"], sl["end_ns"], sl["stream_id"] = t0, t1, sid
            elif corr not in c.ext:
                loose.append((corr, t0, t1, sid))
        if loose:                  # copies and memsets the C executor ran: by issue order
            todo = [s for s in self.slices if s["kind"] in ("copy", "memset") and "start_ns" not in s
                    and ("ext" not in s or not c.ext)]
            for sl, (corr, t0, t1, sid) in zip(todo, sorted(loose)):
                sl["start_ns"], sl["end_ns"], sl["stream_id"] = t0, t1, sid

    def _match_graph_records(self) -> None:
        """Records of work run by graphs (a graph node id) become the rows of the cuGraphLaunch
        that ran them: by external correlation id where CUPTI gave one, else one launch's
        records share a correlation id (the cuGraphLaunch call's) and those groups follow the
        replayed launches in issue order.  Kernels become kernel rows named by CUPTI, with the
        launch's seq and their graph node id; memset and copy nodes become copy rows."""
        c = self.cupti
        kn, cn = getattr(c, "kernel_nodes", None) or [], getattr(c, "copy_nodes", None) or []
        recs = [(r[0], r[1], r[2], r[3], r[4], "kernel", 0, n[1]) for r, n in zip(c.kernels, kn) if n != (0, 0)]
        recs += [(r[0], r[1], r[2], None, r[5], r[4], r[3], n[1]) for r, n in zip(c.copies, cn) if n != (0, 0)]
        if not recs:
            if self.graph_slices:
                self._drop_empty_graph_slices()
            return
        groups: Dict[int, List[tuple]] = {}
        for r in recs:
            groups.setdefault(r[0], []).append(r)
        owner: Dict[int, Dict[str, Any]] = {}
        for corr in groups:
            sl = self.by_ext.get(c.ext.get(corr, -1))
            if sl is not None and sl.get("kind") == "graph":
                owner[corr] = sl
        taken = {id(sl) for sl in owner.values()}
        free = [g for g in self.graph_slices if id(g) not in taken]
        rest = sorted(corr for corr in groups if corr not in owner)
        if len(rest) != len(free):
            self.warn(f"timeline: {len(rest)} graph launch(es) in CUPTI's records against {len(free)} replayed "
                      f"cuGraphLaunch call(s) not matched otherwise; matched in order as far as they go")
        for corr, sl in zip(rest, free):
            owner[corr] = sl
        for corr, sl in owner.items():
            if not sl.get("selected"):
                continue
            kids = sl.setdefault("_kids", [])
            for _corr, t0, t1, name, sid, kind, nb, nid in groups[corr]:
                if kind == "kernel":
                    kids.append({"kind": "kernel", "seq": sl["seq"], "graph_seq": sl["seq"], "graph_node_id": nid,
                                 "name": name, "cupti_name": name, "stream": sl["stream"],
                                 "start_ns": t0, "end_ns": t1, "stream_id": sid})
                else:
                    memset = kind == "memset"
                    kids.append({"kind": "memset" if memset else "copy", "seq": sl["seq"], "graph_seq": sl["seq"],
                                 "graph_node_id": nid, "direction": "memset" if memset else "graph node",
                                 "name": f"{'memset' if memset else 'copy'} node {nb} B", "call": "cuGraphLaunch",
                                 "bytes": nb, "stream": sl["stream"], "start_ns": t0, "end_ns": t1, "stream_id": sid})
            kids.sort(key=lambda k: k["start_ns"])
            sl["start_ns"], sl["end_ns"] = kids[0]["start_ns"], max(k["end_ns"] for k in kids)
        self._drop_empty_graph_slices()

    def _drop_empty_graph_slices(self) -> None:
        """Graph slices give way to the rows of their work (CUPTI); a launch with none is dropped."""
        out: List[Any] = []
        for sl in self.slices:
            if type(sl) is dict and sl.get("kind") == "graph":
                out.extend(sl.get("_kids", ()))
            else:
                out.append(sl)
        self.slices[:] = out

    # results
    def launch_rows(self) -> List[Dict[str, Any]]:
        self._expand()
        rows = []
        for sl in self.slices:
            if sl["kind"] != "kernel":
                continue
            r = {k: v for k, v in sl.items() if not k.startswith("_") and k not in ("ext", "kind")}
            if "start_ns" in sl and "end_ns" in sl:
                r["time_us"] = (sl["end_ns"] - sl["start_ns"]) / 1e3
            rows.append(r)
        return rows

    def summary(self) -> Dict[str, Any]:
        self._expand()
        ks = [s for s in self.slices if s["kind"] == "kernel" and "start_ns" in s]
        d: Dict[str, Any] = {"mode": "timeline", "backend": self.backend, "launches_timed": len(ks),
                             "launches_selected": sum(1 for s in self.slices if s["kind"] == "kernel")}
        if self.graph_slices:
            sel = [g for g in self.graph_slices if g.get("selected")]
            d["graph_launches"] = len(sel)
            d["graph_kernels_timed"] = sum(1 for s in ks if s.get("graph_seq") is not None)
            whole = [(g["end_ns"] - g["start_ns"]) / 1e3 for g in self.slices
                     if g.get("kind") == "graph" and "start_ns" in g and "end_ns" in g]
            if whole:                      # CUDA events: each launch timed whole
                d["graph_launch_us"] = [round(x, 3) for x in whole]
        if self.captured_launches:
            d["captured_launches"] = self.captured_launches
        if ks:
            d["span_us"] = (max(s["end_ns"] for s in ks) - min(s["start_ns"] for s in ks)) / 1e3
            d["kernel_time_us"] = sum(s["end_ns"] - s["start_ns"] for s in ks) / 1e3
            d["total_us"] = d["span_us"]
        return d
