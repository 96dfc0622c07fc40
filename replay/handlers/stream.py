"""Streams and events."""
from __future__ import annotations

from cudasnap.formats.abi import base_name


def stream_memop(ctx, rec):
    """A write of a value to device memory, or a wait for one, in stream order. On pinned host
    memory a host thread may be what writes the flag a wait polls, and a replay runs no host
    code: such a call stops the replay, saying so."""
    a = rec["a"]
    addr = a.get("addr")
    al = ctx.space.find(addr) if isinstance(addr, int) else None
    if al is not None and al.kind == "host":
        ctx.fail(rec, f"{addr:#x} is pinned host memory: a host thread of the program may write what this "
                      "call waits for or reads, and a replay runs no host code")
    name = base_name(rec["f"])
    ctx.drv(rec, name, ctx.stream(rec, a.get("stream")), ctx.tr(addr), int(a.get("value") or 0), int(a.get("flags") or 0))
    if "Write" in name:
        ctx.mark_written(addr, rec.get("s"), rec["f"])
