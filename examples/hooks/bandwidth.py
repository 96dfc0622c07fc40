"""Replay hook: per-kernel achieved memory bandwidth, from each launch's time (CUDA events
around the launch) and the bytes its parameters describe.

    cudasnap replay X.cusnap --hook examples/hooks/bandwidth.py:Bandwidth
    cudasnap replay X.cusnap --hook 'examples/hooks/bandwidth.py:Bandwidth?kernel=saxpy&elem=4&csv=bw.csv'

Bytes per launch (an estimate; say what your kernel does with `count`/`elem`):
  - with count=I: parameter I holds the element count n; every pointer parameter moves
    n * elem bytes (elem default 4);
  - else, when the kernel has exactly one 4- or 8-byte integer parameter that is not a
    pointer, it is taken as n;
  - else each pointer parameter counts the bytes from the pointer to the end of its
    allocation, capped at the distance to the next pointer into the same allocation.
Timing each launch with events serializes the replay; use it on the kernels you care about.
"""
from __future__ import annotations

import statistics
import sys


class Bandwidth:
    name = "bandwidth"

    def __init__(self, kernel=None, count=None, elem="4", csv=None, stream=None):
        import re
        self.rx = re.compile(kernel) if kernel else None
        self.count = int(count) if count is not None else None
        self.elem = int(elem)
        self.csv = csv
        self.stream = stream or sys.stdout
        self.rows = []            # (kernel, seq, bytes, ms)

    def _bytes(self, ev) -> int:
        ptrs = ev.pointer_params()
        vals = ev.param_values()
        n = None
        if self.count is not None and self.count < len(vals):
            n = int.from_bytes(vals[self.count], "little", signed=True)
        elif ev.layout:
            pidx = {i for i, _ in ptrs}
            ints = [v for i, v in enumerate(vals) if i not in pidx and len(v) in (4, 8)]
            if len(ints) == 1:
                n = int.from_bytes(ints[0], "little", signed=True)
        if n is not None and n > 0:
            return n * self.elem * len(ptrs)
        total = 0
        addrs = sorted(a for _, a in ptrs)
        for j, a in enumerate(addrs):
            al = ev.ctx.allocation_of(a)
            if al is None:
                continue
            end = al[0] + al[1] - ev.ctx.translate(a)
            nxt = [b - a for b in addrs[j + 1:] if b > a and ev.ctx.allocation_of(b) == al]
            total += min([end] + nxt)
        return total

    def before_launch(self, ev):
        if self.rx is None or self.rx.search(ev.name):
            ev.ctx.request_timing()
            ev.data["bw_bytes"] = self._bytes(ev)

    def after_launch(self, ev):
        if "bw_bytes" not in ev.data:
            return
        ms = ev.elapsed_ms()
        if ms is not None:
            self.rows.append((ev.name, ev.seq, ev.data["bw_bytes"], ms))

    def per_kernel(self):
        by = {}
        for name, _seq, nb, ms in self.rows:
            by.setdefault(name, []).append((nb, ms))
        out = []
        for name, xs in by.items():
            tot_b = sum(b for b, _ in xs)
            tot_ms = sum(m for _, m in xs)
            gbs = [b / (m * 1e6) for b, m in xs if m > 0]
            out.append({"kernel": name, "launches": len(xs), "bytes": tot_b, "time_ms": tot_ms,
                        "gb_s": tot_b / (tot_ms * 1e6) if tot_ms > 0 else 0.0,
                        "median_gb_s": statistics.median(gbs) if gbs else 0.0})
        out.sort(key=lambda r: -r["time_ms"])
        return out

    def end(self, ev):
        rows = self.per_kernel()
        w = self.stream.write
        w(f"{'kernel':50} {'launches':>8} {'MB':>10} {'ms':>9} {'GB/s':>8}\n")
        for r in rows:
            w(f"{r['kernel'][:50]:50} {r['launches']:8} {r['bytes'] / 1e6:10.2f} {r['time_ms']:9.3f} {r['gb_s']:8.2f}\n")
        if self.csv:
            import csv
            with open(self.csv, "w", newline="") as f:
                wr = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["kernel"])
                wr.writeheader()
                wr.writerows(rows)
