"""SnapshotReader: reads a .cusnap file through its index, or by scanning (recovery).

Untrusted input: every size is bounded before allocating, every checksum verified, and
every problem raised as SnapshotError with a one-line 'file: offset N: problem' message.
"""
from __future__ import annotations

import mmap
import os
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from .container import (
    CHUNK_ID_LEN, CHUNK_SIZE, CODEC_ZSTD, FRAME_MAGIC, FRAME_SIZE, KIND_CHUNK, KIND_HEADER, KIND_INDEX,
    KIND_NAMES, KIND_RECORDS, MAX_FRAME, PREAMBLE_SIZE, TRAILER, TRAILER_MAGIC, TRAILER_SIZE,
    SnapshotError, check_schema, decompressor, check_preamble, chunk_digest, decode_payload,
    chunk_count_ok, iter_record_payload, parse_frame_header, record_list, snap_error, unpack_one, xxh64,
)
from . import native
from .inputs import input_problem
from .blobrefs import frame_blob_refs
from .chunkio import chunk_into
from .segments import segment_paths
from .summary import check_map

_HEX = set("0123456789abcdef")
# A scan reads every records frame; up to this many of its records are kept for the first
# records() pass (info, dump and replay of a file without an index make exactly one), which
# then reads them instead of reading the frame again: decoded, or the payload when the C walk
# (formats/native.py) read it. Each frame's are handed out once.
SCAN_KEEP_RECORDS = 200_000


def _is_hex_id(s: Any) -> bool:
    return isinstance(s, str) and len(s) == 32 and set(s) <= _HEX


def _is_uint(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < (1 << 63)


class Frame:
    __slots__ = ("offset", "kind", "comp_len")

    def __init__(self, offset: int, kind: int, comp_len: int):
        self.offset, self.kind, self.comp_len = offset, kind, comp_len

    @property
    def end(self) -> int:
        return self.offset + FRAME_SIZE + self.comp_len


class SnapshotReader:
    """A .cusnap snapshot opened for reading (untrusted input: every problem is a SnapshotError
    with a one-line 'file: offset N: problem' message). Every read path of the file (index,
    frames, blobs, recovery of a file cut short) is in this one class, about 530 lines, so that
    none of them can fail another way.

        with SnapshotReader("x.cusnap") as r:
            r.header                   # the header frame, with the "proc" record merged in
            for rec in r:              # every record in file order (as r.records())
                ...
            r.records("c")             # only the call records
            r.blob(bid)                # a payload, every chunk checked against its id
            r.check_payloads()         # every frame's checksum, without decoding (before work)

    Through the index when the file has an intact one; else by scanning from the start
    (`truncated`, `lost_bytes` then say what a crash cut off)."""

    def __init__(self, path, *, scan: bool = False, segment: bool = False,
                 segment_chunks: Optional[Iterable[str]] = None, resync: bool = False):
        """scan=True ignores any index and recovers by scanning. segment=True reads a segment
        file (a preamble, then chunk frames: formats/writer.py) by scanning. A file without an
        index whose writer left segments beside it is refused (`cudasnap repair` folds
        them in) unless segment_chunks names the chunk ids those segments hold.
        resync=True (implies scan; what repair uses) steps over a corrupt stretch to the next
        frame that verifies instead of stopping there, and keeps records frames whose blobs
        lost a chunk (leaving those blobs out): `gaps` lists each stretch skipped, `lost_blobs`
        the blobs left out."""
        self._resync = bool(resync)
        self._force_scan = bool(scan) or self._resync
        self._map: Optional[mmap.mmap] = None
        self._segment = segment
        self._segment_chunks = set(segment_chunks) if segment_chunks is not None else None
        self.path = os.fspath(path)
        self.name = self.path
        why = input_problem(self.path)      # before open(): a FIFO would block it
        if why:
            raise SnapshotError(why)
        try:
            self._f = open(self.path, "rb")
            self.file_size = os.fstat(self._f.fileno()).st_size
        except OSError as e:
            raise SnapshotError(f"{self.path}: cannot open ({e.strerror or e})") from None
        try:
            self._open()
        except SnapshotError:
            self.close()
            raise
        except Exception as e:  # pragma: no cover - defensive: never a traceback
            self.close()
            raise SnapshotError(f"{self.path}: unreadable snapshot ({type(e).__name__}: {e})") from None

    # ------------------------------------------------------------------ opening
    def _open(self) -> None:
        self.version = check_preamble(self._read_at(0, PREAMBLE_SIZE), self.path)
        self.truncated = True
        self.lost_bytes = 0
        self.recovered_frames = 0
        self.index: Optional[Dict[str, Any]] = None
        self._frames: List[Frame] = []
        self._chunks: Dict[str, int] = {}
        self._blobs: Dict[str, Tuple[int, List[str]]] = {}
        self._scan_blob_refs: Optional[int] = None
        self._header_merged: Optional[Dict[str, Any]] = None
        self._raw_header = {}
        self._scan_recs: Dict[int, Any] = {}      # records, or (count, payload)
        self.gaps: List[Dict[str, Any]] = []
        self.lost_blobs: List[str] = []
        if self._segment:
            self._scan()
            return
        # The header frame is required in every other mode.
        kind, payload = self._read_frame(PREAMBLE_SIZE, expect_kind=KIND_HEADER)
        hdr = unpack_one(payload, self.path, PREAMBLE_SIZE, "header frame")
        if not isinstance(hdr, dict):
            raise snap_error(self.path, PREAMBLE_SIZE, "header frame is not a map")
        self._raw_header = hdr
        check_schema(hdr.get("schema"), self.path)
        if self._force_scan or not self._load_index():
            if self._segment_chunks is None:
                segs = segment_paths(self.path)
                if segs:
                    raise SnapshotError(
                        f"{self.path}: unfinished, with {len(segs)} segment file(s) of its chunks beside it "
                        f"({os.path.basename(segs[0])}...): once its writer has stopped, run "
                        f"`cudasnap repair {self.path}` to fold them in")
            self._scan()

    def _load_index(self) -> bool:
        """Use the trailer + index when both are intact and consistent; else False."""
        size = self.file_size
        if size < PREAMBLE_SIZE + 2 * FRAME_SIZE + TRAILER_SIZE:
            return False
        magic, off, digest = TRAILER.unpack(self._read_at(size - TRAILER_SIZE, TRAILER_SIZE))
        if magic != TRAILER_MAGIC or not (PREAMBLE_SIZE < off <= size - TRAILER_SIZE - FRAME_SIZE):
            return False
        try:
            kind, payload = self._read_frame(off, expect_kind=KIND_INDEX, expect_digest=digest)
            if off + FRAME_SIZE + self._last_comp_len != size - TRAILER_SIZE:
                return False
            idx = unpack_one(payload, self.path, off, "index frame")
            frames, chunks, blobs = self._validate_index(idx, off)
        except SnapshotError:
            return False
        self.index = idx
        self._frames = frames
        self._chunks = chunks
        self._blobs = blobs
        self.truncated = False
        self.lost_bytes = 0
        self.recovered_frames = len(frames)
        self._index_offset = off
        return True

    def _validate_index(self, idx: Any, index_off: int):
        if not isinstance(idx, dict):
            raise snap_error(self.path, index_off, "index is not a map")
        raw_frames, raw_chunks, raw_blobs = idx.get("frames"), idx.get("chunks"), idx.get("blobs")
        if not isinstance(raw_frames, list) or not isinstance(raw_chunks, dict) or not isinstance(raw_blobs, dict):
            raise snap_error(self.path, index_off, "index lacks frames/chunks/blobs")
        frames: List[Frame] = []
        pos = PREAMBLE_SIZE
        for ent in raw_frames:
            if (not isinstance(ent, list) or len(ent) < 3 or not all(_is_uint(v) for v in ent[:3])):
                raise snap_error(self.path, index_off, "bad index frame entry")
            off, kind, comp = ent[0], ent[1], ent[2]
            if off != pos or kind not in (KIND_HEADER, KIND_RECORDS, KIND_CHUNK) or comp > MAX_FRAME:
                raise snap_error(self.path, index_off, "index frame list inconsistent")
            if (kind == KIND_HEADER) != (off == PREAMBLE_SIZE):
                raise snap_error(self.path, index_off, "index frame list inconsistent")
            frames.append(Frame(off, kind, comp))
            pos = off + FRAME_SIZE + comp
        if pos != index_off or not frames:
            raise snap_error(self.path, index_off, "index frame list does not cover the file")
        chunk_frames = {fr.offset for fr in frames if fr.kind == KIND_CHUNK}
        chunks: Dict[str, int] = {}
        for cid, off in raw_chunks.items():
            if not _is_hex_id(cid) or off not in chunk_frames:
                raise snap_error(self.path, index_off, "bad index chunk entry")
            chunks[cid] = off
        blobs: Dict[str, Tuple[int, List[str]]] = {}
        for bid, ent in raw_blobs.items():
            if not (_is_hex_id(bid) and isinstance(ent, list) and len(ent) >= 2):
                raise snap_error(self.path, index_off, "bad index blob entry")
            bsize, bchunks = ent[0], ent[1]
            if not (_is_uint(bsize) and isinstance(bchunks, list) and chunk_count_ok(bsize, bchunks)
                    and all(c in chunks for c in bchunks)):
                raise snap_error(self.path, index_off, "bad index blob entry")
            blobs[bid] = (bsize, list(bchunks))
        if not _is_uint(idx.get("records", 0)):
            raise snap_error(self.path, index_off, "bad index record count")
        return frames, chunks, blobs

    def _scan(self) -> None:
        """Recovery: walk frames from the start, verifying everything; stop at the first bad
        one. Blob records are checked against the chunks of the whole walk (a writer folding
        segments in puts chunk frames after the records naming them), then the frames are
        cut at the first records frame with a blob whose chunks are nowhere."""
        size = self.file_size
        frames: List[Frame] = []
        pos = PREAMBLE_SIZE
        blob_recs: List[Tuple[int, List[Dict[str, Any]], Dict[str, int]]] = []
        kept = 0
        walk = native.scan_walk()
        while pos < size:
            try:
                if pos + FRAME_SIZE > size:
                    raise snap_error(self.path, pos, "incomplete frame header")
                kind, payload = self._read_frame(pos)
                if self._segment and kind != KIND_CHUNK:
                    raise snap_error(self.path, pos, "segment file holds a frame other than a chunk")
                if kind == KIND_HEADER and pos != PREAMBLE_SIZE:
                    raise snap_error(self.path, pos, "second header frame")
                if kind == KIND_INDEX:
                    break
                if kind == KIND_RECORDS:
                    count = self._last_count
                    got = native.scan_frame(walk, payload, count, self.path, pos, frame_blob_refs) if walk else None
                    if got is None:        # the Python way: decoded records are kept
                        recs = record_list(payload, count, self.path, pos)
                        got = [r for r in recs if r.get("k") == "b"], frame_blob_refs(recs)
                    else:                  # walked in C: the payload is kept
                        recs = (count, payload)
                    blob_recs.append((len(frames), *got))
                    if kept + count <= SCAN_KEEP_RECORDS:
                        self._scan_recs[pos] = recs
                        kept += count
                elif kind == KIND_CHUNK:
                    cid = self._chunk_id_of(payload, pos)
                    self._chunks.setdefault(cid, pos)
            except SnapshotError as e:
                if not self._resync:
                    break
                gap = self._gap(pos, e)
                self.gaps.append(gap)
                pos += gap["length"]
                continue
            fr = Frame(pos, kind, self._last_comp_len)
            frames.append(fr)
            pos = fr.end
        known = self._segment_chunks or set()
        refs_all: Dict[str, int] = {}
        for at, brecs, refs in blob_recs:
            newblobs = {}
            bad: List[str] = []
            for rec in brecs:
                bid, bsize, bchunks = rec.get("id"), rec.get("size"), rec.get("chunks")
                if not (_is_hex_id(bid) and _is_uint(bsize) and isinstance(bchunks, list)
                        and chunk_count_ok(bsize, bchunks)
                        and all(c in self._chunks or c in known for c in bchunks)):
                    bad.append(str(bid))
                    continue
                newblobs[bid] = (bsize, list(bchunks))
            if bad and not self._resync:  # a blob whose chunks are missing: the prefix ends here
                pos = frames[at].offset
                frames = frames[:at]
                self._chunks = {c: o for c, o in self._chunks.items() if o < pos}
                self._scan_recs = {o: v for o, v in self._scan_recs.items() if o < pos}
                break
            self.lost_blobs.extend(bad)
            self._blobs.update(newblobs)
            for b, n in refs.items():
                refs_all[b] = refs_all.get(b, 0) + n
        self._frames = frames
        self.recovered_frames = len(frames)
        if self._resync:       # an old index and trailer hold no data: only data gaps count
            self.lost_bytes = sum(g["length"] for g in self.gaps if g["kind"] != "index")
        else:
            self.lost_bytes = size - pos
        self._scan_blob_refs = sum(s * max(1, refs_all.get(b, 0)) for b, (s, _) in self._blobs.items())

    def _next_frame(self, start: int) -> Optional[int]:
        """Offset of the first frame at or after start that reads and verifies (resync)."""
        if self._map is None:
            self._map = mmap.mmap(self._f.fileno(), 0, access=mmap.ACCESS_READ)
        pos = start
        while True:
            pos = self._map.find(FRAME_MAGIC, pos)
            if pos < 0 or pos + FRAME_SIZE > self.file_size:
                return None
            try:
                self._read_frame(pos)
                return pos
            except SnapshotError:
                pos += 1

    def _gap(self, off: int, err: SnapshotError) -> Dict[str, Any]:
        """The stretch a resync steps over at off, why, and what it held. A frame whose header
        still reads (it is checksummed) is skipped by its own length and named by its kind;
        otherwise the stretch runs to the next frame that verifies, its kind unknown (None).
        An old index and its trailer are kind "index": not data."""
        kind = records = None
        try:
            k, _, _, comp_len, _, count = parse_frame_header(self._read_at(off, FRAME_SIZE), self.path, off)
            kind, records = KIND_NAMES[k], (count if k == KIND_RECORDS else None)
            end = min(off + FRAME_SIZE + comp_len, self.file_size)
        except SnapshotError:
            nxt = self._next_frame(off + 1)
            end = self.file_size if nxt is None else nxt
            tail = self._read_at(self.file_size - TRAILER_SIZE, TRAILER_SIZE)
            if len(tail) == TRAILER_SIZE and TRAILER.unpack(tail)[0] == TRAILER_MAGIC and \
                    (TRAILER.unpack(tail)[1] == off or off == self.file_size - TRAILER_SIZE):
                kind = "index"           # the old index (its header broke) or the trailer itself
        reason, prefix = str(err), f"{self.path}: offset {off}: "
        if reason.startswith(prefix):
            reason = reason[len(prefix):]
        return {"offset": off, "length": end - off, "reason": reason, "kind": kind, "records": records}

    def _chunk_id_of(self, stored: bytes, off: int) -> str:
        # payload is still compressed here: decompress only its first 16 bytes
        if self._last_codec == CODEC_ZSTD:
            try:
                head = decompressor().stream_reader(stored, read_across_frames=False).read(CHUNK_ID_LEN)
            except Exception:
                raise snap_error(self.path, off, "chunk frame: zstd decompression failed") from None
        else:
            head = stored[:CHUNK_ID_LEN]
        if len(head) != CHUNK_ID_LEN:
            raise snap_error(self.path, off, "chunk frame shorter than its chunk id")
        return bytes(head).hex()

    # ------------------------------------------------------------------ raw frame access
    def _read_at(self, off: int, n: int) -> bytes:
        try:
            self._f.seek(off)
            return self._f.read(n)
        except (OSError, ValueError) as e:
            raise snap_error(self.path, off, f"read failed ({e})") from None

    def _read_frame(self, off: int, expect_kind: Optional[int] = None,
                    expect_digest: Optional[int] = None, decode: Optional[bool] = None) -> Tuple[int, bytes]:
        """Read + verify one frame. Returns (kind, payload); chunk payloads stay stored
        (compressed) during scans unless decode is True; others are decoded."""
        head = self._read_at(off, FRAME_SIZE)
        if len(head) < FRAME_SIZE:
            raise snap_error(self.path, off, "truncated frame header")
        kind, codec, raw_len, comp_len, digest, count = parse_frame_header(head, self.path, off)
        if expect_kind is not None and kind != expect_kind:
            raise snap_error(self.path, off, f"expected a {KIND_NAMES[expect_kind]} frame, found {KIND_NAMES[kind]}")
        if off + FRAME_SIZE + comp_len > self.file_size:
            raise snap_error(self.path, off, "truncated frame payload")
        stored = self._read_at(off + FRAME_SIZE, comp_len)
        if len(stored) != comp_len:
            raise snap_error(self.path, off, "truncated frame payload")
        if digest is None:           # FLAG_ID_SUM: a stored chunk checked by its chunk id
            if expect_digest is not None or chunk_digest(memoryview(stored)[CHUNK_ID_LEN:]) != stored[:CHUNK_ID_LEN]:
                raise snap_error(self.path, off, "chunk content checksum mismatch")
        elif xxh64(stored) != digest or (expect_digest is not None and digest != expect_digest):
            raise snap_error(self.path, off, "frame payload checksum mismatch")
        self._last_id_checked = digest is None
        self._last_comp_len, self._last_count, self._last_codec = comp_len, count, codec
        if decode is None:
            decode = kind != KIND_CHUNK
        if not decode:
            return kind, stored
        return kind, decode_payload(stored, codec, raw_len, self.path, off)

    # ------------------------------------------------------------------ public API
    @property
    def header(self) -> Dict[str, Any]:
        if self._header_merged is None:
            h = dict(self._raw_header)
            for rec in self.records("proc"):
                h["proc"] = rec
                break
            self._header_merged = h
        return self._header_merged

    def summary(self) -> Optional[Dict[str, Any]]:
        """The index's record summary (formats/summary.py), None when the file has none (no
        index: a crash; or written by a repair or an older cudasnap): callers then scan.
        A summary that is there but malformed raises SnapshotError."""
        if self.index is None or "summary" not in self.index:
            return None
        sm = self.index["summary"]
        why = check_map(sm)
        if why is not None:
            raise snap_error(self.path, self._index_offset,
                             f"index summary is malformed ({why}); `cudasnap repair` rebuilds the index")
        return sm

    @property
    def raw_header(self) -> Dict[str, Any]:
        return dict(self._raw_header)

    def record_payloads(self, keep: bool = False) -> Iterator[Tuple[int, int, bytes, Optional[List[Dict[str, Any]]], bool]]:
        """(offset, count, payload, records, checked) of every records frame in file order:
        its decompressed payload and record count, its records when a scan kept them decoded
        (else None: the caller decodes, record_list or formats/native.py), and whether the
        C walk already checked the payload (native.Walk.run). What the scan kept is handed
        out once, unless keep."""
        for fr in self._frames:
            if fr.kind != KIND_RECORDS:
                continue
            kept = (self._scan_recs.get if keep else self._scan_recs.pop)(fr.offset, None) if self._scan_recs else None
            if isinstance(kept, list):
                yield fr.offset, len(kept), b"", kept, False
            elif kept is not None:         # the C walk of the scan read it, or readahead.first_record
                yield fr.offset, kept[0], kept[1], None, kept[2] if len(kept) > 2 else True
            else:
                kind, payload = self._read_frame(fr.offset, expect_kind=KIND_RECORDS)
                if self._last_comp_len != fr.comp_len:
                    raise snap_error(self.path, fr.offset, "frame length disagrees with the index")
                yield fr.offset, self._last_count, payload, None, False

    def records(self, kinds: Optional[Iterable[str]] = None) -> Iterator[Dict[str, Any]]:
        """Every record in file order (optionally only those whose 'k' is in kinds)."""
        if isinstance(kinds, str):
            kinds = (kinds,)
        want = set(kinds) if kinds is not None else None
        # the C walk pays where it passes over the call records; wanting those, one decode is cheaper
        walk = native.kinds_walk(want) if want is not None and "c" not in want else None
        for off, count, payload, recs, checked in self.record_payloads(keep=want is not None):
            if recs is None and walk is not None:       # only the wanted records are decoded
                got: List[Dict[str, Any]] = []
                if walk.run(payload, count, self.path, off, got.append, checked=checked):
                    recs = got
            if recs is None:
                recs = record_list(payload, count, self.path, off)
            if want is None:
                yield from recs
            else:
                yield from [rec for rec in recs if rec.get("k") in want]

    def blob_ids(self) -> List[str]:
        return list(self._blobs)

    def has_blob(self, bid: str) -> bool:
        return bid in self._blobs

    def blob_size(self, bid: str) -> int:
        return self._blob_entry(bid)[0]

    def _blob_entry(self, bid: str) -> Tuple[int, List[str]]:
        ent = self._blobs.get(bid) if isinstance(bid, str) else None
        if ent is None:
            raise SnapshotError(f"{self.path}: unknown blob id {str(bid)[:40]!s}")
        return ent

    def blob_reader(self, bid: str) -> Iterator[bytes]:
        """Yield the blob's data chunk by chunk (each verified against its chunk id)."""
        size, chunks = self._blob_entry(bid)
        got = 0
        for i, cid in enumerate(chunks):
            off = self._chunks.get(cid)
            if off is None:
                raise SnapshotError(f"{self.path}: blob {bid}: chunk {cid} missing")
            data = self.chunk(cid)
            got += len(data)
            if (i < len(chunks) - 1 and len(data) != CHUNK_SIZE) or got > size:
                raise snap_error(self.path, off, f"blob {bid}: chunk size inconsistent")
            yield data
        if got != size:
            raise SnapshotError(f"{self.path}: blob {bid}: size {got} != declared {size}")

    def chunk(self, cid: str) -> bytes:
        off = self._chunks.get(cid)
        if off is None:
            raise SnapshotError(f"{self.path}: unknown chunk {str(cid)[:40]}")
        kind, payload = self._read_frame(off, expect_kind=KIND_CHUNK, decode=True)
        if payload[:CHUNK_ID_LEN].hex() != cid:
            raise snap_error(self.path, off, "chunk id does not match the index")
        data = payload[CHUNK_ID_LEN:]
        if not self._last_id_checked and chunk_digest(data).hex() != cid:
            raise snap_error(self.path, off, "chunk content checksum mismatch")
        return data

    def blob_chunk_ids(self, bid: str) -> Tuple[int, List[str]]:
        """(size, chunk ids in order) of a blob."""
        size, chunks = self._blob_entry(bid)
        return size, list(chunks)

    def chunk_into(self, cid: str, out, scratch: Optional[bytearray] = None) -> Tuple[int, Optional[bytearray]]:
        """Chunk `cid` read, verified and decompressed straight into `out` (formats/chunkio.py);
        thread-safe. Returns (data length, reusable scratch buffer)."""
        return chunk_into(self, cid, out, scratch)

    def blob(self, bid: str) -> bytes:
        parts = list(self.blob_reader(bid))
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def verify(self) -> None:
        """Read and check every frame (checksums, decoding, chunk ids); SnapshotError on the first bad one."""
        for fr in self._frames:
            kind, payload = self._read_frame(fr.offset, decode=True)
            if kind != fr.kind or self._last_comp_len != fr.comp_len:
                raise snap_error(self.path, fr.offset, "frame disagrees with the index")
            if kind == KIND_RECORDS:
                for _ in iter_record_payload(payload, self._last_count, self.path, fr.offset):
                    pass
            elif kind == KIND_CHUNK and not self._last_id_checked:
                cid = payload[:CHUNK_ID_LEN].hex()
                if chunk_digest(payload[CHUNK_ID_LEN:]).hex() != cid:
                    raise snap_error(self.path, fr.offset, "chunk content checksum mismatch")

    def check_payloads(self, progress: Optional[Callable[[int, int], None]] = None) -> None:
        """Verify every frame's header and payload checksum (a chunk checked by its id: its
        content digest), reading the file once in order and decoding nothing: what a command
        runs before the GPU or its output does any work. SnapshotError names the first bad
        frame and its offset. progress(done_bytes, total_bytes) is called as frames pass."""
        total = self._frames[-1].end if self._frames else 0
        for fr in self._frames:
            self._read_frame(fr.offset, decode=False)
            if self._last_comp_len != fr.comp_len:
                raise snap_error(self.path, fr.offset, "frame length disagrees with the index")
            if progress is not None:
                progress(fr.end, total)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        """Every record in file order."""
        return self.records()

    def check_records(self) -> None:
        """Verify every records frame's header and payload checksum without decompressing or
        decoding it (what a reader of the summary alone still checks); SnapshotError on the first bad one."""
        for fr in self._frames:
            if fr.kind == KIND_RECORDS:
                self._read_frame(fr.offset, expect_kind=KIND_RECORDS, decode=False)
                if self._last_comp_len != fr.comp_len:
                    raise snap_error(self.path, fr.offset, "frame length disagrees with the index")

    def frames(self) -> List[Tuple[int, str, int]]:
        return [(fr.offset, KIND_NAMES[fr.kind], fr.comp_len) for fr in self._frames]

    @property
    def stats(self) -> Dict[str, Any]:
        """Sizes from frame headers (cheap: 32 bytes read per frame)."""
        raw = {KIND_HEADER: 0, KIND_RECORDS: 0, KIND_CHUNK: 0}
        stored = {KIND_HEADER: 0, KIND_RECORDS: 0, KIND_CHUNK: 0}
        nrec = 0
        for fr in self._frames:
            head = self._read_at(fr.offset, FRAME_SIZE)
            kind, codec, raw_len, comp_len, _, count = parse_frame_header(head, self.path, fr.offset)
            raw[fr.kind] += raw_len
            stored[fr.kind] += comp_len + FRAME_SIZE
            if fr.kind == KIND_RECORDS:
                nrec += count
        unique = sum(s for s, _ in self._blobs.values())
        logical = None
        if self.index is not None:
            st = self.index.get("stats")
            if isinstance(st, dict) and _is_uint(st.get("blob_logical_bytes")):
                logical = st["blob_logical_bytes"]
        if logical is None:
            logical = self._scan_blob_refs if self._scan_blob_refs is not None else unique
        payload_raw = sum(raw.values())
        payload_stored = sum(stored.values())
        return {
            "file_size": self.file_size,
            "frames": len(self._frames),
            "records": nrec,
            "raw_record_bytes": raw[KIND_RECORDS],
            "stored_record_bytes": stored[KIND_RECORDS],
            "blobs": len(self._blobs),
            "chunks": len(self._chunks),
            "blob_logical_bytes": logical,
            "blob_unique_bytes": unique,
            "blob_stored_bytes": stored[KIND_CHUNK],
            "compression_ratio": round(payload_raw / payload_stored, 3) if payload_stored else 1.0,
            "dedup_ratio": round(logical / unique, 3) if unique else 1.0,
            "truncated": self.truncated,
            "lost_bytes": self.lost_bytes,
        }

    def close(self) -> None:
        if getattr(self, "shared", False):
            return                    # the process's one reader of this file (opened()): it stays
        self._scan_recs = {}
        if self._map is not None:
            self._map.close()
            self._map = None
        self._f.close()

    def __enter__(self) -> "SnapshotReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        f = getattr(self, "_f", None)
        if f is not None:
            try:
                f.close()
            except Exception:
                pass

