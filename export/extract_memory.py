"""An extract's memory, read in the replay (subscriber code: it sees the replay's view): at the
selection's start the live ranges it can reach are read (whole allocations here; `exact`
ranges in ranges.py), at its end what it could have written. A part of the Extractor
(export/extract.py): given the selection, the prefix's facts and the snapshot writer, it keeps
what to restore (`restore`, `array_restore`) and what to expect (`expected`)."""
from __future__ import annotations

import bisect
from typing import Any, Dict, List, Optional, Set, Tuple

from cudasnap.formats.vocab import in_class, is_graph_launch
from cudasnap.replay.view import WRITABLE_KINDS

from . import arrays as A
from . import ranges as R
from .extract_common import ExtractError, ExtractResult
from .extract_links import Links
from .extract_prefix import Prefix

READ_CHUNK = 64 << 20


class Memory:
    def __init__(self, reader, res: ExtractResult, w, sel: List[Dict[str, Any]], prefix: Prefix, links: Links,
                 memory: str, exact: bool, bounds: Optional[R.Boundaries]):
        self.reader, self.res, self.w, self.sel, self.links = reader, res, w, sel, links
        self.first, self.last = sel[0]["s"], sel[-1]["s"]
        self.prefix_recs, self.mapped = prefix.recs, prefix.mapped
        self.captured_work, self.kept_globals = prefix.captured_work, prefix.kept_globals
        self.memory, self.exact, self.bounds = memory, exact, bounds
        self.live: List[Tuple[int, int, str]] = []     # live device ranges at the start (base, size, kind)
        self.starts: List[int] = []
        self.lo = self.hi = 0
        self.chosen: List[int] = []                    # indexes of live ranges restored
        self.per: Dict[int, Any] = {}                  # exact: per range, its intervals
        self.before: Dict[int, Any] = {}               # exact: per range, its bytes at the start
        self.restore: List[Tuple[int, int, str]] = []  # (base, size, blob id)
        self.expected: List[Tuple[int, int, str]] = []
        self.array_restore: List[Tuple[Any, int, int, int, str]] = []
        self.host_ranges: Optional[List[Tuple[int, int]]] = None
        self.host_reached: Set[int] = set()

    def ranges(self, rv) -> List[Tuple[int, int, str]]:
        """Live device ranges at this point: (recorded base, size, kind)."""
        out: List[Tuple[int, int, str]] = []
        vmm_pieces = sorted(self.mapped.items())
        for a in rv.recorded_allocations():
            if a.kind in WRITABLE_KINDS:
                out.append((a.rec_base, max(int(a.size), 0), a.kind))
            elif a.kind == "vmm" and a.rec_base in self.links.ipc_opened:
                out.append((a.rec_base, max(int(a.size), 0), "vmm"))     # another process's, opened whole
            elif a.kind == "vmm":
                run = None
                for p, n in vmm_pieces:
                    if not (a.rec_base <= p < a.rec_base + a.size):
                        continue
                    if run is not None and run[0] + run[1] == p:
                        run = (run[0], run[1] + n)
                    else:
                        if run is not None:
                            out.append((run[0], run[1], "vmm"))
                        run = (p, n)
                if run is not None:
                    out.append((run[0], run[1], "vmm"))
        out = [r for r in out if r[1] > 0 and (r[2] != "global" or r[0] in self.kept_globals)]
        out.sort()
        return out

    def read(self, rv, base: int, n: int) -> bytes:
        import ctypes
        buf = bytearray(n)
        if not n:
            return b""
        addr = ctypes.addressof((ctypes.c_char * n).from_buffer(buf))
        live = rv.translate(base)
        for off in range(0, n, READ_CHUNK):
            m = min(READ_CHUNK, n - off)
            rv.call("cuMemcpyDtoH", addr + off, live + off, m)
        return bytes(buf)

    def words(self, data: bytes) -> List[int]:
        """8-byte aligned words of data that may be device addresses (>= 64 KiB)."""
        n = len(data) // 8 * 8
        try:
            import numpy as np
            w = np.frombuffer(data[:n], dtype="<u8")
            w = w[(w >= self.lo) & (w < self.hi)]
            return [int(x) for x in np.unique(w)]
        except ImportError:
            vals = set()
            for o in range(0, n, 8):
                v = int.from_bytes(data[o:o + 8], "little")
                if self.lo <= v < self.hi:
                    vals.add(v)
            return sorted(vals)

    def find(self, v: int) -> Optional[int]:
        i = bisect.bisect_right(self.starts, v) - 1
        if i >= 0:
            b, n, _k = self.live[i]
            if b <= v < b + n:
                return i
        return None

    def at_start(self, rv) -> None:
        if rv.errors:
            raise ExtractError(f"replay failed before the selection: {rv.errors[0]}")
        rv.call("cuCtxSynchronize")
        arrays, notes = A.live_arrays(self.prefix_recs)
        self.array_restore = [(h, row, rows, depth, self.w.add_blob(A.read_array(rv, h, row, rows, depth)))
                              for h, row, rows, depth in arrays]
        self.res.notes += notes
        if arrays:
            self.res.notes.append(f"{len(arrays)} CUDA array(s) restored whole "
                                  f"({sum(r * n * d for _h, r, n, d in arrays)} B): textures and surfaces read them")
        self.links.opened_sizes(rv)
        self.live = self.ranges(rv)
        self.starts = [r[0] for r in self.live]
        if not self.live:
            return
        self.lo = self.live[0][0]
        self.hi = max(b + n for b, n, _k in self.live)
        if self.exact:
            return R.start_exact(self, rv)
        if self.memory == "all":
            todo = list(range(len(self.live)))
        else:
            words: List[int] = []
            for rec in self.root_recs():
                p = (rec.get("x") or {}).get("params")
                if isinstance(p, (bytes, bytearray)):
                    words += self.words(bytes(p) + b"\0" * (-len(p) % 8))
                a = rec.get("a") or {}
                for k in R.PTR_KEYS:
                    if isinstance(a.get(k), int):
                        words.append(a[k])
            for data in self.copied_in():
                words += self.words(data)
            words += [w for w, _n in R.object_roots(self.prefix_recs, self.root_recs())]
            todo = sorted({i for i in (self.find(w) for w in words) if i is not None})
            todo += [i for i, r in enumerate(self.live) if r[2] == "global" and i not in todo]
        chosen: Dict[int, str] = {}
        scanned = 0
        while todo:
            i = todo.pop()
            if i in chosen:
                continue
            base, n, _k = self.live[i]
            data = self.read(rv, base, n)
            chosen[i] = self.w.add_blob(data)
            if self.memory == "reachable" and scanned < R.SCAN_LIMIT:
                self.note_host_refs(data)
                scanned += n
                for v in self.words(data):
                    j = self.find(v)
                    if j is not None and j not in chosen:
                        todo.append(j)
        self.chosen = sorted(chosen)
        self.restore = [(self.live[i][0], self.live[i][1], chosen[i]) for i in self.chosen]
        self.res.restored = [(b, n) for b, n, _ in self.restore]
        self.res.restored_bytes = sum(n for _b, n, _ in self.restore)
        self.res.segments = len(self.restore)
        self.res.segments_bytes = self.res.restored_bytes

    def root_recs(self) -> List[Dict[str, Any]]:
        """The selected calls, and the captured work its graph launches run."""
        recs = list(self.sel)
        if any(is_graph_launch(r.get("f") or "") for r in self.sel):
            recs += self.captured_work
        return recs

    def copied_in(self):
        """The host data the selected H2D copies upload (their pointer words reach memory too)."""
        for rec in self.sel:
            if not in_class(rec.get("f") or "", "h2d_copy"):
                continue
            for v in (rec.get("x") or {}).values():
                if isinstance(v, dict) and isinstance(v.get("blob"), str) and self.reader.has_blob(v["blob"]):
                    yield self.reader.blob(v["blob"])

    def at_end(self, rv) -> None:
        rv.call("cuCtxSynchronize")
        if self.exact:
            return R.end_exact(self, rv)
        self.expected = []
        for i in self.chosen:
            base, n, _k = self.live[i]
            if rv.find(base) is None:
                continue                      # freed by the selection itself
            self.expected.append((base, n, self.w.add_blob(self.read(rv, base, n))))
        self.res.expected = len(self.expected)
        self.res.expected_bytes = sum(n for _b, n, _ in self.expected)

    def host_allocs(self) -> List[Tuple[int, int]]:
        """(base, end) of the page-locked host allocations made before the selection."""
        if self.host_ranges is None:
            self.host_ranges = sorted(
                (a["pp"], a["pp"] + max(a["bytesize"], 1)) for a in ((r.get("a") or {}) for r in self.prefix_recs
                                                                     if in_class(r.get("f") or "", "host_alloc"))
                if isinstance(a.get("pp"), int) and isinstance(a.get("bytesize"), int))
        return self.host_ranges

    def note_host_refs(self, data: bytes) -> None:
        """Notes the host allocations a word of scanned device memory points into (a kernel may
        follow it): those stay in the extract."""
        hosts = self.host_allocs()
        if not hosts or len(self.host_reached) == len(hosts):
            return
        w = R.words(data)
        for lo, hi in hosts:
            if lo not in self.host_reached and bool(((w >= lo) & (w < hi)).any()):
                self.host_reached.add(lo)
