"""Contexts in the exported program: primary contexts retained and released, contexts created
and destroyed, and the current context of each recorded thread (the program runs the calls of
every thread on one thread, in recorded order, switching contexts when a thread's calls
resume).  ContextCalls is a part of Emitter (export/emit.py): it reads and writes the
emitter's slots, lines, tid_ctx and live_ctx."""
from __future__ import annotations

from typing import Optional

from .ctext import lit, ref


class ContextCalls:
    """Emitter's translation of the context calls."""

    def context(self, rec, h) -> str:
        if not h:
            return "NULL"
        i = self.slots.get("context", h)
        if i is None:
            i = self.retain_primary(rec, h)
        return ref("context", i)

    def retain_primary(self, rec, h) -> int:
        """A context whose making was not recorded: the device's primary context (as replay)."""
        i = self.slots.new("context", h)
        self.lines.append(f"    CKN(\"cuDevicePrimaryCtxRetain\", cuDevicePrimaryCtxRetain(&{ref('context', i)}, g_dev));"
                          f" /* context {h:#x} */")
        ident = self.ctx_ids.get(h) or {}
        if not ident.get("primary"):
            self.note_once(f"ctx{h}", f"context {h:#x} (first used by call #{rec.get('s')}) was not made by a recorded "
                                      f"call; the program uses the device's primary context for it")
        return i

    def switch_thread(self, rec) -> None:
        """Recorded calls of several threads run on one thread, in recorded order: each
        thread's current context is made current when its calls resume."""
        tid = rec.get("tid")
        if tid == self.last_tid:
            return
        self.last_tid = tid
        stack = self.tid_ctx.get(tid)
        want = stack[-1] if stack else None
        if stack is not None and want != self.live_ctx:
            self.lines.append(f"    CKN(\"cuCtxSetCurrent\", cuCtxSetCurrent({'NULL' if want is None else ref('context', want)}));"
                              f" /* thread {tid} resumes */")
            self.live_ctx = want

    def set_current(self, rec, slot: Optional[int], push: bool = False, pop: bool = False) -> None:
        tid = rec.get("tid")
        st = self.tid_ctx.setdefault(tid, [])
        if pop:
            if st:
                st.pop()
        elif push or not st:
            st.append(slot)
        else:
            st[-1] = slot
        self.live_ctx = st[-1] if st else None

    def e_retain(self, rec) -> None:
        a = rec["a"]
        i = self.slots.new("context", a.get("pctx"))
        self.emit(rec, f"CK(cuDevicePrimaryCtxRetain(&{ref('context', i)}, g_dev));")

    def e_release(self, rec) -> None:
        if "Reset" in rec["f"]:
            self.note_once("reset", f"call #{rec.get('s')} {rec['f']}: replayed as a release (placement is kept)")
        self.emit(rec, "timing_drop();", "CK(cuDevicePrimaryCtxRelease(g_dev));")

    def e_primary_flags(self, rec) -> None:
        self.emit(rec, f"CK(cuDevicePrimaryCtxSetFlags(g_dev, {lit(int(rec['a'].get('flags', 0)))}));")

    def e_ctx_create(self, rec) -> None:
        a = rec["a"]
        i = self.slots.new("context", a.get("pctx"))
        self.emit(rec, f"CK(ctx_create(&{ref('context', i)}, {lit(int(a.get('flags', 0) or 0))}));")
        self.set_current(rec, i, push=True)

    def e_ctx_destroy(self, rec) -> None:
        h = rec["a"].get("ctx")
        c = self.context(rec, h)
        self.emit(rec, "timing_drop();", f"CK(cuCtxDestroy({c}));")
        i = self.slots.drop("context", h)
        for st in self.tid_ctx.values():
            st[:] = [None if s == i else s for s in st]
        if self.live_ctx == i:
            self.live_ctx = None

    def e_ctx_set(self, rec) -> None:
        h = rec["a"].get("ctx")
        c = self.context(rec, h)
        self.emit(rec, f"CK(cuCtxSetCurrent({c}));")
        self.set_current(rec, self.slots.get("context", h) if h else None)

    def e_ctx_push(self, rec) -> None:
        h = rec["a"].get("ctx")
        c = self.context(rec, h)
        self.emit(rec, f"CK(cuCtxPushCurrent({c}));")
        self.set_current(rec, self.slots.get("context", h), push=True)

    def e_ctx_pop(self, rec) -> None:
        self.emit(rec, "{ CUcontext popped_; CK(cuCtxPopCurrent(&popped_)); }")
        self.set_current(rec, None, pop=True)

    def e_ctx_sync(self, rec) -> None:
        self.emit(rec, "ctx_sync();")
