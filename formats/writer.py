"""SnapshotWriter: streams records and content-addressed blobs into a .cusnap file.

Frames go to the file (os.pwrite, no user-space buffering) as soon as they are complete,
at offsets handed out in submission order, so a writer killed at any point leaves a prefix
of complete frames that the scanner reads (a frame still being written when it died ends
the prefix).

With threads > 0, frame encoding runs on a thread pool: for blob chunks of >= 1 MiB the
chunk digest, the dedup decision, the incompressibility probe, compression, the frame
checksum of a compressed chunk and the write itself all run on the worker (zstd, xxhash and
pwrite release the GIL). A blob's id comes from its chunk digests (container.blob_id), and a
chunk stored raw is checked by its id (FLAG_ID_SUM), so nothing reads the content twice;
put_chunk takes chunks whose digest the caller already has (the shim's).

Segments: buffered writes into one file are serialized by the kernel (one inode lock), about
3-4 GB/s on the GPU machine, where 4 files written in parallel take 12-14 GB/s. With
segments > 0, a large chunk frame that finds the snapshot file busy with another large write
goes to one of that many segment files beside it (`<path>.seg<k>`: a preamble, then chunk
frames). close() folds the segments into the snapshot (copy_file_range, each segment unlinked
once copied) before writing the index, so the result is one ordinary file. A records frame is
written only after every earlier segment write finished, so a blob record never reaches the
file before its chunks. A writer that dies before close() leaves its segments beside the file:
`cudasnap repair` folds them in (formats/recover.py).
"""
from __future__ import annotations

import collections
import os
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple, Union


from .container import (
    CHUNK_ID_LEN, CHUNK_SIZE, CODEC_STORED, CODEC_ZSTD, FLAG_ID_SUM, FORMAT_VERSION, FRAME_SIZE, KIND_CHUNK,
    KIND_HEADER, KIND_INDEX, KIND_RECORDS, MAX_FRAME, PREAMBLE_SIZE, SCHEMA_VERSION, TRAILER, TRAILER_MAGIC,
    blob_id, chunk_digest, compressor, encode_payload, looks_incompressible, new_packer,
    pack_frame_header, pack_frame_header_sum, pack_preamble, xxh64,
)
from .console import tool_version
from .outputs import claim_fd
from .segments import Segment, copy_range, segment_paths
from .summary import Summary

Buffer = Union[bytes, bytearray, memoryview]
Release = Optional[Callable[[], None]]

_JOB_DIGEST_MIN = 1 << 20     # chunks this big are digested on the worker, smaller ones inline
_SEGMENT_MIN = 1 << 20        # chunk frames this big may go to a segment file


def _encode_frame(kind: int, raw, count: int, level: int) -> Tuple[bytes, bytes, int]:
    """Compress + build the header (records, header and index frames)."""
    codec, stored = encode_payload(raw, level)
    return pack_frame_header(kind, codec, len(raw), stored, count), stored, len(raw)


def _encode_chunk(digest: bytes, data, level: int) -> Tuple[List[Any], int]:
    """A chunk frame as pieces to write (header, then payload pieces) without copying the
    chunk when it is stored: incompressible chunks (see container.looks_incompressible) and
    chunks zstd does not shrink are stored raw. Returns (pieces, stored payload length)."""
    raw_len = CHUNK_ID_LEN + len(data)
    if level != 0 and len(data) and not looks_incompressible(data):
        comp = compressor(level).compress(b"".join((digest, data)))
        if len(comp) < raw_len:
            head = pack_frame_header_sum(KIND_CHUNK, CODEC_ZSTD, raw_len, len(comp), xxh64(comp), 0)
            return [head, comp], len(comp)
    # stored: checked by its chunk id, so the data is not read again here
    head = pack_frame_header_sum(KIND_CHUNK, CODEC_STORED, raw_len, raw_len, 0, 0, flags=FLAG_ID_SUM)
    return [head, digest, data], raw_len


def _pwrite_all(fd: int, pieces: List[Any], off: int) -> None:
    views = [memoryview(p).cast("B") for p in pieces if len(p)]
    while views:
        n = os.pwritev(fd, views[:64], off)
        if n <= 0:
            raise OSError(28, "short write")
        off += n
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]


class BlobStream:
    """Streaming form of SnapshotWriter.add_blob for payloads too big to hold at once."""

    def __init__(self, writer: "SnapshotWriter"):
        self._w = writer
        self._buf = bytearray()
        self._chunks: List[Any] = []          # chunk ids, or futures of chunk ids
        self._size = 0
        self._done: Optional[str] = None

    def write(self, data: Buffer, release: Release = None) -> int:
        """Append data. Without `release` the data is copied before write returns (the caller
        may reuse its buffer). With `release`, the caller keeps `data` valid and unchanged
        until release() is called: a piece that is exactly one whole chunk at a chunk boundary
        is then handed to the writer without a copy; release() is called exactly once, when
        the writer no longer needs the memory (possibly from a worker thread, possibly
        before write returns)."""
        handed = False
        try:
            if self._done is not None:
                raise ValueError("blob stream already finished")
            mv = memoryview(data).cast("B")
            n = len(mv)
            self._size += n
            if release is not None and not self._buf and n == CHUNK_SIZE:
                handed = True
                self._chunks.append(self._w._put_chunk(mv, release))
                return n
            pos = 0
            if self._buf:
                take = min(CHUNK_SIZE - len(self._buf), n)
                self._buf += mv[:take]
                pos = take
                if len(self._buf) == CHUNK_SIZE:
                    buf, self._buf = self._buf, bytearray()
                    self._chunks.append(self._w._put_chunk(buf))      # the job owns buf now
            while n - pos >= CHUNK_SIZE:
                self._chunks.append(self._w._put_chunk(bytes(mv[pos:pos + CHUNK_SIZE])))
                pos += CHUNK_SIZE
            if pos < n:
                self._buf += mv[pos:]
            return n
        finally:
            if release is not None and not handed:
                release()

    def finish(self) -> str:
        if self._done is not None:
            return self._done
        if self._buf:
            buf, self._buf = self._buf, bytearray()
            self._chunks.append(self._w._put_chunk(buf))
        chunks = [c if isinstance(c, str) else c.result() for c in self._chunks]
        self._done = self._w._define_blob(blob_id([bytes.fromhex(c) for c in chunks]), self._size, chunks)
        self._chunks = []
        return self._done


class SnapshotWriter:
    """Writes a .cusnap: record frames, blob chunks stored once, the index and its trailer, so
    that a file cut short anywhere still reads up to its last complete frame. One class (about
    440 lines) because frames, blobs and the index share the offsets the trailer records."""

    def __init__(self, path, header: Optional[Dict[str, Any]] = None, *, level: int = 3,
                 frame_bytes: int = 2 << 20, threads: int = 0, blob_level: Optional[int] = None,
                 segments: int = 0, claim: Optional[str] = None):
        """level: zstd level (0 = store uncompressed; negative = zstd fast levels).
        blob_level: zstd level for blob chunks (default: level). Large chunks whose sample
        does not compress are stored raw whatever the level.
        frame_bytes: target raw size of a records frame (clamped to 64 MiB).
        threads: > 0 encodes and writes frames on that many worker threads; file order is
        kept (offsets are handed out in submission order).
        segments: with threads, how many segment files large chunks may spill into while
        the snapshot file is busy (module docstring); 0 writes everything into the file.
        claim: "new" creates the file exclusively, "replace" replaces a file no other writer holds
        (a second writer gets FileExistsError, the file untouched); None opens as it is (a FIFO)."""
        self.path = os.fspath(path)
        self.level = int(level)
        self.blob_level = self.level if blob_level is None else int(blob_level)
        self.frame_bytes = max(1, min(int(frame_bytes), MAX_FRAME))
        self._lock = threading.RLock()          # callers' state: records buffer, blobs, queue
        self._mlock = threading.Condition(threading.Lock())   # file position, index, chunk set
        self._packer = new_packer()
        self._buf = bytearray()
        self._buf_count = 0
        self._pool: Optional[ThreadPoolExecutor] = None
        self._max_pending = 0
        if threads and threads > 0:
            self._pool = ThreadPoolExecutor(max_workers=int(threads), thread_name_prefix="cusnap-zstd")
            self._max_pending = 2 * int(threads)
        self._pending: Deque[Future] = collections.deque()
        self._ticket = 0          # next frame's place in the file (under _lock)
        self._turn = 0            # frame allowed to take the next file offset (under _mlock)
        self._pos = 0             # next file offset (under _mlock)
        self._io_error: Optional[OSError] = None
        self._frames: List[List[int]] = []
        self._chunk_off: Dict[str, int] = {}
        self._chunk_known: set = set()
        self._nseg = int(segments) if self._pool is not None else 0
        self._segs: List[Segment] = []
        self._seg_free: List[Segment] = []       # under _mlock
        self._seg_inflight = 0    # segment writes under way (under _mlock)
        self._main_busy = False   # a large chunk is being written into the file (under _mlock)
        self._blobs: Dict[str, List[Any]] = {}
        # what `info` shows, kept as records are written (index "summary"); None after a
        # record it could not take (the index then has no summary: readers scan instead)
        self._summary: Optional[Summary] = Summary(lambda bid: (self._blobs.get(bid) or (None,))[0])
        self._closed = False
        self._st = dict(raw_bytes=0, stored_bytes=0, blobs=0, blob_refs=0, chunks=0, chunk_hits=0,
                        records=0, frames=0, record_raw_bytes=0, blob_logical_bytes=0,
                        blob_unique_bytes=0, chunk_raw_bytes=0, chunk_stored_bytes=0)
        self._mst = dict(stored_bytes=0, chunks=0, chunk_hits=0, frames=0, chunk_raw_bytes=0,
                         chunk_stored_bytes=0)       # updated by workers, under _mlock
        hdr = dict(header or {})
        hdr.setdefault("format", "cudasnap")
        hdr.setdefault("schema", SCHEMA_VERSION)
        hdr.setdefault("created", time.time())
        hdr.setdefault("host", socket.gethostname())
        hdr.setdefault("tool_version", tool_version())
        self.header = hdr
        self._fd = claim_fd(self.path, claim)
        for stale in segment_paths(self.path):      # an earlier writer's: not this file's
            try:
                os.unlink(stale)
            except OSError:
                pass
        try:
            self._write_at_end([pack_preamble(FORMAT_VERSION)])
            raw = self._packer.pack(hdr)
            if len(raw) > MAX_FRAME:
                raise ValueError("snapshot header too large")
            self._emit(KIND_HEADER, raw, 0)
            self._drain(0)
        except BaseException:
            self._shutdown()
            raise

    # ------------------------------------------------------------------ public API
    def write(self, record: Dict[str, Any]) -> None:
        """Append one record (a map with kind key 'k') to the record stream."""
        raw = self._packer.pack(record)
        if len(raw) > MAX_FRAME:
            raise ValueError(f"record of {len(raw)} bytes exceeds the 64 MiB frame limit; store it as a blob")
        with self._lock:
            self._check_open()
            if self._buf and len(self._buf) + len(raw) > MAX_FRAME:
                self._flush_records()
            self._buf += raw
            self._buf_count += 1
            if self._summary is not None:
                try:
                    self._summary.add(record)
                except Exception:
                    self._summary = None
            self._st["records"] += 1
            self._st["record_raw_bytes"] += len(raw)
            self._st["raw_bytes"] += len(raw)
            if len(self._buf) >= self.frame_bytes:
                self._flush_records()

    def add_blob(self, data: Buffer) -> str:
        """Store a payload (deduplicated by content); returns its blob id."""
        mv = memoryview(data).cast("B")
        pieces = [mv[i:i + CHUNK_SIZE] for i in range(0, len(mv), CHUNK_SIZE)]
        digests = [chunk_digest(p) for p in pieces]
        bid = blob_id(digests)
        with self._lock:
            self._check_open()
            if bid in self._blobs:
                self._ref(len(mv))
                return bid
            own = isinstance(data, bytes)      # immutable: chunks can be views of it
            for d, p in zip(digests, pieces):
                self.put_chunk(d, p if own else bytes(p))
            return self._define_blob(bid, len(mv), [d.hex() for d in digests])

    def put_chunk(self, digest: bytes, data: Buffer, release: Release = None) -> str:
        """Queue one chunk whose digest (chunk_digest of data) the caller computed; it is
        written unless the file has it already. Same ownership rules as _put_chunk."""
        with self._lock:
            try:
                self._check_open()
                cid = self._claim(digest, len(data))
                if cid is not None:
                    rel, release = release, None
                    self._submit(self._chunk_job, data, digest, rel)
                    self._drain(self._max_pending)
                return digest.hex()
            finally:
                if release is not None:
                    release()

    def add_blob_chunks(self, size: int, digests: List[bytes]) -> str:
        """Define a blob from chunks already given to put_chunk (or known); returns its id."""
        return self._define_blob(blob_id(digests), size, [bytes(d).hex() for d in digests])

    def begin_blob(self) -> BlobStream:
        self._check_open()
        return BlobStream(self)

    def flush(self) -> None:
        """Force the current records frame (and pending frames) to the file."""
        with self._lock:
            if self._closed:
                return
            self._flush_records()
            self._drain(0)

    @property
    def stats(self) -> Dict[str, int]:
        with self._lock:
            st = dict(self._st)
            with self._mlock:
                for k, v in self._mst.items():
                    st[k] += v
            return st

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                self._flush_records()
                self._drain(0)
                if self._io_error is not None:
                    raise self._io_error
                self._fold_segments()
                self._frames.sort()
                index = {
                    "frames": self._frames,
                    "chunks": self._chunk_off,
                    "blobs": self._blobs,
                    "records": self._st["records"],
                    "stats": self.stats,
                }
                if self._summary is not None:
                    try:
                        index["summary"] = self._summary.to_map()
                    except Exception:       # never fail a close over it: readers scan
                        pass
                raw = self._packer.pack(index)
                if len(raw) > MAX_FRAME and "summary" in index:     # readers scan instead
                    del index["summary"]
                    raw = self._packer.pack(index)
                if len(raw) > MAX_FRAME:  # pragma: no cover - needs ~1M frames
                    raise ValueError("index too large for one frame")
                head, stored, _ = _encode_frame(KIND_INDEX, raw, 0, self.level)
                off = self._write_at_end([head, stored])
                self._write_at_end([TRAILER.pack(TRAILER_MAGIC, off, xxh64(stored))])
            finally:
                self._closed = True
                self._shutdown()

    def abort(self) -> None:
        """Close the file without an index (what a crash leaves); for tests and emergencies."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._flush_records()
                self._drain(0)
            finally:
                self._shutdown()

    def __enter__(self) -> "SnapshotWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        for seg in self._segs:
            if seg.fd >= 0:
                os.close(seg.fd)
                seg.fd = -1
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("snapshot writer is closed")

    def _ref(self, size: int) -> None:
        self._st["blob_refs"] += 1
        self._st["blob_logical_bytes"] += size
        self._st["raw_bytes"] += size

    def _define_blob(self, bid: str, size: int, chunks: List[str]) -> str:
        with self._lock:
            self._check_open()
            self._ref(size)
            if bid not in self._blobs:
                self._blobs[bid] = [size, list(chunks)]
                self._st["blobs"] += 1
                self._st["blob_unique_bytes"] += size
                self.write({"k": "b", "id": bid, "size": size, "chunks": list(chunks)})
            return bid

    def _claim(self, digest: bytes, size: int) -> Optional[str]:
        """The chunk id when this chunk is new (the caller writes it), None when known."""
        cid = digest.hex()
        with self._mlock:
            if cid in self._chunk_known:
                self._mst["chunk_hits"] += 1
                return None
            self._chunk_known.add(cid)
            self._mst["chunks"] += 1
            self._mst["chunk_raw_bytes"] += size
            return cid

    def _put_chunk(self, data: Buffer, release: Release = None):
        """Queue one chunk. Returns its chunk id, or a Future of it (large chunks are
        digested on a worker). The writer keeps a reference to `data` until the chunk is
        written: pass memory nobody changes, and `release` (called exactly once, when the
        writer is done with `data`) for borrowed memory."""
        if self._pool is None or len(data) < _JOB_DIGEST_MIN:
            return self.put_chunk(chunk_digest(data), data, release)
        with self._lock:
            try:
                self._check_open()
                rel, release = release, None          # the job owns it from here
                fut = self._submit(self._chunk_job, data, None, rel)
                self._drain(self._max_pending)
                return fut
            finally:
                if release is not None:
                    release()

    def _chunk_job(self, ticket: int, data, digest: Optional[bytes], release: Release) -> str:
        """Digest (when not done yet), dedup, encode and write one chunk frame."""
        try:
            pieces = None
            try:
                if digest is None:
                    digest = chunk_digest(data)
                    if self._claim(digest, len(data)) is not None:
                        pieces = _encode_chunk(digest, data, self.blob_level)
                else:
                    pieces = _encode_chunk(digest, data, self.blob_level)
            except BaseException:
                self._place(ticket, None, KIND_CHUNK, 0, None)     # give up the turn, write nothing
                raise
            cid = digest.hex()
            if pieces is not None:
                self._place(ticket, pieces[0], KIND_CHUNK, pieces[1], cid)
            else:
                self._place(ticket, None, KIND_CHUNK, 0, None)
            return cid
        finally:
            if release is not None:
                release()

    def _frame_job(self, ticket: int, kind: int, raw, count: int) -> None:
        try:
            head, stored, _ = _encode_frame(kind, raw, count, self.level)
        except BaseException:
            self._place(ticket, None, kind, 0, None)
            raise
        self._place(ticket, [head, stored], kind, len(stored), None)

    def _place(self, ticket: int, pieces: Optional[List[Any]], kind: int, comp_len: int, cid: Optional[str]) -> None:
        """Wait for this frame's turn, take the next file offset (or a free segment), then
        write (outside the lock, so frames are written in parallel). After a write error
        nothing more is written (the file keeps a readable prefix) and every later frame
        raises it."""
        seg = None
        big = kind == KIND_CHUNK and comp_len >= _SEGMENT_MIN
        owns_busy = False
        with self._mlock:
            while self._turn != ticket:
                self._mlock.wait()
            if kind == KIND_RECORDS:          # its blob records must not precede their chunks
                while self._seg_inflight:
                    self._mlock.wait()
            err = self._io_error
            off = self._pos
            if pieces is not None and err is None:
                n = sum(len(p) for p in pieces)
                if big and self._main_busy and self._nseg:
                    # a second large write into the file would only queue on its inode lock:
                    # wait for a free segment, or for the file
                    seg = self._take_segment()
                    while seg is None and self._main_busy and self._nseg:
                        self._mlock.wait()
                        seg = self._take_segment()
                if seg is not None:
                    off = seg.pos
                    seg.pos += n
                    self._seg_inflight += 1
                else:
                    self._pos += n
                    if big and not self._main_busy:
                        self._main_busy = owns_busy = True
            self._turn += 1
            self._mlock.notify_all()
        if pieces is None:
            return
        if err is not None:
            raise err
        try:
            _pwrite_all(seg.fd if seg is not None else self._fd, pieces, off)
        except OSError as e:
            with self._mlock:
                if self._io_error is None:
                    self._io_error = e
            raise
        finally:
            with self._mlock:
                if seg is not None:
                    self._seg_inflight -= 1
                    self._seg_free.append(seg)
                    self._mlock.notify_all()
                elif owns_busy:
                    self._main_busy = False
                    self._mlock.notify_all()
        with self._mlock:
            if seg is not None:
                seg.frames.append((off, comp_len, cid))
            else:
                self._frames.append([off, kind, comp_len])
                if cid is not None:
                    self._chunk_off[cid] = off
            self._mst["frames"] += 1
            self._mst["stored_bytes"] += FRAME_SIZE + comp_len
            if cid is not None:
                self._mst["chunk_stored_bytes"] += comp_len + FRAME_SIZE

    def _take_segment(self) -> Optional[Segment]:
        """A free segment, creating them on first use; None when all are busy (under _mlock)."""
        if not self._segs:
            try:
                for k in range(1, self._nseg + 1):
                    seg = Segment(f"{self.path}.seg{k}")
                    self._segs.append(seg)
                    self._seg_free.append(seg)
            except OSError:
                self._nseg = 0                # cannot create them: the file alone it is
                return None
        return self._seg_free.pop() if self._seg_free else None

    def _fold_segments(self) -> None:
        """Append every segment's frames to the file (nothing is pending), unlinking each
        one once copied; a writer dying meanwhile leaves the rest for `cudasnap repair`."""
        for seg in self._segs:
            base = self._pos - PREAMBLE_SIZE
            n = seg.pos - PREAMBLE_SIZE
            if n:
                copy_range(seg.fd, PREAMBLE_SIZE, self._fd, self._pos, n)
            self._pos += n
            for off, comp_len, cid in seg.frames:
                self._frames.append([base + off, KIND_CHUNK, comp_len])
                self._chunk_off[cid] = base + off
            os.close(seg.fd)
            seg.fd = -1
            os.unlink(seg.path)
        self._segs = []

    def _flush_records(self) -> None:
        if not self._buf:
            return
        raw, count = bytes(self._buf), self._buf_count
        self._buf = bytearray()
        self._buf_count = 0
        self._emit(KIND_RECORDS, raw, count)

    def _emit(self, kind: int, raw, count: int) -> None:
        with self._lock:
            self._submit(self._frame_job, kind, raw, count)
            self._drain(self._max_pending)

    def _submit(self, job, *args) -> Optional[Future]:
        """Run job(ticket, *args) on the pool, or now without one (or when the pool refuses
        it); tickets, hence file order, follow call order. A job always runs to its end
        (it passes its turn on and releases borrowed memory even when it fails)."""
        with self._lock:
            ticket = self._ticket
            self._ticket += 1
            if self._pool is not None:
                try:
                    fut = self._pool.submit(job, ticket, *args)
                except RuntimeError:       # pool shut down (interpreter exit): run it here
                    fut = None
                if fut is not None:
                    self._pending.append(fut)
                    return fut
            job(ticket, *args)
            return None

    def _drain(self, keep: int) -> None:
        while len(self._pending) > keep:
            fut = self._pending.popleft()
            fut.result()

    def _write_at_end(self, pieces: List[Any]) -> int:
        """Write outside the frame sequence (preamble, index, trailer): nothing is pending."""
        with self._mlock:
            off = self._pos
            _pwrite_all(self._fd, pieces, off)
            n = sum(len(p) for p in pieces)
            self._pos += n
            self._mst["stored_bytes"] += n
            return off
