"""Replay events: what the engine tells its subscribers (profilers, hooks, NVTX).

A subscriber is any object with `on_event(kind, event)`; append it to
`Replayer.subscribers` before `run()`.  Kinds, in order of appearance:

- "start"          RunEvent      after the snapshot's pre-scan, before the first call
- "before_call"    CallEvent     every replayed call record (only for subscribers whose
- "after_call"     CallEvent       `wants_calls` attribute is true)
- "before_launch"  LaunchEvent   just before the driver launch
- "after_launch"   LaunchEvent   just after the launch was enqueued (asynchronous)
- "before_copy"    CopyEvent     memcpy/memset family, before the driver call
- "copy"           CopyEvent     after it
- "before_graph_launch" CallEvent a recorded cuGraphLaunch, before the driver call
- "graph_launch"   CallEvent     after it (the graph's kernels run now: they were recorded as
                                 graph nodes, not as launches)
- "sync"           CallEvent     after cuCtxSynchronize / cuStreamSynchronize / cuEventSynchronize
- "teardown"       CallEvent     before a context is destroyed or released (resolve events now)
- "end"            EndEvent      after the final synchronize

Every event carries `replay`: a ReplayView (replay/view.py), what a subscriber may see and do
of the running replay. Subscribers never get the Replayer.

Subscribers fail open: an exception is reported as a replay warning and replay goes on.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from cudasnap.formats.abi import base_name
from cudasnap.formats.vocab import in_class, is_graph_launch, is_sync

from .params import LAUNCH_CONFIG, LaunchParams

_CLASS_CACHE: Dict[str, Optional[str]] = {}


def classify(f: str) -> Optional[str]:
    """'copy' | 'graph_launch' | 'sync' | 'teardown' | None for an ABI name (cached)."""
    c = _CLASS_CACHE.get(f, "?")
    if c != "?":
        return c
    b = base_name(f)
    if in_class(b, "copy_group") or in_class(b, "memset_group"):
        c = "copy"
    elif is_graph_launch(b):
        c = "graph_launch"
    elif is_sync(b):
        c = "sync"
    elif in_class(b, "ends_context"):
        c = "teardown"
    else:
        c = None
    _CLASS_CACHE[f] = c
    return c


@dataclass
class RunEvent:
    replay: Any                     # ReplayView (replay/view.py)
    path: str


@dataclass
class CallEvent:
    seq: Optional[int]
    call: str                       # ABI name as recorded
    rec: Dict[str, Any]
    replay: Any                     # ReplayView


@dataclass
class CopyEvent:
    seq: Optional[int]
    call: str
    direction: str                  # HtoD DtoH DtoD memset 2D other
    nbytes: int
    dst: Optional[int]              # recorded addresses (device side) where known
    src: Optional[int]
    stream: Any                     # live stream handle
    rec_stream: int
    rec: Dict[str, Any]
    replay: Any                     # ReplayView
    data: Dict[str, Any] = field(default_factory=dict)   # per-event scratch for subscribers


@dataclass
class EndEvent:
    result: Any
    replay: Any                     # ReplayView


def copy_event(rv, rec) -> CopyEvent:
    f = rec.get("f") or ""
    a = rec.get("a") or {}
    b = base_name(f)
    if in_class(b, "memset_group"):
        d, w = "memset", {"D8": 1, "D16": 2, "D32": 4}
        unit = next((v for k, v in w.items() if b.startswith("cuMemset" + k) or b.startswith("cuMemset2D" + k)), 1)
        n = int(a.get("N") or 0) * unit * max(int(a.get("Height") or 1), 1)
        dst, src = a.get("dstDevice"), None
    elif "2D" in b or "3D" in b:
        d, n, dst, src = "2D", 0, None, None
    else:
        d = next((k for k in ("HtoD", "DtoH", "DtoD", "HtoA", "AtoH", "DtoA", "AtoD", "AtoA") if k in b), "other")
        n = int(a.get("ByteCount") or 0)
        dst = a.get("dstDevice", a.get("dst"))
        src = a.get("srcDevice", a.get("src"))
    rs = a.get("hStream") or 0
    try:
        live = rv.stream(rec, rs) if "Async" in f else rv.driver.CUstream(0)
    except Exception:
        live = None
    return CopyEvent(rec.get("s"), f, d, n, dst if isinstance(dst, int) else None,
                     src if isinstance(src, int) else None, live, rs if isinstance(rs, int) else 0, rec, rv)


class LaunchContext:
    """What a subscriber may do around one launch: read device memory, ask for this launch to
    be timed with CUDA events, relaunch it (profilers)."""

    def __init__(self, rv, ev: "LaunchEvent"):
        self.replay = rv
        self._ev = ev
        self.timing_requested = False
        self._ev0 = self._ev1 = None

    @property
    def capturing(self) -> bool:
        """A recorded stream capture is in progress: synchronizing now would break it."""
        return self.replay.capturing

    # -- memory
    def translate(self, addr: int) -> int:
        return self.replay.translate(addr)

    def read_device(self, addr: int, n: int, sync: bool = True) -> bytes:
        """Bytes at device address `addr` (recorded or live; recorded ones are translated).
        Synchronizes the context first, so after_launch sees the kernel's result."""
        rv = self.replay
        if self.capturing:
            raise RuntimeError("read_device during a recorded stream capture (the launch has not run yet)")
        if sync:
            rv.call("cuCtxSynchronize")
        buf = bytearray(n)
        if n:
            rv.call("cuMemcpyDtoH", buf, rv.translate(addr), n)
        return bytes(buf)

    def allocation_of(self, addr: int) -> Optional[Tuple[int, int]]:
        """(live base, size) of the replayed allocation holding recorded address `addr`."""
        a = self.replay.find(addr)
        return (a.live_base, a.size) if a is not None else None

    # -- timing
    def request_timing(self) -> None:
        """Record CUDA events around this launch; read the result with event.elapsed_ms()
        in after_launch (it synchronizes on the end event).  Call in before_launch."""
        self.timing_requested = True

    def _record(self, which: int) -> None:
        rv = self.replay
        e = rv.call("cuEventCreate", 0)
        rv.call("cuEventRecord", e, self._ev.stream)
        if which == 0:
            self._ev0 = e
        else:
            self._ev1 = e

    def elapsed_ms(self) -> Optional[float]:
        if self._ev0 is None or self._ev1 is None:
            return None
        rv = self.replay
        rv.call("cuEventSynchronize", self._ev1)
        ms = float(rv.call("cuEventElapsedTime", self._ev0, self._ev1))
        for e in (self._ev0, self._ev1):
            try:
                rv.driver.cuEventDestroy(e)
            except Exception:
                pass
        self._ev0 = self._ev1 = None
        self._ms = ms
        return ms

    # -- relaunch (profilers)
    def relaunch(self, stream=None) -> None:
        """Launch the same kernel with the same (live) parameters again, on `stream` (default:
        the recorded launch's stream).  Raises DriverCallError."""
        ev, rv = self._ev, self.replay
        s = ev.stream if stream is None else stream
        base = base_name(ev.call)
        if in_class(base, "config_launch") and ev.config is not None and not int(ev.config.numAttrs):
            c = ev.config      # no attributes: the same launch as cuLaunchKernel
            p = LaunchParams(ev.params)
            rv.call("cuLaunchKernel", rv.bound_function(ev.function), c.gridDimX, c.gridDimY, c.gridDimZ,
                       c.blockDimX, c.blockDimY, c.blockDimZ, c.sharedMemBytes, s, None, p.extra_ptr)
            return
        if in_class(base, "config_launch") and ev.config is not None:
            cfg = ev.config
            old = cfg.hStream
            cfg.hStream = s
            try:
                p = LaunchParams(ev.params)
                rv.call("cuLaunchKernelEx", cfg, rv.bound_function(ev.function), None, p.extra_ptr)
            finally:
                cfg.hStream = old
            return
        if in_class(base, "cooperative_launch"):
            p = LaunchParams(ev.params, ev.layout or [])
            rv.call("cuLaunchCooperativeKernel", rv.bound_function(ev.function), *ev.grid, *ev.block, ev.shmem, s, p.kp_ptr)
            return
        p = LaunchParams(ev.params)
        rv.call("cuLaunchKernel", rv.bound_function(ev.function), *ev.grid, *ev.block, ev.shmem, s, None, p.extra_ptr)


@dataclass
class LaunchEvent:
    seq: Optional[int]                 # the launch's call sequence number (as `dump` shows)
    index: int                         # 0-based ordinal among replayed launches
    call: str                          # cuLaunchKernel, cuLaunchKernelEx_ptsz, ...
    name: str                          # kernel name as recorded
    grid: Tuple[int, int, int]
    block: Tuple[int, int, int]
    shmem: int
    stream: Any                        # live CUstream
    rec_stream: int                    # recorded stream handle (0 = default)
    params: bytes                      # packed parameter bytes as launched (relocated)
    rec_params: bytes                  # as recorded
    layout: Optional[List[Tuple[int, int]]]   # [(offset, size), ...] from the fn record
    module: Optional[int]              # recorded module/library handle
    function: Any                      # live CUfunction
    rec_function: Optional[int]
    config: Any = None                 # CUlaunchConfig for cuLaunchKernelEx
    ctx: Optional[LaunchContext] = None
    data: Dict[str, Any] = field(default_factory=dict)   # per-launch scratch for subscribers

    def param_values(self) -> List[bytes]:
        """Each parameter's bytes, by the recorded layout (one blob if no layout)."""
        if not self.layout:
            return [self.params]
        return [self.params[o:o + s] for o, s in self.layout]

    def pointer_params(self) -> List[Tuple[int, int]]:
        """(index, value) of 8-byte parameters that hold a replayed device address."""
        out = []
        rv = self.ctx.replay if self.ctx else None
        items = self.layout or [(o, 8) for o in range(0, len(self.params) - 7, 8)]
        for i, (o, s) in enumerate(items):
            if s != 8 or o + 8 > len(self.rec_params):
                continue
            v = int.from_bytes(self.rec_params[o:o + 8], "little")
            if v >= 0x10000 and (rv is None or rv.find(v) is not None):
                out.append((i, v))
        return out

    def elapsed_ms(self) -> Optional[float]:
        return self.ctx.elapsed_ms() if self.ctx else None


def make_launch_event(rv, rec, fn, params: bytes, name: str, cfg=None) -> LaunchEvent:
    a = rec.get("a") or {}
    f = rec.get("f") or ""
    h = a.get("f")
    fr = rv.function_record(h, rec.get("s")) or {}
    if cfg is not None:
        grid = (int(cfg.gridDimX), int(cfg.gridDimY), int(cfg.gridDimZ))
        block = (int(cfg.blockDimX), int(cfg.blockDimY), int(cfg.blockDimZ))
        shmem = int(cfg.sharedMemBytes)
        raw = a.get("config")
        rs = LAUNCH_CONFIG.unpack_from(bytes(raw))[7] if isinstance(raw, (bytes, bytearray)) and len(raw) >= LAUNCH_CONFIG.size else 0
        live_s = cfg.hStream
    else:
        grid = (int(a.get("gridDimX", 1)), int(a.get("gridDimY", 1)), int(a.get("gridDimZ", 1)))
        block = (int(a.get("blockDimX", 1)), int(a.get("blockDimY", 1)), int(a.get("blockDimZ", 1)))
        shmem = int(a.get("sharedMemBytes", 0))
        rs = a.get("hStream") or 0
        live_s = rv.stream(rec, rs)
    layout = fr.get("params")
    layout = [tuple(p) for p in layout] if layout else None
    rec_params = bytes((rec.get("x") or {}).get("params") or b"")
    ev = LaunchEvent(rec.get("s"), rv.launches, f, name, grid, block, shmem, live_s, rs if isinstance(rs, int) else 0,
                     bytes(params), rec_params, layout, fr.get("module", rv.module_of(h)), fn, h, cfg)
    ev.ctx = LaunchContext(rv, ev)
    return ev
