"""What the snapshot directory's storage accepts: the bound on capturing data that neither
dedups nor compresses. Writes 2 GiB of random data in 4 MiB pieces (source buffers bigger
than the L3, like ring memory the recorder reads) in several ways and prints GB/s each:
buffered into one file from 1 and 4 threads, buffered into 4 and 8 files in parallel, and
O_DIRECT (page cache bypassed, no CPU copy) into one file and into 4 files.

Usage: python bench/diag/diag_storage.py [DIR ...]   (default: the temp dir and /dev/shm)"""
from __future__ import annotations

import mmap
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PIECE = 4 << 20
TOTAL = 2 << 30


def fs_of(d: Path) -> str:
    best = ("?", "?")
    for line in Path("/proc/mounts").read_text().splitlines():
        dev, mnt, typ = line.split()[:3]
        if str(d.resolve()).startswith(mnt) and len(mnt) >= len(best[0]):
            best = (mnt, f"{typ} on {dev}")
    return f"{best[1]} (mounted at {best[0]})"


def source(n_pieces: int) -> list:
    """Page-aligned pieces (O_DIRECT needs that) of random data, 512 MiB in all."""
    m = mmap.mmap(-1, n_pieces * PIECE)
    for i in range(n_pieces):
        m[i * PIECE:(i + 1) * PIECE] = os.urandom(PIECE)
    mv = memoryview(m)
    return [mv[i * PIECE:(i + 1) * PIECE] for i in range(n_pieces)]


def settle() -> None:
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("1")
    except OSError:
        pass


def run(d: Path, src: list, files: int, threads: int, direct: bool) -> float:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0)
    paths = [d / f"cudasnap-storage-probe-{k}.bin" for k in range(files)]
    fds = [os.open(p, flags, 0o600) for p in paths]
    n = TOTAL // PIECE
    errors: list = []

    def work(t: int) -> None:
        try:
            for i in range(t, n, threads):
                fd = fds[i % files]
                os.pwrite(fd, src[i % len(src)], (i // files) * PIECE)
        except OSError as e:
            errors.append(e)
    t0 = time.perf_counter()
    ths = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    dt = time.perf_counter() - t0
    for fd in fds:
        os.close(fd)
    for p in paths:
        p.unlink()
    settle()
    if errors:
        raise errors[0]
    return TOTAL / dt / 1e9


def main() -> None:
    dirs = [Path(a) for a in sys.argv[1:]] or [Path(tempfile.gettempdir()), Path("/dev/shm")]
    src = source(128)
    try:
        print(subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip(), "CPUs;",
              Path("/proc/sys/vm/dirty_ratio").read_text().strip(), "% dirty_ratio")
    except OSError:
        pass
    cases = [("buffered, 1 file, 1 thread", 1, 1, False), ("buffered, 1 file, 4 threads", 1, 4, False),
             ("buffered, 4 files, 4 threads", 4, 4, False), ("buffered, 8 files, 8 threads", 8, 8, False),
             ("O_DIRECT, 1 file, 1 thread", 1, 1, True), ("O_DIRECT, 1 file, 4 threads", 1, 4, True),
             ("O_DIRECT, 4 files, 4 threads", 4, 4, True)]
    for d in dirs:
        print(f"{d}: {fs_of(d)}")
        for name, files, threads, direct in cases:
            try:
                r = f"{run(d, src, files, threads, direct):6.2f} GB/s"
            except OSError as e:
                r = f"not possible ({e.strerror})"
            print(f"  {name:32s} {r}", flush=True)


if __name__ == "__main__":
    main()
