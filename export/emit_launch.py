"""Kernel launches in the exported program: cuLaunchKernel, cooperative launches and
cuLaunchKernelEx with their recorded packed parameter bytes and launch attributes.  LaunchCalls
is a part of Emitter (export/emit.py): it adds the parameter blocks, attribute blocks, offset
tables and kernel names the program declares."""
from __future__ import annotations

import struct
from typing import Tuple
from cudasnap.formats.layout import packer
from .ctext import lit

PARAM_MAX = 32768
LAUNCH_CONFIG = packer("CUlaunchConfig")       # grid, block, shmem, hStream, attrs, numAttrs
LAUNCH_ATTR_SIZE = 72
ATTR_WITH_EVENT = {7: "programmatic event", 12: "launch completion event"}


class LaunchCalls:
    """Emitter's translation of kernel launches."""

    def kid(self, name: str) -> int:
        if name not in self.kernels:
            self.kernels[name] = len(self.kernels)
        return self.kernels[name]

    def _params(self, rec) -> Tuple[bytes, int]:
        p = (rec.get("x") or {}).get("params")
        if p is None:
            self.fail(rec, "kernel parameters were not captured (x.params missing)")
        p = bytes(p)
        if len(p) > PARAM_MAX:
            self.fail(rec, f"{len(p)} bytes of kernel parameters exceed {PARAM_MAX}")
        return p, self.params.setdefault(p, len(self.params))

    def _launch_common(self, rec, hs):
        # managed memory the host wrote in place, recorded with this launch: written back first
        for m in (rec.get("x") or {}).get("hostmem") or ():
            fname, n = self.data_file_of("h2d", rec, m, "managed memory")
            self.res.h2d_bytes += n
            self.emit(rec, f"h2d({lit(m.get('addr'))}, \"{fname}\", {lit(n)}, (CUstream)0, 0);")
        fexpr, name = self.function(rec, rec["a"].get("f"))
        p, k = self._params(rec)
        cap = self.in_capture(rec, hs)
        self.res.launches += 1
        return fexpr, name, p, k, (0 if cap else 1)

    def e_launch(self, rec) -> None:
        a = rec["a"]
        hs = a.get("hStream")
        fexpr, name, p, k, timed = self._launch_common(rec, hs)
        g = [int(a.get(x, 1)) for x in ("gridDimX", "gridDimY", "gridDimZ", "blockDimX", "blockDimY", "blockDimZ")]
        self.emit(rec, f"launch({self.kid(name)}, {fexpr}, {', '.join(map(str, g))}, {int(a.get('sharedMemBytes', 0))}, "
                       f"{self.stream(rec, hs)}, P{k}, {len(p)}, {timed});")

    def e_launch_coop(self, rec) -> None:
        a = rec["a"]
        hs = a.get("hStream")
        fexpr, name, p, k, timed = self._launch_common(rec, hs)
        layout = (self.fn_record(a.get("f"), rec.get("s")) or {}).get("params")
        if layout is None:
            if p:
                self.fail(rec, "a cooperative launch needs the kernel's parameter layout (no fn record)")
            layout = []
        offs = tuple(int(o) for o, _s in layout)
        o = self.offsets.setdefault(offs, len(self.offsets))
        self.sections.add("launch_coop")
        g = [int(a.get(x, 1)) for x in ("gridDimX", "gridDimY", "gridDimZ", "blockDimX", "blockDimY", "blockDimZ")]
        self.emit(rec, f"launch_coop({self.kid(name)}, {fexpr}, {', '.join(map(str, g))}, {int(a.get('sharedMemBytes', 0))}, "
                       f"{self.stream(rec, hs)}, P{k}, {len(p)}, O{o}, {len(offs)}, {timed});")

    def e_launch_ex(self, rec) -> None:
        a = rec["a"]
        cfg = a.get("config")
        if not isinstance(cfg, (bytes, bytearray)) or len(cfg) < LAUNCH_CONFIG.size:
            self.fail(rec, "the CUlaunchConfig struct was not captured")
        gx, gy, gz, bx, by, bz, shm, hs, _ap, nattr = LAUNCH_CONFIG.unpack_from(cfg)
        attrs = bytes((rec.get("x") or {}).get("attrs") or b"")[: nattr * LAUNCH_ATTR_SIZE]
        if nattr and len(attrs) != nattr * LAUNCH_ATTR_SIZE:
            self.fail(rec, f"launch attributes were not captured ({nattr} expected)")
        if nattr > 16:
            self.fail(rec, f"{nattr} launch attributes (at most 16 are exported)")
        for i in range(nattr):
            aid = struct.unpack_from("<I", attrs, i * LAUNCH_ATTR_SIZE)[0]
            if aid in ATTR_WITH_EVENT:
                self.fail(rec, f"launch attribute {aid} ({ATTR_WITH_EVENT[aid]}) holds an event handle of the "
                               f"recording; not exported")
        fexpr, name, p, k, timed = self._launch_common(rec, hs)
        ai = self.attrs.setdefault(attrs, len(self.attrs))
        self.sections.add("launch_ex")
        self.emit(rec, f"launch_ex({self.kid(name)}, {fexpr}, {gx}, {gy}, {gz}, {bx}, {by}, {bz}, {shm}, "
                       f"{self.stream(rec, hs)}, A{ai}, {nattr}, P{k}, {len(p)}, {timed});")
