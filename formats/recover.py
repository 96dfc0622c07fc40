"""repair(): rewrite a damaged snapshot (crash, kill -9, full disk, flipped bytes) with an index.

The file is scanned with resync (reader.py): every frame that verifies is kept, a corrupt
stretch is stepped over rather than ending the scan, so repair keeps at least every record
a plain read finds. Kept frames are copied byte for byte (no recompression); the chunk frames
of segment files a dead writer left beside it (formats/writer.py) follow; then a `repair`
record saying what was lost (SCHEMA.md), so the loss stays visible once the file has an index
again, and a new index and trailer. The new file keeps the original's mode. In place, the
original stays beside it as NAME.orig (its segments as NAME.orig.segK). An intact file is
left alone.
"""
from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time
from typing import Any, Dict, List, Optional

from .container import (
    FORMAT_VERSION, FRAME_SIZE, KIND_CHUNK, KIND_INDEX, KIND_RECORDS, MAX_FRAME, TRAILER,
    TRAILER_MAGIC, SnapshotError, encode_payload, new_packer, pack_frame_header, pack_preamble,
    parse_frame_header, xxh64,
)
from .console import tool_version
from .reader import SnapshotReader
from .segments import segment_paths

_COPY_PIECE = 8 << 20
MAX_GAPS_RECORDED = 64      # stretches listed in a repair record (counts cover them all)


def repair(path, out=None) -> Dict[str, Any]:
    """Rewrite `path` (to `out`, else in place). Returns a summary dict: {path, out, intact,
    was_truncated, frames, records, blobs, chunks, segments, lost_bytes, lost_records,
    unknown_gaps, gaps, lost_blobs, bytes_before, bytes_after, orig}. `intact`: nothing was
    wrong and nothing was written. Raises SnapshotError when the file cannot be read at all
    (no preamble or header frame) or the result cannot be written."""
    src = os.fspath(path)
    in_place = out is None or _same_file(src, os.fspath(out))
    dst = src if in_place else os.fspath(out)
    lock = _lock(src) if in_place else None
    try:
        return _repair(src, dst, in_place)
    finally:
        if lock is not None:
            os.close(lock)


def _lock(src: str) -> Optional[int]:
    """An in-place repair holds the file: a second one is refused (it would take the first's
    result for the original), and one that waited finds the file it opened replaced."""
    import errno
    import fcntl
    try:
        fd = os.open(src, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None                     # the reader names it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SnapshotError(f"{src} is being repaired by another process: run again once it is done") from None
    except OSError as e:
        if e.errno not in (errno.ENOLCK, errno.EINVAL, errno.EOPNOTSUPP):
            os.close(fd)
            raise
        return fd
    st, now = os.fstat(fd), None
    try:
        now = os.stat(src)
    except OSError:
        pass
    if now is None or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise SnapshotError(f"{src} was replaced by another process while this repair started: run again")
    return fd


def _repair(src: str, dst: str, in_place: bool) -> Dict[str, Any]:
    segs = []
    for p in segment_paths(src):
        try:
            segs.append(SnapshotReader(p, segment=True))
        except SnapshotError:           # not even a preamble: it holds nothing to recover
            pass
    known = {cid for sg in segs for cid in sg._chunks}
    try:
        r = SnapshotReader(src, segment_chunks=known)
        indexed = not r.truncated
        if indexed:
            try:
                r.verify()
                r.summary()             # a malformed summary is damage too: rebuilt without it
                intact = True
            except SnapshotError:       # indexed but damaged: recover by scanning instead
                intact = False
            if intact:
                r.close()
                for sg in segs:
                    sg.close()
                return {"path": src, "out": dst, "intact": True, "was_truncated": False,
                        "frames": r.recovered_frames, "lost_bytes": 0}
        r.close()
        r = SnapshotReader(src, resync=True, segment_chunks=known)
    except BaseException:
        for sg in segs:
            sg.close()
        raise
    orig = src + ".orig" if in_place else None
    try:
        if orig is not None and os.path.lexists(orig):
            raise SnapshotError(f"{orig} already exists (the original of an earlier repair): "
                                f"move it away, or write elsewhere with -o")
        mode = stat.S_IMODE(os.stat(src).st_mode)
        data_gaps = [g for g in r.gaps if g["kind"] != "index"]
        st = r.stats
        summary: Dict[str, Any] = {
            "path": src, "out": dst, "intact": False, "was_truncated": not indexed,
            "frames": len(r._frames), "records": st["records"], "blobs": st["blobs"],
            "chunks": st["chunks"] + len(known - set(r._chunks)), "segments": len(segs),
            "lost_bytes": r.lost_bytes,
            "lost_records": sum(g["records"] or 0 for g in data_gaps),
            "unknown_gaps": sum(1 for g in data_gaps if g["kind"] is None),
            "gaps": list(r.gaps), "lost_blobs": len(r.lost_blobs),
            "bytes_before": r.file_size + sum(sg.file_size for sg in segs), "orig": orig,
        }
        note = {"k": "repair", "t": time.time(), "tool_version": tool_version(),
                "bytes_before": summary["bytes_before"], "lost_bytes": r.lost_bytes,
                "lost_records": summary["lost_records"], "unknown_gaps": summary["unknown_gaps"],
                "lost_blobs": summary["lost_blobs"], "segments": len(segs), "gap_count": len(data_gaps),
                "gaps": [[g["offset"], g["length"], g["kind"], g["reason"]]
                         for g in data_gaps[:MAX_GAPS_RECORDED]]}
        d = os.path.dirname(os.path.abspath(dst)) or "."
        fd, tmp = tempfile.mkstemp(prefix=".cusnap-repair-", suffix=".tmp", dir=d)
        kept = False
        try:
            with os.fdopen(fd, "wb") as f:
                _rewrite(r, segs, f, note)
                f.flush()
                os.fchmod(f.fileno(), mode)
                if in_place:             # replacing the original: make the new bytes durable first
                    os.fsync(f.fileno())
            if in_place:
                _keep_original(src, orig)
                kept = True
                os.replace(tmp, dst)
            else:
                from .outputs import OutputError, put_output
                try:
                    put_output(tmp, dst)      # made exclusively unless -f allowed replacing it
                except OutputError as e:
                    raise SnapshotError(str(e)) from None
        except BaseException:
            if kept and os.path.exists(tmp):     # the original was not replaced: drop its copy
                _unlink_quiet(orig)
            _unlink_quiet(tmp)
            raise
    except OSError as e:
        raise SnapshotError(f"{dst}: cannot write repaired snapshot ({e.strerror or e})") from None
    finally:
        r.close()
        for sg in segs:
            sg.close()
    if in_place:
        for k, sg in enumerate(segs, 1):      # folded in; they belong with the original now
            try:
                os.replace(sg.path, f"{orig}.seg{k}")
            except OSError:             # left beside an indexed file, which ignores it
                pass
    summary["bytes_after"] = os.path.getsize(dst)
    return summary


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def _unlink_quiet(p: str) -> None:
    try:
        os.unlink(p)
    except OSError:
        pass


def _keep_original(src: str, orig: str) -> None:
    """src stays in place until the repaired file replaces it: a second name, else a copy."""
    try:
        os.link(src, orig)
    except FileExistsError:             # another writer made it meanwhile: never overwrite it
        raise SnapshotError(f"{orig} appeared while repairing (another repair?): the file was left as it was") from None
    except OSError:
        shutil.copy2(src, orig)


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


def _rewrite(r: SnapshotReader, segs, f, note: Dict[str, Any]) -> None:
    f.write(pack_preamble(FORMAT_VERSION))
    frames: List[List[int]] = []
    chunks: Dict[str, int] = {}
    offset_map: Dict[int, int] = {}
    stats = {"records": 0, "frames": 0, "record_raw_bytes": 0, "chunk_raw_bytes": 0,
             "chunk_stored_bytes": 0}

    def account(new_off: int, kind: int, raw_len: int, comp_len: int, count: int) -> int:
        frames.append([new_off, kind, comp_len])
        stats["frames"] += 1
        if kind == KIND_RECORDS:
            stats["records"] += count
            stats["record_raw_bytes"] += raw_len
        elif kind == KIND_CHUNK:
            stats["chunk_raw_bytes"] += raw_len - 16
            stats["chunk_stored_bytes"] += comp_len + FRAME_SIZE
        return new_off

    def add(src: SnapshotReader, fr) -> int:
        return account(*_copy_frame(src, fr, f))

    for fr in r._frames:
        offset_map[fr.offset] = add(r, fr)
    for cid, off in r._chunks.items():
        chunks[cid] = offset_map[off]
    for sg in segs:
        at = {fr.offset: fr for fr in sg._frames}
        for cid, off in sg._chunks.items():
            if cid not in chunks:
                chunks[cid] = add(sg, at[off])
    # the loss, as a record of its own: it outlives this index (and any later repair)
    raw = new_packer().pack(note)
    codec, stored = encode_payload(raw, 3)
    off = f.tell()
    f.write(pack_frame_header(KIND_RECORDS, codec, len(raw), stored, 1))
    f.write(stored)
    account(off, KIND_RECORDS, len(raw), len(stored), 1)
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
