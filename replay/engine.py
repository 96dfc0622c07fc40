"""The replay engine: reads a snapshot in file order and dispatches each call record."""
from __future__ import annotations

import os
import queue
import sys
import threading
import time
from array import array
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

from cudasnap.formats import SnapshotError, SnapshotReader, cu_result_name
from cudasnap.formats.abi import base_name

from . import dispatch
from .context import ReplayContext
from .driverops import DriverOps, Watchdog, _code, _ival
from .errors import DriverCallError, ReplayError
from .options import ReplayOptions, ReplayResult
from .placement import AddressSpace
from .staging import H2D_PREFETCHED as _SYNC_H2D, PREFETCH_MIN, BlobPipeline as _BlobPrefetch
from .verify import Mismatch, Tolerance

CU_STREAM_LEGACY, CU_STREAM_PER_THREAD = 1, 2
ALLOC_PARAMS = {  # base name -> (address out param, size param or callable)
    "cuMemAlloc": ("dptr", "bytesize"),
    "cuMemAllocAsync": ("dptr", "bytesize"),
    "cuMemAllocFromPoolAsync": ("dptr", "bytesize"),
    "cuMemAllocManaged": ("dptr", "bytesize"),
    "cuMemAddressReserve": ("ptr", "size"),
}


def alloc_range(rec: Dict[str, Any]) -> Optional[Tuple[int, int]]:
    """(recorded base, size) of a device allocation call, or None."""
    f = rec.get("f") or ""
    a = rec.get("a") or {}
    b = base_name(f)
    if rec.get("r", 0) != 0 or rec.get("incomplete"):
        return None
    if b == "cuMemAllocPitch":
        p, pitch, h = a.get("dptr"), a.get("pPitch"), a.get("Height")
        if isinstance(p, int) and isinstance(pitch, int) and isinstance(h, int):
            return p, pitch * h
        return None
    ent = ALLOC_PARAMS.get(b)
    if ent is None:
        return None
    p, n = a.get(ent[0]), a.get(ent[1])
    if isinstance(p, int) and isinstance(n, int) and p:
        return p, n
    return None




def _shared(name: str, attr: Optional[str] = None) -> property:
    """A Replayer attribute that is the handlers' context's field (one object, two names)."""
    attr = attr or name
    return property(lambda self: getattr(self.ctx, attr), lambda self, v: setattr(self.ctx, attr, v),
                    doc=f"ReplayContext.{attr}")


def _delegate(name: str, attr: Optional[str] = None):
    attr = attr or name

    def method(self, *args, **kw):
        return getattr(self.ctx, attr)(*args, **kw)
    method.__name__ = name
    method.__doc__ = f"ReplayContext.{attr}"
    return method


class Replayer:
    """Reads a snapshot and replays it. Handlers see only its ReplayContext (self.ctx,
    replay/context.py); the state they share with the engine is the context's, under the
    same names here."""

    def __init__(self, snapshot_path, options: Optional[ReplayOptions] = None, driver=None, out=None):
        self.path = os.fspath(snapshot_path)
        opt = options or ReplayOptions()
        self.ctx = ReplayContext(opt, ReplayResult(), Tolerance(opt.rtol, opt.atol, opt.dtype))
        hooks = self.ctx.hooks
        hooks.ensure_init = self.ensure_init
        hooks.profiler_control = self.profiler_control
        hooks.before_launch = self.before_launch
        hooks.after_launch = self.after_launch
        hooks.stop_verify = self._stop_verify
        self._driver = driver
        self.out = out if out is not None else sys.stdout
        self._last_tid = None
        self.ranges: List[Tuple[int, int]] = []
        self.regions: List[Tuple[int, int]] = []     # capture placement zones ("region" records)
        self.initialized = False
        self.watchdog: Optional[Watchdog] = None
        self.selection = None                         # LaunchSelection (replay/selection.py)
        self._pr = False                              # --profiler-range workload
        self._pr_state = 0                            # 0 before the range, 1 inside, 2 after
        self._workload_last: Optional[int] = None     # seq of the last workload call (profiler range)
        self._workers: Dict[int, "queue.Queue"] = {}
        self.mismatch_text: List[str] = []
        self.subscribers: List[Any] = []             # objects with on_event(kind, event): see events.py
        self._sub_errors: Dict[Tuple[int, str], int] = {}

    # the context's state, under the engine's names
    cu, dev, device_cc, ops, space, reader = (_shared(n) for n in ("cu", "dev", "device_cc", "ops", "space", "reader"))
    opt, res, tol, handles = (_shared(n) for n in ("opt", "res", "tol", "handles"))
    funcs, func_names, fns, fn_versions, func_from, module_of, ctx_ids = (
        _shared(n) for n in ("funcs", "func_names", "fns", "fn_versions", "func_from", "module_of", "ctx_ids"))
    keepalive, keepalive_images, vmm_virtual, capturing, cur_ctx = (
        _shared(n) for n in ("keepalive", "keepalive_images", "vmm_virtual", "capturing", "cur_ctx"))
    cond_handles, cond_bodies = _shared("cond_handles"), _shared("cond_bodies")
    _mismatch_text, _prefetch = _shared("_mismatch_text", "mismatch_text"), _shared("_prefetch", "prefetch")

    @property
    def modules(self) -> Dict[int, Any]:
        return self.ctx.modules

    @property
    def libraries(self) -> Dict[int, Any]:
        return self.ctx.libraries

    # ------------------------------------------------------------------ helpers (the context's)
    note, fail, drv, raw = _delegate("note"), _delegate("fail"), _delegate("drv"), _delegate("raw")
    _new_error_text = _delegate("_new_error_text", "new_error_text")
    set_handle, live, stream, tr = _delegate("set_handle"), _delegate("live"), _delegate("stream"), _delegate("tr")
    blob, blob_chunks, h2d_payload = _delegate("blob"), _delegate("blob_chunks"), _delegate("h2d_payload")
    mark_written, verify = _delegate("mark_written"), _delegate("verify")
    _add_fn, fn_record, kernel_name_of = _delegate("_add_fn", "add_fn"), _delegate("fn_record"), _delegate("kernel_name_of")

    def _stop_verify(self, m: Mismatch) -> None:
        raise _StopVerify(m)

    def _start_prefetch(self) -> None:
        """Read, verify and decompress the blobs of synchronous H2D copies ahead, on a thread,
        while the driver loads and the calls before them replay."""
        if self._h2d_order and os.environ.get("CUDASNAP_PREFETCH", "1") != "0":
            big = [b for b in self._h2d_order if self.reader.has_blob(b) and self.reader.blob_size(b) >= PREFETCH_MIN]
            if big:
                self._prefetch = _BlobPrefetch(self.path, big)

    # ------------------------------------------------------------------ events (replay/events.py)
    def emit(self, kind: str, ev) -> None:
        """Tell every subscriber; an exception in one is reported and replay goes on."""
        for sub in self.subscribers:
            if kind in ("before_call", "after_call") and not getattr(sub, "wants_calls", False):
                continue
            try:
                sub.on_event(kind, ev)
            except (_StopVerify, _Abort, ReplayError):
                raise
            except Exception as e:
                key = (id(sub), kind)
                n = self._sub_errors[key] = self._sub_errors.get(key, 0) + 1
                if n <= 3:
                    who = getattr(sub, "label", None) or type(sub).__name__
                    seq = getattr(ev, "seq", None)
                    self.note(f"{who}: {kind}{f' (call #{seq})' if seq is not None else ''} raised "
                              f"{type(e).__name__}: {e}; replay continues")

    def before_launch(self, rec, fn, params: bytes, name: str, cfg=None):
        """Launch handlers call this just before the driver launch; returns the event (or None)."""
        if not self.subscribers:
            return None
        from .events import make_launch_event
        ev = make_launch_event(self, rec, fn, params, name, cfg)
        self.emit("before_launch", ev)
        if ev.ctx.timing_requested:
            ev.ctx._record(0)
        return ev

    def after_launch(self, ev) -> None:
        if ev is None:
            return
        if ev.ctx.timing_requested:
            ev.ctx._record(1)
        self.emit("after_launch", ev)

    def _before_call_event(self, rec):
        """before_call, before_copy (returns the copy event) and teardown events."""
        from .events import CallEvent, classify, copy_event
        c = classify(rec.get("f") or "")
        self.emit("before_call", CallEvent(rec.get("s"), rec.get("f"), rec, self))
        if c == "copy":
            ev = copy_event(self, rec)
            self.emit("before_copy", ev)
            return ev
        if c == "teardown":
            self.emit("teardown", CallEvent(rec.get("s"), rec.get("f"), rec, self))
        return None

    def _after_call_event(self, rec, cev) -> None:
        from .events import CallEvent, classify
        c = classify(rec.get("f") or "")
        if c == "copy" and cev is not None:
            self.emit("copy", cev)
        elif c == "sync":
            self.emit("sync", CallEvent(rec.get("s"), rec.get("f"), rec, self))
        self.emit("after_call", CallEvent(rec.get("s"), rec.get("f"), rec, self))

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
        """May plain launches run as native batches?  Not when anything needs per-launch
        Python work: subscribers (hooks, profilers, NVTX), --sync-after-launch, --threads,
        --calls/--kernels, or a driver object other than cuda-bindings (tests)."""
        o = self.opt
        if self._driver is not None or self.subscribers or o.sync_after_launch or o.threads \
                or (self.selection is not None and not self.selection.everything):
            return False
        return os.environ.get("CUDASNAP_FASTPATH", "1") != "0"

    def _prescan(self) -> None:
        self.total = 0
        self.incomplete: List[Dict[str, Any]] = []
        planner = _Planner(self._fast_eligible())
        self._h2d_order: List[str] = []
        self._planner = planner
        max_seq = -1          # the highest call sequence number read so far, in file order
        for rec in self.reader.records():
            k = rec.get("k")
            if k == "c":
                if rec.get("incomplete") or "r" not in rec:
                    self.incomplete.append(rec)
                    continue
                self.total += 1
                if type(rec.get("s")) is int and rec["s"] > max_seq:
                    max_seq = rec["s"]
                if self._pr and rec.get("r") == 0 and is_workload(rec.get("f") or "") and type(rec.get("s")) is int:
                    self._workload_last = rec["s"]
                rng = alloc_range(rec)
                if rng:
                    self.ranges.append(rng)
                if planner.keeping:
                    planner.add(rec)
                if rec.get("f", "").startswith("cuDevicePrimaryCtxRetain") and rec.get("r") == 0:
                    # a context made current before its retain is the primary one
                    h = (rec.get("a") or {}).get("pctx")
                    if isinstance(h, int) and h:
                        self.ctx_ids.setdefault(h, {"h": h, "device": (rec.get("a") or {}).get("dev")})["primary"] = True
                if rec.get("f") in _SYNC_H2D and len(self._h2d_order) < 4096:
                    ref = (rec.get("x") or {}).get("srcHost")
                    if isinstance(ref, dict) and isinstance(ref.get("blob"), str) and rec.get("r", 0) == 0:
                        self._h2d_order.append(ref["blob"])
            elif k == "fn" and isinstance(rec.get("h"), int):
                self._add_fn(rec, max_seq)
            elif k == "repair" and (rec.get("lost_bytes") or rec.get("lost_records") or rec.get("unknown_gaps")):
                self.note(f"snapshot was repaired: {rec.get('lost_bytes', 0)} damaged bytes dropped "
                          f"({rec.get('lost_records', 0)} records known lost); calls may be missing from it")
            elif k == "ctx" and isinstance(rec.get("h"), int):
                self.ctx_ids.setdefault(rec["h"], dict(rec))
            elif k == "region" and isinstance(rec.get("base"), int) and isinstance(rec.get("size"), int):
                # capture's placement zone: reserved whole, first, so allocations land inside
                self.regions.append((rec["base"], rec["size"]))
        # the records, decoded once: the main loop replays from this plan (None when the
        # snapshot is too big to keep: the loop reads the file again)
        self._plan = planner.finish() if planner.keeping else None

    def ensure_init(self, rec=None) -> None:
        """cuInit + placement; idempotent (a snapshot may lack cuInit)."""
        if self.initialized:
            return
        self.initialized = True
        try:
            r = self.cu.cuInit(0)
        except Exception as e:  # the bindings could not load libcuda.so.1
            raise ReplayError(f"no CUDA driver: cannot load libcuda.so.1 ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''})")
        if _code(r[0]) != 0:
            raise ReplayError(f"cuInit failed: {cu_result_name(_code(r[0]))} (no usable GPU or driver?)")
        try:
            cnt = self.raw("cuDeviceGetCount")
        except DriverCallError as e:
            raise ReplayError(f"cannot count devices: {e}")
        if not (0 <= self.opt.device < int(cnt)):
            raise ReplayError(f"--device {self.opt.device}: only {int(cnt)} device(s) present")
        self.dev = self.raw("cuDeviceGet", self.opt.device)
        try:
            mj = self.raw("cuDeviceGetAttribute", self.cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.dev)
            mn = self.raw("cuDeviceGetAttribute", self.cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.dev)
            self.device_cc = (int(mj), int(mn))
        except Exception:
            self.device_cc = None
        self.ops = DriverOps(self.cu, self.opt.device)
        try:
            gran = self.ops.granularity()
        except Exception:
            gran = 2 << 20
        self.space = AddressSpace(self.ops, gran)
        self.space.plan(self.ranges, self.regions)
        self.space.reserve_all()
        if self.space.spans and all(s.refused for s in self.space.spans):
            # some drivers want a context for reservations: retain the primary one and retry
            try:
                ctx = self.raw("cuDevicePrimaryCtxRetain", self.dev)
                self.raw("cuCtxSetCurrent", ctx)
                self.space.reserve_all()
                self.raw("cuCtxSetCurrent", self.cu.CUcontext(0))
            except DriverCallError as e:
                self.note(f"placement: could not reserve with a context either: {e}")

    # ------------------------------------------------------------------ main loop
    def run(self) -> ReplayResult:
        t0 = time.monotonic()
        self._mismatch_text: List[str] = []
        try:
            try:
                self.reader = SnapshotReader(self.path)
            except SnapshotError as e:
                raise ReplayError(str(e))
            self.res.truncated = bool(self.reader.truncated)
            from .selection import LaunchSelection
            try:
                self.selection = LaunchSelection.of(self.opt, self.func_names)
            except ValueError as e:
                raise ReplayError(str(e))
            pr = getattr(self.opt, "profiler_range", None) or "recorded"
            if pr not in PROFILER_RANGES:
                raise ReplayError(f"--profiler-range must be one of {', '.join(PROFILER_RANGES)}")
            self._pr = pr == "workload"
            self.res.profiler = {"range": pr, "starts": 0, "stops": 0}
            self._prescan()
            self.res.total_calls = self.total
            self.selection.prepare(self)
            self._start_prefetch()
            self.cu = self._load_driver()
            if self.opt.watchdog:
                self.watchdog = Watchdog(self.opt.watchdog)
            if self.subscribers:
                from .events import RunEvent
                self.emit("start", RunEvent(self, self.path))
            self._loop()
            if self._pr_state == 1:
                self._profiler_stop(None)
            if self.incomplete:
                inc = self.incomplete[0]
                self.res.stopped_at = inc.get("s")
                self.note(f"call #{inc.get('s')} {inc.get('f')} never returned in the recording "
                          f"(the program died in it); replay stopped there")
            if self.res.truncated:
                self.note(f"snapshot is truncated ({self.reader.lost_bytes} bytes lost): replayed up to the last "
                          f"complete call #{self.res.last_seq}")
            self._finish_sync()
        except (_StopVerify, _Abort):
            pass
        except ReplayError as e:
            self.res.errors.append(str(e))
        finally:
            if self.subscribers:
                from .events import EndEvent
                try:
                    self.emit("end", EndEvent(self.res, self))
                except Exception as e:  # a stop raised by a subscriber at the very end
                    self.res.errors.append(str(e))
            if self.space is not None:
                self.res.placed, self.res.fell_back = self.space.placed, self.space.fell_back
                self.res.host_relocated = self.space.host_relocated
                self.res.fallbacks = [r.to_dict() for r in self.space.relocations if not r.host]
            self.res.elapsed_s = time.monotonic() - t0
            if self._workers:
                for q in self._workers.values():
                    q.put(None)
            if self._prefetch is not None:
                self._prefetch.stop()
        r = self.res
        if r.unreadable_payloads and not r.errors and not r.mismatches:
            # a result that could not be read was not verified: never report success
            r.errors.append(f"damaged snapshot: {len(r.unreadable_payloads)} payload(s) unreadable, "
                            f"first {r.unreadable_payloads[0]}")
        r.exit_code = 2 if r.errors else (1 if r.mismatches else 0)
        self.mismatch_text = self._mismatch_text
        return r

    def _finish_sync(self) -> None:
        if self.initialized:
            try:
                cur = self.cu.cuCtxGetCurrent()
                if _code(cur[0]) == 0 and _ival(cur[1]):
                    self._guard("final cuCtxSynchronize", lambda: self.cu.cuCtxSynchronize())
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
        if f.startswith("cuLaunch") and not f.startswith("cuLaunchHostFunc"):
            return sel.rec(rec, self.kernel_name_of((rec.get("a") or {}).get("f"), rec.get("s")))
        b = base_name(f)
        if b.startswith("cuGraphLaunch") or (b.startswith("cuMemcpy") and "HtoD" not in b and "HtoA" not in b) \
                or b.startswith("cuMemset"):
            return sel.calls_only(rec)
        return True

    # ------------------------------------------------------------------ profiler range
    def profiler_control(self, rec) -> None:
        """A recorded cuProfilerStart/Stop: called on replay, so a profiler collecting from
        them (nsys --capture-range=cudaProfilerApi, ncu --profile-from-start off) sees the
        range the program asked for; ignored under --profiler-range workload."""
        f = base_name(rec.get("f") or "")
        p = self.res.profiler
        if f not in ("cuProfilerStart", "cuProfilerStop"):
            return                                     # cuProfilerInitialize: deprecated, no effect
        if self._pr:
            p["ignored"] = p.get("ignored", 0) + 1
            return
        self._profiler_call(f, rec.get("s"))

    def _profiler_call(self, name: str, seq) -> bool:
        p = self.res.profiler
        try:
            code = _code(getattr(self.cu, name)()[0])
        except Exception as e:                          # bindings without it: say so, go on
            self.note(f"{name}: {type(e).__name__}: {e}")
            return False
        if code != 0:
            self.note(f"{name}{f' (call #{seq})' if seq is not None else ''}: replay returned {cu_result_name(code)}")
            return False
        key = "starts" if name == "cuProfilerStart" else "stops"
        p[key] += 1
        edge = "first_seq" if key == "starts" else "last_seq"
        if seq is not None and (edge not in p or key == "stops"):
            p[edge] = seq
        return True

    def _profiler_start(self, seq) -> None:
        """--profiler-range workload: cuProfilerStart right before the first workload call."""
        self._pr_state = 1
        self._profiler_call("cuProfilerStart", seq)

    def _profiler_stop(self, seq) -> None:
        """--profiler-range workload: after the last workload call, once its work is done."""
        self._pr_state = 2
        try:
            self._guard("cuCtxSynchronize before cuProfilerStop", lambda: self.cu.cuCtxSynchronize())
        except Exception:
            pass
        self._profiler_call("cuProfilerStop", seq)

    def _items(self) -> Iterable[Union[Dict[str, Any], "_Batch"]]:
        if self._plan is not None:
            return self._plan
        return _Planner(self._planner.fast, keep=False).stream(
            r for r in self.reader.records(("c",)) if not (r.get("incomplete") or "r" not in r))

    def _loop(self) -> None:
        prog = None
        auto = self.opt.progress is None and self.total > 20000 and sys.stderr.isatty()
        if (self.opt.progress or auto) and not self.opt.quiet:
            try:
                from rich.console import Console
                from rich.progress import Progress
                prog = Progress(transient=True, console=Console(stderr=True))
                prog.start()
                task = prog.add_task("replaying", total=self.total)
            except Exception:
                prog = None
        self._launcher = None
        if self._planner.fast:
            from .fastlaunch import make_launcher
            try:
                self._launcher = make_launcher(self.cu)
            except Exception as e:  # pragma: no cover - defensive
                self.note(f"launch fast path unavailable ({type(e).__name__}: {e})")
        self.fast_launches = 0
        try:
            for item in self._items():
                if type(item) is _Batch:
                    self._run_batch(item)
                    if prog is not None:
                        prog.advance(task, item.nrec)
                    continue
                if self.opt.threads:
                    self._on_thread(item)
                else:
                    self._one(item)
                if self._pr_state == 1 and isinstance(item.get("s"), int) and item["s"] >= (self._workload_last or 0):
                    self._profiler_stop(item["s"])     # the last workload call was left out
                if prog is not None:
                    prog.advance(task)
        finally:
            if prog is not None:
                prog.stop()

    # ------------------------------------------------------------------ launch fast path
    def _run_batch(self, b: "_Batch") -> None:
        """Replay a run of plain launches (and skipped queries between them) in file order:
        one native call when nothing needs per-launch Python work, else call by call."""
        if self._launcher is None or self.capturing or b.n == 0:
            self._batch_slow(b, 0)
            return
        self.ensure_init()
        tid = b.tid
        if tid != self._last_tid and self._last_tid is not None and tid in self.cur_ctx:
            try:
                self.raw("cuCtxSetCurrent", self.cur_ctx[tid])
            except DriverCallError:
                pass
        self._last_tid = tid
        try:
            live, nchg = self._batch_live(b)
            prepared = self._launcher.prepare(live)
        except (_StopVerify, _Abort):
            raise
        except Exception:
            # a launch would fail before reaching the driver (unknown function, bad stream...):
            # replay the batch call by call, so the error lands on the same launch
            self._batch_slow(b, 0)
            return
        if self._pr and self._pr_state == 0:
            self._profiler_start(b.seqs[0])
        try:
            self._run_prepared(b, prepared, nchg)
        finally:
            if self._pr_state == 1 and b.last_seq is not None and b.last_seq >= (self._workload_last or 0):
                self._profiler_stop(b.last_seq)

    def _run_prepared(self, b: "_Batch", prepared, nchg) -> None:
        res = self.res
        start, n = 0, b.n
        fam = _LAUNCH_FAMILY
        while start < n:
            if self.watchdog is not None:
                self.watchdog.arm(_BatchDesc(self._launcher, b, start))
            try:
                done, code, t_first, t_last = self._launcher.run(prepared, b.idx, start, n)
            finally:
                if self.watchdog is not None:
                    self.watchdog.disarm()
            end = start + done
            if done:
                res.launches += done
                res.calls += done
                res.by_family[fam] = res.by_family.get(fam, 0) + done
                self.fast_launches += done
                if res.first_launch_mono is None:
                    res.first_launch_mono = t_first
                    res.first_launch_unix = time.time() - (time.monotonic() - t_first)
                res.last_launch_mono = t_last
                if nchg is not None:
                    res.params_relocated += sum(nchg[b.idx[i]] for i in range(start, end))
            self._batch_mark_written(b, start, min(end + 1, n))
            if end >= n:
                break
            # launch `end` failed: reported as the slow path's drv() would
            res.last_seq = b.seqs[end]
            rec = b.rec(end)
            self._error(rec, f"call #{b.seqs[end]} {rec['f']}: {self._new_error_text(code)}")
            start = end + 1
        res.skipped += b.skips
        res.last_seq = b.last_seq

    def _batch_slow(self, b: "_Batch", start: int) -> None:
        for i in range(start, b.n):
            self._one(b.rec(i))
        self.res.skipped += b.skips
        if b.n:
            self.res.last_seq = b.last_seq

    def _batch_live(self, b: "_Batch"):
        """Per descriptor: (live function, grid, block, shmem, live stream, params as launched),
        and per descriptor the relocated-parameter count (None when nothing moved)."""
        from .handlers.graph import patch_conditional_handles
        from .handlers.module import resolve_function
        from .placement import relocate_params
        moved = self.space is not None and self.space.moved
        cond = bool(getattr(self, "cond_handles", None))
        fns: Dict[int, int] = {}
        streams: Dict[Tuple[str, Any], int] = {}
        live = []
        nchg = [] if moved else None
        for j, d in enumerate(b.descs):
            f, h, gx, gy, gz, bx, by, bz, shm, hs, params = d
            fn = fns.get(h)
            if fn is None:
                rec = b.rec(b.first_pos[j])
                fn = fns[h] = int(resolve_function(self.ctx, rec, h))
            sk = (f, hs)
            st = streams.get(sk)
            if st is None:
                rec = b.rec(b.first_pos[j])
                st = streams[sk] = int(self.stream(rec, hs))
            if moved or cond:
                layout = (self.fn_record(h, b.seqs[b.first_pos[j]]) or {}).get("params")
                if moved:
                    params, changes = relocate_params(params, layout, self.space)
                    nchg.append(len(changes))
                if cond:
                    params = patch_conditional_handles(self.ctx, b.rec(b.first_pos[j]), params, layout)
            live.append((fn, (gx, gy, gz), (bx, by, bz), shm, st, params))
        return live, nchg

    def _batch_mark_written(self, b: "_Batch", start: int, end: int) -> None:
        """What launches [start, end) wrote, as the slow path marks it: every allocation an
        8-byte parameter word points into, last writer wins."""
        if self.space is None or not b.any_words:
            return
        words = b.words
        if start == 0 and end == b.n:
            last = b.last_pos
        else:
            last = {}
            for i in range(start, end):
                j = b.idx[i]
                if words[j]:
                    last[j] = i
        for j, i in sorted(last.items(), key=lambda kv: kv[1]):
            name = self.kernel_name_of(b.descs[j][1])
            seq = b.seqs[i]
            for v in words[j]:
                self.mark_written(v, seq, name)

    def _on_thread(self, rec) -> None:
        """--threads: each recorded thread replays on its own thread; one call at a time, in
        file order (a global turnstile)."""
        tid = rec.get("tid", 0)
        q = self._workers.get(tid)
        if q is None:
            q = queue.Queue()
            self._workers[tid] = q
            threading.Thread(target=self._worker, args=(q,), daemon=True, name=f"replay-tid-{tid}").start()
        done = threading.Event()
        box: List[BaseException] = []
        q.put((rec, done, box))
        done.wait()
        if box:
            raise box[0]

    def _worker(self, q) -> None:
        while True:
            item = q.get()
            if item is None:
                return
            rec, done, box = item
            try:
                self._one(rec, threaded=True)
            except BaseException as e:  # handed to the main thread
                box.append(e)
            finally:
                done.set()

    def _one(self, rec, threaded: bool = False) -> None:
        f = rec.get("f") or ""
        seq = rec.get("s")
        self.res.last_seq = seq
        h = dispatch.lookup(f)
        if h is None:
            if dispatch.is_query(f):
                self.res.skipped += 1
                return
            self._error(rec, f"unsupported: call #{seq} {f} has no replay handler")
            return
        if rec.get("r", 0) != 0 and not h.errors:
            self.res.skipped += 1
            self.res.errors_recurred += 0
            return
        if not self._selected(rec):
            self.res.filtered += 1
            return
        if f != "cuInit":
            self.ensure_init(rec)
        tid = rec.get("tid")
        if not threaded and tid != self._last_tid and self._last_tid is not None and tid in self.cur_ctx:
            try:
                self.raw("cuCtxSetCurrent", self.cur_ctx[tid])
            except DriverCallError:
                pass
        self._last_tid = tid
        cev = None
        if self._pr and self._pr_state == 0 and is_workload(f):
            self._profiler_start(seq)
        try:
            if self.watchdog is not None:
                self.watchdog.arm(f"call #{seq} {f}")
            if self.subscribers:
                cev = self._before_call_event(rec)
            h.fn(self.ctx, rec)
            if self.subscribers:
                self._after_call_event(rec, cev)
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
            if self._pr_state == 1 and isinstance(seq, int) and seq >= (self._workload_last or 0):
                self._profiler_stop(seq)
        self.res.calls += 1
        fam = h.family
        self.res.by_family[fam] = self.res.by_family.get(fam, 0) + 1

    def _error(self, rec, msg: str) -> None:
        self.res.errors.append(msg)
        if not self.opt.continue_on_error:
            raise _Abort(msg)


_LAUNCH_FAMILY = "launch"
PROFILER_RANGES = ("recorded", "workload")


def is_workload(f: str) -> bool:
    """The calls --profiler-range workload brackets: launches (kernels and graphs), copies and
    memsets -- not context, memory or module set-up."""
    if f.startswith("cuLaunch"):
        return not f.startswith("cuLaunchHostFunc")
    return f.startswith(("cuGraphLaunch", "cuMemcpy", "cuMemset"))
_PLAIN_LAUNCHES = ("cuLaunchKernel", "cuLaunchKernel_ptsz")
BATCH_MAX = 16384                 # launches per batch (watchdog and progress granularity)
PLAN_MAX_RECORDS = 200_000        # decoded records kept from the prescan (else the loop re-reads)
PLAN_MAX_DESCS = 2_000_000        # distinct launch descriptors kept
PLAN_MAX_LAUNCHES = 50_000_000


class _Batch:
    """Consecutive plain launches of one recorded thread, and skipped queries among them.
    descs: distinct (f, function, gx, gy, gz, bx, by, bz, shmem, stream, params) tuples;
    idx[i]: the descriptor of launch i; seqs[i]: its call number."""
    __slots__ = ("tid", "descs", "idx", "seqs", "skips", "last_seq", "nrec", "words", "any_words",
                 "first_pos", "last_pos", "_index")

    def __init__(self, tid):
        self.tid = tid
        self.descs: List[tuple] = []
        self.idx = array("I")
        self.seqs = array("q")
        self.skips = 0
        self.last_seq = None
        self.nrec = 0
        self.words: List[tuple] = []
        self.any_words = False
        self.first_pos: List[int] = []
        self.last_pos: Dict[int, int] = {}
        self._index: Optional[Dict[tuple, int]] = {}

    @property
    def n(self) -> int:
        return len(self.idx)

    def add(self, d: tuple, seq: int, words: tuple) -> None:
        j = self._index.get(d)
        i = len(self.idx)
        if j is None:
            j = self._index[d] = len(self.descs)
            self.descs.append(d)
            self.words.append(words)
            self.first_pos.append(i)
            if words:
                self.any_words = True
        if words:
            self.last_pos[j] = i
        self.idx.append(j)
        self.seqs.append(seq)
        self.last_seq = seq
        self.nrec += 1

    def close(self) -> None:
        self._index = None

    def rec(self, i: int) -> Dict[str, Any]:
        """The call record of launch i (what the slow path's handler reads)."""
        f, h, gx, gy, gz, bx, by, bz, shm, hs, params = self.descs[self.idx[i]]
        return {"k": "c", "s": self.seqs[i], "tid": self.tid, "f": f, "r": 0,
                "a": {"f": h, "gridDimX": gx, "gridDimY": gy, "gridDimZ": gz, "blockDimX": bx,
                      "blockDimY": by, "blockDimZ": bz, "sharedMemBytes": shm, "hStream": hs},
                "x": {"params": params}}


class _BatchDesc:
    """The watchdog's description of a running batch: names the launch in progress."""

    def __init__(self, launcher, b: "_Batch", start: int):
        self.launcher, self.b, self.start = launcher, b, start

    def __str__(self) -> str:
        b = self.b
        try:
            i = min(self.start + max(0, self.launcher.current()), b.n - 1)
        except Exception:
            i = self.start
        return f"call #{b.seqs[i]} {b.descs[b.idx[i]][0]}"

    __format__ = lambda self, spec: format(str(self), spec)  # noqa: E731


def _param_words(params: bytes) -> tuple:
    """8-byte words of a parameter buffer that may be device addresses (launch._prepare's rule)."""
    return tuple(v for v in (int.from_bytes(params[o:o + 8], "little") for o in range(0, len(params) - 7, 8))
                 if v >= 0x10000)


class _Planner:
    """Turns complete call records, in file order, into the replay plan: records to dispatch
    one by one, and _Batch runs of plain launches (when `fast`).  keep=True collects the plan
    (within the PLAN_MAX_* bounds; past them `keeping` turns False and the plan is dropped)."""

    def __init__(self, fast: bool, keep: bool = True):
        self.fast = fast
        self.keeping = keep
        self.items: List[Any] = []
        self.cur: Optional[_Batch] = None
        self.nrecs = self.ndescs = self.nlaunches = 0
        self._words: Dict[bytes, tuple] = {}
        self._disp: Dict[str, Any] = {}

    def _kind(self, f: str) -> int:
        """1: plain launch handler, 2: skipped query, 0: anything else."""
        k = self._disp.get(f)
        if k is None:
            h = dispatch.lookup(f)
            if h is None:
                k = 2 if dispatch.is_query(f) else 0
            else:
                from .handlers.launch import launch_kernel
                k = 1 if (h.fn is launch_kernel and f in _PLAIN_LAUNCHES) else 0
            self._disp[f] = k
        return k

    def _plain(self, rec) -> Optional[tuple]:
        a = rec.get("a")
        x = rec.get("x")
        if rec.get("r", 0) != 0 or type(a) is not dict or type(x) is not dict:
            return None
        params = x.get("params")
        h = a.get("f")
        if type(params) is not bytes or type(h) is not int or not h:
            return None
        g = a.get
        d = (rec["f"], h, g("gridDimX", 1), g("gridDimY", 1), g("gridDimZ", 1), g("blockDimX", 1),
             g("blockDimY", 1), g("blockDimZ", 1), g("sharedMemBytes", 0), g("hStream"), params)
        for v in d[2:9]:
            if type(v) is not int or not (0 <= v < (1 << 32)):
                return None
        hs = d[9]
        if hs is not None and type(hs) is not int:
            return None
        return d

    def _step(self, rec) -> Iterator[Any]:
        """Feed one record; yields finished items."""
        f = rec.get("f") or ""
        k = self._kind(f) if self.fast else 0
        if k == 1:
            d = self._plain(rec)
            tid = rec.get("tid")
            if d is not None and type(rec.get("s")) is int:
                b = self.cur
                if b is not None and (b.tid != tid or b.n >= BATCH_MAX):
                    b.close()
                    yield b
                    b = None
                if b is None:
                    b = self.cur = _Batch(tid)
                w = self._words.get(d[10])
                if w is None:
                    w = self._words[d[10]] = _param_words(d[10])
                before = len(b.descs)
                b.add(d, rec["s"], w)
                self.ndescs += len(b.descs) - before
                self.nlaunches += 1
                return
        elif k == 2 and self.cur is not None:
            # a query between launches: skipped by the slow path too; keeps the batch going
            self.cur.skips += 1
            self.cur.nrec += 1
            if isinstance(rec.get("s"), int):
                self.cur.last_seq = rec["s"]
            return
        if self.cur is not None:
            self.cur.close()
            yield self.cur
            self.cur = None
        self.nrecs += 1
        yield rec

    def add(self, rec) -> None:
        for item in self._step(rec):
            self.items.append(item)
        if self.nrecs > PLAN_MAX_RECORDS or self.ndescs > PLAN_MAX_DESCS or self.nlaunches > PLAN_MAX_LAUNCHES:
            self.keeping = False
            self.items = []
            self.cur = None
            self._words = {}

    def finish(self) -> List[Any]:
        if self.cur is not None:
            self.cur.close()
            self.items.append(self.cur)
            self.cur = None
        self._words = {}
        return self.items

    def stream(self, recs: Iterable[Dict[str, Any]]) -> Iterator[Any]:
        for rec in recs:
            yield from self._step(rec)
            if len(self._words) > 100_000:
                self._words = {}
        if self.cur is not None:
            self.cur.close()
            yield self.cur
            self.cur = None


class _StopVerify(Exception):
    def __init__(self, m: Mismatch):
        self.m = m


class _Abort(Exception):
    """An error already recorded in the result; stop replaying."""
