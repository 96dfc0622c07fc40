"""Streams and events."""
from __future__ import annotations

from . import handles


@handles("cuStreamCreate")
def stream_create(rp, rec):
    a = rec["a"]
    s = rp.drv(rec, "cuStreamCreate", a.get("Flags", 0))
    if s is not None:
        rp.set_handle(a.get("phStream"), s)


@handles("cuStreamCreateWithPriority")
def stream_create_prio(rp, rec):
    a = rec["a"]
    s = rp.drv(rec, "cuStreamCreateWithPriority", a.get("flags", 0), a.get("priority", 0))
    if s is not None:
        rp.set_handle(a.get("phStream"), s)


@handles("cuStreamDestroy")
def stream_destroy(rp, rec):
    h = rec["a"].get("hStream")
    rp.drv(rec, "cuStreamDestroy", rp.live(rec, h, "stream"))
    rp.handles.pop(h, None)


@handles("cuStreamSynchronize", errors=True)
def stream_sync(rp, rec):
    rp.drv(rec, "cuStreamSynchronize", rp.stream(rec, rec["a"].get("hStream")))


@handles("cuStreamWaitEvent", errors=True)
def stream_wait_event(rp, rec):
    a = rec["a"]
    rp.drv(rec, "cuStreamWaitEvent", rp.stream(rec, a.get("hStream")), rp.live(rec, a.get("hEvent"), "event"),
           a.get("Flags", 0))


@handles("cuStreamSetAttribute", "cuStreamCopyAttributes")
def stream_attr(rp, rec):
    pass  # scheduling hints (access policy windows, priorities): no effect on results


@handles("cuEventCreate")
def event_create(rp, rec):
    a = rec["a"]
    e = rp.drv(rec, "cuEventCreate", a.get("Flags", 0))
    if e is not None:
        rp.set_handle(a.get("phEvent"), e)


@handles("cuEventRecord", "cuEventRecordWithFlags", errors=True)
def event_record(rp, rec):
    a = rec["a"]
    ev = rp.live(rec, a.get("hEvent"), "event")
    s = rp.stream(rec, a.get("hStream"))
    if "WithFlags" in rec["f"]:
        rp.drv(rec, "cuEventRecordWithFlags", ev, s, a.get("flags", 0))
    else:
        rp.drv(rec, "cuEventRecord", ev, s)


@handles("cuEventSynchronize", errors=True)
def event_sync(rp, rec):
    rp.drv(rec, "cuEventSynchronize", rp.live(rec, rec["a"].get("hEvent"), "event"))


@handles("cuEventElapsedTime", errors=True)
def event_elapsed(rp, rec):
    a = rec["a"]
    name = "cuEventElapsedTime" if hasattr(rp.cu, "cuEventElapsedTime") else "cuEventElapsedTime_v2"
    rp.drv(rec, name, rp.live(rec, a.get("hStart"), "event"), rp.live(rec, a.get("hEnd"), "event"))


@handles("cuEventDestroy")
def event_destroy(rp, rec):
    h = rec["a"].get("hEvent")
    rp.drv(rec, "cuEventDestroy", rp.live(rec, h, "event"))
    rp.handles.pop(h, None)
