"""The replay engine (Replayer): reads a snapshot, prescans it (handles, placement, selection),
loads the driver, then replays its call records in file order: runs of plain calls are planned
into batches the C executor runs (plan.py, executor.c), the rest dispatched one by one to the
handlers (dispatch.py); D2H results are verified as they come. Profilers and hooks subscribe to
its events (events.py)."""
from __future__ import annotations

import gc
import math
import os
import sys
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

from cudasnap.formats import SnapshotError
from cudasnap.formats.opened import opened
from cudasnap.formats.layout import recorded_stream
from cudasnap.formats.vocab import in_class, is_launch, is_query, is_release, is_sync, malformed_call, selectable

from . import dispatch
from .batchrun import SYNC_TIMES_MAX, BatchRunner, RecordedThread, RecordedThreads
from .profrange import PROFILER_RANGES, ProfilerRange
from .prescan import Prescan
from .driverinit import init_driver
from .eventbus import EventBus
from .context import ReplayContext
from .driverops import Watchdog, result_code, handle_int
from .errors import DriverCallError, ReplayError
from .options import ReplayOptions, ReplayResult
from . import hostplace
from .plan import OpBatch
from .staging import PREFETCH_MIN, BlobPipeline
from .numerics import Policy, TypeOracle, parse_dtype_specs, policy_of
from .verify import Mismatch
from .view import ReplayView

CU_STREAM_LEGACY, CU_STREAM_PER_THREAD = 1, 2
PACE_SPIN_S = 100e-6            # --pace recorded: spin (not sleep) this long before a call is due


# Replays this process must give back before it runs another (track_replays; None: not tracked)
_tracked: Optional[List["Replayer"]] = None


def track_replays() -> None:
    """This process runs replay after replay (a campaign's kept worker): remember every
    replay that initialized the driver, for close_replays, and keep what never touches the
    GPU (a snapshot's prescan, its module images) for the next replay of it (keep.py)."""
    global _tracked
    if _tracked is None:
        _tracked = []
    from . import keep
    keep.enable()                 # what never touches the GPU is kept between its replays


def close_replays() -> Dict[str, int]:
    """Replayer.close() on every tracked replay since the last call; the counts, summed."""
    out: Dict[str, int] = {}
    while _tracked:
        for k, v in _tracked.pop().close().items():
            out[k] = out.get(k, 0) + v
    from . import keep
    keep.release()                # the kept prescans free for the next replay
    return out


def plan_ahead(snapshot, options: ReplayOptions) -> Optional[Tuple]:
    """In a process that forks replays and never starts the driver (a campaign's warm server):
    the snapshot's pass made and kept (keep.py) for these options, with its module images
    decoded, so that each replay forked afterwards takes them (copy-on-write) instead of making
    its own. Raises what the replay would report (a bad option, a damaged snapshot). Returns
    the key the pass is kept under (keep.kept tells whether it still is; None: not kept)."""
    from . import keep
    from .retarget import image_info, loaded_images
    keep.enable()
    rp = Replayer(snapshot, options)
    try:
        rp._read_and_plan()
        reader = rp.ctx.reader
        for _rec, bid in loaded_images(reader):
            image_info(reader, bid)                        # the preflight's reading, and the image
        return rp.scan._keep_key()
    finally:
        keep.release()


def _policy(opt, driver) -> Policy:
    """The numerics policy: given, else by target (a simulator, swapped-in kernels, PTX JIT:
    rounding may legitimately differ)."""
    try:
        pol = policy_of(opt)
    except ValueError:                # option_problem refused it before any replay
        pol = Policy()
    if getattr(driver, "moves_all_memory", False):
        pol.add_reason("a simulator")
    from .replace import effective_specs
    if effective_specs(opt):
        pol.add_reason("a swapped-in kernel: --replace or CUDASNAP_REPLACE")
    if getattr(opt, "jit", None) == "ptx":
        pol.add_reason("kernels JIT-compiled from PTX: --jit ptx")
    return pol


def _dtype_specs(opt):
    specs = ([opt.dtype] if opt.dtype else []) + list(getattr(opt, "dtype_for", None) or [])
    try:
        return parse_dtype_specs(specs)
    except ValueError:
        return []


def _group_client():
    from .group import client     # imported when a call links another process (group replay)
    return client()


class Replayer:
    """Reads a snapshot and replays it; about 470 lines: the per-call loop's concerns meet here.
    The state handlers and profilers share lives in one ReplayContext (self.ctx, replay/context.py); the Replayer drives the run and composes its
    parts: the pass over the records (Prescan, prescan.py), the batches the C executor runs
    (BatchRunner, batchrun.py), the events (EventBus, eventbus.py), the profiler range
    (ProfilerRange, profrange.py), the driver's start (driverinit.py) and the give-back
    (release.py). What stays here is the per-call loop, where recorded threads, the watchdog,
    the selection, the pace and the summary meet."""

    def __init__(self, snapshot_path, options: Optional[ReplayOptions] = None, driver=None, out=None):
        self.path = os.fspath(snapshot_path)
        opt = options or ReplayOptions()
        self.ctx = ReplayContext(opt, ReplayResult(), _policy(opt, driver))
        self.view = ReplayView(self)                  # what subscribers see of this replay (view.py)
        self.events = EventBus(self.ctx, self.view, (_StopVerify, _Abort, ReplayError))   # eventbus.py
        self.subscribers: List[Any] = self.events.subscribers     # on_event(kind, event): see events.py
        self.emit = self.events.emit
        hooks = self.ctx.hooks
        hooks.ensure_init = self.ensure_init
        self.prange = ProfilerRange(self.ctx, self._guard)    # --profiler-range (profrange.py)
        hooks.profiler_control = self.prange.control
        hooks.before_launch = self.events.before_launch
        hooks.after_launch = self.events.after_launch
        hooks.stop_verify = self._stop_verify
        hooks.group_client = _group_client
        self._driver = driver
        self.out = out if out is not None else sys.stdout
        self.thread = RecordedThread(self.ctx)
        self.ranges: List[Tuple[int, int]] = []
        self.regions: List[Tuple[int, int]] = []     # capture placement zones ("region" records)
        self.initialized = False
        self.watchdog: Optional[Watchdog] = None
        self.selection = None                         # LaunchSelection (replay/selection.py)
        self._stale = None                            # StaleResults of a partial selection
        self._held: List[Dict[str, Any]] = []          # calls that free memory, held for a subscriber (release_held)
        self.empty_selection: Optional[str] = None    # why the selection selects nothing
        self._threads = RecordedThreads(lambda rec: self._one(rec, threaded=True))    # --threads
        self._closed = False                          # close() gave the driver state back
        # the architecture check, run on this replay's records after its pass over them and before
        # any driver work: reader -> None, or why nothing may run here (the entry points set it)
        self.preflight: Optional[Callable[[Any], Optional[str]]] = None
        self.refused: Optional[str] = None

    @property
    def _pr(self) -> bool:
        """--profiler-range workload (the profiler range's, profrange.py)."""
        return self.prange.on

    @_pr.setter
    def _pr(self, on: bool) -> None:
        self.prange.on = on

    @property
    def _workload_last(self) -> Optional[int]:
        return self.prange.last

    def _stop_verify(self, m: Mismatch) -> None:
        raise _StopVerify(m)

    def _start_prefetch(self) -> None:
        """Read, verify and decompress the blobs of synchronous H2D copies ahead, on a thread,
        while the driver loads and the calls before them replay."""
        if self._h2d_order and os.environ.get("CUDASNAP_PREFETCH", "1") != "0":
            big = [b for b in self._h2d_order if self.ctx.reader.has_blob(b) and self.ctx.reader.blob_size(b) >= PREFETCH_MIN]
            if big:
                self.ctx.prefetch = BlobPipeline(self.ctx.reader, big)     # the same reader: no second open

    def release_held(self) -> None:
        """Run the calls that free memory a subscriber held (graph mode in a job profiles its
        sequence after the replay's last call, from memory the program had freed by then)."""
        held, self._held = self._held, []
        if held:
            self.ctx.note(f"{len(held)} call(s) that free memory (call #{held[0].get('s')} first) waited for the "
                          f"profile taken at the replay's end")
        for rec in held:
            h = dispatch.lookup(rec.get("f") or "")
            try:
                if h is not None:
                    h.fn(self.ctx, rec)
            except Exception as e:
                self.ctx.note(f"call #{rec.get('s')} {rec.get('f')} (held for graph mode): {e}")

    def close(self) -> Dict[str, int]:
        """Give back what this replay holds in the driver and in the process, so that another
        replay in the same process places its memory at the recorded addresses again: device
        memory and its reserved ranges, pinned host memory mapped at recorded addresses, the
        contexts (created ones destroyed, primary ones reset) and the live functions cached per
        process, texture and surface objects. The driver stays initialized. Call after run();
        returns what was released."""
        ctx = self.ctx
        if self._closed or not self.initialized or ctx.cu is None or ctx.dev is None:
            return {}
        self._closed = True
        from .release import release
        return release(ctx)

    # ------------------------------------------------------------------ setup
    def _load_driver(self):
        if self._driver is not None:
            return self._driver
        try:
            from cuda.bindings import driver as cu  # type: ignore
        except Exception as e:  # ImportError, or a broken install
            raise ReplayError(f"cuda-python is not available ({type(e).__name__}: {e}); "
                              f"install it with: pip install cuda-python")
        return cu

    def _fast_eligible(self) -> bool:
        """Compile a plan of batches?  Not when every call needs its handler: --sync-after-launch,
        --threads, --calls/--kernels, or a driver object other than cuda-bindings (tests).
        Subscribers are asked at run time (batches then replay call by call)."""
        o = self.ctx.opt
        if self._driver is not None or o.sync_after_launch or o.threads \
                or (self.selection is not None and not self.selection.everything):
            return False
        return os.environ.get("CUDASNAP_FASTPATH", "1") != "0"

    def _prescan(self) -> None:
        """The one pass over the records (prescan.py); its findings, where the loop reads them."""
        ps = self.scan = Prescan(self.ctx, self._fast_eligible(), self.prange.on)
        ps.run()
        self.total, self.incomplete, self.malformed = ps.total, ps.incomplete, ps.malformed
        self.ranges, self.regions, self.index = ps.ranges, ps.regions, ps.index
        self._plan, self._t_origin, self._planner, self._slots = ps.plan, ps.t_origin, ps.planner, ps.slots
        self._h2d_order, self._host_ranges, self._ipc_shared = ps.h2d_order, ps.host_ranges, ps.ipc_shared
        self._unhandled, self._expected = ps.unhandled, ps.expected
        if ps.workload_last is not None:
            self.prange.last = ps.workload_last
        self._plan_fast, self._pace_on = ps.fast, ps.pace
        self._pace_base = 0.0
        self._pace_start: Optional[float] = None

    def ensure_init(self, rec=None) -> None:
        """cuInit + placement; idempotent (a snapshot may lack cuInit)."""
        if self.initialized:
            return
        self.initialized = True
        if _tracked is not None:
            _tracked.append(self)
        t0 = time.monotonic()
        try:
            init_driver(self.ctx, self.ranges, self.regions, self._ipc_shared)
        finally:
            self.ctx.res.init_s = round(time.monotonic() - t0, 4)

    # ------------------------------------------------------------------ main loop
    def _read_and_plan(self) -> None:
        """The snapshot opened and its one pass made (prescan.py), with the options the pass
        reads checked; no driver work (plan_ahead runs only this)."""
        try:
            t_open = time.monotonic()
            self.ctx.reader = opened(self.path)      # checked once by preflight, read once
        except SnapshotError as e:
            raise ReplayError(str(e))
        self.ctx.types = TypeOracle(self.ctx.reader, _dtype_specs(self.ctx.opt))
        self.ctx.res.truncated = bool(self.ctx.reader.truncated)
        self.ctx.res.startup_s["open"] = round(time.monotonic() - t_open, 4)
        from .selection import LaunchSelection
        try:
            self.selection = LaunchSelection.of(self.ctx.opt, self.ctx.func_names)
        except ValueError as e:
            raise ReplayError(str(e))
        pr = getattr(self.ctx.opt, "profiler_range", None) or "recorded"
        if pr not in PROFILER_RANGES:
            raise ReplayError(f"--profiler-range must be one of {', '.join(PROFILER_RANGES)}")
        self.prange.on = pr == "workload"
        pace = getattr(self.ctx.opt, "pace", None) or "fast"
        if pace not in PACES:
            raise ReplayError(f"--pace must be one of {', '.join(PACES)}")
        self.ctx.res.pace = pace
        self.ctx.res.profiler = {"range": pr, "starts": 0, "stops": 0}
        gc_on = gc.isenabled()
        gc.disable()            # the prescan builds 100k+ records that live on: no cycles to find
        t_scan = time.monotonic()
        try:
            self._prescan()
        finally:
            if gc_on:
                gc.enable()
        startup = self.ctx.res.startup_s
        startup["prescan"] = round(time.monotonic() - t_scan, 4)
        self.ctx.types.reader = self.ctx.reader      # the kernels' PTX types: from the index, not the file
        self.ctx.res.phases.update({"count.alloc_bytes": self.scan.alloc_bytes,
                                    "count.h2d_bytes": self.scan.h2d_bytes})

    def run(self) -> ReplayResult:
        t0 = time.monotonic()
        self.ctx.mismatch_text = []
        try:
            self._read_and_plan()
            if self.preflight is not None and self._driver is None:
                t_pre = time.monotonic()
                why = self.preflight(self.ctx.reader)
                # the architecture check: the GPU's compute capability (cuInit in a new process)
                self.ctx.res.startup_s["preflight"] = round(time.monotonic() - t_pre, 4)
                if why:
                    self.refused = why
                    raise ReplayError(why)
            self.ctx.res.total_calls = self.total
            self.selection.prepare(self.view)
            why = self.selection.nothing(self.view)
            if why:                        # before any driver work
                self.empty_selection = why
                raise ReplayError(why)
            if self._unhandled and not self.ctx.opt.continue_on_error:
                raise ReplayError(self.scan.unhandled_text())
            if not self.selection.everything:
                from .selection import StaleResults
                self._stale = StaleResults(lambda: self.ctx.space, lambda rec: self.ctx.blob(rec, "srcHost"))
                self.ctx.hooks.stale = self._stale.stale
            self._start_prefetch()
            startup = self.ctx.res.startup_s
            if self._host_ranges:          # before the driver maps anything there
                hostplace.reserve(self._host_ranges)
            t_drv = time.monotonic()
            self.ctx.cu = self._load_driver()
            startup["driver_load"] = round(time.monotonic() - t_drv, 4)
            if self.ctx.opt.watchdog:
                self.watchdog = Watchdog(self.ctx.opt.watchdog)
            if self.subscribers:
                from .events import RunEvent
                t_sub = time.monotonic()
                self.emit("start", RunEvent(self.view, self.path))
                startup["profiler_start"] = round(time.monotonic() - t_sub, 4)
            self._loop()
            if self.prange.state == 1:
                self.prange.stop(None)
            if self.incomplete:
                inc = self.incomplete[0]
                self.ctx.res.stopped_at = inc.get("s")
                self.ctx.note(f"call #{inc.get('s')} {inc.get('f')} never returned in the recording "
                          f"(the program died in it); replay stopped there")
            if self.malformed:
                bad = self.malformed[0]
                self.ctx.note(f"{len(self.malformed)} call record(s) malformed (a function name, arguments, extras "
                              f"or thread of the wrong type), "
                              f"first call #{bad.get('s')} {bad.get('f')}: skipped; what follows may diverge")
            if self.ctx.res.truncated:
                self.ctx.note(f"snapshot is truncated ({self.ctx.reader.lost_bytes} bytes lost): replayed up to the last "
                          f"complete call #{self.ctx.res.last_seq}")
            t_end = time.perf_counter()
            self._finish_sync()
            from .endstate import check_window
            check_window(self)           # a window's recorded end state against this device's memory
            self.ctx.res.phases["end_state"] = round(time.perf_counter() - t_end, 4)
        except (_StopVerify, _Abort):
            pass
        except ReplayError as e:
            self.ctx.res.errors.append(str(e))
        finally:
            if self.subscribers:
                from .events import EndEvent
                t_end = time.perf_counter()
                try:
                    self.emit("end", EndEvent(self.ctx.res, self.view))
                except Exception as e:  # a stop raised by a subscriber at the very end
                    self.ctx.res.errors.append(str(e))
                self.ctx.res.phases["profile_end"] = round(time.perf_counter() - t_end, 4)
            if self.ctx.space is not None:
                self.ctx.res.placed, self.ctx.res.fell_back = self.ctx.space.placed, self.ctx.space.fell_back
                self.ctx.res.host_relocated = self.ctx.space.host_relocated
                self.ctx.res.fallbacks = [r.to_dict() for r in self.ctx.space.relocations if not r.host]
            self.ctx.res.elapsed_s = time.monotonic() - t0
            self._threads.stop()
            if self.ctx.prefetch is not None:
                self.ctx.prefetch.stop()
        r = self.ctx.res
        if r.unreadable_payloads and not r.errors and not r.mismatches:
            # a result that could not be read was not verified: never report success
            r.errors.append(f"damaged snapshot: {len(r.unreadable_payloads)} payload(s) unreadable, "
                            f"first {r.unreadable_payloads[0]}")
        cu_sample = getattr(self.ctx.cu, "sample", None)
        if isinstance(cu_sample, dict):
            # a simulator sampled a launch (replay/sim/bounded.py): its account stands whether or not
            # a result was read back after it (the end state is not judged after a sample)
            if r.sample is None:
                r.sample = {"checked": 0, "read": 0, "unjudged": 0}
            r.sample.update(cu_sample)
        if r.sample is not None and not r.sample["checked"] and not r.errors and not r.mismatches:
            # a bounded verdict that judged nothing must not pass
            why = (f"no result read back was written by the {r.sample['ctas']:,} sampled CTAs of {r.sample['kernel']} "
                   f"(or a later launch came between)" if r.sample["read"] else
                   f"no result was read back after the {r.sample['ctas']:,} sampled CTAs of {r.sample['kernel']} ran")
            fix = ("raise --sim-max-ctas" + (" or CUDASNAP_SIM_SAMPLE_MB" if r.sample.get("unread") else "")
                   if r.sample["read"] else "replay without --sim-max-ctas")
            r.errors.append(f"bounded verdict: {why}: nothing was judged; {fix}")
        r.exit_code = 2 if r.errors else (1 if r.mismatches else 0)
        pol = self.ctx.tol
        # results the C executor verified are EXACT: the counts are completed here
        r.numerics.update(tolerance=pol.tol.describe(), line=pol.line(), reasons=list(pol.reasons),
                          exact=r.d2h_verified - r.numerics.get("close", 0) - r.numerics.get("different", 0))
        mr = r.numerics.get("max_rel")
        if isinstance(mr, float) and not math.isfinite(mr):     # a zero recorded: JSON has no infinity
            r.numerics["max_rel"] = str(mr)
        return r

    def _finish_sync(self) -> None:
        if self.initialized:
            try:
                cur = self.ctx.cu.cuCtxGetCurrent()
                if result_code(cur[0]) == 0 and handle_int(cur[1]):
                    self._guard("final cuCtxSynchronize", lambda: self.ctx.cu.cuCtxSynchronize())
            except Exception:
                pass

    def _guard(self, desc: str, fn: Callable):
        if self.watchdog is None:
            return fn()
        self.watchdog.arm(desc)
        try:
            return fn()
        finally:
            self.watchdog.disarm()

    def _selected(self, rec) -> bool:
        """The launch selection (replay/selection.py: -k, -s, -c, --kernels, --calls): launches,
        D2H/D2D copies, memsets and graph launches can be left out (copies, memsets and graph
        launches by --calls only); state-building calls always run."""
        sel = self.selection
        if sel is None or sel.everything:
            return True
        f = rec.get("f", "")
        if is_launch(f):
            chosen = sel.rec(rec, self.ctx.kernel_name_of((rec.get("a") or {}).get("f"), rec.get("s")))
        elif selectable(f):
            chosen = sel.calls_only(rec)
        else:
            return True
        # work left out that a stream in capture records is a node of its graph: it runs with the graph
        return chosen or bool(self.ctx.capturing and self._captured(f, rec))

    def _captured(self, f: str, rec) -> bool:
        """Is this call issued to a stream in capture (begun by a replayed call, or joined)?"""
        rec_s = recorded_stream(f, rec.get("a") or {})
        if rec_s in self.ctx.capturing:
            return True
        try:
            live = self.ctx.stream(rec, rec_s)
        except Exception:
            return False
        return self.ctx.stream_capturing(rec_s, live)

    # ------------------------------------------------------------------ profiler range
    def _items(self) -> Iterable[Union[Dict[str, Any], OpBatch]]:
        if self._plan is not None:
            return self._plan
        recs = (r for r in self.ctx.reader.records(("c",)) if not (r.get("incomplete") or "r" not in r or malformed_call(r)))
        if self.ctx.opt.call_order:
            recs = iter(sorted(recs, key=lambda r: r["s"] if type(r.get("s")) is int else -1))
        return self.scan.new_planner(keep=False).stream(recs)

    def _loop(self) -> None:
        prog = None
        auto = self.ctx.opt.progress is None and self.total > 20000 and sys.stderr.isatty()
        if (self.ctx.opt.progress or auto) and not self.ctx.opt.quiet:
            try:
                from rich.console import Console
                from rich.progress import Progress
                prog = Progress(transient=True, console=Console(stderr=True))
                prog.start()
                task = prog.add_task("replaying", total=self.total)
                self.progress_bar = prog        # a profiler's phases go on it (one live display)
            except Exception:
                prog = None
        executor = None
        if self._planner.fast and all(getattr(sub, "batch_ok", False) for sub in self.subscribers):
            from .executor import make_executor
            try:
                executor = make_executor()
            except Exception as e:  # pragma: no cover - defensive
                self.ctx.note(f"C executor unavailable ({type(e).__name__}: {e})")
        # the plan's records stay alive to the end: keep the collector from walking them again and
        # again while the loop allocates (a full collection over 100k+ records costs milliseconds)
        gc.freeze()
        self.ctx.res.loop_start_mono = time.monotonic()
        if self._pace_on:
            self._pace_base = self._pace_start if self._pace_start is not None else self.ctx.res.loop_start_mono
        batches = BatchRunner(self.ctx, executor, self._slots, one=self._one, error=self._error,
                              ensure_init=self.ensure_init, emit=self.emit, subscribers=self.subscribers,
                              view=self.view, watchdog=self.watchdog, prange=self.prange,
                              pace_wait=self._pace_wait if self._pace_on else None,
                              pace_base=self._pace_base if self._pace_on else 0.0, thread=self.thread)
        try:
            for item in self._items():
                if type(item) is OpBatch:
                    batches.run(item)
                    if prog is not None:
                        prog.advance(task, item.n)
                    continue
                if self._pace_on:
                    self._pace_wait(item)
                if self.ctx.opt.threads:
                    self._threads.run(item)
                else:
                    self._one(item)
                self.prange.after(item.get("s"))     # the last workload call may have been left out
                if prog is not None:
                    prog.advance(task)
        finally:
            self.ctx.res.loop_end_mono = time.monotonic()
            gc.unfreeze()
            if prog is not None:
                self.progress_bar = None
                prog.stop()

    # ------------------------------------------------------------------ pace
    def pace_origin(self) -> Optional[int]:
        """--pace recorded: the recorded time (ns) of the first replayed call, else None."""
        return self._t_origin if self._pace_on else None

    def pace_start_at(self, mono_s: float) -> None:
        """--pace recorded: put the first call at this time.monotonic() value instead of the
        loop's start (group replay: one start for every rank)."""
        self._pace_start = mono_s

    def _pace_wait(self, rec) -> None:
        """--pace recorded: a call starts no earlier than its recorded offset from the first."""
        t0 = rec.get("t0")
        if type(t0) is not int or self._t_origin is None:
            return
        due = self._pace_base + (t0 - self._t_origin) * 1e-9
        d = due - time.monotonic() - PACE_SPIN_S
        if d > 0:
            time.sleep(d)            # wakes tens of us late: the last stretch spins
        while time.monotonic() < due:
            pass

    def _sync_mark(self, seq) -> None:
        """A synchronization returned: [seq, its time] (step boundaries for benchmarks)."""
        s = self.ctx.res.sync_mono
        if len(s) < SYNC_TIMES_MAX:
            s.append([seq, time.monotonic()])

    # ------------------------------------------------------------------ C executor
    def _one(self, rec, threaded: bool = False) -> None:
        f = rec.get("f") or ""
        seq = rec.get("s")
        self.ctx.res.last_seq = seq
        h = dispatch.lookup(f)
        if h is None:
            if is_query(f) or rec.get("r", 0) != 0:     # a query, or a call that failed: no effect
                self.ctx.res.skipped += 1
                return
            self._error(rec, f"unsupported: call #{seq} {f} has no replay handler")
            return
        if rec.get("r", 0) != 0 and not h.errors:
            self.ctx.res.skipped += 1
            return
        if not self._selected(rec):
            self.ctx.res.filtered += 1
            if self._stale is not None:
                self._stale.skipped(rec)
            return
        if not in_class(f, "inits_driver"):
            self.ensure_init(rec)
        self.thread.switch(rec.get("tid"), follow=not threaded)
        cev = None
        self.prange.before(f, seq)
        try:
            if self.watchdog is not None:
                self.watchdog.arm(f"call #{seq} {f}")
            if self.subscribers:
                cev = self.events.before_call(rec)
                if is_release(f) and any(getattr(sub, "holds_releases", False) for sub in self.subscribers):
                    self._held.append(rec)      # run by release_held, after the subscriber's later work
                    self.ctx.res.calls += 1
                    return
            t_call = time.perf_counter()
            h.fn(self.ctx, rec)
            dt = time.perf_counter() - t_call
            if self.subscribers:
                self.events.after_call(rec, cev)
        except (_StopVerify, _Abort):
            raise
        except ReplayError as e:
            self._error(rec, str(e))
            return
        except DriverCallError as e:
            self._error(rec, f"call #{seq} {f}: {e}")
            return
        except Exception as e:  # a handler bug or a bindings surprise: name the call
            self._error(rec, f"call #{seq} {f}: {type(e).__name__}: {e}")
            return
        finally:
            if self.watchdog is not None:
                self.watchdog.disarm()
            self.prange.after(seq)
        self.ctx.res.calls += 1
        if self._stale is not None:
            self._stale.ran(rec)
        fam = h.family
        self.ctx.res.by_family[fam] = self.ctx.res.by_family.get(fam, 0) + 1
        ph = self.ctx.res.phases          # where the loop's time went, by family (profile phase_timings)
        k = "calls." + fam
        ph[k] = ph.get(k, 0.0) + dt
        if is_sync(f):
            self._sync_mark(seq)

    def _error(self, rec, msg: str) -> None:
        self.ctx.res.errors.append(msg)
        if not self.ctx.opt.continue_on_error:
            raise _Abort(msg)


PACES = ("fast", "recorded")


class _StopVerify(Exception):
    def __init__(self, m: Mismatch):
        self.m = m


class _Abort(Exception):
    """An error already recorded in the result; stop replaying."""
