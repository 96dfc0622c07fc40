"""The C walk of records frames (formats/records.c, formats/native.py) against the Python
paths it stands in for: `dump` text and jsonl byte for byte, `info`'s scan summary and a
scan's blob references, on programs captured on the test double and on generated records;
and garbage payloads never crash it (the Python layer raises what it always raised)."""
from __future__ import annotations

import contextlib
import io
import os
import sys

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cudasnap.formats import SnapshotError, SnapshotReader, SnapshotWriter, native
from cudasnap.formats.blobrefs import frame_blob_refs
from cudasnap.formats.container import TRAILER, TRAILER_SIZE, record_list
from cudasnap.inspect_cmds import _Dump, run_dump, summarize

sys.path.insert(0, os.path.dirname(__file__))
from test_inspect import make_session  # noqa: E402

pytestmark = pytest.mark.skipif(native.module() is None, reason="cudasnap.formats._records is not built")

CALLS = (None, "launches", "errors,3-20", "memcpy,add|gemm", "cuMem.*Async", "5", "  ")


def _dump(path, fmt, calls=None, blobs=False, use_native=True, monkeypatch=None):
    monkeypatch.setenv("CUDASNAP_NATIVE_RECORDS", "1" if use_native else "0")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = run_dump(path, calls, fmt, blobs)
    return rc, out.getvalue(), err.getvalue()


def _no_index(path, tmp_path):
    data = path.read_bytes()
    cut = tmp_path / (path.stem + "-noindex.cusnap")
    cut.write_bytes(data[:TRAILER.unpack(data[-TRAILER_SIZE:])[1]])
    return cut


def _summary(path, monkeypatch, use_native):
    monkeypatch.setenv("CUDASNAP_NATIVE_RECORDS", "1" if use_native else "0")
    with SnapshotReader(path) as r:
        return summarize(r), r.stats["blob_logical_bytes"]


def _check_same(path, tmp_path, monkeypatch):
    for fmt in ("text", "jsonl"):
        for calls in CALLS:
            for blobs in (False, True):
                got = _dump(path, fmt, calls, blobs, True, monkeypatch)
                want = _dump(path, fmt, calls, blobs, False, monkeypatch)
                assert got == want, (fmt, calls, blobs)
    cut = _no_index(path, tmp_path)
    with SnapshotReader(path) as r:
        indexed = r.summary()
    got, want = _summary(cut, monkeypatch, True), _summary(cut, monkeypatch, False)
    assert got == want
    assert list(got[0]["calls"]["by_name"].items()) == list(want[0]["calls"]["by_name"].items())
    if indexed is not None:
        assert got[0]["calls"]["by_name"] == dict(summarize_index(path)["calls"]["by_name"])


def summarize_index(path):
    with SnapshotReader(path) as r:
        return summarize(r)


PROGRAMS = [("launch_forms",), ("threads", "20"), ("queries", "50"), ("unified",), ("nvtx_client", "3"),
            ("reload",), ("direct",)]


@pytest.mark.parametrize("prog", PROGRAMS, ids=lambda p: p[0])
def test_captured_programs(prog, double, capture, tmp_path, monkeypatch):
    cp, snap = capture(double["progs"][prog[0]], *prog[1:])
    assert cp.returncode == 0, cp.stderr
    _check_same(snap, tmp_path, monkeypatch)


def test_made_session(tmp_path, monkeypatch):
    """Every kind of record the inspect tests write, frames of a few records each."""
    _check_same(make_session(tmp_path / "s.cusnap", frame_bytes=300), tmp_path, monkeypatch)


# ---------------------------------------------------------------------------- generated records

_KEYS = st.sampled_from(["f", "a", "x", "blob", "size", "s", "N", "ByteCount", "hfunc", "Flags", "name", "é"])
_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1),
    st.integers(min_value=0, max_value=70000), st.floats(allow_nan=False), st.binary(max_size=80),
    st.text(max_size=12), st.sampled_from(["", "a b", "x\"y", "\x7f", "ok_1.2:3/4-5", "é\u2603\U0001f600", "abc"]),
)
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=20), st.dictionaries(_KEYS, inner, max_size=4),
    st.builds(lambda b: {"blob": b}, st.sampled_from(["b" * 32, "c" * 32, "d" * 5])),
    st.builds(lambda b, n: {"blob": b, "size": n}, st.sampled_from(["b" * 32, "z" * 32]), st.integers(0, 9))),
    max_leaves=12)
_NAMES = st.sampled_from(["cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchHostFunc", "cuMemcpyHtoD_v2",
                          "cuMemcpyDtoDAsync_v2", "cuMemcpy", "cuMemcpy2D_v2", "cuMemsetD32_v2", "cuMemsetD2D8_v2",
                          "cuMemAlloc_v2", "cuMemAllocPitch_v2", "cuModuleLoadData", "cuModuleGetFunction",
                          "cuStreamQuery", "cuInit"])
_CALL = st.fixed_dictionaries(
    {"k": st.just("c"), "f": st.one_of(_NAMES, _NAMES, st.integers(0, 3)),
     "a": st.one_of(st.dictionaries(_KEYS, _VALUES, max_size=5),
                    st.fixed_dictionaries({"f": st.sampled_from([1, 2, 0x500, -1, 7.0, None])},
                                          optional={"ByteCount": st.integers(-5, 1 << 40), "N": st.integers(0, 99)}),
                    st.just([1, 2])),
     "s": st.one_of(st.integers(0, 30), st.none(), st.just(""), st.just(2.0), st.just(True)),
     "tid": st.one_of(st.integers(0, 1 << 40), st.text(max_size=3))},
    optional={"r": st.one_of(st.sampled_from([0, 0, 1, 700, 999, 1000, -3]), st.none(), st.booleans()),
              "t0": st.integers(-10, 1 << 60), "t1": st.integers(-10, 1 << 60), "x": st.dictionaries(_KEYS, _VALUES, max_size=3),
              "state": st.one_of(st.booleans(), st.just(1))})
_OTHER = st.one_of(
    st.fixed_dictionaries({"k": st.just("fn"), "h": st.sampled_from([1, 2, 0x500, True, 2.0]),
                           "name": st.sampled_from(["gemm", "add", "", "k\u00e9"])}),
    st.fixed_dictionaries({"k": st.sampled_from(["rep", "note", "b", "end", "nvtx", "zz", 5])},
                          optional={"calls": st.just([{"f": "cuStreamQuery", "n": 2, "of": 1}]), "msg": _VALUES}),
    st.dictionaries(_KEYS, _VALUES, max_size=4))
_INTS = st.one_of(st.integers(0, 1 << 64 - 1), st.sampled_from([0, 1, 0xFFFF, 0x10000, 0x500, -1]))
_PLAIN = st.fixed_dictionaries(         # the usual shapes: what the C walk takes itself
    {"k": st.just("c"), "s": st.integers(0, 30), "tid": st.integers(0, 1 << 40), "t0": st.integers(0, 1 << 40),
     "t1": st.integers(0, 1 << 40), "f": _NAMES,
     "a": st.fixed_dictionaries({"f": st.sampled_from([1, 2, 0x500])},
                                optional={k: _INTS for k in ("ByteCount", "N", "size", "count", "hStream")}),
     "r": st.sampled_from([0, 0, 0, 1, 700, 999, 1000])},
    optional={"x": st.fixed_dictionaries({}, optional={
        "params": st.binary(max_size=70), "src": st.builds(lambda b: {"blob": b}, st.sampled_from(["b" * 32, "q" * 32])),
        "dst": st.builds(lambda b, n: {"blob": b, "size": n}, st.sampled_from(["c" * 32, "z" * 3]), st.integers(0, 9))}),
        "state": st.booleans()})
_RECORDS = st.lists(st.one_of(_PLAIN, _PLAIN, _PLAIN, _CALL, _OTHER), min_size=1, max_size=12)


class _Reader:
    """What _Dump and the Summary read of a reader, for two known blobs."""
    path = "gen"
    _blobs = {"b" * 32: 40, "c" * 32: 1 << 33}

    def blob_ids(self):
        return list(self._blobs)

    def has_blob(self, bid):
        return bid in self._blobs

    def blob_size(self, bid):
        return self._blobs[bid]

    def blob_reader(self, bid):
        yield b"\x01\x02" * 20


def _lines(frames, fmt, calls, blobs, use_native):
    out = io.StringIO()
    d = _Dump(_Reader(), fmt, blobs, calls, out, use_native=use_native)
    try:
        for i, (payload, count) in enumerate(frames):
            d.frame(i, count, payload, None)
    except SnapshotError as e:
        d.flush()
        return out.getvalue(), str(e)
    d.flush()
    return out.getvalue(), None


def _pack(recs):
    p = msgpack.Packer(use_bin_type=True)
    return b"".join(p.pack(r) for r in recs)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(_RECORDS, st.sampled_from(["text", "jsonl"]), st.sampled_from(CALLS), st.booleans())
def test_generated_records_dump_the_same(recs, fmt, calls, blobs):
    frames = [(_pack(recs[:3]), len(recs[:3])), (_pack(recs[3:]), len(recs[3:]))]
    assert _lines(frames, fmt, calls, blobs, True) == _lines(frames, fmt, calls, blobs, False)


class _Frames:
    """A reader of given payloads for summarize."""

    def __init__(self, frames):
        self.frames, self.path = frames, "gen"

    def record_payloads(self):
        for i, (payload, count) in enumerate(self.frames):
            yield i, count, payload, None, False

    def has_blob(self, bid):
        return False


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(_RECORDS)
def test_generated_records_summarize_the_same(recs):
    from cudasnap.formats.summary import Summary
    frames = [(_pack(recs[:5]), len(recs[:5])), (_pack(recs[5:]), len(recs[5:]))]
    got, want = Summary(lambda b: None), Summary(lambda b: None)
    native.summarize(_Frames(frames), got)
    for payload, count in frames:
        for rec in record_list(payload, count, "gen", 0):
            want.add(rec)
    g, w = got.to_map(), want.to_map()
    assert g == w
    assert [list(g[k]) for k in ("kinds", "calls", "kernels", "memory")] == \
           [list(w[k]) for k in ("kinds", "calls", "kernels", "memory")]


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(_RECORDS)
def test_generated_records_blob_refs_the_same(recs):
    payload = _pack(recs)
    w = native.scan_walk()
    got = native.scan_frame(w, payload, len(recs), "gen", 0, frame_blob_refs)
    want = record_list(payload, len(recs), "gen", 0)
    assert got is not None
    assert got[0] == [r for r in want if r.get("k") == "b"] and got[1] == frame_blob_refs(want)


# ---------------------------------------------------------------------------- garbage

def _python_or_error(payload, count):
    try:
        return record_list(payload, count, "gen", 0)
    except SnapshotError as e:
        return str(e)


@settings(max_examples=800, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(st.binary(max_size=300),
                 st.builds(lambda recs, cut, junk: _pack(recs)[:cut] + junk, _RECORDS, st.integers(0, 400),
                           st.binary(max_size=8))),
       st.integers(0, 20))
def test_garbage_never_crashes_and_errors_match(payload, count):
    ref = _python_or_error(payload, count)
    for mode in range(5):
        w = native.Walk(native.module(), mode)
        if mode == native.M_KINDS:
            w.set(native.TAB_NAMES, b"c")
        got: list = []
        try:
            ok = w.run(payload, count, "gen", 0, got.append, need=lambda n: w.set(native.TAB_NAMES, n.encode(), 0),
                       out=lambda s: None)
        except SnapshotError as e:
            ok, got = True, str(e)
        if ok:                      # C read it: so does the Python decoder
            assert not isinstance(ref, str)
    frames = [(payload, count)]
    assert _lines(frames, "text", None, False, True) == _lines(frames, "text", None, False, False)
    assert _lines(frames, "jsonl", "launches", False, True) == _lines(frames, "jsonl", "launches", False, False)


def test_turned_off_gives_the_python_path(monkeypatch):
    monkeypatch.setenv("CUDASNAP_NATIVE_RECORDS", "0")
    assert native.module() is None and native.scan_walk() is None


def test_a_file_written_with_odd_records(tmp_path, monkeypatch):
    """Records the C walk hands over mid-frame (floats, int keys, a fn record with a float
    handle that turns the walk off) in an indexed and an index-less file."""
    p = tmp_path / "odd.cusnap"
    with SnapshotWriter(p, {"pid": 1}) as w:
        w.write({"k": "fn", "h": 5, "name": "k5"})
        for i in range(50):
            w.write({"k": "c", "s": i, "f": "cuLaunchKernel", "a": {"f": 5 if i % 2 else 6, "x": 1.5 if i == 7 else 1},
                     "r": 0, "t0": 10, "t1": 20 + i})
            if i == 20:
                w.write({"k": "c", "s": i, "f": "cuInit", "a": {1: 2}, "r": 0})
            if i == 30:
                w.write({"k": "fn", "h": 6.0, "name": "k6"})
    _check_same(p, tmp_path, monkeypatch)


def test_truncated_utf8_at_a_string_end_is_refused():
    """A multi-byte sequence cut by the string's end is invalid even when the next byte (the
    next record's) looks like its continuation: C leaves the frame to the Python decoders (which
    refuse it, or with ormsgpack keep the byte as a surrogate escape)."""
    payload = b"\x81\xa1f\xa2a\xcc" + b"\x81\xa1k\xa1c"
    assert native.module().lib.rd_check(payload, len(payload), 2) != 0
    w = native.Walk(native.module(), native.M_TEXT)
    assert not w.run(payload, 2, "gen", 0, lambda rec: None, need=lambda n: None, out=lambda s: None)
