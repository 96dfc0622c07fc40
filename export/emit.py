"""Snapshot -> standalone C program (`cudasnap export`).

The program is one C file, a Makefile and the payloads in data/ (H2D sources, module images,
expected D2H results).  It replays the recorded calls through the plain Driver API, with no
Python: the placement zone is reserved at its recorded address, every allocation is mapped at
its recorded address exactly as the replayer maps it (the replayer's address-space manager
plans the mappings here, at export time, against a driver that writes C), modules load from
their images, kernels launch with their recorded packed parameter bytes.

Translation is table-driven: TABLE maps each API (base name) to the emitter of its family;
calls made only of values and handles (streams, events, graphs, limits, attributes) share one
emitter that reads their parameter list and handle kinds from the API description.  A call
with no entry stops the export with its name; pure queries are left out.
"""
from __future__ import annotations

import os
import re
import struct
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from cudasnap.formats import SnapshotError, SnapshotReader, parse_callset
from cudasnap.formats.abi import base_name
from cudasnap.formats.outputs import atomic_file, write_atomic
from cudasnap.formats.vocab import alloc_range, is_launch, is_query

PLACE_GRAN = 2 << 20              # granule the placement plan is aligned to (checked when run)
CALLS_PER_FUNCTION = 400          # the call sequence is split into functions this long
PARAM_MAX = 32768
LAUNCH_CONFIG = struct.Struct("<7I4xQQI4x")   # CUlaunchConfig: grid, block, shmem, hStream, attrs, numAttrs
LAUNCH_ATTR_SIZE = 72
ATTR_WITH_EVENT = {7: "programmatic event", 12: "launch completion event"}

# handle kind -> (C type, array name)
ARRAYS = {
    "context": ("CUcontext", "ctx"), "module": ("CUmodule", "mod"), "library": ("CUlibrary", "lib"),
    "function": ("CUfunction", "fn"), "kernel": ("CUkernel", "krn"), "stream": ("CUstream", "stream"),
    "event": ("CUevent", "event"), "graph": ("CUgraph", "graph"), "graph_exec": ("CUgraphExec", "gexec"),
    "memh": ("CUmemGenericAllocationHandle", "memh"), "phys": ("CUmemGenericAllocationHandle", "phys"),
}


class ExportError(Exception):
    """The snapshot cannot be exported (exit code 2); the message names the call."""




def c_string(s: str) -> str:
    out = []
    for ch in s.encode("utf-8", "surrogateescape"):
        c = chr(ch)
        if c in '"\\':
            out.append("\\" + c)
        elif 32 <= ch < 127 and c != "?":
            out.append(c)
        else:
            out.append(f"\\{ch:03o}")
    return '"' + "".join(out) + '"'


def c_bytes(b: bytes) -> str:
    """A string literal holding exactly b (its implicit NUL is not counted by the users)."""
    lines, row = [], []
    for i, x in enumerate(b):
        row.append(f"\\x{x:02x}")
        if len(row) == 32:
            lines.append('"' + "".join(row) + '"')
            row = []
    if row or not lines:
        lines.append('"' + "".join(row) + '"')
    return "\n    ".join(lines)


def lit(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        if v < 0:
            return f"({v}LL)" if v < -(1 << 31) else f"({v})"
        return f"0x{v:x}ULL" if v >= (1 << 31) else str(v)
    if isinstance(v, float):
        return repr(v) + ("f" if "." in repr(v) or "e" in repr(v) else ".0f")
    raise TypeError(v)


@dataclass
class ExportResult:
    outdir: str
    c_file: str
    program: str
    calls: int = 0                    # recorded calls translated
    launches: int = 0
    queries_skipped: int = 0
    host_only: Dict[str, int] = field(default_factory=dict)   # dropped calls without device effect, by name
    failed_skipped: int = 0           # calls that failed when recorded (they had no effect)
    filtered: int = 0                 # left out by --calls
    no_effect: int = 0                # hints, host-only calls: nothing to replay
    h2d_files: int = 0
    h2d_bytes: int = 0
    d2h_files: int = 0
    d2h_bytes: int = 0
    modules: int = 0
    kernels: int = 0
    stopped_at: Optional[int] = None  # the call the recorded program died in
    notes: List[str] = field(default_factory=list)
    elapsed_s: float = 0.0


class _Slots:
    def __init__(self):
        self.n: Dict[str, int] = {}
        self.map: Dict[Tuple[str, Any], int] = {}

    def new(self, kind: str, rec_h=None) -> int:
        i = self.n.get(kind, 0)
        self.n[kind] = i + 1
        if rec_h:
            self.map[(kind, rec_h)] = i
        return i

    def get(self, kind: str, rec_h) -> Optional[int]:
        return self.map.get((kind, rec_h))

    def drop(self, kind: str, rec_h) -> Optional[int]:
        return self.map.pop((kind, rec_h), None)


def ref(kind: str, i: int) -> str:
    return f"{ARRAYS[kind][1]}[{i}]"


class _PlanDriver:
    """The replayer's address-space manager calls this 'driver' at export time: each operation
    becomes a line of C (placement is planned by the same code that places allocations on replay)."""

    def __init__(self, em: "Emitter"):
        self.em = em
        self.lines: List[str] = []

    def reserve(self, size, addr, align=0):
        raise ExportError("placement: a range outside the planned zones needed a reservation")

    def free_va(self, addr, size):
        pass

    def create(self, size):
        k = self.em.slots.new("phys")
        self.lines.append(f"mem_create(&{ref('phys', k)}, {lit(size)});")
        return k

    def map(self, addr, size, handle, offset=0):
        self.lines.append(f"mem_map({lit(addr)}, {lit(size)}, {ref('phys', handle)});")

    def set_access(self, addr, size, flags=None):
        self.lines.append(f"set_access({lit(addr)}, {lit(size)}, {3 if flags is None else int(flags)});")

    def unmap(self, addr, size):
        self.lines.append(f'CKN("cuMemUnmap", cuMemUnmap({lit(addr)}, {lit(size)}));')

    def release(self, handle):
        self.lines.append(f'CKN("cuMemRelease", cuMemRelease({ref("phys", handle)}));')

    def mem_alloc(self, size):
        raise ExportError("placement: an allocation lies outside the planned zones")

    def mem_free(self, addr):
        pass

    def take(self) -> List[str]:
        out, self.lines = self.lines, []
        return out


# ------------------------------------------------------------------------------ the table
# base name -> emitter method name.  Anything not here and not a pure query is refused.
TABLE: Dict[str, str] = {}


def _t(method: str, *names: str) -> None:
    for n in names:
        TABLE[n] = method


_t("e_init", "cuInit")
_t("e_retain", "cuDevicePrimaryCtxRetain")
_t("e_release", "cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxReset")
_t("e_primary_flags", "cuDevicePrimaryCtxSetFlags")
_t("e_ctx_create", "cuCtxCreate")
_t("e_ctx_destroy", "cuCtxDestroy")
_t("e_ctx_set", "cuCtxSetCurrent")
_t("e_ctx_push", "cuCtxPushCurrent")
_t("e_ctx_pop", "cuCtxPopCurrent")
_t("e_ctx_sync", "cuCtxSynchronize")
_t("e_none", "cuCtxSetCacheConfig", "cuCtxSetSharedMemConfig", "cuCtxResetPersistingL2Cache", "cuCtxSetFlags",
   "cuFuncSetSharedMemConfig", "cuKernelSetCacheConfig", "cuFuncSetBlockShape", "cuFuncSetSharedSize",
   "cuLinkCreate", "cuLinkAddData", "cuLinkAddFile", "cuLinkComplete", "cuLinkDestroy", "cuFuncLoad",
   "cuStreamSetAttribute", "cuStreamCopyAttributes", "cuThreadExchangeStreamCaptureMode",
   "cuProfilerStart", "cuProfilerStop", "cuProfilerInitialize",
   "cuMemHostAlloc", "cuMemAllocHost", "cuMemFreeHost", "cuMemHostRegister", "cuMemHostUnregister",
   "cuMemAdvise", "cuMemPrefetchAsync", "cuMemRangeGetAttribute", "cuStreamAttachMemAsync",
   "cuMemPoolCreate", "cuDeviceGetDefaultMemPool", "cuDeviceGetMemPool", "cuMemGetDefaultMemPool",
   "cuMemGetMemPool", "cuMemPoolDestroy", "cuMemPoolTrimTo", "cuMemPoolSetAttribute", "cuMemPoolSetAccess",
   "cuDeviceSetMemPool", "cuMemSetMemPool", "cuEventElapsedTime", "cuCtxAttach", "cuCtxDetach")
_t("e_host_func", "cuLaunchHostFunc", "cuStreamAddCallback")
_t("e_alloc", "cuMemAlloc", "cuMemAllocManaged", "cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuMemAllocPitch")
_t("e_free", "cuMemFree")
_t("e_free_async", "cuMemFreeAsync")
_t("e_reserve", "cuMemAddressReserve")
_t("e_address_free", "cuMemAddressFree")
_t("e_mem_create", "cuMemCreate")
_t("e_mem_release", "cuMemRelease")
_t("e_mem_map", "cuMemMap")
_t("e_mem_unmap", "cuMemUnmap")
_t("e_mem_access", "cuMemSetAccess")
_t("e_h2d", "cuMemcpyHtoD", "cuMemcpyHtoDAsync")
_t("e_d2h", "cuMemcpyDtoH", "cuMemcpyDtoHAsync")
_t("e_d2d", "cuMemcpyDtoD", "cuMemcpyDtoDAsync", "cuMemcpy", "cuMemcpyAsync")
_t("e_copy2d", "cuMemcpy2D", "cuMemcpy2DAsync", "cuMemcpy2DUnaligned")
_t("e_memset", "cuMemsetD8", "cuMemsetD16", "cuMemsetD32", "cuMemsetD8Async", "cuMemsetD16Async",
   "cuMemsetD32Async", "cuMemsetD2D8", "cuMemsetD2D16", "cuMemsetD2D32", "cuMemsetD2D8Async",
   "cuMemsetD2D16Async", "cuMemsetD2D32Async")
_t("e_module_load", "cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoadFatBinary", "cuModuleLoad")
_t("e_library_load", "cuLibraryLoadData", "cuLibraryLoadFromFile")
_t("e_module_unload", "cuModuleUnload")
_t("e_library_unload", "cuLibraryUnload")
_t("e_get_function", "cuModuleGetFunction")
_t("e_get_kernel", "cuLibraryGetKernel")
_t("e_kernel_function", "cuKernelGetFunction")
_t("e_library_module", "cuLibraryGetModule")
_t("e_global", "cuModuleGetGlobal", "cuLibraryGetGlobal")
_t("e_func_attr", "cuFuncSetAttribute", "cuFuncSetCacheConfig")
_t("e_kernel_attr", "cuKernelSetAttribute")
_t("e_launch", "cuLaunchKernel")
_t("e_launch_ex", "cuLaunchKernelEx")
_t("e_launch_coop", "cuLaunchCooperativeKernel")
_t("e_begin_capture", "cuStreamBeginCapture")
_t("e_end_capture", "cuStreamEndCapture")
_t("e_instantiate", "cuGraphInstantiate", "cuGraphInstantiateWithFlags", "cuGraphInstantiateWithParams")
_t("e_stream_sync", "cuStreamSynchronize")
_t("e_event_record", "cuEventRecord", "cuEventRecordWithFlags")
_t("e_stream_wait", "cuStreamWaitEvent")
# calls made only of values and handles: parameters from the API description
_t("e_generic", "cuStreamCreate", "cuStreamCreateWithPriority", "cuStreamDestroy", "cuEventCreate",
   "cuEventDestroy", "cuEventSynchronize", "cuGraphLaunch", "cuGraphUpload", "cuGraphExecDestroy",
   "cuGraphDestroy", "cuCtxSetLimit")

DESTROYS = {"cuStreamDestroy": "stream", "cuEventDestroy": "event", "cuGraphExecDestroy": "graph_exec",
            "cuGraphDestroy": "graph"}


class Emitter:
    def __init__(self, snapshot, calls: Optional[str] = None):
        self.path = os.fspath(snapshot)
        self.calls_spec = calls
        self.slots = _Slots()
        self.lines: List[str] = []          # the call sequence, statements
        self.sections = {"core"}
        self.data: Dict[str, Tuple[str, Any]] = {}   # data file name -> (kind, source)
        self.params: Dict[bytes, int] = {}
        self.attrs: Dict[bytes, int] = {}
        self.offsets: Dict[Tuple[int, ...], int] = {}
        self.descs: Dict[bytes, int] = {}
        self.kernels: Dict[str, int] = {}
        self.fn_slot_src: Dict[int, Tuple[str, Any]] = {}   # fn slot -> ("module"|"library", rec handle)
        self.krn_slot_src: Dict[int, Any] = {}
        self.slot_name: Dict[Tuple[str, int], str] = {}
        self.capturing: Dict[Any, Any] = {}   # recorded stream -> stream whose capture it joined
        self.captured_events: Dict[Any, Any] = {}
        self.virtual: set = set()
        self.tid_ctx: Dict[Any, List[Optional[int]]] = {}   # recorded tid -> context stack (slots)
        self.live_ctx: Optional[int] = None                 # slot current in the program
        self.last_tid = None
        self.primary_slot: Optional[int] = None
        self.res: Optional[ExportResult] = None
        self._desc = None
        self._noted: set = set()
        self._dropped: Optional[list] = None   # [line index, first seq, {name: count}] of the last drop comment

    # -------------------------------------------------------------------------- helpers
    def fail(self, rec, msg: str):
        raise ExportError(f"call #{rec.get('s')} {rec.get('f')}: {msg}")

    def note_once(self, key: str, msg: str) -> None:
        if key not in self._noted:
            self._noted.add(key)
            self.res.notes.append(msg)

    def emit(self, rec, *stmts: str) -> None:
        at = f'AT({rec.get("s", -1)}, {c_string(rec.get("f", ""))});'
        self.lines.append("    " + " ".join((at,) + stmts))

    def comment(self, rec, text: str) -> None:
        self.emit(rec, f"/* {text} */")

    def desc(self):
        if self._desc is None:
            from cudasnap.shim.description import load
            self._desc = load()
        return self._desc

    def data_file(self, role: str, rec, key: str, required: bool = True) -> Optional[Tuple[str, int]]:
        """(file name, size) of the blob the record holds under x[key]; the file is written later."""
        ref_ = (rec.get("x") or {}).get(key)
        if not isinstance(ref_, dict) or not isinstance(ref_.get("blob"), str):
            if required:
                self.fail(rec, f"the {key} payload was not captured")
            return None
        bid = ref_["blob"]
        if not self.reader.has_blob(bid):
            self.fail(rec, f"the {key} payload (blob {bid[:12]}) is not in the snapshot")
        name = f"{role}-{bid}.bin"
        self.data.setdefault(name, ("blob", bid))
        return name, self.reader.blob_size(bid)

    def handle(self, rec, kind: str, h, what: str = "") -> str:
        if kind == "stream":
            return self.stream(rec, h)
        if kind == "context":
            return self.context(rec, h)
        i = self.slots.get(kind, h)
        if i is None:
            self.fail(rec, f"{what or kind.replace('_', ' ')} {h:#x} was not made by a recorded call"
                      if isinstance(h, int) else f"no {what or kind}")
        return ref(kind, i)

    def stream(self, rec, h) -> str:
        f = rec.get("f") or ""
        if not h:
            return "STREAM_PER_THREAD" if ("_ptsz" in f or "_ptds" in f) else "(CUstream)0"
        if h == 1:
            return "STREAM_LEGACY"
        if h == 2:
            return "STREAM_PER_THREAD"
        i = self.slots.get("stream", h)
        if i is None:
            self.fail(rec, f"stream {h:#x} was not created by a recorded call")
        return ref("stream", i)

    def skey(self, rec, h):
        """A recorded stream as the capture bookkeeping keys it."""
        f = rec.get("f") or ""
        if not h:
            return 2 if ("_ptsz" in f or "_ptds" in f) else 0
        return h

    def in_capture(self, rec, h) -> bool:
        return self.skey(rec, h) in self.capturing

    def context(self, rec, h) -> str:
        if not h:
            return "NULL"
        i = self.slots.get("context", h)
        if i is None:
            i = self.retain_primary(rec, h)
        return ref("context", i)

    def retain_primary(self, rec, h) -> int:
        """A context whose making was not recorded: the device's primary context (as replay)."""
        i = self.slots.new("context", h)
        self.lines.append(f"    CKN(\"cuDevicePrimaryCtxRetain\", cuDevicePrimaryCtxRetain(&{ref('context', i)}, g_dev));"
                          f" /* context {h:#x} */")
        ident = self.ctx_ids.get(h) or {}
        if not ident.get("primary"):
            self.note_once(f"ctx{h}", f"context {h:#x} (first used by call #{rec.get('s')}) was not made by a recorded "
                                      f"call; the program uses the device's primary context for it")
        return i

    def kid(self, name: str) -> int:
        if name not in self.kernels:
            self.kernels[name] = len(self.kernels)
        return self.kernels[name]

    def fn_record(self, h, seq) -> Optional[Dict[str, Any]]:
        vers = self.fn_versions.get(h)
        if not vers:
            return None
        best = vers[0][1]
        for after, fr in vers:
            if isinstance(seq, int) and after < seq:
                best = fr
        return best

    def function(self, rec, h) -> Tuple[str, str]:
        """(C expression of the function, kernel name) for a recorded CUfunction/CUkernel."""
        seq = rec.get("s")
        fr = self.fn_record(h, seq) or {}
        i = self.slots.get("function", h)
        if i is not None:
            return ref("function", i), self.slot_name.get(("function", i)) or fr.get("name") or f"{h:#x}"
        k = self.slots.get("kernel", h)
        if k is not None:
            return f"(CUfunction){ref('kernel', k)}", self.slot_name.get(("kernel", k)) or fr.get("name") or f"{h:#x}"
        name = fr.get("name")
        if not name:
            self.fail(rec, f"function handle {h:#x} is unknown (no recorded lookup and no fn record)"
                      if isinstance(h, int) else "launch without a function handle")
        self.sections.add("find_function")
        mod = fr.get("module")
        mi, li = self.slots.get("module", mod), self.slots.get("library", mod)
        i = self.slots.new("function", h)
        self.slot_name[("function", i)] = name
        self.fn_slot_src[i] = ("module" if mi is not None else "library", mod)
        nm, nl = self.slots.n.get("module", 0), self.slots.n.get("library", 0)
        self.lines.append(f"    {ref('function', i)} = find_function({c_string(name)}, mod, {nm}, lib, {nl}, "
                          f"{-1 if mi is None else mi}, {-1 if li is None else li});")
        return ref("function", i), name

    # -------------------------------------------------------------------------- prescan
    def prescan(self) -> None:
        self.fn_versions: Dict[Any, List[Tuple[int, Dict[str, Any]]]] = {}
        self.func_names: Dict[Any, str] = {}
        self.ctx_ids: Dict[Any, Dict[str, Any]] = {}
        self.regions: List[Tuple[int, int]] = []
        self.ranges: List[Tuple[int, int]] = []
        self.header = self.reader.header
        max_seq = -1
        for rec in self.reader.records():
            k = rec.get("k")
            if k == "c":
                if type(rec.get("s")) is int:
                    max_seq = max(max_seq, rec["s"])
                if rec.get("incomplete") or "r" not in rec:
                    continue
                rng = alloc_range(rec)
                if rng:
                    self.ranges.append(rng)
                a = rec.get("a") or {}
                if rec.get("r") == 0 and isinstance(a.get("name"), str):
                    out = a.get("hfunc") or a.get("pKernel")
                    if out:
                        self.func_names.setdefault(out, a["name"])
                if rec.get("f", "").startswith("cuDevicePrimaryCtxRetain") and rec.get("r") == 0:
                    h = a.get("pctx")
                    if isinstance(h, int) and h:
                        self.ctx_ids.setdefault(h, {"h": h})["primary"] = True
            elif k == "fn" and isinstance(rec.get("h"), int):
                vers = self.fn_versions.setdefault(rec["h"], [])
                if not vers or (rec.get("name"), rec.get("module")) != (vers[-1][1].get("name"), vers[-1][1].get("module")):
                    vers.append((max_seq, rec))
                self.func_names.setdefault(rec["h"], rec.get("name") or "")
            elif k == "ctx" and isinstance(rec.get("h"), int):
                self.ctx_ids.setdefault(rec["h"], dict(rec))
            elif k == "region" and isinstance(rec.get("base"), int) and isinstance(rec.get("size"), int):
                self.regions.append((rec["base"], rec["size"]))

    # -------------------------------------------------------------------------- main pass
    @staticmethod
    def _filterable(rec) -> bool:
        """Calls --calls can leave out: launches, graph launches, D2H/D2D copies, memsets."""
        f = rec.get("f", "")
        b = base_name(f)
        return is_launch(f) or b.startswith("cuGraphLaunch") \
            or (b.startswith("cuMemcpy") and "HtoD" not in b and "HtoA" not in b) or b.startswith("cuMemset")

    def selected(self, rec) -> bool:
        if self.sel is None:
            return True
        return (not self._filterable(rec)) or bool(self.sel(rec, self.func_names))

    def run(self, outdir) -> ExportResult:
        t0 = time.monotonic()
        out = Path(outdir)
        try:
            self.reader = SnapshotReader(self.path)
        except SnapshotError as e:
            raise ExportError(str(e))
        from cudasnap.formats.integrity import check_integrity
        bad = check_integrity(self.reader)     # before the output is touched
        if bad:
            self.reader.close()
            raise ExportError(bad)
        try:
            self.sel = parse_callset(self.calls_spec) if self.calls_spec else None
        except ValueError as e:
            raise ExportError(f"--calls: {e}")
        self.res = ExportResult(str(out), str(out / "replay.c"), str(out / "replay"))
        with self.reader:
            self.prescan()
            if self.sel is not None and not any(self._filterable(r) and self.sel(r, self.func_names)
                                                for r in self.reader.records("c")):
                raise ExportError(f"--calls {self.calls_spec}: no launch, copy or memset of the snapshot is "
                                  f"among those calls")
            self.plan_placement()
            for rec in self.reader.records():
                k = rec.get("k")
                if k == "fn":
                    self.on_fn(rec)
                    continue
                if k != "c":
                    continue
                if rec.get("incomplete") or "r" not in rec:
                    self.res.stopped_at = rec.get("s")
                    self.res.notes.append(f"call #{rec.get('s')} {rec.get('f')} never returned in the recording "
                                          f"(the program died in it); the export ends there")
                    break
                self.one(rec)
            if self.dropped_note():
                self.res.notes.append(self.dropped_note())
            if self.reader.truncated:
                self.res.notes.append(f"the snapshot is truncated ({self.reader.lost_bytes} bytes lost): exported "
                                      f"up to its last complete call")
            if not self.res.calls:
                raise ExportError(f"{self.path}: no call to export (the snapshot holds no call with an effect "
                                  f"on the device)")
            # the parent must exist (checked before the work); files export does not write are kept
            out.mkdir(exist_ok=True)
            (out / "data").mkdir(exist_ok=True)
            self.write_data(out / "data")
            write_atomic(out / "replay.c", self.render())
            write_atomic(out / "Makefile", self.makefile())
        self.res.kernels = len(self.kernels)
        self.res.elapsed_s = time.monotonic() - t0
        return self.res

    def on_fn(self, rec) -> None:
        """A newer fn record for a handle that now names another kernel: its slot is stale."""
        h = rec.get("h")
        i = self.slots.get("function", h)
        if i is not None and self.slot_name.get(("function", i)) not in (None, rec.get("name")):
            self.slots.drop("function", h)

    def one(self, rec) -> None:
        f = rec.get("f") or ""
        b = base_name(f)
        method = TABLE.get(b) or TABLE.get(f)
        if rec.get("r", 0) != 0:
            self.res.failed_skipped += 1
            return
        if method is None:
            if self.host_only(f):
                self.drop(rec)
                return
            self.fail(rec, "export cannot translate this call (no C translation for it, and the API description "
                           "gives it an effect on the device); export a call set without it (--calls) or replay "
                           "the snapshot with `cudasnap replay`")
        if not self.selected(rec):
            self.res.filtered += 1
            return
        self.switch_thread(rec)
        before = len(self.lines)
        getattr(self, method)(rec)
        if len(self.lines) > before:
            self.res.calls += 1

    def host_only(self, f: str) -> bool:
        """The API description says the call has no effect on the device (a query, a host
        pointer lookup): the program does not need it."""
        fn = self.desc().by_name(f) or self.desc().by_name(base_name(f))
        if fn is None:
            return is_query(f)
        return bool(fn.get("host_only"))

    def drop(self, rec) -> None:
        """Leave out a host-only call, saying so in the program (consecutive ones share a comment)."""
        f = rec.get("f") or "?"
        self.res.host_only[f] = self.res.host_only.get(f, 0) + 1
        run = self._dropped if self._dropped is not None and self._dropped[0] == len(self.lines) - 1 else None
        if run is None:
            self.lines.append("")
            run = self._dropped = [len(self.lines) - 1, rec.get("s"), {}]
        run[2][f] = run[2].get(f, 0) + 1
        names = ", ".join(n + (f" x{k}" if k > 1 else "") for n, k in run[2].items())
        where = f"#{run[1]}" if run[1] == rec.get("s") else f"#{run[1]}-#{rec.get('s')}"
        self.lines[run[0]] = f"    /* {where}: dropped host-only (no device effect): {names} */"

    def dropped_note(self) -> Optional[str]:
        d = self.res.host_only
        if not d:
            return None
        names = ", ".join(f"{n} x{k}" for n, k in sorted(d.items(), key=lambda kv: (-kv[1], kv[0])))
        return f"dropped {sum(d.values())} host-only call(s) without device effect: {names}"

    def switch_thread(self, rec) -> None:
        """Recorded calls of several threads run on one thread, in recorded order: each
        thread's current context is made current when its calls resume."""
        tid = rec.get("tid")
        if tid == self.last_tid:
            return
        self.last_tid = tid
        stack = self.tid_ctx.get(tid)
        want = stack[-1] if stack else None
        if stack is not None and want != self.live_ctx:
            self.lines.append(f"    CKN(\"cuCtxSetCurrent\", cuCtxSetCurrent({'NULL' if want is None else ref('context', want)}));"
                              f" /* thread {tid} resumes */")
            self.live_ctx = want

    def set_current(self, rec, slot: Optional[int], push: bool = False, pop: bool = False) -> None:
        tid = rec.get("tid")
        st = self.tid_ctx.setdefault(tid, [])
        if pop:
            if st:
                st.pop()
        elif push or not st:
            st.append(slot)
        else:
            st[-1] = slot
        self.live_ctx = st[-1] if st else None

    # -------------------------------------------------------------------------- placement
    def plan_placement(self) -> None:
        from cudasnap.replay.placement import AddressSpace
        self.pdrv = _PlanDriver(self)
        self.space = AddressSpace(self.pdrv, PLACE_GRAN)
        spans = self.space.plan(self.ranges, self.regions)
        self.reserve_lines = []
        for sp in spans:
            sp.reserved, sp.live = True, sp.start
            self.reserve_lines.append(f"reserve_exact({lit(sp.start)}, {lit(sp.size)}, 0);")

    def flush_plan(self, rec) -> None:
        ops = self.pdrv.take()
        if ops:
            self.emit(rec, *ops)
        else:
            self.comment(rec, "inside memory already mapped at its recorded address")

    # -------------------------------------------------------------------------- emitters
    def e_none(self, rec) -> None:
        self.res.no_effect += 1

    def e_init(self, rec) -> None:
        self.res.no_effect += 1       # the program's start() runs cuInit

    def e_host_func(self, rec) -> None:
        self.res.no_effect += 1
        self.note_once("hostfn", f"host callbacks of the recorded process are not run (first: call #{rec.get('s')} "
                                 f"{rec.get('f')})")

    # contexts
    def e_retain(self, rec) -> None:
        a = rec["a"]
        i = self.slots.new("context", a.get("pctx"))
        self.emit(rec, f"CK(cuDevicePrimaryCtxRetain(&{ref('context', i)}, g_dev));")

    def e_release(self, rec) -> None:
        if "Reset" in rec["f"]:
            self.note_once("reset", f"call #{rec.get('s')} {rec['f']}: replayed as a release (placement is kept)")
        self.emit(rec, "timing_drop();", "CK(cuDevicePrimaryCtxRelease(g_dev));")

    def e_primary_flags(self, rec) -> None:
        self.emit(rec, f"CK(cuDevicePrimaryCtxSetFlags(g_dev, {lit(int(rec['a'].get('flags', 0)))}));")

    def e_ctx_create(self, rec) -> None:
        a = rec["a"]
        i = self.slots.new("context", a.get("pctx"))
        self.emit(rec, f"CK(ctx_create(&{ref('context', i)}, {lit(int(a.get('flags', 0) or 0))}));")
        self.set_current(rec, i, push=True)

    def e_ctx_destroy(self, rec) -> None:
        h = rec["a"].get("ctx")
        c = self.context(rec, h)
        self.emit(rec, "timing_drop();", f"CK(cuCtxDestroy({c}));")
        i = self.slots.drop("context", h)
        for st in self.tid_ctx.values():
            st[:] = [None if s == i else s for s in st]
        if self.live_ctx == i:
            self.live_ctx = None

    def e_ctx_set(self, rec) -> None:
        h = rec["a"].get("ctx")
        c = self.context(rec, h)
        self.emit(rec, f"CK(cuCtxSetCurrent({c}));")
        self.set_current(rec, self.slots.get("context", h) if h else None)

    def e_ctx_push(self, rec) -> None:
        h = rec["a"].get("ctx")
        c = self.context(rec, h)
        self.emit(rec, f"CK(cuCtxPushCurrent({c}));")
        self.set_current(rec, self.slots.get("context", h), push=True)

    def e_ctx_pop(self, rec) -> None:
        self.emit(rec, "{ CUcontext popped_; CK(cuCtxPopCurrent(&popped_)); }")
        self.set_current(rec, None, pop=True)

    def e_ctx_sync(self, rec) -> None:
        self.emit(rec, "ctx_sync();")

    # memory
    def e_alloc(self, rec) -> None:
        rng = alloc_range(rec)
        if rng is None:
            self.fail(rec, "the recorded allocation has no address or size")
        if rec["f"].startswith("cuMemAllocManaged"):
            self.note_once("managed", "managed memory is replayed as device memory at its recorded address")
        self.space.alloc(rng[0], rng[1], rec.get("s"))
        self.flush_plan(rec)

    def e_free(self, rec) -> None:
        p = rec["a"].get("dptr")
        if self.space.free(p) is None:
            self.res.no_effect += 1
            return
        self.flush_plan(rec)

    def e_free_async(self, rec) -> None:
        a = rec["a"]
        if self.in_capture(rec, a.get("hStream")):
            self.note_once("capfree", f"call #{rec.get('s')}: frees captured into graphs are not performed")
            self.res.no_effect += 1
            return
        s = self.stream(rec, a.get("hStream"))
        self.space.free(a.get("dptr"))
        self.emit(rec, f"stream_sync({s});", *self.pdrv.take())

    def e_reserve(self, rec) -> None:
        a = rec["a"]
        ptr, size = a.get("ptr"), int(a.get("size", 0))
        sp = self.space.span_of(ptr, size) if ptr else None
        self.space.add_vmm(ptr, size, ptr, rec.get("s"))
        if sp is not None and sp.reserved:
            self.virtual.add(ptr)
            self.comment(rec, f"{ptr:#x}: inside the reserved placement zone")
            return
        self.emit(rec, f"reserve_exact({lit(ptr)}, {lit(size)}, {lit(int(a.get('alignment', 0) or 0))});")

    def e_address_free(self, rec) -> None:
        a = rec["a"]
        ptr = a.get("ptr")
        self.space.free(ptr)
        if ptr in self.virtual:
            self.virtual.discard(ptr)
            self.res.no_effect += 1
            return
        self.emit(rec, f"CK(cuMemAddressFree({lit(ptr)}, {lit(int(a.get('size', 0)))}));")

    def e_mem_create(self, rec) -> None:
        a = rec["a"]
        i = self.slots.new("memh", a.get("handle"))
        self.emit(rec, f"mem_create(&{ref('memh', i)}, {lit(int(a.get('size', 0)))});")

    def e_mem_release(self, rec) -> None:
        h = rec["a"].get("handle")
        self.emit(rec, f"CK(cuMemRelease({self.handle(rec, 'memh', h, 'allocation handle')}));")
        self.slots.drop("memh", h)

    def e_mem_map(self, rec) -> None:
        a = rec["a"]
        h = self.handle(rec, "memh", a.get("handle"), "allocation handle")
        self.emit(rec, f"CK(cuMemMap(TR({lit(a.get('ptr'))}), {lit(int(a.get('size', 0)))}, "
                       f"{lit(int(a.get('offset', 0) or 0))}, {h}, 0));")

    def e_mem_unmap(self, rec) -> None:
        a = rec["a"]
        self.emit(rec, f"CK(cuMemUnmap(TR({lit(a.get('ptr'))}), {lit(int(a.get('size', 0)))}));")

    def e_mem_access(self, rec) -> None:
        a = rec["a"]
        desc = a.get("desc")
        flags = 3
        if isinstance(desc, (bytes, bytearray)) and len(desc) >= 12:
            flags = struct.unpack_from("<I", desc, 8)[0]
        self.emit(rec, f"set_access(TR({lit(a.get('ptr'))}), {lit(int(a.get('size', 0)))}, {flags});")

    # copies
    def e_h2d(self, rec) -> None:
        a = rec["a"]
        n = int(a.get("ByteCount", 0))
        if n == 0:
            self.res.no_effect += 1
            return
        name, size = self.data_file("h2d", rec, "srcHost")
        if size != n:
            self.fail(rec, f"the H2D payload holds {size} bytes, the copy {n}")
        self.res.h2d_bytes += n
        if "Async" in rec["f"]:
            hs = a.get("hStream")
            self.emit(rec, f"h2d({lit(a.get('dstDevice'))}, \"{name}\", {lit(n)}, {self.stream(rec, hs)}, "
                           f"{2 if self.in_capture(rec, hs) else 1});")
        else:
            self.emit(rec, f"h2d({lit(a.get('dstDevice'))}, \"{name}\", {lit(n)}, (CUstream)0, 0);")

    def e_d2h(self, rec) -> None:
        a = rec["a"]
        n = int(a.get("ByteCount", 0))
        got = self.data_file("d2h", rec, "dstHost", required=False)
        if got is not None and got[1] != n:
            self.fail(rec, f"the recorded D2H result holds {got[1]} bytes, the copy {n}")
        name = f"\"{got[0]}\"" if got else "NULL"
        if got:
            self.res.d2h_bytes += n
        if "Async" in rec["f"]:
            hs = a.get("hStream")
            cap = self.in_capture(rec, hs)
            if cap:
                self.note_once("capd2h", "device-to-host copies captured into graphs are not verified")
            self.emit(rec, f"d2h({lit(a.get('srcDevice'))}, {'NULL' if cap else name}, {lit(n)}, "
                           f"{self.stream(rec, hs)}, {2 if cap else 1});")
        else:
            self.emit(rec, f"d2h({lit(a.get('srcDevice'))}, {name}, {lit(n)}, (CUstream)0, 0);")

    def e_d2d(self, rec) -> None:
        a = rec["a"]
        n = int(a.get("ByteCount", 0))
        if rec["f"].startswith("cuMemcpyDtoD"):
            dst, src = a.get("dstDevice"), a.get("srcDevice")
        else:
            dst, src = a.get("dst"), a.get("src")
            if self.space.find(dst or 0) is None or self.space.find(src or 0) is None:
                self.note_once(f"uni{rec.get('s')}", f"call #{rec.get('s')} {rec['f']}: an end of the copy is not "
                                                     f"device memory of the recording (host memory?); left out")
                self.res.no_effect += 1
                return
        if "Async" in rec["f"]:
            self.emit(rec, f"CK(cuMemcpyDtoDAsync(TR({lit(dst)}), TR({lit(src)}), {lit(n)}, "
                           f"{self.stream(rec, a.get('hStream'))}));")
        else:
            self.emit(rec, f"CK(cuMemcpyDtoD(TR({lit(dst)}), TR({lit(src)}), {lit(n)}));")

    def e_copy2d(self, rec) -> None:
        a = rec["a"]
        cp = a.get("pCopy")
        if not isinstance(cp, (bytes, bytearray)) or len(cp) < 128:
            self.fail(rec, "the CUDA_MEMCPY2D struct was not captured")
        cp = bytes(cp[:128])
        w, h = struct.unpack_from("<QQ", cp, 112)
        types = [struct.unpack_from("<I", cp, base + 16)[0] for base in (0, 56)]
        if 3 in types:
            self.fail(rec, "2D copies with CUDA arrays are not exported")
        self.sections.add("copy2d")
        src_name, src_n, dst_name, dst_n = "NULL", 0, "NULL", 0
        if types[0] == 1:
            pitch = max(struct.unpack_from("<Q", cp, 48)[0], w)
            n = pitch * (h - 1) + w if h and w else 0
            got = self.data_file("h2d", rec, "hostsrc", required=n > 0)
            if got is not None:
                src_name, src_n = f"\"{got[0]}\"", got[1]
                self.res.h2d_bytes += got[1]
        cap = "Async" in rec["f"] and self.in_capture(rec, a.get("hStream"))
        if types[1] == 1:
            pitch = max(struct.unpack_from("<Q", cp, 56 + 48)[0], w)
            dst_n = pitch * (h - 1) + w if h and w else 0
            ref_ = (rec.get("x") or {}).get("hostdst")
            if isinstance(ref_, dict) and isinstance(ref_.get("blob"), str) and self.reader.has_blob(ref_["blob"]) and not cap:
                fname = f"d2h-{rec.get('s')}-rows.bin"
                self.data[fname] = ("rows", (ref_["blob"], w, h, pitch))
                dst_name = f"\"{fname}\""
                self.res.d2h_bytes += w * h
        k = self.descs.setdefault(cp, len(self.descs))
        if "Async" in rec["f"]:
            s = self.stream(rec, a.get("hStream"))
            self.emit(rec, f"copy2d(D{k}, {src_name}, {lit(src_n)}, {dst_name}, {lit(dst_n)}, {s}, {2 if cap else 1});")
        else:
            self.emit(rec, f"copy2d(D{k}, {src_name}, {lit(src_n)}, {dst_name}, {lit(dst_n)}, (CUstream)0, 0);")

    def e_memset(self, rec) -> None:
        a = rec["a"]
        f = rec["f"]
        m = re.match(r"cuMemset(D2D|D)(8|16|32)", f)
        width = m.group(2)
        val = a.get({"8": "uc", "16": "us", "32": "ui"}[width], 0)
        dst = f"TR({lit(a.get('dstDevice'))})"
        if m.group(1) == "D2D":
            name = f"cuMemsetD2D{width}"
            args = [dst, lit(int(a.get("dstPitch", 0))), lit(int(val)), lit(int(a.get("Width", 0))),
                    lit(int(a.get("Height", 0)))]
        else:
            name = f"cuMemsetD{width}"
            args = [dst, lit(int(val)), lit(int(a.get("N", 0)))]
        if "Async" in f:
            name += "Async"
            args.append(self.stream(rec, a.get("hStream")))
        self.emit(rec, f"CK({name}({', '.join(args)}));")

    # modules
    def image(self, rec) -> Tuple[str, int]:
        got = self.data_file("module", rec, "image", required=False)
        if got is not None:
            return got
        fname = rec["a"].get("fname") or rec["a"].get("fileName")
        if isinstance(fname, str) and os.path.isfile(fname):
            name = f"module-file-{rec.get('s')}.bin"
            self.data[name] = ("file", fname)
            self.res.notes.append(f"call #{rec.get('s')} {rec['f']}: image not in the snapshot; exported {fname} from disk")
            return name, os.path.getsize(fname)
        self.fail(rec, "the module image was not captured (no x.image blob)")

    def e_module_load(self, rec) -> None:
        name, n = self.image(rec)
        self.sections.add("modules")
        i = self.slots.new("module", rec["a"].get("module"))
        self.res.modules += 1
        self.emit(rec, f"CK(cuModuleLoadData(&{ref('module', i)}, load_image(\"{name}\", {lit(n)})));")

    def e_library_load(self, rec) -> None:
        name, n = self.image(rec)
        self.sections.add("modules")
        i = self.slots.new("library", rec["a"].get("library"))
        self.res.modules += 1
        self.emit(rec, f"CK(cuLibraryLoadData(&{ref('library', i)}, load_image(\"{name}\", {lit(n)}), "
                       f"NULL, NULL, 0, NULL, NULL, 0));")

    def _forget_functions(self, kind: str, h) -> None:
        for (k, rec_h), i in list(self.slots.map.items()):
            if k == "function" and self.fn_slot_src.get(i) == (kind, h):
                self.slots.drop("function", rec_h)
            if k == "kernel" and self.krn_slot_src.get(i) == h and kind == "library":
                self.slots.drop("kernel", rec_h)

    def e_module_unload(self, rec) -> None:
        h = rec["a"].get("hmod")
        m = self.handle(rec, "module", h)
        self.emit(rec, f"CK(cuModuleUnload({m}));", f"{m} = NULL;")
        self.slots.drop("module", h)
        self._forget_functions("module", h)

    def e_library_unload(self, rec) -> None:
        h = rec["a"].get("library")
        lb = self.handle(rec, "library", h)
        self.emit(rec, f"CK(cuLibraryUnload({lb}));", f"{lb} = NULL;")
        self.slots.drop("library", h)
        self._forget_functions("library", h)

    def _name(self, rec) -> str:
        n = rec["a"].get("name")
        if not isinstance(n, str):
            self.fail(rec, "the name string was not captured")
        return n

    def e_get_function(self, rec) -> None:
        a = rec["a"]
        name = self._name(rec)
        m = self.handle(rec, "module", a.get("hmod"))
        i = self.slots.new("function", a.get("hfunc"))
        self.slot_name[("function", i)] = name
        self.fn_slot_src[i] = ("module", a.get("hmod"))
        self.emit(rec, f"CK(cuModuleGetFunction(&{ref('function', i)}, {m}, {c_string(name)}));")

    def e_get_kernel(self, rec) -> None:
        a = rec["a"]
        name = self._name(rec)
        lb = self.handle(rec, "library", a.get("library"))
        i = self.slots.new("kernel", a.get("pKernel"))
        self.slot_name[("kernel", i)] = name
        self.krn_slot_src[i] = a.get("library")
        self.emit(rec, f"CK(cuLibraryGetKernel(&{ref('kernel', i)}, {lb}, {c_string(name)}));")

    def e_kernel_function(self, rec) -> None:
        a = rec["a"]
        k = self.slots.get("kernel", a.get("kernel"))
        if k is None:
            self.fail(rec, f"kernel {a.get('kernel')!r} was not made by a recorded call")
        i = self.slots.new("function", a.get("pFunc"))
        self.slot_name[("function", i)] = self.slot_name.get(("kernel", k), "")
        self.fn_slot_src[i] = ("library", self.krn_slot_src.get(k))
        self.emit(rec, f"CK(cuKernelGetFunction(&{ref('function', i)}, {ref('kernel', k)}));")

    def e_library_module(self, rec) -> None:
        a = rec["a"]
        lb = self.handle(rec, "library", a.get("library"))
        i = self.slots.new("module", a.get("pMod"))
        self.emit(rec, f"CK(cuLibraryGetModule(&{ref('module', i)}, {lb}));")

    def e_global(self, rec) -> None:
        a = rec["a"]
        name = self._name(rec)
        self.sections.add("globals")
        if rec["f"].startswith("cuModule"):
            call = f"cuModuleGetGlobal(&p_, &n_, {self.handle(rec, 'module', a.get('hmod'))}, {c_string(name)})"
        else:
            call = f"cuLibraryGetGlobal(&p_, &n_, {self.handle(rec, 'library', a.get('library'))}, {c_string(name)})"
        rp = a.get("dptr") or 0
        self.emit(rec, f"{{ CUdeviceptr p_; size_t n_; CK({call}); global_at({lit(rp)}, p_, n_); }}")
        if rp:
            self.space.add_global(rp, int(a.get("bytes") or 0), rp, rec.get("s"), name)

    def e_func_attr(self, rec) -> None:
        a = rec["a"]
        fexpr, _name = self.function(rec, a.get("hfunc"))
        if rec["f"].startswith("cuFuncSetCacheConfig"):
            self.emit(rec, f"CK(cuFuncSetCacheConfig({fexpr}, (CUfunc_cache){int(a.get('config', 0))}));")
        else:
            self.emit(rec, f"CK(cuFuncSetAttribute({fexpr}, (CUfunction_attribute){int(a.get('attrib', 0))}, "
                           f"{lit(int(a.get('value', 0)))}));")

    def e_kernel_attr(self, rec) -> None:
        a = rec["a"]
        k = self.handle(rec, "kernel", a.get("kernel"))
        self.emit(rec, f"CK(cuKernelSetAttribute((CUfunction_attribute){int(a.get('attrib', 0))}, "
                       f"{lit(int(a.get('val', 0)))}, {k}, g_dev));")

    # launches
    def _params(self, rec) -> Tuple[bytes, int]:
        p = (rec.get("x") or {}).get("params")
        if p is None:
            self.fail(rec, "kernel parameters were not captured (x.params missing)")
        p = bytes(p)
        if len(p) > PARAM_MAX:
            self.fail(rec, f"{len(p)} bytes of kernel parameters exceed {PARAM_MAX}")
        return p, self.params.setdefault(p, len(self.params))

    def _launch_common(self, rec, hs):
        fexpr, name = self.function(rec, rec["a"].get("f"))
        p, k = self._params(rec)
        cap = self.in_capture(rec, hs)
        self.res.launches += 1
        return fexpr, name, p, k, (0 if cap else 1)

    def e_launch(self, rec) -> None:
        a = rec["a"]
        hs = a.get("hStream")
        fexpr, name, p, k, timed = self._launch_common(rec, hs)
        g = [int(a.get(x, 1)) for x in ("gridDimX", "gridDimY", "gridDimZ", "blockDimX", "blockDimY", "blockDimZ")]
        self.emit(rec, f"launch({self.kid(name)}, {fexpr}, {', '.join(map(str, g))}, {int(a.get('sharedMemBytes', 0))}, "
                       f"{self.stream(rec, hs)}, P{k}, {len(p)}, {timed});")

    def e_launch_coop(self, rec) -> None:
        a = rec["a"]
        hs = a.get("hStream")
        fexpr, name, p, k, timed = self._launch_common(rec, hs)
        layout = (self.fn_record(a.get("f"), rec.get("s")) or {}).get("params")
        if layout is None:
            if p:
                self.fail(rec, "a cooperative launch needs the kernel's parameter layout (no fn record)")
            layout = []
        offs = tuple(int(o) for o, _s in layout)
        o = self.offsets.setdefault(offs, len(self.offsets))
        self.sections.add("launch_coop")
        g = [int(a.get(x, 1)) for x in ("gridDimX", "gridDimY", "gridDimZ", "blockDimX", "blockDimY", "blockDimZ")]
        self.emit(rec, f"launch_coop({self.kid(name)}, {fexpr}, {', '.join(map(str, g))}, {int(a.get('sharedMemBytes', 0))}, "
                       f"{self.stream(rec, hs)}, P{k}, {len(p)}, O{o}, {len(offs)}, {timed});")

    def e_launch_ex(self, rec) -> None:
        a = rec["a"]
        cfg = a.get("config")
        if not isinstance(cfg, (bytes, bytearray)) or len(cfg) < LAUNCH_CONFIG.size:
            self.fail(rec, "the CUlaunchConfig struct was not captured")
        gx, gy, gz, bx, by, bz, shm, hs, _ap, nattr = LAUNCH_CONFIG.unpack_from(cfg)
        attrs = bytes((rec.get("x") or {}).get("attrs") or b"")[: nattr * LAUNCH_ATTR_SIZE]
        if nattr and len(attrs) != nattr * LAUNCH_ATTR_SIZE:
            self.fail(rec, f"launch attributes were not captured ({nattr} expected)")
        if nattr > 16:
            self.fail(rec, f"{nattr} launch attributes (at most 16 are exported)")
        for i in range(nattr):
            aid = struct.unpack_from("<I", attrs, i * LAUNCH_ATTR_SIZE)[0]
            if aid in ATTR_WITH_EVENT:
                self.fail(rec, f"launch attribute {aid} ({ATTR_WITH_EVENT[aid]}) holds an event handle of the "
                               f"recording; not exported")
        fexpr, name, p, k, timed = self._launch_common(rec, hs)
        ai = self.attrs.setdefault(attrs, len(self.attrs))
        self.sections.add("launch_ex")
        self.emit(rec, f"launch_ex({self.kid(name)}, {fexpr}, {gx}, {gy}, {gz}, {bx}, {by}, {bz}, {shm}, "
                       f"{self.stream(rec, hs)}, A{ai}, {nattr}, P{k}, {len(p)}, {timed});")

    # streams, events, graphs
    def e_begin_capture(self, rec) -> None:
        a = rec["a"]
        hs = a.get("hStream")
        mode = int(a.get("mode", 0) or 0)
        self.emit(rec, f"CK(cuStreamBeginCapture({self.stream(rec, hs)}, (CUstreamCaptureMode){mode}));")
        k = self.skey(rec, hs)
        self.capturing[k] = k

    def e_end_capture(self, rec) -> None:
        a = rec["a"]
        hs = a.get("hStream")
        i = self.slots.new("graph", a.get("phGraph"))
        self.emit(rec, f"CK(cuStreamEndCapture({self.stream(rec, hs)}, &{ref('graph', i)}));")
        origin = self.capturing.get(self.skey(rec, hs))
        for s in [s for s, o in self.capturing.items() if o == origin]:
            del self.capturing[s]

    def e_instantiate(self, rec) -> None:
        a = rec["a"]
        g = self.handle(rec, "graph", a.get("hGraph"))
        flags = int(a.get("flags", 0) or 0)
        if rec["f"].startswith("cuGraphInstantiateWithParams"):
            ip = a.get("instantiateParams")
            flags = struct.unpack_from("<Q", ip, 0)[0] if isinstance(ip, (bytes, bytearray)) and len(ip) >= 8 else 0
        elif not rec["f"].startswith("cuGraphInstantiateWithFlags"):
            flags = 0
        flags &= ~2                    # upload on instantiation needs the params form; launch uploads anyway
        i = self.slots.new("graph_exec", a.get("phGraphExec"))
        self.emit(rec, f"CK(cuGraphInstantiateWithFlags(&{ref('graph_exec', i)}, {g}, {lit(flags)}));")

    def e_stream_sync(self, rec) -> None:
        self.emit(rec, f"stream_sync({self.stream(rec, rec['a'].get('hStream'))});")

    def e_event_record(self, rec) -> None:
        a = rec["a"]
        hs = a.get("hStream")
        e = self.handle(rec, "event", a.get("hEvent"))
        if rec["f"].startswith("cuEventRecordWithFlags"):
            self.emit(rec, f"CK(cuEventRecordWithFlags({e}, {self.stream(rec, hs)}, {lit(int(a.get('flags', 0) or 0))}));")
        else:
            self.emit(rec, f"CK(cuEventRecord({e}, {self.stream(rec, hs)}));")
        k = self.skey(rec, hs)
        if k in self.capturing:
            self.captured_events[a.get("hEvent")] = self.capturing[k]
        else:
            self.captured_events.pop(a.get("hEvent"), None)

    def e_stream_wait(self, rec) -> None:
        a = rec["a"]
        hs = a.get("hStream")
        e = self.handle(rec, "event", a.get("hEvent"))
        self.emit(rec, f"CK(cuStreamWaitEvent({self.stream(rec, hs)}, {e}, {lit(int(a.get('Flags', a.get('flags', 0)) or 0))}));")
        origin = self.captured_events.get(a.get("hEvent"))
        if origin is not None and origin in self.capturing.values():
            self.capturing[self.skey(rec, hs)] = origin

    def e_generic(self, rec) -> None:
        """A call made only of values and handles, from its description entry: each value is
        written as recorded, each handle as the program's own, each output handle into a new slot."""
        d = self.desc()
        fn = d.by_name(rec["f"])
        if fn is None:
            self.fail(rec, "not in the API description")
        b = fn["base"]
        a = rec.get("a") or {}
        args, outs = [], []
        for p in fn["params"]:
            t = d.types.get(p.get("pointee" if p["kind"] == "out" else "ctype") or "", {})
            kind = t.get("handle", "") if t.get("kind") == "handle" else ""
            v = a.get(p["name"])
            if p["kind"] == "val":
                if kind:
                    args.append(self.handle(rec, kind, v))
                elif t.get("semantic") == "device":
                    args.append("g_dev")
                elif t.get("kind") == "enum":
                    args.append(f"({p['ctype']}){int(v or 0)}")
                elif isinstance(v, (int, float)):
                    args.append(lit(v))
                else:
                    self.fail(rec, f"parameter {p['name']} ({p['ctype']}) has no recorded value")
            elif p["kind"] == "out" and kind:
                i = self.slots.new(kind, v)
                outs.append((kind, i))
                args.append(f"&{ref(kind, i)}")
            else:
                self.fail(rec, f"parameter {p['name']} ({p['kind']}) needs a translation of its own")
        self.emit(rec, f"CK({b}({', '.join(args)}));")
        kind = DESTROYS.get(b)
        if kind:
            for p in fn["params"]:
                if p["kind"] == "val":
                    self.slots.drop(kind, a.get(p["name"]))
                    break

    # -------------------------------------------------------------------------- output
    def write_data(self, ddir: Path) -> None:
        for name, (kind, src) in self.data.items():
            path = ddir / name
            with atomic_file(path, "wb") as fh:
                if kind == "blob":
                    for chunk in self.reader.blob_reader(src):
                        fh.write(chunk)
                elif kind == "rows":
                    bid, w, h, pitch = src
                    blob = self.reader.blob(bid)
                    for i in range(h):
                        fh.write(blob[i * pitch:i * pitch + w])
                else:
                    with open(src, "rb") as f_in:
                        fh.write(f_in.read())
            if name.startswith("h2d-"):
                self.res.h2d_files += 1
            elif name.startswith("d2h-"):
                self.res.d2h_files += 1

    def runtime(self) -> str:
        text = resources.files("cudasnap.export").joinpath("runtime.c").read_text()
        out = []
        for m in re.finditer(r"/\*@section (\w+)\*/\n(.*?)/\*@end\*/\n", text, re.S):
            if m.group(1) in self.sections:
                out.append(m.group(2))
        return "".join(out)

    def render(self) -> str:
        h = self.header
        gpus = (h.get("proc") or {}).get("gpus") or []
        gpu = f"{gpus[0].get('name')} (sm_{''.join(map(str, gpus[0].get('cc') or []))})" if gpus else "unknown GPU"
        argv = " ".join(map(str, h.get("argv") or []))[:200].replace("*/", "* /")
        o: List[str] = [
            f"/* Generated by `cudasnap export` from {os.path.basename(self.path)}"
            + (f" (calls {self.calls_spec})" if self.calls_spec else "") + ".",
            f" * Recorded: {argv or '?'} on {gpu}.",
            f" * {self.res.calls} calls, {self.res.launches} launches, {len(self.kernels)} kernels.",
            " * Build: make (CC, CFLAGS, LDFLAGS honoured; CUDA_HOME for cuda.h); run: ./replay [-v] [-n] [-d N].",
            " * Exit: 0 every device-to-host result verified, 1 a result differs, 2 cannot proceed. */",
            f"#define NKERNELS {len(self.kernels)}",
            "static const char *const KERNEL_NAMES[] = {"
            + ", ".join(c_string(n) for n in self.kernels) + ("" if self.kernels else "\"\"") + "};",
            self.runtime(),
            "/* ---- the program's objects, by recorded handle ---- */",
        ]
        for kind, (ctype, arr) in ARRAYS.items():
            if self.slots.n.get(kind) or (kind in ("module", "library") and "find_function" in self.sections):
                o.append(f"static {ctype} {arr}[{max(self.slots.n.get(kind, 0), 1)}];")
        o.append("\n/* ---- recorded kernel parameter blocks (packed bytes, as launched) ---- */")
        for p, k in self.params.items():
            o.append(f"static const unsigned char P{k}[] =\n    {c_bytes(p)};")
        for b, k in self.attrs.items():
            o.append(f"static const unsigned char A{k}[] =\n    {c_bytes(b)};")
        for offs, k in self.offsets.items():
            o.append(f"static const unsigned O{k}[] = {{{', '.join(map(str, offs)) or '0'}}};")
        for b, k in self.descs.items():
            o.append(f"static const unsigned char D{k}[] =\n    {c_bytes(b)};")
        o.append("\n/* ---- the recorded calls: AT(sequence number, API as recorded) ---- */")
        parts = [self.lines[i:i + CALLS_PER_FUNCTION] for i in range(0, len(self.lines), CALLS_PER_FUNCTION)] or [[]]
        for i, part in enumerate(parts):
            o.append(f"static void calls_{i}(void) {{")
            o.extend(part)
            o.append("}")
        o.append("\nint main(int argc, char **argv) {")
        o.append("    options(argc, argv);")
        o.append("    start();")
        if self.reserve_lines:
            o.append(f"    check_granularity({lit(PLACE_GRAN)});")
            o.append('    g_api = "placement";')
            o.extend("    " + ln for ln in self.reserve_lines)
        for i in range(len(parts)):
            o.append(f"    calls_{i}();")
        o.append("    return finish();")
        o.append("}")
        return "\n".join(o) + "\n"

    def makefile(self) -> str:
        return (
            f"# Built by `cudasnap export` from {os.path.basename(self.path)}: a standalone replay through the CUDA\n"
            "# Driver API.  `make` builds ./replay; `make run` runs it.  CC, CFLAGS, CPPFLAGS, LDFLAGS and\n"
            "# LDLIBS are honoured; cuda.h comes from CUDA_HOME/include unless CFLAGS names another.\n"
            "CUDA_HOME ?= /usr/local/cuda\n"
            "CFLAGS ?= -O1 -g\n"
            "CPPFLAGS ?=\n"
            "LDFLAGS ?=\n"
            "LDLIBS ?= -lcuda -ldl\n"
            "\n"
            "replay: replay.c\n"
            "\t$(CC) $(CFLAGS) $(CPPFLAGS) -I$(CUDA_HOME)/include -o $@ replay.c $(LDFLAGS) "
            "-L$(CUDA_HOME)/lib64/stubs $(LDLIBS)\n"
            "\n"
            "run: replay\n"
            "\t./replay\n"
            "\n"
            "clean:\n"
            "\trm -f replay\n"
            "\n"
            ".PHONY: run clean\n"
        )


def export_snapshot(snapshot, outdir, calls: Optional[str] = None) -> ExportResult:
    """Write the standalone C program for `snapshot` (or the call set `calls`) into outdir."""
    return Emitter(snapshot, calls).run(outdir)
