"""Low-level pieces of the .cusnap container (see SCHEMA.md): constants, frame headers,
checksums, bounded decompression and bounded msgpack decoding.

Everything that parses bytes from a file lives here or in reader.py and raises only
SnapshotError on bad input.
"""
from __future__ import annotations

import gc
import os
import struct
import threading
from typing import Any, Iterator, List, Tuple

import msgpack
import xxhash
import zstandard

try:                        # a faster decoder for records frames; msgpack stays the reference
    import ormsgpack
except ImportError:         # pragma: no cover - a machine without it decodes with msgpack alone
    ormsgpack = None

FORMAT_VERSION = 2          # container (preamble) version this code writes; it reads 1 and 2
SCHEMA_VERSION = 1          # record schema version this code writes

MAGIC = b"CUSNAP\0\0"
PREAMBLE = struct.Struct("<8sII")           # magic, format_version, reserved
PREAMBLE_SIZE = PREAMBLE.size               # 16

FRAME_MAGIC = b"CSFR"
FRAME = struct.Struct("<4sBBHIIQII")        # magic kind codec flags raw comp xxh64 count hcrc
FRAME_SIZE = FRAME.size                     # 32
FRAME_CRC_SPAN = 28

TRAILER_MAGIC = b"CSEND\0\0\0"
TRAILER = struct.Struct("<8sQQ")            # magic, index frame offset, xxh64(index payload)
TRAILER_SIZE = TRAILER.size                 # 24

KIND_HEADER, KIND_RECORDS, KIND_CHUNK, KIND_INDEX = 0, 1, 2, 3
KIND_NAMES = {0: "header", 1: "records", 2: "chunk", 3: "index"}
CODEC_STORED, CODEC_ZSTD = 0, 1
# frame flag (format 2): a stored chunk frame whose payload is checked by its chunk id (the
# xxh3_128 of the data after it) instead of an xxh64, so writing it reads the data only once
FLAG_ID_SUM = 1

MAX_FRAME = 64 << 20        # bound on raw_len and comp_len of any frame
CHUNK_SIZE = 4 << 20        # blobs are cut in 4 MiB chunks
CHUNK_ID_LEN = 16
_DECOMP_PIECE = 4 << 20     # decompress in pieces of this size: memory follows real output

assert PREAMBLE_SIZE == 16 and FRAME_SIZE == 32 and TRAILER_SIZE == 24


class SnapshotError(Exception):
    """Any problem reading a snapshot. The message is one line: 'file: offset N: problem'."""


def _fmt_where(path: Any, offset: int | None) -> str:
    name = os.fspath(path) if path is not None else "<snapshot>"
    if offset is None:
        return f"{name}"
    return f"{name}: offset {offset}"


def snap_error(path: Any, offset: int | None, problem: str) -> SnapshotError:
    return SnapshotError(f"{_fmt_where(path, offset)}: {problem}")


# ---------------------------------------------------------------------------- hashing

def xxh64(data) -> int:
    return xxhash.xxh64_intdigest(data)


def chunk_digest(data) -> bytes:
    return xxhash.xxh3_128_digest(data)


def blob_id(chunk_digests) -> str:
    """A blob's id from its chunks' digests (SCHEMA.md): a blob of one chunk is named by
    that chunk's digest (the xxh3_128 of its content), a longer one by the xxh3_128 of its
    chunk digests in order, an empty one by the xxh3_128 of nothing. Content-addressed
    either way, and computable without reading the content twice."""
    if len(chunk_digests) == 1:
        return bytes(chunk_digests[0]).hex()
    return xxhash.xxh3_128_hexdigest(b"".join(chunk_digests))


def blob_id_of(data) -> str:
    """blob_id of a payload held in memory."""
    mv = memoryview(data).cast("B")
    return blob_id([chunk_digest(mv[i:i + CHUNK_SIZE]) for i in range(0, len(mv), CHUNK_SIZE)])


# ---------------------------------------------------------------------------- preamble

def pack_preamble(version: int = FORMAT_VERSION) -> bytes:
    return PREAMBLE.pack(MAGIC, version, 0)


def check_preamble(buf: bytes, path: Any) -> int:
    if len(buf) < PREAMBLE_SIZE:
        raise snap_error(path, 0, f"file too short for a snapshot ({len(buf)} bytes)")
    magic, version, _ = PREAMBLE.unpack_from(buf, 0)
    if magic != MAGIC:
        raise snap_error(path, 0, "not a cudasnap snapshot (bad magic)")
    if version > FORMAT_VERSION or version == 0:
        raise snap_error(
            path, 0,
            f"unsupported snapshot format version {version} (this cudasnap reads <= {FORMAT_VERSION})")
    return version


# ---------------------------------------------------------------------------- frames

def pack_frame_header(kind: int, codec: int, raw_len: int, stored: bytes, count: int) -> bytes:
    return pack_frame_header_sum(kind, codec, raw_len, len(stored), xxh64(stored), count)


def pack_frame_header_sum(kind: int, codec: int, raw_len: int, comp_len: int, digest: int, count: int,
                          flags: int = 0) -> bytes:
    """Frame header for a payload whose stored length and xxh64 are already known (a payload
    written as several pieces)."""
    head = struct.pack("<4sBBHIIQI", FRAME_MAGIC, kind, codec, flags, raw_len, comp_len, digest, count)
    return head + struct.pack("<I", xxhash.xxh32_intdigest(head))


def parse_frame_header(buf: bytes, path: Any, offset: int) -> Tuple[int, int, int, int, int, int]:
    """Validate a 32-byte frame header; returns (kind, codec, raw_len, comp_len, xxh64, count);
    xxh64 is None for a frame checked by its chunk id (FLAG_ID_SUM)."""
    if len(buf) < FRAME_SIZE:
        raise snap_error(path, offset, "incomplete frame header")
    magic, kind, codec, flags, raw_len, comp_len, digest, count, hcrc = FRAME.unpack_from(buf, 0)
    if magic != FRAME_MAGIC:
        raise snap_error(path, offset, "bad frame magic")
    if xxhash.xxh32_intdigest(buf[:FRAME_CRC_SPAN]) != hcrc:
        raise snap_error(path, offset, "frame header checksum mismatch")
    if kind not in KIND_NAMES:
        raise snap_error(path, offset, f"unknown frame kind {kind}")
    if codec not in (CODEC_STORED, CODEC_ZSTD):
        raise snap_error(path, offset, f"unknown frame codec {codec}")
    if raw_len > MAX_FRAME or comp_len > MAX_FRAME:
        raise snap_error(path, offset, f"frame too large (raw {raw_len}, stored {comp_len}; limit {MAX_FRAME})")
    if codec == CODEC_STORED and raw_len != comp_len:
        raise snap_error(path, offset, "stored frame with raw length != stored length")
    if kind != KIND_RECORDS and count != 0:
        raise snap_error(path, offset, "non-record frame with nonzero record count")
    if kind == KIND_CHUNK and raw_len < CHUNK_ID_LEN:
        raise snap_error(path, offset, "chunk frame shorter than its chunk id")
    if flags:
        if flags != FLAG_ID_SUM or kind != KIND_CHUNK or codec != CODEC_STORED or digest != 0:
            raise snap_error(path, offset, f"bad frame flags {flags:#x}")
        digest = None
    return kind, codec, raw_len, comp_len, digest, count


_tls = threading.local()


def decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_tls, "dctx", None)
    if d is None:
        d = _tls.dctx = zstandard.ZstdDecompressor()
    return d


def compressor(level: int) -> zstandard.ZstdCompressor:
    cache = getattr(_tls, "cctx", None)
    if cache is None:
        cache = _tls.cctx = {}
    c = cache.get(level)
    if c is None:
        c = cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return c


def encode_payload(raw, level: int) -> Tuple[int, bytes]:
    """Compress a payload (level <= 0 after mapping means stored); returns (codec, stored)."""
    if level == 0 or len(raw) == 0:
        return CODEC_STORED, bytes(raw)
    comp = compressor(level).compress(raw)
    if len(comp) >= len(raw):
        return CODEC_STORED, bytes(raw)
    return CODEC_ZSTD, comp


PROBE_MIN = 256 << 10        # payloads at least this big are probed before compressing
PROBE_PIECE = 16 << 10       # 4 samples of this size, spread over the payload
PROBE_GAIN = 0.97            # compressed sample must be below this fraction of its size


def looks_incompressible(data) -> bool:
    """Cheap probe for large payloads: compress 4 spread 16 KiB samples (64 KiB) at zstd
    level 1; True when they do not shrink by more than 3% (random data, already-compressed
    data). Small payloads are never judged (False): compressing them is cheap anyway."""
    mv = memoryview(data).cast("B")
    n = len(mv)
    if n < PROBE_MIN:
        return False
    step = (n - PROBE_PIECE) // 3
    sample = b"".join(mv[i * step:i * step + PROBE_PIECE] for i in range(4))
    return len(compressor(1).compress(sample)) > PROBE_GAIN * len(sample)


def decode_payload(stored: bytes, codec: int, raw_len: int, path: Any, offset: int) -> bytes:
    """Decompress with every size bounded by the declared raw_len (itself <= MAX_FRAME)."""
    if codec == CODEC_STORED:
        if len(stored) != raw_len:
            raise snap_error(path, offset, "stored payload length mismatch")
        return stored
    try:
        size = zstandard.frame_content_size(stored)
    except Exception:
        raise snap_error(path, offset, "frame payload is not a valid zstd frame") from None
    if size != raw_len:
        raise snap_error(path, offset, f"zstd content size {size} != declared raw length {raw_len}")
    try:
        reader = decompressor().stream_reader(stored, read_across_frames=False)
        if raw_len + 1 <= _DECOMP_PIECE:
            out = reader.read(raw_len + 1)
            extra = b""
            while len(out) < raw_len + 1:
                extra = reader.read(raw_len + 1 - len(out))
                if not extra:
                    break
                out += extra
        else:
            parts: List[bytes] = []
            got = 0
            while got <= raw_len:
                piece = reader.read(min(_DECOMP_PIECE, raw_len + 1 - got))
                if not piece:
                    break
                parts.append(piece)
                got += len(piece)
            out = b"".join(parts)
    except zstandard.ZstdError as e:
        raise snap_error(path, offset, f"zstd decompression failed ({_oneline(e)})") from None
    except Exception as e:  # pragma: no cover - defensive: never leak other exceptions
        raise snap_error(path, offset, f"decompression failed ({type(e).__name__})") from None
    if len(out) != raw_len:
        raise snap_error(path, offset, f"decompressed {len(out)} bytes, frame declares {raw_len}")
    return out


def _oneline(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


# ---------------------------------------------------------------------------- msgpack

def _msgpack_default(obj):
    if isinstance(obj, (bytearray, memoryview)):
        return bytes(obj)
    if hasattr(obj, "__index__"):
        return obj.__index__()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if hasattr(obj, "__fspath__"):
        return os.fspath(obj)
    raise TypeError(f"cannot store {type(obj).__name__} in a snapshot record")


def new_packer() -> msgpack.Packer:
    return msgpack.Packer(use_bin_type=True, default=_msgpack_default, autoreset=True)


def _unpacker(nbytes: int) -> msgpack.Unpacker:
    n = max(nbytes, 1)
    # Every element takes >= 1 byte of input, so these bounds never reject valid data
    # but stop a tiny payload from declaring a huge container (pre-allocation bombs).
    return msgpack.Unpacker(
        None, raw=False, use_list=True, strict_map_key=False,
        max_buffer_size=n, max_str_len=n, max_bin_len=n, max_array_len=n,
        max_map_len=max(n // 2, 1), max_ext_len=n,
        unicode_errors="surrogateescape",
    )


def unpack_one(payload: bytes, path: Any, offset: int, what: str) -> Any:
    """Decode a payload holding exactly one msgpack object."""
    objs = unpack_many(payload, path, offset, what, expect=1)
    return objs[0]


def unpack_many(payload: bytes, path: Any, offset: int, what: str, expect: int | None = None) -> List[Any]:
    if len(payload) > MAX_FRAME:
        raise snap_error(path, offset, f"{what} too large")
    u = _unpacker(len(payload))
    # no collection while a frame's objects are made: one frame makes tens of thousands of
    # containers, and the collections they set off (full ones too, while a reader keeps the
    # records it read) cost a third of the decode
    gc_on = gc.isenabled()
    gc.disable()
    try:
        u.feed(payload)
        if expect is None:
            objs = list(u)
        else:
            objs = []
            try:
                for _ in range(expect):
                    objs.append(u.unpack())
            except msgpack.OutOfData:      # fewer than expected: reported below
                pass
        leftover = u.tell() != len(payload)
    except SnapshotError:
        raise
    except Exception as e:
        raise snap_error(path, offset, f"{what}: invalid msgpack ({_oneline(e)[:80]})") from None
    finally:
        if gc_on:
            gc.enable()
    if leftover:
        raise snap_error(path, offset, f"{what}: trailing or incomplete msgpack data")
    if expect is not None and len(objs) != expect:
        raise snap_error(path, offset, f"{what}: expected {expect} objects, found {len(objs)}")
    return objs


def iter_record_payload(payload: bytes, count: int, path: Any, offset: int) -> Iterator[dict]:
    return iter(record_list(payload, count, path, offset))


_ARRAY32 = struct.Struct(">BI")
_DICT = frozenset((dict,))
_END = b"\xc4\x10" + os.urandom(16)      # bin8 of 16 random bytes


def _ext_hook(code: int, data: bytes) -> Any:
    # what msgpack's Unpacker gives (a Timestamp for -1, else ExtType, which refuses other
    # negative codes): the same objects, and the same frames refused
    if code == -1:
        return msgpack.Timestamp.from_bytes(bytes(data))
    return msgpack.ExtType(code, bytes(data))


def _fast_records(payload: bytes, count: int) -> List[dict] | None:
    """The frame's records decoded by ormsgpack (1.5-2x msgpack's Unpacker here) as one array
    of `count`, or None when it refuses them: msgpack then decodes (and reports) as before.
    Whatever msgpack refuses it refuses too, except a map keyed by an array (a tuple key here)."""
    if ormsgpack is None or not 0 < count <= len(payload) <= MAX_FRAME:
        return None
    gc_on = gc.isenabled()
    gc.disable()                # see unpack_many
    try:
        # ormsgpack ignores bytes after the array: a last element no file can know shows that
        # the payload held exactly `count` objects
        recs = ormsgpack.unpackb(b"".join((_ARRAY32.pack(0xDD, count + 1), payload, _END)),
                                 option=ormsgpack.OPT_NON_STR_KEYS, ext_hook=_ext_hook)
    except Exception:
        return None
    finally:
        if gc_on:
            gc.enable()
    if type(recs) is not list or len(recs) != count + 1 or type(recs[-1]) is not bytes or recs[-1] != _END[2:]:
        return None
    recs.pop()
    return recs


def record_one(data: bytes, path: Any, offset: int) -> dict:
    """record_list(data, 1, path, offset)[0] for the span of one record a C walk checked
    (formats/native.py), without the array around it."""
    if ormsgpack is not None:
        try:
            rec = ormsgpack.unpackb(data, option=ormsgpack.OPT_NON_STR_KEYS, ext_hook=_ext_hook)
        except Exception:
            rec = None
        if type(rec) is dict:
            return rec
    return record_list(data, 1, path, offset)[0]


def record_list(payload: bytes, count: int, path: Any, offset: int) -> List[dict]:
    """The records of one records frame, every one checked to be a map."""
    recs = _fast_records(payload, count)
    if recs is None:
        recs = unpack_many(payload, path, offset, "records frame", expect=count)
    if not _DICT.issuperset(map(type, recs)):
        raise snap_error(path, offset, "records frame: record is not a map")
    return recs


def check_schema(schema: Any, path: str) -> None:
    """Refuse a header whose record schema is newer than this reader knows, by name."""
    if isinstance(schema, int) and not isinstance(schema, bool) and schema > SCHEMA_VERSION:
        raise SnapshotError(f"{path}: record schema {schema} is newer than this cudasnap reads "
                            f"(<= {SCHEMA_VERSION}): upgrade cudasnap to read it")


def chunk_count_ok(size: int, chunks: List[Any]) -> bool:
    """A blob of `size` bytes has exactly ceil(size / 4 MiB) chunks (bounds read work by size),
    each named by a hex id."""
    return (len(chunks) == (size + CHUNK_SIZE - 1) // CHUNK_SIZE
            and all(isinstance(c, str) and len(c) == CHUNK_ID_LEN * 2 and all(ch in "0123456789abcdef" for ch in c)
                    for c in chunks))
