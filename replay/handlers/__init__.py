"""Replay handlers, one module per family. The overrides table (shim/overlay.py OVERRIDES, read
through the description) names each function's handler; dispatch.py registers them."""
from __future__ import annotations

from typing import Callable, Dict, NamedTuple


class Handler(NamedTuple):
    fn: Callable
    errors: bool      # re-execute when the recorded call returned an error
    family: str
    via: str = ""     # the driver entry point the handler replays these calls through, where it is another


REGISTRY: Dict[str, Handler] = {}   # base name or ABI name -> handler
