"""The .cusnap container: round trip, blobs and dedup, crash recovery, repair, call sets."""
from __future__ import annotations

import os
import random
import struct
import time

import msgpack
import pytest
import xxhash

from cudasnap.formats import (
    FORMAT_VERSION, SCHEMA_VERSION, SnapshotError, SnapshotReader, SnapshotWriter, parse_callset, repair,
)
from cudasnap.formats import container as C
from cudasnap.formats.container import blob_id_of
from cudasnap.formats.cuerrors import cu_result_name

HEADER = {"host": "h", "pid": 7, "ppid": 1, "argv": ["python", "x.py"], "cwd": "/tmp",
          "env": {"CUDA_VISIBLE_DEVICES": "0"}, "options": {"blobs": "all"},
          "api": {"name": "cuda-12.4", "digest": "abc"}, "tool_version": "0.1.0"}


def every_kind(w: SnapshotWriter):
    """Write one record of every kind; returns the list of records as they should read back."""
    bid = w.add_blob(b"\x01\x02" * 5000)
    recs = [
        {"k": "proc", "driver_version": 12040,
         "gpus": [{"index": 0, "name": "GPU", "uuid": "GPU-1", "cc": [9, 0], "mem": 80 << 30}]},
        {"k": "b", "id": bid, "size": 10000, "chunks": [xxhash.xxh3_128_hexdigest(b"\x01\x02" * 5000)]},
        {"k": "fn", "h": 0x5555AAAA0000, "name": "kern", "kind": "function", "module": 0x1234,
         "params": [[0, 8], [8, 4]]},
        {"k": "fn", "h": 77, "name": "lib_kern", "kind": "kernel", "module": None, "params": []},
        {"k": "c", "s": 1, "tid": 9, "t0": 100, "t1": 200, "f": "cuMemAlloc_v2",
         "a": {"dptr": 0x7F0000000000, "bytesize": 1024}, "r": 0},
        {"k": "c", "s": 2, "tid": 9, "t0": 300, "t1": 400, "f": "cuMemcpyHtoD_v2",
         "a": {"dstDevice": 0x7F0000000000, "ByteCount": 10000}, "r": 0, "x": {"src": {"blob": bid}}},
        {"k": "c", "s": 3, "tid": 9, "t0": 500, "t1": 600, "f": "cuLaunchKernel",
         "a": {"f": 0x5555AAAA0000, "gridDimX": 1}, "r": 0, "x": {"params": b"\x00" * 12}},
        {"k": "c", "s": 4, "tid": 10, "t0": 700, "f": "cuCtxSynchronize", "a": {}},
        {"k": "note", "level": "warning", "msg": "dropped 3 records"},
        {"k": "future_kind", "whatever": [1, 2, {"x": b"y"}]},
        {"k": "end", "exit": None, "signal": 9, "partial": True},
    ]
    for r in recs[2:]:
        w.write(r)
    w.write(recs[0])   # proc after the first calls: the header view still finds it
    return bid, recs


def _proc_first(recs):
    return recs[2:] + [recs[0]]


@pytest.mark.parametrize("threads", [0, 2])
@pytest.mark.parametrize("level", [0, 3])
def test_roundtrip_every_kind(tmp_path, threads, level):
    p = tmp_path / "a.cusnap"
    with SnapshotWriter(p, HEADER, level=level, threads=threads) as w:
        bid, recs = every_kind(w)
    r = SnapshotReader(p)
    assert not r.truncated and r.lost_bytes == 0
    got = list(r.records())
    want = [recs[1]] + _proc_first(recs)
    assert got == want
    h = r.header
    for k, v in HEADER.items():
        assert h[k] == v
    assert h["format"] == "cudasnap" and h["schema"] == SCHEMA_VERSION and "created" in h
    assert h["proc"] == recs[0]
    assert r.blob(bid) == b"\x01\x02" * 5000 and r.blob_size(bid) == 10000
    assert [x["k"] for x in r.records(kinds=["c"])] == ["c"] * 4
    assert list(r.records("end")) == [recs[-1]]
    assert r.stats["records"] == len(want)
    assert FORMAT_VERSION == 2


def test_format_1_files_still_read():
    """Snapshots written before stored chunks were checked by their id (format 1) read and
    verify: the real-GPU examples in examples/ are such files."""
    ex = os.path.join(os.path.dirname(__file__), "..", "examples", "vector_add_h200.cusnap")
    r = SnapshotReader(ex)
    assert r.version == 1 and not r.truncated
    r.verify()
    assert r.blob_ids() and all(len(r.blob(b)) == r.blob_size(b) for b in r.blob_ids())


def test_stored_chunks_are_checked_by_their_id(tmp_path):
    """A stored chunk frame carries no xxh64 (FLAG_ID_SUM): a flipped data byte is caught by
    the chunk id, in indexed reads and in scans."""
    p = tmp_path / "id.cusnap"
    data = os.urandom(1 << 20)
    with SnapshotWriter(p, HEADER, level=1) as w:
        bid = w.add_blob(data)
    raw = bytearray(p.read_bytes())
    off = raw.index(bytes.fromhex(bid)) + 16 + 1000          # inside the chunk's data
    head = C.FRAME.unpack_from(raw, raw.index(bytes.fromhex(bid)) - C.FRAME_SIZE)
    assert head[3] == C.FLAG_ID_SUM and head[6] == 0
    assert SnapshotReader(p).blob(bid) == data
    raw[off] ^= 0x40
    p.write_bytes(bytes(raw))
    with pytest.raises(SnapshotError, match="checksum mismatch"):
        SnapshotReader(p).blob(bid)
    r = SnapshotReader(p, scan=True)
    assert bid not in r.blob_ids() and r.lost_bytes > len(data)


def test_file_layout_matches_schema(tmp_path):
    p = tmp_path / "l.cusnap"
    with SnapshotWriter(p, HEADER) as w:
        w.write({"k": "c", "s": 1, "f": "cuInit", "a": {"Flags": 0}, "r": 0})
    data = p.read_bytes()
    assert data[:8] == b"CUSNAP\0\0" and struct.unpack_from("<II", data, 8) == (2, 0)
    magic, kind, codec, res, raw, comp, h64, count, hcrc = struct.unpack_from("<4sBBHIIQII", data, 16)
    assert (magic, kind, res, count) == (b"CSFR", 0, 0, 0)
    assert hcrc == xxhash.xxh32_intdigest(data[16:44])
    assert h64 == xxhash.xxh64_intdigest(data[48:48 + comp])
    tmagic, ioff, ih = struct.unpack_from("<8sQQ", data, len(data) - 24)
    assert tmagic == b"CSEND\0\0\0"
    ik = struct.unpack_from("<4sBBHIIQII", data, ioff)
    assert ik[1] == 3 and ik[6] == ih
    idx = msgpack.unpackb(C.decode_payload(data[ioff + 32:ioff + 32 + ik[5]], ik[2], ik[4], "x", 0))
    assert idx["records"] == 1 and [f[1] for f in idx["frames"]] == [0, 1]


def test_blob_dedup_10mib(tmp_path):
    p = tmp_path / "d.cusnap"
    payload = os.urandom(10 << 20)
    with SnapshotWriter(p, HEADER, level=1) as w:
        ids = {w.add_blob(payload) for _ in range(10)}
        st = w.stats
    assert len(ids) == 1
    assert st["blobs"] == 1 and st["blob_refs"] == 10 and st["chunks"] == 3
    size = p.stat().st_size
    assert (10 << 20) <= size < (10 << 20) + 64 * 1024       # one copy, random = incompressible
    r = SnapshotReader(p)
    bid = ids.pop()
    assert bid == blob_id_of(payload)   # SCHEMA.md: named by its chunk digests
    assert r.blob(bid) == payload
    assert b"".join(r.blob_reader(bid)) == payload
    s = r.stats
    assert s["blob_logical_bytes"] == 10 * (10 << 20) and s["dedup_ratio"] == 10.0
    assert len(list(r.records("b"))) == 1


def test_chunk_dedup_across_blobs(tmp_path):
    p = tmp_path / "c.cusnap"
    common = os.urandom(C.CHUNK_SIZE)
    with SnapshotWriter(p, HEADER, level=0) as w:
        a = w.add_blob(common + b"A" * 100)
        b = w.add_blob(common + b"B" * 100)
        st = w.stats
    assert st["chunks"] == 3 and st["chunk_hits"] == 1
    r = SnapshotReader(p)
    assert r.blob(a) == common + b"A" * 100 and r.blob(b) == common + b"B" * 100


@pytest.mark.parametrize("threads", [0, 3])
def test_streaming_blob_equals_add_blob(tmp_path, threads):
    rnd = random.Random(5)
    data = bytes(rnd.getrandbits(8) for _ in range(100_000)) * 100   # ~9.5 MiB, 3 chunks
    p1, p2 = tmp_path / "1.cusnap", tmp_path / "2.cusnap"
    with SnapshotWriter(p1, HEADER, threads=threads) as w:
        b1 = w.add_blob(data)
    with SnapshotWriter(p2, HEADER, threads=threads) as w:
        bs = w.begin_blob()
        pos = 0
        buf = bytearray(1 << 20)
        while pos < len(data):                       # odd piece sizes, reused buffer
            n = min(rnd.randint(1, 3 << 20), len(data) - pos)
            mv = memoryview(buf) if n <= len(buf) else memoryview(bytearray(n))
            mv[:n] = data[pos:pos + n]
            bs.write(mv[:n])
            pos += n
        b2 = bs.finish()
        assert bs.finish() == b2
        assert w.add_blob(data) == b2                # dedup against the streamed blob
        st = w.stats
    assert b1 == b2 and st["blobs"] == 1 and st["blob_refs"] == 2
    r1, r2 = SnapshotReader(p1), SnapshotReader(p2)
    assert r2.blob(b2) == data
    assert list(r1.records()) == list(r2.records())


def test_empty_blob_and_empty_file(tmp_path):
    p = tmp_path / "e.cusnap"
    with SnapshotWriter(p, {}) as w:
        e = w.add_blob(b"")
        e2 = w.begin_blob().finish()
    r = SnapshotReader(p)
    assert e == e2 and r.blob(e) == b"" and r.blob_size(e) == 0
    p2 = tmp_path / "e2.cusnap"
    SnapshotWriter(p2, {}).close()
    r2 = SnapshotReader(p2)
    assert list(r2.records()) == [] and not r2.truncated and "proc" not in r2.header


def test_close_idempotent_and_flush(tmp_path):
    p = tmp_path / "f.cusnap"
    w = SnapshotWriter(p, HEADER, frame_bytes=1 << 20)
    w.write({"k": "c", "s": 1, "f": "cuInit", "a": {}, "r": 0})
    w.flush()                                        # reaches the file before close
    r = SnapshotReader(p)
    assert r.truncated and [x["s"] for x in r.records()] == [1]
    w.write({"k": "c", "s": 2, "f": "cuInit", "a": {}, "r": 0})
    w.close()
    w.close()
    assert [x["s"] for x in SnapshotReader(p).records()] == [1, 2]
    with pytest.raises(ValueError):
        w.write({"k": "note"})


def make_small_frames(path, n=120, blob_every=15):
    """Many small frames: records frames (~200 B) interleaved with small chunk frames."""
    w = SnapshotWriter(path, HEADER, frame_bytes=200)
    rnd = random.Random(1)
    written = []
    for i in range(n):
        if i % blob_every == 0:
            bid = w.add_blob(bytes(rnd.getrandbits(8) for _ in range(300)))
            written.append({"k": "b"})
            rec = {"k": "c", "s": i, "tid": 1, "f": "cuMemcpyHtoD_v2", "a": {"ByteCount": 300},
                   "r": 0, "x": {"src": {"blob": bid}}}
        else:
            rec = {"k": "c", "s": i, "tid": 1, "f": "cuLaunchKernel", "a": {"f": 0x1000 + i % 3}, "r": 0}
        w.write(rec)
    w.close()
    return w


def _kept(path):
    """Records of a repaired file, without the `repair` record repair adds."""
    return [r for r in SnapshotReader(path).records() if r.get("k") != "repair"]


def _frame_ends(path):
    r = SnapshotReader(path)
    return [(off, off + 32 + comp, kind) for off, kind, comp in r.frames()], r


def test_truncation_every_frame_boundary_and_mid_frame(tmp_path):
    full = tmp_path / "full.cusnap"
    make_small_frames(full)
    data = full.read_bytes()
    frames, r = _frame_ends(full)
    assert len(frames) > 30
    # records as they are up to the end of each frame
    per_frame = []
    reader_records = []
    for off, end, kind in frames:
        if kind == "records":
            _, payload = r._read_frame(off)
            reader_records.extend(C.iter_record_payload(payload, r._last_count, "x", off))
        per_frame.append((end, list(reader_records)))
    rnd = random.Random(3)
    cuts = [end for end, _ in per_frame]
    cuts += [end + k for end, _ in per_frame[:-1] for k in (1, 17, 31, 32, 33)]
    cuts += [rnd.randrange(per_frame[0][0], len(data)) for _ in range(40)]
    cuts += [len(data) - 1, len(data) - 24, len(data) - 25]
    tp = tmp_path / "t.cusnap"
    rp = tmp_path / "t.repaired.cusnap"
    for cut in (0, 10, 16, 20, 48, per_frame[0][0] - 1):     # inside preamble / header frame
        tp.write_bytes(data[:cut])
        with pytest.raises(SnapshotError):
            SnapshotReader(tp)
    for cut in sorted(set(cuts)):
        tp.write_bytes(data[:cut])
        last_end, want = max(((e, recs) for e, recs in per_frame if e <= cut), key=lambda t: t[0])
        tr = SnapshotReader(tp)
        assert tr.truncated
        got = list(tr.records())
        assert got == want, cut
        assert tr.lost_bytes == cut - last_end, cut
        assert tr.recovered_frames == sum(1 for e, _ in per_frame if e <= cut)
        for rec in got:
            if rec["k"] == "b":
                assert len(tr.blob(rec["id"])) == 300
        s = repair(tp, rp)
        data_lost = cut - last_end if last_end < per_frame[-1][0] else 0     # an index is not data
        assert s["was_truncated"] and s["lost_bytes"] == data_lost
        rr = SnapshotReader(rp)
        assert not rr.truncated and rr.lost_bytes == 0
        assert _kept(rp) == want
        note = list(rr.records("repair"))
        assert len(note) == 1 and note[0]["lost_bytes"] == data_lost
        assert sorted(rr.blob_ids()) == sorted(tr.blob_ids())


def test_repair_in_place(tmp_path):
    p = tmp_path / "x.cusnap"
    make_small_frames(p, n=40)
    data = p.read_bytes()
    p.write_bytes(data[:len(data) - 300])
    os.chmod(p, 0o640)
    before = list(SnapshotReader(p).records())
    s = repair(p)
    assert s["out"] == str(p) and s["was_truncated"] and s["orig"] == f"{p}.orig"
    r = SnapshotReader(p)
    assert not r.truncated and _kept(p) == before
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".cusnap-repair")]
    assert os.stat(p).st_mode & 0o777 == 0o640                     # the mode is kept
    assert open(f"{p}.orig", "rb").read() == data[:len(data) - 300]  # so is the original
    assert repair(p)["intact"]                                     # now whole: left alone
    with open(p, "r+b") as f:                                      # damaged again: the first
        f.seek(len(data) // 2)                                     # original is not overwritten
        f.write(b"\xff" * 4)
    with pytest.raises(SnapshotError, match=r"x.cusnap.orig already exists"):
        repair(p)


def _flip(path, off, mask=0x10):
    data = bytearray(open(path, "rb").read())
    data[off] ^= mask
    open(path, "wb").write(bytes(data))


@pytest.mark.parametrize("indexed", [True, False])
def test_repair_resyncs_past_a_corrupt_records_frame(tmp_path, indexed):
    """A plain read stops at a damaged frame; repair steps over it, keeps every frame after
    it, reports the stretch, and leaves the loss on record for `info`."""
    p = tmp_path / "c.cusnap"
    make_small_frames(p, n=60)
    if not indexed:
        data = p.read_bytes()
        p.write_bytes(data[:struct.unpack_from("<Q", data, len(data) - 16)[0]])   # index and trailer gone
    frames, _ = _frame_ends(p)
    rec_frames = [(o, e) for o, e, k in frames if k == "records"]
    off, end = rec_frames[len(rec_frames) // 2]
    full = list(SnapshotReader(p).records())
    _flip(p, off + 40)
    plain = []
    try:
        for rec in SnapshotReader(p).records():
            plain.append(rec)
    except SnapshotError:
        pass
    s = repair(p, tmp_path / "fixed.cusnap")
    kept = _kept(tmp_path / "fixed.cusnap")
    assert len(kept) > len(plain)
    assert [g["offset"] for g in s["gaps"]] == [off] and s["gaps"][0]["kind"] == "records"
    assert s["lost_bytes"] == end - off and s["lost_records"] == len(full) - len(kept)
    assert kept == [r for r in full if r in kept] and kept[-1] == full[-1]
    from cudasnap.inspect_cmds import summarize
    info = summarize(SnapshotReader(tmp_path / "fixed.cusnap"))
    assert not info["truncated"] and info["repaired"]["lost_bytes"] == end - off
    assert info["repaired"]["lost_records"] == s["lost_records"]


def test_repair_keeps_records_whose_blob_lost_a_chunk(tmp_path):
    p = tmp_path / "b.cusnap"
    make_small_frames(p, n=60)
    frames, r = _frame_ends(p)
    n_blobs = len(r.blob_ids())
    off = [o for o, e, k in frames if k == "chunk"][1]
    full = list(r.records())
    _flip(p, off + 40)
    s = repair(p, tmp_path / "fixed.cusnap")
    rr = SnapshotReader(tmp_path / "fixed.cusnap")
    assert _kept(tmp_path / "fixed.cusnap") == full
    assert s["lost_blobs"] == 1 and len(rr.blob_ids()) == n_blobs - 1
    rr.verify()


def test_repair_of_a_damaged_index_loses_nothing(tmp_path):
    p = tmp_path / "i.cusnap"
    make_small_frames(p, n=30)
    full = list(SnapshotReader(p).records())
    data = p.read_bytes()
    _flip(p, struct.unpack_from("<Q", data, len(data) - 16)[0] + 3)   # the index frame's header
    s = repair(p, tmp_path / "fixed.cusnap")
    assert s["lost_bytes"] == 0 and [g["kind"] for g in s["gaps"]] == ["index"]
    assert _kept(tmp_path / "fixed.cusnap") == full


def test_killed_writer_leaves_complete_frames(tmp_path):
    p = tmp_path / "k.cusnap"
    w = SnapshotWriter(p, HEADER, frame_bytes=100, threads=2)
    for i in range(200):
        w.write({"k": "c", "s": i, "f": "cuInit", "a": {}, "r": 0})
    w.flush()
    # simulate kill -9: no close, no index (file object dropped without writing more)
    r = SnapshotReader(p)
    assert r.truncated and r.lost_bytes == 0
    assert [x["s"] for x in r.records()] == list(range(200))
    w.abort()


def _write_spilling(p, monkeypatch, n=16, fold=True):
    """n unique 4 MiB blobs from 8 threads into 4 segments; returns (writer, blob ids, segment
    paths seen before close). The writer is closed when fold is True. Large writes into the
    snapshot file itself are slowed down, so later chunks find it busy and spill."""
    from cudasnap.formats import writer as W
    from cudasnap.formats.segments import segment_paths
    real = W._pwrite_all

    def slow_main(fd, pieces, off):
        if str(os.readlink(f"/proc/self/fd/{fd}")).endswith(".cusnap") and sum(map(len, pieces)) > C.CHUNK_SIZE:
            time.sleep(0.02)
        real(fd, pieces, off)
    monkeypatch.setattr(W, "_pwrite_all", slow_main)
    base = os.urandom(C.CHUNK_SIZE)
    w = SnapshotWriter(p, HEADER, threads=8, segments=4, level=1)
    ids = []
    for i in range(n):
        ids.append(w.add_blob(struct.pack("<Q", i) + base[8:]))
        w.write({"k": "c", "s": i, "f": "cuMemcpyHtoD_v2", "a": {}, "r": 0, "x": {"src": {"blob": ids[-1]}}})
    w.flush()
    seen = [(q, os.path.getsize(q)) for q in segment_paths(p)]
    if fold:
        w.close()
    return w, ids, seen


def _check_blobs(p, ids):
    r = SnapshotReader(p)
    r.verify()
    assert not r.truncated and r.stats["chunks"] == len(ids)
    assert [rec["s"] for rec in r.records("c")] == list(range(len(ids)))
    for i, b in enumerate(ids):
        assert r.blob(b)[:8] == struct.pack("<Q", i)


def test_segments_fold_into_one_file(tmp_path, monkeypatch):
    from cudasnap.formats.segments import segment_paths
    p = tmp_path / "s.cusnap"
    _, ids, seen = _write_spilling(p, monkeypatch)
    # chunks spilled while the file was busy: segments held frames before close
    assert seen and sum(n for _, n in seen) > len(seen) * C.PREAMBLE_SIZE
    assert segment_paths(p) == []
    _check_blobs(p, ids)


def test_segments_left_by_a_dead_writer_are_repaired(tmp_path, monkeypatch):
    from cudasnap.formats.segments import segment_paths
    p = tmp_path / "d.cusnap"
    w, ids, _ = _write_spilling(p, monkeypatch, fold=False)
    w.abort()                              # what a killed recorder leaves
    assert segment_paths(p)
    with pytest.raises(SnapshotError, match="segment file.*cudasnap repair"):
        SnapshotReader(p)
    s = repair(p)
    assert s["was_truncated"] and s["segments"] == 4
    assert segment_paths(p) == []
    _check_blobs(p, ids)


def test_writer_dying_while_folding_is_repaired(tmp_path, monkeypatch):
    """Chunks already folded sit after the records naming them: the scan still finds them."""
    from cudasnap.formats.segments import segment_paths
    p = tmp_path / "f.cusnap"
    w, ids, _ = _write_spilling(p, monkeypatch, fold=False)
    segs = w._segs
    w._segs = segs[:1]

    def die():
        w._segs = segs[:1]
        type(w)._fold_segments(w)
        raise OSError(28, "simulated death after one segment")
    w._fold_segments = die
    with pytest.raises(OSError):
        w.close()
    assert len(segment_paths(p)) == 3
    repair(p)
    assert segment_paths(p) == []
    _check_blobs(p, ids)


def test_segments_off_writes_one_file(tmp_path):
    from cudasnap.formats.segments import segment_paths
    p = tmp_path / "o.cusnap"
    base = os.urandom(C.CHUNK_SIZE)
    with SnapshotWriter(p, HEADER, threads=8, segments=0, level=1) as w:
        ids = [w.add_blob(struct.pack("<Q", i) + base[8:]) for i in range(16)]
        assert segment_paths(p) == []
    r = SnapshotReader(p)
    assert all(r.blob(b)[:8] == struct.pack("<Q", i) for i, b in enumerate(ids))


def test_corrupt_index_falls_back_to_scan(tmp_path):
    p = tmp_path / "ci.cusnap"
    make_small_frames(p, n=30)
    data = bytearray(p.read_bytes())
    want = list(SnapshotReader(p).records())
    ioff = struct.unpack_from("<Q", data, len(data) - 16)[0]
    data[ioff + 40] ^= 0xFF                      # index payload byte
    p.write_bytes(bytes(data))
    r = SnapshotReader(p)
    assert r.truncated and list(r.records()) == want


def test_corrupt_record_frame_in_indexed_file_raises(tmp_path):
    p = tmp_path / "cr.cusnap"
    make_small_frames(p, n=30)
    r = SnapshotReader(p)
    off = [o for o, k, c in r.frames() if k == "records"][3]
    data = bytearray(p.read_bytes())
    data[off + 40] ^= 0x10
    p.write_bytes(bytes(data))
    r = SnapshotReader(p)
    with pytest.raises(SnapshotError, match=rf"offset {off}: frame payload checksum mismatch"):
        list(r.records())


def test_errors_are_one_line_snapshot_errors(tmp_path):
    p = tmp_path / "bad.cusnap"
    p.write_bytes(b"hello world, not a snapshot")
    with pytest.raises(SnapshotError, match="bad.cusnap: offset 0: not a cudasnap snapshot"):
        SnapshotReader(p)
    with pytest.raises(SnapshotError, match="cannot open"):
        SnapshotReader(tmp_path / "missing.cusnap")
    p.write_bytes(C.PREAMBLE.pack(C.MAGIC, 7, 0) + b"\0" * 64)
    with pytest.raises(SnapshotError, match=r"unsupported snapshot format version 7 \(this cudasnap reads <= 2\)"):
        SnapshotReader(p)
    p.write_bytes(C.pack_preamble())
    with pytest.raises(SnapshotError, match="truncated frame header"):
        SnapshotReader(p)
    ok = tmp_path / "ok.cusnap"
    SnapshotWriter(ok, {}).close()
    with pytest.raises(SnapshotError, match="unknown blob"):
        SnapshotReader(ok).blob("00" * 16)


def test_huge_declared_sizes_rejected(tmp_path):
    p = tmp_path / "h.cusnap"
    hdr = C.pack_frame_header(0, 0, 5, b"\x80" * 5, 0)
    head = bytearray(hdr)
    struct.pack_into("<II", head, 8, 0xFFFFFFF0, 0xFFFFFFF0)
    struct.pack_into("<I", head, 28, xxhash.xxh32_intdigest(bytes(head[:28])))
    p.write_bytes(C.pack_preamble() + bytes(head) + b"\x80" * 5)
    with pytest.raises(SnapshotError, match="frame too large"):
        SnapshotReader(p)


def test_callset():
    fns = {0x10: "gemm_kernel", 0x20: "relu"}
    mk = lambda s, name, r=0, **a: {"k": "c", "s": s, "f": name, "a": a, "r": r}  # noqa: E731
    recs = [mk(1, "cuInit"), mk(2, "cuMemAlloc_v2"), mk(3, "cuMemcpyHtoD_v2"),
            mk(4, "cuLaunchKernel", f=0x10), mk(5, "cuLaunchKernelEx", f=0x20),
            mk(6, "cuMemsetD32_v2"), mk(7, "cuStreamSynchronize", r=700),
            {"k": "c", "s": 8, "f": "cuCtxSynchronize", "a": {}}, mk(9, "cuModuleLoadData"),
            mk(10, "cuGraphLaunch"), {"k": "note", "s": 3}]

    def sel(spec):
        p = parse_callset(spec)
        return [r["s"] for r in recs if p(r, fns)]

    assert sel("3") == [3]
    assert sel("2-4,9-") == [2, 3, 4, 9, 10]
    assert sel("-2") == [1, 2]
    assert sel("launches") == [4, 5]
    assert sel("memcpy,memset") == [3, 6]
    assert sel("alloc") == [2]
    assert sel("sync") == [7, 8]
    assert sel("module") == [9]
    assert sel("graph") == [10]
    assert sel("errors") == [7, 8]
    assert sel("gemm") == [4]
    assert sel("relu|cuInit") == [1, 5]
    assert sel("cuMem[(]") == []                 # invalid regex -> substring
    assert sel(None) == list(range(1, 11))
    with pytest.raises(ValueError):
        parse_callset("9-3")


def test_cu_result_names():
    assert cu_result_name(0) == "CUDA_SUCCESS"
    assert cu_result_name(700) == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert cu_result_name(12345) == "CUDA_ERROR_12345"
    assert cu_result_name(None) == "<no return>"


def test_formats_is_neutral_core():
    import pathlib
    import re
    import cudasnap.formats as f
    for py in pathlib.Path(f.__file__).parent.glob("*.py"):
        src = py.read_text()
        # the one exception: the API description's loader (standard library only), for vocab.py
        assert not re.search(r"^\s*(from|import)\s+cudasnap(?!\.shim\.description import)", src, re.M), py
        assert "pickle" not in src, py
        assert len(src.splitlines()) < 600, py


def test_kernel_names_from_fn_records_and_naming_calls():
    """An fn record names a handle; a lazily loaded function's has no name (the driver names it
    only once loaded), so the calls that hand out handles by name name it too."""
    from cudasnap.formats.callset import learn_kernel_name
    names = {}
    recs = [
        {"k": "c", "f": "cuLibraryGetKernel", "r": 0, "a": {"pKernel": 0x10, "library": 1, "name": "ncclDevKernel_AllReduce"}},
        {"k": "c", "f": "cuKernelGetFunction", "r": 0, "a": {"pFunc": 0x20, "kernel": 0x10}},
        {"k": "fn", "h": 0x20, "name": ""},                     # lazy: no name from the driver
        {"k": "c", "f": "cuModuleGetFunction", "r": 0, "a": {"hfunc": 0x30, "hmod": 2, "name": "saxpy"}},
        {"k": "c", "f": "cuModuleGetFunction", "r": 500, "a": {"hfunc": 0x40, "hmod": 2, "name": "missing"}},
        {"k": "fn", "h": 0x30, "name": "add_one"},              # the handle value handed out again
    ]
    for rec in recs:
        learn_kernel_name(names, rec)
    assert names == {0x10: "ncclDevKernel_AllReduce", 0x20: "ncclDevKernel_AllReduce", 0x30: "add_one"}
