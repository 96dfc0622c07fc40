"""Graphs: stream capture (cuStreamBeginCapture, cuStreamBeginCaptureToGraph, capture modes,
capture dependencies), explicit node construction, instantiate/update/launch/destroy.

Stream capture rebuilds itself: the calls the program made on a capturing stream are
replayed in order onto the mapped (live) stream, so the live driver captures them into the
live graph exactly as it did when recorded.  Nodes built explicitly (cuGraphAdd*Node,
cuGraphAddNode) are rebuilt from the recorded structs with recorded handles and device
addresses mapped to live ones; recorded node handles map to the live nodes.

What cannot be rebuilt:
- kernel nodes: capture records the CUDA_KERNEL_NODE_PARAMS struct only; its kernelParams /
  extra members are host pointers of the recorded process, the packed arguments themselves
  are not recorded (unlike launches, whose arguments the shim packs into x.params).  Such
  calls stop the replay with a one-line reason (a recording that does carry x.params is
  rebuilt through the `extra` buffer form).
- host nodes (host callbacks of the recorded process) become empty nodes: same edges, so the
  order they imposed is kept.
- graph memory nodes (alloc/free), external semaphore and batch memory-op nodes."""
from __future__ import annotations

import ctypes
import struct
from typing import Any, List, Optional

from ..driverops import handle_int
from cudasnap.formats.abi import strip_per_thread
from cudasnap.formats.layout import offsetof, sizeof
from cudasnap.formats.vocab import NODE_LISTS, handle_array

# CUgraphNodeType
NT_KERNEL, NT_MEMCPY, NT_MEMSET, NT_HOST, NT_GRAPH, NT_EMPTY, NT_WAIT_EVENT, NT_EVENT_RECORD = range(8)
NT_EXT_SEMAS_SIGNAL, NT_EXT_SEMAS_WAIT, NT_MEM_ALLOC, NT_MEM_FREE, NT_BATCH_MEM_OP, NT_CONDITIONAL = range(8, 14)
NODE_TYPE_NAMES = {NT_EXT_SEMAS_SIGNAL: "external semaphore signal", NT_EXT_SEMAS_WAIT: "external semaphore wait",
                   NT_MEM_ALLOC: "graph memory allocation", NT_MEM_FREE: "graph memory free",
                   NT_BATCH_MEM_OP: "batch memory operation"}
NODE_PARAMS_SIZE = sizeof("CUgraphNodeParams")
NP_UNION = offsetof("CUgraphNodeParams", "kernel")     # type, reserved0[3], then the union
KERNEL_PARAMS_SIZE = sizeof("CUDA_KERNEL_NODE_PARAMS")
MEMSET_PARAMS_SIZE = sizeof("CUDA_MEMSET_NODE_PARAMS")  # v1 (v2 adds ctx at its end)
MEMCPY3D_SIZE = sizeof("CUDA_MEMCPY3D")
MT_HOST, MT_DEVICE, MT_ARRAY, MT_UNIFIED = 1, 2, 3, 4
CU_LAUNCH_PARAM_END, CU_LAUNCH_PARAM_BUFFER_POINTER, CU_LAUNCH_PARAM_BUFFER_SIZE = 0, 1, 2

KERNEL_NODE_REASON = ("this snapshot has no packed arguments for it (x.params; captured by cudasnap >= the "
                      "kernel-node hook): CUDA_KERNEL_NODE_PARAMS alone holds host pointers of the recorded process")


def _u64(b, o: int) -> int:
    return struct.unpack_from("<Q", b, o)[0]


def _u32(b, o: int) -> int:
    return struct.unpack_from("<I", b, o)[0]


def struct_bytes(ctx, rec, key: str, size: int, what: str) -> bytearray:
    """The recorded bytes of struct argument `key` (what: its type, for the error)."""
    raw = rec["a"].get(key)
    if not isinstance(raw, (bytes, bytearray)) or len(raw) < size:
        ctx.fail(rec, f"the {what} struct ({key}) was not captured")
    return bytearray(raw[:size])


def fill_struct(obj, data: bytes):
    """A bindings struct object holding `data`."""
    ctypes.memmove(int(obj.getPtr()), bytes(data), len(data))
    return obj


# ------------------------------------------------------------------ handle helpers
def graph(ctx, rec, h, what: str = "graph"):
    """Live graph for a recorded CUgraph.  A graph handle no recorded call returned may be a
    body graph of a conditional node (the driver writes those into a host array capture does
    not record): the oldest unclaimed body is taken for it, with a note."""
    if h and h not in ctx.handles:
        bodies = ctx.cond_bodies
        if bodies:
            live = bodies.pop(0)
            ctx.set_handle(h, live, "graph")
            ctx.note(f"call #{rec.get('s')} {rec['f']}: graph {h:#x} taken to be the next body graph of a "
                    f"conditional node (body handles are not recorded)")
            return live
    return ctx.live(rec, h, what)


def nodes(ctx, rec, key: str = "dependencies", count_key: str = "numDependencies") -> List[Any]:
    """Live CUgraphNodes for a recorded array of node handles (array_in: bytes)."""
    hs = handle_array(rec, key, count_key)
    if hs is None:
        ctx.fail(rec, f"the {key} array ({rec['a'].get(count_key)} nodes) was not captured")
    out = []
    for i, h in enumerate(hs):
        if h not in ctx.handles:
            ctx.fail(rec, f"{key}[{i}]: graph node {h:#x} is unknown (not created by a replayed call; nodes made "
                         f"implicitly by stream capture have no recorded handle)")
        out.append(ctx.handles[h])
    return out


def edges(ctx, rec, key: str = "dependencyData", count_key: str = "numDependencies") -> Optional[List[Any]]:
    """CUgraphEdgeData list for a recorded edge array, or None (NULL: default edges)."""
    a = rec["a"]
    n = int(a.get(count_key) or 0)
    raw = a.get(key)
    if n <= 0 or not isinstance(raw, (bytes, bytearray)) or len(raw) < 8 * n or not any(raw[:8 * n]):
        return None
    out = []
    for i in range(n):
        e = ctx.cu.CUgraphEdgeData()
        e.from_port, e.to_port, e.type = raw[8 * i], raw[8 * i + 1], raw[8 * i + 2]
        out.append(e)
    return out


def context(ctx, rec, h):
    """Live context for a recorded CUcontext member/argument (0: the current context)."""
    if h and h in ctx.handles:
        return ctx.handles[h]
    if h:
        from .context import ctx_or_primary
        return ctx_or_primary(ctx, rec, h)
    r = ctx.cu.cuCtxGetCurrent()
    return r[1] if len(r) > 1 and handle_int(r[0]) == 0 else ctx.cu.CUcontext(0)


def keep_forever(ctx, obj) -> None:
    """Host memory a graph node reads or writes whenever the graph runs: never released."""
    ctx.keepalive_images.append(obj)


def _note_once(ctx, key: str, msg: str) -> None:
    seen = ctx.graph_notes
    if key not in seen:
        seen.add(key)
        ctx.note(msg)


# ------------------------------------------------------------------ stream capture
def begin_capture(ctx, rec):
    a = rec["a"]
    s = ctx.stream(rec, a.get("hStream"))
    mode = ctx.cu.CUstreamCaptureMode(a.get("mode", 0))
    if ctx.drv(rec, "cuStreamBeginCapture", s, mode) is not None:
        ctx.capturing.add(a.get("hStream"))


def begin_capture_to_graph(ctx, rec):
    a = rec["a"]
    s = ctx.stream(rec, a.get("hStream"))
    g = graph(ctx, rec, a.get("hGraph"))
    deps = nodes(ctx, rec)
    mode = ctx.cu.CUstreamCaptureMode(a.get("mode", 0))
    if ctx.drv(rec, "cuStreamBeginCaptureToGraph", s, g, deps, edges(ctx, rec), len(deps), mode) is not None:
        ctx.capturing.add(a.get("hStream"))


def end_capture(ctx, rec):
    a = rec["a"]
    g = ctx.drv(rec, "cuStreamEndCapture", ctx.stream(rec, a.get("hStream")))
    ctx.capturing.discard(a.get("hStream"))
    if g is not None:
        ctx.set_handle(a.get("phGraph"), g, "graph")


def update_capture_deps(ctx, rec):
    a = rec["a"]
    deps = nodes(ctx, rec)
    ctx.drv(rec, "cuStreamUpdateCaptureDependencies", ctx.stream(rec, a.get("hStream")), deps, edges(ctx, rec),
           len(deps), a.get("flags", 0))


def _exchange_inputs(ctx) -> dict:
    """cuThreadExchangeStreamCaptureMode records only the mode it returned (the previous one):
    the mode a call set is what the next exchange on the same thread returned; the last one
    on a thread is taken to restore the thread's first mode."""
    if ctx.xmode_inputs is None:        # a pass over every call: once per snapshot in a kept worker
        from .. import keep
        ctx.xmode_inputs = keep.fact(("xmode_inputs", keep.reader_key(ctx.reader)), lambda: _xmode_inputs(ctx.reader))
    return ctx.xmode_inputs


def _xmode_inputs(reader) -> dict:
    m, by_tid = {}, {}
    for r in reader.records(("c",)):
        if r.get("f") == "cuThreadExchangeStreamCaptureMode" and r.get("r") == 0 \
                and isinstance((r.get("a") or {}).get("mode"), int):
            by_tid.setdefault(r.get("tid"), []).append(r)
    for lst in by_tid.values():
        for i, r in enumerate(lst):
            m[r.get("s")] = (lst[i + 1] if i + 1 < len(lst) else lst[0])["a"]["mode"]
    return m


def exchange_capture_mode(ctx, rec):
    mode = _exchange_inputs(ctx).get(rec.get("s"))
    if mode is None:
        mode = rec["a"].get("mode", 0) if isinstance(rec["a"].get("mode"), int) else 0
    ctx.drv(rec, "cuThreadExchangeStreamCaptureMode", ctx.cu.CUstreamCaptureMode(mode))


# ------------------------------------------------------------------ graphs
def _node_out(ctx, rec, n) -> None:
    if n is not None:
        ctx.set_handle(rec["a"].get("phGraphNode"), n, "graph node")


def node_list(ctx, rec):
    """A program that asks for a graph's nodes (to change a node of a captured graph, say) holds
    handles no creating call returned: the live graph is asked the same question and its
    answer maps the recorded handles in order (graphs built by the same calls list their nodes
    in the same order)."""
    base = strip_per_thread(rec["f"])
    base = base[:-3] if base.endswith("_v2") else base
    key, count_key, obj_key, kind = NODE_LISTS[base]
    rec_nodes = handle_array(rec, key, count_key)
    if not rec_nodes:                 # a count query (NULL array): nothing to map
        return
    a = rec["a"]
    obj = graph(ctx, rec, a.get(obj_key)) if kind == "graph" else ctx.live(rec, a.get(obj_key), kind)
    fn = base if hasattr(ctx.cu, base) else base + "_v2"
    out = ctx.drv(rec, fn, obj, len(rec_nodes))
    if out is None:
        return
    live = list(out[0])
    if len(live) < len(rec_nodes) or any(handle_int(n) == 0 for n in live[:len(rec_nodes)]):
        ctx.fail(rec, f"the replayed graph has {sum(1 for n in live if handle_int(n))} of the {len(rec_nodes)} "
                      f"nodes recorded")
    for h, n in zip(rec_nodes, live):      # a recorded value now names this node (values are reused)
        ctx.set_handle(h, n, "graph node")


def add_empty_node(ctx, rec):
    a = rec["a"]
    deps = nodes(ctx, rec)
    _node_out(ctx, rec, ctx.drv(rec, "cuGraphAddEmptyNode", graph(ctx, rec, a.get("hGraph")), deps, len(deps)))


def add_host_node(ctx, rec):
    # a host callback of the recorded process: an empty node with the same dependencies keeps
    # the order it imposed (later nodes depending on it still wait for its predecessors)
    a = rec["a"]
    deps = nodes(ctx, rec)
    n = ctx.raw("cuGraphAddEmptyNode", graph(ctx, rec, a.get("hGraph")), deps, len(deps))
    _node_out(ctx, rec, n)
    _note_once(ctx, "host", f"call #{rec.get('s')} {rec['f']}: graph host nodes (callbacks of the recorded "
                           f"process) are replayed as empty nodes")


def add_child_graph_node(ctx, rec):
    a = rec["a"]
    deps = nodes(ctx, rec)
    _node_out(ctx, rec, ctx.drv(rec, "cuGraphAddChildGraphNode", graph(ctx, rec, a.get("hGraph")), deps, len(deps),
                              graph(ctx, rec, a.get("childGraph"), "child graph")))


def add_event_node(ctx, rec):
    a = rec["a"]
    deps = nodes(ctx, rec)
    name = "cuGraphAddEventRecordNode" if "Record" in rec["f"] else "cuGraphAddEventWaitNode"
    _node_out(ctx, rec, ctx.drv(rec, name, graph(ctx, rec, a.get("hGraph")), deps, len(deps),
                              ctx.live(rec, a.get("event"), "event")))


def memset_params(ctx, rec, raw: bytearray, off: int = 0) -> bytearray:
    """Map the destination of a recorded CUDA_MEMSET_NODE_PARAMS at raw[off:] in place."""
    dst = _u64(raw, off)
    struct.pack_into("<Q", raw, off, ctx.tr(dst))
    ctx.mark_written(dst, rec.get("s"), rec["f"])
    return raw


def memcpy3d_params(ctx, rec, raw: bytearray, off: int = 0) -> bytearray:
    """Map both ends of a recorded CUDA_MEMCPY3D at raw[off:] in place: device memory to its
    live address, host memory only when it is a replayed pinned allocation."""
    for side, base in (("source", off), ("destination", off + 88)):
        mt = _u32(raw, base + 32)
        if mt in (MT_DEVICE, MT_UNIFIED):
            addr = _u64(raw, base + 48)
            if side == "destination":
                ctx.mark_written(addr, rec.get("s"), rec["f"])
            struct.pack_into("<Q", raw, base + 48, ctx.tr(addr))
        elif mt == MT_HOST:
            hp = _u64(raw, base + 40)
            al = ctx.space.find(hp) if ctx.space is not None else None
            if side == "source":
                ctx.fail(rec, f"the copy reads host memory of the recorded process ({hp:#x}) when the graph runs: "
                             f"those contents were not captured")
            if al is None or al.kind != "host":
                ctx.fail(rec, f"the copy writes host memory of the recorded process ({hp:#x}) that is not a "
                             f"replayed pinned allocation")
            struct.pack_into("<Q", raw, base + 40, ctx.tr(hp))
        elif mt == MT_ARRAY:
            struct.pack_into("<Q", raw, base + 56, int(ctx.live(rec, _u64(raw, base + 56), "array")))
    return raw


def _copy_node_handler(name: str, key: str, size: int, ctype: str, fix):
    """cuGraphAddMemsetNode / cuGraphAddMemcpyNode: the node's struct with its addresses
    translated (fix), on the recorded graph, dependencies and context."""
    def add_node(ctx, rec):
        a = rec["a"]
        p = fill_struct(getattr(ctx.cu, ctype)(), fix(ctx, rec, struct_bytes(ctx, rec, key, size, ctype)))
        deps = nodes(ctx, rec)
        _node_out(ctx, rec, ctx.drv(rec, name, graph(ctx, rec, a.get("hGraph")), deps, len(deps), p,
                                  context(ctx, rec, a.get("ctx"))))
    return add_node


add_memset_node = _copy_node_handler("cuGraphAddMemsetNode", "memsetParams", MEMSET_PARAMS_SIZE,
                                     "CUDA_MEMSET_NODE_PARAMS", memset_params)
add_memcpy_node = _copy_node_handler("cuGraphAddMemcpyNode", "copyParams", MEMCPY3D_SIZE, "CUDA_MEMCPY3D",
                                     memcpy3d_params)


class _KernelArgs:
    """Packed kernel arguments (x.params) handed to a kernel node through `extra`."""

    def __init__(self, data: bytes):
        self.buf = ctypes.create_string_buffer(data, max(len(data), 1))
        self.size = ctypes.c_size_t(len(data))
        self.extra = (ctypes.c_void_p * 5)(CU_LAUNCH_PARAM_BUFFER_POINTER, ctypes.addressof(self.buf),
                                           CU_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(self.size),
                                           CU_LAUNCH_PARAM_END)


def kernel_params(ctx, rec, raw: bytearray, off: int = 0) -> bytearray:
    """Rebuild a recorded CUDA_KERNEL_NODE_PARAMS at raw[off:] in place, or refuse."""
    x = rec.get("x") or {}
    params = x.get("params")
    if params is None:
        ctx.fail(rec, f"cannot rebuild the kernel node: {KERNEL_NODE_REASON}")
    from ..placement import relocate_params
    from ..functions import resolve_function
    h = _u64(raw, off) or _u64(raw, off + 56)          # func, else kern
    fn = resolve_function(ctx, rec, h)
    params = bytes(params)
    if ctx.space is not None and ctx.space.moved:
        params, changes = relocate_params(params, (ctx.fn_record(h, rec.get("s")) or {}).get("params"), ctx.space)
        ctx.res.params_relocated += len(changes)
    params = patch_conditional_handles(ctx, rec, params, (ctx.fn_record(h, rec.get("s")) or {}).get("params"))
    args = _KernelArgs(params)
    keep_forever(ctx, args)
    rec_ctx = _u64(raw, off + 64)
    # kernelParams @40 -> NULL, extra @48 -> packed buffer, kern @56 -> NULL (func is set), ctx @64
    struct.pack_into("<QQQQ", raw, off + 40, 0, ctypes.addressof(args.extra), 0,
                     handle_int(context(ctx, rec, rec_ctx)) if rec_ctx else 0)
    struct.pack_into("<Q", raw, off, handle_int(fn))
    return raw


def add_kernel_node(ctx, rec):
    a = rec["a"]
    raw = kernel_params(ctx, rec, struct_bytes(ctx, rec, "nodeParams", KERNEL_PARAMS_SIZE, "CUDA_KERNEL_NODE_PARAMS"))
    p = fill_struct(ctx.cu.CUDA_KERNEL_NODE_PARAMS(), raw)
    deps = nodes(ctx, rec)
    _node_out(ctx, rec, ctx.drv(rec, "cuGraphAddKernelNode", graph(ctx, rec, a.get("hGraph")), deps, len(deps), p))


def kernel_node_set_params(ctx, rec):
    a = rec["a"]
    raw = kernel_params(ctx, rec, struct_bytes(ctx, rec, "nodeParams", KERNEL_PARAMS_SIZE, "CUDA_KERNEL_NODE_PARAMS"))
    p = fill_struct(ctx.cu.CUDA_KERNEL_NODE_PARAMS(), raw)
    node = ctx.live(rec, a.get("hNode"), "graph node")
    if "Exec" in rec["f"]:
        ctx.drv(rec, "cuGraphExecKernelNodeSetParams", ctx.live(rec, a.get("hGraphExec"), "graph exec"), node, p)
    else:
        ctx.drv(rec, "cuGraphKernelNodeSetParams", node, p)


def node_params(ctx, rec, key: str = "nodeParams"):
    """Rebuild a recorded CUgraphNodeParams (cuGraphAddNode, cuGraph(Exec)NodeSetParams).
    Returns (params object, node type, conditional body buffer or None)."""
    raw = struct_bytes(ctx, rec, key, NODE_PARAMS_SIZE, "CUgraphNodeParams")
    t = _u32(raw, 0)
    u = NP_UNION
    bodies = None
    if t == NT_KERNEL:
        kernel_params(ctx, rec, raw, u)
    elif t == NT_MEMCPY:
        # CUDA_MEMCPY_NODE_PARAMS: flags, reserved, copyCtx @8, copyParams @16
        memcpy3d_params(ctx, rec, raw, u + 16)
        c = _u64(raw, u + 8)
        struct.pack_into("<Q", raw, u + 8, handle_int(context(ctx, rec, c)) if c else 0)
    elif t == NT_MEMSET:
        memset_params(ctx, rec, raw, u)
        c = _u64(raw, u + 40)
        struct.pack_into("<Q", raw, u + 40, handle_int(context(ctx, rec, c)) if c else 0)
    elif t == NT_HOST:
        raw[:] = bytes(NODE_PARAMS_SIZE)
        struct.pack_into("<I", raw, 0, NT_EMPTY)
        _note_once(ctx, "host", f"call #{rec.get('s')} {rec['f']}: graph host nodes (callbacks of the recorded "
                               f"process) are replayed as empty nodes")
    elif t == NT_GRAPH:
        struct.pack_into("<Q", raw, u, handle_int(graph(ctx, rec, _u64(raw, u), "child graph")))
    elif t in (NT_WAIT_EVENT, NT_EVENT_RECORD):
        struct.pack_into("<Q", raw, u, handle_int(ctx.live(rec, _u64(raw, u), "event")))
    elif t == NT_EMPTY:
        pass
    elif t == NT_CONDITIONAL:
        # CUDA_CONDITIONAL_NODE_PARAMS: handle, type, size, phGraph_out (driver-written array), ctx
        rec_handle, size = _u64(raw, u), _u32(raw, u + 12)
        live_h = ctx.handles.get(rec_handle)
        if live_h is None:
            ctx.fail(rec, f"conditional handle {rec_handle:#x} is unknown (its cuGraphConditionalHandleCreate "
                         f"was not replayed)")
        bodies = (ctypes.c_uint64 * max(size, 1))()
        keep_forever(ctx, bodies)
        c = _u64(raw, u + 24)
        struct.pack_into("<Q", raw, u, handle_int(live_h))
        struct.pack_into("<Q", raw, u + 16, ctypes.addressof(bodies))
        struct.pack_into("<Q", raw, u + 24, handle_int(context(ctx, rec, c)) if c else 0)
        bodies = (bodies, size)
    else:
        ctx.fail(rec, f"{NODE_TYPE_NAMES.get(t, f'type {t}')} nodes are not supported by the replayer")
    return fill_struct(ctx.cu.CUgraphNodeParams(), raw), t, bodies


def add_node(ctx, rec):
    a = rec["a"]
    p, _t, bodies = node_params(ctx, rec)
    deps = nodes(ctx, rec)
    n = ctx.drv(rec, "cuGraphAddNode", graph(ctx, rec, a.get("hGraph")), deps, edges(ctx, rec), len(deps), p)
    _node_out(ctx, rec, n)
    if n is not None and bodies is not None:
        ctx.cond_bodies.extend(_body_graphs(ctx, rec, p, *bodies))


def _body_graphs(ctx, rec, p, arr, size: int) -> List[Any]:
    """The body graphs the driver made for a conditional node. cuda-bindings hands the driver an
    array of its own for phGraph_out (read back through the struct), not the one the recorded
    struct was given; either one holds them."""
    try:
        got = [g for g in p.conditional.phGraph_out][:size]
    except (AttributeError, TypeError, ValueError):
        got = []
    if len(got) < size or not all(handle_int(g) for g in got):
        got = [ctx.cu.CUgraph(arr[i]) for i in range(size)]
    if not all(handle_int(g) for g in got):
        ctx.fail(rec, "the driver gave no body graph for the conditional node")
    return got


def node_set_params(ctx, rec):
    a = rec["a"]
    p, t, _bodies = node_params(ctx, rec)
    if t == NT_CONDITIONAL:
        ctx.fail(rec, "changing a conditional node's parameters is not supported")
    node = ctx.live(rec, a.get("hNode"), "graph node")
    if "Exec" in rec["f"]:
        ctx.drv(rec, "cuGraphExecNodeSetParams", ctx.live(rec, a.get("hGraphExec"), "graph exec"), node, p)
    else:
        ctx.drv(rec, "cuGraphNodeSetParams", node, p)


def memset_node_set_params(ctx, rec):
    a = rec["a"]
    key = "memsetParams" if "Exec" in rec["f"] else "nodeParams"
    p = fill_struct(ctx.cu.CUDA_MEMSET_NODE_PARAMS(),
              memset_params(ctx, rec, struct_bytes(ctx, rec, key, MEMSET_PARAMS_SIZE, "CUDA_MEMSET_NODE_PARAMS")))
    node = ctx.live(rec, a.get("hNode"), "graph node")
    if "Exec" in rec["f"]:
        ctx.drv(rec, "cuGraphExecMemsetNodeSetParams", ctx.live(rec, a.get("hGraphExec"), "graph exec"), node, p,
               context(ctx, rec, a.get("ctx")))
    else:
        ctx.drv(rec, "cuGraphMemsetNodeSetParams", node, p)


def memcpy_node_set_params(ctx, rec):
    a = rec["a"]
    key = "copyParams" if "Exec" in rec["f"] else "nodeParams"
    p = fill_struct(ctx.cu.CUDA_MEMCPY3D(), memcpy3d_params(ctx, rec, struct_bytes(ctx, rec, key, MEMCPY3D_SIZE,
                                                                                "CUDA_MEMCPY3D")))
    node = ctx.live(rec, a.get("hNode"), "graph node")
    if "Exec" in rec["f"]:
        ctx.drv(rec, "cuGraphExecMemcpyNodeSetParams", ctx.live(rec, a.get("hGraphExec"), "graph exec"), node, p,
               context(ctx, rec, a.get("ctx")))
    else:
        ctx.drv(rec, "cuGraphMemcpyNodeSetParams", node, p)


def event_node_set_event(ctx, rec):
    a = rec["a"]
    f = rec["f"]
    name = "cuGraph" + ("Exec" if "Exec" in f else "") + ("EventRecord" if "Record" in f else "EventWait") \
        + "NodeSetEvent"
    node = ctx.live(rec, a.get("hNode"), "graph node")
    ev = ctx.live(rec, a.get("event"), "event")
    if "Exec" in f:
        ctx.drv(rec, name, ctx.live(rec, a.get("hGraphExec"), "graph exec"), node, ev)
    else:
        ctx.drv(rec, name, node, ev)


def exec_child_set_params(ctx, rec):
    a = rec["a"]
    ctx.drv(rec, "cuGraphExecChildGraphNodeSetParams", ctx.live(rec, a.get("hGraphExec"), "graph exec"),
           ctx.live(rec, a.get("hNode"), "graph node"), graph(ctx, rec, a.get("childGraph"), "child graph"))


def node_set_enabled(ctx, rec):
    a = rec["a"]
    ctx.drv(rec, "cuGraphNodeSetEnabled", ctx.live(rec, a.get("hGraphExec"), "graph exec"),
           ctx.live(rec, a.get("hNode"), "graph node"), a.get("isEnabled", 1))


def graph_dependencies(ctx, rec):
    a = rec["a"]
    frm = nodes(ctx, rec, "from")
    to = nodes(ctx, rec, "to")
    name = "cuGraphAddDependencies" if "Add" in rec["f"] else "cuGraphRemoveDependencies"
    ctx.drv(rec, name, graph(ctx, rec, a.get("hGraph")), frm, to, edges(ctx, rec, "edgeData"), len(frm))


def kernel_node_attributes(ctx, rec):
    # scheduling attributes of kernel nodes (access policy windows, priorities, clusters of
    # nodes this replayer builds only from captured streams): no effect on results
    pass


# ------------------------------------------------------------------ conditional handles
def conditional_handle_create(ctx, rec):
    a = rec["a"]
    h = ctx.drv(rec, "cuGraphConditionalHandleCreate", graph(ctx, rec, a.get("hGraph")),
               context(ctx, rec, a.get("ctx")), a.get("defaultLaunchValue", 0), a.get("flags", 0))
    if h is None:
        return
    rec_h = a.get("pHandle_out")
    ctx.set_handle(rec_h, h, "conditional handle")
    if isinstance(rec_h, int) and rec_h and handle_int(h) != rec_h:
        ctx.cond_handles[rec_h] = handle_int(h)


def patch_conditional_handles(ctx, rec, params: bytes, layout) -> bytes:
    """Kernels set conditional handles they receive as 8-byte arguments: a recorded handle value
    the live driver gave differently is replaced (8-byte parameters of the layout only)."""
    m = ctx.cond_handles
    if not m or not layout:
        return params
    out = None
    for off, size in layout:
        if size != 8 or off + 8 > len(params):
            continue
        v = _u64(params, off)
        if v in m:
            out = out or bytearray(params)
            struct.pack_into("<Q", out, off, m[v])
    return bytes(out) if out is not None else params


# ------------------------------------------------------------------ executable graphs
def graph_instantiate(ctx, rec):
    a = rec["a"]
    flags = a.get("flags", 0) if isinstance(a.get("flags"), int) else 0
    g = graph(ctx, rec, a.get("hGraph"))
    fn = "cuGraphInstantiateWithFlags" if hasattr(ctx.cu, "cuGraphInstantiateWithFlags") else "cuGraphInstantiate"
    ex = ctx.drv(rec, fn, g, flags)
    if ex is not None:
        ctx.set_handle(a.get("phGraphExec"), ex, "graph exec")


def graph_instantiate_params(ctx, rec):
    a = rec["a"]
    raw = a.get("instantiateParams")
    g = graph(ctx, rec, a.get("hGraph"))
    if not isinstance(raw, (bytes, bytearray)) or len(raw) < 32:
        ctx.fail(rec, "the CUDA_GRAPH_INSTANTIATE_PARAMS struct was not captured")
    flags, up = _u64(raw, 0), _u64(raw, 8)
    p = ctx.cu.CUDA_GRAPH_INSTANTIATE_PARAMS()
    p.flags = flags
    if up:
        p.hUploadStream = ctx.stream(rec, up)
    ex = ctx.drv(rec, "cuGraphInstantiateWithParams", g, p)
    if ex is not None:
        ctx.set_handle(a.get("phGraphExec"), ex, "graph exec")


def graph_launch(ctx, rec):
    a = rec["a"]
    name = "cuGraphUpload" if rec["f"].startswith("cuGraphUpload") else "cuGraphLaunch"
    ctx.drv(rec, name, ctx.live(rec, a.get("hGraph") or a.get("hGraphExec"), "graph exec"),
           ctx.stream(rec, a.get("hStream")))
    if name == "cuGraphLaunch":
        ctx.res.launches += 1


def graph_exec_update(ctx, rec):
    a = rec["a"]
    ctx.drv(rec, "cuGraphExecUpdate", ctx.live(rec, a.get("hGraphExec"), "graph exec"),
           graph(ctx, rec, a.get("hGraph")))
