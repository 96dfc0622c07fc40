"""Driver adapters for the engine: result codes, the placement manager's driver operations,
and the watchdog."""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Optional

from .errors import DriverCallError  # noqa: F401  (re-exported: callers import it from here)


def _code(err) -> int:
    try:
        return int(err)
    except Exception:
        return int(getattr(err, "value", 1))


def _ival(x) -> int:
    if x is None:
        return 0
    try:
        return int(x)
    except TypeError:
        return int(getattr(x, "value", 0))


class DriverOps:
    """The few driver operations the address-space manager needs, over cuda.bindings."""

    def __init__(self, cu, device: int):
        self.cu, self.device = cu, device

    def _c(self, name, *args):
        res = getattr(self.cu, name)(*args)
        code = _code(res[0])
        if code != 0:
            raise DriverCallError(name, code)
        return res[1] if len(res) == 2 else res[1:]

    def prop(self):
        cu = self.cu
        p = cu.CUmemAllocationProp()
        p.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        p.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        p.location.id = self.device
        return p

    def granularity(self) -> int:
        cu = self.cu
        return int(self._c("cuMemGetAllocationGranularity", self.prop(),
                           cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM))

    def reserve(self, size: int, addr: int, align: int = 0) -> int:
        return _ival(self._c("cuMemAddressReserve", size, align, addr, 0))

    def free_va(self, addr: int, size: int) -> None:
        self._c("cuMemAddressFree", addr, size)

    def create(self, size: int):
        return self._c("cuMemCreate", size, self.prop(), 0)

    def map(self, addr: int, size: int, handle, offset: int = 0) -> None:
        self._c("cuMemMap", addr, size, offset, handle, 0)

    def unmap(self, addr: int, size: int) -> None:
        self._c("cuMemUnmap", addr, size)

    def release(self, handle) -> None:
        self._c("cuMemRelease", handle)

    def set_access(self, addr: int, size: int, flags: Optional[int] = None) -> None:
        cu = self.cu
        d = cu.CUmemAccessDesc()
        d.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        d.location.id = self.device
        d.flags = (cu.CUmemAccess_flags(flags) if flags is not None
                   else cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        self._c("cuMemSetAccess", addr, size, [d], 1)

    def mem_alloc(self, size: int) -> int:
        return _ival(self._c("cuMemAlloc", max(size, 1)))

    def mem_free(self, addr: int) -> None:
        self._c("cuMemFree", addr)


class Watchdog:
    """One thread; arm(desc) before a driver call, disarm() after.  A call running past the
    limit prints a clear error and exits the process with code 2."""

    def __init__(self, seconds: float, out=sys.stderr):
        self.seconds = seconds
        self.out = out
        self._deadline = None
        self._desc = ""
        self._lock = threading.Lock()
        t = threading.Thread(target=self._run, name="cudasnap-watchdog", daemon=True)
        t.start()

    def arm(self, desc: str) -> None:
        with self._lock:
            self._desc = desc
            self._deadline = time.monotonic() + self.seconds

    def disarm(self) -> None:
        with self._lock:
            self._deadline = None

    def _run(self) -> None:
        while True:
            time.sleep(min(0.1, self.seconds / 4))
            with self._lock:
                dl, desc = self._deadline, self._desc
            if dl is not None and time.monotonic() > dl:
                try:
                    self.out.write(f"cudasnap replay: watchdog: {desc} did not return within {self.seconds:g} s "
                                   f"(hung synchronization?); giving up\n")
                    self.out.flush()
                finally:
                    os._exit(2)
