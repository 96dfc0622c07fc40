#!/usr/bin/env python3
"""CUPTI kernel durations of identical work launched on a stream and as graph nodes.

Graph mode times short kernels about 0.5 us below timeline mode. This measures whether the
difference follows the launch path rather than the kernel: the same kernels (an empty one and
clock64 spins of fixed cycle counts, and memory-bound elementwise adds of several waves, each
reading what the one before wrote) run K times back to back on a stream and as a K-node graph,
traced by the same CUPTI collector, and on the stream with the GPU idle before each launch
(as in a launch-bound replay; --idle-us, several lengths), and as a 2-node graph launched K/2
times (its node parameters read again and again, as a program's own one-step graph's are);
prints median durations per path.

    python bench/diag_graph_offset_gpu.py [--k 1000] [--idle-us 30,100,250] [--json OUT]

A last pattern mixes kernels (adds after spins and the reverse) to see whether a kernel's time
in a graph depends on the kernel before it.
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


# c = a + b over n floats, a thread per element: many waves, bound by memory like an
# elementwise framework kernel
ADD = """
.version 7.0
.target sm_70
.address_size 64
.visible .entry vadd(.param .u64 pa, .param .u64 pb, .param .u64 pc, .param .u32 n)
{
    .reg .u32 %r<6>;
    .reg .u64 %rd<8>;
    .reg .f32 %f<4>;
    .reg .pred %p;
    ld.param.u64 %rd1, [pa];
    ld.param.u64 %rd2, [pb];
    ld.param.u64 %rd3, [pc];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.u32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p, %r5, %r1;
    @%p bra DONE;
    mul.wide.u32 %rd4, %r5, 4;
    add.u64 %rd5, %rd1, %rd4;
    add.u64 %rd6, %rd2, %rd4;
    add.u64 %rd7, %rd3, %rd4;
    ld.global.f32 %f1, [%rd5];
    ld.global.f32 %f2, [%rd6];
    add.f32 %f3, %f1, %f2;
    st.global.f32 [%rd7], %f3;
DONE:
    ret;
}
"""


# the same add with a 2 KiB parameter block, of which every thread reads the last word (framework
# kernels pass ~0.5-4 KiB: offset calculators, tensor lists, TMA descriptors)
BIG = ADD.replace(".param .u32 n)", ".param .u32 n, .param .align 8 .b8 pad[2048])").replace(
    "vadd(", "vadd_big(").replace(
    "    add.f32 %f3, %f1, %f2;\n",
    "    ld.param.u32 %r2, [pad+2044];\n    cvt.rn.f32.u32 %f3, %r2;\n    add.f32 %f1, %f1, %f3;\n"
    "    add.f32 %f3, %f1, %f2;\n")

# a 6 KiB parameter block (over the 4 KiB classic limit, as a foreach kernel's tensor-list
# metadata), read per block at an offset that depends on the block index: each block looks up
# its entry, as multi_tensor_apply does
HUGE = ADD.replace(".version 7.0", ".version 8.1").replace(".target sm_70", ".target sm_90").replace(".param .u32 n)", ".param .u32 n, .param .align 8 .b8 pad[6144])").replace(
    "vadd(", "vadd_huge(").replace(
    "    add.f32 %f3, %f1, %f2;\n",
    "    mov.u64 %rd4, pad;\n    and.b32 %r2, %r2, 1535;\n    mul.wide.u32 %rd5, %r2, 4;\n"
    "    add.u64 %rd4, %rd4, %rd5;\n    ld.param.u32 %r2, [%rd4];\n    cvt.rn.f32.u32 %f3, %r2;\n"
    "    add.f32 %f1, %f1, %f3;\n    add.f32 %f3, %f1, %f2;\n")


def ok(r):
    err, *vals = r if isinstance(r, tuple) else (r,)
    if int(err) != 0:
        raise RuntimeError(f"CUDA error {err}")
    return vals[0] if len(vals) == 1 else vals


MIXED = (("vadd 2M", 1 << 21), (10000, None), ("vadd 1M", 1 << 20), (0, None), (20000, None), ("vadd 2M", 1 << 21))


def mixed(reps, kernels, launch, stream, clock):
    """Different kernels in a row (a memory-bound add after a spin and the reverse, as framework
    kernels follow each other): per position of the pattern, median duration on the stream back
    to back and in a graph.  If a kernel's time in a graph depends on what ran just before it
    (work of the previous kernel finishing inside the next one's span), these differ per position
    while the sum stays."""
    def one(i, grid):
        key = MIXED[i][0]
        launch(kernels[key], grid if grid else 2 * SMS["n"])

    ok(cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED))
    for _ in range(reps):
        for i, (_k, grid) in enumerate(MIXED):
            one(i, grid)
    exe = ok(cu.cuGraphInstantiate(ok(cu.cuStreamEndCapture(stream)), 0))
    ok(cu.cuGraphLaunch(exe, stream))
    ok(cu.cuStreamSynchronize(stream))
    clock.start()
    windows, paths = [], ("stream", "graph") * 3
    for path in paths:
        m0 = clock.mark()
        if path == "graph":
            ok(cu.cuGraphLaunch(exe, stream))
        else:
            for _ in range(reps):
                for i, (_k, grid) in enumerate(MIXED):
                    one(i, grid)
        ok(cu.cuStreamSynchronize(stream))
        windows.append((m0, clock.mark()))
    per = {p: [[] for _ in MIXED] for p in ("stream", "graph")}
    for path, recs in zip(paths, clock.collect_records(windows)):
        ks = [x for x in recs if x.kind == "kernel"]
        for j, x in enumerate(ks):
            per[path][j % len(MIXED)].append((x.t1 - x.t0) / 1e3)
    out = []
    for i, (k, _g) in enumerate(MIXED):
        prev = MIXED[i - 1][0]
        s, g = statistics.median(per["stream"][i]), statistics.median(per["graph"][i])
        label = lambda v: v if isinstance(v, str) else f"spin {v}"
        out.append({"kernel": label(k), "after": label(prev), "stream_us": round(s, 3), "graph_us": round(g, 3),
                    "diff_pct": round((g - s) / s * 100, 2)})
        print(f"  mixed: {label(k):>10} after {label(prev):>10}: stream {s:.3f} graph {g:.3f} us ({(g - s) / s * 100:+.1f}%)",
              flush=True)
    return {"kernel": "mixed sequence", "positions": out}


SMS = {"n": 132}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=1000)
    ap.add_argument("--idle-us", default="30,100,250", help="idle gaps before each launch, us")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    ok(cu.cuInit(0))
    dev = ok(cu.cuDeviceGet(0))
    name = ok(cu.cuDeviceGetName(64, dev)).split(b"\0")[0].decode()
    ctx = ok(cu.cuDevicePrimaryCtxRetain(dev))
    ok(cu.cuCtxSetCurrent(ctx))
    sms = ok(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev))
    SMS["n"] = sms
    stream = ok(cu.cuStreamCreate(1))
    kernels = {}
    for n in (0, 10000, 20000):
        mod = ok(cu.cuModuleLoadData(SPIN.format(n=n).encode() + b"\0"))
        kernels[n] = ok(cu.cuModuleGetFunction(mod, f"spin_{n}".encode()))

    import ctypes
    vmod = ok(cu.cuModuleLoadData(ADD.encode() + b"\0"))
    vadd = ok(cu.cuModuleGetFunction(vmod, b"vadd"))
    bmod = ok(cu.cuModuleLoadData(BIG.encode() + b"\0"))
    vbig = ok(cu.cuModuleGetFunction(bmod, b"vadd_big"))
    pad = (ctypes.c_char * 2048)()
    hpad = (ctypes.c_char * 6144)()
    try:
        hmod = ok(cu.cuModuleLoadData(HUGE.encode() + b"\0"))
        vhuge = ok(cu.cuModuleGetFunction(hmod, b"vadd_huge"))
    except RuntimeError as e:
        print(f"vadd_huge not loaded ({e}); skipped")
        vhuge = None
    bufs = {}
    for n in (1 << 20, 1 << 21):                       # 12 and 24 MB moved per kernel
        bufs[n] = [int(ok(cu.cuMemAlloc(4 * n))) for _ in range(3)]
        for b in bufs[n]:
            ok(cu.cuMemsetD32(b, 0, n))
        kernels[f"vadd {n >> 20}M"] = vadd
        kernels[f"vadd_big {n >> 20}M"] = vbig
        if vhuge is not None:
            kernels[f"vadd_huge {n >> 20}M"] = vhuge
    flip = {"i": 0}

    def launch(fn, grid):
        if fn is vadd or fn is vbig or (vhuge is not None and fn is vhuge):   # grid carries n; alternate in/out
            n = grid
            a, b, c = bufs[n]
            flip["i"] ^= 1
            src, dst = (a, c) if flip["i"] else (c, a)
            vals = [ctypes.c_uint64(src), ctypes.c_uint64(b), ctypes.c_uint64(dst), ctypes.c_uint32(n)]
            if fn is vbig:
                vals.append(pad)
            elif fn is not vadd:
                vals.append(hpad)
            ptrs = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
            ok(cu.cuLaunchKernel(fn, (n + 255) // 256, 1, 1, 256, 1, 1, 0, stream, ctypes.addressof(ptrs), 0))
            return
        ok(cu.cuLaunchKernel(fn, grid, 1, 1, 128, 1, 1, 0, stream, None, 0))

    graphs, single = {}, {}          # K-node graphs; 2-node graphs launched K/2 times (warm node params)
    for n, fn in kernels.items():
        for grid in ((int(n.split()[1][:-1]) << 20,) if isinstance(n, str) else (2 * sms,)):
            ok(cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED))
            for _ in range(a.k):
                launch(fn, grid)
            g = ok(cu.cuStreamEndCapture(stream))
            graphs[n, grid] = ok(cu.cuGraphInstantiate(g, 0))
            ok(cu.cuGraphLaunch(graphs[n, grid], stream))          # upload
            ok(cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED))
            launch(fn, grid)
            launch(fn, grid)                                          # a pair: in and out swap back
            single[n, grid] = ok(cu.cuGraphInstantiate(ok(cu.cuStreamEndCapture(stream)), 0))
            ok(cu.cuGraphLaunch(single[n, grid], stream))
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
        idles = [f"idle {x}" for x in a.idle_us.split(",") if x.strip()]
        paths = ("stream", "graph", "small graph", *idles) * 2
        for path in paths:
            m0 = clock.mark()
            if path == "graph":
                ok(cu.cuGraphLaunch(exe, stream))
            elif path == "small graph":
                for _ in range(a.k // 2):
                    ok(cu.cuGraphLaunch(single[n, grid], stream))
            else:
                gap = float(path.split()[1]) * 1e-6 if path.startswith("idle") else 0.0
                for _ in range(a.k):
                    launch(fn, grid)
                    if gap:                              # the GPU idles between kernels
                        t = time.perf_counter() + gap
                        while time.perf_counter() < t:
                            pass
            ok(cu.cuStreamSynchronize(stream))
            windows.append((m0, clock.mark()))
        got = clock.collect_records(windows)
        dur = {p: [] for p in paths}
        for path, recs in zip(paths, got):
            dur[path] += [(x.t1 - x.t0) / 1e3 for x in recs if x.kind == "kernel"]
        meds = {p: round(statistics.median(v), 3) for p, v in dur.items() if v}
        row = {"kernel": n, "grid": grid, "median_us": meds, "n": {p: len(v) for p, v in dur.items()}}
        rows.append(row)
        label = ("cycles " + str(n)) if isinstance(n, int) else n
        print(f"{label:>14}: " + "  ".join(f"{p} {m:.3f}" for p, m in meds.items()) + " us", flush=True)
    rows.append(mixed(a.k // 4, kernels, launch, stream, clock))
    cupti.close()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": name, "k": a.k, "rows": rows}, f, indent=1)
    print(f"device: {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
