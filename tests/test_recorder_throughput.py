"""The recorder's large-payload path (functional checks only, no timing): ring pieces read
in place and released after the write, chunk work on writer threads, the incompressibility
probe, file order and crash readability with parallel writes, and end to end on the double."""
from __future__ import annotations

import mmap
import os
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import xxhash

from cudasnap.capture import ring as R
from cudasnap.formats import SnapshotReader, SnapshotWriter
from cudasnap.formats import container as C
from cudasnap.formats.container import blob_id_of

HEADER = {"pid": 1}
ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20


# ---------------------------------------------------------------------------- ring

def _make_ring(path: Path, capacity: int = 32 * MiB) -> mmap.mmap:
    with open(path, "wb") as f:
        f.truncate(R.HDR_SIZE + capacity)
    fd = os.open(path, os.O_RDWR)
    mm = mmap.mmap(fd, R.HDR_SIZE + capacity)
    os.close(fd)
    mm[:8] = R.MAGIC
    struct.pack_into("<I", mm, R.OFF_VERSION, R.VERSION)
    struct.pack_into("<Q", mm, R.OFF_CAPACITY, capacity)
    struct.pack_into("<Q", mm, R.OFF_PID, os.getpid())
    return mm


def _put(mm: mmap.mmap, head: int, typ: int, seq: int, payload: bytes) -> int:
    """Publish one record with a single T_BYTES field at position head; returns new head."""
    cap = struct.unpack_from("<Q", mm, R.OFF_CAPACITY)[0]
    flen = 8 + ((len(payload) + 7) & ~7)
    ln = R.REC_HDR.size + flen
    off = R.HDR_SIZE + (head & (cap - 1))
    R.REC_HDR.pack_into(mm, off, ln, 0, typ, 1, 0, seq, 1, 0, 0, 0)
    R.FIELD_HDR.pack_into(mm, off + R.REC_HDR.size, 0, R.T_BYTES, len(payload))
    p = off + R.REC_HDR.size + 8
    mm[p:p + len(payload)] = payload
    struct.pack_into("<I", mm, off + 4, R.state_word(head))
    head += ln
    struct.pack_into("<Q", mm, R.OFF_HEAD, head)
    return head


def _shared_tail(mm) -> int:
    return struct.unpack_from("<Q", mm, R.OFF_TAIL)[0]


def test_ring_pins_blob_pieces_until_released(tmp_path):
    mm = _make_ring(tmp_path / "ring.shm")
    a, b = os.urandom(4 * MiB), os.urandom(4 * MiB)
    head = _put(mm, 0, R.BLOB_PIECE, 1, a)
    first_end = head
    head = _put(mm, head, R.BLOB_PIECE, 1, b)
    head = _put(mm, head, R.NOTE, 0, b"hello")
    ring = R.Ring(str(tmp_path / "ring.shm"))
    recs = ring.poll(pin_blobs=True)
    assert [r.type for r in recs] == [R.BLOB_PIECE, R.BLOB_PIECE, R.NOTE]
    assert isinstance(recs[0].fields[0][2], memoryview) and recs[0].release is not None
    assert bytes(recs[0].fields[0][2]) == a and bytes(recs[1].fields[0][2]) == b
    assert isinstance(recs[2].fields[0][2], bytes) and recs[2].release is None
    assert ring.tail == head and ring.pinned() == 2
    assert _shared_tail(mm) == 0                     # producers may not reuse pinned space
    recs[1].release()                                # out of order: still held by the first
    assert _shared_tail(mm) == 0
    recs[0].release()
    recs[0].release()                                # a second call is harmless
    assert _shared_tail(mm) == head and ring.pinned() == 0
    assert first_end < head
    # default poll copies everything and moves the shared tail at once
    head2 = _put(mm, head, R.BLOB_PIECE, 2, a)
    recs = ring.poll()
    assert isinstance(recs[0].fields[0][2], bytes) and recs[0].release is None
    assert _shared_tail(mm) == head2
    ring.close()
    mm.close()


def test_ring_small_pieces_are_copied(tmp_path):
    mm = _make_ring(tmp_path / "ring.shm")
    head = _put(mm, 0, R.BLOB_PIECE, 1, b"x" * 1000)
    ring = R.Ring(str(tmp_path / "ring.shm"))
    recs = ring.poll(pin_blobs=True)
    assert recs[0].fields[0][2] == b"x" * 1000 and recs[0].release is None
    assert _shared_tail(mm) == head
    ring.close()
    mm.close()


# ---------------------------------------------------------------------------- writer

class _Releases:
    def __init__(self):
        self.n = 0
        self.lock = threading.Lock()

    def __call__(self):
        with self.lock:
            self.n += 1


def _chunks_by_codec(path) -> dict:
    r = SnapshotReader(path)
    out = {}
    for fr in r._frames:
        if fr.kind == C.KIND_CHUNK:
            with open(path, "rb") as f:
                f.seek(fr.offset)
                kind, codec, raw_len, comp_len, _, _ = C.parse_frame_header(f.read(C.FRAME_SIZE), path, fr.offset)
            out.setdefault(codec, 0)
            out[codec] += 1
    r.close()
    return out


@pytest.mark.parametrize("threads", [0, 1, 4])
def test_streamed_pieces_with_release(tmp_path, threads):
    """Whole-chunk pieces go to the writer in place; release is called once per piece;
    ids follow the chunk-digest rule; random chunks are stored raw, zeros compressed."""
    rnd = os.urandom(12 * MiB)
    zeros = bytes(8 * MiB)
    data = rnd + zeros + rnd[:3 * MiB]                 # 23 MiB: 5 whole chunks + a 3 MiB tail
    p = tmp_path / "s.cusnap"
    rel = []
    with SnapshotWriter(p, HEADER, threads=threads, level=3) as w:
        bs = w.begin_blob()
        for i in range(0, len(data), C.CHUNK_SIZE):
            piece = bytearray(data[i:i + C.CHUNK_SIZE])     # "ring memory": changes after release
            r = _Releases()
            rel.append(r)

            def release(piece=piece, r=r):
                r()
                piece[:8] = b"CLOBBER!"                    # the writer must be done with it

            bs.write(memoryview(piece), release)
        bid = bs.finish()
        st = w.stats
    assert [r.n for r in rel] == [1] * len(rel)
    assert bid == blob_id_of(data)
    r = SnapshotReader(p)
    assert not r.truncated and r.blob(bid) == data
    assert st["chunks"] == 5 and st["chunk_hits"] == 1        # the 2 zero chunks are one
    codecs = _chunks_by_codec(p)
    assert codecs.get(C.CODEC_STORED) == 4 and codecs.get(C.CODEC_ZSTD) == 1


def test_release_called_on_error(tmp_path):
    p = tmp_path / "e.cusnap"
    w = SnapshotWriter(p, HEADER, threads=2)
    bs = w.begin_blob()
    bs.finish()
    r = _Releases()
    with pytest.raises(ValueError):
        bs.write(memoryview(bytearray(C.CHUNK_SIZE)), r)     # finished stream
    assert r.n == 1
    s = w.begin_blob()
    w.close()
    r2 = _Releases()
    with pytest.raises(ValueError):
        s.write(memoryview(bytearray(C.CHUNK_SIZE)), r2)     # writer closed
    assert r2.n == 1


def test_parallel_writes_keep_order_and_crash_prefix(tmp_path):
    """Many blobs and records through 8 threads: indexed file equals the scanned one, and a
    writer that stops without an index (abort) leaves everything readable by the scan."""
    p = tmp_path / "o.cusnap"
    blobs = [os.urandom(C.CHUNK_SIZE) + bytes(C.CHUNK_SIZE // 2) + os.urandom(1000) for _ in range(6)]
    ids = []
    with SnapshotWriter(p, HEADER, threads=8, frame_bytes=4096) as w:
        for i, b in enumerate(blobs):
            bs = w.begin_blob()
            for j in range(0, len(b), 3 * MiB):              # unaligned pieces: copy path
                bs.write(b[j:j + 3 * MiB])
            ids.append(bs.finish())
            for k in range(200):
                w.write({"k": "c", "s": i * 1000 + k, "f": "cuInit", "a": {"pad": "y" * 50}, "r": 0,
                         "x": {"src": {"blob": ids[-1]}}})
    r = SnapshotReader(p)
    assert not r.truncated
    assert [r.blob(i) for i in ids] == blobs
    recs = [x["s"] for x in r.records("c")]
    assert recs == sorted(recs) and len(recs) == 1200
    scanned = SnapshotReader(p, scan=True)
    assert [x["s"] for x in scanned.records("c")] == recs
    assert [scanned.blob(i) for i in ids] == blobs

    q = tmp_path / "a.cusnap"
    w = SnapshotWriter(q, HEADER, threads=8, frame_bytes=4096)
    for b in blobs[:3]:
        w.add_blob(b)
        w.write({"k": "c", "s": 1, "f": "cuInit", "a": {}, "r": 0})
    w.abort()
    r = SnapshotReader(q)
    assert r.truncated and r.lost_bytes == 0
    assert sorted(r.blob_ids()) == sorted(blob_id_of(b) for b in blobs[:3])


def test_probe():
    assert C.looks_incompressible(os.urandom(C.CHUNK_SIZE))
    assert not C.looks_incompressible(bytes(C.CHUNK_SIZE))
    assert not C.looks_incompressible(os.urandom(1000))        # small: never judged
    text = (b"cuMemcpyHtoD_v2 " * 300000)[:C.CHUNK_SIZE]
    assert not C.looks_incompressible(text)


def test_recorder_default_threads():
    from cudasnap.capture.recorder import default_threads

    assert 1 <= default_threads() <= 8
    assert default_threads() == max(1, min(8, (os.cpu_count() or 2) // 2))


# ---------------------------------------------------------------------------- end to end

def _xorshift_words(n: int) -> list:
    x, out, m = 0x9E3779B97F4A7C15, [], (1 << 64) - 1
    for _ in range(n):
        x ^= (x << 13) & m
        x ^= x >> 7
        x ^= (x << 17) & m
        out.append(x)
    return out


def test_capture_large_h2d_copies(double, tmp_path):
    """bench/h2d_double.c under capture: every 12 MiB copy is in the snapshot, intact."""
    exe = tmp_path / "h2d_double"
    subprocess.run(["cc", "-O2", "-o", str(exe), str(ROOT / "bench" / "h2d_double.c"), "-ldl"], check=True)
    out = tmp_path / "h.cusnap"
    n, size_mb = 3, 12
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "capture", "-q", "-o", str(out), "--ring-mb", "16",
                         "--threads", "3", "--", str(exe), str(n), str(size_mb)],
                        env=double["env"], capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stderr
    assert "H2D 3 x 12582912" in cp.stdout
    r = SnapshotReader(out)
    assert not r.truncated
    calls = [c for c in r.records("c") if c["f"] == "cuMemcpyHtoD_v2"]
    assert len(calls) == n
    first = _xorshift_words(8)
    prev = None
    for it, c in enumerate(calls):
        bid = c["x"]["srcHost"]["blob"]
        data = r.blob(bid)
        assert len(data) == size_mb * MiB and blob_id_of(data) == bid
        words = struct.unpack_from("<8Q", data)
        bump = (it + 1) * (it + 2) // 2             # buf[0] += it + 1 before copy `it`
        assert words[1:] == tuple(first[1:]) and words[0] == (first[0] + bump) & ((1 << 64) - 1)
        if prev is not None:                        # differs in exactly one word per 4 MiB
            for off in range(0, len(data), C.CHUNK_SIZE):
                assert data[off:off + 8] != prev[off:off + 8]
                assert data[off + 8:off + C.CHUNK_SIZE] == prev[off + 8:off + C.CHUNK_SIZE]
        prev = data
    st = r.stats
    assert st["blob_unique_bytes"] == n * size_mb * MiB
