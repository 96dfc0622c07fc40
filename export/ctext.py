"""How the exported program spells things in C: literals (c_string, c_bytes, lit) and the
program's handle arrays (ARRAYS, Slots, ref): each recorded handle becomes an element of the
array of its kind, numbered in the order the program makes them."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

# handle kind -> (C type, array name)
ARRAYS = {
    "context": ("CUcontext", "ctx"), "module": ("CUmodule", "mod"), "library": ("CUlibrary", "lib"),
    "function": ("CUfunction", "fn"), "kernel": ("CUkernel", "krn"), "stream": ("CUstream", "stream"),
    "event": ("CUevent", "event"), "graph": ("CUgraph", "graph"), "graph_exec": ("CUgraphExec", "gexec"),
    "graph_node": ("CUgraphNode", "gnode"),
    "memh": ("CUmemGenericAllocationHandle", "memh"), "phys": ("CUmemGenericAllocationHandle", "phys"),
}


def c_string(s: str) -> str:
    out = []
    for ch in s.encode("utf-8", "surrogateescape"):
        c = chr(ch)
        if c in '"\\':
            out.append("\\" + c)
        elif 32 <= ch < 127 and c != "?":
            out.append(c)
        else:
            out.append(f"\\{ch:03o}")
    return '"' + "".join(out) + '"'


def c_bytes(b: bytes) -> str:
    """A string literal holding exactly b (its implicit NUL is not counted by the users)."""
    lines, row = [], []
    for i, x in enumerate(b):
        row.append(f"\\x{x:02x}")
        if len(row) == 32:
            lines.append('"' + "".join(row) + '"')
            row = []
    if row or not lines:
        lines.append('"' + "".join(row) + '"')
    return "\n    ".join(lines)


def lit(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        if v < 0:
            return f"({v}LL)" if v < -(1 << 31) else f"({v})"
        return f"0x{v:x}ULL" if v >= (1 << 31) else str(v)
    if isinstance(v, float):
        return repr(v) + ("f" if "." in repr(v) or "e" in repr(v) else ".0f")
    raise TypeError(v)


class Slots:
    """Recorded handle -> the index of its element in its kind's array."""

    def __init__(self):
        self.n: Dict[str, int] = {}
        self.map: Dict[Tuple[str, Any], int] = {}

    def new(self, kind: str, rec_h=None) -> int:
        i = self.n.get(kind, 0)
        self.n[kind] = i + 1
        if rec_h:
            self.map[(kind, rec_h)] = i
        return i

    def get(self, kind: str, rec_h) -> Optional[int]:
        return self.map.get((kind, rec_h))

    def drop(self, kind: str, rec_h) -> Optional[int]:
        return self.map.pop((kind, rec_h), None)


def ref(kind: str, i: int) -> str:
    return f"{ARRAYS[kind][1]}[{i}]"
