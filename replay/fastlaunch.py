"""Launch fast path of the replay engine: runs a batch of plain kernel launches in one call.

A batch (engine._Batch) holds the distinct launch descriptors of a run of consecutive
launches and, per launch, the index of its descriptor.  Two backends launch it:

- NativeLauncher: cudasnap.replay._fastlaunch (replay/build_fastlaunch.py), a small C loop
  over cuLaunchKernel resolved through cuGetProcAddress_v2 with the version and flags
  cuda-bindings uses, so it is the entry point the slow path calls;
- PyLauncher: the same loop through cuda-bindings (when the C module is not built).

Both launch in order and stop at the first failing launch: run() returns (launched, code,
t_first, t_last); launched < n means launch `launched` failed with CUresult `code`.
Timestamps are time.monotonic() values taken after the first and the last launch."""
from __future__ import annotations

import os
import time
from typing import Any, List, Optional, Sequence, Tuple

CU_LAUNCH_PARAM_END, CU_LAUNCH_PARAM_BUFFER_POINTER, CU_LAUNCH_PARAM_BUFFER_SIZE = 0, 1, 2
BINDINGS_LAUNCH_VERSION = 4000     # what cuda-bindings asks cuGetProcAddress for (cuLaunchKernel)


def _bindings_flags() -> int:
    """cuGetProcAddress flags cuda-bindings uses: per-thread default stream when asked for."""
    v = os.environ.get("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "")
    return 2 if v not in ("", "0") else 0


class NativeLauncher:
    name = "native"

    def __init__(self, mod):
        self.mod = mod
        self.ffi, self.lib = mod.ffi, mod.lib
        err = self.ffi.new("char[]", 256)
        rc = self.lib.fl_init(BINDINGS_LAUNCH_VERSION, _bindings_flags(), err, 256)
        if rc != 0:
            raise RuntimeError(self.ffi.string(err).decode(errors="replace"))
        self._code = self.ffi.new("int *")
        self._t = self.ffi.new("double[2]")

    def prepare(self, live: Sequence[Tuple[int, Tuple[int, int, int], Tuple[int, int, int], int, int, bytes]]):
        """live: per descriptor (function, grid, block, shmem, stream, params).  Returns an
        opaque object for run() (it keeps the parameter bytes alive)."""
        ffi = self.ffi
        arr = ffi.new("fl_desc[]", max(len(live), 1))
        keep = []
        for j, (fn, grid, block, shm, stream, params) in enumerate(live):
            d = arr[j]
            d.func = fn
            d.grid = grid
            d.block = block
            d.shmem = shm
            d.stream = stream
            if params:
                buf = ffi.from_buffer(params)
                keep.append(buf)
                d.params = buf
                d.size = len(params)
        return arr, keep

    def run(self, prepared, idx, start: int, n: int):
        arr, _keep = prepared
        ffi = self.ffi
        ip = ffi.from_buffer("uint32_t[]", idx)
        t = self._t
        t[0] = t[1] = 0.0
        done = self.lib.fl_launch(arr, ip + start, n - start, self._code, t, t + 1)
        return int(done), int(self._code[0]), (t[0] if done else None), (t[1] if done else None)

    def current(self) -> int:
        """Index (relative to run()'s start) of the launch in progress; for the watchdog."""
        return int(self.lib.fl_current())


class PyLauncher:
    """The batch loop through cuda-bindings (no C module)."""
    name = "python"

    def __init__(self, cu):
        self.cu = cu
        self._cur = 0

    def current(self) -> int:
        return self._cur

    def prepare(self, live):
        from .handlers.launch import _Params
        cu = self.cu
        out = []
        for fn, grid, block, shm, stream, params in live:
            p = _Params(params)
            out.append((cu.CUfunction(fn), grid, block, shm, cu.CUstream(stream), p, p.extra_ptr))
        return out

    def run(self, prepared, idx, start: int, n: int):
        launch = self.cu.cuLaunchKernel
        t_first = t_last = None
        i = start
        for i in range(start, n):
            self._cur = i - start
            fn, (gx, gy, gz), (bx, by, bz), shm, s, _p, extra = prepared[idx[i]]
            r = launch(fn, gx, gy, gz, bx, by, bz, shm, s, None, extra)
            code = int(r[0])
            if code != 0:
                return i - start, code, t_first, t_last
            t_last = time.monotonic()
            if t_first is None:
                t_first = t_last
        return n - start, 0, t_first, t_last


def make_launcher(cu) -> Optional[Any]:
    """The native launcher when the C module loads and resolves cuLaunchKernel, else the
    cuda-bindings loop; None when CUDASNAP_FASTPATH=0 (slow path only)."""
    mode = os.environ.get("CUDASNAP_FASTPATH", "1")
    if mode == "0":
        return None
    if mode != "python":
        try:
            from . import _fastlaunch  # type: ignore
            return NativeLauncher(_fastlaunch)
        except Exception:
            pass
    return PyLauncher(cu)


def native_available() -> bool:
    try:
        from . import _fastlaunch  # type: ignore  # noqa: F401
        return True
    except Exception:
        return False
