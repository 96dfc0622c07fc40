"""What a replay subscriber sees of the running replay (`event.replay`, called `rv` in code).

Profilers, hooks and the extractor work on the live driver state a replay built: they call
the driver, translate recorded addresses, look up the replayed allocations, streams and
functions, and read the snapshot's records. They get this narrow view, not the Replayer:
they cannot reach the replay's handle tables, its result object or its handlers, and what
they may change (hold frees for a later profile, defer code unloads, add a warning or an
error) is a named method here.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from .functions import bound_function, resolve_function

# allocation kinds a kernel writes (placement.Alloc.kind): placed or fallen back, module globals
WRITABLE_KINDS = ("placed", "fallback", "global")


class ReplayView:
    __slots__ = ("_rp", "_ctx")

    def __init__(self, replayer):
        self._rp = replayer
        self._ctx = replayer.ctx

    # -- the run
    @property
    def path(self) -> str:
        """The snapshot being replayed."""
        return self._rp.path

    @property
    def options(self):
        """The ReplayOptions of this replay, to read (the engine reads the same object)."""
        return self._ctx.opt

    @property
    def snapshot(self):
        """The open snapshot: `records(kinds)`, `header`, `raw_header` (formats/reader.py)."""
        return self._ctx.reader

    @property
    def launches(self) -> int:
        """Launches replayed so far."""
        return self._ctx.res.launches

    @property
    def errors(self) -> Tuple[str, ...]:
        """The replay's errors so far (a copy)."""
        return tuple(self._ctx.res.errors)

    @property
    def initialized(self) -> bool:
        """The driver is initialized and the device is known."""
        return bool(self._rp.initialized)

    def subscribe(self, sub, first: bool = False) -> None:
        """Add a subscriber (once); first: before the others (a job rank's hook, whose waits
        must come before a caller's reads)."""
        subs = self._rp.subscribers
        if sub not in subs:
            subs.insert(0, sub) if first else subs.append(sub)

    def pace_origin(self) -> Optional[int]:
        """--pace recorded: the recorded time (ns) of the first replayed call, else None."""
        return self._rp.pace_origin()

    def pace_start_at(self, mono_s: float) -> None:
        """--pace recorded: start the first call at this time.monotonic() value (the ranks of a
        job replay start together)."""
        self._rp.pace_start_at(mono_s)

    def warn(self, msg: str) -> None:
        """A warning in the replay's result."""
        self._ctx.note(msg)

    def fail(self, msg: str) -> None:
        """An error in the replay's result: the replay exits 2 (a subscriber that was asked to
        change the replay and could not)."""
        self._ctx.res.errors.append(msg)

    # -- the driver and the device
    @property
    def driver(self):
        """The driver binding the replay calls (cuda.bindings.driver, or the test double's)."""
        return self._ctx.cu

    def call(self, name: str, *args):
        """A driver call outside the recorded calls; raises DriverCallError on an error code."""
        return self._ctx.raw(name, *args)

    @property
    def device(self):
        """The live CUdevice of the replay (None before the driver's start)."""
        return self._ctx.dev

    @property
    def device_cc(self) -> Optional[Tuple[int, int]]:
        return self._ctx.device_cc

    # -- memory
    def translate(self, addr) -> int:
        """The live address of a recorded device address."""
        return self._ctx.tr(addr)

    def find(self, addr):
        """The replayed allocation holding recorded address `addr` (rec_base, live_base, size),
        or None."""
        sp = self._ctx.space
        return sp.find(addr) if sp is not None else None

    def recorded_allocations(self) -> List[Any]:
        """Every allocation the replay placed or mapped, by recorded address: objects with
        rec_base, live_base, size and kind (placed, fallback, global, vmm...)."""
        sp = self._ctx.space
        return sp.in_order() if sp is not None else []

    def writable_ranges(self) -> List[Tuple[int, int]]:
        """(live base, size) of everything a kernel can write: replayed allocations and module
        globals, the program's own VMM mappings, and memory held by hold_frees."""
        sp = self._ctx.space
        if sp is None:
            return []
        out = [(a.live_base, a.size) for a in sp.allocs.values() if a.kind in WRITABLE_KINDS]
        return out + list(sp.mappings.items()) + sp.held_ranges()

    def writable_range_of(self, value: int) -> Optional[Tuple[int, int]]:
        """The live (base, size) of the writable memory a recorded pointer value points into:
        a replayed allocation, a program's VMM mapping, else whatever range the driver knows."""
        sp = self._ctx.space
        a = sp.find(value) if sp is not None else None
        if a is not None and a.kind in WRITABLE_KINDS:
            return (a.live_base, a.size)
        live = self._ctx.tr(value)
        m = sp.find_mapping(live) if sp is not None else None
        if m is not None:
            return m
        try:  # memory the placement does not know
            base, size = self._ctx.raw("cuMemGetAddressRange", live)
            return (int(base), int(size))
        except Exception:
            return None

    def hold_frees(self) -> None:
        """From now on, freed allocations stay mapped until release_held_memory (a profile
        replays the program's work after the program freed its memory)."""
        if self._ctx.space is not None:
            self._ctx.space.hold_frees()

    def release_held_memory(self) -> int:
        """Free what hold_frees kept; the count."""
        sp = self._ctx.space
        return sp.release_held() if sp is not None else 0

    def run_held_frees(self) -> None:
        """Run the recorded calls that free memory, held while a subscriber's `holds_releases`
        was true (a job rank profiled at the replay's end)."""
        self._rp.release_held()

    def host_bytes(self, rec, key: str) -> Optional[bytes]:
        """The recorded host bytes of argument `key` of call record `rec` (an H2D source)."""
        return self._ctx.blob(rec, key)

    def h2d_payload(self, rec, data: bytes) -> bytes:
        """Recorded H2D bytes as the replay copies them (recorded addresses inside relocated)."""
        return self._ctx.h2d_payload(rec, data)

    # -- streams, handles, functions
    def stream(self, rec, rec_stream):
        """The live stream of a recorded stream handle in call record `rec` (0: the default)."""
        return self._ctx.stream(rec, rec_stream)

    @property
    def capturing(self) -> bool:
        """A recorded stream capture is in progress: synchronizing now would break it."""
        return bool(self._ctx.capturing)

    def stream_capturing(self, rec_stream, live_stream=None) -> bool:
        return self._ctx.stream_capturing(rec_stream, live_stream)

    def live_handle(self, rec, rec_handle, what: str = "handle"):
        """The live handle of a recorded one (a graph exec, an event...)."""
        return self._ctx.live(rec, rec_handle, what)

    def kernel_name(self, rec_function, seq=None) -> str:
        return self._ctx.kernel_name_of(rec_function, seq)

    @property
    def function_names(self) -> Dict[int, str]:
        """Recorded function handle -> kernel name, as the replay resolved them."""
        return self._ctx.func_names

    def function_record(self, rec_function, seq=None) -> Optional[Dict[str, Any]]:
        """The snapshot's "fn" record of a recorded function (name, parameter layout, module)."""
        return self._ctx.fn_record(rec_function, seq)

    def module_of(self, rec_function) -> Optional[int]:
        return self._ctx.module_of.get(rec_function)

    def resolve_function(self, rec, rec_function):
        """The live CUfunction of a recorded function or kernel handle."""
        return resolve_function(self._ctx, rec, rec_function)

    def bound_function(self, fn):
        """The current context's CUfunction of a live function or library kernel."""
        return bound_function(self._ctx, fn)

    # -- code unloads (graph mode relaunches kernels after the program unloaded them)
    @property
    def unloads_deferred(self) -> bool:
        return self._ctx.unload_later is not None

    def defer_unloads(self) -> None:
        self._ctx.defer_unloads()

    def unload_deferred(self) -> None:
        self._ctx.unload_deferred()
