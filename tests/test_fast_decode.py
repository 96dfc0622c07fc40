"""The fast read paths give what the reference paths give: records frames decoded by ormsgpack
against msgpack's Unpacker, blob references counted without the walk, jsonl lines assembled
from pieces against json.dumps of _jsonable, and a scan's kept records against a fresh decode."""
from __future__ import annotations

import datetime
import json
import random

import msgpack
import pytest

from cudasnap.formats import SnapshotError, SnapshotReader, SnapshotWriter
from cudasnap.formats import blobrefs
from cudasnap.formats import container as C
from cudasnap.formats import reader as R
from cudasnap import inspect_cmds as ic


def _frame(objs) -> bytes:
    p = msgpack.Packer(use_bin_type=True, datetime=True)
    return b"".join(p.pack(o) for o in objs)


def _reference(payload: bytes, count: int):
    try:
        return C.unpack_many(payload, "x", 0, "records frame", expect=count)
    except SnapshotError as e:
        return ("error", str(e))


def _record_list(payload: bytes, count: int):
    try:
        return C.record_list(payload, count, "x", 0)
    except SnapshotError as e:
        return ("error", str(e))


TS = datetime.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=datetime.timezone.utc)
CASES = [
    [{"k": "c", "s": 1, "f": "cuInit", "a": {"Flags": 0}, "r": 0}],
    [{"k": "c", "a": {1: "int key", b"b": "bytes key", None: 1, 1.5: 3}}, {"k": "c", "a": {True: 2, False: 0}}],
    [{"k": "c", "x": {"params": b"\x00" * 40, "t": TS, "e": msgpack.ExtType(7, b"abc")}}],
    [{"u64": (1 << 64) - 1, "i64": -(1 << 63), "f": 1.5, "neg0": -0.0, "nan": float("nan")}],
    [{"deep": [[[[1]]]], "empty": {}, "el": [], "s": "é\u2603"}],
]


@pytest.mark.parametrize("objs", CASES)
def test_fast_decode_matches_msgpack(objs):
    payload = _frame(objs)
    got, ref = _record_list(payload, len(objs)), _reference(payload, len(objs))
    assert repr(got) == repr(ref)          # repr: nan != nan, -0.0 == 0.0
    assert [type(v) for r in got for v in r.values()] == [type(v) for r in ref for v in r.values()]


@pytest.mark.parametrize("payload,count", [
    (b"\x81\xa1k\xa2\xff\xfe", 1),            # invalid UTF-8: msgpack's surrogateescape
    (_frame([{"a": 1}]) + b"\x01", 1),        # trailing data
    (_frame([{"a": 1}]), 2),                  # fewer objects than the header says
    (_frame([{"a": 1}, 5]), 2),               # a record that is not a map
    (b"\x81\xa1a\xc7\x01\xfbx", 1),           # negative ext code: refused by msgpack
    (b"\x81\xa1a\xdd\x7f\xff\xff\xff", 1),    # a huge declared array in a tiny payload
    (b"\x91" * 1100 + b"\x01", 1),            # nested deeper than msgpack's stack
    (b"", 0),
])
def test_fast_decode_refuses_and_reports_as_msgpack(payload, count):
    got, ref = _record_list(payload, count), _reference(payload, count)
    if isinstance(ref, tuple) or not all(type(r) is dict for r in ref):
        assert isinstance(got, tuple) and got[0] == "error"
        if isinstance(ref, tuple):
            assert got == ref
    else:
        assert got == ref


def _rand_value(rng: random.Random, depth: int = 0):
    pick = rng.random()
    if depth < 3 and pick < 0.15:
        return {rng.choice(["blob", "size", "p", "q", 1]): _rand_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    if depth < 3 and pick < 0.25:
        return [_rand_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if pick < 0.4:
        return {"blob": rng.choice(["b1", "b2", "b3", 7]), "size": 8}
    return rng.choice([0, 1, 1 << 40, "s", b"\x01", None, True, 2.5])


def test_blob_refs_fast_path_counts_as_the_walk():
    rng = random.Random(5)
    recs = []
    for _ in range(3000):
        rec = {"k": "c"}
        for key in ("a", "x"):
            if rng.random() < 0.8:
                rec[key] = ({f"k{i}": _rand_value(rng) for i in range(rng.randint(0, 5))}
                            if rng.random() < 0.8 else _rand_value(rng))
        recs.append(rec)
    recs.append({"k": "c", "a": {f"v{i}": i for i in range(20000)}, "x": {"d": {"blob": "big"}}})
    walked: dict = {}
    for rec in recs:
        blobrefs._walk_blob_refs(rec, walked)
    assert blobrefs.frame_blob_refs(recs) == walked
    assert sum(walked.values()) > 100


def test_json_line_matches_json_dumps(tmp_path):
    path = tmp_path / "j.cusnap"
    with SnapshotWriter(path, {"t": 1}) as w:
        bid = w.add_blob(b"\x05" * 300)
        w.write({"k": "b", "id": bid, "size": 300, "chunks": [bid]})
    recs = [
        {"k": "c", "s": 1, "f": "cuMemcpyDtoH_v2", "a": {"ByteCount": 300}, "x": {"dst": {"blob": bid}}, "r": 0},
        {"k": "c", "s": 2, "f": "cuX", "a": {"v": 1}, "r": 0},
        {"k": "c", "s": 3, "f": "cuX", "a": {"v": True}, "r": 0},
        {"k": "c", "s": 4, "f": "cuX", "a": {"v": 1.0}, "r": 0},
        {"k": "c", "s": 5, "f": "cuX", "a": {"v": 0.0}, "r": 0.0},
        {"k": "c", "s": 6, "f": "cuX", "a": {"v": -0.0}, "r": False},
        {"k": "c", "s": 7, "f": "cuX", "a": {1: "a", "1": "b"}, "r": None},
        {"k": "c", "s": 8, "f": "cuX", "a": {True: "a"}, "r": 0},
        {"k": "c", "s": 9, "f": "cuX", "a": {1: "a"}, "r": 0},
        {"k": "c", "s": 10, "f": "cü%s\n", "a": {"%d": b"\x00" * 100, "n": [1, {"blob": bid}]}, "r": 0},
        {"k": "c", "s": 11, "%": "%%", "blob": bid},
        {1: "non-str key", "k": "x"},
        {"k": "c", "s": 12, "t": float("inf"), "n": float("nan"), "big": 1 << 70, "neg": -5},
        {"k": "c", "s": 13, "deep": {"a": {"b": {"c": [[[[{"d": 1}]]]]}}}},
    ]
    with SnapshotReader(path) as r:
        for blobs in (False, True):
            memo = ic._Memo()
            for rec in recs + recs:            # twice: the second time from the memo
                want = json.dumps(ic._jsonable(rec, blobs, r), separators=(",", ":"), default=str)
                assert ic._json_line(rec, blobs, r, memo) == want, rec


def test_scan_keeps_records_for_one_pass(tmp_path, monkeypatch):
    path = tmp_path / "s.cusnap"
    with SnapshotWriter(path, {"t": 1}) as w:
        for i in range(5000):
            w.write({"k": "c", "s": i, "f": "cuLaunchKernel", "a": {"f": 7, "n": i}, "r": 0})
            if i % 1000 == 999:
                w.flush()
    data = path.read_bytes()
    cut = tmp_path / "cut.cusnap"
    cut.write_bytes(data[:C.TRAILER.unpack(data[-C.TRAILER_SIZE:])[1]])   # no index: scanned
    with SnapshotReader(path) as r:
        want = list(r.records())
    for keep in (0, 2500, 10 ** 6):
        monkeypatch.setattr(R, "SCAN_KEEP_RECORDS", keep)
        with SnapshotReader(cut) as r:
            assert r.truncated
            assert len(r._scan_recs) == (0 if keep == 0 else 2 if keep == 2500 else len(r._scan_recs))
            assert next(iter(r.records("c")))["s"] == 0        # a partial pass, then whole ones
            first, second = list(r.records()), list(r.records())
            assert first == want and second == want
            assert not r._scan_recs
            assert all(a is not b for a, b in zip(first, second))   # each pass has its own records
