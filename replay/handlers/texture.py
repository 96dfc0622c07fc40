"""CUDA arrays, texture and surface objects. An array is opaque device memory the driver lays
out; 2D copies reach it (memory.memcpy_2d). A texture or surface object is a value the program
passes to its kernels as a parameter: the replay creates it over the replayed array or memory
and needs the driver to give back the recorded value, which kernels read from their recorded
parameters (a fresh context hands the values out in creation order, as when recorded)."""
from __future__ import annotations

import struct

from cudasnap.formats.abi import base_name
from cudasnap.formats.layout import sizeof

from .graph import fill_struct, struct_bytes

RES_ARRAY, RES_MIPMAPPED, RES_LINEAR, RES_PITCH2D = 0, 1, 2, 3


def _struct(ctx, rec, key: str, kind: str, data=None):
    """A bindings struct `kind` holding recorded argument `key` (or `data`, the bytes made of it)."""
    if data is None:
        data = struct_bytes(ctx, rec, key, sizeof(kind), kind)
    return fill_struct(getattr(ctx.cu, kind)(), data)


def array_create(ctx, rec):
    a = rec["a"]
    three = "3D" in rec["f"]
    kind = "CUDA_ARRAY3D_DESCRIPTOR" if three else "CUDA_ARRAY_DESCRIPTOR"
    live = ctx.drv(rec, "cuArray3DCreate" if three else "cuArrayCreate", _struct(ctx, rec, "pAllocateArray", kind))
    if live is not None:
        ctx.set_handle(a.get("pHandle"), live, "array")


def _resource(ctx, rec, surface: bool):
    """The recorded CUDA_RESOURCE_DESC with its array or device pointer replayed."""
    res = struct_bytes(ctx, rec, "pResDesc", sizeof("CUDA_RESOURCE_DESC"), "CUDA_RESOURCE_DESC")
    rtype = struct.unpack_from("<I", res, 0)[0]
    handle = struct.unpack_from("<Q", res, 8)[0]          # res.array.hArray / res.linear.devPtr / res.pitch2D.devPtr
    if rtype == RES_ARRAY:
        struct.pack_into("<Q", res, 8, int(ctx.live(rec, handle, "array")))
    elif rtype in (RES_LINEAR, RES_PITCH2D) and not surface:
        struct.pack_into("<Q", res, 8, ctx.tr(handle))
    else:
        ctx.fail(rec, f"resource type {rtype} ({'mipmapped array' if rtype == RES_MIPMAPPED else 'unknown'}) "
                      "is not replayed")
    return _struct(ctx, rec, "pResDesc", "CUDA_RESOURCE_DESC", res)


def _same_value(ctx, rec, recorded, live, what: str) -> None:
    """Kernels take the object from their recorded parameters, and its destroyer the recorded
    value (handlers/generic.py): the live one must be it."""
    if isinstance(recorded, int) and int(live) != recorded:
        ctx.fail(rec, f"the driver gave {what} {int(live):#x} where the program had {recorded:#x}: kernels take "
                      "the recorded value from their parameters")


def tex_create(ctx, rec):
    a = rec["a"]
    view = _struct(ctx, rec, "pResViewDesc", "CUDA_RESOURCE_VIEW_DESC") if a.get("pResViewDesc") else None
    live = ctx.drv(rec, "cuTexObjectCreate", _resource(ctx, rec, surface=False),
                   _struct(ctx, rec, "pTexDesc", "CUDA_TEXTURE_DESC"), view)
    if live is not None:
        ctx.tex_objects.append(("cuTexObjectDestroy", int(live)))
        _same_value(ctx, rec, a.get("pTexObject"), live, "texture object")


def surf_create(ctx, rec):
    a = rec["a"]
    live = ctx.drv(rec, "cuSurfObjectCreate", _resource(ctx, rec, surface=True))
    if live is not None:
        ctx.tex_objects.append(("cuSurfObjectDestroy", int(live)))
        _same_value(ctx, rec, a.get("pSurfObject"), live, "surface object")


# ------------------------------------------------------------------ 1D copies with arrays
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
