"""Recorder large-payload throughput, without a GPU.

Two parts:

1. end to end: builds the CUDA test double (tests/double) and bench/h2d_double.c, runs
   `h2d_double N SIZE_MB` natively and under `python -m cudasnap capture`, and reports the
   copy loop's GB/s both ways plus the recorder's CPU time (capture process tree minus the
   program's own CPU) as bytes per busy core-second.
2. writer only: SnapshotWriter.begin_blob() fed 4 MiB pieces (as the ring delivers them)
   of incompressible data that differs per chunk, for several thread counts / levels;
   MB/s wall and MB per CPU-second.

    python bench/bench_recorder.py [--n 8] [--size-mb 256] [--out DIR] [--skip-e2e]
                                   [--skip-writer] [--writer-mb 1024] [--threads 0,1,2,4]

Numbers depend on the machine: report the core count with them.
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _cpu_self() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _run_timed(cmd, env) -> tuple[str, float, float]:
    """Run cmd; returns (stdout+stderr, wall seconds, CPU seconds of its whole process tree)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    text = out.decode("utf-8", "replace")
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({p.returncode}):\n{text}")
    return text, wall, ru.ru_utime + ru.ru_stime


def _parse(text: str) -> tuple[float, float, float]:
    m = re.search(r"H2D (\d+) x (\d+) in ([\d.]+) s = ([\d.]+) GB/s", text)
    c = re.search(r"^CPU ([\d.]+)", text, re.M)
    if not m or not c:
        raise RuntimeError(f"unexpected h2d_double output:\n{text}")
    return int(m.group(1)) * int(m.group(2)), float(m.group(3)), float(c.group(1))


def end_to_end(n: int, size_mb: int, outdir: Path, extra: list[str]) -> None:
    from tests.double.build import build

    work = Path(tempfile.mkdtemp(prefix="cusnap-bench-"))
    paths = build(work / "double")
    exe = work / "h2d_double"
    subprocess.run(["cc", "-O2", "-o", str(exe), str(ROOT / "bench" / "h2d_double.c"), "-ldl"], check=True)
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = paths["libdir"] + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    text, _, _ = _run_timed([str(exe), str(n), str(size_mb)], env)
    nbytes, secs, _ = _parse(text)
    print(f"native:    {nbytes / secs / 1e9:6.2f} GB/s  ({n} x {size_mb} MiB H2D in {secs:.3f} s)")
    out = outdir / "bench_recorder.cusnap"
    cmd = [sys.executable, "-m", "cudasnap", "capture", "-q", "-f", "-o", str(out), *extra, "--", str(exe), str(n), str(size_mb)]
    text, wall, cpu_tree = _run_timed(cmd, env)
    nbytes, secs, app_cpu = _parse(text)
    rec_cpu = max(cpu_tree - app_cpu, 1e-9)
    size = out.stat().st_size
    print(f"captured:  {nbytes / secs / 1e9:6.2f} GB/s  (copy loop {secs:.3f} s; capture wall {wall:.2f} s incl. "
          f"start-up and final drain; file {size / 2**20:.0f} MiB)  {' '.join(extra)}")
    print(f"           recorder CPU {rec_cpu:.2f} s -> {nbytes / rec_cpu / 1e9:.2f} GB per busy core-second; "
          f"program CPU {app_cpu:.2f} s")
    from cudasnap.formats import SnapshotReader

    r = SnapshotReader(out)
    calls = [c for c in r.records("c") if c["f"] == "cuMemcpyHtoD_v2"]
    assert len(calls) == n and all(r.blob_size(c["x"]["srcHost"]["blob"]) == size_mb << 20 for c in calls)
    r.close()
    out.unlink()


def writer_only(total_mb: int, thread_list: list[int], levels: list[int], outdir: Path, devnull: bool) -> None:
    from cudasnap.formats import SnapshotWriter
    from cudasnap.formats.container import CHUNK_SIZE

    base = bytearray(os.urandom(64 << 20))          # 16 distinct chunks, made unique per write below
    nchunks = total_mb // 4
    p = Path(os.devnull) if devnull else outdir / "bench_writer.cusnap"
    print(f"writer blob path: {total_mb} MiB random in 4 MiB pieces, one blob per 256 MiB, cpus={os.cpu_count()}, "
          f"to {p}")
    for level in levels:
        for threads in thread_list:
            c0, t0 = _cpu_self(), time.perf_counter()
            with SnapshotWriter(p, {"bench": 1}, level=level, threads=threads) as w:
                bs = None
                for i in range(nchunks):
                    if bs is None:
                        bs = w.begin_blob()
                    off = (i % 16) * CHUNK_SIZE
                    base[off:off + 8] = i.to_bytes(8, "little")      # no dedup between chunks
                    bs.write(memoryview(base)[off:off + CHUNK_SIZE])
                    if (i + 1) % 64 == 0:
                        bs.finish()
                        bs = None
                if bs is not None:
                    bs.finish()
            wall, cpu = time.perf_counter() - t0, _cpu_self() - c0
            mb = nchunks * 4 * 1.048576
            print(f"  level {level:3d} threads {threads:2d}: {mb / wall:8.0f} MB/s wall, "
                  f"{mb / cpu:8.0f} MB per CPU-second (cpu {cpu:.2f} s, wall {wall:.2f} s)")
            if not devnull:
                p.unlink()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--size-mb", type=int, default=256)
    ap.add_argument("--out", type=Path, default=None, help="directory for the snapshots (default: a temp dir)")
    ap.add_argument("--skip-e2e", action="store_true")
    ap.add_argument("--skip-writer", action="store_true")
    ap.add_argument("--writer-mb", type=int, default=1024)
    ap.add_argument("--threads", default="0,1,2,4")
    ap.add_argument("--levels", default="3")
    ap.add_argument("--devnull", action="store_true", help="writer part writes to /dev/null (CPU cost without the file system)")
    ap.add_argument("--capture-args", default="", help="extra `cudasnap capture` options, e.g. '--threads 2'")
    a = ap.parse_args()
    outdir = a.out or Path(tempfile.mkdtemp(prefix="cusnap-bench-out-"))
    outdir.mkdir(parents=True, exist_ok=True)
    print(f"cpus: {os.cpu_count()}  out: {outdir}")
    if not a.skip_e2e:
        end_to_end(a.n, a.size_mb, outdir, a.capture_args.split())
    if not a.skip_writer:
        writer_only(a.writer_mb, [int(x) for x in a.threads.split(",")], [int(x) for x in a.levels.split(",")], outdir, a.devnull)


if __name__ == "__main__":
    main()
