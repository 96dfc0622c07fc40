"""`--profile graph`: the selected launches, in recorded order, are stream-captured into one
CUDA graph and the graph is launched warmup + repeat times; each timed run's time is the
graph launch's (CUDA events around cuGraphLaunch: the whole selected sequence).

What the graph holds: every selected launch from the first to the last one replayed, and the
device-side state changes issued between them (memsets, device-to-device copies, host-to-device
copies through a device staging buffer), in recorded order.  Kernels often depend on those: a
cuBLAS/CUB/CUTLASS kernel that spin-waits on a semaphore or tile counter that the library
zeroes with a memset right before the launch never finishes when the memset is left out and
the counter holds whatever a later kernel left there.  Device-to-host copies are not captured.

Capture: on one new non-blocking stream (CU_STREAM_NON_BLOCKING, so neither the legacy NULL
stream nor any other replayed stream synchronizes with it), in CU_STREAM_CAPTURE_MODE_RELAXED,
with nothing synchronized or queried while capturing.  Launches of every recorded stream,
the NULL stream included, are relaunched onto it (serialized in recorded order).  Launches
that the recording made into a stream capture of its own are graph nodes of the program's
graph, not executed launches: they are skipped.  A failed capture is ended and reported.

The sequence is recorded while the replay runs up to its last launch (graphseq.py): call by
call, or in the replay's C executor as timeline mode replays, when every launch is selected.

Memory: everything the launches could write is saved before the first selected launch
(pre-state) and after the last one (post-state).  Every graph run starts from the pre-state,
so each run does the recorded work on the recorded data; afterwards the post-state is put
back and the replay continues (and verifies) as recorded.  Memory the sequence frees (a
stream-ordered pool, cudaMallocAsync, scratch buffers) stays mapped until the graph has run
(placement.hold_frees): its kernels use it whenever it runs.  Runs are waited for with a time
limit (below --watchdog): a run that does not finish is reported as such and replay stops.

Timed runs: --repeat at most; from the 5th on, they stop once all are within 1% of their median
(`timed_runs`, `runs_note`), and the per-node runs below are as many.

Per-node times, in runs of their own after the timed ones (tracing slows a graph):
- CUPTI (cupti-python): repeat runs under CUPTI activity tracing.  Records of work run by a graph
  carry the graph node id; those are ids of the executable graph's nodes (clones made at
  instantiation), so the sequence is captured once more while CUPTI reports node creation (each
  node tagged with the operation being issued) and instantiated while it reports node cloning:
  record -> executable node -> captured node -> operation.  Where CUPTI gives no such callbacks
  (another subscriber holds them), node ids are matched to the operations by graph order (the
  graph is one chain).  Records are attributed by node id, not counted: a memset/copy node that
  CUPTI reports as a kernel is that memset/copy; a record of no captured node is listed as "not
  a recorded launch"; no run is thrown away.  Records without node ids (an old CUPTI): the i-th
  kernel record of a run is launch i, in runs with as many kernel records as launches.
- Without CUPTI: the sequence captured once more with an event record node (cuEventRecordWithFlags,
  CU_EVENT_RECORD_EXTERNAL) before the first operation and after each one; a node's time is the
  time between its two events (it holds the gap to the next node; the event nodes lengthen the
  graph).
The timeline check (`timeline_check`: each kernel's median in the graph against its median as
the same replay ran it eagerly, timed as timeline mode times it; graphcheck.py) needs no second
replay.  The summary's `per_node_method` says which ran ("CUPTI graph node ids", "event nodes between
launches"), `node_mapping` how node ids were matched, and `check` compares per-node times (with
the time between nodes that no record covers, under CUPTI) with the graph's time (within 5%?).

Kernels that run only inside the program's own graphs (JAX/XLA command buffers, CUDA-graph
PyTorch): when no selected launch runs outside a recorded stream capture, the recorded
cuGraphLaunch calls that hold selected kernels are timed themselves (they are graphs already):
each from the memory saved before it, warmup + repeat runs timed with CUDA events (the graph's
time), then repeat runs under CUPTI for per-kernel-node rows (graphunits.py).  The summary's
`path` says which was used: "captured sequence" or "recorded graph launches"."""
from __future__ import annotations

import gc
import importlib.util
import statistics
import time
from contextlib import contextmanager
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..functions import why_unbound
from ..group import peers_text, rank_done
from ..errors import ReplayError
from .common import LaunchGate, MemorySaver, Selection, destroy_all, ranges_for, stats
from .gapmodel import GapChain
from .graphcheck import TimelineReference, reference_check
from .graphnodes import NodeAttribution
from .graphrecorded import RecordedGraphUnits
from .graphseq import PRE_PHASE, SequenceRecording, relaunch
from .progress import PhaseProgress
from .timeline import open_cupti

CU_STREAM_NON_BLOCKING = 1
REPLAY_PHASE = "replaying (up to the last selected launch)"
REFERENCE_PHASE = "timeline check: the replay's kernel times"
CU_EVENT_RECORD_EXTERNAL = 1
CUDA_ERROR_NOT_READY = 600
STEADY_RUNS = 5          # timed runs before the graph's time may be called steady
NODE_RUNS = 5            # per-node runs (CUPTI or event nodes): at most this many
STEADY_PCT = 1.0         # steady: the timed runs' noise (robust relative std) within this, in percent


class GraphHang(Exception):
    pass


@contextmanager
def _no_gc():
    """Cyclic collection paused: hundreds of thousands of CUPTI records are made at once, and
    each collection pass would walk all of them again (it doubled the time to read them)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def steady(times_us: List[float], pct: float = STEADY_PCT) -> bool:
    """Timed runs whose noise (nvbench's robust relative standard deviation, 1.4826 x MAD /
    median, as compare reads it) is within pct: one slow run among steady ones does not keep
    a 65 ms graph running to --repeat."""
    if len(times_us) < 2:
        return False
    m = statistics.median(times_us)
    if m <= 0:
        return False
    mad = statistics.median(abs(t - m) for t in times_us)
    return 1.4826 * mad / m * 100 <= pct


class GraphProfiler:
    """Graph mode for one sequence, about 700 lines: each phase handles the driver's failures
    where it happens (a held stream, a hang, an invalidated capture). The phases: pre-state,
    build, instantiate, timed runs, per-node times, the timeline check (graphcheck.py), restore.
    Parts it holds: the sequence recorded from the replay (`sequence`, graphseq.py: the
    operations and the pre-state the phases here read), per-node attribution (`nodes`,
    graphnodes.py), the program's own graphs (`recorded`, graphrecorded.py)."""
    mode = "graph"
    label = "graph profiler"

    def __init__(self, cfg, warn: Callable[[str], None]):
        self.cfg = cfg
        self.warn = warn
        self.rv = None
        self.sel = None
        self._dp_hint: Optional[str] = None      # why a graph may not hold this code (computed once)
        self._gate: Optional[LaunchGate] = None  # holds the stream while a timed run is issued
        self._prelude_ops: List[Tuple] = []
        self._ref: Optional[TimelineReference] = None    # the timeline check's reference (graphcheck.py)
        self.done = False
        self.total_times_us: List[float] = []
        self.backend = "events"
        self.info: Dict[str, Any] = {}
        self.sequence = SequenceRecording(cfg, warn, self.info, self._phase)   # ops and pre-state (graphseq.py)
        self.nodes = NodeAttribution(self.info, warn)    # per-node times (graphnodes.py)
        self.timeout = 300.0
        self.recorded: Optional[RecordedGraphUnits] = None   # timing the program's own graphs instead
        self._chain: Optional[GapChain] = None           # gap calibration (gapmodel.py)
        self.gap: Optional[Dict[str, Any]] = None
        self.event_spans_us: List[float] = []           # event-node runs: first to last event
        self._made: List[Tuple[str, Any]] = []
        self._progress: Optional[PhaseProgress] = None

    @property
    def wants_calls(self) -> bool:
        """Call events: while the pre-state waits for its place, or when timing the recorded
        graph launches (unit mode)."""
        return self.recorded is not None or self.sequence.pre_pending

    @property
    def batch_ok(self) -> bool:
        """The replay may run plain calls in its C executor: every launch is selected (the
        sequence is recorded from the executor's batch events), and the timeline check, if
        on, times them through CUPTI as timeline mode does."""
        if self.recorded is not None or self.sel is None or not self.sel.everything:
            return False
        return self._ref is None or self._ref.batch_ok

    # ------------------------------------------------------------------ events
    def on_event(self, kind: str, ev) -> None:
        if kind == "start":
            self._start(ev)
            return
        if self.recorded is not None:
            self.recorded.on_event(kind, ev)
            return
        if self.done:
            return
        if self.sequence.due and self.sequence.in_job and kind not in ("teardown", "end"):
            # a rank of a job: the graph phase waits for the replay's end, when every collective
            # has run (a pause in the middle would leave a peer's collective waiting on this rank
            # while CUPTI and graph work here wait for that peer's GPU: a deadlock); the calls
            # that free memory wait with it (holds_releases), so the sequence's memory is there
            return
        if self.sequence.first_seq is None:
            if kind == "end" and self._ref is not None:
                self._ref.close()
            return
        ref = self._ref
        if kind == "before_launch":
            self.sequence.record(kind, ev)            # the pre-state first: the reference times the launch itself
            if ref is not None:
                ref.on_event(kind, ev)
        else:
            if ref is not None:
                ref.on_event(kind, ev)
            self.sequence.record(kind, ev)
        if self.sequence.launches and not self.rv.unloads_deferred:
            # from the sequence's first launch: the graph relaunches kernels whose module the
            # program may unload before the graph is built
            self.rv.defer_unloads()
        if kind in ("teardown", "end"):
            self.sequence.due = True
        if self.sequence.due and self.sequence.launches and not self.rv.capturing \
                and kind in (("teardown", "end") if self.sequence.in_job else
                             ("after_launch", "copy", "sync", "batch", "teardown", "end")):
            self.done = True
            if self.sequence.in_job:
                rank_done()
            try:
                self._run()
            finally:
                if self.sequence.in_job:
                    self.rv.run_held_frees()
                self.rv.unload_deferred()
        elif kind == "end":
            self._abandon()

    @property
    def holds_releases(self) -> bool:
        """A job rank's sequence is recorded and waits for the replay's end: calls that free
        memory wait with it (the engine runs them after, release_held)."""
        return self.sequence.in_job and self.sequence.due and not self.done

    def _abandon(self) -> None:
        """The replay ended before the sequence could be profiled: what was set up is released."""
        if self._ref is not None:
            self._ref.close()
        if self.sequence.pre is not None:
            self.sequence.pre.free()
            self.sequence.pre = None
            self.rv.release_held_memory()
        if self.rv is not None:
            self.rv.unload_deferred()

    def _start(self, ev) -> None:
        self.rv = rv = ev.replay
        self._t_start = time.monotonic()
        self.sel = Selection(self.cfg, rv)
        wd = getattr(rv.options, "watchdog", None)
        if wd:
            self.timeout = max(1.0, 0.8 * float(wd))
        self.sequence.scan(rv, self.sel)
        if self.sequence.last_seq is None:
            units = RecordedGraphUnits(self.cfg, rv, self.sel, self.info, self.warn, self._open_cupti)
            if units.start():
                self.recorded = units
            else:
                self.warn("graph: no launch selected")
                self.info["error"] = "no launch selected"
            return
        inside = [s for s in self.sequence.collectives if isinstance(s, int) and self.sequence.first_seq <= s <= self.sequence.last_seq]
        if inside:
            # one rank's graph cannot run a collective apart from its peers' graphs (its kernels wait
            # for them): refused before anything is built; the ranks replay on as recorded
            msg = (f"{len(inside)} collective launch(es) (call #{inside[0]} first) lie in the sequence: a graph of "
                   f"one rank cannot run them apart from its peers; profile the job with --profile timeline, or "
                   f"select launches between collectives (-k, --calls)")
            self.warn(f"graph: {msg}")
            self.info["error"] = msg
            self.sequence.first_seq = self.sequence.last_seq = None
            return
        n = sum(1 for s in self.sequence.graph_launch_seqs if isinstance(s, int) and self.sequence.first_seq < s < self.sequence.last_seq)
        if n:      # the program's own graphs run between the selected launches: not in ours
            self.sequence.skipped_ops["cuGraphLaunch"] = n
        self.sequence.pre_pending = True      # after_call: where the pre-state can be saved
        self._ref = TimelineReference.start(self.cfg, self.warn, ev)

    # ------------------------------------------------------------------ running the graph
    def _arm(self, what: str) -> None:
        wd = getattr(self.rv, "watchdog", None)
        if wd is not None:
            wd.arm(f"graph profiler: {what} ({len(self.sequence.launches)} launches, calls #{self.sequence.first_seq}..#{self.sequence.last_seq})")

    def _wait(self, stream, what: str) -> None:
        """cuStreamSynchronize with a time limit (polls cuStreamQuery)."""
        from ..driverops import DriverCallError, result_code
        cu = self.rv.driver
        t_end = time.monotonic() + self.timeout
        delay = 0.0
        while True:
            code = result_code(cu.cuStreamQuery(stream)[0])
            if code == 0:
                return
            if code != CUDA_ERROR_NOT_READY:
                raise DriverCallError("cuStreamQuery", code)
            if time.monotonic() > t_end:
                raise GraphHang(f"{what} did not finish within {self.timeout:g} s")
            time.sleep(delay)
            delay = min(0.002, delay + 0.0001)

    def _issue(self, op, stream) -> None:
        rv = self.rv
        k = op[0]
        if k == "launch":
            relaunch(op[1], stream)
        elif k == "memset":
            rv.call(op[1], *op[2], stream)
        elif k == "dtod":
            rv.call("cuMemcpyDtoDAsync", op[1], op[2], op[3], stream)
        elif k == "htod":
            rv.call("cuMemcpyDtoDAsync", op[2], op[5], op[3], stream)   # from the staging copy

    @staticmethod
    def _desc(op) -> str:
        if op[0] == "launch":
            return f"call #{op[1].seq} {op[1].name}"
        return f"call #{op[-1] if op[0] != 'htod' else op[4]} ({op[0]})"

    def _open_cupti(self):
        return open_cupti(self.cfg.backend, self.warn)

    def _prog(self) -> PhaseProgress:
        if self._progress is None:
            self._progress = PhaseProgress("graph", getattr(self.rv.options, "progress", None),
                                           bool(getattr(self.rv.options, "quiet", False)),
                                           getattr(self.rv, "progress_bar", None))
        return self._progress

    def _phase(self, name: str, total: Optional[int] = None):
        return self._prog().phase(name, total)

    def _capture(self, stream, tag=None, events: Optional[List] = None, what: str = "building the graph"):
        """The operations captured into a new graph.  tag: an object whose node_tag is set to
        each operation's index while it is issued (CUPTI node tracking); events: n + 1 events
        recorded as event record nodes, before the first operation and after each one."""
        with self._phase(what, len(self.sequence.ops)) as ph:
            return self._capture_ops(stream, tag, events, ph)

    def _instantiate(self, graph, what: str = "instantiating"):
        with self._phase(what):
            return self.rv.call("cuGraphInstantiate", graph, 0)

    def _capture_ops(self, stream, tag, events, ph):
        rv, cu = self.rv, self.rv.driver
        mode = getattr(getattr(cu, "CUstreamCaptureMode", None), "CU_STREAM_CAPTURE_MODE_RELAXED", 2)
        for op in self.sequence.ops:       # a library kernel's CUfunction is got before the capture, not inside it
            if op[0] == "launch" and getattr(op[1], "function", None) is not None:
                rv.bound_function(op[1].function)
        rv.call("cuStreamBeginCapture", stream, mode)
        err = None
        try:                          # nothing else in between: no sync, no query
            if events:
                rv.call("cuEventRecordWithFlags", events[0], stream, CU_EVENT_RECORD_EXTERNAL)
            for i, op in enumerate(self.sequence.ops):
                if tag is not None:
                    tag.node_tag = i
                try:
                    self._issue(op, stream)
                    if events:
                        rv.call("cuEventRecordWithFlags", events[i + 1], stream, CU_EVENT_RECORD_EXTERNAL)
                except Exception as e:
                    fn = getattr(op[1], "function", None) if op[0] == "launch" else None
                    err = f"{self._desc(op)}: {e}{why_unbound(fn) if fn is not None else ''}"
                    break
                if i & 255 == 255:
                    ph.advance(256)
        except Exception as e:
            err = f"event record node: {e}"
        finally:
            if tag is not None:
                tag.node_tag = None
        try:
            graph = rv.call("cuStreamEndCapture", stream)
        except Exception as e:
            graph = None
            err = err or f"cuStreamEndCapture: {e}"
        if err is not None:
            if graph is not None:
                try:
                    cu.cuGraphDestroy(graph)
                except Exception:
                    pass
            raise RuntimeError(f"stream capture failed at {err}")
        return graph

    def _live_ranges(self) -> List[Tuple[int, int]]:
        rv = self.rv
        live = rv.writable_ranges()
        for base, _bk, _n in (self.sequence.pre.copies if self.sequence.pre else []):
            try:
                b, n = rv.call("cuMemGetAddressRange", base)
                live.append((int(b), int(n)))
            except Exception:
                pass
        return live

    def _run(self) -> None:
        rv, cfg = self.rv, self.cfg
        prog = self._prog()                  # the replay up to here, as recorded, without the save before it
        prog.record(REPLAY_PHASE, time.monotonic() - self._t_start - prog.times.get(PRE_PHASE, 0.0))
        post = None
        stream = graph = gexec = None
        staging: List[int] = []
        evs: List[Any] = []
        cupti = None
        hung = False
        try:
            if self._ref is not None:        # the reference for the timeline check: the replay so far
                self._arm("reading the replay's kernel times")
                with self._phase(REFERENCE_PHASE):
                    self._ref.finish(self.sequence.first_seq, self.sequence.last_seq)
            self._arm("saving memory")
            with self._phase("saving memory"):
                rv.call("cuCtxSynchronize")
                post = MemorySaver(rv, ranges_for(rv, self.sequence.launches, cfg.save_limit))
                post.save()
                if self.sequence.pre is not None:
                    dropped = self.sequence.pre.keep_only(self._live_ranges())
                    if dropped:
                        self.warn(f"graph: {dropped} range(s) saved before the sequence were freed during it; "
                                  f"not restored")
                stream = rv.call("cuStreamCreate", CU_STREAM_NON_BLOCKING)
                staging = self.sequence.stage()
                self._prelude_ops = self.sequence.prelude()
                if self._prelude_ops:
                    self.info["prelude_ops"] = len(self._prelude_ops)
                rv.call("cuCtxSynchronize")
            self._arm("capturing")
            graph = self._capture(stream)
            gexec = self._instantiate(graph)
            digests: List[str] = []

            def check(timed: bool) -> None:
                if cfg.check_repeats and self.sequence.pre is not None and (timed or not digests):
                    digests.append(post.digest())

            with self._phase("timing the graph", cfg.warmup + cfg.repeat) as ph:
                for i in range(cfg.warmup):
                    self._graph_run(gexec, stream, f"warmup run {i + 1}")
                    check(False)
                    ph.advance()
                self._gate = LaunchGate.open(rv, stream)
                for i in range(cfg.repeat):
                    e0, e1 = rv.call("cuEventCreate", 0), rv.call("cuEventCreate", 0)
                    evs.append((e0, e1))
                    self._graph_run(gexec, stream, f"timed run {i + 1}", events=(e0, e1))
                    check(True)
                    ph.advance()
                    # each run was waited for: its time is there now
                    self.total_times_us.append(float(rv.call("cuEventElapsedTime", e0, e1)) * 1e3)
                    if STEADY_RUNS <= i + 1 < cfg.repeat and steady(self.total_times_us):
                        self.info["runs_note"] = (f"{i + 1} of {cfg.repeat} timed runs: their noise within "
                                                  f"{STEADY_PCT:g}%")
                        break
            self.info["timed_runs"] = len(self.total_times_us)
            self.info["launch_gated"] = self._gate is not None and self._gate.ok
            if self._gate is not None and not self._gate.ok:
                self.info["launch_gate"] = (f"released by its timer: the launch of {len(self.sequence.ops)} nodes waits for "
                                            f"queue space on a held stream; timed ungated")
            if self.sequence.in_job:      # memory then is the replay's later state, not the sequence's end
                self.info["profiled_at_end"] = True
            elif cfg.check_repeats and digests:
                self.info["repeats_identical"] = len(set(digests)) <= 1
                self.info["graph_matches_replay"] = digests[0] == post.digest(backup=True)
                if not self.info["graph_matches_replay"]:
                    self.warn("graph: memory after a graph run differs from the replay's (nondeterministic kernels, "
                              "or state the graph does not reproduce)")
            # per-node times in separate runs: CUPTI's kernel tracing, or event record nodes, slow the graph
            try:
                if cfg.backend != "events" and importlib.util.find_spec("cupti") is not None:
                    try:             # the gap calibration's untraced runs, before CUPTI is on
                        with self._phase("calibrating tracing"):
                            self._chain = GapChain(rv, stream)
                            self._chain.time_untraced()
                    except Exception as e:
                        self.warn(f"graph: gap calibration: {type(e).__name__}: {e}")
                        self._close_chain()
                cupti = self._open_cupti()
                if cupti is not None:
                    self._cupti_node_times(cupti, stream, gexec)
                    if self.nodes.node_times:
                        self.backend = "cupti"
                if not self.nodes.node_times and cfg.backend != "cupti":
                    self._event_node_times(stream)
            except GraphHang:
                raise
            except Exception as e:
                self.warn(f"graph: per-node times: {type(e).__name__}: {e}")
            self.info.update(nodes=len(self.sequence.ops), launches=len(self.sequence.launches),
                             memsets=sum(op[0] == "memset" for op in self.sequence.ops),
                             copies=sum(op[0] in ("dtod", "htod") for op in self.sequence.ops),
                             pre_state_restored=self.sequence.pre is not None)
        except GraphHang as e:
            hung = True
            msg = (f"graph: {e}: a kernel of the graph is likely waiting for state that the captured sequence "
                   f"does not reproduce (a semaphore or flag set by work outside calls "
                   f"#{self.sequence.first_seq}..#{self.sequence.last_seq}, or by another process); the GPU is still busy, replay stops")
            if self.sequence.in_job and peers_text():
                msg += f" (this rank's peers: {peers_text()})"
            self.warn(msg)
            self.info.update(error=str(e), hung=True)
            raise ReplayError(msg)
        except Exception as e:
            hint = self._device_launch_hint()
            self.warn(f"graph: {type(e).__name__}: {e}" + (f" ({hint})" if hint else ""))
            self.info["error"] = str(e)
        finally:
            if not hung:
                self._cleanup(post, stream, graph, gexec, staging, evs, cupti)

    def _device_launch_hint(self) -> str:
        """Why graph mode may fail or time nothing here: the snapshot's code launches kernels from
        the device (dynamic parallelism), whatever the error said; "" when it does not."""
        if self._dp_hint is None:
            from ..retarget import device_launching_loads
            try:
                loads = device_launching_loads(self.rv.snapshot)
            except Exception:
                loads = []
            self._dp_hint = (f"the code loaded by call #{loads[0]} launches kernels from the device, dynamic "
                             f"parallelism, which a graph of the sequence may not hold: --profile timeline or "
                             f"isolated times those kernels") if loads else ""
        return self._dp_hint

    def _graph_run(self, gexec, stream, what: str, events: Optional[Tuple] = None, clock=None,
                   windows: Optional[List] = None) -> None:
        """One run of an executable graph from the pre-sequence memory, waited for (time limit).
        events: a pair recorded around the launch; clock: CUPTI window marks around it."""
        rv = self.rv
        self._arm(what)
        if self.sequence.pre is not None:
            self.sequence.pre.restore(stream)
            for op in self._prelude_ops:           # what ran between the save and the first launch
                self._issue(op, stream)
            self._wait(stream, f"restoring memory before {what}")
        m0 = clock.mark() if clock is not None else None
        if events is not None:                       # the events time the GPU, not the host's submission
            LaunchGate.launch_timed(rv, self._gate, gexec, stream, *events)
        else:
            rv.call("cuGraphLaunch", gexec, stream)
        try:
            self._wait(stream, what)
        except GraphHang as e:
            if m0 is None:
                raise
            raise GraphHang(f"{e}{self._stuck_at(clock, m0)}") from None
        if m0 is not None and windows is not None:
            windows.append((m0, clock.mark()))

    def _stuck_at(self, clock, m0) -> str:
        """A traced run that did not finish: the operations whose records CUPTI has delivered
        (finished ones) and the first without one, where the graph waits (its nodes run in
        the sequence's order, except where the recorded streams let them overlap)."""
        try:
            done = len(clock.collect_records([(m0, clock.mark())])[0])
        except Exception:                                   # CUPTI itself is stuck: nothing to add
            return ""
        if done >= len(self.sequence.ops):
            return ""
        return (f"; {done} of {len(self.sequence.ops)} operations had finished, the first not finished is "
                f"{self._desc(self.sequence.ops[done])}")

    def _node_runs(self) -> int:
        """Runs for per-node times: as many as the graph's timed runs (fewer than --repeat when
        its time was steady early), at most NODE_RUNS: a node's median needs no more, and each
        traced run of a 20,000-node graph costs as much as a timed one plus its records."""
        return min(len(self.total_times_us) or self.cfg.repeat, NODE_RUNS)

    def _own(self, destroy: str, h) -> None:
        """A handle made for per-node runs, destroyed in _cleanup."""
        if h is not None:
            self._made.append((destroy, h))

    # ------------------------------------------------------------------ per-node times: CUPTI
    def _cupti_node_times(self, cupti, stream, gexec) -> None:
        """Repeat runs under CUPTI.  The graph is captured once more while CUPTI follows graph
        node creation (each node tagged with the operation being captured) and instantiated
        while it follows node cloning: a record's graph node id, an executable graph's node,
        leads to its original node and so to the captured operation (graph node ids).  Without
        those callbacks the node ids are matched to operations by their order in the graph."""
        from .graphunits import WindowClock
        tracked = False
        exe = gexec
        try:
            track = getattr(cupti, "track_graph_nodes", None)
            tracked = bool(track and track())
            if tracked:
                self._arm("capturing (CUPTI)")
                g2 = self._capture(stream, tag=cupti, what="building the graph (CUPTI node tracking)")
                self._own("cuGraphDestroy", g2)
                exe = self._instantiate(g2, "instantiating (CUPTI node tracking)")
                self._own("cuGraphExecDestroy", exe)
        except Exception as e:
            self.warn(f"graph: CUPTI node tracking: {type(e).__name__}: {e}; node ids matched by graph order")
            exe = gexec
        finally:
            if tracked:
                cupti.untrack_graph_nodes()
        clock = WindowClock(cupti)
        windows: List[Tuple] = []
        n_runs = self._node_runs()
        with self._phase("timing every node (CUPTI)", n_runs + (exe is not gexec)) as ph:
            if exe is not gexec:
                self._graph_run(exe, stream, "CUPTI warmup run")      # a new executable graph: its first upload
                ph.advance()
            clock.start()
            for i in range(n_runs):
                cupti.push(i + 1)
                try:
                    self._graph_run(exe, stream, f"CUPTI run {i + 1}", clock=clock, windows=windows)
                finally:
                    cupti.pop()
                ph.advance()
        with self._phase("collecting CUPTI records"), _no_gc():
            runs = clock.collect_records(windows)
            reset = getattr(cupti, "reset", None)
            if reset is not None:        # the calibration's records are read alone, not with these again
                reset()
        if self._chain is not None:
            try:
                with self._phase("calibrating tracing (CUPTI)"):
                    self._chain.time_traced(clock)
                    self.gap = self._chain.model()
            except Exception as e:
                self.warn(f"graph: gap calibration under CUPTI: {type(e).__name__}: {e}")
        cupti.close()
        created = getattr(cupti, "node_created", None) or {}
        clones = getattr(cupti, "node_clones", None) or {}
        with self._phase("matching records to nodes"), _no_gc():
            self.nodes.per_node(self.sequence.ops, self.sequence.launches, runs, created if exe is not gexec else {}, clones)

    # ------------------------------------------------------------------ per-node times: event nodes
    def _event_node_times(self, stream) -> None:
        """Without CUPTI: the sequence captured again with an event record node
        (CU_EVENT_RECORD_EXTERNAL) before the first operation and after each one; a node's time
        is the time between the events around it (so it holds the gap before the next node,
        and the event nodes add to the graph's time)."""
        rv = self.rv
        n = len(self.sequence.ops)
        try:
            evs = []
            for _ in range(n + 1):
                e = rv.call("cuEventCreate", 0)
                self._own("cuEventDestroy", e)
                evs.append(e)
            self._arm("capturing (event nodes)")
            g2 = self._capture(stream, events=evs, what="building the graph (event nodes)")
            self._own("cuGraphDestroy", g2)
            exe = self._instantiate(g2, "instantiating (event nodes)")
            self._own("cuGraphExecDestroy", exe)
        except Exception as e:
            self.warn(f"graph: per-node times with event nodes not available ({type(e).__name__}: {e})")
            return
        op_times: List[List[float]] = [[] for _ in range(n)]
        spans = []
        n_runs = self._node_runs()
        with self._phase("timing every node (event nodes)", n_runs + 1) as ph:
            self._graph_run(exe, stream, "event-node warmup run")
            ph.advance()
            for i in range(n_runs):
                self._graph_run(exe, stream, f"event-node run {i + 1}")
                span = 0.0
                for k in range(n):
                    t = float(rv.call("cuEventElapsedTime", evs[k], evs[k + 1])) * 1e3
                    op_times[k].append(t)
                    span += t
                spans.append(span)
                ph.advance()
        self.nodes.by_events(self.sequence.ops, self.sequence.launches, op_times)
        self.event_spans_us = spans
        self.backend = "events"
        self.info["per_node_method"] = "event nodes between launches"

    def _close_chain(self) -> None:
        if self._chain is not None:
            self._chain.close()
            self._chain = None

    def _cleanup(self, post, stream, graph, gexec, staging, evs, cupti) -> None:
        rv, cu = self.rv, self.rv.driver
        if self._ref is not None:
            self._ref.close()
        if cupti is not None:
            try:
                cupti.close()
            except Exception:
                pass
        self._close_chain()
        if self._gate is not None:
            self._gate.close()
            self._gate = None
        destroy_all(cu, self._made)
        self._made = []
        for p in evs:
            for e in p:
                try:
                    cu.cuEventDestroy(e)
                except Exception:
                    pass
        try:
            if post is not None and post.copies:
                self._arm("restoring memory")
                with self._phase("restoring memory"):
                    if stream is not None:
                        self._wait(stream, "the last graph run")
                    post.restore(stream if stream is not None else cu.CUstream(0))
                    rv.call("cuCtxSynchronize")
        except Exception as e:
            self.warn(f"graph: could not restore memory after the graph runs ({type(e).__name__}: {e})")
            self.info.setdefault("error", str(e))
        finally:
            for s in (post, self.sequence.pre):
                if s is not None:
                    s.free()
            self.sequence.pre = None
            held = rv.release_held_memory()
            if held:
                self.info["frees_held"] = held
            for b in staging:
                try:
                    rv.call("cuMemFree", b)
                except Exception:
                    pass
            for name, h in (("cuGraphExecDestroy", gexec), ("cuGraphDestroy", graph), ("cuStreamDestroy", stream)):
                if h is not None:
                    try:
                        getattr(cu, name)(h)
                    except Exception:
                        pass
            if self.sequence.skipped_ops:
                self.info["skipped_ops"] = dict(self.sequence.skipped_ops)
                self.warn("graph: not captured (not reproduced in the graph): "
                          + ", ".join(f"{k} x{v}" for k, v in sorted(self.sequence.skipped_ops.items())))
            if self.sequence.skipped_captured:
                self.info["skipped_captured_launches"] = self.sequence.skipped_captured
            if self._progress is not None:
                self._progress.close()
                self.info["phases_s"] = {k: round(v, 3) for k, v in self._progress.times.items()}

    # ------------------------------------------------------------------ results
    def launch_rows(self) -> List[Dict[str, Any]]:
        if self.recorded is not None:
            return [dict(r) for r in self.recorded.unit_rows]
        timing = "cupti" if self.backend == "cupti" else "event nodes"
        rows = []
        for i, ev in enumerate(self.sequence.launches):
            r = {"seq": ev.seq, "index": ev.index, "name": ev.name, "stream": ev.rec_stream, "grid": list(ev.grid),
                 "block": list(ev.block), "shmem": ev.shmem, "node": i}
            if self.nodes.node_times and self.nodes.node_times[i]:
                r["times_us"] = self.nodes.node_times[i]
                r["timing"] = timing
                if self.nodes.node_names and self.nodes.node_names[i]:
                    r["cupti_name"] = self.nodes.node_names[i]
                r.update(stats(self.nodes.node_times[i]))
            rows.append(r)
        return rows

    def _other_nodes(self) -> List[Dict[str, Any]]:
        """Memset and copy nodes of the graph: count and median time per run, by kind."""
        out: Dict[str, Dict[str, Any]] = {}
        for k, op in enumerate(self.sequence.ops):
            if op[0] == "launch":
                continue
            kind = "memset" if op[0] == "memset" else "copy"
            d = out.setdefault(kind, {"kind": kind, "nodes": 0, "timed": 0, "us_per_run": 0.0})
            d["nodes"] += 1
            ts = self.nodes.op_times[k] if k < len(self.nodes.op_times) else []
            if ts:
                d["timed"] += 1
                d["us_per_run"] += statistics.median(ts)
        return list(out.values())

    def _consistency(self, graph_us: float) -> Dict[str, Any]:
        """Per-node times against the graph's time (CUDA events around the whole graph)."""
        kernels = sum(statistics.median(t) for t in self.nodes.node_times if t)
        other = sum(d["us_per_run"] for d in self._other_nodes())
        extra = sum(e["us_per_run"] for e in self.nodes.extra_records)
        between = traced = self.nodes.between_us or 0.0             # as traced
        tracing = 0.0
        if self.gap and self.nodes.records_per_run and traced:
            # what tracing adds per node (durations and gaps), measured on the calibration chain
            tracing = statistics.median(self.nodes.records_per_run) * self.gap.get("tracing_per_node_us", 0.0)
        total = kernels + other + extra + between - tracing
        c: Dict[str, Any] = {"graph_us": graph_us, "kernels_us": kernels, "other_nodes_us": other,
                             "unrecorded_us": extra, "between_nodes_us": between, "tracing_us": tracing,
                             "sum_us": total,
                             "kernel_share_pct": kernels / graph_us * 100 if graph_us > 0 else None,
                             "diff_pct": (total - graph_us) / graph_us * 100 if graph_us > 0 else None}
        c["within_5pct"] = c["diff_pct"] is not None and abs(c["diff_pct"]) <= 5.0
        if self.event_spans_us:
            c["event_span_us"] = statistics.median(self.event_spans_us)
        if self.gap and traced:
            c["between_nodes_traced_us"] = traced
            c["gap_model"] = self.gap
        if traced and graph_us > 0:
            # measured bounds, nothing calibrated: untraced gaps are at least 0 and at most as traced
            lo, hi = kernels + other + extra, kernels + other + extra + traced
            c["bounds_us"] = [lo, hi]
            c["within_bounds"] = lo * 0.95 <= graph_us <= hi * 1.05
        return c

    def summary(self) -> Dict[str, Any]:
        if self.recorded is not None:
            return self.recorded.summary()
        d: Dict[str, Any] = {"mode": "graph", "backend": self.backend, "nodes": len(self.sequence.ops),
                             "launches": len(self.sequence.launches), "repeat": self.cfg.repeat, "warmup": self.cfg.warmup,
                             "first_seq": self.sequence.first_seq, "last_seq": self.sequence.last_seq,
                             "path": "captured sequence", **self.info}
        if self.total_times_us:
            st = stats(self.total_times_us)
            d["total_us"] = st["median_us"]
            d["graph_times_us"] = self.total_times_us
            d["graph"] = st
            if self.sequence.launches:
                d["per_launch_us"] = st["median_us"] / len(self.sequence.launches)
        if self.nodes.cupti_spans_us:
            d["cupti_span_us"] = stats(self.nodes.cupti_spans_us)["median_us"]
        if self.nodes.node_times:
            d.setdefault("per_node_method", "CUPTI graph node ids" if self.backend == "cupti" else
                         "event nodes between launches")
            d["launches_timed"] = sum(1 for t in self.nodes.node_times if t)
            other = self._other_nodes()
            if other:
                d["other_nodes"] = other
            if self.nodes.extra_records:
                d["unrecorded"] = self.nodes.extra_records[:20]
            if self.total_times_us:
                d["check"] = self._consistency(d["total_us"])
            ref = self._ref
            if ref is not None and ref.rows is not None and d["launches_timed"] \
                    and (self.cfg.timeline_check or self.backend == "cupti"):
                d["timeline_check"] = reference_check(self.launch_rows(), ref)
        else:
            d["launches_timed"] = 0
            d.pop("per_node_method", None)
            d.pop("node_mapping", None)
        if self.sequence.launches and not d["launches_timed"] and self._device_launch_hint():   # no profile: say why
            d["hint"] = self._device_launch_hint()
        return d
