"""Graphs: stream capture, instantiate/launch/update/destroy.  Explicit node construction
(cuGraphAdd*Node) is not replayed yet: it stops with a clear 'unsupported' error."""
from __future__ import annotations

from . import handles


@handles("cuStreamBeginCapture", errors=True)
def begin_capture(rp, rec):
    a = rec["a"]
    s = rp.stream(rec, a.get("hStream"))
    mode = rp.cu.CUstreamCaptureMode(a.get("mode", 0))
    if rp.drv(rec, "cuStreamBeginCapture", s, mode) is not None:
        rp.capturing.add(a.get("hStream"))


@handles("cuStreamEndCapture", errors=True)
def end_capture(rp, rec):
    a = rec["a"]
    g = rp.drv(rec, "cuStreamEndCapture", rp.stream(rec, a.get("hStream")))
    rp.capturing.discard(a.get("hStream"))
    if g is not None:
        rp.set_handle(a.get("phGraph"), g)


@handles("cuGraphCreate")
def graph_create(rp, rec):
    a = rec["a"]
    g = rp.drv(rec, "cuGraphCreate", a.get("flags", 0))
    if g is not None:
        rp.set_handle(a.get("phGraph"), g)


@handles("cuGraphInstantiate", "cuGraphInstantiateWithFlags", "cuGraphInstantiateWithParams", errors=True)
def graph_instantiate(rp, rec):
    a = rec["a"]
    flags = a.get("flags", 0) if isinstance(a.get("flags"), int) else 0
    p = a.get("instantiateParams")
    if isinstance(p, (bytes, bytearray)) and len(p) >= 8:
        flags = int.from_bytes(p[:8], "little")
    g = rp.live(rec, a.get("hGraph"), "graph")
    fn = "cuGraphInstantiateWithFlags" if hasattr(rp.cu, "cuGraphInstantiateWithFlags") else "cuGraphInstantiate"
    ex = rp.drv(rec, fn, g, flags)
    if ex is not None:
        rp.set_handle(a.get("phGraphExec"), ex)


@handles("cuGraphLaunch", "cuGraphUpload", errors=True)
def graph_launch(rp, rec):
    a = rec["a"]
    name = "cuGraphUpload" if rec["f"].startswith("cuGraphUpload") else "cuGraphLaunch"
    rp.drv(rec, name, rp.live(rec, a.get("hGraph") or a.get("hGraphExec"), "graph exec"),
           rp.stream(rec, a.get("hStream")))
    if name == "cuGraphLaunch":
        rp.res.launches += 1


@handles("cuGraphExecUpdate", errors=True)
def graph_exec_update(rp, rec):
    a = rec["a"]
    rp.drv(rec, "cuGraphExecUpdate", rp.live(rec, a.get("hGraphExec"), "graph exec"),
           rp.live(rec, a.get("hGraph"), "graph"))


@handles("cuGraphDestroy")
def graph_destroy(rp, rec):
    h = rec["a"].get("hGraph")
    rp.drv(rec, "cuGraphDestroy", rp.live(rec, h, "graph"))
    rp.handles.pop(h, None)


@handles("cuGraphExecDestroy")
def graph_exec_destroy(rp, rec):
    h = rec["a"].get("hGraphExec")
    rp.drv(rec, "cuGraphExecDestroy", rp.live(rec, h, "graph exec"))
    rp.handles.pop(h, None)
