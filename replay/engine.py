"""The replay engine: reads a snapshot in file order and dispatches each call record."""
from __future__ import annotations

import os
import queue
import re
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from cudasnap.formats import SnapshotError, SnapshotReader, cu_result_name

from . import dispatch
from .options import ReplayOptions, ReplayResult
from .placement import AddressSpace, scan_payload
from .verify import Mismatch, Tolerance, compare

CU_STREAM_LEGACY, CU_STREAM_PER_THREAD = 1, 2
ALLOC_PARAMS = {  # base name -> (address out param, size param or callable)
    "cuMemAlloc": ("dptr", "bytesize"),
    "cuMemAllocAsync": ("dptr", "bytesize"),
    "cuMemAllocFromPoolAsync": ("dptr", "bytesize"),
    "cuMemAllocManaged": ("dptr", "bytesize"),
    "cuMemAddressReserve": ("ptr", "size"),
}


def base_name(f: str) -> str:
    return re.sub(r"(_v\d+)?(_pt(sz|ds))?(_v\d+)?$", "", f)


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


class ReplayError(Exception):
    """Replay cannot proceed past this call (exit code 2)."""

    def __init__(self, msg: str, code: int = 2):
        super().__init__(msg)
        self.code = code


from .driverops import DriverCallError, DriverOps, Watchdog, _code, _ival  # noqa: E402


class Replayer:
    def __init__(self, snapshot_path, options: Optional[ReplayOptions] = None, driver=None, out=None):
        self.path = os.fspath(snapshot_path)
        self.opt = options or ReplayOptions()
        self._driver = driver
        self.out = out if out is not None else sys.stdout
        self.res = ReplayResult()
        self.tol = Tolerance(self.opt.rtol, self.opt.atol, self.opt.dtype)
        self.handles: Dict[int, Any] = {}
        self.funcs: Dict[int, Any] = {}               # recorded CUfunction/CUkernel -> live CUfunction
        self.func_names: Dict[int, str] = {}          # recorded function handle -> name
        self.fns: Dict[int, Dict[str, Any]] = {}      # "fn" records by handle
        self.modules: Dict[int, Any] = {}             # recorded module -> live
        self.libraries: Dict[int, Any] = {}           # recorded library -> live
        self.module_of: Dict[int, int] = {}           # recorded function -> recorded module/library
        self.keepalive: List[Any] = []               # host buffers of async copies, until a sync
        self.keepalive_images: List[bytes] = []
        self.vmm_virtual: set = set()                 # program reservations inside our spans
        self.capturing: set = set()                   # recorded streams in capture
        self.cur_ctx: Dict[int, Any] = {}             # recorded tid -> live ctx current on it
        self._last_tid = None
        self.primary_retained = False
        self.space: Optional[AddressSpace] = None
        self.ops: Optional[DriverOps] = None
        self.ranges: List[Tuple[int, int]] = []
        self.regions: List[Tuple[int, int]] = []     # capture placement zones ("region" records)
        self.initialized = False
        self.watchdog: Optional[Watchdog] = None
        self.device_cc: Optional[Tuple[int, int]] = None
        self.recorded_gpus: List[Dict[str, Any]] = []
        self.sel = None
        self.kern_rx = None
        self.cu = None
        self._workers: Dict[int, "queue.Queue"] = {}
        self._mismatch_text: List[str] = []
        self.mismatch_text: List[str] = []
        self.subscribers: List[Any] = []             # objects with on_event(kind, event): see events.py
        self._sub_errors: Dict[Tuple[int, str], int] = {}

    # ------------------------------------------------------------------ helpers for handlers
    def note(self, msg: str) -> None:
        self.res.warnings.append(msg)

    def fail(self, rec, msg: str) -> None:
        raise ReplayError(f"call #{rec.get('s')} {rec.get('f')}: {msg}")

    def drv(self, rec, name: str, *args):
        """Call driver `name`; compare its CUresult with the recorded one.  Returns the output
        values (a single value, a tuple, or () when none), or None when the recorded error
        recurred.  Raises ReplayError on a new error."""
        fn = getattr(self.cu, name, None)
        if fn is None:
            self.fail(rec, f"the driver bindings lack {name}")
        res = fn(*args)
        code = _code(res[0])
        want = rec.get("r", 0) if rec is not None else 0
        if code == 0 and want in (0, None):
            return res[1] if len(res) == 2 else tuple(res[1:])
        if code == want:
            self.res.errors_recurred += 1
            return None
        if want == 0 or want is None:
            hint = ""
            if self.res.payload_stale and not self.opt.relocate_payloads:
                hint = "; device memory holds stale recorded addresses after a fallback (try --relocate-payloads)"
            self.fail(rec, f"replay returned {cu_result_name(code)} (recorded CUDA_SUCCESS){hint}")
        if code == 0:
            self.note(f"call #{rec.get('s')} {rec.get('f')}: recorded {cu_result_name(want)} did not recur")
            return res[1] if len(res) == 2 else tuple(res[1:])
        self.note(f"call #{rec.get('s')} {rec.get('f')}: replay returned {cu_result_name(code)}, "
                  f"recorded {cu_result_name(want)}")
        return None

    def raw(self, name: str, *args):
        """Driver call outside any record; raises DriverCallError."""
        res = getattr(self.cu, name)(*args)
        code = _code(res[0])
        if code != 0:
            raise DriverCallError(name, code)
        return res[1] if len(res) == 2 else tuple(res[1:])

    def set_handle(self, rec_h, live) -> None:
        if isinstance(rec_h, int) and rec_h:
            self.handles[rec_h] = live

    def live(self, rec, rec_h, what: str = "handle"):
        if not rec_h:
            return None
        try:
            return self.handles[rec_h]
        except (KeyError, TypeError):
            self.fail(rec, f"unknown {what} {rec_h:#x} (its creating call was not replayed)"
                      if isinstance(rec_h, int) else f"bad {what} {rec_h!r}")

    def stream(self, rec, rec_s):
        """Live stream for a recorded stream handle (0 = default; per-thread for _ptsz)."""
        cu = self.cu
        f = rec.get("f", "")
        if not rec_s:
            return cu.CUstream(CU_STREAM_PER_THREAD if ("_ptsz" in f or "_ptds" in f) else 0)
        if rec_s in (CU_STREAM_LEGACY, CU_STREAM_PER_THREAD):
            return cu.CUstream(rec_s)
        return self.live(rec, rec_s, "stream")

    def blob(self, rec, key: str) -> Optional[bytes]:
        x = rec.get("x") or {}
        ref = x.get(key)
        if ref is None:  # early snapshots named payloads "src"/"dst"
            ref = x.get({"srcHost": "src", "dstHost": "dst"}.get(key, ""))
        if not isinstance(ref, dict) or not ref.get("blob"):
            return None
        try:
            return self.reader.blob(ref["blob"])
        except SnapshotError as e:
            self.note(f"call #{rec.get('s')}: blob for {key} unreadable: {e}")
            return None

    def tr(self, addr) -> int:
        return self.space.translate(addr) if isinstance(addr, int) else 0

    def h2d_payload(self, rec, data: bytes) -> bytes:
        if self.space is None or not self.space.moved:
            return data
        data, found = scan_payload(data, self.space, self.opt.relocate_payloads)
        if found:
            self.res.payload_stale.append({"seq": rec.get("s"), "call": rec.get("f"), "count": len(found),
                                           "first_offset": found[0][0], "value": hex(found[0][1]),
                                           "rewritten": self.opt.relocate_payloads})
        return data

    def mark_written(self, rec_addr: int, seq, who: str) -> None:
        a = self.space.find(rec_addr) if self.space and isinstance(rec_addr, int) else None
        if a is not None:
            a.last_writer = (seq, who)

    def verify(self, rec, expected: Optional[bytes], got: bytes, src: Optional[int] = None) -> None:
        if expected is None:
            self.res.d2h_unverified += 1
            return
        alloc = self.space.find(src) if (self.space and src) else None
        writer = alloc.last_writer if alloc else None
        m = compare(expected, got, self.tol, seq=rec.get("s", 0), call=rec.get("f", ""), src=src, writer=writer)
        self.res.d2h_verified += 1
        self.res.d2h_bytes += len(expected)
        if m is not None:
            self.res.mismatches.append(m.to_dict())
            self._mismatch_text.append(m.describe())
            if not self.opt.continue_on_error:
                raise _StopVerify(m)

    def kernel_name_of(self, rec_f) -> str:
        if rec_f in self.func_names:
            return self.func_names[rec_f]
        fr = self.fns.get(rec_f)
        return fr["name"] if fr else (f"{rec_f:#x}" if isinstance(rec_f, int) else "?")

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

    def _prescan(self) -> None:
        self.total = 0
        self.last_complete = None
        self.incomplete: List[Dict[str, Any]] = []
        for rec in self.reader.records():
            k = rec.get("k")
            if k == "c":
                if rec.get("incomplete") or "r" not in rec:
                    self.incomplete.append(rec)
                    continue
                self.total += 1
                rng = alloc_range(rec)
                if rng:
                    self.ranges.append(rng)
            elif k == "fn" and isinstance(rec.get("h"), int):
                self.fns[rec["h"]] = rec
                self.func_names.setdefault(rec["h"], rec.get("name") or "")
            elif k == "proc":
                self.recorded_gpus = rec.get("gpus") or []
            elif k == "region" and isinstance(rec.get("base"), int) and isinstance(rec.get("size"), int):
                # capture's placement zone: reserved whole, first, so allocations land inside
                self.regions.append((rec["base"], rec["size"]))

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
                self.primary_retained = True
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
            self._prescan()
            self.res.total_calls = self.total
            try:
                from cudasnap.formats import parse_callset
                self.sel = parse_callset(self.opt.calls) if self.opt.calls else None
            except ValueError as e:
                raise ReplayError(f"--calls: {e}")
            if self.opt.kernels:
                try:
                    self.kern_rx = re.compile(self.opt.kernels)
                except re.error as e:
                    raise ReplayError(f"--kernels: bad regex: {e}")
            self.cu = self._load_driver()
            if self.opt.watchdog:
                self.watchdog = Watchdog(self.opt.watchdog)
            if self.subscribers:
                from .events import RunEvent
                self.emit("start", RunEvent(self, self.path))
            self._loop()
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
        r = self.res
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
        """--calls / --kernels: launches, D2H/D2D copies, memsets and syncs can be left out;
        state-building calls always run."""
        if self.sel is None and self.kern_rx is None:
            return True
        f = rec.get("f", "")
        b = base_name(f)
        filterable = (f.startswith("cuLaunch") and not f.startswith("cuLaunchHostFunc")) or b.startswith("cuGraphLaunch") \
            or (b.startswith("cuMemcpy") and "HtoD" not in b and "HtoA" not in b) or b.startswith("cuMemset")
        if not filterable:
            return True
        if self.sel is not None and not self.sel(rec, self.func_names):
            return False
        if self.kern_rx is not None and f.startswith("cuLaunch"):
            h = (rec.get("a") or {}).get("f")
            return bool(self.kern_rx.search(self.kernel_name_of(h)))
        return True

    def _loop(self) -> None:
        prog = None
        if self.opt.progress and not self.opt.quiet:
            try:
                from rich.progress import Progress
                prog = Progress(transient=True)
                prog.start()
                task = prog.add_task("replaying", total=self.total)
            except Exception:
                prog = None
        try:
            stop_seq = self.incomplete[0].get("s") if self.incomplete else None
            for rec in self.reader.records(("c", "fn")):
                if rec.get("k") == "fn":
                    continue
                if rec.get("incomplete") or "r" not in rec:
                    continue
                if stop_seq is not None and isinstance(rec.get("s"), int) and rec["s"] > stop_seq:
                    # completed after the call the program died in: later in entry order; still replay
                    pass
                if self.opt.threads:
                    self._on_thread(rec)
                else:
                    self._one(rec)
                if prog is not None:
                    prog.advance(task)
        finally:
            if prog is not None:
                prog.stop()

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
        try:
            if self.watchdog is not None:
                self.watchdog.arm(f"call #{seq} {f}")
            if self.subscribers:
                cev = self._before_call_event(rec)
            h.fn(self, rec)
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
        self.res.calls += 1
        fam = h.family
        self.res.by_family[fam] = self.res.by_family.get(fam, 0) + 1

    def _error(self, rec, msg: str) -> None:
        self.res.errors.append(msg)
        if not self.opt.continue_on_error:
            raise _Abort(msg)


class _StopVerify(Exception):
    def __init__(self, m: Mismatch):
        self.m = m


class _Abort(Exception):
    """An error already recorded in the result; stop replaying."""
