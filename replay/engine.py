"""The replay engine (Replayer): reads a snapshot, prescans it (handles, placement, selection),
loads the driver, then replays its call records in file order: runs of plain calls are planned
into batches the C executor runs (plan.py, executor.c), the rest dispatched one by one to the
handlers (dispatch.py); D2H results are verified as they come. Profilers and hooks subscribe to
its events (events.py)."""
from __future__ import annotations

import gc
import math
import os
import queue
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

from cudasnap.formats import SnapshotError, cu_result_name
from cudasnap.formats.opened import opened
from cudasnap.formats.abi import base_name
from cudasnap.formats.container import record_list
from cudasnap.formats.layout import recorded_stream
from cudasnap.formats.callset import asked_by_name, is_module_load, names_function
from cudasnap.formats.vocab import (alloc_range, in_class, is_launch, is_query, is_release, is_sync, is_workload,
                                    makes_address_range, malformed_call, family)

from . import dispatch, plan
from .batchrun import D2H_AHEAD_EACH, D2H_AHEAD_TOTAL, SYNC_TIMES_MAX, BatchRunner
from .index import IndexedReader, ReplayIndex
from .context import ReplayContext
from .driverops import DriverOps, Watchdog, result_code, handle_int
from .errors import DriverCallError, ReplayError
from .options import ReplayOptions, ReplayResult
from . import hostplace
from .placement import AddressSpace
from .plan import OpBatch, Planner, Ranges, SlotMap, Slots
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
    replay that initialized the driver, for close_replays."""
    global _tracked
    if _tracked is None:
        _tracked = []


def close_replays() -> Dict[str, int]:
    """Replayer.close() on every tracked replay since the last call; the counts, summed."""
    out: Dict[str, int] = {}
    while _tracked:
        for k, v in _tracked.pop().close().items():
            out[k] = out.get(k, 0) + v
    return out


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


class Replayer(BatchRunner):
    """Reads a snapshot and replays it. The state handlers, the batch runner and profile/
    share lives in one ReplayContext (self.ctx, replay/context.py) and is named only there;
    the Replayer drives the run. Runs of plain calls go to the C executor (batchrun.py).
    About 700 lines because the per-call loop's concerns meet here and nowhere else: recorded
    threads, the watchdog, the profiler range, call events for profilers, partial selections
    and the summary; handlers, placement, staging and the plan live in their own modules."""

    def __init__(self, snapshot_path, options: Optional[ReplayOptions] = None, driver=None, out=None):
        self.path = os.fspath(snapshot_path)
        opt = options or ReplayOptions()
        self.ctx = ReplayContext(opt, ReplayResult(), _policy(opt, driver))
        self.view = ReplayView(self)                  # what subscribers see of this replay (view.py)
        hooks = self.ctx.hooks
        hooks.ensure_init = self.ensure_init
        hooks.profiler_control = self.profiler_control
        hooks.before_launch = self.before_launch
        hooks.after_launch = self.after_launch
        hooks.stop_verify = self._stop_verify
        hooks.group_client = _group_client
        self._driver = driver
        self.out = out if out is not None else sys.stdout
        self._last_tid = None
        self.ranges: List[Tuple[int, int]] = []
        self.regions: List[Tuple[int, int]] = []     # capture placement zones ("region" records)
        self.initialized = False
        self.watchdog: Optional[Watchdog] = None
        self.selection = None                         # LaunchSelection (replay/selection.py)
        self._stale = None                            # StaleResults of a partial selection
        self._held: List[Dict[str, Any]] = []          # calls that free memory, held for a subscriber (release_held)
        self.empty_selection: Optional[str] = None    # why the selection selects nothing
        self._pr = False                              # --profiler-range workload
        self._pr_state = 0                            # 0 before the range, 1 inside, 2 after
        self._workload_last: Optional[int] = None     # seq of the last workload call (profiler range)
        self._workers: Dict[int, "queue.Queue"] = {}
        self.subscribers: List[Any] = []             # objects with on_event(kind, event): see events.py
        self._sub_errors: Dict[Tuple[int, str], int] = {}
        self._closed = False                          # close() gave the driver state back
        # the architecture check, run on this replay's records after its pass over them and before
        # any driver work: reader -> None, or why nothing may run here (the entry points set it)
        self.preflight: Optional[Callable[[Any], Optional[str]]] = None
        self.refused: Optional[str] = None

    def _stop_verify(self, m: Mismatch) -> None:
        raise _StopVerify(m)

    def _start_prefetch(self) -> None:
        """Read, verify and decompress the blobs of synchronous H2D copies ahead, on a thread,
        while the driver loads and the calls before them replay."""
        if self._h2d_order and os.environ.get("CUDASNAP_PREFETCH", "1") != "0":
            big = [b for b in self._h2d_order if self.ctx.reader.has_blob(b) and self.ctx.reader.blob_size(b) >= PREFETCH_MIN]
            if big:
                self.ctx.prefetch = BlobPipeline(self.ctx.reader, big)     # the same reader: no second open

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
                    self.ctx.note(f"{who}: {kind}{f' (call #{seq})' if seq is not None else ''} raised "
                              f"{type(e).__name__}: {e}; replay continues")

    def before_launch(self, rec, fn, params: bytes, name: str, cfg=None):
        """Launch handlers call this just before the driver launch; returns the event (or None)."""
        if not self.subscribers:
            return None
        from .events import make_launch_event
        ev = make_launch_event(self.view, rec, fn, params, name, cfg)
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
        out: Dict[str, int] = {}
        ctx = self.ctx
        if self._closed or not self.initialized or ctx.cu is None or ctx.dev is None:
            return out
        self._closed = True
        cu = ctx.cu
        try:
            cu.cuCtxSynchronize()
        except Exception:
            pass
        sp = ctx.space
        for p in sorted(ctx.host_placed):
            a = sp.find(p) if sp is not None else None
            try:
                hostplace.release(ctx, p, a.size if a is not None else 1)
            except Exception:
                pass
        out["host"] = len(ctx.host_placed)
        ctx.host_placed.clear()
        # texture and surface objects still alive: kernels take their recorded values, which the
        # next replay's objects can have only once these are gone (one destroyed already fails)
        out["texture_objects"] = 0
        for destroy, obj in reversed(ctx.tex_objects):
            try:
                if result_code(getattr(cu, destroy)(obj)[0]) == 0:
                    out["texture_objects"] += 1
            except Exception:
                pass
        ctx.tex_objects.clear()
        hostplace.release_reservations()
        if sp is not None:
            out.update(sp.release_all())
        devs = {handle_int(ctx.dev): ctx.dev, **{handle_int(d): d for d in ctx.devlive.values()}}
        primaries = {}
        for k, d in devs.items():
            try:
                r = cu.cuDevicePrimaryCtxGetState(d)
                if result_code(r[0]) == 0 and r[2]:
                    primaries[k] = handle_int(ctx.raw("cuDevicePrimaryCtxRetain", d))
                    cu.cuDevicePrimaryCtxRelease(d)
            except Exception:
                pass
        made = {handle_int(c): c for c in ctx.handles.contexts.values() if handle_int(c)}
        out["contexts"] = 0
        for k, c in made.items():
            if k not in primaries.values():
                try:
                    if result_code(cu.cuCtxDestroy(c)[0]) == 0:
                        out["contexts"] += 1
                except Exception:
                    pass
        for k in primaries:
            try:
                if result_code(cu.cuDevicePrimaryCtxReset(devs[k])[0]) == 0:
                    out["contexts"] += 1
            except Exception:
                pass
        try:
            cu.cuCtxSetCurrent(cu.CUcontext(0))
        except Exception:
            pass
        from .functions import forget_live
        forget_live()
        return out

    def _before_call_event(self, rec):
        """before_call, before_copy (returns the copy event) and teardown events."""
        from .events import CallEvent, classify, copy_event
        c = classify(rec.get("f") or "")
        self.emit("before_call", CallEvent(rec.get("s"), rec.get("f"), rec, self.view))
        if c == "copy":
            ev = copy_event(self.view, rec)
            self.emit("before_copy", ev)
            return ev
        if c == "graph_launch":
            ev = CallEvent(rec.get("s"), rec.get("f"), rec, self.view)
            self.emit("before_graph_launch", ev)
            return ev
        if c == "teardown":
            self.emit("teardown", CallEvent(rec.get("s"), rec.get("f"), rec, self.view))
        return None

    def _after_call_event(self, rec, cev) -> None:
        from .events import CallEvent, classify
        c = classify(rec.get("f") or "")
        if c == "copy" and cev is not None:
            self.emit("copy", cev)
        elif c == "graph_launch" and cev is not None:
            self.emit("graph_launch", cev)
        elif c == "sync":
            self.emit("sync", CallEvent(rec.get("s"), rec.get("f"), rec, self.view))
        self.emit("after_call", CallEvent(rec.get("s"), rec.get("f"), rec, self.view))

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
        self.total = 0
        self.incomplete: List[Dict[str, Any]] = []
        self.malformed: List[Dict[str, Any]] = []          # call records skipped (vocab.malformed_call)
        self._plan_fast = self._fast_eligible()
        self._pace_on = getattr(self.ctx.opt, "pace", "fast") == "recorded"
        self._pace_base = 0.0
        self._pace_start: Optional[float] = None
        self._host_ranges: List[Tuple[int, int]] = []     # recorded pinned host memory (hostplace)
        self._ipc_shared: List[int] = []                   # addresses shared through legacy IPC
        self._unhandled: Dict[str, List[int]] = {}          # ABI name -> [calls, first seq]: no replay handler
        from .executor import module
        mod = module()
        self._slots = Slots(mod.ffi if mod is not None else None)
        self._expected: Dict[str, bytes] = {}
        self._expected_bytes = 0
        self._ranges = Ranges()
        hs = self.ctx.handles          # handlers store live handles there: the slots follow
        hs._all = SlotMap(self._slots, "h", hs._all)
        self.ctx.funcs = SlotMap(self._slots, "f", self.ctx.funcs)
        self._fk: Dict[str, int] = {}
        # in call order the loop sorts the records itself: nothing is compiled in file order
        planner = self._new_planner(keep=False) if self.ctx.opt.call_order else self._new_planner(native=True)
        index = self.index = ReplayIndex()       # every other reader of the records reads this pass
        self._h2d_order: List[str] = []
        self._planner = planner
        max_seq = -1          # the highest call sequence number read so far, in file order
        fkind = self._fkind
        take = getattr(planner, "take", None)     # the C walk's call count and highest seq

        def one(rec) -> None:
            nonlocal max_seq
            if take is not None:
                n, mx, wl = take()
                self.total += n
                index.planned += n
                if mx is not None and mx > max_seq:
                    max_seq = mx
                if wl is not None:
                    self._workload_last = wl
            k = rec.get("k")
            if k == "c":
                if rec.get("incomplete") or "r" not in rec:
                    self.incomplete.append(rec)
                    index.keep(rec)
                    return
                if malformed_call(rec):
                    self.malformed.append(rec)
                    index.keep(rec)
                    return
                self.total += 1
                sq = rec.get("s")
                if type(sq) is int and sq > max_seq:
                    max_seq = sq
                if self._pr and rec.get("r") == 0 and is_workload(rec.get("f") or "") and type(sq) is int:
                    self._workload_last = sq
                fk = fkind(rec.get("f", ""))
                rng = alloc_range(rec) if fk & 1 else None
                if rng:
                    self.ranges.append(rng)
                    self._ranges.add(*rng)
                if planner.keeping:
                    planner.add(rec)
                    index.planned += 1
                if not fk:
                    return
                if fk & 64:
                    asked = asked_by_name(rec)
                    if asked is not None and isinstance(asked[0], int):
                        self.ctx.names_in.setdefault(asked[0], set()).add(asked[1])
                if fk & 128 and rec.get("r") == 0 and type(sq) is int:
                    self.ctx.code_loads.append(rec)              # functions.hoist_loads
                if fk & 448:
                    index.code.append(rec)                       # retarget.module_loads
                if fk & 32 and rec.get("r") == 0:
                    u = self._unhandled.get(rec["f"])
                    if u is None:
                        self._unhandled[rec["f"]] = [1, sq]
                    else:
                        u[0] += 1
                if fk & 2 and rec.get("r") == 0:
                    # a context made current before its retain is the primary one
                    h = (rec.get("a") or {}).get("pctx")
                    if isinstance(h, int) and h:
                        self.ctx.ctx_ids.setdefault(h, {"h": h, "device": (rec.get("a") or {}).get("dev")})["primary"] = True
                if fk & 8 and rec.get("r") == 0:
                    self._host_ranges.append(hostplace.recorded_range(rec))    # reserved before the driver loads
                if fk & 16 and isinstance((rec.get("a") or {}).get("dptr"), int):
                    self._ipc_shared.append(rec["a"]["dptr"])       # shared through legacy IPC
                if fk & 4 and len(self._h2d_order) < 4096:
                    ref = (rec.get("x") or {}).get("srcHost")
                    if isinstance(ref, dict) and isinstance(ref.get("blob"), str) and rec.get("r", 0) == 0:
                        self._h2d_order.append(ref["blob"])
                return
            if k != "b":               # blob records: the reader's own (the C walk passes over them)
                index.keep(rec)
            if k == "fn" and isinstance(rec.get("h"), int):
                self.ctx.add_fn(rec, max_seq)
            elif k == "repair" and (rec.get("lost_bytes") or rec.get("lost_records") or rec.get("unknown_gaps")):
                self.ctx.note(f"snapshot was repaired: {rec.get('lost_bytes', 0)} damaged bytes dropped "
                          f"({rec.get('lost_records', 0)} records known lost); calls may be missing from it")
            elif k == "ctx" and isinstance(rec.get("h"), int):
                self.ctx.ctx_ids.setdefault(rec["h"], dict(rec))
            elif k == "note" and str(rec.get("msg") or "").startswith("limitation:"):
                # what capture could not see (kernels reading host-visible memory directly):
                # the replay's verdict holds only for what was recorded
                self.ctx.note(f"capture: {rec['msg']}")

            elif k == "region" and isinstance(rec.get("base"), int) and isinstance(rec.get("size"), int):
                # capture's placement zone: reserved whole, first, so allocations land inside
                self.regions.append((rec["base"], rec["size"]))

        walk = getattr(planner, "walk", None)
        path = self.ctx.reader.path
        for off, count, payload, recs, checked in self.ctx.reader.record_payloads():
            if recs is None and walk is not None and planner.keeping and walk(payload, count, off, checked, one):
                continue
            for rec in (record_list(payload, count, path, off) if recs is None else recs):
                one(rec)
        if take is not None:
            n, _, wl = take()
            self.total += n
            index.planned += n
            if wl is not None:
                self._workload_last = wl
        # the records, decoded once: the main loop replays from this plan (None when the
        # snapshot is too big to keep: the loop reads the file again)
        self._plan = planner.finish() if planner.keeping else None
        self._t_origin = planner.t_origin
        index.attach_plan(self._plan)
        self.ctx.reader = IndexedReader(self.ctx.reader, index, self._expected)

    def _unhandled_text(self) -> str:
        """The calls no handler replays, all named before any driver work (a replay would stop
        at the first; --continue-on-error replays the rest and reports each)."""
        parts = [f"{f} ({n} call{'s' if n > 1 else ''}, first #{first})"
                 for f, (n, first) in sorted(self._unhandled.items(), key=lambda kv: kv[1][1] if isinstance(kv[1][1], int) else 0)]
        return ("unsupported: the snapshot holds calls replay does not handle: " + ", ".join(parts[:6])
                + (f" and {len(parts) - 6} more" if len(parts) > 6 else "")
                + "; nothing was replayed (--continue-on-error replays the rest and reports each)")

    def _fkind(self, f) -> int:
        """Per name: 1 allocation, 2 primary context retain, 4 H2D prefetched, 8 pinned host
        memory, 16 shared through legacy IPC, 32 no replay handler, 64 names a kernel of a module
        or library (functions.preload_functions), 128 loads a module or library
        (functions.hoist_loads), 256 refers to code (the index's code_records). Non-zero: the pre-scan reads the call itself, so the C plan walk
        hands it over."""
        if type(f) is not str:
            return 0                   # a damaged record: its handler reports it
        fk = self._fk.get(f)
        if fk is None:
            fk = ((1 if makes_address_range(f) else 0)
                  | (2 if f.startswith("cuDevicePrimaryCtxRetain") else 0)
                  | (4 if in_class(f, "h2d_copy") else 0)    # its blob read ahead (staging.py)
                  | (8 if in_class(f, "pins_host") else 0)
                  | (16 if f.startswith("cuIpcGetMemHandle") else 0)
                  | (32 if dispatch.unhandled(f) else 0)
                  | (64 if names_function(f) else 0)
                  | (128 if is_module_load(f) else 0)
                  | (256 if in_class(f, "refers_code") else 0))
            self._fk[f] = fk
        return fk

    def _expected_blob(self, bid: str) -> Optional[bytes]:
        """The plan's blob prefetch for verification points: the expected bytes of a small D2H
        copy, read while compiling (None: too big, over the budget, or unreadable -- its call
        then takes the handler, which reads and reports as before)."""
        got = self._expected.get(bid)
        if got is not None:
            return got
        r = self.ctx.reader
        try:
            n = r.blob_size(bid)
            if n > D2H_AHEAD_EACH or self._expected_bytes + n > D2H_AHEAD_TOTAL:
                return None
            got = r.blob(bid)
        except Exception:
            return None
        self._expected[bid] = got
        self._expected_bytes += n
        return got

    def ensure_init(self, rec=None) -> None:
        """cuInit + placement; idempotent (a snapshot may lack cuInit)."""
        if self.initialized:
            return
        self.initialized = True
        if _tracked is not None:
            _tracked.append(self)
        t0 = time.monotonic()
        try:
            self._init_driver()
        finally:
            self.ctx.res.init_s = round(time.monotonic() - t0, 4)

    def _init_driver(self) -> None:
        try:
            r = self.ctx.cu.cuInit(0)
        except Exception as e:  # the bindings could not load libcuda.so.1
            raise ReplayError(f"no CUDA driver: cannot load libcuda.so.1 ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''})")
        if result_code(r[0]) != 0:
            raise ReplayError(f"cuInit failed: {cu_result_name(result_code(r[0]))} (no usable GPU or driver?)")
        try:
            cnt = self.ctx.raw("cuDeviceGetCount")
        except DriverCallError as e:
            raise ReplayError(f"cannot count devices: {e}")
        if not (0 <= self.ctx.opt.device < int(cnt)):
            raise ReplayError(f"--device {self.ctx.opt.device}: only {int(cnt)} device(s) present")
        self.ctx.dev = self.ctx.raw("cuDeviceGet", self.ctx.opt.device)
        try:
            mj = self.ctx.raw("cuDeviceGetAttribute", self.ctx.cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.ctx.dev)
            mn = self.ctx.raw("cuDeviceGetAttribute", self.ctx.cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.ctx.dev)
            self.ctx.device_cc = (int(mj), int(mn))
        except Exception:
            self.ctx.device_cc = None
        self.ctx.ops = DriverOps(self.ctx.cu, self.ctx.opt.device)
        try:
            gran = self.ctx.ops.granularity()
        except Exception:
            gran = 2 << 20
        self.ctx.space = AddressSpace(self.ctx.ops, gran)
        self.ctx.space.shared = {b for b, n in self.ranges if any(b <= d < b + max(n, 1) for d in self._ipc_shared)}
        self.ctx.space.plan(self.ranges, self.regions)
        self.ctx.space.reserve_all()
        if self.ctx.space.spans and all(s.refused for s in self.ctx.space.spans):
            # some drivers want a context for reservations: retain the primary one and retry
            try:
                ctx = self.ctx.raw("cuDevicePrimaryCtxRetain", self.ctx.dev)
                self.ctx.raw("cuCtxSetCurrent", ctx)
                self.ctx.space.reserve_all()
                self.ctx.raw("cuCtxSetCurrent", self.ctx.cu.CUcontext(0))
            except DriverCallError as e:
                self.ctx.note(f"placement: could not reserve with a context either: {e}")

    # ------------------------------------------------------------------ main loop
    def run(self) -> ReplayResult:
        t0 = time.monotonic()
        self.ctx.mismatch_text = []
        try:
            try:
                self.ctx.reader = opened(self.path)      # checked once by preflight, read once
            except SnapshotError as e:
                raise ReplayError(str(e))
            self.ctx.types = TypeOracle(self.ctx.reader, _dtype_specs(self.ctx.opt))
            self.ctx.res.truncated = bool(self.ctx.reader.truncated)
            from .selection import LaunchSelection
            try:
                self.selection = LaunchSelection.of(self.ctx.opt, self.ctx.func_names)
            except ValueError as e:
                raise ReplayError(str(e))
            pr = getattr(self.ctx.opt, "profiler_range", None) or "recorded"
            if pr not in PROFILER_RANGES:
                raise ReplayError(f"--profiler-range must be one of {', '.join(PROFILER_RANGES)}")
            self._pr = pr == "workload"
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
            if self.preflight is not None and self._driver is None:
                why = self.preflight(self.ctx.reader)
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
                raise ReplayError(self._unhandled_text())
            if not self.selection.everything:
                from .selection import StaleResults
                self._stale = StaleResults(lambda: self.ctx.space, lambda rec: self.ctx.blob(rec, "srcHost"))
                self.ctx.hooks.stale = self._stale.stale
            self._start_prefetch()
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
            if self._pr_state == 1:
                self._profiler_stop(None)
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
            self._finish_sync()
            from .endstate import check_window
            check_window(self)           # a window's recorded end state against this device's memory
        except (_StopVerify, _Abort):
            pass
        except ReplayError as e:
            self.ctx.res.errors.append(str(e))
        finally:
            if self.subscribers:
                from .events import EndEvent
                try:
                    self.emit("end", EndEvent(self.ctx.res, self.view))
                except Exception as e:  # a stop raised by a subscriber at the very end
                    self.ctx.res.errors.append(str(e))
            if self.ctx.space is not None:
                self.ctx.res.placed, self.ctx.res.fell_back = self.ctx.space.placed, self.ctx.space.fell_back
                self.ctx.res.host_relocated = self.ctx.space.host_relocated
                self.ctx.res.fallbacks = [r.to_dict() for r in self.ctx.space.relocations if not r.host]
            self.ctx.res.elapsed_s = time.monotonic() - t0
            if self._workers:
                for q in self._workers.values():
                    q.put(None)
            if self.ctx.prefetch is not None:
                self.ctx.prefetch.stop()
        r = self.ctx.res
        if r.unreadable_payloads and not r.errors and not r.mismatches:
            # a result that could not be read was not verified: never report success
            r.errors.append(f"damaged snapshot: {len(r.unreadable_payloads)} payload(s) unreadable, "
                            f"first {r.unreadable_payloads[0]}")
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
        else:
            b = base_name(f)
            if b.startswith("cuGraphLaunch") or (b.startswith("cuMemcpy") and "HtoD" not in b and "HtoA" not in b) \
                    or b.startswith("cuMemset"):
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
    def profiler_control(self, rec) -> None:
        """A recorded cuProfilerStart/Stop: called on replay, so a profiler collecting from
        them (nsys --capture-range=cudaProfilerApi, ncu --profile-from-start off) sees the
        range the program asked for; ignored under --profiler-range workload."""
        f = base_name(rec.get("f") or "")
        p = self.ctx.res.profiler
        if family(f) != "profiler" or f == "cuProfilerInitialize":
            return                                     # cuProfilerInitialize: deprecated, no effect
        if self._pr:
            p["ignored"] = p.get("ignored", 0) + 1
            return
        self._profiler_call(f, rec.get("s"))

    def _profiler_call(self, name: str, seq) -> bool:
        p = self.ctx.res.profiler
        try:
            code = result_code(getattr(self.ctx.cu, name)()[0])
        except Exception as e:                          # bindings without it: say so, go on
            self.ctx.note(f"{name}: {type(e).__name__}: {e}")
            return False
        if code != 0:
            self.ctx.note(f"{name}{f' (call #{seq})' if seq is not None else ''}: replay returned {cu_result_name(code)}")
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
            self._guard("cuCtxSynchronize before cuProfilerStop", lambda: self.ctx.cu.cuCtxSynchronize())
        except Exception:
            pass
        self._profiler_call("cuProfilerStop", seq)

    def _items(self) -> Iterable[Union[Dict[str, Any], OpBatch]]:
        if self._plan is not None:
            return self._plan
        recs = (r for r in self.ctx.reader.records(("c",)) if not (r.get("incomplete") or "r" not in r or malformed_call(r)))
        if self.ctx.opt.call_order:
            recs = iter(sorted(recs, key=lambda r: r["s"] if type(r.get("s")) is int else -1))
        return self._new_planner(keep=False).stream(recs)

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
        self._executor = None
        self._moved_key, self._moved = None, []
        if self._planner.fast and all(getattr(sub, "batch_ok", False) for sub in self.subscribers):
            from .executor import make_executor
            try:
                self._executor = make_executor()
            except Exception as e:  # pragma: no cover - defensive
                self.ctx.note(f"C executor unavailable ({type(e).__name__}: {e})")
        # the plan's records stay alive to the end: keep the collector from walking them again and
        # again while the loop allocates (a full collection over 100k+ records costs milliseconds)
        gc.freeze()
        self.ctx.res.loop_start_mono = time.monotonic()
        if self._pace_on:
            self._pace_base = self._pace_start if self._pace_start is not None else self.ctx.res.loop_start_mono
        try:
            for item in self._items():
                if type(item) is OpBatch:
                    self._run_batch(item)
                    if prog is not None:
                        prog.advance(task, item.n)
                    continue
                if self._pace_on:
                    self._pace_wait(item)
                if self.ctx.opt.threads:
                    self._on_thread(item)
                else:
                    self._one(item)
                if self._pr_state == 1 and isinstance(item.get("s"), int) and item["s"] >= (self._workload_last or 0):
                    self._profiler_stop(item["s"])     # the last workload call was left out
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
    def _pr_split(self, b: OpBatch, pos: int):
        """--profiler-range workload: where in b[pos:] the range starts ("start", before the op)
        or stops ("stop", after op at-1), or None."""
        if self._pr_state == 0:
            for i in range(pos, b.n):
                if b.kinds[i] != plan.SKIP and is_workload(b.recs[i]["f"]):
                    return i, "start"
            return None
        last = self._workload_last or 0
        for i in range(pos, b.n):
            if b.kinds[i] != plan.SKIP and b.seq(i) >= last:
                return i + 1, "stop"
        return None

    def _batch_slow(self, b: OpBatch, start: int, end: int) -> None:
        for i in range(start, end):
            rec = b.recs[i]
            if self._pace_on:
                self._pace_wait(rec)
            self._one(rec)
            if self._pr_state == 1 and rec["s"] >= (self._workload_last or 0):
                self._profiler_stop(rec["s"])

    def _new_planner(self, keep: bool = True, native: bool = False) -> Planner:
        """native: compile in C where cudasnap.replay._plan is built (replay/plannative.py)."""
        from .executor import module
        mod = module()
        args = (self._plan_fast, self._slots, self._ranges)
        kw = dict(keep=keep, ffi=mod.ffi if mod is not None else None, pace=self._pace_on, expected=self._expected_blob)
        if native and self._plan_fast:
            from .plannative import NativePlanner, module as plan_module
            rmod = plan_module()
            if rmod is not None:
                return NativePlanner(rmod, self.ctx.reader.path, self._fkind, is_workload if self._pr else None,
                                     *args, **kw)
        return Planner(*args, **kw)

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
        if f != "cuInit":
            self.ensure_init(rec)
        tid = rec.get("tid")
        if not threaded and tid != self._last_tid and self._last_tid is not None and tid in self.ctx.cur_ctx:
            try:
                self.ctx.raw("cuCtxSetCurrent", self.ctx.cur_ctx[tid])
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
                if is_release(f) and any(getattr(sub, "holds_releases", False) for sub in self.subscribers):
                    self._held.append(rec)      # run by release_held, after the subscriber's later work
                    self.ctx.res.calls += 1
                    return
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
        self.ctx.res.calls += 1
        if self._stale is not None:
            self._stale.ran(rec)
        fam = h.family
        self.ctx.res.by_family[fam] = self.ctx.res.by_family.get(fam, 0) + 1
        if is_sync(f):
            self._sync_mark(seq)

    def _error(self, rec, msg: str) -> None:
        self.ctx.res.errors.append(msg)
        if not self.ctx.opt.continue_on_error:
            raise _Abort(msg)


PROFILER_RANGES = ("recorded", "workload")
PACES = ("fast", "recorded")


class _StopVerify(Exception):
    def __init__(self, m: Mismatch):
        self.m = m


class _Abort(Exception):
    """An error already recorded in the result; stop replaying."""
