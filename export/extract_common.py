"""What the parts of an extract share (export/extract.py puts them together): its result, its
error, and the facts about a call every part asks (its stream, whether it is work)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Tuple

from cudasnap.formats.layout import recorded_stream
from cudasnap.formats.vocab import in_class, is_graph_launch, is_query, is_sync

from .emit import ExportError, base_name

# argument keys that name a module, library or function handle
HANDLE_KEYS = ("module", "library", "hmod", "hfunc", "kernel", "pKernel", "pFunc", "pMod", "f")


class ExtractError(ExportError):
    pass


class Done(BaseException):
    """Ends the replay once the selection ran (a BaseException: replay's subscriber guard
    reports and swallows Exceptions)."""


@dataclass
class ExtractResult:
    output: str
    selected: List[int] = field(default_factory=list)        # original call numbers
    kernels: List[str] = field(default_factory=list)
    memory: str = "reachable"
    ranges: str = "exact"
    segments: int = 0                 # allocations the restored ranges lie in
    segments_bytes: int = 0
    written_beyond: int = 0           # bytes written outside the ranges (added to them)
    module_bytes: int = 0             # images of the module loads kept (as written)
    sass_dropped: List[int] = field(default_factory=list)    # architectures whose SASS was left out
    sass_dropped_bytes: int = 0
    allocs_dropped: int = 0           # allocations (and their frees) the selection cannot reach
    lookups_dropped: int = 0          # function lookups (and calls naming them) no kept launch uses
    objects_dropped: int = 0          # streams and events (with their destructions) no kept call names
    restored: List[Tuple[int, int]] = field(default_factory=list)     # (base, size)
    restored_bytes: int = 0
    expected: int = 0
    expected_bytes: int = 0
    prefix_calls: int = 0
    modules_kept: int = 0
    modules_dropped: int = 0
    size: int = 0
    original_size: int = 0
    elapsed_s: float = 0.0
    notes: List[str] = field(default_factory=list)
    launches: int = 0                 # --calls: launches (and graph launches) kept
    range_state: int = 0              # --calls: state-building calls kept from inside the range
    range_left_out: int = 0           # --calls: calls after the range's last work, left out


def stream_key(f: str, a) -> int:
    """The stream a call was issued on, as the capture bookkeeping keys it: the handle, or 0 for
    the legacy default stream and 2 for the per-thread one; cuLaunchKernelEx carries its stream
    in the launch configuration."""
    return recorded_stream(f, a) or (2 if ("_ptsz" in f or "_ptds" in f) else 0)


def is_work(f: str) -> bool:
    """Calls whose effect the restored memory stands for (or that only order work)."""
    b = base_name(f)
    return (in_class(b, "launch_group") or is_graph_launch(b) or in_class(b, "moves_memory")
            or is_sync(b) or in_class(b, "order"))


def skipped_query(f: str) -> bool:
    """A query replay skips: the description's class, and no handler of its own."""
    from cudasnap.replay import dispatch
    return dispatch.lookup(f) is None and is_query(f)
