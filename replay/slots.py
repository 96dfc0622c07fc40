"""Handle slots and allocation ranges of the replay plan (replay/plan.py): recorded handles
compiled to slot indices of a table the handlers keep filled (Slots, SlotMap), and the recorded
allocation ranges a batch's writes are grouped by (Ranges)."""
from __future__ import annotations

import bisect
from typing import Any, Dict, List, Optional, Tuple


class Slots:
    """Recorded handle -> slot index, per namespace ("h": Replayer.handles, "f": Replayer.funcs),
    and the live values (uint64) the executor reads: a cffi array when the executor module is
    built (grown by copying, between batches), else a list."""

    def __init__(self, ffi=None):
        self.ffi = ffi
        self.index: Dict[Tuple[str, int], int] = {}
        self.n = 1                        # slot 0 unused: keeps "0 = empty" unambiguous
        self.values = ffi.new("uint64_t[]", 1024) if ffi is not None else [0] * 1024
        self.maps: Dict[str, Any] = {}    # namespace -> SlotMap (set by the engine)

    def slot(self, ns: str, h: int) -> int:
        k = (ns, h)
        i = self.index.get(k)
        if i is None:
            i = self.index[k] = self.n
            self.n += 1
            if i >= len(self.values):
                if self.ffi is not None:
                    new = self.ffi.new("uint64_t[]", 2 * len(self.values))
                    self.ffi.memmove(new, self.values, 8 * len(self.values))
                    self.values = new
                else:
                    self.values.extend([0] * len(self.values))
            m = self.maps.get(ns)
            if m is not None and h in m:
                self.values[i] = _live_int(dict.__getitem__(m, h))
        return i


def _live_int(v) -> int:
    try:
        return int(v) & 0xFFFFFFFFFFFFFFFF
    except Exception:
        return 0


class SlotMap(dict):
    """A handle map (recorded -> live) that keeps the executor's slot table in step: handlers
    store and drop handles as before; a handle with a slot is written to it."""

    def __init__(self, slots: Slots, ns: str, init=()):
        super().__init__(init)
        self._slots = slots
        self._ns = ns
        slots.maps[ns] = self

    def _put(self, k, v) -> None:
        i = self._slots.index.get((self._ns, k))
        if i is not None:
            self._slots.values[i] = _live_int(v) if v is not None else 0

    def __setitem__(self, k, v):
        super().__setitem__(k, v)
        self._put(k, v)

    def __delitem__(self, k):
        super().__delitem__(k)
        self._put(k, None)

    def pop(self, k, *default):
        had = k in self
        v = super().pop(k, *default)
        if had:
            self._put(k, None)
        return v

    def setdefault(self, k, v=None):
        if k not in self:
            self[k] = v
        return self[k]

    def update(self, *a, **kw):
        for k, v in dict(*a, **kw).items():
            self[k] = v

    def clear(self):
        for k in list(self):
            self._put(k, None)
        super().clear()


class Ranges:
    """Recorded allocation ranges seen so far (prescan order): groups addresses by the
    allocation holding them, so a batch's writes can be summarised per allocation."""

    def __init__(self):
        self.bases: List[int] = []
        self.size: Dict[int, int] = {}
        self.version = 0                  # bumped on every add (the C planner's copy follows it)

    def add(self, base: int, size: int) -> None:
        self.version += 1
        if base not in self.size:
            bisect.insort(self.bases, base)
        self.size[base] = size

    def key(self, addr: int) -> Optional[int]:
        i = bisect.bisect_right(self.bases, addr) - 1
        if i >= 0:
            b = self.bases[i]
            if addr < b + max(self.size[b], 1):
                return b
        return None
