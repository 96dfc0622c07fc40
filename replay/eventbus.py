"""A replay's event bus (events.py says what is sent when): the subscribers (profilers, hooks,
the extractor's tap), what each event carries, and a subscriber's exception reported, not raised,
unless it stops the replay."""
from __future__ import annotations

from typing import Any, Dict, List, Tuple


class EventBus:
    """subscribers: the live list (Replayer.subscribers); view: what they see of the replay;
    passthrough: the exceptions a subscriber raises to stop or end the replay."""

    def __init__(self, ctx, view, passthrough: Tuple[type, ...]):
        self.ctx, self.view, self.passthrough = ctx, view, passthrough
        self.subscribers: List[Any] = []             # objects with on_event(kind, event)
        self._sub_errors: Dict[Tuple[int, str], int] = {}

    def emit(self, kind: str, ev) -> None:
        """Tell every subscriber; an exception in one is reported and replay goes on."""
        for sub in self.subscribers:
            if kind in ("before_call", "after_call") and not getattr(sub, "wants_calls", False):
                continue
            try:
                sub.on_event(kind, ev)
            except self.passthrough:
                raise
            except Exception as e:
                key = (id(sub), kind)
                n = self._sub_errors[key] = self._sub_errors.get(key, 0) + 1
                if n <= 3:
                    who = getattr(sub, "label", None) or type(sub).__name__
                    seq = getattr(ev, "seq", None)
                    self.ctx.note(f"{who}: {kind}{f' (call #{seq})' if seq is not None else ''} raised "
                              f"{type(e).__name__}: {e}; replay continues")

    def before_launch(self, rec, fn, params: bytes, name: str, cfg=None):
        """Launch handlers call this just before the driver launch; returns the event (or None)."""
        if not self.subscribers:
            return None
        from .events import make_launch_event
        ev = make_launch_event(self.view, rec, fn, params, name, cfg)
        self.emit("before_launch", ev)
        if ev.ctx.timing_requested:
            ev.ctx._record(0)
        return ev

    def after_launch(self, ev) -> None:
        if ev is None:
            return
        if ev.ctx.timing_requested:
            ev.ctx._record(1)
        self.emit("after_launch", ev)

    def before_call(self, rec):
        """before_call, before_copy (returns the copy event) and teardown events."""
        from .events import CallEvent, classify, copy_event
        c = classify(rec.get("f") or "")
        self.emit("before_call", CallEvent(rec.get("s"), rec.get("f"), rec, self.view))
        if c == "copy":
            ev = copy_event(self.view, rec)
            self.emit("before_copy", ev)
            return ev
        if c == "graph_launch":
            ev = CallEvent(rec.get("s"), rec.get("f"), rec, self.view)
            self.emit("before_graph_launch", ev)
            return ev
        if c == "teardown":
            self.emit("teardown", CallEvent(rec.get("s"), rec.get("f"), rec, self.view))
        return None

    def after_call(self, rec, cev) -> None:
        from .events import CallEvent, classify
        c = classify(rec.get("f") or "")
        if c == "copy" and cev is not None:
            self.emit("copy", cev)
        elif c == "graph_launch" and cev is not None:
            self.emit("graph_launch", cev)
        elif c == "sync":
            self.emit("sync", CallEvent(rec.get("s"), rec.get("f"), rec, self.view))
        self.emit("after_call", CallEvent(rec.get("s"), rec.get("f"), rec, self.view))
