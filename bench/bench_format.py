#!/usr/bin/env python3
"""Throughput of the .cusnap container: write (add_blob) and read (blob) MB/s and compression
ratio for three payload kinds: random bytes, zeros, and fp16 weights of a small MLP trained
for a few steps with numpy.

    python bench/bench_format.py [--size-mb 256] [--level 3] [--threads 0] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

import numpy as np

try:
    from cudasnap.formats import SnapshotReader, SnapshotWriter
except ImportError:
    raise SystemExit("cudasnap is not installed: run `pip install .` in the repository first")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def mlp_weights_fp16(nbytes: int, steps: int = 3, seed: int = 0) -> bytes:
    """Train a deep ReLU MLP (width 1024) on a synthetic regression task for a few SGD
    steps, then return its weights cast to float16, nbytes in total."""
    rng = np.random.default_rng(seed)
    width = 1024
    per_layer = width * width * 2
    layers = max(1, nbytes // per_layer)
    ws = [(rng.standard_normal((width, width), dtype=np.float32) * np.sqrt(2.0 / width)) for _ in range(layers)]
    x = rng.standard_normal((64, width), dtype=np.float32)
    y = np.tanh(x @ rng.standard_normal((width, width), dtype=np.float32) / np.sqrt(width))
    lr = 1e-3
    for _ in range(steps):
        acts = [x]
        h = x
        for w in ws:
            h = np.maximum(h @ w, 0.0)
            acts.append(h)
        g = 2.0 * (h - y) / h.shape[0]
        for i in range(layers - 1, -1, -1):
            g = g * (acts[i + 1] > 0)
            gw = acts[i].T @ g
            g = g @ ws[i].T
            ws[i] -= lr * np.clip(gw, -1.0, 1.0)
    out = np.concatenate([w.ravel() for w in ws]).astype(np.float16).tobytes()
    if len(out) < nbytes:
        out += np.asarray(rng.standard_normal((nbytes - len(out)) // 2) * 0.02, dtype=np.float16).tobytes()
    return out[:nbytes]


def bench_one(name: str, payload: bytes, level: int, threads: int, tmpdir: str) -> dict:
    path = os.path.join(tmpdir, f"bench-{name}.cusnap")
    t0 = time.perf_counter()
    with SnapshotWriter(path, {"bench": name}, level=level, threads=threads) as w:
        bid = w.add_blob(payload)
        w.write({"k": "c", "s": 1, "f": "cuMemcpyHtoD_v2", "a": {"ByteCount": len(payload)},
                 "r": 0, "x": {"src": {"blob": bid}}})
    t_write = time.perf_counter() - t0
    size = os.path.getsize(path)
    t0 = time.perf_counter()
    with SnapshotReader(path) as r:
        n = 0
        for chunk in r.blob_reader(bid):
            n += len(chunk)
    t_read = time.perf_counter() - t0
    assert n == len(payload)
    os.unlink(path)
    mb = len(payload) / 1e6
    return {"payload": name, "mb": round(mb, 1), "write_mb_s": round(mb / t_write, 1),
            "read_mb_s": round(mb / t_read, 1), "ratio": round(len(payload) / size, 3),
            "file_bytes": size}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=256, help="payload size per kind (MiB)")
    ap.add_argument("--level", type=int, default=3, help="zstd level (0 = stored)")
    ap.add_argument("--threads", type=int, default=0, help="compression threads (0 = inline)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--dir", default=None, help="where to write the temporary snapshot")
    args = ap.parse_args(argv)
    n = args.size_mb << 20
    t0 = time.perf_counter()
    payloads = {
        "random": np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8).tobytes(),
        "zeros": bytes(n),
        "fp16-mlp": mlp_weights_fp16(n),
    }
    gen_s = time.perf_counter() - t0
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        for name, data in payloads.items():
            rows.append(bench_one(name, data, args.level, args.threads, d))
    machine = {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
               "level": args.level, "threads": args.threads, "payload_gen_s": round(gen_s, 1)}
    if args.json:
        print(json.dumps({"machine": machine, "results": rows}, indent=2))
        return 0
    try:
        from rich.console import Console
        from rich.table import Table
        t = Table(title=f"cudasnap format: {args.size_mb} MiB per payload, zstd level {args.level}, "
                        f"threads {args.threads}")
        for col in ("payload", "write MB/s", "read MB/s", "ratio"):
            t.add_column(col, justify="left" if col == "payload" else "right")
        for r in rows:
            t.add_row(r["payload"], f"{r['write_mb_s']:.0f}", f"{r['read_mb_s']:.0f}", f"{r['ratio']:.2f}x")
        Console().print(t)
    except ImportError:
        print(f"{'payload':10} {'write MB/s':>11} {'read MB/s':>10} {'ratio':>8}")
        for r in rows:
            print(f"{r['payload']:10} {r['write_mb_s']:11.0f} {r['read_mb_s']:10.0f} {r['ratio']:7.2f}x")
    print(f"machine: {machine['cpu']}, {machine['cores']} cores, Python {machine['python']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
