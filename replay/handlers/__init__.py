"""Replay handlers, one module per family.  Each registers with @handles(...); dispatch.py
imports the family modules (this package imports none of them)."""
from __future__ import annotations

from typing import Callable, Dict, NamedTuple


class Handler(NamedTuple):
    fn: Callable
    errors: bool      # re-execute when the recorded call returned an error
    family: str


REGISTRY: Dict[str, Handler] = {}   # base name or ABI name -> handler


def handles(*names: str, errors: bool = False, family: str = ""):
    def deco(fn):
        for n in names:
            REGISTRY[n] = Handler(fn, errors, family or fn.__module__.rsplit(".", 1)[-1])
        return fn
    return deco
