"""Address-space manager: places every device allocation at its recorded virtual address.

Plan (driver-free, testable): collect the recorded allocation ranges, align them to the
VMM granularity and merge overlapping/adjacent ones into spans.  Reserve (driver): after
cuInit, reserve each span with cuMemAddressReserve(addr=span start) and verify the hint was
honoured exactly.  Allocate: map physical memory (cuMemCreate + cuMemMap + cuMemSetAccess)
at the recorded address, sharing granules between small allocations (reference counted
chunks).  A range whose span could not be reserved falls back to cuMemAlloc anywhere and
gets a relocation (recorded base -> live base, with the reason).

Test hook: CUDASNAP_REPLAY_TEST_BLOCK=ADDR[:SIZE] (hex or decimal) reserves that range
before the spans are reserved, so the span covering it misses and falls back.  Only for
tests of the fallback path.
"""
from __future__ import annotations

import bisect
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

TEST_BLOCK_ENV = "CUDASNAP_REPLAY_TEST_BLOCK"
MAX_RANGE = 1 << 42                 # 4 TiB, beyond any GPU's memory: a larger mapping is a damaged size


def align_down(x: int, a: int) -> int:
    return x - (x % a)


def align_up(x: int, a: int) -> int:
    return -(-x // a) * a


def plan_spans(ranges: List[Tuple[int, int]], gran: int) -> List[Tuple[int, int]]:
    """Recorded (base, size) ranges -> sorted, merged, granule-aligned (start, size) spans."""
    iv = sorted((align_down(b, gran), align_up(b + max(s, 1), gran)) for b, s in ranges if b)
    out: List[List[int]] = []
    for lo, hi in iv:
        if out and lo <= out[-1][1]:  # overlapping or adjacent
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi - lo) for lo, hi in out]


@dataclass
class Relocation:
    rec_base: int
    size: int
    new_base: int
    reason: str
    seq: Optional[int] = None
    host: bool = False

    def to_dict(self) -> Dict[str, Any]:
        return {"rec_base": hex(self.rec_base), "size": self.size, "new_base": hex(self.new_base),
                "reason": self.reason, "seq": self.seq, "host": self.host}


@dataclass
class Span:
    start: int
    size: int
    reserved: bool = False
    live: int = 0
    reason: str = ""
    refused: bool = False     # the driver refused the call (as opposed to moving the hint)

    @property
    def end(self) -> int:
        return self.start + self.size


@dataclass
class Chunk:
    start: int
    size: int
    handle: Any
    refs: int = 0


FREED_KINDS = ("placed", "fallback", "host", "vmm")     # allocations the program frees


@dataclass
class Alloc:
    rec_base: int
    size: int
    live_base: int
    kind: str              # "placed" | "fallback" | "host" | "vmm"
    seq: Optional[int] = None
    chunks: List[Chunk] = field(default_factory=list)
    last_writer: Optional[Tuple[int, str]] = None  # (seq, kernel or API name)


class AddressSpace:
    """Owns recorded->live address placement.  `drv` is a small adapter (see engine.DriverOps)
    with reserve/free_va/create/map/unmap/release/set_access/mem_alloc/mem_free methods;
    None for pure planning."""

    def __init__(self, drv=None, gran: int = 2 << 20):
        self.drv = drv
        self.gran = gran
        self.spans: List[Span] = []
        self._span_starts: List[int] = []
        self.granule_chunk: Dict[int, Chunk] = {}
        self.allocs: Dict[int, Alloc] = {}          # recorded base -> Alloc (live ones)
        self._sorted: List[int] = []                 # sorted recorded bases of live allocs
        self._waiting: Dict[int, List[Alloc]] = {}   # recorded base -> allocations due after the live one
        self.relocations: List[Relocation] = []      # every relocation ever made (report)
        self.placed = 0
        self.fell_back = 0
        self.shared: set = set()      # recorded bases the program shares through legacy IPC
        self.host_relocated = 0
        self.globals_relocated = 0
        self.test_block: Optional[Tuple[int, int]] = None
        self._blocks: List[int] = []
        self._ranges: List[Tuple[int, int]] = []
        self.held: Optional[List[Alloc]] = None      # freed allocations kept mapped (hold_frees)
        self.held_host: List[Callable[[], None]] = []   # host memory frees waiting for release_held
        self.mappings: Dict[int, int] = {}           # the program's own cuMemMap ranges: live base -> size
        self._map_starts: List[int] = []             # their sorted bases

    # ------------------------------------------------------------- planning / reservation
    def plan(self, ranges: List[Tuple[int, int]], regions: List[Tuple[int, int]] = ()) -> List[Span]:
        """ranges: recorded allocations; regions: whole zones capture reserved (reserved as one
        span; if a zone misses, its allocations are retried piece by piece)."""
        self._ranges = list(ranges)
        self.spans = [Span(s, n) for s, n in plan_spans(list(ranges) + list(regions), self.gran)]
        self._span_starts = [s.start for s in self.spans]
        return self.spans

    def _split_missed(self) -> None:
        """A span that missed is retried as its pieces (granule groups of overlapping
        allocations, without merging merely adjacent ones), so one occupied granule only
        costs the allocations that really sit on it."""
        out: List[Span] = []
        changed = False
        for sp in self.spans:
            if sp.reserved or sp.refused:
                out.append(sp)
                continue
            inside = [(b, n) for b, n in self._ranges if sp.start <= b < sp.end]
            iv = sorted((align_down(b, self.gran), align_up(b + max(n, 1), self.gran)) for b, n in inside)
            pieces: List[List[int]] = []
            for lo, hi in iv:
                if pieces and lo < pieces[-1][1]:
                    pieces[-1][1] = max(pieces[-1][1], hi)
                else:
                    pieces.append([lo, hi])
            if len(pieces) <= 1:
                out.append(sp)
                continue
            changed = True
            for lo, hi in pieces:
                piece = Span(lo, hi - lo)
                self._reserve_one(piece)
                out.append(piece)
        if changed:
            self.spans = out
            self._span_starts = [s.start for s in self.spans]

    def _reserve_one(self, sp: "Span") -> None:
        sp.refused, sp.reason = False, ""
        try:
            got = self.drv.reserve(sp.size, sp.start)
        except Exception as e:  # driver refused entirely
            sp.reason = f"cuMemAddressReserve failed: {e}"
            sp.refused = True
            return
        if got == sp.start:
            sp.reserved, sp.live = True, got
        else:
            sp.reason = (f"cuMemAddressReserve({sp.size:#x} at {sp.start:#x}) returned {got:#x}: "
                         f"the driver did not honour the hint (range in use or not reservable)")
            try:
                self.drv.free_va(got, sp.size)
            except Exception:
                pass

    def reserve_all(self) -> None:
        blk = os.environ.get(TEST_BLOCK_ENV)
        if blk and not self._blocks:
            addr, _, size = blk.partition(":")
            a = align_down(int(addr, 0), self.gran)
            n = align_up(int(size, 0), self.gran) if size else self.gran
            try:
                self._blocks.append(self.drv.reserve(n, a))
            except Exception:
                pass
            self.test_block = (a, n)
        for sp in self.spans:
            if not sp.reserved:
                self._reserve_one(sp)
        if not all(sp.refused for sp in self.spans if not sp.reserved):
            self._split_missed()

    def span_of(self, addr: int, size: int = 1) -> Optional[Span]:
        i = bisect.bisect_right(self._span_starts, addr) - 1
        if i >= 0:
            sp = self.spans[i]
            if sp.start <= addr and addr + max(size, 1) <= sp.end:
                return sp
        return None

    # ------------------------------------------------------------------- allocations
    def _register(self, a: Alloc) -> None:
        old = self.allocs.get(a.rec_base)
        if old is not None and old.kind in FREED_KINDS and a.kind in FREED_KINDS:
            # The same recorded address live twice in replay order: calls are numbered as they
            # enter, so an allocation that entered before another thread's free returned can
            # hold the address that free gave back.  The older stays current until its free.
            self._waiting.setdefault(a.rec_base, []).append(a)
            return
        if old is not None:
            self._forget(a.rec_base)
        self.allocs[a.rec_base] = a
        bisect.insort(self._sorted, a.rec_base)

    def _forget(self, rec_base: int) -> Optional[Alloc]:
        a = self.allocs.pop(rec_base, None)
        if a is not None:
            i = bisect.bisect_left(self._sorted, rec_base)
            if i < len(self._sorted) and self._sorted[i] == rec_base:
                del self._sorted[i]
        return a

    def _map_range(self, base: int, size: int) -> List[Chunk]:
        """Map physical memory over [base, base+size) granule-aligned, sharing mapped granules."""
        g = self.gran
        lo, hi = align_down(base, g), align_up(base + max(size, 1), g)
        if hi - lo > MAX_RANGE:       # a damaged size: never walk its granules one by one
            raise ValueError(f"{size} bytes is more memory than a GPU has")
        chunks: List[Chunk] = []
        run_start = None
        addr = lo
        while addr <= hi:
            mapped = self.granule_chunk.get(addr) if addr < hi else None
            if addr < hi and mapped is None:
                if run_start is None:
                    run_start = addr
            else:
                if run_start is not None:
                    n = addr - run_start
                    c = Chunk(run_start, n, self._back(run_start, n))
                    for ga in range(run_start, addr, g):
                        self.granule_chunk[ga] = c
                    chunks.append(c)
                    run_start = None
                if mapped is not None and mapped not in chunks:
                    chunks.append(mapped)
            addr += g
        for c in chunks:
            c.refs += 1
        return chunks

    def _unref(self, chunks: List[Chunk]) -> None:
        for c in chunks:
            c.refs -= 1
            if c.refs <= 0:
                for ga in range(c.start, c.start + c.size, self.gran):
                    if self.granule_chunk.get(ga) is c:
                        del self.granule_chunk[ga]
                try:
                    self.drv.unmap(c.start, c.size)
                finally:
                    self.drv.release(c.handle)

    def alloc(self, rec_base: int, size: int, seq: Optional[int] = None) -> int:
        """Allocate device memory for a recorded allocation; returns the live base address."""
        sp = self.span_of(rec_base, size)
        if sp is not None and sp.reserved:
            try:
                chunks = self._map_range(rec_base, size)
            except Exception as e:
                reason = f"mapping at the recorded address failed: {e}"
            else:
                self._register(Alloc(rec_base, size, rec_base, "placed", seq, chunks))
                self.placed += 1
                return rec_base
        else:
            reason = sp.reason if sp is not None else "recorded range was not reserved (not in the pre-scan)"
        chunks = []
        if rec_base in self.shared:
            # shared with another process (legacy IPC): VMM memory anywhere, handed over as
            # shareable fds like placed memory (an IPC handle opens only from a related process)
            new, chunks = self._map_anywhere(size)
        else:
            new = self.drv.mem_alloc(size)
        self._register(Alloc(rec_base, size, new, "fallback", seq, chunks))
        self.relocations.append(Relocation(rec_base, size, new, reason, seq))
        self.fell_back += 1
        return new

    def _back(self, addr: int, n: int):
        """Physical memory mapped and made accessible over [addr, addr+n); its handle."""
        h = self.drv.create(n)
        try:
            self.drv.map(addr, n, h)
            self.drv.set_access(addr, n)
        except Exception:
            self.drv.release(h)
            raise
        return h

    def _map_anywhere(self, size: int) -> Tuple[int, List[Chunk]]:
        n = align_up(max(size, 1), self.gran)
        va = self.drv.reserve(n, 0, self.gran)
        try:
            h = self._back(va, n)
        except Exception:
            self.drv.free_va(va, n)
            raise
        return va, [Chunk(va, n, h, refs=1)]

    def add_host(self, rec_base: int, size: int, live: int, seq: Optional[int] = None) -> None:
        """Pinned host memory: its address is the host allocator's; record a relocation."""
        self._register(Alloc(rec_base, size, live, "host", seq))
        if live != rec_base:
            self.relocations.append(Relocation(rec_base, size, live, "host memory (address chosen by the host)", seq, host=True))
            self.host_relocated += 1

    def add_vmm(self, rec_base: int, size: int, live: int, seq: Optional[int] = None, reason: str = "") -> None:
        """A program-recorded VMM reservation: placed when live == recorded."""
        self._register(Alloc(rec_base, size, live, "vmm", seq))
        if live == rec_base:
            self.placed += 1
        else:
            self.fell_back += 1
            self.relocations.append(Relocation(rec_base, size, live, reason or "reservation hint not honoured", seq))

    def add_global(self, rec_base: int, size: int, live: int, seq: Optional[int] = None, name: str = "") -> None:
        """A module global: the loader chooses its address; relocate when it moved."""
        self._register(Alloc(rec_base, size, live, "global", seq))
        if live != rec_base:
            self.relocations.append(Relocation(rec_base, size, live, f"module global {name} (placed by the module loader)",
                                               seq, host=True))
            self.globals_relocated += 1

    def free(self, rec_base: int) -> Optional[Alloc]:
        a = self._forget(rec_base)
        if a is None:
            return None
        later = self._waiting.get(rec_base)
        if later:                        # the allocation that took this address after the free
            self.allocs[rec_base] = later.pop(0)
            bisect.insort(self._sorted, rec_base)
            if not later:
                del self._waiting[rec_base]
        if self.held is not None and a.kind in ("placed", "fallback"):
            self.held.append(a)          # released by release_held
        else:
            self._release(a)
        return a

    def _release(self, a: Alloc) -> None:
        if a.kind == "placed":
            self._unref(a.chunks)
        elif a.kind == "fallback" and a.chunks:
            for c in a.chunks:
                self.drv.unmap(c.start, c.size)
                self.drv.release(c.handle)
                self.drv.free_va(c.start, c.size)
        elif a.kind == "fallback":
            self.drv.mem_free(a.live_base)

    # A graph of a recorded sequence runs after the whole sequence was replayed, so memory the
    # sequence freed (stream-ordered pools, scratch buffers) must still be there when it runs.
    # While holding, frees forget the allocation but keep its memory mapped; an allocation at
    # the same recorded address maps the same granules again, as the program's pool did.
    def hold_frees(self) -> None:
        if self.held is None:
            self.held = []

    def held_ranges(self) -> List[Tuple[int, int]]:
        return [(a.live_base, a.size) for a in self.held or []]

    def hold_host_free(self, free: Callable[[], None]) -> bool:
        """While frees are held, a free of host memory (kernels may read it through its device
        address) waits too: True when it was kept for release_held."""
        if self.held is None:
            return False
        self.held_host.append(free)
        return True

    def release_held(self) -> int:
        held, self.held = self.held or [], None
        host, self.held_host = self.held_host, []
        for release in [*(lambda a=a: self._release(a) for a in held), *host]:
            try:
                release()
            except Exception:
                pass
        return len(held) + len(host)

    def release_all(self) -> Dict[str, int]:
        """Give back everything this space holds in the driver (the replay has ended and another
        may run in this process): device memory of live and held allocations, the granules they
        mapped, the reserved spans and test blocks. The program's own VMM reservations, host
        memory and module globals are not the space's to free. Counts of what was released and
        of what could not be."""
        out = {"allocations": 0, "spans": 0, "failed": 0}
        pending = [*self.allocs.values(), *(self.held or []), *(w for ws in self._waiting.values() for w in ws)]
        for a in pending:
            if a.kind not in ("placed", "fallback"):
                continue
            try:
                self._release(a)
                out["allocations"] += 1
            except Exception:
                out["failed"] += 1
        for release in self.held_host:
            try:
                release()
            except Exception:
                out["failed"] += 1
        for c in {id(c): c for c in self.granule_chunk.values()}.values():   # still mapped: unreferenced now
            try:
                self.drv.unmap(c.start, c.size)
                self.drv.release(c.handle)
            except Exception:
                out["failed"] += 1
        for sp in self.spans:
            if sp.reserved:
                try:
                    self.drv.free_va(sp.live, sp.size)
                    out["spans"] += 1
                except Exception:
                    out["failed"] += 1
                sp.reserved = False
        for b in self._blocks:
            try:
                self.drv.free_va(b, self.test_block[1] if self.test_block else self.gran)
            except Exception:
                out["failed"] += 1
        self.allocs.clear()
        self._sorted.clear()
        self._waiting.clear()
        self.granule_chunk.clear()
        self.held, self.held_host, self._blocks = None, [], []
        return out

    # The program's own VMM mappings (cuMemMap on its reservations): memory kernels write that
    # is no replayed allocation (a "vmm" alloc is the whole reservation, mostly unmapped).
    def note_map(self, live: int, size: int) -> None:
        if live and size:
            if live not in self.mappings:
                bisect.insort(self._map_starts, live)
            self.mappings[live] = size

    def note_unmap(self, live: int, size: int) -> None:
        end = live + size
        i = max(0, bisect.bisect_right(self._map_starts, live) - 1)
        hit = []
        while i < len(self._map_starts) and self._map_starts[i] < end:
            b = self._map_starts[i]
            if b + self.mappings[b] > live:
                hit.append(b)
            i += 1
        for b in hit:
            n = self.mappings.pop(b)
            self._map_starts.remove(b)
            if b < live:                       # what stays mapped either side
                self.note_map(b, live - b)
            if b + n > end:
                self.note_map(end, b + n - end)

    def find_mapping(self, live: int) -> Optional[Tuple[int, int]]:
        i = bisect.bisect_right(self._map_starts, live) - 1
        if i >= 0:
            b = self._map_starts[i]
            if live < b + self.mappings[b]:
                return b, self.mappings[b]
        return None

    # ------------------------------------------------------------------- translation
    def in_order(self) -> List[Alloc]:
        """The live allocations by recorded base."""
        return [self.allocs[b] for b in list(self._sorted)]

    def find(self, rec_addr: int) -> Optional[Alloc]:
        i = bisect.bisect_right(self._sorted, rec_addr) - 1
        if i >= 0:
            a = self.allocs[self._sorted[i]]
            if a.rec_base <= rec_addr < a.rec_base + max(a.size, 1):
                return a
        return None

    def translate(self, rec_addr: int) -> int:
        """Recorded address -> live address (identity when placed or unknown)."""
        if not rec_addr:
            return rec_addr
        a = self.find(rec_addr)
        if a is None or a.live_base == a.rec_base:
            return rec_addr
        return a.live_base + (rec_addr - a.rec_base)

    @property
    def moved(self) -> bool:
        return any(a.live_base != a.rec_base for a in self.allocs.values())


# ----------------------------------------------------------------- relocation scanning
def relocate_params(params: bytes, layout: Optional[List[List[int]]], space: AddressSpace,
                    aggregates: bool = False) -> Tuple[bytes, List[Tuple[int, int, int]]]:
    """Rewrite 8-byte kernel parameters that point into moved allocations.

    layout: the fn record's [[offset, size], ...]; when None, every 8-byte aligned word is
    scanned.  aggregates: also the aligned words inside larger parameters (structs passed by
    value, such as PyTorch's arrays of pointers), where every allocation moved (a simulator).
    Returns (new bytes, [(offset, old, new), ...])."""
    if not params:
        return params, []
    if layout:
        offs = [w for o, s in layout if (s == 8 or (aggregates and s > 8)) and o % 8 == 0
                for w in range(o, min(o + s, len(params)) - 7, 8)]
    else:
        offs = list(range(0, len(params) - 7, 8))
    buf = bytearray(params)
    changes = []
    for o in offs:
        v = int.from_bytes(buf[o:o + 8], "little")
        nv = space.translate(v)
        if nv != v:
            buf[o:o + 8] = nv.to_bytes(8, "little")
            changes.append((o, v, nv))
    return bytes(buf), changes


def scan_payload(data: bytes, space: AddressSpace, rewrite: bool = False) -> Tuple[bytes, List[Tuple[int, int, int]]]:
    """Find 8-byte aligned words in an H2D payload that are recorded addresses of moved
    allocations; optionally rewrite them.  Returns (data, [(offset, old, new), ...])."""
    moved = [a for a in space.allocs.values() if a.live_base != a.rec_base]
    if not moved or len(data) < 8:
        return data, []
    n = len(data) // 8
    lo = min(a.rec_base for a in moved)
    hi = max(a.rec_base + a.size for a in moved)
    found = []
    try:
        import numpy as np
        w = np.frombuffer(data, dtype="<u8", count=n)
        idx = np.nonzero((w >= lo) & (w < hi))[0]
        cand = [(int(i) * 8, int(w[i])) for i in idx]
    except ImportError:
        import struct
        cand = [(i * 8, v) for i, (v,) in enumerate(struct.iter_unpack("<Q", data[: n * 8])) if lo <= v < hi]
    for o, v in cand:
        nv = space.translate(v)
        if nv != v:
            found.append((o, v, nv))
    if rewrite and found:
        buf = bytearray(data)
        for o, _v, nv in found:
            buf[o:o + 8] = nv.to_bytes(8, "little")
        return bytes(buf), found
    return data, found
