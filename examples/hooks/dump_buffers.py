"""Replay hook: dump the buffers a chosen kernel's pointer parameters point to, right after it
runs -- to find which kernel corrupts memory.

    cudasnap replay X.cusnap --hook 'examples/hooks/dump_buffers.py:DumpBuffers?kernel=saxpy&params=1&out=dumps'
    # later, against another build/GPU/driver: which launch first produces different bytes?
    cudasnap replay X.cusnap --hook 'examples/hooks/dump_buffers.py:DumpBuffers?kernel=saxpy&out=dumps2&compare=dumps'
    # or: which launches write into this range at all?
    cudasnap replay X.cusnap --hook 'examples/hooks/dump_buffers.py:DumpBuffers?watch=0x7f0000000000:4096&dump=0'

Options (all strings on the command line):
  kernel    regex on kernel names (default: every kernel)
  params    comma-separated parameter indices to dump (default: every pointer parameter)
  out       directory for the dumps and index.jsonl (default: cudasnap-dumps)
  max_bytes per buffer, from the pointer to the end of its allocation (default 64 MiB)
  compare   a previous dump directory: report the first launch whose bytes differ
  watch     ADDR[:N]: after every launch, report the launches that changed these bytes
  dump      0 to write no files (watch/compare only)
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys


class DumpBuffers:
    name = "dump_buffers"

    def __init__(self, kernel=None, params=None, out="cudasnap-dumps", max_bytes=64 << 20, compare=None, watch=None,
                 dump="1", stream=None):
        self.rx = re.compile(kernel) if kernel else None
        self.params = [int(p) for p in str(params).split(",") if p.strip()] if params else None
        self.out = out
        self.max_bytes = int(max_bytes)
        self.dump = str(dump) not in ("0", "false", "no")
        self.stream = stream or sys.stderr
        self.index = []
        self.diffs = []            # (seq, kernel, param) whose bytes differ from `compare`
        self.changes = []          # (seq, kernel) that changed the watched range
        self.ref = {}
        if compare:
            with open(os.path.join(compare, "index.jsonl")) as f:
                for line in f:
                    r = json.loads(line)
                    self.ref[(r["seq"], r["param"])] = r["sha256"]
        self.watch = None
        if watch:
            a, _, n = str(watch).partition(":")
            self.watch = (int(a, 0), int(n or "8", 0))
            self._last = None
        if self.dump:
            os.makedirs(out, exist_ok=True)
            self._index = open(os.path.join(out, "index.jsonl"), "w")

    def after_launch(self, ev):
        if self.watch is not None:
            data = ev.ctx.read_device(*self.watch)
            if self._last is not None and data != self._last:
                self.changes.append((ev.seq, ev.name))
                self.stream.write(f"dump_buffers: call #{ev.seq} {ev.name} changed {self.watch[0]:#x}+{self.watch[1]}\n")
            self._last = data
        if self.rx is not None and not self.rx.search(ev.name):
            return
        if self.rx is None and self.watch is not None and not self.dump and not self.ref:
            return
        for i, addr in ev.pointer_params():
            if self.params is not None and i not in self.params:
                continue
            al = ev.ctx.allocation_of(addr)
            live = ev.ctx.translate(addr)
            n = min(self.max_bytes, (al[0] + al[1] - live) if al else 0)
            if n <= 0:
                continue
            data = ev.ctx.read_device(addr, n)
            sha = hashlib.sha256(data).hexdigest()
            row = {"seq": ev.seq, "kernel": ev.name, "param": i, "addr": hex(addr), "bytes": n, "sha256": sha}
            if self.dump:
                fn = f"call{ev.seq}_p{i}.bin"
                with open(os.path.join(self.out, fn), "wb") as f:
                    f.write(data)
                row["file"] = fn
                self._index.write(json.dumps(row) + "\n")
                self._index.flush()
            self.index.append(row)
            want = self.ref.get((ev.seq, i))
            if want is not None and want != sha:
                self.diffs.append((ev.seq, ev.name, i))
                if len(self.diffs) == 1:
                    self.stream.write(f"dump_buffers: first difference: call #{ev.seq} {ev.name} parameter {i} "
                                      f"({hex(addr)}, {n} bytes)\n")

    def end(self, ev):
        if self.dump:
            self._index.close()
            self.stream.write(f"dump_buffers: {len(self.index)} buffer(s) dumped to {self.out}\n")
        if self.ref:
            self.stream.write(f"dump_buffers: {len(self.diffs)} buffer(s) differ from the reference dump\n")
