"""What replay handlers see: a ReplayContext, not the engine.

The engine (Replayer) owns one context and passes it to every handler. The context holds:
- the driver, device, options, result and the address space (set by the engine);
- one declared map per handle kind (Handles), and the function/module bookkeeping;
- translate/record methods: live(), set_handle(), stream(), tr(), drv(), raw(), blob(),
  verify(), note(), fail(), mark_written(), before_launch()/after_launch() (the engine's
  event hooks);
- the declared fields handlers keep state in (nothing is stored on it ad hoc: __slots__).
"""
from __future__ import annotations

import bisect
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

from cudasnap.formats import SnapshotError, cu_result_name
from cudasnap.formats.abi import per_thread
from cudasnap.formats.callset import in_sync_group, is_memcpy
from cudasnap.formats.vocab import is_graph_launch, is_launch

from .driverops import handle_int, result_code
from .notes import recurred_note
from .errors import DriverCallError, ReplayError
from .placement import scan_payload
from .numerics import DIFFERENT, Judgement, measure, summarize
from .verify import Tolerance, compare

CU_STREAM_LEGACY, CU_STREAM_PER_THREAD = 1, 2

# handle kind -> the Handles map it lives in; `what` words handlers and the description use
_KIND_MAP = {
    "context": "contexts", "stream": "streams", "event": "events", "graph": "graphs", "child graph": "graphs",
    "graph node": "graph_nodes", "node": "graph_nodes", "graph exec": "graph_execs",
    "allocation handle": "mem_handles", "mem handle": "mem_handles", "mempool": "pools", "pool": "pools",
    "module": "modules", "library": "libraries", "kernel": "kernels", "function": "functions",
    "conditional handle": "conditionals",
}


class Handles:
    """Recorded handle -> live object, one map per handle kind (contexts, streams, events,
    graphs, graph_nodes, graph_execs, mem_handles, pools, modules, libraries, kernels,
    functions, conditionals; anything else in `other`). A recorded value belongs to one kind
    at a time. A lookup by kind falls back to the value alone: programs pass one kind as
    another (the runtime hands CUkernel handles to calls that take a CUfunction)."""

    KINDS = ("contexts", "streams", "events", "graphs", "graph_nodes", "graph_execs", "mem_handles", "pools",
             "modules", "libraries", "kernels", "functions", "conditionals", "other")
    __slots__ = KINDS + ("_all", "_kind_of")

    def __init__(self):
        for k in self.KINDS:
            setattr(self, k, {})
        self._all: Dict[int, Any] = {}
        self._kind_of: Dict[int, str] = {}

    @staticmethod
    def map_name(kind: str) -> str:
        return _KIND_MAP.get(kind.replace("_", " "), "other")

    def set(self, kind: str, rec_h: int, live) -> None:
        m = self.map_name(kind)
        old = self._kind_of.get(rec_h)
        if old is not None and old != m:
            getattr(self, old).pop(rec_h, None)
        getattr(self, m)[rec_h] = live
        self._all[rec_h] = live
        self._kind_of[rec_h] = m

    def lookup(self, kind: str, rec_h):
        """The live object of rec_h (KeyError when unknown)."""
        v = getattr(self, self.map_name(kind)).get(rec_h)
        return v if v is not None else self._all[rec_h]

    def kind_of(self, rec_h) -> Optional[str]:
        return self._kind_of.get(rec_h)

    # any-kind access (by value)
    def __contains__(self, rec_h) -> bool:
        return rec_h in self._all

    def __getitem__(self, rec_h):
        return self._all[rec_h]

    def get(self, rec_h, default=None):
        return self._all.get(rec_h, default)

    def pop(self, rec_h, default=None):
        m = self._kind_of.pop(rec_h, None)
        if m is not None:
            getattr(self, m).pop(rec_h, None)
        return self._all.pop(rec_h, default)

    def __len__(self) -> int:
        return len(self._all)

    def __iter__(self):
        return iter(self._all)

    def items(self):
        return self._all.items()


class EngineHooks:
    """What the engine does for handlers: initialize, run profiler control, tell subscribers
    about a launch, stop on a mismatch, reach the group coordinator. Set by the engine that
    owns the context."""
    __slots__ = ("ensure_init", "profiler_control", "before_launch", "after_launch", "wants_launch_events",
                 "stop_verify", "stale", "group_client")

    def __init__(self):
        self.ensure_init: Callable[[Any], None] = lambda rec=None: None
        self.profiler_control: Callable[[Any], None] = lambda rec: None
        self.before_launch: Callable[..., Any] = lambda *a, **k: None
        self.after_launch: Callable[[Any], None] = lambda ev: None
        self.wants_launch_events: Callable[[], bool] = lambda: False
        self.stop_verify: Callable[[Any], None] = lambda m: None
        self.stale: Callable[[Any], bool] = lambda src: False    # a result the selection does not determine
        self.group_client: Callable[[], Any] = lambda: None      # the group coordinator (None outside a group)


class ReplayContext:
    __slots__ = (
        # driver, device and run (set by the engine)
        "cu", "dev", "device_cc", "ops", "space", "reader", "opt", "res", "tol", "hooks",
        # handles
        "handles", "funcs", "func_names", "fns", "fn_versions", "func_from", "module_of", "ctx_ids",
        # lifetimes and replay state
        "keepalive", "keepalive_images", "unload_later", "vmm_virtual", "capturing", "cur_ctx", "mismatch_text", "prefetch",
        # state the handlers keep
        "cond_bodies", "cond_handles", "graph_notes", "xmode_inputs", "noted", "replacements", "jit_t0",
        "jit_what", "ipc_opened", "devmap", "devlive", "host_placed", "preloaded_in", "names_in",
        "code_loads", "hoisted", "tex_objects", "types", "digests",
    )

    def __init__(self, opt, res, tol):
        self.cu = None                                   # cuda.bindings.driver (or a test driver)
        self.dev = None                                  # live CUdevice
        self.device_cc: Optional[Tuple[int, int]] = None
        self.ops = None                                  # DriverOps
        self.space = None                                # AddressSpace (placement)
        self.reader = None                               # SnapshotReader
        self.opt, self.res, self.tol = opt, res, tol     # tol: the numerics Policy
        self.types = None                                # numerics.TypeOracle (set with the reader)
        self.digests: Optional[Dict[int, str]] = None    # seq -> digest of a result that differed (recheck)
        self.hooks = EngineHooks()
        self.handles = Handles()
        self.funcs: Dict[int, Any] = {}                  # recorded CUfunction/CUkernel -> live CUfunction
        self.func_names: Dict[int, str] = {}             # recorded function handle -> name
        self.fns: Dict[int, Dict[str, Any]] = {}         # "fn" records by handle (the first)
        self.fn_versions: Dict[int, List[Tuple[int, Dict[str, Any]]]] = {}  # reused handles: (after seq, fn)
        self.func_from: Dict[int, Dict[str, Any]] = {}   # handle -> fn record its live function was resolved by
        self.module_of: Dict[int, int] = {}              # recorded function -> recorded module/library
        self.ctx_ids: Dict[int, Dict[str, Any]] = {}     # "ctx" records: contexts identified at first sight
        self.keepalive: List[Any] = []                   # host buffers of async copies, until a sync
        self.keepalive_images: List[Any] = []            # module images and structs the driver keeps pointers to
        self.unload_later: Optional[List[Any]] = None   # (call, live handle) of unloads a profiler defers
        self.vmm_virtual: Set[int] = set()               # program reservations inside our spans
        self.capturing: Set[Any] = set()                 # recorded streams in capture
        self.cur_ctx: Dict[Any, Any] = {}                # recorded tid -> live ctx current on it
        self.mismatch_text: List[str] = []
        self.prefetch = None                             # the engine's blob prefetch thread
        self.cond_bodies: List[Any] = []                 # conditional node body graphs (kept alive)
        self.cond_handles: Dict[int, int] = {}           # recorded conditional handle -> live value
        self.graph_notes: Set[str] = set()               # graph notes already given
        self.xmode_inputs: Optional[Dict[int, Any]] = None  # capture dependencies read ahead (graph.py)
        self.noted: Set[str] = set()                     # one-time notes already given
        self.replacements: Any = False                   # replace.Replacements, None, or False: not built
        self.jit_t0: Optional[float] = None              # --jit ptx: first JIT start
        self.jit_what: Any = None
        self.ipc_opened: Dict[Any, Any] = {}             # recorded IPC/imported handle -> what was opened (ipc.py)
        self.devmap = None                               # recorded device -> GPU (devices.py), built on first use
        self.devlive: Dict[int, Any] = {}                # GPU ordinal -> live CUdevice
        self.host_placed: Set[int] = set()               # pinned host ranges mapped at their recorded address
        self.tex_objects: List[Tuple[str, int]] = []     # texture/surface objects made: (destroyer, value)
        self.preloaded_in: Dict[int, Set[int]] = {}      # live context -> libraries whose kernels it loaded
        self.names_in: Dict[int, Set[str]] = {}          # recorded module/library -> names the program asked of it
        self.code_loads: List[Dict[str, Any]] = []       # successful module/library loads (the pre-scan's)
        self.hoisted: Dict[int, Tuple[int, Any, bool]] = {}  # load seq -> (recorded, live, library?) loaded ahead

    @property
    def modules(self) -> Dict[int, Any]:
        return self.handles.modules

    @property
    def libraries(self) -> Dict[int, Any]:
        return self.handles.libraries

    # ------------------------------------------------------------------ report
    def stream_capturing(self, rec_s, live_s=None) -> bool:
        """Is the recorded stream capturing now?  Streams whose capture was begun by a replayed
        call, and streams that joined a capture (through an event wait), asked of the driver."""
        if rec_s in self.capturing:
            return True
        if not self.capturing or live_s is None:
            return False
        try:
            r = self.cu.cuStreamIsCapturing(live_s)
            return len(r) > 1 and handle_int(r[0]) == 0 and handle_int(r[1]) != 0
        except Exception:
            return False

    def note(self, msg: str) -> None:
        self.res.warnings.append(msg)

    def note_once(self, key: str, msg: str) -> None:
        if key not in self.noted:
            self.noted.add(key)
            self.note(msg)

    def fail(self, rec, msg: str) -> None:
        raise ReplayError(f"call #{rec.get('s')} {rec.get('f')}: {msg}")

    # ------------------------------------------------------------------ driver calls
    def drv(self, rec, name: str, *args, detail: str = ""):
        """Call driver `name`; compare its CUresult with the recorded one.  Returns the output
        values (a single value, a tuple, or () when none), or None when the recorded error
        recurred.  Raises ReplayError on a new error (`detail` is appended to its message)."""
        fn = getattr(self.cu, name, None)
        if fn is None:
            from .rawcall import binding        # a plain call the bindings do not wrap
            fn = binding(self.cu, name)
        if fn is None:
            self.fail(rec, f"neither the driver bindings nor this libcuda.so.1 have {name} (a driver older than the "
                           f"captured one, or a call of arguments replay cannot pass without a handler)")
        res = fn(*args)
        code = result_code(res[0])
        want = rec.get("r", 0) if rec is not None else 0
        if code == 0 and want in (0, None):
            return res[1] if len(res) == 2 else tuple(res[1:])
        if code == want:
            self.res.errors_recurred += 1
            if self.res.errors_recurred <= 3:       # name it, with its kernel (notes.py)
                self.note(recurred_note(self, rec, code))
            return None
        if want == 0 or want is None:
            self.fail(rec, self.new_error_text(code, (rec or {}).get("f") or "") + detail)
        if code == 0:
            self.note(f"call #{rec.get('s')} {rec.get('f')}: recorded {cu_result_name(want)} did not recur")
            return res[1] if len(res) == 2 else tuple(res[1:])
        self.note(f"call #{rec.get('s')} {rec.get('f')}: replay returned {cu_result_name(code)}, "
                  f"recorded {cu_result_name(want)}")
        return None

    # ------------------------------------------------------------------ code unloads
    def defer_unloads(self) -> None:
        """From now on, module and library unloads forget the recorded handle at once (the
        program may hand its value out again) but keep the code loaded until unload_deferred:
        a profiler relaunches it later (graph mode: threads that each load and unload a
        library, JIT autotuners)."""
        if self.unload_later is None:
            self.unload_later = []

    def unload(self, rec, f: str, live) -> None:
        """A recorded unload of live module or library `live`: now, or deferred."""
        if self.unload_later is not None:
            self.unload_later.append((f, live))
        else:
            self.drv(rec, f, live)

    def unload_deferred(self) -> None:
        """The unloads defer_unloads kept back, in their recorded order; unloads run at once again."""
        held, self.unload_later = self.unload_later or [], None
        for f, live in held:
            try:
                self.raw(f, live)
            except Exception as e:         # the replay's result stands; the leak is said
                self.note(f"{f} deferred for the profile: {e}")
        if held:
            self.note(f"{len(held)} module/library unload(s) waited for the graph profile")

    def new_error_text(self, code: int, f: str = "") -> str:
        hint = ""
        # only where device work could have read one: a launch, a copy, or a wait for them
        if self.res.payload_stale and not self.opt.relocate_payloads and (
                not f or is_launch(f) or is_graph_launch(f) or is_memcpy(f) or in_sync_group(f)):
            hint = ("; device memory holds stale recorded addresses after a relocation (an allocation that fell "
                    "back, or a moved host buffer; try --relocate-payloads)")
        return f"replay returned {cu_result_name(code)} (recorded CUDA_SUCCESS){hint}"

    def raw(self, name: str, *args):
        """Driver call outside any record; raises DriverCallError."""
        res = getattr(self.cu, name)(*args)
        code = result_code(res[0])
        if code != 0:
            raise DriverCallError(name, code)
        return res[1] if len(res) == 2 else tuple(res[1:])

    # ------------------------------------------------------------------ handles
    def set_handle(self, rec_h, live, kind: str = "other") -> None:
        if isinstance(rec_h, int) and rec_h:
            self.handles.set(kind, rec_h, live)

    def live(self, rec, rec_h, what: str = "handle"):
        if not rec_h:
            return None
        try:
            return self.handles.lookup(what, rec_h)
        except (KeyError, TypeError):
            self.fail(rec, f"unknown {what} {rec_h:#x} (its creating call was not replayed)"
                      if isinstance(rec_h, int) else f"bad {what} {rec_h!r}")

    def stream(self, rec, rec_s):
        """Live stream for a recorded stream handle (0 = default; per-thread for _ptsz)."""
        cu = self.cu
        if not rec_s:
            return cu.CUstream(CU_STREAM_PER_THREAD if per_thread(rec.get("f", "")) else 0)
        if rec_s in (CU_STREAM_LEGACY, CU_STREAM_PER_THREAD):
            return cu.CUstream(rec_s)
        return self.live(rec, rec_s, "stream")

    # ------------------------------------------------------------------ payloads
    def blob(self, rec, key: str) -> Optional[bytes]:
        x = rec.get("x") or {}
        ref = x.get(key)
        if ref is None:  # early snapshots named payloads "src"/"dst"
            ref = x.get({"srcHost": "src", "dstHost": "dst"}.get(key, ""))
        return self.blob_of(rec, ref, key)

    def blob_of(self, rec, ref, what: str) -> Optional[bytes]:
        """The bytes of a blob reference ({"blob": id, ...}) of rec; None when not captured."""
        if not isinstance(ref, dict) or not ref.get("blob"):
            return None
        try:
            if what == "image":           # a module image: decoded once in a kept worker (keep.py)
                from .keep import image
                return image(self.reader, ref["blob"])
            return self.reader.blob(ref["blob"])
        except SnapshotError as e:
            self.note(f"call #{rec.get('s')}: blob for {what} unreadable: {e}")
            self.res.unreadable_payloads.append(f"call #{rec.get('s')} {what}: {e}")
            return None

    def blob_chunks(self, rec, key: str) -> Optional[Tuple[int, Iterator[Any]]]:
        """(size, iterator over the blob's chunks) for payload `key` of rec, or None when the
        payload was not captured.  Chunks come from the prefetch thread when it holds this blob,
        else from the file; an unreadable blob raises SnapshotError while iterating."""
        ref = (rec.get("x") or {}).get(key)
        if not isinstance(ref, dict) or not ref.get("blob") or not self.reader.has_blob(ref["blob"]):
            return None
        bid = ref["blob"]
        size = self.reader.blob_size(bid)
        it = self.prefetch.take(bid) if self.prefetch is not None else None
        if it is None:
            from .keep import small_blob       # a kept worker's later replays: decoded once
            data = small_blob(self.reader, bid, size)
            it = iter((data,)) if data is not None else self.reader.blob_reader(bid)
        return size, it

    # ------------------------------------------------------------------ addresses
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

    # ------------------------------------------------------------------ verification
    def verify(self, rec, expected: Optional[bytes], got: bytes, src: Optional[int] = None,
               from_array: bool = False, strided: bool = False) -> None:
        """Compare a D2H result (src: the recorded device address it was read from; from_array:
        read from a CUDA array, which a left-out kernel may have written through a surface;
        strided: rows of a 2-D or 3-D copy, not contiguous bytes at src)."""
        if expected is None:
            self.res.d2h_unverified += 1
            return
        if self.hooks.stale("array" if from_array else src):
            self.res.d2h_left_out += 1
            return
        alloc = self.space.find(src) if (self.space and src) else None
        writer = alloc.last_writer if alloc else None
        if getattr(self.cu, "moves_all_memory", False) and self.space is not None and self.space.moved:
            # a simulator places every allocation itself: recorded pointers read back (a table a
            # kernel built) are expected at the simulator's address of what they point to
            expected, _found = scan_payload(bytes(expected), self.space, True)
        expected, got = bytes(expected), bytes(got)
        judged = len(expected)
        sample_mask = getattr(self.cu, "sample_mask", None)    # a simulator's bounded verdict
        if sample_mask is not None and len(expected) == len(got):
            # the mask maps contiguous bytes: the rows of a strided copy are not judged
            whole = isinstance(src, int) and not from_array and not strided
            mask = sample_mask(self.tr(src) if whole else None, len(got))
            if mask is not None:
                got = self._sampled(mask, expected, got)
                if got is None:
                    return
                judged = int(mask.sum())
        self.res.d2h_verified += 1
        self.res.d2h_bytes += judged
        seq = rec.get("s", 0)
        if expected == got:               # counted at the end with the C executor's (engine.run)
            return
        if self.digests is not None:      # what a second replay is compared with (replay.recheck)
            import xxhash
            self.digests[seq] = xxhash.xxh3_64_hexdigest(got)
        j = None
        if len(expected) == len(got) and self.types is not None:
            dtype, source = self.types.of(seq, writer)
            if dtype is not None:
                j = measure(expected, got, dtype, self.tol.tol)
                j.dtype_source = source
            elif not self.tol.tol.exact:
                j = Judgement(DIFFERENT, None, f"{source}: compared bit for bit" if source.startswith("integers")
                              else f"type unknown, {source}: compared bit for bit; --dtype gives it")
        if j is not None and j.outcome != DIFFERENT:
            summarize(self.res.numerics, j, seq, rec.get("f", ""), writer)
            return
        m = compare(expected, got, Tolerance(), seq=seq, call=rec.get("f", ""), src=src, writer=writer)
        if j is not None:
            m.judge(j)
            if j.dtype and j.first is not None:
                m.expected, m.got = expected[m.offset:m.offset + 8], got[m.offset:m.offset + 8]
        if getattr(self.cu, "approximations_exact", False) and writer and self.types is not None:
            ops = self.types.approx(writer[1])
            if ops:                       # the simulator's math library, not the GPU's approximations
                m.cause = (f"its writer uses {', '.join(ops)}, which the simulator computes with the host's math "
                           f"library where the GPU approximates: a difference in the last bits there is the "
                           f"simulator's (--dtype judges it within a tolerance)")
            elif self.types.contractions(writer[1]):  # the GPU's FMAs where the PTX has a mul and an add
                fused = " and ".join(f"mul.{t} into add/sub.{t}" for t in self.types.contractions(writer[1]))
                m.cause = (f"its writer adds products ({fused} without a rounding mode) that ptxas may fuse into "
                           f"one FMA on the GPU (one rounding) and the simulator rounds twice: a difference in the "
                           f"last bits there is the simulator's (--dtype judges it within a tolerance)")
        summarize(self.res.numerics, j or Judgement(DIFFERENT), seq, rec.get("f", ""), writer)
        self.res.mismatches.append(m.to_dict())
        self.mismatch_text.append(m.describe())
        if m.hint or m.cause or (j is not None and j.would_pass):   # rounding-like: the replay goes on (a profile completes); exit 1 stays
            self.res.rounding_mismatches += 1
        elif not self.opt.continue_on_error:
            self.hooks.stop_verify(m)

    def _sampled(self, mask, expected: bytes, got: bytes) -> Optional[bytes]:
        """A bounded verdict judges only the bytes the sampled CTAs wrote (mask): the others are
        taken as recorded, counted as not judged; None when none was written."""
        import numpy as np
        s = self.res.sample
        if s is None:
            s = self.res.sample = {"checked": 0, "read": 0, "unjudged": 0}
        s.update(self.cu.sample)
        k = int(mask.sum())
        s["read"] += len(got)
        s["checked"] += k
        if not k:
            s["unjudged"] += 1
            return None
        if k == len(got):
            return got
        return np.where(mask, np.frombuffer(got, np.uint8), np.frombuffer(expected, np.uint8)).tobytes()

    # ------------------------------------------------------------------ functions
    def add_fn(self, rec, after_seq: int) -> None:
        """An fn record names a handle at first sight. The shim sends one again after a module,
        library or context is unloaded; one that names another kernel than before (a reused
        handle value) holds for the calls after it, so versions are kept with their position."""
        h = rec["h"]
        first = self.fns.get(h)
        if first is None:
            self.fns[h] = rec
            self.func_names.setdefault(h, rec.get("name") or "")
            return
        vers = self.fn_versions.get(h)
        last = vers[-1][1] if vers else first
        if (rec.get("name"), rec.get("module"), rec.get("kind")) != (last.get("name"), last.get("module"), last.get("kind")):
            self.fn_versions.setdefault(h, [(-1, first)]).append((after_seq, rec))

    def fn_record(self, h, seq=None) -> Optional[Dict[str, Any]]:
        """The fn record that names handle h at call `seq` (the newest one before it)."""
        vers = self.fn_versions.get(h)
        if not vers or not isinstance(seq, int):
            return self.fns.get(h)
        i = bisect.bisect_left(vers, seq, key=lambda v: v[0]) - 1
        return vers[max(i, 0)][1]

    def kernel_name_of(self, rec_f, seq=None) -> str:
        if rec_f in self.fn_versions:
            return (self.fn_record(rec_f, seq) or {}).get("name") or self.func_names.get(rec_f) or f"{rec_f:#x}"
        if rec_f in self.func_names:
            return self.func_names[rec_f]
        fr = self.fns.get(rec_f)
        return fr["name"] if fr else (f"{rec_f:#x}" if isinstance(rec_f, int) else "?")

    # ------------------------------------------------------------------ engine hooks
    def ensure_init(self, rec=None) -> None:
        self.hooks.ensure_init(rec)

    def profiler_control(self, rec) -> None:
        self.hooks.profiler_control(rec)

    def group_client(self):
        """This process's group coordinator connection (None outside a group replay)."""
        return self.hooks.group_client()

    def before_launch(self, rec, fn, params: bytes, name: str, cfg=None):
        """Launch handlers call this just before the driver launch; returns the event (or None)."""
        return self.hooks.before_launch(rec, fn, params, name, cfg)

    def after_launch(self, ev) -> None:
        if ev is not None:
            self.hooks.after_launch(ev)
