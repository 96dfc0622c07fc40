"""SnapshotWriter: streams records and content-addressed blobs into a .cusnap file.

Frames go to the file as soon as they are complete (and the file is flushed after each),
so a writer killed at any point leaves every complete frame readable by the scanner.
"""
from __future__ import annotations

import collections
import os
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Deque, Dict, List, Optional, Tuple, Union

from .container import (
    CHUNK_SIZE, FORMAT_VERSION, FRAME_SIZE, KIND_CHUNK, KIND_HEADER, KIND_INDEX, KIND_RECORDS,
    MAX_FRAME, SCHEMA_VERSION, TRAILER, TRAILER_MAGIC, blob_hasher, chunk_digest, encode_payload,
    new_packer, pack_frame_header, pack_preamble, xxh64,
)

Buffer = Union[bytes, bytearray, memoryview]


def _encode_frame(kind: int, raw, count: int, level: int) -> Tuple[bytes, bytes, int]:
    """Runs on a worker thread when threads > 0: compress + build the header."""
    codec, stored = encode_payload(raw, level)
    return pack_frame_header(kind, codec, len(raw), stored, count), stored, len(raw)


class BlobStream:
    """Streaming form of SnapshotWriter.add_blob for payloads too big to hold at once."""

    def __init__(self, writer: "SnapshotWriter"):
        self._w = writer
        self._hash = blob_hasher()
        self._buf = bytearray()
        self._chunks: List[str] = []
        self._size = 0
        self._done: Optional[str] = None

    def write(self, data: Buffer) -> int:
        if self._done is not None:
            raise ValueError("blob stream already finished")
        mv = memoryview(data).cast("B")
        n = len(mv)
        self._hash.update(mv)
        self._size += n
        pos = 0
        if self._buf:
            take = min(CHUNK_SIZE - len(self._buf), n)
            self._buf += mv[:take]
            pos = take
            if len(self._buf) == CHUNK_SIZE:
                self._chunks.append(self._w._put_chunk(self._buf))
                self._buf = bytearray()
        while n - pos >= CHUNK_SIZE:
            self._chunks.append(self._w._put_chunk(mv[pos:pos + CHUNK_SIZE]))
            pos += CHUNK_SIZE
        if pos < n:
            self._buf += mv[pos:]
        return n

    def finish(self) -> str:
        if self._done is not None:
            return self._done
        if self._buf:
            self._chunks.append(self._w._put_chunk(self._buf))
            self._buf = bytearray()
        self._done = self._w._define_blob(self._hash.hexdigest(), self._size, self._chunks)
        return self._done


class SnapshotWriter:
    def __init__(self, path, header: Optional[Dict[str, Any]] = None, *, level: int = 3,
                 frame_bytes: int = 2 << 20, threads: int = 0):
        """level: zstd level (0 = store uncompressed; negative = zstd fast levels).
        frame_bytes: target raw size of a records frame (clamped to 64 MiB).
        threads: > 0 compresses frames on that many worker threads; file order is kept."""
        self.path = os.fspath(path)
        self.level = int(level)
        self.frame_bytes = max(1, min(int(frame_bytes), MAX_FRAME))
        self._lock = threading.RLock()
        self._packer = new_packer()
        self._buf = bytearray()
        self._buf_count = 0
        self._pool: Optional[ThreadPoolExecutor] = None
        self._max_pending = 0
        if threads and threads > 0:
            self._pool = ThreadPoolExecutor(max_workers=int(threads), thread_name_prefix="cusnap-zstd")
            self._max_pending = 2 * int(threads)
        self._pending: Deque[Tuple[int, Any, Optional[str]]] = collections.deque()
        self._frames: List[List[int]] = []
        self._chunk_off: Dict[str, int] = {}
        self._chunk_known: set = set()
        self._blobs: Dict[str, List[Any]] = {}
        self._closed = False
        self._st = dict(raw_bytes=0, stored_bytes=0, blobs=0, blob_refs=0, chunks=0, chunk_hits=0,
                        records=0, frames=0, record_raw_bytes=0, blob_logical_bytes=0,
                        blob_unique_bytes=0, chunk_raw_bytes=0, chunk_stored_bytes=0)
        hdr = dict(header or {})
        hdr.setdefault("format", "cudasnap")
        hdr.setdefault("schema", SCHEMA_VERSION)
        hdr.setdefault("created", time.time())
        hdr.setdefault("host", socket.gethostname())
        hdr.setdefault("tool_version", _tool_version())
        self.header = hdr
        self._f = open(self.path, "wb")
        try:
            self._write_raw(pack_preamble(FORMAT_VERSION))
            raw = self._packer.pack(hdr)
            if len(raw) > MAX_FRAME:
                raise ValueError("snapshot header too large")
            self._emit(KIND_HEADER, raw, 0)
            self._drain(0)
            self._f.flush()
        except BaseException:
            self._f.close()
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
            self._st["records"] += 1
            self._st["record_raw_bytes"] += len(raw)
            self._st["raw_bytes"] += len(raw)
            if len(self._buf) >= self.frame_bytes:
                self._flush_records()

    def add_blob(self, data: Buffer) -> str:
        """Store a payload (deduplicated by content); returns its blob id."""
        mv = memoryview(data).cast("B")
        bid = blob_hasher()
        bid.update(mv)
        bid_hex = bid.hexdigest()
        with self._lock:
            self._check_open()
            if bid_hex in self._blobs:
                self._ref(len(mv))
                return bid_hex
            chunks = [self._put_chunk(mv[i:i + CHUNK_SIZE]) for i in range(0, len(mv), CHUNK_SIZE)]
            return self._define_blob(bid_hex, len(mv), chunks)

    def begin_blob(self) -> BlobStream:
        self._check_open()
        return BlobStream(self)

    def flush(self) -> None:
        """Force the current records frame (and pending compressed frames) to the file."""
        with self._lock:
            if self._closed:
                return
            self._flush_records()
            self._drain(0)
            self._f.flush()

    @property
    def stats(self) -> Dict[str, int]:
        with self._lock:
            return dict(self._st)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                self._flush_records()
                self._drain(0)
                index = {
                    "frames": self._frames,
                    "chunks": self._chunk_off,
                    "blobs": self._blobs,
                    "records": self._st["records"],
                    "stats": {k: v for k, v in self._st.items()},
                }
                raw = self._packer.pack(index)
                if len(raw) > MAX_FRAME:  # pragma: no cover - needs ~1M frames
                    raise ValueError("index too large for one frame")
                off = self._f.tell()
                head, stored, _ = _encode_frame(KIND_INDEX, raw, 0, self.level)
                self._write_raw(head)
                self._write_raw(stored)
                self._write_raw(TRAILER.pack(TRAILER_MAGIC, off, xxh64(stored)))
                self._f.flush()
            finally:
                self._closed = True
                if self._pool is not None:
                    self._pool.shutdown(wait=True)
                self._f.close()

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
                if self._pool is not None:
                    self._pool.shutdown(wait=True)
                self._f.close()

    def __enter__(self) -> "SnapshotWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
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

    def _put_chunk(self, data: Buffer) -> str:
        digest = chunk_digest(data)
        cid = digest.hex()
        with self._lock:
            self._check_open()
            if cid in self._chunk_known:
                self._st["chunk_hits"] += 1
                return cid
            self._chunk_known.add(cid)
            self._st["chunks"] += 1
            self._st["chunk_raw_bytes"] += len(data)
            payload = b"".join((digest, data))       # one copy: caller may reuse its buffer
            self._emit(KIND_CHUNK, payload, 0, cid)
        return cid

    def _flush_records(self) -> None:
        if not self._buf:
            return
        raw, count = bytes(self._buf), self._buf_count
        self._buf = bytearray()
        self._buf_count = 0
        self._emit(KIND_RECORDS, raw, count)

    def _emit(self, kind: int, raw, count: int, cid: Optional[str] = None) -> None:
        if self._pool is None:
            self._write_frame(kind, _encode_frame(kind, raw, count, self.level), cid)
            return
        fut = self._pool.submit(_encode_frame, kind, raw, count, self.level)
        self._pending.append((kind, fut, cid))
        self._drain(self._max_pending)

    def _drain(self, keep: int) -> None:
        while len(self._pending) > keep:
            kind, fut, cid = self._pending.popleft()
            self._write_frame(kind, fut.result(), cid)

    def _write_frame(self, kind: int, encoded: Tuple[bytes, bytes, int], cid: Optional[str]) -> None:
        head, stored, raw_len = encoded
        off = self._f.tell()
        self._write_raw(head)
        self._write_raw(stored)
        self._f.flush()      # complete frames reach the OS: a crash keeps them
        self._frames.append([off, kind, len(stored)])
        self._st["frames"] += 1
        if kind == KIND_CHUNK and cid is not None:
            self._chunk_off[cid] = off
            self._st["chunk_stored_bytes"] += len(stored) + FRAME_SIZE

    def _write_raw(self, b: bytes) -> None:
        self._f.write(b)
        self._st["stored_bytes"] += len(b)


def _tool_version() -> str:
    try:
        from importlib.metadata import version
        return version("cudasnap")
    except Exception:
        return "0.1.0"
