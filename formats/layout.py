"""Struct layouts from the API description (shim/api_description.json, measured from cuda.h
by shim/gen_api.py): the sizes and field offsets handlers use, so none hard-codes them."""
from __future__ import annotations

import struct
from functools import lru_cache
from typing import Any, Dict, Optional, Sequence

from cudasnap.shim.description import load

from .vocab import in_class

_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}


def _type(name: str) -> Dict[str, Any]:
    t = load().types.get(name)
    if t is None or t.get("kind") != "struct":
        raise KeyError(f"the API description has no struct {name}")
    return t


@lru_cache(maxsize=None)
def sizeof(name: str) -> int:
    return int(_type(name)["size"])


@lru_cache(maxsize=None)
def offsetof(name: str, field: str) -> int:
    for f in _type(name)["fields"]:
        if f[0] == field:
            return int(f[2])
    raise KeyError(f"struct {name} has no field {field}")


@lru_cache(maxsize=None)
def packer(name: str, fields: Optional[Sequence[str]] = None) -> struct.Struct:
    """A little-endian struct.Struct over the integer (or pointer) fields of `name` in offset
    order (all of them when `fields` is None), padded to sizeof(name)."""
    fmt, pos = "<", 0
    for f in sorted(_type(name)["fields"], key=lambda f: f[2]):
        fname, off, size = f[0], int(f[2]), int(f[3])
        if fields is not None and fname not in fields:
            continue
        if off < pos or size not in _CODES:
            raise ValueError(f"struct {name}: field {fname} cannot be packed")
        fmt += f"{off - pos}x" if off > pos else ""
        fmt += _CODES[size]
        pos = off + size
    total = sizeof(name)
    return struct.Struct(fmt + (f"{total - pos}x" if total > pos else ""))


def recorded_stream(f: str, a: Dict[str, Any]) -> Any:
    """The recorded stream handle a call was issued on: its hStream argument, or for
    cuLaunchKernelEx the one in its captured launch configuration (None when neither is there)."""
    cfg = a.get("config")
    if in_class(f, "config_launch") and isinstance(cfg, (bytes, bytearray)):
        off = offsetof("CUlaunchConfig", "hStream")
        if len(cfg) >= off + 8:
            return struct.unpack_from("<Q", cfg, off)[0]
    return a.get("hStream")
