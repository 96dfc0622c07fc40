"""The profile modes of `replay --profile MODE`, each described once: what the command line, the
campaign, bisect, compare, advise and the cell servers ask of a mode reads this table.

    MODES["isolated"].repeats     # each launch run --warmup + --repeat times
    mode("graph").profiler(cfg, warn)
    for_advise("stretch").name    # the mode advise measures a stretch's what-if in
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple


@dataclass(frozen=True)
class ProfileMode:
    name: str
    repeats: bool        # runs each launch (or the graph) --warmup + --repeat times
    cupti: bool          # times kernels from CUPTI activity records when cupti-python loads
    campaign: bool       # gives per-kernel times a campaign or bisect judges (one row per kernel run)
    factory: str         # "module:Class" under replay/profile/: the profiler, a replay subscriber
    renderer: str        # module under replay/profile/ with render_table(report, out, top) and write_out(report, path)
    words: str           # what it measures, for help texts
    advise: str = ""     # what advise takes it for: "profile" (its findings' launches on the replay's time
    #                      axis), "counters" (bounds, occupancy), "stretch" (a stretch as one graph, measured),
    #                      "variant" (each launch timed, with and without a change)

    def profiler(self, cfg, warn: Callable[[str], None]):
        mod, cls = self.factory.split(":")
        return getattr(importlib.import_module(f"{__package__}.{mod}"), cls)(cfg, warn)

    def render_table(self, report: Dict[str, Any], out, top: int) -> None:
        importlib.import_module(f"{__package__}.{self.renderer}").render_table(report, out, top)

    def write_out(self, report: Dict[str, Any], path: str) -> None:
        importlib.import_module(f"{__package__}.{self.renderer}").write_out(report, path)


MODES: Dict[str, ProfileMode] = {m.name: m for m in (
    ProfileMode("timeline", False, True, True, "timeline:TimelineProfiler", "report",
                "the replay as recorded (asynchronous), kernel and copy times", advise="profile"),
    ProfileMode("isolated", True, True, True, "isolated:IsolatedProfiler", "report",
                "each launch alone, from restored memory, L2 flushed", advise="variant"),
    ProfileMode("graph", True, True, False, "graphmode:GraphProfiler", "report",
                "the launches as one CUDA graph, each node timed", advise="stretch"),
    ProfileMode("metrics", False, False, False, "metrics:MetricsProfiler", "metrics_report",
                "hardware counters per launch (CUPTI's range profiler)", advise="counters"),
)}


def mode(name: Optional[str]) -> Optional[ProfileMode]:
    return MODES.get(name) if name else None


def names(**want: bool) -> Tuple[str, ...]:
    """The modes whose flags are as given, e.g. names(repeats=True)."""
    return tuple(m.name for m in MODES.values() if all(getattr(m, k) == v for k, v in want.items()))


def for_advise(use: str) -> ProfileMode:
    """The mode advise takes for a use ("profile", "counters", "stretch", "variant")."""
    found = [m for m in MODES.values() if m.advise == use]
    if len(found) != 1:
        raise KeyError(f"no one profile mode for advise's {use!r}")
    return found[0]
