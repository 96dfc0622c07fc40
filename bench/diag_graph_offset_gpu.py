#!/usr/bin/env python3
"""CUPTI kernel durations of identical work launched on a stream and as graph nodes.

Graph mode times short kernels about 0.5 us below timeline mode. This measures whether the
difference follows the launch path rather than the kernel: the same kernels (an empty one and
clock64 spins of fixed cycle counts) run K times back to back on a stream and as a K-node graph,
traced by the same CUPTI collector, and once more on the stream with the GPU idle ~30 us
before each launch (as in a launch-bound replay); prints median durations per path.

    python bench/diag_graph_offset_gpu.py [--k 1000] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from cuda.bindings import driver as cu

from cudasnap.replay.profile.graphunits import WindowClock
from cudasnap.replay.profile.timeline import CuptiCollector

SPIN = """
.version 7.0
.target sm_70
.address_size 64
.visible .entry spin_{n}()
{{
    .reg .u64 %rd<5>;
    .reg .pred %p;
    mov.u64 %rd1, {n};
    mov.u64 %rd2, %clock64;
L:  mov.u64 %rd3, %clock64;
    sub.u64 %rd4, %rd3, %rd2;
    setp.lt.u64 %p, %rd4, %rd1;
    @%p bra L;
    ret;
}}
"""


def ok(r):
    err, *vals = r if isinstance(r, tuple) else (r,)
    if int(err) != 0:
        raise RuntimeError(f"CUDA error {err}")
    return vals[0] if len(vals) == 1 else vals


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=1000)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    ok(cu.cuInit(0))
    dev = ok(cu.cuDeviceGet(0))
    name = ok(cu.cuDeviceGetName(64, dev)).split(b"\0")[0].decode()
    ctx = ok(cu.cuDevicePrimaryCtxRetain(dev))
    ok(cu.cuCtxSetCurrent(ctx))
    sms = ok(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev))
    stream = ok(cu.cuStreamCreate(1))
    kernels = {}
    for n in (0, 10000, 20000):
        mod = ok(cu.cuModuleLoadData(SPIN.format(n=n).encode() + b"\0"))
        kernels[n] = ok(cu.cuModuleGetFunction(mod, f"spin_{n}".encode()))

    def launch(fn, grid):
        ok(cu.cuLaunchKernel(fn, grid, 1, 1, 128, 1, 1, 0, stream, None, 0))

    graphs = {}
    for n, fn in kernels.items():
        for grid in (2 * sms,):
            ok(cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED))
            for _ in range(a.k):
                launch(fn, grid)
            g = ok(cu.cuStreamEndCapture(stream))
            graphs[n, grid] = ok(cu.cuGraphInstantiate(g, 0))
            ok(cu.cuGraphLaunch(graphs[n, grid], stream))          # upload
    ok(cu.cuStreamSynchronize(stream))
    cupti = CuptiCollector()
    clock = WindowClock(cupti)
    rows = []
    for (n, grid), exe in graphs.items():
        fn = kernels[n]
        for _ in range(50):                                           # warm the stream path
            launch(fn, grid)
        ok(cu.cuStreamSynchronize(stream))
        clock.start()
        windows = []
        paths = ("stream", "graph", "idle", "stream", "graph", "idle")
        for path in paths:
            m0 = clock.mark()
            if path == "graph":
                ok(cu.cuGraphLaunch(exe, stream))
            else:
                for _ in range(a.k):
                    launch(fn, grid)
                    if path == "idle":                  # the GPU idles between kernels
                        t = time.perf_counter() + 30e-6
                        while time.perf_counter() < t:
                            pass
            ok(cu.cuStreamSynchronize(stream))
            windows.append((m0, clock.mark()))
        got = clock.collect_records(windows)
        dur = {"stream": [], "graph": [], "idle": []}
        for path, recs in zip(paths, got):
            dur[path] += [(x.t1 - x.t0) / 1e3 for x in recs if x.kind == "kernel"]
        st, gr, idl = (statistics.median(dur[p]) for p in ("stream", "graph", "idle"))
        row = {"cycles": n, "grid": grid, "stream_us": round(st, 3), "graph_us": round(gr, 3),
               "idle_stream_us": round(idl, 3), "n": [len(dur[p]) for p in ("stream", "graph", "idle")]}
        rows.append(row)
        print(f"cycles {n:6d} grid {grid:4d}: stream {st:8.3f} us  graph {gr:8.3f} us  "
              f"stream with idle gaps {idl:8.3f} us  (n {row['n']})", flush=True)
    cupti.close()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": name, "k": a.k, "rows": rows}, f, indent=1)
    print(f"device: {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
