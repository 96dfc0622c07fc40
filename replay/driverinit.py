"""The driver's start for a replay (Replayer.ensure_init): cuInit, the device, its compute
capability, then placement: every recorded address range reserved before the first call maps
memory (placement.py)."""
from __future__ import annotations

import time
from typing import List, Tuple

from cudasnap.formats import cu_result_name

from .driverops import DriverOps, result_code
from .errors import DriverCallError, ReplayError
from .placement import AddressSpace


def init_driver(ctx, ranges: List[Tuple[int, int]], regions: List[Tuple[int, int]], ipc_shared: List[int]) -> None:
    """ranges: the recorded allocations; regions: capture's placement zones; ipc_shared:
    addresses shared through legacy IPC (their ranges are reserved alone)."""
    t0 = time.perf_counter()
    try:
        r = ctx.cu.cuInit(0)
    except Exception as e:  # the bindings could not load libcuda.so.1
        raise ReplayError(f"no CUDA driver: cannot load libcuda.so.1 ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''})")
    ctx.res.phases["cuinit"] = round(time.perf_counter() - t0, 4)
    if result_code(r[0]) != 0:
        raise ReplayError(f"cuInit failed: {cu_result_name(result_code(r[0]))} (no usable GPU or driver?)")
    try:
        cnt = ctx.raw("cuDeviceGetCount")
    except DriverCallError as e:
        raise ReplayError(f"cannot count devices: {e}")
    if not (0 <= ctx.opt.device < int(cnt)):
        raise ReplayError(f"--device {ctx.opt.device}: only {int(cnt)} device(s) present")
    ctx.dev = ctx.raw("cuDeviceGet", ctx.opt.device)
    try:
        mj = ctx.raw("cuDeviceGetAttribute", ctx.cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, ctx.dev)
        mn = ctx.raw("cuDeviceGetAttribute", ctx.cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, ctx.dev)
        ctx.device_cc = (int(mj), int(mn))
    except Exception:
        ctx.device_cc = None
    ctx.ops = DriverOps(ctx.cu, ctx.opt.device)
    try:
        gran = ctx.ops.granularity()
    except Exception:
        gran = 2 << 20
    ctx.space = AddressSpace(ctx.ops, gran)
    ctx.space.shared = {b for b, n in ranges if any(b <= d < b + max(n, 1) for d in ipc_shared)}
    ctx.space.plan(ranges, regions)
    ctx.space.reserve_all()
    if ctx.space.spans and all(s.refused for s in ctx.space.spans):
        # some drivers want a context for reservations: retain the primary one and retry
        try:
            pctx = ctx.raw("cuDevicePrimaryCtxRetain", ctx.dev)
            ctx.raw("cuCtxSetCurrent", pctx)
            ctx.space.reserve_all()
            ctx.raw("cuCtxSetCurrent", ctx.cu.CUcontext(0))
        except DriverCallError as e:
            ctx.note(f"placement: could not reserve with a context either: {e}")
