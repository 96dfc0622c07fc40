"""Reading one blob chunk straight into a caller's buffer, from several threads at once: the
read-ahead of big host-to-device copies (replay/staging.py) fills page-locked slots with it."""
from __future__ import annotations

import os
from typing import Optional, Tuple

import xxhash
import zstandard

from .container import (
    CHUNK_ID_LEN, CHUNK_SIZE, CODEC_ZSTD, FRAME_SIZE, KIND_CHUNK, KIND_NAMES, SnapshotError, decompressor,
    chunk_digest, parse_frame_header, snap_error, xxh64,
)


def chunk_into(r, cid: str, out, scratch: Optional[bytearray] = None) -> Tuple[int, Optional[bytearray]]:
    """Read, verify and decompress chunk `cid` straight into the writable buffer `out`
    (>= CHUNK_SIZE bytes); returns (data length, scratch). Thread-safe (positioned reads on
    the file, no shared state), so several threads may fill buffers at once; zstd and the
    reads release the GIL. `scratch` (returned, reusable) holds a compressed payload."""
    off = r._chunks.get(cid)
    if off is None:
        raise SnapshotError(f"{r.path}: unknown chunk {str(cid)[:40]}")
    fd = r._f.fileno()
    try:
        head = os.pread(fd, FRAME_SIZE, off)
    except OSError as e:
        raise snap_error(r.path, off, f"read failed ({e})") from None
    kind, codec, raw_len, comp_len, digest, _ = parse_frame_header(head, r.path, off)
    if kind != KIND_CHUNK:
        raise snap_error(r.path, off, f"expected a chunk frame, found {KIND_NAMES[kind]}")
    n = raw_len - CHUNK_ID_LEN
    mv = memoryview(out).cast("B")
    if n > len(mv) or off + FRAME_SIZE + comp_len > r.file_size:
        raise snap_error(r.path, off, "chunk frame larger than a chunk")
    ident = bytearray(CHUNK_ID_LEN)
    try:
        if codec != CODEC_ZSTD:
            got = os.preadv(fd, [ident, mv[:n]], off + FRAME_SIZE)
            if got != comp_len:
                raise snap_error(r.path, off, "truncated frame payload")
            if digest is not None:
                h = xxhash.xxh64()
                h.update(ident)
                h.update(mv[:n])
                if h.intdigest() != digest:
                    raise snap_error(r.path, off, "frame payload checksum mismatch")
        else:
            if scratch is None or len(scratch) < comp_len:
                scratch = bytearray(max(comp_len, CHUNK_SIZE + 4096))
            sv = memoryview(scratch)[:comp_len]
            if os.preadv(fd, [sv], off + FRAME_SIZE) != comp_len:
                raise snap_error(r.path, off, "truncated frame payload")
            if xxh64(sv) != digest:
                raise snap_error(r.path, off, "frame payload checksum mismatch")
            try:
                size = zstandard.frame_content_size(sv)
            except Exception:
                raise snap_error(r.path, off, "frame payload is not a valid zstd frame") from None
            if size != raw_len:
                raise snap_error(r.path, off, f"zstd content size {size} != declared raw length {raw_len}")
            try:
                rd = decompressor().stream_reader(sv, read_across_frames=False)
                got = rd.readinto(ident)
                while got < raw_len:
                    step = rd.readinto(mv[got - CHUNK_ID_LEN:n]) if got >= CHUNK_ID_LEN else 0
                    if step <= 0:
                        break
                    got += step
                extra = rd.read(1)
            except zstandard.ZstdError as e:
                raise snap_error(r.path, off, f"zstd decompression failed ({e})") from None
            if got != raw_len or extra:
                raise snap_error(r.path, off, f"decompressed size differs from the declared {raw_len}")
    except OSError as e:
        raise snap_error(r.path, off, f"read failed ({e})") from None
    if bytes(ident).hex() != cid:
        raise snap_error(r.path, off, "chunk id does not match the index")
    if chunk_digest(mv[:n]) != ident:
        raise snap_error(r.path, off, "chunk content checksum mismatch")
    return n, scratch
