"""Replay handlers, one module per family.  Each registers with @handles(...); dispatch.py
imports the family modules (this package imports none of them)."""
from __future__ import annotations

from typing import Callable, Dict, NamedTuple


class Handler(NamedTuple):
    fn: Callable
    errors: bool      # re-execute when the recorded call returned an error
    family: str
    via: str = ""     # the driver entry point the handler replays these calls through, where it is another


REGISTRY: Dict[str, Handler] = {}   # base name or ABI name -> handler


def handles(*names: str, errors: bool = False, family: str = "", via: str = ""):
    def deco(fn):
        for n in names:
            REGISTRY[n] = Handler(fn, errors, family or fn.__module__.rsplit(".", 1)[-1], via)
        return fn
    return deco
