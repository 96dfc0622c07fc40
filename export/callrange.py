"""`extract --calls A-B`: which calls of the range an extract keeps.

The range's work (launches, graph launches, copies, memsets, and what orders them between them)
with the state-building calls among it. Calls after its last piece of work (frees, unloads,
context teardown) are left out: the expected results are read back after that work. State-building
calls before its first piece of work join the prefix, where the memory is read; what the work
uses that was made before A (streams, events, modules, functions, allocations) comes with the
prefix too. A stream capture is never cut: memory cannot be read while one is open, so a range
that starts or ends inside one grows to the whole capture."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from cudasnap.formats.vocab import in_class, is_graph_launch, is_launch, is_workload

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
    count_kept(res, sel, is_work)
    return sel


def count_kept(res, sel: List[Dict[str, Any]], is_work: Callable[[str], bool]) -> None:
    res.launches = sum(is_launch(r.get("f") or "") or is_graph_launch(r.get("f") or "")
                       for r in sel)
    res.range_state = sum(not is_work(r.get("f") or "") for r in sel)


class CaptureSpans:
    """The stream captures of a snapshot, as (begin, end) call numbers: fed every call in order
    (stream_key gives the stream a call was issued on); a capture never ended ends at the last
    call."""

    def __init__(self, stream_key: Callable[[str, Any], Any]):
        self.key = stream_key
        self.open: Dict[Any, int] = {}
        self.spans: List[Tuple[int, int]] = []

    def feed(self, rec: Dict[str, Any]) -> None:
        f = base_name(rec.get("f") or "")
        if in_class(f, "begins_capture"):
            if rec.get("r", 0) == 0:
                self.open[self.key(rec.get("f") or "", rec.get("a") or {})] = rec["s"]
        elif in_class(f, "ends_capture"):        # ends it, failed (an invalidated capture) or not
            b = self.open.pop(self.key(rec.get("f") or "", rec.get("a") or {}), None)
            if b is not None:
                self.spans.append((b, rec["s"]))

    def whole(self, first: int, last: int, last_seq: int) -> Tuple[int, int]:
        """first..last grown until no capture is open at its start or still open at its end."""
        spans = self.spans + [(b, last_seq) for b in self.open.values()]
        grown = True
        while grown:
            grown = False
            for b, e in spans:
                if b < first <= e:
                    first, grown = b, True
                if b <= last < e:
                    last, grown = e, True
        return first, last


def kept_text(res) -> str:
    """What a --calls extract kept, in one phrase."""
    deps = res.prefix_calls + res.range_state
    return (f"{res.launches} launch(es) and {len(res.selected) - res.range_state - res.launches} other work call(s), "
            f"with {deps} call(s) they depend on ({res.prefix_calls} made before its first work)"
            + (f"; {res.range_left_out} call(s) after the range's last work left out" if res.range_left_out else ""))
