"""CUDA arrays, texture and surface objects. An array is opaque device memory the driver lays
out; 2D copies reach it (memory.memcpy_2d). A texture or surface object is a value the program
passes to its kernels as a parameter: the replay creates it over the replayed array or memory
and needs the driver to give back the recorded value, which kernels read from their recorded
parameters (a fresh context hands the values out in creation order, as when recorded)."""
from __future__ import annotations

import ctypes
import struct

from cudasnap.formats.abi import base_name
from cudasnap.formats.layout import sizeof

from . import handles

RES_ARRAY, RES_MIPMAPPED, RES_LINEAR, RES_PITCH2D = 0, 1, 2, 3


def _struct(ctx, rec, kind: str, raw):
    """A cuda-python struct `kind` holding the recorded bytes."""
    n = sizeof(kind)
    if not isinstance(raw, (bytes, bytearray)) or len(raw) < n:
        ctx.fail(rec, f"the {kind} struct was not captured")
    st = getattr(ctx.cu, kind)()
    ctypes.memmove(int(st.getPtr()), bytes(raw[:n]), n)
    return st


@handles("cuArrayCreate", "cuArray3DCreate", errors=True)
def array_create(ctx, rec):
    a = rec["a"]
    three = "3D" in rec["f"]
    kind = "CUDA_ARRAY3D_DESCRIPTOR" if three else "CUDA_ARRAY_DESCRIPTOR"
    live = ctx.drv(rec, "cuArray3DCreate" if three else "cuArrayCreate", _struct(ctx, rec, kind, a.get("pAllocateArray")))
    if live is not None:
        ctx.set_handle(a.get("pHandle"), live, "array")


@handles("cuArrayDestroy")
def array_destroy(ctx, rec):
    ctx.drv(rec, "cuArrayDestroy", ctx.live(rec, rec["a"].get("hArray"), "array"))


def _resource(ctx, rec, raw, surface: bool):
    """The recorded CUDA_RESOURCE_DESC with its array or device pointer replayed."""
    if not isinstance(raw, (bytes, bytearray)) or len(raw) < 16:
        ctx.fail(rec, "the CUDA_RESOURCE_DESC struct was not captured")
    res = bytearray(raw)
    rtype = struct.unpack_from("<I", res, 0)[0]
    handle = struct.unpack_from("<Q", res, 8)[0]          # res.array.hArray / res.linear.devPtr / res.pitch2D.devPtr
    if rtype == RES_ARRAY:
        struct.pack_into("<Q", res, 8, int(ctx.live(rec, handle, "array")))
    elif rtype in (RES_LINEAR, RES_PITCH2D) and not surface:
        struct.pack_into("<Q", res, 8, ctx.tr(handle))
    else:
        ctx.fail(rec, f"resource type {rtype} ({'mipmapped array' if rtype == RES_MIPMAPPED else 'unknown'}) "
                      "is not replayed")
    return _struct(ctx, rec, "CUDA_RESOURCE_DESC", res)


def _same_value(ctx, rec, recorded, live, what: str) -> None:
    if isinstance(recorded, int) and int(live) != recorded:
        ctx.fail(rec, f"the driver gave {what} {int(live):#x} where the program had {recorded:#x}: kernels take "
                      "the recorded value from their parameters")
    ctx.set_handle(recorded, live, what)


@handles("cuTexObjectCreate", errors=True)
def tex_create(ctx, rec):
    a = rec["a"]
    res = _resource(ctx, rec, a.get("pResDesc"), surface=False)
    tex = _struct(ctx, rec, "CUDA_TEXTURE_DESC", a.get("pTexDesc"))
    view = a.get("pResViewDesc")
    view = _struct(ctx, rec, "CUDA_RESOURCE_VIEW_DESC", view) if isinstance(view, (bytes, bytearray)) else None
    live = ctx.drv(rec, "cuTexObjectCreate", res, tex, view)
    if live is not None:
        _same_value(ctx, rec, a.get("pTexObject"), live, "texture object")


@handles("cuSurfObjectCreate", errors=True)
def surf_create(ctx, rec):
    a = rec["a"]
    live = ctx.drv(rec, "cuSurfObjectCreate", _resource(ctx, rec, a.get("pResDesc"), surface=True))
    if live is not None:
        _same_value(ctx, rec, a.get("pSurfObject"), live, "surface object")


@handles("cuTexObjectDestroy")
def tex_destroy(ctx, rec):
    ctx.drv(rec, "cuTexObjectDestroy", ctx.live(rec, rec["a"].get("texObject"), "texture object"))


@handles("cuSurfObjectDestroy")
def surf_destroy(ctx, rec):
    ctx.drv(rec, "cuSurfObjectDestroy", ctx.live(rec, rec["a"].get("surfObject"), "surface object"))


# ------------------------------------------------------------------ 1D copies with arrays
@handles("cuMemcpyHtoA", "cuMemcpyHtoAAsync", "cuMemcpyAtoH", "cuMemcpyAtoHAsync", "cuMemcpyDtoA", "cuMemcpyAtoD",
         "cuMemcpyAtoA", errors=True)
def memcpy_array_1d(ctx, rec):
    """Copies that address an array as bytes from an offset (cudaMemcpyToArray & co.)."""
    a = rec["a"]
    f = base_name(rec["f"])
    n = int(a.get("ByteCount") or 0)
    stream = [ctx.stream(rec, a.get("hStream"))] if f.endswith("Async") else []

    def arr(key):
        return ctx.live(rec, a.get(key), "array")

    if f.startswith("cuMemcpyHtoA"):
        data = ctx.blob(rec, "srcHost")
        if data is None and n:
            ctx.fail(rec, "the H2D source payload was not captured")
        buf = bytes(data or b"")
        if stream:
            ctx.keepalive.append(buf)
        ctx.drv(rec, f, arr("dstArray"), int(a.get("dstOffset") or 0), buf, n, *stream)
    elif f.startswith("cuMemcpyAtoH"):
        buf = bytearray(max(n, 1))
        if ctx.drv(rec, f, buf, arr("srcArray"), int(a.get("srcOffset") or 0), n, *stream) is None:
            return
        if stream:
            ctx.raw("cuStreamSynchronize", stream[0])
        if rec.get("r", 0) == 0:
            ctx.verify(rec, ctx.blob(rec, "dstHost"), bytes(buf[:n]), None, from_array=True)
    elif f == "cuMemcpyDtoA":
        ctx.drv(rec, f, arr("dstArray"), int(a.get("dstOffset") or 0), ctx.tr(a.get("srcDevice")), n)
    elif f == "cuMemcpyAtoD":
        ctx.drv(rec, f, ctx.tr(a.get("dstDevice")), arr("srcArray"), int(a.get("srcOffset") or 0), n)
        ctx.mark_written(a.get("dstDevice"), rec.get("s"), rec["f"])
    else:
        ctx.drv(rec, f, arr("dstArray"), int(a.get("dstOffset") or 0), arr("srcArray"), int(a.get("srcOffset") or 0), n)
