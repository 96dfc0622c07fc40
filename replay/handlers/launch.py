"""Launch family: cuLaunchKernel(_ptsz), cuLaunchCooperativeKernel, cuLaunchKernelEx with the
recorded packed parameter bytes (passed through the `extra` buffer form: no layout needed)."""
from __future__ import annotations

import time

import ctypes

from cudasnap.formats.layout import recorded_stream, sizeof
from cudasnap.formats.vocab import in_class
from ..placement import relocate_params
from .graph import patch_conditional_handles
from ..functions import resolve_function
from ..params import LAUNCH_CONFIG, LaunchParams

LAUNCH_ATTR_SIZE = sizeof("CUlaunchAttribute")  # id, pad, 64-byte value union


def _managed_uploads(ctx, rec, x) -> None:
    """Managed or mapped pinned memory the host wrote without a copy call, recorded with this
    launch (its arguments reach it): written back at its address before the kernel runs."""
    for m in x.get("hostmem") or ():
        data = ctx.blob_of(rec, m, "host-written memory") if isinstance(m, dict) else None
        if data is None or not isinstance(m.get("addr"), int):
            ctx.note_once("hostmem_lost", f"call #{rec.get('s')}: memory the host wrote, recorded with this launch, is "
                                          f"missing from the snapshot; the kernel reads what the replay holds there")
            continue
        h = ctx.space.find(m["addr"]) if ctx.space is not None else None
        if h is None:
            ctx.note_once("hostmem_gone", f"call #{rec.get('s')}: memory the host wrote at {m['addr']:#x} is not a "
                                          f"replayed allocation; not written back")
        elif h.kind == "host":                      # pinned host memory: written in place
            ctypes.memmove(h.live_base + (m["addr"] - h.rec_base), data, len(data))
        else:
            ctx.drv(rec, "cuMemcpyHtoD", ctx.tr(m["addr"]), data, len(data))


def _prepare(ctx, rec):
    a = rec["a"]
    x = rec.get("x") or {}
    _managed_uploads(ctx, rec, x)
    params = x.get("params")
    h = a.get("f")
    name = ctx.kernel_name_of(h, rec.get("s"))
    if params is None:
        ctx.fail(rec, f"kernel parameters of {name} were not captured (x.params missing); cannot launch")
    params = bytes(params)
    fn = resolve_function(ctx, rec, h)
    layout = (ctx.fn_record(h, rec.get("s")) or {}).get("params")
    # the kernel writes (as far as we can tell) every allocation its pointer parameters reach
    seq = rec.get("s")
    for off in range(0, len(params) - 7, 8):
        v = int.from_bytes(params[off:off + 8], "little")
        if v >= 0x10000:
            ctx.mark_written(v, seq, name)
    if ctx.space is not None and ctx.space.moved:
        params, changes = relocate_params(params, layout, ctx.space, getattr(ctx.cu, "moves_all_memory", False))
        ctx.res.params_relocated += len(changes)
    params = patch_conditional_handles(ctx, rec, params, layout)
    return fn, params, layout, name


def _capturing(ctx, rec) -> bool:
    hs = recorded_stream(rec["f"], rec["a"])
    return ctx.stream_capturing(hs, ctx.stream(rec, hs))


def _after(ctx, rec, name, ev=None):
    ctx.res.launches += 1
    now = time.monotonic()
    if ctx.res.first_launch_mono is None:
        ctx.res.first_launch_mono, ctx.res.first_launch_unix = now, time.time()
    ctx.res.last_launch_mono = now
    ctx.after_launch(ev)
    # a launch on a capturing stream became a graph node: a sync now would break the capture
    if ctx.opt.sync_after_launch and rec.get("r", 0) == 0 and not _capturing(ctx, rec):
        r = ctx.cu.cuCtxSynchronize()
        if int(r[0]) != 0:
            from cudasnap.formats import cu_result_name
            ctx.fail(rec, f"kernel {name} failed: {cu_result_name(int(r[0]))} (--sync-after-launch)")


def launch_kernel(ctx, rec):
    a = rec["a"]
    fn, params, _layout, name = _prepare(ctx, rec)
    p = LaunchParams(params)
    ev = ctx.before_launch(rec, fn, params, name)
    ctx.drv(rec, "cuLaunchKernel", fn, a.get("gridDimX", 1), a.get("gridDimY", 1), a.get("gridDimZ", 1),
           a.get("blockDimX", 1), a.get("blockDimY", 1), a.get("blockDimZ", 1), a.get("sharedMemBytes", 0),
           ctx.stream(rec, a.get("hStream")), None, p.extra_ptr)
    _after(ctx, rec, name, ev)


def launch_cooperative(ctx, rec):
    a = rec["a"]
    fn, params, layout, name = _prepare(ctx, rec)
    if layout is None and params:
        ctx.fail(rec, f"cooperative launch of {name} needs the parameter layout (no fn record)")
    p = LaunchParams(params, layout or [])
    ev = ctx.before_launch(rec, fn, params, name)
    ctx.drv(rec, "cuLaunchCooperativeKernel", fn, a.get("gridDimX", 1), a.get("gridDimY", 1), a.get("gridDimZ", 1),
           a.get("blockDimX", 1), a.get("blockDimY", 1), a.get("blockDimZ", 1), a.get("sharedMemBytes", 0),
           ctx.stream(rec, a.get("hStream")), p.kp_ptr)
    _after(ctx, rec, name, ev)


def build_config(ctx, rec, cfg_bytes: bytes, attrs: bytes):
    cu = ctx.cu
    if not isinstance(cfg_bytes, (bytes, bytearray)) or len(cfg_bytes) < LAUNCH_CONFIG.size:
        ctx.fail(rec, "the CUlaunchConfig struct was not captured")
    gx, gy, gz, bx, by, bz, shm, hs, _attrp, nattr = LAUNCH_CONFIG.unpack_from(cfg_bytes)
    c = cu.CUlaunchConfig()
    c.gridDimX, c.gridDimY, c.gridDimZ = gx, gy, gz
    c.blockDimX, c.blockDimY, c.blockDimZ = bx, by, bz
    c.sharedMemBytes = shm
    c.hStream = ctx.stream(rec, hs)
    lst = []
    attrs = bytes(attrs or b"")
    for i in range(min(nattr, len(attrs) // LAUNCH_ATTR_SIZE)):
        at = cu.CUlaunchAttribute()
        ctypes.memmove(int(at.getPtr()), attrs[i * LAUNCH_ATTR_SIZE:(i + 1) * LAUNCH_ATTR_SIZE], LAUNCH_ATTR_SIZE)
        lst.append(at)
    if nattr and len(lst) != nattr:
        ctx.fail(rec, f"launch attributes were not captured ({nattr} expected)")
    if lst:
        c.attrs = lst
    c.numAttrs = len(lst)
    return c


def launch_kernel_ex(ctx, rec):
    a = rec["a"]
    fn, params, _layout, name = _prepare(ctx, rec)
    cfg = build_config(ctx, rec, a.get("config"), (rec.get("x") or {}).get("attrs"))
    p = LaunchParams(params)
    ev = ctx.before_launch(rec, fn, params, name, cfg)
    ctx.drv(rec, "cuLaunchKernelEx", cfg, fn, None, p.extra_ptr)
    _after(ctx, rec, name, ev)


def host_func(ctx, rec):
    """A host function of the recorded process cannot run: a no-op C function takes its place,
    so the stream waits there as it did and a stream capture gets its host node (a program that
    lists the captured graph's nodes finds them where they were). Where no stand-in can be
    enqueued the call is left out: the stream's order holds without it."""
    from ..executor import host_stand_in
    from ..driverops import handle_int
    f = rec["f"]
    stream = handle_int(ctx.stream(rec, rec["a"].get("hStream")))
    code = host_stand_in(ctx.cu, stream, in_class(f, "stream_callback"), f.endswith("_ptsz"))
    if code is None:
        ctx.res.skipped += 1
    elif code != 0 and rec.get("r", 0) == 0:
        ctx.fail(rec, ctx.new_error_text(code, f))
    ctx.note_once("hostfn", f"call #{rec.get('s')} {f}: host callbacks of the recorded process are not run"
                            + (" (a no-op stands in for each)" if code is not None else ""))
