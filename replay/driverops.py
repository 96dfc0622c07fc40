"""Driver adapters for the engine: result codes, the placement manager's driver operations,
and the watchdog."""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Optional

from .errors import DriverCallError  # noqa: F401  (re-exported: callers import it from here)


def result_code(err) -> int:
    """A CUresult from cuda-python (an enum member or an int) as an int."""
    try:
        return int(err)
    except Exception:
        return int(getattr(err, "value", 1))


def handle_int(x) -> int:
    """A cuda-python handle or pointer (CUdeviceptr, CUcontext, ..., an int or None) as an int."""
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
        self.others: list = []          # other GPUs of a several-GPU replay (replay/devices.py)
        self._reach: dict = {}

    def follow_context(self, live: list) -> None:
        """Several GPUs: memory goes to the current context's GPU, reachable from the others
        that can access it."""
        self.others = list(live)

    def current(self) -> int:
        if not self.others:
            return self.device
        try:
            res = self.cu.cuCtxGetDevice()
            if result_code(res[0]) == 0:
                return int(res[1])
        except Exception:
            pass
        return self.device

    def _reaching(self, dev: int) -> list:
        """dev, then the other GPUs of the replay that can access dev's memory."""
        if dev not in self._reach:
            out = [dev]
            for d in self.others:
                if d == dev:
                    continue
                try:
                    res = self.cu.cuDeviceCanAccessPeer(self.cu.CUdevice(d), self.cu.CUdevice(dev))
                    if result_code(res[0]) == 0 and int(res[1]):
                        out.append(d)
                except Exception:
                    pass
            self._reach[dev] = out
        return self._reach[dev]

    def _c(self, name, *args):
        res = getattr(self.cu, name)(*args)
        code = result_code(res[0])
        if code != 0:
            raise DriverCallError(name, code)
        return res[1] if len(res) == 2 else res[1:]

    def prop(self):
        cu = self.cu
        p = cu.CUmemAllocationProp()
        p.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        p.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        p.location.id = self.current()
        if os.environ.get("CUDASNAP_GROUP_SOCKET"):
            # a group replay may hand placed memory to another rank (legacy IPC): exportable
            p.requestedHandleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        return p

    def granularity(self) -> int:
        cu = self.cu
        return int(self._c("cuMemGetAllocationGranularity", self.prop(),
                           cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM))

    def reserve(self, size: int, addr: int, align: int = 0) -> int:
        return handle_int(self._c("cuMemAddressReserve", size, align, addr, 0))

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
        descs = []
        for dev in self._reaching(self.current()):
            d = cu.CUmemAccessDesc()
            d.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            d.location.id = dev
            d.flags = (cu.CUmemAccess_flags(flags) if flags is not None
                       else cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            descs.append(d)
        self._c("cuMemSetAccess", addr, size, descs, len(descs))

    def mem_alloc(self, size: int) -> int:
        return handle_int(self._c("cuMemAlloc", max(size, 1)))

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

    @staticmethod
    def _dump_stacks() -> None:
        """CUDASNAP_WATCHDOG_STACKS=DIR: every thread's Python stack, to DIR/watchdog.PID.txt
        (where the replay waited, for a hang report)."""
        d = os.environ.get("CUDASNAP_WATCHDOG_STACKS")
        if not d:
            return
        import faulthandler
        try:
            with open(os.path.join(d, f"watchdog.{os.getpid()}.txt"), "w") as f:
                faulthandler.dump_traceback(f, all_threads=True)
        except OSError:
            pass

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
                    self._dump_stacks()
                finally:
                    try:                            # what this process was writing goes
                        from cudasnap.formats.outputs import remove_temporaries
                        remove_temporaries()
                    finally:
                        os._exit(2)
