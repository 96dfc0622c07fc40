#!/usr/bin/env python3
"""Legacy IPC between two processes through cuda.bindings, as group replay does it: the owner
allocates with cuMemAlloc, takes a cuIpcMemHandle and hands its 64 bytes (replay/handlers/ipc.py's
_handle_bytes) to a child, which rebuilds the handle (_make_handle) and opens it, once with
nothing in its way and once with the owner's address range reserved in the child first.
    python3 bench/diag_ipc_gpu.py"""
import subprocess
import sys

from cuda.bindings import driver as cu

from cudasnap.replay.handlers.ipc import _handle_bytes, _make_handle


def ok(r):
    if int(r[0]) != 0:
        raise RuntimeError(str(r[0]))
    return r[1] if len(r) == 2 else r[1:]


def setup(dev):
    ok(cu.cuInit(0))
    d = ok(cu.cuDeviceGet(dev))
    ctx = ok(cu.cuDevicePrimaryCtxRetain(d))
    ok(cu.cuCtxSetCurrent(ctx))


if len(sys.argv) > 1:                      # child: argv = hex, owner address, size, mode
    raw, base, size, mode = bytes.fromhex(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    ok(cu.cuInit(0))
    setup(1 if ok(cu.cuDeviceGetCount()) > 1 else 0)
    if mode == "reserved":
        got = ok(cu.cuMemAddressReserve(size, 0, base, 0))
        print(f"  child reserved {int(got):#x} (asked {base:#x})")
    r = cu.cuIpcOpenMemHandle(_make_handle(cu, raw), 1)
    print(f"  child {mode}: cuIpcOpenMemHandle -> {r[0]}" + (f" at {int(r[1]):#x} (owner's {base:#x})" if int(r[0]) == 0 else ""))
    sys.exit(0 if int(r[0]) == 0 else 1)

setup(0)
size = 64 << 20
p = ok(cu.cuMemAlloc(size))
h = ok(cu.cuIpcGetMemHandle(p))
raw = _handle_bytes(h)
print(f"owner: cuMemAlloc {int(p):#x}, handle {len(raw)} bytes, reserved field {len(bytes(h.reserved))} bytes, "
      f"same bytes: {bytes(h.reserved)[:len(raw)] == raw[:len(bytes(h.reserved))]}")
for mode in ("free", "reserved"):
    rc = subprocess.run([sys.executable, __file__, raw.hex(), str(int(p)), str(size), mode]).returncode
    print(f"{mode}: exit {rc}")
