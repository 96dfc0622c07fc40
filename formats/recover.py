"""repair(): rewrite a snapshot left without an index (crash, kill -9, full disk).

Every complete, verified frame is copied byte for byte (no recompression); the chunk frames
of segment files a dead writer left beside it (formats/writer.py) follow; a new index frame
and trailer are appended. In place (via a temp file + rename, then the segments are
removed) when out is None.
"""
from __future__ import annotations

import os
import tempfile
from typing import Any, Dict

from .container import (
    FORMAT_VERSION, FRAME_SIZE, KIND_CHUNK, KIND_INDEX, KIND_RECORDS, MAX_FRAME, TRAILER,
    TRAILER_MAGIC, SnapshotError, encode_payload, new_packer, pack_frame_header, pack_preamble,
    parse_frame_header, xxh64,
)
from .reader import SnapshotReader
from .segments import segment_paths

_COPY_PIECE = 8 << 20


def repair(path, out=None) -> Dict[str, Any]:
    """Rewrite `path` with an index. Returns a summary dict:
    {path, out, was_truncated, frames, records, blobs, chunks, lost_bytes, bytes_before, bytes_after}."""
    src = os.fspath(path)
    segs = []
    for p in segment_paths(src):
        try:
            segs.append(SnapshotReader(p, segment=True))
        except SnapshotError:           # not even a preamble: it holds nothing to recover
            pass
    known = {cid for sg in segs for cid in sg._chunks}
    r = SnapshotReader(src, segment_chunks=known)
    if not r.truncated:
        for sg in segs:                 # an indexed file has no segments of its own
            sg.close()
        segs = []
        try:
            r.verify()
        except SnapshotError:       # indexed but damaged: recover by scanning instead
            r.close()
            r = SnapshotReader(src, scan=True, segment_chunks=known)
    dst = os.fspath(out) if out is not None else src
    try:
        st = r.stats
        summary: Dict[str, Any] = {
            "path": src, "out": dst, "was_truncated": r.truncated,
            "frames": len(r._frames), "records": st["records"], "blobs": st["blobs"],
            "chunks": st["chunks"] + len(known - set(r._chunks)), "lost_bytes": r.lost_bytes,
            "bytes_before": r.file_size + sum(sg.file_size for sg in segs), "segments": len(segs),
        }
        d = os.path.dirname(os.path.abspath(dst)) or "."
        fd, tmp = tempfile.mkstemp(prefix=".cusnap-repair-", suffix=".tmp", dir=d)
        try:
            with os.fdopen(fd, "wb") as f:
                _rewrite(r, segs, f)
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
        for sg in segs:
            sg.close()
    if out is None:
        for sg in segs:                 # folded in: the file is whole without them
            try:
                os.unlink(sg.path)
            except OSError:
                pass
    summary["bytes_after"] = os.path.getsize(dst)
    return summary


def _copy_frame(src: SnapshotReader, fr, f) -> tuple:
    """Copy one verified frame byte for byte; returns (new offset, kind, raw_len, comp_len, count)."""
    head = src._read_at(fr.offset, FRAME_SIZE)
    kind, codec, raw_len, comp_len, digest, count = parse_frame_header(head, src.path, fr.offset)
    new_off = f.tell()
    f.write(head)
    pos, left = fr.offset + FRAME_SIZE, comp_len
    while left > 0:
        piece = src._read_at(pos, min(left, _COPY_PIECE))
        if not piece:
            raise SnapshotError(f"{src.path}: offset {fr.offset}: file changed during repair")
        f.write(piece)
        pos += len(piece)
        left -= len(piece)
    return new_off, kind, raw_len, comp_len, count


def _rewrite(r: SnapshotReader, segs, f) -> None:
    f.write(pack_preamble(FORMAT_VERSION))
    frames = []
    chunks: Dict[str, int] = {}
    offset_map: Dict[int, int] = {}
    stats = {"records": 0, "frames": 0, "record_raw_bytes": 0, "chunk_raw_bytes": 0,
             "chunk_stored_bytes": 0}

    def add(src: SnapshotReader, fr) -> int:
        new_off, kind, raw_len, comp_len, count = _copy_frame(src, fr, f)
        frames.append([new_off, kind, comp_len])
        stats["frames"] += 1
        if kind == KIND_RECORDS:
            stats["records"] += count
            stats["record_raw_bytes"] += raw_len
        elif kind == KIND_CHUNK:
            stats["chunk_raw_bytes"] += raw_len - 16
            stats["chunk_stored_bytes"] += comp_len + FRAME_SIZE
        return new_off

    for fr in r._frames:
        offset_map[fr.offset] = add(r, fr)
    for cid, off in r._chunks.items():
        chunks[cid] = offset_map[off]
    for sg in segs:
        at = {fr.offset: fr for fr in sg._frames}
        for cid, off in sg._chunks.items():
            if cid not in chunks:
                chunks[cid] = add(sg, at[off])
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
