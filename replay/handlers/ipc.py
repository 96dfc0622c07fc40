"""Cross-process and cross-device links: shareable handles, legacy IPC memory and event
handles, peer access.

In a group replay (replay/group.py) each rank runs in its own replayer process; an export
hands the live fd (or IPC bytes) to the coordinator under the recorded (pid, call), and the
import the manifest pairs with it waits for it there. Imported memory is mapped by the
program's own recorded cuMemMap at the recorded address (the rank's placement zone is its
own: ranks are separate processes, so zones never collide). Outside a group these calls
stop the replay with a one-line reason."""
from __future__ import annotations

import ctypes
import os
import struct

from cudasnap.formats.layout import offsetof

POSIX_FD = 1
_REQ_TYPES = offsetof("CUmemAllocationProp", "requestedHandleTypes")
IPC_HANDLE_SIZE = 64          # CUipcMemHandle: opaque bytes, NULs included


def _handle_bytes(h) -> bytes:
    """The 64 opaque bytes of a CUipcMemHandle, read from its memory (a char-array field may
    stop at the first NUL)."""
    get = getattr(h, "getPtr", None)
    if get is not None:
        return ctypes.string_at(int(get()), IPC_HANDLE_SIZE)
    return bytes(getattr(h, "reserved", b"")) or bytes(h)


def _ordinal(ctx):
    try:
        return int(ctx.dev)
    except (TypeError, ValueError):
        return None


def _make_handle(cu, raw: bytes, kind: str = "CUipcMemHandle"):
    h = getattr(cu, kind)()
    get = getattr(h, "getPtr", None)
    if get is not None and len(raw) == IPC_HANDLE_SIZE:
        ctypes.memmove(int(get()), raw, IPC_HANDLE_SIZE)
    else:
        h.reserved = raw
    return h
_ERR_PEER_ALREADY = (704, 705)  # CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED / _NOT_ENABLED


def _client(ctx, rec):
    c = ctx.group_client()
    if c is None:
        ctx.fail(rec, "links another process: replay the whole job (its group manifest, or all its snapshots) "
                     f"with `cudasnap replay {_manifest_of(ctx) or 'JOB.cusnap'}`; to replay one kernel of this "
                     f"rank alone, `cudasnap extract` it (the extract stands alone)")
    return c


def _manifest_of(ctx):
    """The group manifest beside this snapshot that names it (a window's: STEM.wN.group.json)."""
    try:
        from cudasnap.formats.group import find_manifest
        found = find_manifest(ctx.reader.path)
    except Exception:
        return None
    return found[0]["path"] if found else None


def recorded_prop(ctx, prop_bytes):
    """The allocation properties to create with: this replay's device, and the shareable
    handle types the program asked for (an export needs them)."""
    p = ctx.ops.prop()
    if isinstance(prop_bytes, (bytes, bytearray)) and len(prop_bytes) >= _REQ_TYPES + 4:
        types = struct.unpack_from("<I", prop_bytes, _REQ_TYPES)[0]
        if types:
            try:
                p.requestedHandleTypes = ctx.cu.CUmemAllocationHandleType(types)
            except Exception:
                p.requestedHandleTypes = types
    return p


# ------------------------------------------------------------------ shareable handles
def _posix_fd(ctx, rec, htype) -> int:
    htype = int(htype or 0)
    if htype != POSIX_FD:
        ctx.fail(rec, f"shareable handle type {htype} is not replayed (POSIX file descriptors are)")
    return htype


def mem_export(ctx, rec):
    a = rec["a"]
    htype = _posix_fd(ctx, rec, a.get("handleType"))
    c = _client(ctx, rec)
    live = ctx.live(rec, a.get("handle"), "allocation handle")
    fd = ctx.drv(rec, "cuMemExportToShareableHandle", live, ctx.cu.CUmemAllocationHandleType(htype), 0)
    if fd is None:
        return
    fd = int(fd)
    try:
        c.put(["export", c.pid, rec.get("s")], {"recorded_fd": a.get("shareableHandle")}, [fd])
    finally:
        os.close(fd)       # the coordinator holds its own copy


def mem_import(ctx, rec):
    a = rec["a"]
    htype = _posix_fd(ctx, rec, a.get("shHandleType"))
    c = _client(ctx, rec)
    _meta, fds = c.get(["import", c.pid, rec.get("s")], ctx, rec)
    if not fds:
        ctx.fail(rec, "the coordinator sent no file descriptor for this import")
    try:
        h = ctx.drv(rec, "cuMemImportFromShareableHandle", fds[0], ctx.cu.CUmemAllocationHandleType(htype))
    finally:
        for fd in fds:
            os.close(fd)
    if h is not None:
        ctx.set_handle(a.get("handle"), h, "mem handle")


# ------------------------------------------------------------------ legacy IPC handles
def ipc_get(ctx, rec):
    """The exporter's allocation is VMM memory here (placed, or fallen back to another address:
    placement makes IPC-shared allocations VMM either way), handed over as shareable fds of its
    chunks; cuMemAlloc memory (a replay without placement) as a real IPC handle."""
    a = rec["a"]
    c = _client(ctx, rec)
    dptr = a.get("dptr")
    al = ctx.space.find(dptr or 0)
    if al is None:
        ctx.fail(rec, f"{dptr:#x} is not a replayed allocation" if isinstance(dptr, int) else "no dptr recorded")
    if al.chunks:
        fds, parts = [], []
        try:
            for ch in al.chunks:
                fd = ctx.raw("cuMemExportToShareableHandle", ch.handle, ctx.cu.CUmemAllocationHandleType(POSIX_FD), 0)
                fds.append(int(fd))
                parts.append([ch.start, ch.size])
            c.put(["export", c.pid, rec.get("s")],
                  {"kind": "chunks", "base": al.live_base, "size": al.size, "chunks": parts}, fds)
        finally:
            for fd in fds:
                os.close(fd)
        return
    h = ctx.drv(rec, "cuIpcGetMemHandle", ctx.tr(dptr))
    if h is not None:
        raw = _handle_bytes(h)
        c.put(["export", c.pid, rec.get("s")], {"kind": "ipc", "bytes": raw.hex(), "base": al.rec_base,
                                                "size": al.size, "live": al.live_base,
                                                "device": _ordinal(ctx)}, [])


def ipc_open(ctx, rec):
    a = rec["a"]
    c = _client(ctx, rec)
    meta, fds = c.get(["import", c.pid, rec.get("s")], ctx, rec)
    want = a.get("pdptr")
    try:
        if meta.get("kind") == "chunks":
            _map_chunks(ctx, rec, meta, fds, want)
            return
        raw = bytes.fromhex(meta.get("bytes", ""))
        h = _make_handle(ctx.cu, raw)
        live = ctx.drv(rec, "cuIpcOpenMemHandle", h, int(a.get("Flags") or 1),
                      detail=f" opening the exporter's handle ({len(raw)} bytes {raw[:16].hex()}..., its allocation "
                             f"at {int(meta.get('live') or 0):#x} on GPU {meta.get('device')}, recorded at "
                             f"{int(meta.get('base') or 0):#x}; this rank on GPU {_ordinal(ctx)})")
        if live is not None:
            ctx.space.add_vmm(want, int(meta.get("size") or 0), int(live), rec.get("s"),
                             "" if int(live) == want else f"cuIpcOpenMemHandle returned {int(live):#x}")
            ctx.ipc_opened[want] = ("ipc", int(live))
    finally:
        for fd in fds:
            os.close(fd)


def _map_chunks(ctx, rec, meta, fds, want):
    """Map the exporter's chunks so that its allocation base lands at the recorded address."""
    chunks = meta.get("chunks") or []
    if len(chunks) != len(fds) or not chunks:
        ctx.fail(rec, "the exporter sent an incomplete set of chunks")
    lo = chunks[0][0]
    span = chunks[-1][0] + chunks[-1][1] - lo
    hint = want - (meta["base"] - lo)
    sp = ctx.space.span_of(hint, span)
    own_va = sp is None or not sp.reserved
    # inside a range this replay reserved (the importer's placement zone, where capture mapped
    # it): mapped there as it is; elsewhere a reservation of its own at the recorded address
    got = int(ctx.raw("cuMemAddressReserve", span, 0, hint, 0)) if own_va else hint
    handles_ = []
    for (start, size), fd in zip(chunks, fds):
        h = ctx.raw("cuMemImportFromShareableHandle", fd, ctx.cu.CUmemAllocationHandleType(POSIX_FD))
        handles_.append(h)
        ctx.ops.map(got + (start - lo), size, h)
    ctx.ops.set_access(got, span)
    live = got + (meta["base"] - lo)
    ctx.space.add_vmm(want, int(meta["size"]), live, rec.get("s"),
                     "" if live == want else f"cuMemAddressReserve hint {hint:#x} returned {got:#x}")
    ctx.ipc_opened[want] = ("chunks", got, span, handles_, own_va)


def ipc_close(ctx, rec):
    want = rec["a"].get("dptr")
    ent = ctx.ipc_opened.pop(want, None)
    if ent is None:
        ctx.note(f"call #{rec.get('s')} {rec['f']}: {want:#x} was not opened by this replay; ignored")
        return
    ctx.space.free(want)
    if ent[0] == "ipc":
        ctx.drv(rec, "cuIpcCloseMemHandle", ent[1])
        return
    _, got, span, hs, own_va = ent
    ctx.ops.unmap(got, span)
    for h in hs:
        ctx.ops.release(h)
    if own_va:
        ctx.ops.free_va(got, span)


# ------------------------------------------------------------------ IPC events
def ipc_event_get(ctx, rec):
    """An event another process waits on (PyTorch shares one with each CUDA tensor it sends):
    its live handle goes to the coordinator for the rank that opens it."""
    a = rec["a"]
    c = _client(ctx, rec)
    h = ctx.drv(rec, "cuIpcGetEventHandle", ctx.live(rec, a.get("event"), "event"))
    if h is not None:
        c.put(["export", c.pid, rec.get("s")], {"kind": "ipc_event", "bytes": _handle_bytes(h).hex()}, [])


def ipc_event_open(ctx, rec):
    a = rec["a"]
    c = _client(ctx, rec)
    meta, fds = c.get(["import", c.pid, rec.get("s")], ctx, rec)
    for fd in fds:
        os.close(fd)
    raw = bytes.fromhex(meta.get("bytes", ""))
    ev = ctx.drv(rec, "cuIpcOpenEventHandle", _make_handle(ctx.cu, raw, "CUipcEventHandle"),
                 detail=f" opening the exporter's event handle ({raw[:16].hex()}...)")
    if ev is not None:
        ctx.set_handle(a.get("phEvent"), ev, "event")


# ------------------------------------------------------------------ peer access
def _peer(ctx, rec, f):
    a = rec["a"]
    from .context import ctx_or_primary
    peer = ctx_or_primary(ctx, rec, a.get("peerContext"))
    cur = ctx.cu.cuCtxGetCurrent()
    if int(cur[0]) == 0 and int(cur[1]) == int(peer):
        # both devices of the recording replay on one GPU: access is already there
        ctx.note_once("peer-folded", f"call #{rec.get('s')} {rec['f']}: the recorded devices replay on one GPU; "
                     "peer access is implicit")
        return
    args = (peer, int(a.get("Flags") or 0)) if f == "cuCtxEnablePeerAccess" else (peer,)
    res = getattr(ctx.cu, f)(*args)
    code = int(res[0])
    if code not in (0,) + _ERR_PEER_ALREADY:
        from cudasnap.formats import cu_result_name
        ctx.fail(rec, f"replay returned {cu_result_name(code)}")


def enable_peer(ctx, rec):
    _peer(ctx, rec, "cuCtxEnablePeerAccess")


def disable_peer(ctx, rec):
    _peer(ctx, rec, "cuCtxDisablePeerAccess")


def memcpy_peer(ctx, rec):
    """Between two contexts: a device-to-device copy when both replay on one GPU."""
    a = rec["a"]
    from .context import ctx_or_primary
    dc, sc = ctx_or_primary(ctx, rec, a.get("dstContext")), ctx_or_primary(ctx, rec, a.get("srcContext"))
    dst, src, n = ctx.tr(a.get("dstDevice")), ctx.tr(a.get("srcDevice")), int(a.get("ByteCount") or 0)
    is_async = "Async" in rec["f"]
    s = [ctx.stream(rec, a.get("hStream"))] if is_async else []
    if int(dc) == int(sc):
        ctx.drv(rec, "cuMemcpyDtoDAsync" if is_async else "cuMemcpyDtoD", dst, src, n, *s)
    else:
        ctx.drv(rec, "cuMemcpyPeerAsync" if is_async else "cuMemcpyPeer", dst, dc, src, sc, n, *s)
    ctx.mark_written(a.get("dstDevice"), rec.get("s"), rec["f"])
