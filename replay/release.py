"""Giving back what a replay holds in the driver and in the process (Replayer.close), so that
another replay in the same process places its memory at the recorded addresses again."""
from __future__ import annotations

from typing import Dict

from . import hostplace
from .driverops import handle_int, result_code


def release(ctx) -> Dict[str, int]:
    """Device memory and its reserved ranges, pinned host memory mapped at recorded addresses,
    the contexts (created ones destroyed, primary ones reset), the live functions cached per
    process, texture and surface objects; the driver stays initialized. Returns the counts."""
    out: Dict[str, int] = {}
    cu = ctx.cu
    try:
        cu.cuCtxSynchronize()
    except Exception:
        pass
    sp = ctx.space
    for p in sorted(ctx.host_placed):
        a = sp.find(p) if sp is not None else None
        try:
            hostplace.release(ctx, p, a.size if a is not None else 1)
        except Exception:
            pass
    out["host"] = len(ctx.host_placed)
    ctx.host_placed.clear()
    # texture and surface objects still alive: kernels take their recorded values, which the
    # next replay's objects can have only once these are gone (one destroyed already fails)
    out["texture_objects"] = 0
    for destroy, obj in reversed(ctx.tex_objects):
        try:
            if result_code(getattr(cu, destroy)(obj)[0]) == 0:
                out["texture_objects"] += 1
        except Exception:
            pass
    ctx.tex_objects.clear()
    hostplace.release_reservations()
    if sp is not None:
        out.update(sp.release_all())
    devs = {handle_int(ctx.dev): ctx.dev, **{handle_int(d): d for d in ctx.devlive.values()}}
    primaries = {}
    for k, d in devs.items():
        try:
            r = cu.cuDevicePrimaryCtxGetState(d)
            if result_code(r[0]) == 0 and r[2]:
                primaries[k] = handle_int(ctx.raw("cuDevicePrimaryCtxRetain", d))
                cu.cuDevicePrimaryCtxRelease(d)
        except Exception:
            pass
    made = {handle_int(c): c for c in ctx.handles.contexts.values() if handle_int(c)}
    out["contexts"] = 0
    for k, c in made.items():
        if k not in primaries.values():
            try:
                if result_code(cu.cuCtxDestroy(c)[0]) == 0:
                    out["contexts"] += 1
            except Exception:
                pass
    for k in primaries:
        try:
            if result_code(cu.cuDevicePrimaryCtxReset(devs[k])[0]) == 0:
                out["contexts"] += 1
        except Exception:
            pass
    try:
        cu.cuCtxSetCurrent(cu.CUcontext(0))
    except Exception:
        pass
    from .functions import forget_live
    forget_live()
    return out
