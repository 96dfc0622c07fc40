"""The C executor of replay plans (cudasnap.replay._executor, built by
replay/build_executor.py): runs a range of an OpBatch's ops (replay/plan.py) in one call.

CUDASNAP_FASTPATH selects the path: 1 (default) the C executor; python: the plan's batches
replayed through the handlers, op by op; 0: no plan, every call through its handler."""
from __future__ import annotations

import os
from typing import Optional, Tuple

NEED_SLOW = -1                  # the op must take its handler (an empty slot, no entry point)
MISMATCH = -2                   # a D2H result differs from the recording: its handler reports it


def _per_thread() -> int:
    """cuGetProcAddress flags cuda-bindings uses: per-thread default stream when asked for."""
    v = os.environ.get("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "")
    return 1 if v not in ("", "0") else 0


def mode() -> str:
    return os.environ.get("CUDASNAP_FASTPATH", "1")


def module():
    """The cffi module, or None when it is not built."""
    try:
        from . import _executor  # type: ignore
        return _executor
    except Exception:
        return None


def host_stand_in(cu, stream: int, callback: bool, per_thread: bool) -> Optional[int]:
    """Enqueue a no-op C function where the recording had a host function (cuLaunchHostFunc,
    or cuStreamAddCallback when callback) on the live stream: the CUresult, or None where it
    cannot be had (bindings that are not the driver's, no C executor, no entry point)."""
    mod = module()
    if mod is None or getattr(cu, "__name__", "") != "cuda.bindings.driver":
        return None
    r = mod.lib.ex_host_func(stream, 1 if callback else 0, 1 if per_thread else 0)
    return None if r < 0 else r


class NativeExecutor:
    name = "native"

    def __init__(self, mod):
        self.ffi, self.lib = mod.ffi, mod.lib
        err = self.ffi.new("char[]", 256)
        if self.lib.ex_init(_per_thread(), err, 256) != 0:
            raise RuntimeError(self.ffi.string(err).decode(errors="replace"))
        self._code = self.ffi.new("int *")
        self._t = self.ffi.new("double[2]")
        self._nsync = self.ffi.new("int64_t *")
        self._sync = self.ffi.new("double[]", 1)

    def has(self, kind: int) -> bool:
        return bool(self.lib.ex_has(kind))

    def run(self, b, start: int, end: int, slots, pace_base: float = 0.0
            ) -> Tuple[int, int, Optional[float], Optional[float], list]:
        """Run b.ops[start, end).  Returns (stopped at, code, t_first, t_last, sync times)."""
        t = self._t
        t[0] = t[1] = 0.0
        if b.nsync > len(self._sync):
            self._sync = self.ffi.new("double[]", b.nsync)
        self._nsync[0] = 0
        i = self.lib.ex_run(b.ops, start, end, slots.values, self._code, t, t + 1,
                            self._sync, len(self._sync), self._nsync, pace_base)
        ns = self._nsync[0]
        syncs = [self._sync[k] for k in range(ns)] if ns else []
        return int(i), int(self._code[0]), (t[0] or None), (t[1] or None), syncs

    def current(self) -> int:
        """Index of the op in progress; for the watchdog."""
        return int(self.lib.ex_current())

    def now(self) -> float:
        return float(self.lib.ex_now())


def make_executor() -> Optional[NativeExecutor]:
    """The C executor when CUDASNAP_FASTPATH=1 and the module loads and resolves the driver;
    else None (batches replay through the handlers)."""
    if mode() != "1":
        return None
    mod = module()
    if mod is None:
        return None
    return NativeExecutor(mod)
