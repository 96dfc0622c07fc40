"""Streams, events and graphs in the exported program: the recorded stream a call names, stream
capture (which streams are capturing, and into which capture an event record pulls a waiting
stream), graph instantiation, and the generic translation of calls made only of values and
handles (from the API description).  StreamCalls is a part of Emitter (export/emit.py)."""
from __future__ import annotations

import struct

from .ctext import lit, ref
from .table import DESTROYS


class StreamCalls:
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

    def e_end_capture(self, rec) -> None:
        a = rec["a"]
        hs = a.get("hStream")
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
            if p["kind"] == "val":
                if kind:
                    args.append(self.handle(rec, kind, v))
                elif t.get("semantic") == "device":
                    args.append("g_dev")
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
        self.emit(rec, f"CK({b}({', '.join(args)}));")
        kind = DESTROYS.get(b)
        if kind:
            for p in fn["params"]:
                if p["kind"] == "val":
                    self.slots.drop(kind, a.get(p["name"]))
                    break
