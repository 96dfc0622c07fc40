"""Fuzzing the reader (and repair) with >= 10,000 corrupted snapshots.

Every input must either read fine or raise SnapshotError (one line, naming the file);
never another exception, never a hang (time per example bounded), never a big allocation
(every fourth example's tracemalloc peak bounded, the others' address space: tracemalloc on
every example took two thirds of the time). Inputs: bit flips anywhere, truncation, appended
and pure garbage, and frames/indexes forged with *valid* checksums so that the payload
parsers (zstd, msgpack, index validation) see huge declared sizes and nonsense.
"""
from __future__ import annotations

import atexit
import os
import random
import resource
import shutil
import struct
import tempfile
import time
import tracemalloc

import msgpack
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cudasnap.formats import SnapshotError, SnapshotReader, SnapshotWriter, repair
from cudasnap.formats import container as C

TMP = tempfile.mkdtemp(prefix="cusnap-fuzz-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
# every process that imports this module (each pytest-xdist worker collects it) removes its
# directory at exit, whether or not it ran the module's tests
atexit.register(shutil.rmtree, TMP, True)
MAX_SECONDS = 5.0                 # per example (generous for slow CI cores)
MAX_PEAK = 96 << 20               # bytes an example may allocate beyond its input
TRACE_EVERY = 4
COUNTS = {}
# CUSNAP_FUZZ_SCALE=0.1 for a quick local pass; the default (1) runs >= 10,000 examples.
SCALE = float(os.environ.get("CUSNAP_FUZZ_SCALE", "1"))


def N(n: int) -> int:
    return max(1, int(n * SCALE))


FUZZ = dict(derandomize=True, deadline=None, database=None, print_blob=True,
            suppress_health_check=list(HealthCheck))


def _build_base(name: str, level: int, close: bool) -> bytes:
    p = os.path.join(TMP, name)
    rnd = random.Random(42)
    w = SnapshotWriter(p, {"pid": 1, "argv": ["a"]}, level=level, frame_bytes=160)
    w.write({"k": "proc", "driver_version": 12040, "gpus": [{"index": 0, "name": "G", "cc": [8, 0]}]})
    w.write({"k": "fn", "h": 16, "name": "k0", "kind": "function", "module": 1, "params": [[0, 8]]})
    for i in range(14):
        x = {}
        if i % 5 == 0:
            x["src"] = {"blob": w.add_blob(bytes(rnd.getrandbits(8) for _ in range(200)) * 2)}
        w.write({"k": "c", "s": i, "tid": 3, "t0": i * 10, "t1": i * 10 + 5, "f": "cuLaunchKernel",
                 "a": {"f": 16, "n": i}, "r": 0, "x": x})
    w.write({"k": "end", "exit": 0, "signal": None, "partial": False})
    if close:
        w.close()
    else:
        w.abort()
    with open(p, "rb") as f:
        return f.read()


BASES = [_build_base("full.cusnap", 3, True), _build_base("stored.cusnap", 0, True),
         _build_base("trunc.cusnap", 3, False)]
HEADER_END = [16 + 32 + struct.unpack_from("<I", b, 16 + 12)[0] for b in BASES]


def teardown_module(module):
    shutil.rmtree(TMP, ignore_errors=True)


def _check_error(e: SnapshotError, path: str) -> None:
    msg = str(e)
    assert "\n" not in msg and msg.startswith(path), msg
    # the reader turns any exception into a SnapshotError: one that began as the address-space
    # limit's MemoryError is an allocation beyond the bound
    seen = e
    while seen is not None:
        assert not isinstance(seen, MemoryError), f"{path}: an allocation beyond the bound: {msg}"
        seen = seen.__cause__ or seen.__context__


def _vm_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


def _read_all(path: str) -> bool:
    """Open + read everything; True when the file opened."""
    try:
        r = SnapshotReader(path)
    except SnapshotError as e:
        _check_error(e, path)
        return False
    try:
        r.header
        for _ in r.records():
            pass
        r.stats
        r.frames()
        for bid in r.blob_ids()[:6]:
            if r.blob_size(bid) <= (16 << 20):
                r.blob(bid)
    except SnapshotError as e:
        _check_error(e, path)
    finally:
        r.close()
    return True


def consume(data: bytes, key: str, do_repair: bool = False) -> None:
    COUNTS[key] = COUNTS.get(key, 0) + 1
    path = os.path.join(TMP, f"in-{key}.cusnap")
    with open(path, "wb") as f:
        f.write(data)
    # tracemalloc sees an allocation a caught MemoryError would hide; the limit costs nothing
    traced = COUNTS[key] % TRACE_EVERY == 0
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if traced:
        tracemalloc.start()
    else:
        resource.setrlimit(resource.RLIMIT_AS, (_vm_bytes() + MAX_PEAK + len(data), hard))
    try:
        t0 = time.perf_counter()
        _bounded(path, key, do_repair)
        took = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1] if traced else 0
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        if traced:
            tracemalloc.stop()
    assert took < MAX_SECONDS, f"{key}: {took:.1f}s"
    assert peak < MAX_PEAK + len(data), f"{key}: peak {peak}"


def _bounded(path: str, key: str, do_repair: bool) -> None:
    opened = _read_all(path)
    if opened and do_repair:
        out = os.path.join(TMP, f"out-{key}.cusnap")
        if os.path.exists(out):
            os.unlink(out)
        try:
            s = repair(path, out)
        except SnapshotError as e:
            _check_error(e, path)
        else:
            if s["intact"]:                # left alone: nothing written
                assert not os.path.exists(out)
                out = path
            r = SnapshotReader(out)        # a repaired file always opens with an index...
            assert not r.truncated
            for _ in r.records():          # ...and its records always read
                pass
            r.close()
            _read_all(out)


# --------------------------------------------------------------------------- bit flips

@settings(max_examples=N(3000), **FUZZ)
@given(base=st.integers(0, len(BASES) - 1),
       flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 7)), min_size=1, max_size=6))
def _bitflips(base, flips):
    data = bytearray(BASES[base])
    for frac, bit in flips:
        data[int(frac * len(data))] ^= 1 << bit
    consume(bytes(data), "bitflip", do_repair=(len(flips) == 1))


def test_fuzz_bitflips():
    _bitflips()
    assert COUNTS["bitflip"] >= N(3000)


# --------------------------------------------------------------------------- truncation + garbage

@settings(max_examples=N(2000), **FUZZ)
@given(base=st.integers(0, len(BASES) - 1), frac=st.floats(0, 1),
       tail=st.one_of(st.just(b""), st.binary(max_size=64)),
       overwrite=st.one_of(st.none(), st.tuples(st.floats(0, 1), st.binary(min_size=1, max_size=16))))
def _truncations(base, frac, tail, overwrite):
    data = bytearray(BASES[base][:int(frac * len(BASES[base]))] + tail)
    if overwrite and data:
        pos = int(overwrite[0] * (len(data) - 1))
        data[pos:pos + len(overwrite[1])] = overwrite[1]
    consume(bytes(data), "trunc", do_repair=True)


def test_fuzz_truncation_and_garbage_tails():
    _truncations()
    assert COUNTS["trunc"] >= N(2000)


@settings(max_examples=N(1000), **FUZZ)
@given(prefix=st.sampled_from([b"", C.pack_preamble(), C.pack_preamble(2), b"CUSNAP\0\0"]),
       body=st.binary(max_size=512), keep_header=st.booleans())
def _garbage(prefix, body, keep_header):
    if keep_header:
        prefix = BASES[0][:HEADER_END[0]]
    consume(prefix + body, "garbage")


def test_fuzz_random_garbage():
    _garbage()
    assert COUNTS["garbage"] >= N(1000)


# --------------------------------------------------------------------------- forged frames

U32 = st.one_of(st.integers(0, 64), st.sampled_from([C.MAX_FRAME, C.MAX_FRAME + 1, 0x7FFFFFFF, 0xFFFFFFFF]),
                st.integers(0, 0xFFFFFFFF))

# msgpack prefixes that declare enormous containers / strings / binaries
HUGE_MSGPACK = [b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff",
                b"\xdb\x7f\xff\xff\xff", b"\xc9\xff\xff\xff\xff\x01", b"\xdc\xff\xff", b"\xde\xff\xff",
                b"\xc5\xff\xff", b"\x91" * 200, b"\x81\xa1k\xa1c" * 3, b"\xc1", b"\xd4\xff\x00"]


def _random_obj(rnd: random.Random, depth: int = 0):
    pick = rnd.randrange(9 if depth < 3 else 6)
    if pick == 0:
        return None
    if pick == 1:
        return rnd.random() < 0.5
    if pick == 2:
        return rnd.choice([0, 1, -1, 2**31, 2**63 - 1, 2**64 - 1, -2**63, rnd.randrange(-1000, 1000)])
    if pick == 3:
        return rnd.choice(["k", "c", "b", "s", "f", "a", "x", "blob", "id", "size", "chunks", "proc", ""])
    if pick == 4:
        return rnd.randbytes(rnd.randrange(9))
    if pick == 5:
        return rnd.random()
    if pick == 6:
        return [_random_obj(rnd, depth + 1) for _ in range(rnd.randrange(4))]
    if pick == 7:
        return {"k": rnd.choice(["c", "b", "fn", "proc", "end", "note"]),
                **{rnd.choice(["s", "id", "size", "chunks", "a", "x", "h"]): _random_obj(rnd, depth + 1)
                   for _ in range(rnd.randrange(4))}}
    return {_random_obj(rnd, 3) if rnd.random() < 0.8 else rnd.randrange(9): _random_obj(rnd, depth + 1)
            for _ in range(rnd.randrange(3))}


_rnd = random.Random(7)
MSGPACK_POOL = []
while len(MSGPACK_POOL) < 300:
    try:
        MSGPACK_POOL.append(msgpack.packb(_random_obj(_rnd), use_bin_type=True))
    except (TypeError, ValueError):
        pass
PIECE = st.one_of(st.sampled_from(HUGE_MSGPACK), st.sampled_from(MSGPACK_POOL), st.binary(max_size=24))
PIECES = st.lists(PIECE, max_size=6)
BOMBS = {n: zstandard.ZstdCompressor(level=1).compress(b"\0" * n) for n in (1 << 10, 1 << 20, 5 << 20)}


def _msgpack_payload(draw):
    return b"".join(draw(PIECES))


@st.composite
def forged_frame(draw):
    kind = draw(st.one_of(st.integers(0, 3), st.integers(4, 255)))
    codec = draw(st.one_of(st.integers(0, 1), st.integers(2, 255)))
    raw = _msgpack_payload(draw)
    if kind == 2 and draw(st.booleans()):
        body = draw(st.binary(max_size=40))
        raw = (C.chunk_digest(body) if draw(st.booleans()) else draw(st.binary(min_size=16, max_size=16))) + body
    if codec == 1:
        how = draw(st.sampled_from(["real", "bomb", "nosize", "garbage"]))
        if how == "real":
            stored = zstandard.ZstdCompressor().compress(raw)
        elif how == "bomb":
            n = draw(st.sampled_from(sorted(BOMBS)))
            raw, stored = b"\0" * n, BOMBS[n]
        elif how == "nosize":
            stored = zstandard.ZstdCompressor(write_content_size=False).compress(raw)
        else:
            stored = b"\x28\xb5\x2f\xfd" + draw(st.binary(max_size=40))
    else:
        stored = raw
    raw_len = len(raw) if draw(st.booleans()) else draw(U32)
    count = draw(st.one_of(st.integers(0, 8), U32))
    if kind == 3 or draw(st.booleans()):
        count = count if kind == 1 else 0
    # flags: FLAG_ID_SUM (a stored chunk checked by its id, xxh64 field 0) or junk
    flags = draw(st.sampled_from([0, 0, C.FLAG_ID_SUM, 2, 0xFFFF]))
    digest = 0 if flags == C.FLAG_ID_SUM and draw(st.booleans()) else C.xxh64(stored)
    head = bytearray(struct.pack("<4sBBHIIQI", C.FRAME_MAGIC, kind & 0xFF, codec & 0xFF, flags,
                                 raw_len, len(stored), digest, count))
    comp_override = draw(st.one_of(st.none(), U32))
    if comp_override is not None:
        struct.pack_into("<I", head, 12, comp_override)
    head += struct.pack("<I", C.xxhash.xxh32_intdigest(bytes(head)))
    return bytes(head) + stored


@settings(max_examples=N(3000), **FUZZ)
@given(base=st.integers(0, len(BASES) - 1), keep=st.floats(0, 1),
       frames=st.lists(forged_frame(), min_size=1, max_size=4),
       trailer=st.sampled_from(["none", "last", "random"]), tr_off=st.integers(0, 2**64 - 1))
def _forged(base, keep, frames, trailer, tr_off):
    b = BASES[base]
    cut = HEADER_END[base] + int(keep * (len(b) - HEADER_END[base]))
    data = b[:cut]
    offsets = []
    for fr in frames:
        offsets.append(len(data))
        data += fr
    if trailer == "last":
        stored = frames[-1][32:]
        data += struct.pack("<8sQQ", C.TRAILER_MAGIC, offsets[-1], C.xxh64(stored))
    elif trailer == "random":
        data += struct.pack("<8sQQ", C.TRAILER_MAGIC, tr_off, tr_off ^ 0x5A5A)
    consume(data, "forged", do_repair=True)


def test_fuzz_forged_frames():
    _forged()
    assert COUNTS["forged"] >= N(3000)


# --------------------------------------------------------------------------- forged indexes

def _index_parts(data: bytes):
    ioff = struct.unpack_from("<Q", data, len(data) - 16)[0]
    head = C.FRAME.unpack_from(data, ioff)
    stored = data[ioff + 32:ioff + 32 + head[5]]
    idx = msgpack.unpackb(C.decode_payload(stored, head[2], head[4], "x", ioff), strict_map_key=False)
    return ioff, idx


ANY = st.one_of(st.none(), st.integers(-1, 2**64 - 1), st.text(max_size=4), st.binary(max_size=4),
                st.lists(st.integers(0, 2**32), max_size=3), st.sampled_from(["0" * 32, "f" * 32]))


@settings(max_examples=N(1000), **FUZZ)
@given(base=st.integers(0, 1), edits=st.lists(st.tuples(st.sampled_from(
    ["frames", "chunks", "blobs", "records", "stats", "drop", "frame_entry", "blob_size", "blob_chunks"]),
    ANY, st.integers(0, 50)), min_size=1, max_size=4))
def _forged_index(base, edits):
    data = BASES[base]
    ioff, idx = _index_parts(data)
    for what, val, i in edits:
        if what == "drop":
            idx.pop(["frames", "chunks", "blobs"][i % 3], None)
        elif what == "frame_entry" and idx.get("frames"):
            fr = idx["frames"]
            if isinstance(fr, list) and fr:
                fr[i % len(fr)] = val if not isinstance(val, list) else (val + [0, 0, 0])[:3]
        elif what in ("blob_size", "blob_chunks") and isinstance(idx.get("blobs"), dict) and idx["blobs"]:
            k = sorted(idx["blobs"])[i % len(idx["blobs"])]
            ent = list(idx["blobs"][k])
            if what == "blob_size":
                ent[0] = val if not isinstance(val, int) else min(max(val, 0), 2**63 - 1)
            else:
                ent[1] = [ent[1][0]] * (i + 1) if ent[1] else [val]
            idx["blobs"][k] = ent
        else:
            idx[what] = val
    raw = msgpack.packb(idx, use_bin_type=True)
    codec, stored = C.encode_payload(raw, 3)
    frame = C.pack_frame_header(3, codec, len(raw), stored, 0) + stored
    out = data[:ioff] + frame + struct.pack("<8sQQ", C.TRAILER_MAGIC, ioff, C.xxh64(stored))
    consume(out, "index", do_repair=True)


def test_fuzz_forged_index():
    _forged_index()
    assert COUNTS["index"] >= N(1000)


def test_fuzz_total():
    """Sum over the fuzz tests above (when run together, as in CI)."""
    if len(COUNTS) < 5:
        pytest.skip("run the whole module to count")
    assert sum(COUNTS.values()) >= N(10_000)
