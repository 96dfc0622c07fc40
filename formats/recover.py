"""repair(): rewrite a snapshot left without an index (crash, kill -9, full disk).

Every complete, verified frame is copied byte for byte (no recompression); a new index
frame and trailer are appended. In place (via a temp file + rename) when out is None.
"""
from __future__ import annotations

import os
import tempfile
from typing import Any, Dict, Optional

from .container import (
    FORMAT_VERSION, FRAME_SIZE, KIND_CHUNK, KIND_INDEX, KIND_RECORDS, MAX_FRAME, TRAILER,
    TRAILER_MAGIC, SnapshotError, encode_payload, new_packer, pack_frame_header, pack_preamble,
    parse_frame_header, xxh64,
)
from .reader import SnapshotReader

_COPY_PIECE = 8 << 20


def repair(path, out=None) -> Dict[str, Any]:
    """Rewrite `path` with an index. Returns a summary dict:
    {path, out, was_truncated, frames, records, blobs, chunks, lost_bytes, bytes_before, bytes_after}."""
    src = os.fspath(path)
    r = SnapshotReader(src)
    if not r.truncated:
        try:
            r.verify()
        except SnapshotError:       # indexed but damaged: recover by scanning instead
            r.close()
            r = SnapshotReader(src, scan=True)
    dst = os.fspath(out) if out is not None else src
    try:
        st = r.stats
        summary: Dict[str, Any] = {
            "path": src, "out": dst, "was_truncated": r.truncated,
            "frames": len(r._frames), "records": st["records"], "blobs": st["blobs"],
            "chunks": st["chunks"], "lost_bytes": r.lost_bytes, "bytes_before": r.file_size,
        }
        d = os.path.dirname(os.path.abspath(dst)) or "."
        fd, tmp = tempfile.mkstemp(prefix=".cusnap-repair-", suffix=".tmp", dir=d)
        try:
            with os.fdopen(fd, "wb") as f:
                _rewrite(r, f)
                f.flush()
                if out is None:          # replacing the original: make the new bytes durable first
                    os.fsync(f.fileno())
            os.replace(tmp, dst)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as e:
        raise SnapshotError(f"{dst}: cannot write repaired snapshot ({e.strerror or e})") from None
    finally:
        r.close()
    summary["bytes_after"] = os.path.getsize(dst)
    return summary


def _rewrite(r: SnapshotReader, f) -> None:
    f.write(pack_preamble(FORMAT_VERSION))
    frames = []
    chunks: Dict[str, int] = {}
    offset_map: Dict[int, int] = {}
    stats = {"records": 0, "frames": 0, "record_raw_bytes": 0, "chunk_raw_bytes": 0,
             "chunk_stored_bytes": 0}
    for fr in r._frames:
        head = r._read_at(fr.offset, FRAME_SIZE)
        kind, codec, raw_len, comp_len, digest, count = parse_frame_header(head, r.path, fr.offset)
        new_off = f.tell()
        offset_map[fr.offset] = new_off
        f.write(head)
        pos, left = fr.offset + FRAME_SIZE, comp_len
        while left > 0:
            piece = r._read_at(pos, min(left, _COPY_PIECE))
            if not piece:
                raise SnapshotError(f"{r.path}: offset {fr.offset}: file changed during repair")
            f.write(piece)
            pos += len(piece)
            left -= len(piece)
        frames.append([new_off, kind, comp_len])
        stats["frames"] += 1
        if kind == KIND_RECORDS:
            stats["records"] += count
            stats["record_raw_bytes"] += raw_len
        elif kind == KIND_CHUNK:
            stats["chunk_raw_bytes"] += raw_len - 16
            stats["chunk_stored_bytes"] += comp_len + FRAME_SIZE
    for cid, off in r._chunks.items():
        chunks[cid] = offset_map[off]
    blobs = {bid: [size, list(cl)] for bid, (size, cl) in r._blobs.items()}
    logical = r.stats["blob_logical_bytes"]
    stats.update(blobs=len(blobs), chunks=len(chunks), blob_logical_bytes=logical,
                 blob_unique_bytes=sum(s for s, _ in blobs.values()), repaired=True)
    index = {"frames": frames, "chunks": chunks, "blobs": blobs, "records": stats["records"],
             "stats": stats}
    raw = new_packer().pack(index)
    if len(raw) > MAX_FRAME:  # pragma: no cover
        raise SnapshotError(f"{r.path}: index too large")
    codec, stored = encode_payload(raw, 3)
    off = f.tell()
    f.write(pack_frame_header(KIND_INDEX, codec, len(raw), stored, 0))
    f.write(stored)
    f.write(TRAILER.pack(TRAILER_MAGIC, off, xxh64(stored)))
