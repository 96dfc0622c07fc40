"""Windowed snapshots (capture --window / --flight-recorder) need no handlers of their own:
the state at a window start is ordinary records (the kept state-creating calls, then
cuMemcpyHtoD_v2 records flagged `state` holding every live range's contents), replayed by
the memory, module, stream and context handlers. What lives here, below the handlers: naming
a recorded error that recurs on replay (the flight recorder's trigger) with the kernel it
belongs to."""
from __future__ import annotations

from typing import Any, Dict, Optional

from cudasnap.formats import cu_result_name
from cudasnap.formats.vocab import is_launch


def last_launch_before(ctx, seq) -> Optional[Dict[str, Any]]:
    """The newest kernel launch recorded before call `seq` (a sticky error reported by a
    synchronization belongs to a kernel launched earlier)."""
    if not isinstance(seq, int) or getattr(ctx, "reader", None) is None:
        return None
    last = None
    for r in ctx.reader.records(("c",)):
        s = r.get("s")
        if isinstance(s, int) and s < seq and is_launch(r.get("f") or "") and r.get("r", 0) == 0:
            if last is None or s > last.get("s", -1):
                last = r
    return last


def recurred_note(ctx, rec, code: int) -> str:
    """'call #N F: recorded CUDA_ERROR_X recurred (kernel K)'."""
    f = rec.get("f") or ""
    seq = rec.get("s")
    if is_launch(f):
        k = rec
        where = "in kernel"
    else:
        k = last_launch_before(ctx, seq)
        where = "after kernel"
    kname = ""
    if k is not None:
        h = (k.get("a") or {}).get("f")
        try:
            kname = f" ({where} {ctx.kernel_name_of(h, k.get('s'))}, launch call #{k.get('s')})"
        except Exception:  # a name is a courtesy here
            kname = ""
    return f"call #{seq} {f}: recorded error {cu_result_name(code)} recurred{kname}"
