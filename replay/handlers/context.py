"""Context family: init, primary contexts, created contexts, current-context stack, sync."""
from __future__ import annotations

from ..functions import preload_in


def _current(rp, rec, ctx) -> None:
    rp.cur_ctx[rec.get("tid")] = ctx


def init(rp, rec):
    rp.ensure_init(rec)


def _dev(rp, rec_dev):
    """The GPU a recorded device replays on (replay/devices.py)."""
    from ..devices import live_device
    return live_device(rp, rec_dev)


def primary_retain(rp, rec):
    ctx = rp.drv(rec, "cuDevicePrimaryCtxRetain", _dev(rp, rec["a"].get("dev")))
    if ctx is not None:
        rp.set_handle(rec["a"].get("pctx"), ctx, "context")
        preload_in(rp, ctx)


def primary_release(rp, rec):
    # Reset would drop every allocation and the placement reservations with them; replay
    # both as a release of one retain (the program's later calls re-create what they need).
    if "Reset" in rec["f"]:
        rp.note(f"call #{rec.get('s')} {rec['f']}: replayed as a release (placement is kept)")
    rp.drv(rec, "cuDevicePrimaryCtxRelease", _dev(rp, rec["a"].get("dev")))


def primary_set_flags(rp, rec):
    rp.drv(rec, "cuDevicePrimaryCtxSetFlags", _dev(rp, rec["a"].get("dev")), rec["a"].get("flags", 0))


def ctx_create(rp, rec):
    a = rec["a"]
    ctx = rp.drv(rec, "cuCtxCreate", None, a.get("flags", 0), _dev(rp, a.get("dev")))
    if ctx is not None:
        rp.set_handle(a.get("pctx"), ctx, "context")
        _current(rp, rec, ctx)
        preload_in(rp, ctx)


def ctx_destroy(rp, rec):
    ctx = rp.live(rec, rec["a"].get("ctx"), "context")
    rp.drv(rec, "cuCtxDestroy", ctx)
    for tid, c in list(rp.cur_ctx.items()):
        if c is ctx:
            del rp.cur_ctx[tid]


def ctx_or_primary(rp, rec, h):
    """A context handle whose creation was not recorded (the runtime retains its primary
    context through paths the shim may not see) is taken to be the device's primary context."""
    if not h:
        return rp.cu.CUcontext(0)
    if h in rp.handles:
        return rp.handles[h]
    ident = rp.ctx_ids.get(h)
    ctx = rp.raw("cuDevicePrimaryCtxRetain", _dev(rp, (ident or {}).get("device")))
    rp.set_handle(h, ctx, "context")
    preload_in(rp, ctx)
    if not (ident and ident.get("primary")):
        what = "a context the capture could not identify" if not ident or ident.get("primary") is None else \
            f"a non-primary context of device {ident.get('device')} not created by a recorded call"
        rp.note(f"call #{rec.get('s')} {rec['f']}: context {h:#x} is {what}; "
                f"using the primary context of device {rp.opt.device}")
    return ctx


def ctx_set_current(rp, rec):
    h = rec["a"].get("ctx")
    ctx = ctx_or_primary(rp, rec, h)
    rp.drv(rec, "cuCtxSetCurrent", ctx)
    _current(rp, rec, ctx)


def ctx_push(rp, rec):
    ctx = ctx_or_primary(rp, rec, rec["a"].get("ctx"))
    rp.drv(rec, "cuCtxPushCurrent", ctx)
    _current(rp, rec, ctx)


def ctx_pop(rp, rec):
    rp.drv(rec, "cuCtxPopCurrent")
    cur = rp.cu.cuCtxGetCurrent()
    _current(rp, rec, cur[1] if int(cur[0]) == 0 else rp.cu.CUcontext(0))


def ctx_sync(rp, rec):
    rp.drv(rec, "cuCtxSynchronize")
    rp.keepalive.clear()


def ctx_set_limit(rp, rec):
    a = rec["a"]
    rp.drv(rec, "cuCtxSetLimit", rp.cu.CUlimit(a.get("limit", 0)), a.get("value", 0))


def ctx_event(rp, rec):
    a = rec["a"]
    name = "cuCtxRecordEvent" if "Record" in rec["f"] else "cuCtxWaitEvent"
    rp.drv(rec, name, ctx_or_primary(rp, rec, a.get("hCtx")), rp.live(rec, a.get("hEvent"), "event"))


def ctx_attach(rp, rec):
    # deprecated usage counting of the current context: Attach hands out the current context
    if "Attach" in rec["f"]:
        cur = rp.cu.cuCtxGetCurrent()
        if int(cur[0]) == 0:
            rp.set_handle(rec["a"].get("pctx"), cur[1], "context")
