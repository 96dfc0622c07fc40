"""Synthetic snapshots shaped exactly like capture/decode.py output, for tests and demos.

`write_double_program(path)` writes a session the CUDA test double (tests/double) can
replay: a module of the double's built-in kernels, allocations that share a granule, a
pointer table stored in device memory (the `chase` kernel reads through it), launches and
D2H results computed here."""
from __future__ import annotations

import struct
from typing import Any, Dict, Optional

from cudasnap.formats import SnapshotWriter

DOUBLE_MODULE = b"CUDADOUBLE\nkernel add_one\nkernel fill\nkernel saxpy\nkernel chase\nkernel incr\nkernel spin\n"
BASE = 0x200000000000


class Synth:
    def __init__(self, path, header: Optional[Dict[str, Any]] = None, frame_bytes: int = 2 << 20):
        self.w = SnapshotWriter(path, header or {"argv": ["synthetic"], "pid": 1}, frame_bytes=frame_bytes)
        self.seq = 0
        self.t = 1000

    def blob(self, data: bytes) -> Dict[str, Any]:
        return {"blob": self.w.add_blob(data), "size": len(data)}

    def call(self, f: str, a: Dict[str, Any], r: Optional[int] = 0, x: Optional[Dict[str, Any]] = None,
             tid: int = 100) -> Dict[str, Any]:
        self.seq += 1
        self.t += 1000
        rec = {"k": "c", "s": self.seq, "tid": tid, "t0": self.t, "f": f, "a": a}
        if x:
            rec["x"] = x
        if r is None:
            rec["incomplete"] = True
        else:
            rec["t1"] = self.t + 500
            rec["r"] = r
        self.w.write(rec)
        return rec

    def fn(self, h: int, name: str, module: int, params, kind: str = "function") -> None:
        self.w.write({"k": "fn", "h": h, "name": name, "kind": kind, "module": module,
                      "params": [list(p) for p in params]})

    def double_prologue(self, kernel: str, handle: int, layout, ctx: int = 0x55550000, mod: int = 0x55560000,
                        image: bytes = None) -> None:
        """The usual start of a session on the test-double driver: init, the primary context,
        the double's module (or `image`: a PTX whose entries run the double's kernels) and one
        of its kernels (with its parameter layout)."""
        self.call("cuInit", {"Flags": 0})
        self.call("cuDeviceGet", {"device": 0, "ordinal": 0})
        self.call("cuDevicePrimaryCtxRetain", {"pctx": ctx, "dev": 0})
        self.call("cuCtxSetCurrent", {"ctx": ctx})
        self.call("cuModuleLoadData", {"module": mod, "image": 0x7F0000001000},
                  x={"image": self.blob((image or DOUBLE_MODULE) + b"\0")})
        self.call("cuModuleGetFunction", {"hfunc": handle, "hmod": mod, "name": kernel})
        self.fn(handle, kernel, mod, layout)

    def launch(self, h: int, params: bytes, grid=1, block=1, stream=0, f="cuLaunchKernel", r=0):
        a = {"f": h, "gridDimX": grid, "gridDimY": 1, "gridDimZ": 1, "blockDimX": block, "blockDimY": 1,
             "blockDimZ": 1, "sharedMemBytes": 0, "hStream": stream, "kernelParams": 0x7FFF0000, "extra": 0}
        return self.call(f, a, r=r, x={"params": params})

    def expect_d2h(self, src: int, ints) -> None:
        """Synchronize, then a D2H of int32s from src whose recorded result is `ints` (what the
        replay verifies)."""
        self.call("cuCtxSynchronize", {})
        self.call("cuMemcpyDtoH_v2", {"dstHost": 0x7F0000200000, "srcDevice": src, "ByteCount": 4 * len(ints)},
                  x={"dstHost": self.blob(struct.pack(f"<{len(ints)}i", *ints))})

    def double_epilogue(self, frees=()) -> None:
        """The usual end: free `frees`, release the primary context, a clean exit, close."""
        for p in frees:
            self.call("cuMemFree_v2", {"dptr": p})
        self.call("cuDevicePrimaryCtxRelease_v2", {"dev": 0})
        self.w.write({"k": "end", "exit": 0, "signal": None, "partial": False})
        self.close()

    def close(self) -> None:
        self.w.close()


def write_double_program(path, base: int = BASE, n: int = 64, tamper: bool = False, incomplete: bool = False,
                         extra_calls=None, frame_bytes: int = 2 << 20) -> Dict[str, Any]:
    """Returns facts about what was written (addresses, seqs of D2H calls)."""
    s = Synth(path, frame_bytes=frame_bytes)
    ctx, mod = 0x55550000, 0x55560000
    f_add, f_fill, f_chase = 0x55570001, 0x55570002, 0x55570003
    s.call("cuInit", {"Flags": 0})
    s.w.write({"k": "proc", "driver_version": 13000,
               "gpus": [{"index": 0, "name": "cudasnap test double", "uuid": "GPU-0", "cc": [9, 0], "mem": 1 << 36}]})
    s.call("cuDeviceGet", {"device": 0, "ordinal": 0})
    s.call("cuDevicePrimaryCtxRetain", {"pctx": ctx, "dev": 0})
    s.call("cuCtxSetCurrent", {"ctx": ctx})
    s.call("cuModuleLoadData", {"module": mod, "image": 0x7F0000001000},
           x={"image": s.blob(DOUBLE_MODULE + b"\0")})
    s.call("cuModuleGetFunction", {"hfunc": f_add, "hmod": mod, "name": "add_one"})
    s.call("cuModuleGetFunction", {"hfunc": f_fill, "hmod": mod, "name": "fill"})
    s.call("cuModuleGetFunction", {"hfunc": f_chase, "hmod": mod, "name": "chase"})
    s.call("cuModuleGetFunction", {"hfunc": 0x55570009, "hmod": mod, "name": "nosuch"}, r=500)  # NOT_FOUND recurs
    s.fn(f_add, "add_one", mod, [[0, 8], [8, 4]])
    s.fn(f_fill, "fill", mod, [[0, 8], [8, 4], [12, 4]])
    s.fn(f_chase, "chase", mod, [[0, 8], [8, 8], [16, 4]])
    A, B, C = base, base + 0x1000, base + 0x400000        # A and B share a 2 MiB granule
    nb = n * 4
    s.call("cuMemAlloc_v2", {"dptr": A, "bytesize": nb})
    s.call("cuMemAlloc_v2", {"dptr": B, "bytesize": n * 8})
    s.call("cuMemAlloc_v2", {"dptr": C, "bytesize": n * 8})
    s.call("cuDeviceGetAttribute", {"pi": 1024, "attrib": 1, "dev": 0})
    vals = [float(i) * 0.5 for i in range(n)]
    s.call("cuMemcpyHtoD_v2", {"dstDevice": A, "srcHost": 0x7F0000100000, "ByteCount": nb},
           x={"srcHost": s.blob(struct.pack(f"<{n}f", *vals))})
    s.launch(f_add, struct.pack("<Qi", A, n), block=n)
    expect_a = struct.pack(f"<{n}f", *[v + 1.0 for v in vals])
    out = {"A": A, "B": B, "C": C}
    d2h = s.call("cuMemcpyDtoH_v2", {"dstHost": 0x7F0000200000, "srcDevice": A, "ByteCount": nb},
                 x={"dstHost": s.blob(expect_a if not tamper else expect_a[:8] + b"\xff\xff\xff\xff" + expect_a[12:])})
    out["d2h_a"] = d2h["s"]
    # pointer table in device memory: B[i] = &A[i]; chase reads through it into C
    table = struct.pack(f"<{n}Q", *[A + 4 * i for i in range(n)])
    s.call("cuMemcpyHtoD_v2", {"dstDevice": B, "srcHost": 0x7F0000300000, "ByteCount": n * 8},
           x={"srcHost": s.blob(table)})
    s.launch(f_chase, struct.pack("<QQi", B, C, n), block=n)
    chased = b"".join(expect_a[4 * i:4 * i + 8].ljust(8, b"\0") if 4 * i + 8 <= nb else
                      (expect_a[4 * i:] + b"\0" * 8)[:8] for i in range(n))
    if incomplete:
        s.call("cuCtxSynchronize", {}, r=None)
        s.close()
        return out
    s.call("cuCtxSynchronize", {})
    d2 = s.call("cuMemcpyDtoH_v2", {"dstHost": 0x7F0000400000, "srcDevice": C, "ByteCount": n * 8},
                x={"dstHost": s.blob(chased)})
    out["d2h_c"] = d2["s"]
    s.call("cuMemsetD32_v2", {"dstDevice": C, "ui": 0x01020304, "N": 4})
    d3 = s.call("cuMemcpyDtoH_v2", {"dstHost": 0x7F0000400000, "srcDevice": C, "ByteCount": 16},
                x={"dstHost": s.blob(struct.pack("<4I", *([0x01020304] * 4)))})
    out["d2h_memset"] = d3["s"]
    for fn in (extra_calls or []):
        fn(s, out)
    s.call("cuMemFree_v2", {"dptr": A})
    s.call("cuMemFree_v2", {"dptr": B})
    s.call("cuMemFree_v2", {"dptr": C})
    s.call("cuDevicePrimaryCtxRelease_v2", {"dev": 0})
    s.w.write({"k": "end", "exit": 0, "signal": None, "partial": False})
    s.close()
    return out
