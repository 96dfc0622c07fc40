"""Streams, events and graphs in the exported program: the recorded stream a call names, stream
capture (which streams are capturing, and into which capture an event record pulls a waiting
stream), graph instantiation, graphs built node by node (GraphNodeCalls), and the generic
translation of calls made only of values and handles (from the API description).  StreamCalls
is a part of Emitter (export/emit.py).

Graphs built node by node (cuGraphAdd*Node, cuGraphAddNode, cuGraph*SetParams, as XLA's command
buffers build theirs) are rebuilt from the recorded structs, as the replayer rebuilds them: node
handles live in the program's gnode[] array; a kernel node names the exported module's function
and carries its recorded packed arguments through CU_LAUNCH_PARAM_BUFFER_POINTER; device
pointers inside the structs are recorded addresses (allocations are placed there).  Each node is
added through its typed call (cuGraphAddKernelNode, cuGraphAddMemsetNode, ...), whose form is
the same from CUDA 12.0 on; edge data (ports, programmatic edges) becomes plain dependencies,
which order the work at least as strictly."""
from __future__ import annotations

import struct
from typing import List, Tuple

from cudasnap.formats.vocab import NODE_LISTS, handle_array, in_class
from .ctext import ARRAYS, lit, ref

# CUgraphNodeType
NT_KERNEL, NT_MEMCPY, NT_MEMSET, NT_HOST, NT_GRAPH, NT_EMPTY, NT_WAIT_EVENT, NT_EVENT_RECORD = range(8)
NODE_TYPE_NAMES = {8: "external semaphore signal", 9: "external semaphore wait", 10: "graph memory allocation",
                   11: "graph memory free", 12: "batch memory operation", 13: "conditional"}
NODE_PARAMS_SIZE = 256          # CUgraphNodeParams: type, reserved0[3], the union at 16, reserved2
NP_UNION = 16
KNODE_V1, KNODE_V2 = 56, 72     # CUDA_KERNEL_NODE_PARAMS v1 (no kern, ctx) and v2
KNODE = struct.Struct("<Q7I")   # func, gridDim x y z, blockDim x y z, sharedMemBytes
MEMSET_NODE = struct.Struct("<QQIIQQ")   # dst, pitch, value, elementSize, width, height (40 bytes)
MEMCPY3D_SIZE = 200
MT_HOST, MT_DEVICE, MT_ARRAY, MT_UNIFIED = 1, 2, 3, 4
KNODE_ATTR_WITH_EVENT = {7: "programmatic event", 12: "launch completion event"}


def _u64(b, o: int) -> int:
    return struct.unpack_from("<Q", b, o)[0]


def _u32(b, o: int) -> int:
    return struct.unpack_from("<I", b, o)[0]


class GraphNodeCalls:
    """Emitter's translation of graphs built node by node."""

    def _struct(self, rec, key: str, size: int, what: str, min_size: int = 0) -> bytes:
        raw = (rec.get("a") or {}).get(key)
        if not isinstance(raw, (bytes, bytearray)) or len(raw) < (min_size or size):
            self.fail(rec, f"the {what} struct ({key}) was not captured")
        return bytes(raw[:size]).ljust(size, b"\0")

    def _nodes(self, rec, key: str, count_key: str = "numDependencies") -> List[str]:
        """The program's nodes for a recorded array of node handles."""
        hs = handle_array(rec, key, count_key)
        if hs is None:
            self.fail(rec, f"the {key} array ({rec['a'].get(count_key)} graph nodes) was not captured")
        return [self.handle(rec, "graph_node", h, "graph node") for h in hs]

    def _edges_note(self, rec, key: str, count_key: str = "numDependencies") -> None:
        raw = rec["a"].get(key)
        n = int(rec["a"].get(count_key) or 0)
        if isinstance(raw, (bytes, bytearray)) and any(raw[:8 * n]):
            self.note_once("edgedata", f"call #{rec.get('s')} {rec['f']}: graph edge data (ports, programmatic "
                                       f"edges) is exported as plain dependencies")

    def _deps(self, rec) -> Tuple[List[str], str, int]:
        """(declaration, C expression, count) of a node call's dependencies."""
        refs = self._nodes(rec, "dependencies")
        self._edges_note(rec, "dependencyData")
        if not refs:
            return [], "NULL", 0
        return [f"CUgraphNode d_[] = {{{', '.join(refs)}}};"], "d_", len(refs)

    def _node_ctx(self, rec, h) -> List[str]:
        """c_: the context a node runs in, the recorded one or (0) the current one."""
        if h:
            return [f"CUcontext c_ = {self.context(rec, h)};"]
        return ["CUcontext c_ = NULL;", 'CKN("cuCtxGetCurrent", cuCtxGetCurrent(&c_));']

    def _kernel_setup(self, rec, raw: bytes, off: int = 0, v2: bool = True) -> List[str]:
        """k_: a CUDA_KERNEL_NODE_PARAMS of the exported program for the recorded one at raw[off:]."""
        if (rec.get("x") or {}).get("params") is None:
            self.fail(rec, "the kernel node's packed arguments were not captured (x.params): the recorded "
                           "CUDA_KERNEL_NODE_PARAMS holds only host pointers of the recorded process")
        func, gx, gy, gz, bx, by, bz, shm = KNODE.unpack_from(raw, off)
        kern = _u64(raw, off + 56) if v2 else 0
        rctx = _u64(raw, off + 64) if v2 else 0
        fexpr, name = self.function(rec, func or kern)
        self.kid(name)
        p, k = self._params(rec)
        out = ["CUDA_KERNEL_NODE_PARAMS k_;", "memset(&k_, 0, sizeof k_);",
               f"k_.func = {fexpr};" if func else f"k_.kern = (CUkernel){fexpr};",
               f"k_.gridDimX = {gx}; k_.gridDimY = {gy}; k_.gridDimZ = {gz};",
               f"k_.blockDimX = {bx}; k_.blockDimY = {by}; k_.blockDimZ = {bz}; k_.sharedMemBytes = {shm};"]
        if p:
            out += [f"size_t kn_ = {len(p)};",
                    f"void *kx_[] = {{CU_LAUNCH_PARAM_BUFFER_POINTER, params_live(P{k}, {len(p)}), "
                    f"CU_LAUNCH_PARAM_BUFFER_SIZE, &kn_, CU_LAUNCH_PARAM_END}};", "k_.extra = kx_;"]
        if rctx:
            out.append(f"k_.ctx = {self.context(rec, rctx)};")
        return out

    def _memset_setup(self, rec, raw: bytes, off: int = 0) -> List[str]:
        """m_: a CUDA_MEMSET_NODE_PARAMS for the recorded one at raw[off:]."""
        dst, pitch, value, esize, width, height = MEMSET_NODE.unpack_from(raw, off)
        return ["CUDA_MEMSET_NODE_PARAMS m_;", "memset(&m_, 0, sizeof m_);",
                f"m_.dst = TR({lit(dst)}); m_.pitch = {lit(pitch)}; m_.value = {lit(value)}; "
                f"m_.elementSize = {esize}; m_.width = {lit(width)}; m_.height = {lit(height)};"]

    def _memcpy_setup(self, rec, raw: bytes, off: int = 0) -> List[str]:
        """y_: a CUDA_MEMCPY3D for the recorded one at raw[off:]; device (and unified) ends only."""
        desc = bytes(raw[off:off + MEMCPY3D_SIZE])
        for side, base in (("source", 0), ("destination", 88)):
            mt = _u32(desc, base + 32)
            if mt == MT_HOST:
                self.fail(rec, f"the copy node's {side} is host memory of the recorded process (not exported: "
                               f"the program does not rebuild host buffers a graph reads or writes)")
            if mt == MT_ARRAY:
                self.fail(rec, "copy nodes with CUDA arrays are not exported")
        k = self.descs.setdefault(desc, len(self.descs))
        return ["CUDA_MEMCPY3D y_;", "_Static_assert(sizeof(CUDA_MEMCPY3D) == 200, \"CUDA_MEMCPY3D is 200 bytes\");",
                f"memcpy(&y_, D{k}, sizeof y_);", "y_.srcDevice = TR(y_.srcDevice); y_.dstDevice = TR(y_.dstDevice);"]

    def _add(self, rec, setup: List[str], call: str) -> None:
        """Add a node: call is the driver call with {node}, {graph}, {deps} and {n} to fill."""
        a = rec["a"]
        g = self.handle(rec, "graph", a.get("hGraph"))
        decl, deps, n = self._deps(rec)
        i = self.slots.new("graph_node", a.get("phGraphNode"))
        c = call.format(node=f"&{ref('graph_node', i)}", graph=g, deps=deps, n=n)
        self.emit(rec, "{", *setup, *decl, f"CK({c});", "}")

    def e_graph_add_kernel(self, rec) -> None:
        v2 = "_v2" in rec["f"]          # cuGraphAddKernelNode (v1 ABI): 56 bytes, no kern, ctx
        raw = self._struct(rec, "nodeParams", KNODE_V2, "CUDA_KERNEL_NODE_PARAMS", KNODE_V2 if v2 else KNODE_V1)
        self._add(rec, self._kernel_setup(rec, raw, 0, v2), "cuGraphAddKernelNode({node}, {graph}, {deps}, {n}, &k_)")

    def e_graph_add_memset(self, rec) -> None:
        raw = self._struct(rec, "memsetParams", MEMSET_NODE.size, "CUDA_MEMSET_NODE_PARAMS")
        setup = self._memset_setup(rec, raw) + self._node_ctx(rec, rec["a"].get("ctx"))
        self._add(rec, setup, "cuGraphAddMemsetNode({node}, {graph}, {deps}, {n}, &m_, c_)")

    def e_graph_add_memcpy(self, rec) -> None:
        raw = self._struct(rec, "copyParams", MEMCPY3D_SIZE, "CUDA_MEMCPY3D")
        setup = self._memcpy_setup(rec, raw) + self._node_ctx(rec, rec["a"].get("ctx"))
        self._add(rec, setup, "cuGraphAddMemcpyNode({node}, {graph}, {deps}, {n}, &y_, c_)")

    def e_graph_add_empty(self, rec) -> None:
        if rec["f"].startswith("cuGraphAddHostNode"):
            self._host_node_note(rec)
        self._add(rec, [], "cuGraphAddEmptyNode({node}, {graph}, {deps}, {n})")

    def e_node_list(self, rec) -> None:
        """cuGraphGetNodes and its kin: ask the exported graph, name the recorded nodes by position."""
        from cudasnap.formats.abi import strip_per_thread
        base = strip_per_thread(rec["f"])
        base = base[:-3] if base.endswith("_v2") else base
        key, count_key, obj_key, kind = NODE_LISTS[base]
        hs = handle_array(rec, key, count_key)
        if not hs:                          # a count query: nothing the program keeps
            return
        a = rec["a"]
        obj = self.handle(rec, kind.replace(" ", "_"), a.get(obj_key))
        extra = ", NULL" if rec["f"].endswith("_v2") else ""        # _v2: the edge data array
        lines = [f"CUgraphNode l_[{len(hs)}];", f"size_t n_ = {len(hs)};", f"CK({rec['f']}({obj}, l_{extra}, &n_));"]
        for i, h in enumerate(hs):
            lines.append(f"{ref('graph_node', self.slots.new('graph_node', h))} = l_[{i}];")
        self.emit(rec, "{", *lines, "}")

    def _host_node_note(self, rec) -> None:
        self.note_once("hostnode", f"graph host nodes (callbacks of the recorded process) are exported as empty "
                                   f"nodes (first: call #{rec.get('s')} {rec['f']})")

    def e_graph_add_event(self, rec) -> None:
        name = "cuGraphAddEventRecordNode" if "Record" in rec["f"] else "cuGraphAddEventWaitNode"
        ev = self.handle(rec, "event", rec["a"].get("event"))
        self._add(rec, [], f"{name}({{node}}, {{graph}}, {{deps}}, {{n}}, {ev})")

    def e_graph_add_child(self, rec) -> None:
        child = self.handle(rec, "graph", rec["a"].get("childGraph"), "child graph")
        self._add(rec, [], f"cuGraphAddChildGraphNode({{node}}, {{graph}}, {{deps}}, {{n}}, {child})")

    def _node_type(self, rec, raw: bytes) -> int:
        t = _u32(raw, 0)
        if t in NODE_TYPE_NAMES:
            self.fail(rec, f"{NODE_TYPE_NAMES[t]} graph nodes (CUgraphNodeType {t}) are not exported; replay the "
                           f"snapshot with `cudasnap replay`")
        if t > NT_EVENT_RECORD:
            self.fail(rec, f"graph node type {t} is unknown to export")
        return t

    def e_graph_add_node(self, rec) -> None:
        """cuGraphAddNode: through the typed call of the node's type."""
        raw = self._struct(rec, "nodeParams", NODE_PARAMS_SIZE, "CUgraphNodeParams")
        t, u = self._node_type(rec, raw), NP_UNION
        if t == NT_KERNEL:
            self._add(rec, self._kernel_setup(rec, raw, u), "cuGraphAddKernelNode({node}, {graph}, {deps}, {n}, &k_)")
        elif t == NT_MEMSET:       # CUDA_MEMSET_NODE_PARAMS_v2: the v1 fields, ctx at 40
            setup = self._memset_setup(rec, raw, u) + self._node_ctx(rec, _u64(raw, u + 40))
            self._add(rec, setup, "cuGraphAddMemsetNode({node}, {graph}, {deps}, {n}, &m_, c_)")
        elif t == NT_MEMCPY:       # CUDA_MEMCPY_NODE_PARAMS: flags, reserved, copyCtx at 8, copyParams at 16
            setup = self._memcpy_setup(rec, raw, u + 16) + self._node_ctx(rec, _u64(raw, u + 8))
            self._add(rec, setup, "cuGraphAddMemcpyNode({node}, {graph}, {deps}, {n}, &y_, c_)")
        elif t in (NT_EMPTY, NT_HOST):
            if t == NT_HOST:
                self._host_node_note(rec)
            self._add(rec, [], "cuGraphAddEmptyNode({node}, {graph}, {deps}, {n})")
        elif t in (NT_EVENT_RECORD, NT_WAIT_EVENT):
            name = "cuGraphAddEventRecordNode" if t == NT_EVENT_RECORD else "cuGraphAddEventWaitNode"
            ev = self.handle(rec, "event", _u64(raw, u))
            self._add(rec, [], f"{name}({{node}}, {{graph}}, {{deps}}, {{n}}, {ev})")
        else:                      # NT_GRAPH: CUDA_CHILD_GRAPH_NODE_PARAMS, the graph first
            child = self.handle(rec, "graph", _u64(raw, u), "child graph")
            self._add(rec, [], f"cuGraphAddChildGraphNode({{node}}, {{graph}}, {{deps}}, {{n}}, {child})")

    def e_graph_deps(self, rec) -> None:
        """cuGraphAddDependencies / cuGraphRemoveDependencies: CUDA 12.3 added edge data to both."""
        a = rec["a"]
        g = self.handle(rec, "graph", a.get("hGraph"))
        frm, to = self._nodes(rec, "from"), self._nodes(rec, "to")
        self._edges_note(rec, "edgeData")
        name = "cuGraphAddDependencies" if "Add" in rec["f"] else "cuGraphRemoveDependencies"
        n = len(frm)
        if not n:
            self.res.no_effect += 1
            return
        self.emit(rec, "{", f"CUgraphNode f_[] = {{{', '.join(frm)}}}, t_[] = {{{', '.join(to)}}};",
                  f"\n#if CUDA_VERSION >= 12030\n    CK({name}({g}, f_, t_, NULL, {n}));"
                  f"\n#else\n    CK({name}({g}, f_, t_, {n}));\n#endif\n   ", "}")

    def _exec(self, rec) -> str:
        return self.handle(rec, "graph_exec", rec["a"].get("hGraphExec"), "executable graph")

    def e_kernel_node_set(self, rec) -> None:
        a = rec["a"]
        v2 = "_v2" in rec["f"]
        raw = self._struct(rec, "nodeParams", KNODE_V2, "CUDA_KERNEL_NODE_PARAMS", KNODE_V2 if v2 else KNODE_V1)
        node = self.handle(rec, "graph_node", a.get("hNode"), "graph node")
        setup = self._kernel_setup(rec, raw, 0, v2)
        if "Exec" in rec["f"]:
            self.emit(rec, "{", *setup, f"CK(cuGraphExecKernelNodeSetParams({self._exec(rec)}, {node}, &k_));", "}")
        else:
            self.emit(rec, "{", *setup, f"CK(cuGraphKernelNodeSetParams({node}, &k_));", "}")

    def e_memset_node_set(self, rec) -> None:
        a = rec["a"]
        node = self.handle(rec, "graph_node", a.get("hNode"), "graph node")
        if "Exec" in rec["f"]:
            raw = self._struct(rec, "memsetParams", MEMSET_NODE.size, "CUDA_MEMSET_NODE_PARAMS")
            setup = self._memset_setup(rec, raw) + self._node_ctx(rec, a.get("ctx"))
            self.emit(rec, "{", *setup, f"CK(cuGraphExecMemsetNodeSetParams({self._exec(rec)}, {node}, &m_, c_));", "}")
        else:
            setup = self._memset_setup(rec, self._struct(rec, "nodeParams", MEMSET_NODE.size,
                                                         "CUDA_MEMSET_NODE_PARAMS"))
            self.emit(rec, "{", *setup, f"CK(cuGraphMemsetNodeSetParams({node}, &m_));", "}")

    def e_memcpy_node_set(self, rec) -> None:
        a = rec["a"]
        node = self.handle(rec, "graph_node", a.get("hNode"), "graph node")
        if "Exec" in rec["f"]:
            setup = self._memcpy_setup(rec, self._struct(rec, "copyParams", MEMCPY3D_SIZE, "CUDA_MEMCPY3D"))
            setup += self._node_ctx(rec, a.get("ctx"))
            self.emit(rec, "{", *setup, f"CK(cuGraphExecMemcpyNodeSetParams({self._exec(rec)}, {node}, &y_, c_));", "}")
        else:
            setup = self._memcpy_setup(rec, self._struct(rec, "nodeParams", MEMCPY3D_SIZE, "CUDA_MEMCPY3D"))
            self.emit(rec, "{", *setup, f"CK(cuGraphMemcpyNodeSetParams({node}, &y_));", "}")

    def e_node_set(self, rec) -> None:
        """cuGraphNodeSetParams / cuGraphExecNodeSetParams: through the typed call of the node's type."""
        a = rec["a"]
        raw = self._struct(rec, "nodeParams", NODE_PARAMS_SIZE, "CUgraphNodeParams")
        t, u = self._node_type(rec, raw), NP_UNION
        node = self.handle(rec, "graph_node", a.get("hNode"), "graph node")
        ex = self._exec(rec) if "Exec" in rec["f"] else None
        if t == NT_KERNEL:
            setup = self._kernel_setup(rec, raw, u)
            call = (f"cuGraphExecKernelNodeSetParams({ex}, {node}, &k_)" if ex
                    else f"cuGraphKernelNodeSetParams({node}, &k_)")
        elif t == NT_MEMSET:
            setup = self._memset_setup(rec, raw, u)
            if ex:
                setup += self._node_ctx(rec, _u64(raw, u + 40))
            call = (f"cuGraphExecMemsetNodeSetParams({ex}, {node}, &m_, c_)" if ex
                    else f"cuGraphMemsetNodeSetParams({node}, &m_)")
        elif t == NT_MEMCPY:
            setup = self._memcpy_setup(rec, raw, u + 16)
            if ex:
                setup += self._node_ctx(rec, _u64(raw, u + 8))
            call = (f"cuGraphExecMemcpyNodeSetParams({ex}, {node}, &y_, c_)" if ex
                    else f"cuGraphMemcpyNodeSetParams({node}, &y_)")
        elif t in (NT_EVENT_RECORD, NT_WAIT_EVENT):
            setup = []
            ev = self.handle(rec, "event", _u64(raw, u))
            name = "EventRecord" if t == NT_EVENT_RECORD else "EventWait"
            call = (f"cuGraphExec{name}NodeSetEvent({ex}, {node}, {ev})" if ex
                    else f"cuGraph{name}NodeSetEvent({node}, {ev})")
        elif t == NT_GRAPH and ex:
            setup = []
            child = self.handle(rec, "graph", _u64(raw, u), "child graph")
            call = f"cuGraphExecChildGraphNodeSetParams({ex}, {node}, {child})"
        elif t in (NT_EMPTY, NT_HOST):
            self.res.no_effect += 1      # nothing to set (host nodes are exported as empty nodes)
            return
        else:
            self.fail(rec, "setting a child graph node's graph in place is not exported")
        self.emit(rec, "{", *setup, f"CK({call});", "}")

    def e_exec_update(self, rec) -> None:
        a = rec["a"]
        g = self.handle(rec, "graph", a.get("hGraph"))
        self.emit(rec, "{", "CUgraphExecUpdateResultInfo u_;",
                  f"CK(cuGraphExecUpdate({self._exec(rec)}, {g}, &u_));", "}")

    def e_knode_attr(self, rec) -> None:
        a = rec["a"]
        aid = int(a.get("attr", 0) or 0)
        val = a.get("value")
        if aid in KNODE_ATTR_WITH_EVENT:
            self.note_once(f"knattr{aid}", f"call #{rec.get('s')} {rec['f']}: kernel node attribute {aid} "
                                           f"({KNODE_ATTR_WITH_EVENT[aid]}) is left out (it names an event of the "
                                           f"recording; the node keeps its dependencies)")
            self.res.no_effect += 1
            return
        if not isinstance(val, (bytes, bytearray)) or len(val) < 64:
            self.fail(rec, "the CUkernelNodeAttrValue struct (value) was not captured")
        node = self.handle(rec, "graph_node", a.get("hNode"), "graph node")
        k = self.descs.setdefault(bytes(val[:64]), len(self.descs))
        self.emit(rec, "{", "CUkernelNodeAttrValue v_;", f"memcpy(&v_, D{k}, sizeof v_);",
                  f"CK(cuGraphKernelNodeSetAttribute({node}, (CUkernelNodeAttrID){aid}, &v_));", "}")


class StreamCalls(GraphNodeCalls):
    """Emitter's translation of the stream, event and graph calls."""

    def stream(self, rec, h) -> str:
        f = rec.get("f") or ""
        if not h:
            return "STREAM_PER_THREAD" if ("_ptsz" in f or "_ptds" in f) else "(CUstream)0"
        if h == 1:
            return "STREAM_LEGACY"
        if h == 2:
            return "STREAM_PER_THREAD"
        i = self.slots.get("stream", h)
        if i is None:
            self.fail(rec, f"stream {h:#x} was not created by a recorded call")
        return ref("stream", i)

    def skey(self, rec, h):
        """A recorded stream as the capture bookkeeping keys it."""
        f = rec.get("f") or ""
        if not h:
            return 2 if ("_ptsz" in f or "_ptds" in f) else 0
        return h

    def in_capture(self, rec, h) -> bool:
        return self.skey(rec, h) in self.capturing

    def e_begin_capture(self, rec) -> None:
        a = rec["a"]
        hs = a.get("hStream")
        mode = int(a.get("mode", 0) or 0)
        self.emit(rec, f"CK(cuStreamBeginCapture({self.stream(rec, hs)}, (CUstreamCaptureMode){mode}));")
        k = self.skey(rec, hs)
        self.capturing[k] = k

    def e_begin_capture_to_graph(self, rec) -> None:
        """A capture into an existing graph, after the given nodes (XLA's command buffers)."""
        a = rec["a"]
        hs = a.get("hStream")
        g = self.handle(rec, "graph", a.get("hGraph"))
        decl, deps, n = self._deps(rec)
        mode = int(a.get("mode", 0) or 0)
        self.emit(rec, "{", *decl, f"CK(cuStreamBeginCaptureToGraph({self.stream(rec, hs)}, {g}, {deps}, NULL, {n}, "
                                   f"(CUstreamCaptureMode){mode}));", "}")
        k = self.skey(rec, hs)
        self.capturing[k] = k

    def e_end_capture(self, rec) -> None:
        a = rec["a"]
        hs = a.get("hStream")
        known = self.slots.get("graph", a.get("phGraph"))
        if known is not None:       # a capture into an existing graph ends with that graph
            self.emit(rec, "{", "CUgraph g_;", f"CK(cuStreamEndCapture({self.stream(rec, hs)}, &g_));", "}")
        else:
            i = self.slots.new("graph", a.get("phGraph"))
            self.emit(rec, f"CK(cuStreamEndCapture({self.stream(rec, hs)}, &{ref('graph', i)}));")
        origin = self.capturing.get(self.skey(rec, hs))
        for s in [s for s, o in self.capturing.items() if o == origin]:
            del self.capturing[s]

    def e_instantiate(self, rec) -> None:
        a = rec["a"]
        g = self.handle(rec, "graph", a.get("hGraph"))
        flags = int(a.get("flags", 0) or 0)
        if rec["f"].startswith("cuGraphInstantiateWithParams"):
            ip = a.get("instantiateParams")
            flags = struct.unpack_from("<Q", ip, 0)[0] if isinstance(ip, (bytes, bytearray)) and len(ip) >= 8 else 0
        elif not rec["f"].startswith("cuGraphInstantiateWithFlags"):
            flags = 0
        flags &= ~2                    # upload on instantiation needs the params form; launch uploads anyway
        i = self.slots.new("graph_exec", a.get("phGraphExec"))
        self.emit(rec, f"CK(cuGraphInstantiateWithFlags(&{ref('graph_exec', i)}, {g}, {lit(flags)}));")

    def e_stream_sync(self, rec) -> None:
        self.emit(rec, f"stream_sync({self.stream(rec, rec['a'].get('hStream'))});")

    def e_event_record(self, rec) -> None:
        a = rec["a"]
        hs = a.get("hStream")
        e = self.handle(rec, "event", a.get("hEvent"))
        if rec["f"].startswith("cuEventRecordWithFlags"):
            self.emit(rec, f"CK(cuEventRecordWithFlags({e}, {self.stream(rec, hs)}, {lit(int(a.get('flags', 0) or 0))}));")
        else:
            self.emit(rec, f"CK(cuEventRecord({e}, {self.stream(rec, hs)}));")
        k = self.skey(rec, hs)
        if k in self.capturing:
            self.captured_events[a.get("hEvent")] = self.capturing[k]
        else:
            self.captured_events.pop(a.get("hEvent"), None)

    def e_stream_wait(self, rec) -> None:
        a = rec["a"]
        hs = a.get("hStream")
        e = self.handle(rec, "event", a.get("hEvent"))
        self.emit(rec, f"CK(cuStreamWaitEvent({self.stream(rec, hs)}, {e}, {lit(int(a.get('Flags', a.get('flags', 0)) or 0))}));")
        origin = self.captured_events.get(a.get("hEvent"))
        if origin is not None and origin in self.capturing.values():
            self.capturing[self.skey(rec, hs)] = origin

    def e_generic(self, rec) -> None:
        """A call made only of values and handles, from its description entry: each value is
        written as recorded, each handle as the program's own, each output handle into a new slot."""
        d = self.desc()
        fn = d.by_name(rec["f"])
        if fn is None:
            self.fail(rec, "not in the API description")
        b = fn["base"]
        a = rec.get("a") or {}
        args, outs = [], []
        for p in fn["params"]:
            t = d.types.get(p.get("pointee" if p["kind"] == "out" else "ctype") or "", {})
            kind = t.get("handle", "") if t.get("kind") == "handle" else ""
            v = a.get(p["name"])
            if kind and kind not in ARRAYS:
                self.fail(rec, f"parameter {p['name']} is a {kind.replace('_', ' ')} handle, an object the exported "
                               "program does not keep; replay the snapshot with `cudasnap replay`")
            if p["kind"] == "val":
                if kind:
                    args.append(self.handle(rec, kind, v))
                elif t.get("semantic") == "device":
                    args.append("g_dev")
                elif t.get("semantic") == "deviceptr" and isinstance(v, int):
                    args.append(f"TR({lit(v)})")
                elif t.get("kind") == "enum":
                    args.append(f"({p['ctype']}){int(v or 0)}")
                elif isinstance(v, (int, float)):
                    args.append(lit(v))
                else:
                    self.fail(rec, f"parameter {p['name']} ({p['ctype']}) has no recorded value")
            elif p["kind"] == "out" and kind:
                i = self.slots.new(kind, v)
                outs.append((kind, i))
                args.append(f"&{ref(kind, i)}")
            else:
                self.fail(rec, f"parameter {p['name']} ({p['kind']}) needs a translation of its own")
        if fn.get("origin") == "overlay":    # cuda.h lacks it: the program declares it
            b = fn["name"]
            self.prototypes[b] = "CUresult %s(%s);" % (b, ", ".join(f"{p['ctype']} {p['name']}" for p in fn["params"]))
        self.emit(rec, f"CK({b}({', '.join(args)}));")
        if in_class(rec["f"], "destroys"):   # the first handle argument ends: its slot is free
            for p in fn["params"]:
                t = d.types.get(p["ctype"], {})
                if p["kind"] == "val" and t.get("kind") == "handle":
                    self.slots.drop(t["handle"], a.get(p["name"]))
                    break
