"""Memory family: allocations through the placement manager, program VMM, pools, copies, memsets."""
from __future__ import annotations

import ctypes
import struct

from .. import hostplace
from cudasnap.formats.vocab import handle_array, in_class
from cudasnap.formats.layout import offsetof, sizeof
from .graph import fill_struct, keep_forever, struct_bytes
from ..staging import h2d_async_from_blob, h2d_from_blob


def _captured(ctx, rec) -> bool:
    """An async call on a stream in capture: it became a graph node, it did not execute."""
    a = rec["a"]
    return "Async" in rec["f"] and ctx.stream_capturing(a.get("hStream"), ctx.stream(rec, a.get("hStream")))


def _note_capture_d2h(ctx, rec) -> None:
    ctx.note_once("capture_d2h", f"call #{rec.get('s')} {rec['f']}: device-to-host copies captured into graphs "
                                f"are not verified (the recorded bytes predate the graph's execution)")

# ------------------------------------------------------------------ allocations


def _alloc(ctx, rec, ptr_key="dptr", size=None):
    a = rec["a"]
    rec_ptr = a.get(ptr_key)
    n = size if size is not None else a.get("bytesize", 0)
    if not isinstance(rec_ptr, int) or not rec_ptr:
        ctx.fail(rec, f"recorded allocation has no {ptr_key} output")
    ctx.space.alloc(rec_ptr, int(n), rec.get("s"))


def mem_alloc(ctx, rec):
    if in_class(rec["f"], "managed_alloc"):
        ctx.note_once("managed", "managed memory is replayed as device memory placed at its recorded address")
    _alloc(ctx, rec)


def mem_alloc_pitch(ctx, rec):
    a = rec["a"]
    pitch = a.get("pPitch")
    if not isinstance(pitch, int):
        ctx.fail(rec, "recorded pitch missing")
    _alloc(ctx, rec, size=pitch * int(a.get("Height", 0)))


def mem_alloc_async(ctx, rec):
    # stream-ordered allocation becomes a VMM mapping at the recorded address, now
    _alloc(ctx, rec)


def mem_free(ctx, rec):
    p = rec["a"].get("dptr")
    check = (rec.get("x") or {}).get("hostcheck")
    if check is not None and isinstance(p, int) and rec.get("r", 0) == 0:
        # managed memory's final bytes, which the program read in place: verified before the free
        n = int(check.get("size") or 0)
        buf = bytearray(n)
        ctx.raw("cuCtxSynchronize")
        ctx.raw("cuMemcpyDtoH", buf, ctx.tr(p), n)
        ctx.verify(rec, ctx.blob(rec, "hostcheck"), bytes(buf), p)
    if ctx.space.free(p) is None and p:
        ctx.note(f"call #{rec.get('s')} {rec['f']}: {p:#x} is not a replayed allocation; ignored")


def mem_free_async(ctx, rec):
    a = rec["a"]
    s = ctx.stream(rec, a.get("hStream"))
    if ctx.stream_capturing(a.get("hStream"), s):
        # a free node of the captured graph: the graph's kernels use the memory whenever it runs
        ctx.note_once("capture_free", f"call #{rec.get('s')} {rec['f']}: frees captured into graphs are not "
                                     f"performed (the memory stays mapped at its recorded address)")
        ctx.res.skipped += 1
        return
    ctx.raw("cuStreamSynchronize", s)      # frees happen after the stream's work
    mem_free(ctx, rec)


def host_alloc(ctx, rec):
    a = rec["a"]
    want, n = hostplace.recorded_range(rec)
    if rec.get("r", 0) == 0 and want and hostplace.place(ctx, want, n, int(a.get("Flags", 0) or 0)):
        ctx.space.add_host(want, n, want, rec.get("s"))      # at its recorded address
        ctx.host_placed.add(want)
        return
    if rec["f"].startswith("cuMemHostAlloc"):
        live = ctx.drv(rec, "cuMemHostAlloc", n, a.get("Flags", 0))
    else:
        live = ctx.drv(rec, "cuMemAllocHost", n)
    if live is not None:
        ctx.space.add_host(want, n, int(live), rec.get("s"))


def host_dev_ptr(ctx, rec):
    a = rec["a"]
    h = ctx.space.find(a.get("p") or 0)
    if h is None:
        ctx.fail(rec, "host pointer is not a replayed host allocation")
    live = ctx.drv(rec, "cuMemHostGetDevicePointer", h.live_base + (a["p"] - h.rec_base), a.get("Flags", 0))
    if live is not None and a.get("pdptr") and a["pdptr"] != a["p"]:
        ctx.space.add_host(a["pdptr"], h.size, int(live), rec.get("s"))


def _check_host_end(ctx, rec, h, p) -> None:
    """Mapped pinned memory's final bytes, which the program read in place: verified before it
    is freed or unregistered."""
    check = (rec.get("x") or {}).get("hostcheck")
    if check is not None and h is not None and rec.get("r", 0) == 0:
        ctx.raw("cuCtxSynchronize")
        got = ctypes.string_at(h.live_base + (p - h.rec_base), int(check.get("size") or 0))
        ctx.verify(rec, ctx.blob(rec, "hostcheck"), got, p)


def host_free(ctx, rec):
    p = rec["a"].get("p")
    h = ctx.space.find(p or 0)
    if h is None:
        ctx.fail(rec, "host pointer is not a replayed host allocation")
    _check_host_end(ctx, rec, h, p)
    if h.rec_base in ctx.host_placed:
        ctx.host_placed.discard(h.rec_base)
        base, size = h.rec_base, h.size
        if not ctx.space.hold_host_free(lambda: hostplace.release(ctx, base, size)):
            hostplace.release(ctx, base, size)
    elif not ctx.space.hold_host_free(lambda live=h.live_base: ctx.raw("cuMemFreeHost", live)):
        ctx.drv(rec, "cuMemFreeHost", h.live_base)
    ctx.space.free(h.rec_base)


def host_register(ctx, rec):
    """A program's own host range registered for the device: mapped and registered at its
    recorded address when that is free here (kernels may read it through that address)."""
    a = rec["a"]
    p, n = hostplace.recorded_range(rec)
    if rec.get("r", 0) == 0 and p and ctx.space is not None and ctx.space.find(p) is None \
            and hostplace.place(ctx, p, n, int(a.get("Flags", 0) or 0)):
        ctx.space.add_host(p, n, p, rec.get("s"))
        ctx.host_placed.add(p)
        return
    ctx.res.skipped += 1


def host_unregister(ctx, rec):
    p = rec["a"].get("p") or 0
    h = ctx.space.find(p) if ctx.space is not None else None
    _check_host_end(ctx, rec, h, p)
    if h is not None and h.rec_base == p and p in ctx.host_placed:
        ctx.host_placed.discard(p)
        size = h.size
        if not ctx.space.hold_host_free(lambda: hostplace.release(ctx, p, size)):
            hostplace.release(ctx, p, size)
        ctx.space.free(p)
        return
    ctx.res.skipped += 1


def host_ignored(ctx, rec):
    # host memory of the recorded process / placement hints: nothing to replay
    ctx.res.skipped += 1


# ------------------------------------------------------------------ program VMM
def vmm_reserve(ctx, rec):
    a = rec["a"]
    ptr, size = a.get("ptr"), int(a.get("size", 0))
    sp = ctx.space.span_of(ptr, size) if ptr else None
    if sp is not None and sp.reserved:
        ctx.space.add_vmm(ptr, size, ptr, rec.get("s"))       # inside our reservation: virtual
        ctx.vmm_virtual.add(ptr)
        return
    live = ctx.drv(rec, "cuMemAddressReserve", size, a.get("alignment", 0), ptr, 0)
    if live is None:
        return
    live = int(live)
    ctx.space.add_vmm(ptr, size, live, rec.get("s"),
                     (sp.reason if sp is not None else "") or f"cuMemAddressReserve hint {ptr:#x} returned {live:#x}")


def vmm_free(ctx, rec):
    a = rec["a"]
    ptr = a.get("ptr")
    al = ctx.space.free(ptr)
    if ptr in ctx.vmm_virtual:
        ctx.vmm_virtual.discard(ptr)
        return
    ctx.drv(rec, "cuMemAddressFree", al.live_base if al else ptr, a.get("size", 0))


def vmm_create(ctx, rec):
    a = rec["a"]
    from .ipc import recorded_prop      # the shareable handle types asked for (exports need them)
    h = ctx.drv(rec, "cuMemCreate", int(a.get("size", 0)), recorded_prop(ctx, a.get("prop")), 0)
    if h is not None:
        ctx.set_handle(a.get("handle"), h, "allocation handle")


def vmm_release(ctx, rec):
    h = rec["a"].get("handle")
    ctx.drv(rec, "cuMemRelease", ctx.live(rec, h, "allocation handle"))


def vmm_retain(ctx, rec):
    # not a query: it takes a reference the program gives back with a cuMemRelease of its own
    a = rec["a"]
    h = ctx.drv(rec, "cuMemRetainAllocationHandle", ctx.tr(a.get("addr")))
    if h is not None:
        ctx.set_handle(a.get("handle"), h, "allocation handle")


def vmm_map(ctx, rec):
    a = rec["a"]
    h = ctx.live(rec, a.get("handle"), "allocation handle")
    ptr, n = ctx.tr(a.get("ptr")), int(a.get("size", 0))
    if ctx.drv(rec, "cuMemMap", ptr, n, int(a.get("offset", 0)), h, 0) is not None:
        ctx.space.note_map(ptr, n)


def vmm_unmap(ctx, rec):
    a = rec["a"]
    ptr, n = ctx.tr(a.get("ptr")), int(a.get("size", 0))
    if ctx.drv(rec, "cuMemUnmap", ptr, n) is not None:
        ctx.space.note_unmap(ptr, n)


def vmm_set_access(ctx, rec):
    a = rec["a"]
    desc = a.get("desc")
    flags = 3
    if isinstance(desc, (bytes, bytearray)) and len(desc) >= 12:
        flags = struct.unpack_from("<I", desc, 8)[0]
    ctx.ops.set_access(ctx.tr(a.get("ptr")), int(a.get("size", 0)), flags)


# ------------------------------------------------------------------ pools
class PoolToken:
    """Stands in for a recorded memory pool: pool allocations are placed by the manager."""

    def __init__(self, rec_h):
        self.rec_h = rec_h


def pool_create(ctx, rec):
    a = rec["a"]
    key = a.get("pool") if "pool" in a and rec["f"].startswith("cuMemPool") else a.get("pool_out")
    ctx.set_handle(key, PoolToken(key), "pool")


def pool_get(ctx, rec):
    a = rec["a"]
    key = a.get("pool_out") if "Default" in rec["f"] else a.get("pool")
    if key not in ctx.handles:
        ctx.set_handle(key, PoolToken(key), "pool")


def pool_misc(ctx, rec):
    pass


# ------------------------------------------------------------------ copies
def _async(rec):
    return "Async" in rec["f"]


def _stream(ctx, rec):
    return ctx.stream(rec, rec["a"].get("hStream"))


def _staged(ctx, rec, n: int) -> bool:
    """Copies of big captured blobs stream through replay/staging.py (read ahead, page-locked)."""
    if not _async(rec):
        return h2d_from_blob(ctx, rec, n)
    return not _captured(ctx, rec) and h2d_async_from_blob(ctx, rec, n, _stream(ctx, rec))


def memcpy_htod(ctx, rec):
    a = rec["a"]
    n = int(a.get("ByteCount", 0))
    if n and _staged(ctx, rec, n):
        ctx.mark_written(a.get("dstDevice"), rec.get("s"), rec["f"])
        return
    data = ctx.blob(rec, "srcHost")
    if data is None:
        if n == 0:
            data = b""
        else:
            ctx.fail(rec, "the H2D source payload was not captured")
    data = ctx.h2d_payload(rec, data)
    dst = ctx.tr(a.get("dstDevice"))
    if _async(rec):
        buf = bytes(data)
        if _captured(ctx, rec):
            keep_forever(ctx, buf)         # a graph node reads it whenever the graph runs
        else:
            ctx.keepalive.append(buf)
        ctx.drv(rec, "cuMemcpyHtoDAsync", dst, buf, n, _stream(ctx, rec))
    else:
        ctx.drv(rec, "cuMemcpyHtoD", dst, data, n)
    ctx.mark_written(a.get("dstDevice"), rec.get("s"), rec["f"])


def memcpy_dtoh(ctx, rec):
    a = rec["a"]
    n = int(a.get("ByteCount", 0))
    buf = bytearray(n)
    src = a.get("srcDevice")
    if _async(rec):
        s = _stream(ctx, rec)
        captured = _captured(ctx, rec)
        if captured:
            keep_forever(ctx, buf)         # the graph writes it whenever it runs
        if ctx.drv(rec, "cuMemcpyDtoHAsync", buf, ctx.tr(src), n, s) is None:
            return
        if captured:
            _note_capture_d2h(ctx, rec)    # captured into a graph: no data until the graph runs
            return
        ctx.raw("cuStreamSynchronize", s)
    elif ctx.drv(rec, "cuMemcpyDtoH", buf, ctx.tr(src), n) is None:
        return
    if rec.get("r", 0) == 0:
        ctx.verify(rec, ctx.blob(rec, "dstHost"), bytes(buf), src)


BATCH_HOST_ENDS = 256        # copies of a batch whose host ends capture records (shim_hooks.c CS_BATCH_MAX)


def memcpy_batch(ctx, rec):
    """A batch of unified-addressing copies, replayed one by one on its stream: a host source
    from its recorded bytes, a host destination read back and verified once the stream is done,
    device to device as it was."""
    a, x = rec["a"], rec.get("x") or {}
    dsts, srcs, sizes = (handle_array(rec, k, "count") for k in ("dsts", "srcs", "sizes"))
    if dsts is None or srcs is None or sizes is None:
        ctx.fail(rec, "the batch's address and size arrays were not captured")
    s = ctx.stream(rec, a.get("hStream"))
    if ctx.stream_capturing(a.get("hStream"), s):
        ctx.fail(rec, "batched copies inside a stream capture are not replayed")
    host_src = {e.get("i"): e for e in x.get("batchsrc") or ()}
    host_dst = {e.get("i"): e for e in x.get("batchdst") or ()}
    keep, reads = [], []
    for i, (dst, src, n) in enumerate(zip(dsts, srcs, sizes)):
        if not n:
            continue
        if i in host_src:
            data = ctx.blob_of(rec, host_src[i], f"copy {i}'s host source")
            if data is None:
                ctx.fail(rec, f"copy {i}'s host source ({n} bytes) was not captured")
            keep.append(data)
            ctx.drv(rec, "cuMemcpyHtoDAsync", ctx.tr(dst), data, n, s)
            ctx.mark_written(dst, rec.get("s"), rec["f"])
        elif i in host_dst:
            buf = bytearray(n)
            keep.append(buf)
            ctx.drv(rec, "cuMemcpyDtoHAsync", buf, ctx.tr(src), n, s)
            reads.append((i, buf, src))
        elif i >= BATCH_HOST_ENDS and (ctx.space.find(src) is None or ctx.space.find(dst) is None):
            ctx.fail(rec, f"copy {i} of the batch may have a host end: capture records those of the first "
                          f"{BATCH_HOST_ENDS} copies only")
        else:
            ctx.drv(rec, "cuMemcpyAsync", ctx.tr(dst), ctx.tr(src), n, s)
            ctx.mark_written(dst, rec.get("s"), rec["f"])
    if keep:
        ctx.raw("cuStreamSynchronize", s)       # host ends: done before their bytes go
    for i, buf, src in reads:
        ctx.verify(rec, ctx.blob_of(rec, host_dst[i], f"copy {i}'s result"), bytes(buf), src)


def memcpy_dtod(ctx, rec):
    a = rec["a"]
    b = rec["f"]
    n = int(a.get("ByteCount", 0))
    if in_class(b, "d2d_copy"):
        dst, src = a.get("dstDevice"), a.get("srcDevice")
        name = "cuMemcpyDtoDAsync" if _async(rec) else "cuMemcpyDtoD"
    else:
        dst, src = a.get("dst"), a.get("src")
        name = "cuMemcpyAsync" if _async(rec) else "cuMemcpy"
        # an end in host memory came with its bytes (the host source as it was, the result as
        # the program got it): those are replayed, whether or not the host memory was replayed
        x = rec.get("x") or {}
        if "hostsrc" in x:
            _unified_h2d(ctx, rec, dst, src, n)
            return
        if "hostdst" in x:
            _unified_d2h(ctx, rec, dst, src, n)
            return
        if ctx.space.find(src or 0) is None or ctx.space.find(dst or 0) is None:
            ctx.note(f"call #{rec.get('s')} {b}: an end of the copy is host memory whose contents were not "
                    f"captured; skipped")
            ctx.res.skipped += 1
            return
    args = [ctx.tr(dst), ctx.tr(src), n] + ([_stream(ctx, rec)] if _async(rec) else [])
    ctx.drv(rec, name, *args)
    al = ctx.space.find(src or 0)
    ctx.mark_written(dst, rec.get("s"), al.last_writer[1] if al and al.last_writer else b)


def _host_mirror(ctx, rec_ptr, data: bytes) -> None:
    """Keep a replayed pinned host allocation's bytes as the program had them."""
    al = ctx.space.find(rec_ptr or 0)
    if al is not None and al.kind == "host":
        ctypes.memmove(ctx.tr(rec_ptr), data, len(data))


def _unified_h2d(ctx, rec, dst, src, n: int) -> None:
    """cuMemcpy(Async) from host memory: the captured source bytes, copied as an H2D."""
    data = ctx.blob(rec, "hostsrc")
    if data is None or len(data) < n:
        ctx.fail(rec, "the host source of the copy was not captured whole")
    data = ctx.h2d_payload(rec, bytes(data[:n]))
    _host_mirror(ctx, src, data)
    if _async(rec):
        if _captured(ctx, rec):
            keep_forever(ctx, data)
        else:
            ctx.keepalive.append(data)
        ctx.drv(rec, "cuMemcpyHtoDAsync", ctx.tr(dst), data, n, _stream(ctx, rec))
    else:
        ctx.drv(rec, "cuMemcpyHtoD", ctx.tr(dst), data, n)
    ctx.mark_written(dst, rec.get("s"), rec["f"])


def _unified_d2h(ctx, rec, dst, src, n: int) -> None:
    """cuMemcpy(Async) into host memory: read back and verified like a D2H."""
    buf = bytearray(n)
    if _async(rec):
        s = _stream(ctx, rec)
        if ctx.drv(rec, "cuMemcpyDtoHAsync", buf, ctx.tr(src), n, s) is None:
            return
        ctx.raw("cuStreamSynchronize", s)
    elif ctx.drv(rec, "cuMemcpyDtoH", buf, ctx.tr(src), n) is None:
        return
    _host_mirror(ctx, dst, bytes(buf))
    if rec.get("r", 0) == 0:
        ctx.verify(rec, ctx.blob(rec, "hostdst"), bytes(buf), src)


class _CopyLayout:
    """Where a CUDA_MEMCPY2D or CUDA_MEMCPY3D keeps its fields (see shim_hooks.c
    cs_memcpy2d_host / cs_memcpy3d_host). The src* and dst* groups have the same shape; `side`
    offsets are relative to a group's XInBytes field; z and rows (slice height) are 3D's."""

    def __init__(self, kind: str, three: bool):
        self.kind, self.size = kind, sizeof(kind)
        self.src, self.dst = offsetof(kind, "srcXInBytes"), offsetof(kind, "dstXInBytes")
        side = {f: offsetof(kind, "src" + f) - self.src for f in ("MemoryType", "Host", "Device", "Array", "Pitch")}
        self.mtype, self.host, self.device, self.array, self.pitch = (side[f] for f in
                                                                     ("MemoryType", "Host", "Device", "Array", "Pitch"))
        self.z = offsetof(kind, "srcZ") - self.src if three else None
        self.rows = offsetof(kind, "srcHeight") - self.src if three else None
        self.width, self.height = offsetof(kind, "WidthInBytes"), offsetof(kind, "Height")
        self.depth = offsetof(kind, "Depth") if three else None

    def extent(self, cp, base):
        """(width, height, depth, pitch, slice rows) of one side."""
        w, h = _u64(cp, self.width), _u64(cp, self.height)
        d = _u64(cp, self.depth) if self.depth is not None else 1
        pitch = max(_u64(cp, base + self.pitch), w)
        rows = max(_u64(cp, base + self.rows), h) if self.rows is not None else h
        return w, h, d, pitch, rows


_L2D = _CopyLayout("CUDA_MEMCPY2D", three=False)
_L3D = _CopyLayout("CUDA_MEMCPY3D", three=True)
MT_HOST, MT_DEVICE, MT_ARRAY, MT_UNIFIED = 1, 2, 3, 4


def _u64(b, o):
    return struct.unpack_from("<Q", b, o)[0]


def _rows(buf: bytes, w, h, d, pitch, rows) -> bytes:
    """The copied bytes of a host side (the gaps between rows and slices are untouched memory)."""
    return b"".join(buf[k * pitch * rows + i * pitch:k * pitch * rows + i * pitch + w] for k in range(d) for i in range(h))


def memcpy_2d(ctx, rec):
    _memcpy_struct(ctx, rec, _L2D, "cuMemcpy2DAsync" if _async(rec) else
                   ("cuMemcpy2DUnaligned" if "Unaligned" in rec["f"] else "cuMemcpy2D"))


def memcpy_3d(ctx, rec):
    _memcpy_struct(ctx, rec, _L3D, "cuMemcpy3DAsync" if _async(rec) else "cuMemcpy3D")


def _memcpy_struct(ctx, rec, L: _CopyLayout, name: str):
    cp = struct_bytes(ctx, rec, "pCopy", L.size, L.kind)
    host_bufs = {}
    for base, key in ((L.src, "hostsrc"), (L.dst, "hostdst")):
        mt = struct.unpack_from("<I", cp, base + L.mtype)[0]
        w, h, d, pitch, rows = L.extent(cp, base)
        if mt == MT_HOST:
            n = pitch * rows * (d - 1) + pitch * (h - 1) + w if h and w and d else 0
            if base == L.src:
                data = ctx.blob(rec, key)
                if data is None and n:
                    ctx.fail(rec, "the copy's host source was not captured")
                buf = ctypes.create_string_buffer(bytes(data or b""), max(n, 1))
            else:
                buf = ctypes.create_string_buffer(max(n, 1))
            host_bufs[base] = buf
            struct.pack_into("<QQ", cp, base, 0, 0)                       # x, y -> 0 in our buffer
            if L.z is not None:
                struct.pack_into("<Q", cp, base + L.z, 0)
            struct.pack_into("<Q", cp, base + L.host, ctypes.addressof(buf))
            struct.pack_into("<Q", cp, base + L.pitch, pitch)
            if L.rows is not None:
                struct.pack_into("<Q", cp, base + L.rows, rows)
        elif mt in (MT_DEVICE, MT_UNIFIED):
            struct.pack_into("<Q", cp, base + L.device, ctx.tr(_u64(cp, base + L.device)))
        elif mt == MT_ARRAY:
            struct.pack_into("<Q", cp, base + L.array, int(ctx.live(rec, _u64(cp, base + L.array), "array")))
    args = [fill_struct(getattr(ctx.cu, L.kind)(), cp)] + ([_stream(ctx, rec)] if _async(rec) else [])
    captured = _captured(ctx, rec)
    if captured:
        keep_forever(ctx, host_bufs)       # graph nodes read/write them whenever the graph runs
    if ctx.drv(rec, name, *args) is None:
        return
    dst_mt = struct.unpack_from("<I", cp, L.dst + L.mtype)[0]
    if captured:
        if L.dst in host_bufs:
            _note_capture_d2h(ctx, rec)
        elif dst_mt in (MT_DEVICE, MT_UNIFIED):
            ctx.mark_written(_u64(rec["a"]["pCopy"], L.dst + L.device), rec.get("s"), rec["f"])
        return
    if _async(rec):
        ctx.raw("cuStreamSynchronize", _stream(ctx, rec))
    if L.dst in host_bufs and rec.get("r", 0) == 0:
        ext = L.extent(cp, L.dst)
        exp = ctx.blob(rec, "hostdst")
        got = host_bufs[L.dst].raw
        if exp is not None:        # compare the copied rows only
            exp, got = _rows(exp, *ext), _rows(got, *ext)
        else:
            got = got[:ext[3] * ext[4] * (ext[2] - 1) + ext[3] * (ext[1] - 1) + ext[0]]
        src = _u64(rec["a"]["pCopy"], L.src + L.device)
        smt = struct.unpack_from("<I", cp, L.src + L.mtype)[0]
        ctx.verify(rec, exp, got, src if smt in (MT_DEVICE, MT_UNIFIED) else None, from_array=smt == MT_ARRAY,
                   strided=True)
    elif dst_mt in (MT_DEVICE, MT_UNIFIED):
        ctx.mark_written(_u64(rec["a"]["pCopy"], L.dst + L.device), rec.get("s"), rec["f"])


# ------------------------------------------------------------------ memsets
_MEMSET_VAL = {"D8": "uc", "D16": "us", "D32": "ui"}


def memset(ctx, rec):
    a = rec["a"]
    f = rec["f"]
    import re
    m = re.match(r"cuMemset(D2D|D)(8|16|32)", f)
    two_d = m.group(1) == "D2D"
    width = "D" + m.group(2)
    name = ("cuMemsetD2D" + width[1:]) if two_d else ("cuMemset" + width)
    if _async(rec):
        name += "Async"
    val = a.get(_MEMSET_VAL[width], 0)
    dst = ctx.tr(a.get("dstDevice"))
    if two_d:
        args = [dst, a.get("dstPitch", 0), val, a.get("Width", 0), a.get("Height", 0)]
    else:
        args = [dst, val, a.get("N", 0)]
    if _async(rec):
        args.append(_stream(ctx, rec))
    ctx.drv(rec, name, *args)
    ctx.mark_written(a.get("dstDevice"), rec.get("s"), f)
