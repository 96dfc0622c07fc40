"""Pinned host memory at its recorded address.

Kernels reach mapped pinned memory (cuMemHostAlloc with DEVICEMAP, cuMemAllocHost, registered
host ranges) through its host address (unified addressing), and programs store that address in
device memory (NCCL's device communicators do). Replay maps anonymous memory at the recorded
address (MAP_FIXED_NOREPLACE: never over something of ours) and registers it with the driver,
so the recorded pointers stay valid. The recorded ranges are reserved (PROT_NONE) before the
driver loads, so that its mappings and the libraries' do not take them first. Where an address
is taken anyway, the caller falls back to a driver-chosen address (a relocation)."""
from __future__ import annotations

import ctypes
import mmap
import os
from typing import Any, Dict, Iterable, Optional, Tuple

from cudasnap.formats.vocab import in_class

_PAGE = mmap.PAGESIZE
_MAP_FIXED_NOREPLACE = 0x100000
_MAP_NORESERVE = 0x4000
_MAP_FIXED = 0x10
_PROT_NONE = 0
_REG_PORTABLE, _REG_DEVICEMAP = 0x1, 0x2

_libc = None


def _c():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.mmap.restype = ctypes.c_void_p
        _libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        _libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return _libc


def span(addr: int, size: int):
    lo = addr - addr % _PAGE
    hi = addr + max(size, 1)
    return lo, (hi + _PAGE - 1) // _PAGE * _PAGE - lo


def recorded_range(rec: Dict[str, Any]) -> Tuple[int, int]:
    """(recorded address, size) of a call that pins host memory (class pins_host; 0 where the
    record lacks them)."""
    a = rec.get("a") or {}
    addr = a.get("pp") if in_class(rec.get("f", ""), "host_alloc") else a.get("p")
    return (addr if isinstance(addr, int) else 0), int(a.get("bytesize", 0) or 0)


_reserved: Dict[int, int] = {}     # page-aligned start -> length of our PROT_NONE reservations


def reserve(ranges: Iterable[Tuple[int, int]]) -> int:
    """Hold the recorded host ranges (PROT_NONE, nothing committed) before the driver and the
    libraries it loads map memory there; map_at() then takes them over. Returns how many."""
    if os.environ.get("CUDASNAP_HOST_PLACEMENT", "1") == "0":
        return 0
    c = _c()
    n_ok = 0
    for addr, size in ranges:
        if not addr or size <= 0:
            continue
        lo, n = span(addr, size)
        if any(b <= lo < b + m or lo <= b < lo + n for b, m in _reserved.items()):
            continue
        got = c.mmap(lo, n, _PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE | _MAP_FIXED_NOREPLACE,
                     -1, 0)
        if got == lo:
            _reserved[lo] = n
            n_ok += 1
        elif got not in (None, ctypes.c_void_p(-1).value, 2 ** 64 - 1):
            c.munmap(got, n)
    return n_ok


_live: Dict[int, int] = {}         # ranges of reservations that map_at() has mapped


def _held(lo: int, n: int) -> bool:
    """Inside a reservation of ours and not mapped yet."""
    return (any(b <= lo and lo + n <= b + m for b, m in _reserved.items())
            and not any(b < lo + n and lo < b + m for b, m in _live.items()))


def map_at(addr: int, size: int) -> bool:
    """Anonymous zeroed memory covering [addr, addr+size), exactly there; False if taken."""
    if not addr or size <= 0 or os.environ.get("CUDASNAP_HOST_PLACEMENT", "1") == "0":
        return False
    lo, n = span(addr, size)
    c = _c()
    # inside a reservation of ours: replace it (MAP_FIXED over our own PROT_NONE pages only)
    fixed = _MAP_FIXED if _held(lo, n) else _MAP_FIXED_NOREPLACE
    got = c.mmap(lo, n, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | fixed, -1, 0)
    if got in (None, ctypes.c_void_p(-1).value) or got == 2 ** 64 - 1:
        return False
    if got != lo:        # an old kernel ignoring NOREPLACE gave another address
        c.munmap(got, n)
        return False
    if fixed == _MAP_FIXED:
        _live[lo] = n
    return True


def unmap(addr: int, size: int) -> None:
    lo, n = span(addr, size)
    if _live.pop(lo, None) is not None:      # back to a reservation: ours for a later allocation
        _c().mmap(lo, n, _PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE | _MAP_FIXED, -1, 0)
    else:
        _c().munmap(lo, n)


def place(ctx, addr: int, size: int, flags: int = 0) -> Optional[int]:
    """Map and register [addr, addr+size) for the device; the address, or None (nothing left
    mapped) when the address is taken or the driver refuses."""
    if not map_at(addr, size):
        return None
    lo, n = span(addr, size)
    reg = _REG_DEVICEMAP | (_REG_PORTABLE if flags & 0x1 else 0)
    try:
        r = ctx.cu.cuMemHostRegister(lo, n, reg)
        code = int(r[0]) if isinstance(r, tuple) else int(r)
    except Exception:
        code = -1
    if code != 0:
        unmap(addr, size)
        return None
    return addr


def release_reservations() -> int:
    """Unmap every host range reserve() holds (the replay that needed them has ended and
    released what it placed there); how many."""
    c = _c()
    n = 0
    for lo, size in list(_reserved.items()):
        if not any(lo <= b < lo + size for b in _live):
            c.munmap(lo, size)
            del _reserved[lo]
            n += 1
    return n


def release(ctx, addr: int, size: int) -> None:
    lo, n = span(addr, size)
    try:
        ctx.cu.cuMemHostUnregister(lo)
    finally:
        unmap(addr, size)
