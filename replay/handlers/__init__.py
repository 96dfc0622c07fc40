"""Replay handlers, one module per family.  Each registers with @handles(...).

@refuses(..., reason=...) registers a handler that stops the replay with a one-line reason:
the call cannot be rebuilt from what capture recorded.  Refused names are not listed in
dispatch.REPLAY_HANDLED (they are in dispatch.REPLAY_REFUSED, with the reason)."""
from __future__ import annotations

from typing import Callable, Dict, NamedTuple


class Handler(NamedTuple):
    fn: Callable
    errors: bool      # re-execute when the recorded call returned an error
    family: str
    refused: str = ""  # non-empty: the handler only refuses (the reason)


REGISTRY: Dict[str, Handler] = {}   # base name or ABI name -> handler


def handles(*names: str, errors: bool = False, family: str = ""):
    def deco(fn):
        for n in names:
            REGISTRY[n] = Handler(fn, errors, family or fn.__module__.rsplit(".", 1)[-1])
        return fn
    return deco


def refuses(*names: str, reason: str, family: str = ""):
    """Calls that cannot be replayed from the recording: stop with `reason` (errors=False: a
    call that failed when recorded had no effect and is skipped like any other)."""
    def deco(fn):
        for n in names:
            REGISTRY[n] = Handler(fn, False, family or fn.__module__.rsplit(".", 1)[-1], reason)
        return fn
    return deco


def load_all() -> Dict[str, Handler]:
    from . import context, generic, graph, ipc, launch, memory, module, profiler, stream  # noqa: F401
    return REGISTRY
