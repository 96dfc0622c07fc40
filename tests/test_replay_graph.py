"""Graphs and stream capture in replay: launch_forms on the CUDA test double (captured stream
replayed as a graph), and driver-free tests of the graph/capture handlers with a fake driver
that captures launches, copies and memsets into graphs the way the driver does."""
from __future__ import annotations

import ctypes
import json
import struct
import subprocess
import sys

from cudasnap.formats import SnapshotReader
from cudasnap.replay import ReplayOptions
from cudasnap.replay.engine import Replayer
from synth import Synth
from test_replay_unit import FakeCU, _Handle

G = 2 << 20
A = 0x300000000000
FILL = 0x333


# ---------------------------------------------------------------------------- test double
def test_launch_forms_graph_capture_replays(double, capture):
    cp, snap = capture(double["progs"]["launch_forms"])
    assert cp.returncode == 0, cp.stderr
    names = [c["f"] for c in SnapshotReader(snap).records() if c.get("k") == "c"]
    assert any(n.startswith("cuStreamBeginCapture") for n in names)
    assert sum(n.startswith("cuGraphLaunch") for n in names) == 2
    env = dict(double["env"])
    env.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    rp = subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snap), "--json"], env=env,
                        capture_output=True, text=True, timeout=120)
    assert rp.returncode == 0, rp.stdout + rp.stderr
    res = json.loads(rp.stdout[rp.stdout.index("{"):])
    assert res["exit_code"] == 0 and not res["errors"] and not res["mismatches"]
    assert res["d2h_verified"] >= 2 and res["fell_back"] == 0
    assert res["by_family"].get("graph", 0) >= 5          # end capture, instantiate, 2 launches, destroys


# ---------------------------------------------------------------------------- fake driver
class _Raw:
    SIZE = 256

    def __init__(self):
        self.buf = ctypes.create_string_buffer(self.SIZE)

    def getPtr(self):
        return ctypes.addressof(self.buf)

    @property
    def raw(self) -> bytes:
        return self.buf.raw


class _Memset(_Raw):
    SIZE = 40


class _Memcpy3D(_Raw):
    SIZE = 200


class _KernelNode(_Raw):
    SIZE = 72


class _Edge:
    def __init__(self):
        self.from_port = self.to_port = self.type = 0


class _InstParams:
    def __init__(self):
        self.flags = 0
        self.hUploadStream = None


class GraphCU(FakeCU):
    """FakeCU with streams, capture and graphs: work on a capturing stream is appended to the
    capture's graph instead of running; cuGraphLaunch runs a graph's work in order."""

    def __init__(self):
        super().__init__()
        self.CUstreamCaptureMode = int
        self.CUgraph = _Handle
        self.CUgraphEdgeData = _Edge
        self.CUDA_MEMSET_NODE_PARAMS = _Memset
        self.CUDA_MEMCPY3D = _Memcpy3D
        self.CUgraphNodeParams = _Raw
        self.CUDA_KERNEL_NODE_PARAMS = _KernelNode
        self.CUDA_GRAPH_INSTANTIATE_PARAMS = _InstParams
        self.next_h = 0x9000
        self.graphs = {}          # id -> list of ops
        self.execs = {}           # id -> graph id
        self.capturing = {}       # stream id -> graph id
        self.mode = 0             # this thread's capture mode
        self.modes_set = []
        self.log = []

    def _new(self):
        self.next_h += 1
        return self.next_h

    # streams / capture
    def cuStreamCreate(self, flags):
        return (0, _Handle(self._new()))

    def cuStreamBeginCapture(self, s, mode):
        g = self._new()
        self.graphs[g] = []
        self.capturing[int(s)] = g
        return (0,)

    def cuStreamBeginCaptureToGraph(self, s, g, deps, edges, n, mode):
        self.log.append(("begin_to_graph", int(g), [int(d) for d in deps], edges, n, mode))
        self.capturing[int(s)] = int(g)
        return (0,)

    def cuStreamEndCapture(self, s):
        return (0, _Handle(self.capturing.pop(int(s))))

    def cuStreamIsCapturing(self, s):
        return (0, 1 if int(s) in self.capturing else 0)

    def cuStreamSynchronize(self, s):
        if int(s) in self.capturing:
            return (900,)      # CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        return (0,)

    def cuCtxSynchronize(self):
        return (900,) if self.capturing else (0,)

    def cuThreadExchangeStreamCaptureMode(self, mode):
        prev, self.mode = self.mode, int(mode)
        self.modes_set.append(int(mode))
        return (0, prev)

    # work: captured or run
    def _work(self, s, op):
        if s is not None and int(s) in self.capturing:
            self.graphs[self.capturing[int(s)]].append(op)
        else:
            self._run(op)
        return (0,)

    def _run(self, op):
        kind = op[0]
        if kind == "fill":
            p, v, n = struct.unpack_from("<QIi", op[1])
            buf, o = self._find(p, 4 * n)
            buf[o:o + 4 * n] = struct.pack("<I", v) * n
        elif kind == "memset32":
            _k, dst, v, n = op
            buf, o = self._find(dst, 4 * n)
            buf[o:o + 4 * n] = struct.pack("<I", v) * n
        elif kind == "d2h":
            _k, out, src, n = op
            buf, o = self._find(src, n)
            out[:n] = buf[o:o + n]
        elif kind == "graph":
            for sub in self.graphs[op[1]]:
                self._run(sub)

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shm, stream, kp, extra):
        arr = (ctypes.c_void_p * 5).from_address(extra)
        size = ctypes.c_size_t.from_address(arr[3]).value
        self.calls.append("launch")
        return self._work(stream, ("fill", ctypes.string_at(arr[1], size)))

    def cuMemcpyDtoHAsync(self, out, src, n, s):
        return self._work(s, ("d2h", out, int(src), n))

    def cuMemsetD32Async(self, dst, v, n, s):
        return self._work(s, ("memset32", int(dst), v, n))

    # graphs
    def cuGraphCreate(self, flags):
        g = self._new()
        self.graphs[g] = []
        return (0, _Handle(g))

    def _node(self, g, op=None, deps=()):
        self.log.append(("node", int(g), [int(d) for d in deps], op and op[0]))
        if op is not None:
            self.graphs[int(g)].append(op)
        return (0, _Handle(self._new()))

    def cuGraphAddEmptyNode(self, g, deps, n):
        return self._node(g, None, deps)

    def cuGraphAddMemsetNode(self, g, deps, n, p, ctx):
        dst, _pitch, v, es, w, _h = struct.unpack_from("<QQIIQQ", p.raw)
        assert es == 4
        return self._node(g, ("memset32", dst, v, w), deps)

    def cuGraphAddKernelNode(self, g, deps, n, p):
        func, *_r = struct.unpack_from("<Q", p.raw)
        extra = struct.unpack_from("<Q", p.raw, 48)[0]
        arr = (ctypes.c_void_p * 5).from_address(extra)
        size = ctypes.c_size_t.from_address(arr[3]).value
        return self._node(g, ("fill", ctypes.string_at(arr[1], size)), deps)

    def cuGraphAddNode(self, g, deps, edges, n, p):
        raw = p.raw
        t = struct.unpack_from("<I", raw)[0]
        if t == 13:       # conditional: hand out body graphs through phGraph_out
            handle, _ty, size, out = struct.unpack_from("<QIIQ", raw, 16)
            self.log.append(("cond", handle, size))
            arr = (ctypes.c_uint64 * size).from_address(out)
            for i in range(size):
                b = self._new()
                self.graphs[b] = []
                arr[i] = b
            return self._node(g, None, deps)
        if t == 5:
            return self._node(g, ("empty",), deps)
        if t == 2:
            dst, _pitch, v, es, w, _h = struct.unpack_from("<QQIIQQ", raw, 16)
            return self._node(g, ("memset32", dst, v, w), deps)
        return (1,)

    def cuGraphConditionalHandleCreate(self, g, ctx, dflt, flags):
        return (0, 0xC0DE0000)

    def cuGraphInstantiateWithFlags(self, g, flags):
        e = self._new()
        self.execs[e] = int(g)
        return (0, _Handle(e))

    def cuGraphInstantiateWithParams(self, g, p):
        self.log.append(("inst_params", p.flags, p.hUploadStream is not None))
        return self.cuGraphInstantiateWithFlags(g, p.flags)

    def cuGraphLaunch(self, e, s):
        return self._work(s, ("graph", self.execs[int(e)]))


def _prologue(s: Synth):
    s.call("cuInit", {"Flags": 0})
    s.call("cuDevicePrimaryCtxRetain", {"pctx": 0x111, "dev": 0})
    s.call("cuCtxSetCurrent", {"ctx": 0x111})
    s.call("cuModuleLoadData", {"module": 0x222, "image": 1}, x={"image": s.blob(b"IMG\0")})
    s.call("cuModuleGetFunction", {"hfunc": FILL, "hmod": 0x222, "name": "fill"})
    s.fn(FILL, "fill", 0x222, [[0, 8], [8, 4], [12, 4]])
    s.call("cuMemAlloc_v2", {"dptr": A, "bytesize": 64})
    s.call("cuStreamCreate", {"phStream": 0x5000, "Flags": 0})


def _d2h(s: Synth, data: bytes, stream=None):
    if stream is None:
        return s.call("cuMemcpyDtoH_v2", {"dstHost": 9, "srcDevice": A, "ByteCount": len(data)},
                      x={"dstHost": s.blob(data)})
    return s.call("cuMemcpyDtoHAsync_v2", {"dstHost": 9, "srcDevice": A, "ByteCount": len(data), "hStream": stream},
                  x={"dstHost": s.blob(data)})


def _run(path, drv=None, **kw):
    rp = Replayer(path, ReplayOptions(**kw), driver=drv or GraphCU())
    return rp.run(), rp


def _deps(*hs) -> bytes:
    return b"".join(struct.pack("<Q", h) for h in hs)


def _fill(v):
    return struct.pack("<I", v) * 16


def test_stream_capture_is_not_executed_eagerly_and_captured_d2h_not_verified(tmp_path):
    p = tmp_path / "cap.cusnap"
    s = Synth(p)
    _prologue(s)
    s.call("cuThreadExchangeStreamCaptureMode", {"mode": 0})            # set RELAXED, was GLOBAL
    s.call("cuStreamBeginCapture_v2", {"hStream": 0x5000, "mode": 2})
    s.launch(FILL, struct.pack("<QIi", A, 7, 16), stream=0x5000)
    _d2h(s, b"\xee" * 64, stream=0x5000)          # recorded during capture: garbage, not a result
    s.call("cuStreamEndCapture", {"hStream": 0x5000, "phGraph": 0x6000})
    s.call("cuThreadExchangeStreamCaptureMode", {"mode": 2})            # restore GLOBAL, was RELAXED
    _d2h(s, bytes(64))                             # nothing ran yet
    s.call("cuGraphInstantiateWithFlags", {"phGraphExec": 0x7000, "hGraph": 0x6000, "flags": 0})
    s.call("cuGraphLaunch", {"hGraph": 0x7000, "hStream": 0x5000})
    s.call("cuStreamSynchronize", {"hStream": 0x5000})
    _d2h(s, _fill(7))
    s.call("cuGraphExecDestroy", {"hGraphExec": 0x7000})
    s.call("cuGraphDestroy", {"hGraph": 0x6000})
    s.close()
    res, rp = _run(p, sync_after_launch=True)
    assert res.exit_code == 0, (res.errors, rp.ctx.mismatch_text)
    assert res.d2h_verified == 2 and not res.mismatches
    assert any("captured into graphs are not verified" in w for w in res.warnings)
    assert rp.ctx.cu.modes_set == [2, 0]              # inputs recovered from the next exchange's output
    assert not rp.ctx.capturing
    assert res.by_family.get("graph", 0) >= 5 and res.launches == 2


def test_capture_to_graph_with_explicit_nodes(tmp_path):
    p = tmp_path / "xla.cusnap"
    s = Synth(p)
    _prologue(s)
    s.call("cuGraphCreate", {"phGraph": 0x6000, "flags": 0})
    s.call("cuGraphAddEmptyNode", {"phGraphNode": 0x6100, "hGraph": 0x6000, "dependencies": 0,
                                   "numDependencies": 0})
    memset = struct.pack("<QQIIQQ", A, 0, 3, 4, 16, 1)
    s.call("cuGraphAddMemsetNode", {"phGraphNode": 0x6101, "hGraph": 0x6000, "dependencies": _deps(0x6100),
                                    "numDependencies": 1, "memsetParams": memset, "ctx": 0x111})
    s.call("cuGraphAddHostNode", {"phGraphNode": 0x6102, "hGraph": 0x6000, "dependencies": _deps(0x6101),
                                  "numDependencies": 1, "nodeParams": bytes(16)})
    s.call("cuStreamBeginCaptureToGraph", {"hStream": 0x5000, "hGraph": 0x6000, "dependencies": _deps(0x6102),
                                           "dependencyData": 0, "numDependencies": 1, "mode": 2})
    s.call("cuStreamIsCapturing", {"hStream": 0x5000, "captureStatus": 1})
    s.call("cuStreamGetCaptureInfo_v3", {"hStream": 0x5000, "captureStatus_out": 1})
    s.call("cuMemsetD32Async", {"dstDevice": A + 32, "ui": 9, "N": 8, "hStream": 0x5000})
    s.call("cuStreamEndCapture", {"hStream": 0x5000, "phGraph": 0x6000})
    s.call("cuGraphInstantiateWithParams", {"phGraphExec": 0x7000, "hGraph": 0x6000,
                                            "instantiateParams": struct.pack("<QQQI4x", 2, 0x5000, 0, 0)})
    s.call("cuGraphUpload", {"hGraph": 0x7000, "hStream": 0x5000})
    s.call("cuGraphLaunch", {"hGraph": 0x7000, "hStream": 0x5000})
    s.call("cuStreamSynchronize", {"hStream": 0x5000})
    _d2h(s, struct.pack("<I", 3) * 8 + struct.pack("<I", 9) * 8)
    s.call("cuProfilerInitialize", {"configFile": "x", "outputFile": "y", "outputMode": 0})
    s.call("cuProfilerStart", {})
    s.call("cuProfilerStop", {})
    s.close()
    res, rp = _run(p)
    assert res.exit_code == 0, (res.errors, rp.ctx.mismatch_text)
    assert res.d2h_verified == 1
    cu = rp.ctx.cu
    begin = [e for e in cu.log if e[0] == "begin_to_graph"][0]
    host_node = rp.ctx.handles[0x6102]
    assert begin[1] == int(rp.ctx.handles[0x6000]) and begin[2] == [int(host_node)] and begin[3] is None
    memset_node = [e for e in cu.log if e[0] == "node" and e[3] == "memset32"][0]
    assert memset_node[2] == [int(rp.ctx.handles[0x6100])]
    assert any("host nodes" in w for w in res.warnings)      # replayed as an empty node, same edges
    assert ("inst_params", 2, True) in cu.log
    assert res.by_family.get("profiler") == 3


def test_kernel_node_without_packed_params_is_refused(tmp_path):
    from cudasnap.replay import dispatch
    p = tmp_path / "kn.cusnap"
    s = Synth(p)
    _prologue(s)
    s.call("cuGraphCreate", {"phGraph": 0x6000, "flags": 0})
    kn = struct.pack("<Q6II4xQQQQ", FILL, 1, 1, 1, 16, 1, 1, 0, 0x7FFF0000, 0, 0, 0)
    rec = s.call("cuGraphAddKernelNode_v2", {"phGraphNode": 0x6100, "hGraph": 0x6000, "dependencies": 0,
                                             "numDependencies": 0, "nodeParams": kn})
    s.close()
    res, _ = _run(p)
    assert res.exit_code == 2 and len(res.errors) == 1
    err = res.errors[0]
    assert f"call #{rec['s']} cuGraphAddKernelNode_v2" in err and "cannot rebuild the kernel node" in err
    assert "\n" not in err
    # capture packs kernel-node arguments now: the handler is a real one, and only a snapshot
    # without them (as above) stops with the reason
    assert "cuGraphAddKernelNode_v2" in dispatch.REPLAY_HANDLED


def test_kernel_node_with_packed_params_is_rebuilt(tmp_path):
    p = tmp_path / "kn2.cusnap"
    s = Synth(p)
    _prologue(s)
    s.call("cuGraphCreate", {"phGraph": 0x6000, "flags": 0})
    kn = struct.pack("<Q6II4xQQQQ", FILL, 1, 1, 1, 16, 1, 1, 0, 0x7FFF0000, 0, 0, 0)
    s.call("cuGraphAddKernelNode_v2", {"phGraphNode": 0x6100, "hGraph": 0x6000, "dependencies": 0,
                                       "numDependencies": 0, "nodeParams": kn},
           x={"params": struct.pack("<QIi", A, 5, 16)})
    s.call("cuGraphInstantiateWithFlags", {"phGraphExec": 0x7000, "hGraph": 0x6000, "flags": 0})
    s.call("cuGraphLaunch", {"hGraph": 0x7000, "hStream": 0})
    _d2h(s, _fill(5))
    s.close()
    res, rp = _run(p)
    assert res.exit_code == 0, res.errors
    assert res.d2h_verified == 1


def test_conditional_node_bodies_and_handles(tmp_path):
    p = tmp_path / "cond.cusnap"
    s = Synth(p)
    _prologue(s)
    s.call("cuGraphCreate", {"phGraph": 0x6000, "flags": 0})
    s.call("cuGraphConditionalHandleCreate", {"pHandle_out": 0xABC00000, "hGraph": 0x6000, "ctx": 0x111,
                                              "defaultLaunchValue": 1, "flags": 1})
    npar = bytearray(256)
    struct.pack_into("<I", npar, 0, 13)
    struct.pack_into("<QIIQQ", npar, 16, 0xABC00000, 0, 1, 0x7FFF1234, 0x111)   # IF, one body
    s.call("cuGraphAddNode_v2", {"phGraphNode": 0x6100, "hGraph": 0x6000, "dependencies": 0, "dependencyData": 0,
                                 "numDependencies": 0, "nodeParams": bytes(npar)})
    # the body graph's handle was written by the driver into host memory: not recorded
    s.call("cuStreamBeginCaptureToGraph", {"hStream": 0x5000, "hGraph": 0x6abc, "dependencies": 0,
                                           "dependencyData": 0, "numDependencies": 0, "mode": 2})
    s.launch(FILL, struct.pack("<QIi", A, 4, 16), stream=0x5000)
    s.call("cuStreamEndCapture", {"hStream": 0x5000, "phGraph": 0x6abc})
    s.close()
    res, rp = _run(p)
    assert res.exit_code == 0, res.errors
    cond = [e for e in rp.ctx.cu.log if e[0] == "cond"][0]
    assert cond[1] == 0xC0DE0000 and cond[2] == 1              # the live handle went into the node
    body = rp.ctx.handles[0x6abc]
    assert rp.ctx.cu.graphs[int(body)] and rp.ctx.cu.graphs[int(body)][0][0] == "fill"
    assert any("body graph of a conditional node" in w for w in res.warnings)
    assert rp.ctx.cond_handles == {0xABC00000: 0xC0DE0000}


def test_host_func_keeps_order_and_is_skipped(tmp_path):
    p = tmp_path / "hf.cusnap"
    s = Synth(p)
    _prologue(s)
    s.call("cuStreamBeginCapture_v2", {"hStream": 0x5000, "mode": 0})
    s.launch(FILL, struct.pack("<QIi", A, 1, 16), stream=0x5000)
    s.call("cuLaunchHostFunc", {"hStream": 0x5000, "fn": 0x401000, "userData": 0})
    s.launch(FILL, struct.pack("<QIi", A, 2, 16), stream=0x5000)
    s.call("cuStreamEndCapture", {"hStream": 0x5000, "phGraph": 0x6000})
    s.call("cuGraphInstantiateWithFlags", {"phGraphExec": 0x7000, "hGraph": 0x6000, "flags": 0})
    s.call("cuGraphLaunch", {"hGraph": 0x7000, "hStream": 0x5000})
    s.call("cuStreamSynchronize", {"hStream": 0x5000})
    _d2h(s, _fill(2))
    s.close()
    res, rp = _run(p)
    assert res.exit_code == 0, (res.errors, rp.ctx.mismatch_text)
    assert res.d2h_verified == 1 and res.skipped >= 1
    g = rp.ctx.cu.graphs[int(rp.ctx.handles[0x6000])]
    assert [op[0] for op in g] == ["fill", "fill"]


def test_dispatch_classes_are_truthful():
    from cudasnap.replay import dispatch as D
    from cudasnap.shim.description import load
    assert D.REPLAY_HANDLED == set(D.REPLAY_EXECUTED | D.REPLAY_SKIPPED)
    assert not (D.REPLAY_EXECUTED & D.REPLAY_SKIPPED) and not (D.REPLAY_HANDLED & set(D.REPLAY_REFUSED))
    for n in ("cuThreadExchangeStreamCaptureMode", "cuStreamBeginCaptureToGraph", "cuGraphCreate",
              "cuGraphAddMemcpyNode", "cuGraphAddMemsetNode", "cuGraphAddEmptyNode", "cuGraphAddChildGraphNode",
              "cuGraphAddEventRecordNode", "cuGraphAddEventWaitNode", "cuGraphAddNode", "cuGraphAddNode_v2",
              "cuGraphInstantiateWithFlags", "cuGraphInstantiateWithParams", "cuGraphExecUpdate",
              "cuGraphExecUpdate_v2", "cuGraphLaunch", "cuGraphLaunch_ptsz", "cuGraphUpload", "cuGraphDestroy",
              "cuGraphExecDestroy", "cuGraphConditionalHandleCreate", "cuStreamUpdateCaptureDependencies_v2",
              "cuProfilerInitialize", "cuProfilerStart", "cuProfilerStop", "cuGraphGetNodes", "cuGraphGetRootNodes"):
        assert n in D.REPLAY_EXECUTED, n
    for n in ("cuStreamGetCaptureInfo", "cuStreamGetCaptureInfo_v2", "cuStreamGetCaptureInfo_v3",
              "cuStreamIsCapturing", "cuGraphKernelNodeGetParams_v2"):
        assert n in D.REPLAY_SKIPPED, n
    for n in ("cuGraphAddKernelNode", "cuGraphAddKernelNode_v2", "cuGraphExecKernelNodeSetParams_v2"):
        assert n in D.REPLAY_EXECUTED and n not in D.REPLAY_REFUSED, n
    assert not D.is_query("cuProfilerStart")
    # every ABI name with a handler is a description name, and the table agrees with lookup()
    names = {f["name"] for f in load().functions}
    assert D.REPLAY_HANDLED <= names
    cov = D.coverage()
    for fam in ("stream", "event", "context", "module", "pool", "profiler"):
        assert cov[fam]["unhandled"] == 0, (fam, cov[fam])
