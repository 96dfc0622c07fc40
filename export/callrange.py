"""`extract --calls A-B`: which calls of the range an extract keeps.

The range's work (launches, graph launches, copies, memsets, and what orders them between them)
with the state-building calls among it. Calls after its last piece of work (frees, unloads,
context teardown) are left out: the expected results are read back after that work. State-building
calls before its first piece of work join the prefix, where the memory is read; what the work
uses that was made before A (streams, events, modules, functions, allocations) comes with the
prefix too."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

from cudasnap.formats.vocab import is_launch, is_workload

from .emit import ExportError, base_name


def range_work(res, sel: List[Dict[str, Any]], lo: int, hi: int, last_seq: Optional[int],
               is_work: Callable[[str], bool], error=ExportError) -> List[Dict[str, Any]]:
    """The calls of sel (the range's successful non-query calls, in order) an extract keeps;
    res (an ExtractResult) gets the counts its summary gives."""
    if last_seq is None:
        raise error(f"--calls {lo}-{hi}: the snapshot holds no complete call")
    if lo > last_seq:
        raise error(f"--calls {lo}-{hi}: the snapshot's calls are #0-#{last_seq}")
    work = [i for i, r in enumerate(sel) if is_workload(r.get("f") or "")]
    if not work:
        raise error(f"--calls {lo}-{min(hi, last_seq)}: no launch, copy or memset in that range")
    res.range_left_out = len(sel) - work[-1] - 1
    sel = sel[work[0]:work[-1] + 1]
    res.launches = sum(is_launch(r.get("f") or "") or base_name(r.get("f") or "").startswith("cuGraphLaunch")
                       for r in sel)
    res.range_state = sum(not is_work(r.get("f") or "") for r in sel)
    return sel


def kept_text(res) -> str:
    """What a --calls extract kept, in one phrase."""
    deps = res.prefix_calls + res.range_state
    return (f"{res.launches} launch(es) and {len(res.selected) - res.range_state - res.launches} other work call(s), "
            f"with {deps} call(s) they depend on ({res.prefix_calls} made before its first work)"
            + (f"; {res.range_left_out} call(s) after the range's last work left out" if res.range_left_out else ""))
