"""NVTX ranges named after the recorded calls and kernels, so `nsys` and `ncu` run over a
replay (`ncu -- cudasnap replay X.cusnap --nvtx`) show recorded names.  Each call is a range
"cuMemcpyHtoD_v2 #12"; each launch also gets a nested range named after its kernel.

Uses the `nvtx` package when importable, else libnvToolsExt through ctypes, else nothing."""
from __future__ import annotations

import ctypes
from typing import Callable, Optional

DOMAIN = "cudasnap"


class _Backend:
    def push(self, msg: str) -> None: ...

    def pop(self) -> None: ...


class _Pkg(_Backend):
    def __init__(self):
        import nvtx
        self.nvtx = nvtx

    def push(self, msg: str) -> None:
        self.nvtx.push_range(message=msg, domain=DOMAIN)

    def pop(self) -> None:
        self.nvtx.pop_range(domain=DOMAIN)


class _Lib(_Backend):
    def __init__(self):
        lib = None
        for n in ("libnvToolsExt.so.1", "libnvToolsExt.so"):
            try:
                lib = ctypes.CDLL(n)
                break
            except OSError:
                continue
        if lib is None:
            raise OSError("libnvToolsExt not found")
        self._push, self._pop = lib.nvtxRangePushA, lib.nvtxRangePop
        self._push.argtypes = [ctypes.c_char_p]

    def push(self, msg: str) -> None:
        self._push(msg.encode("utf-8", "replace"))

    def pop(self) -> None:
        self._pop()


def backend() -> Optional[_Backend]:
    for cls in (_Pkg, _Lib):
        try:
            return cls()
        except Exception:
            continue
    return None


class NvtxEmitter:
    label = "nvtx"
    wants_calls = True

    def __init__(self, warn: Callable[[str], None] = lambda m: None, impl: Optional[_Backend] = None):
        self.impl = impl or backend()
        if self.impl is None:
            warn("NVTX: neither the nvtx package nor libnvToolsExt is available; no ranges emitted")
        self.depth = 0
        self.pushed = 0

    def _push(self, msg: str) -> None:
        self.impl.push(msg)
        self.depth += 1
        self.pushed += 1

    def _pop(self) -> None:
        if self.depth > 0:
            self.impl.pop()
            self.depth -= 1

    def on_event(self, kind: str, ev) -> None:
        if self.impl is None:
            return
        if kind == "before_call":
            while self.depth:          # a call that failed left its range open
                self._pop()
            self._push(f"{ev.call} #{ev.seq}")
        elif kind == "after_call":
            while self.depth:
                self._pop()
        elif kind == "before_launch":
            self._push(ev.name)
        elif kind == "after_launch":
            self._pop()
        elif kind == "end":
            while self.depth:
                self._pop()
