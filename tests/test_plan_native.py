"""The replay pre-scan's plan compiled in C (replay/plan_walk.c, replay/plannative.py)
against the Python planner (replay/plan.py, the reference; CUDASNAP_NATIVE_RECORDS=0): the
same op streams, counters, write summaries, records and pre-scan state, on programs captured
on the test double, on bench/records_double.c's pattern, on generated records, and garbage
frames never crash it."""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cudasnap.formats import SnapshotError, SnapshotReader, SnapshotWriter, native
from cudasnap.formats.container import TRAILER, TRAILER_SIZE, record_list
from cudasnap.replay import plan as P
from cudasnap.replay.engine import Replayer
from cudasnap.replay.slots import Ranges, Slots

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler: the plan walk is not built")


def test_the_plan_walk_is_built():
    """With a C compiler the install builds it (its build is optional: a failure would
    otherwise go unseen, every plan then compiled in Python)."""
    from cudasnap.replay.plannative import module
    assert native.module() is not None and module() is not None and hasattr(module().lib, "pl_new")
    assert not hasattr(native.module().lib, "pl_new")      # the records reader has no plan walk

ROOT = Path(__file__).resolve().parent.parent
OPTS = ({}, {"pace": "recorded"}, {"profiler_range": "workload"})


def _exffi():
    from cudasnap.replay.executor import module
    mod = module()
    return mod.ffi if mod is not None else None


def _batch_view(b, ffi):
    ops = None
    if b.ops is not None:
        raw = bytes(ffi.buffer(b.ops, P.OP_SIZE * b.n))
        ops = []
        for i in range(b.n):
            f = list(P.OP.unpack_from(raw, i * P.OP_SIZE))
            pp, size = f[16], f[17]
            # contents, not addresses; and their alignment (16 bytes, as the bytes objects' are)
            f[16] = (bytes(ffi.buffer(ffi.cast("char *", pp), size)), pp % 16) if pp else None
            if f[0] == P.LAUNCH_EX and f[8]:
                f[7] = (bytes(ffi.buffer(ffi.cast("char *", f[7]), f[8] * P.LAUNCH_ATTR_SIZE)), f[7] % 16)
            if f[0] == P.D2H:
                f[6] = "scratch"
            ops.append(tuple(f))
    c = b.counts
    return ("batch", b.tid, b.n, list(b.kinds), list(b.fams), list(b.recs), ops, list(c.items()),
            list(c["fam"].items()) if c else None, list(b.funcs.items()), b.fslots, b.sync_idx, b.nsync,
            b.has_ctx_sync, b.ctx_ops, b.copies, b.marks, b.addrs, b.last_seq, [b.seq(i) for i in range(b.n)],
            [r.get("s") for r in b.recs])


def _view(rp):
    ffi = _exffi()
    items = None
    if rp._plan is not None:
        items = [_batch_view(it, ffi) if isinstance(it, P.OpBatch) else ("rec", it) for it in rp._plan]
    state = (rp.total, rp.incomplete, rp._workload_last, rp.ranges, rp._h2d_order, rp.ctx.ctx_ids, rp.regions,
             list(rp._expected.items()), list(rp._slots.index.items()), rp._t_origin, rp._host_ranges,
             rp._ipc_shared)
    return items, state


def _prescan(snap, use_native: bool, monkeypatch, **opt):
    monkeypatch.setenv("CUDASNAP_NATIVE_RECORDS", "1" if use_native else "0")
    rp = Replayer(str(snap))
    for k, v in opt.items():
        setattr(rp.ctx.opt, k, v)
    rp._pr = opt.get("profiler_range") == "workload"
    rp.ctx.reader = SnapshotReader(str(snap))
    try:
        rp._prescan()
        kind = type(rp._planner).__name__
        return _view(rp), kind
    finally:
        rp.ctx.reader.close()


def _check_same(snap, monkeypatch, want_batches: bool = True):
    for opt in OPTS:
        got, kind = _prescan(snap, True, monkeypatch, **opt)
        want, ref = _prescan(snap, False, monkeypatch, **opt)
        assert (kind, ref) == ("NativePlanner", "Planner")
        assert got[1] == want[1], opt
        assert got[0] == want[0], opt
        if want_batches and want[0] is not None and not opt:
            assert any(it[0] == "batch" for it in want[0])


PROGRAMS = [("direct",), ("launch_forms",), ("threads", "20"), ("queries", "50"), ("unified",), ("nvtx_client", "3"),
            ("reload",), ("chase",), ("carve",), ("windowed", "40", "10")]


@pytest.mark.parametrize("prog", PROGRAMS, ids=lambda p: p[0])
def test_captured_programs(prog, double, capture, monkeypatch):
    cp, snap = capture(double["progs"][prog[0]], *prog[1:])
    assert cp.returncode == 0, cp.stderr
    _check_same(snap, monkeypatch, want_batches=False)


@pytest.mark.parametrize("src,args", [("records_double.c", ("400",)), ("mixed_double.c", ("300",)),
                                      ("launch_loop_double.c", ("500",))])
def test_bench_patterns(src, args, double, capture, tmp_path, monkeypatch):
    prog = tmp_path / Path(src).stem
    subprocess.run(["cc", "-O2", "-I", double["include"], "-o", str(prog), str(ROOT / "bench" / src), "-ldl"],
                   check=True, env=double["env"])
    cp, snap = capture(str(prog), *args)
    assert cp.returncode == 0, cp.stderr
    _check_same(snap, monkeypatch)
    data = snap.read_bytes()                 # no index (a crash's file): the scan's frames, checked
    cut = tmp_path / "noindex.cusnap"
    cut.write_bytes(data[:TRAILER.unpack(data[-TRAILER_SIZE:])[1]])
    _check_same(cut, monkeypatch)


@pytest.mark.parametrize("max_ops,max_recs", [(50, 10**6), (10**6, 3), (2000, 10**6)])
def test_plan_dropped_past_the_limits(max_ops, max_recs, double, capture, tmp_path, monkeypatch):
    """Past PLAN_MAX_OPS / PLAN_MAX_RECORDS the plan is dropped at the same record, with the
    same slots and expected bytes left behind."""
    prog = tmp_path / "records_double"
    subprocess.run(["cc", "-O2", "-I", double["include"], "-o", str(prog), str(ROOT / "bench" / "records_double.c"),
                    "-ldl"], check=True, env=double["env"])
    cp, snap = capture(str(prog), "300")
    assert cp.returncode == 0, cp.stderr
    monkeypatch.setattr(P, "PLAN_MAX_OPS", max_ops)
    monkeypatch.setattr(P, "PLAN_MAX_RECORDS", max_recs)
    got, _ = _prescan(snap, True, monkeypatch)
    want, _ = _prescan(snap, False, monkeypatch)
    assert got == want
    assert got[0] is None


def test_batches_full_and_split_by_thread(tmp_path, monkeypatch):
    """Batches closed at BATCH_MAX ops, by a change of thread, by a call dispatched alone, and
    records the C walk hands over mid-batch (odd types) joining the batch in order."""
    p = tmp_path / "b.cusnap"
    with SnapshotWriter(p, {"pid": 1}, frame_bytes=4096) as w:
        w.write({"k": "c", "s": 0, "tid": 1, "f": "cuMemAlloc_v2", "a": {"dptr": 1 << 20, "bytesize": 1 << 16}, "r": 0})
        w.write({"k": "fn", "h": 77, "name": "k"})
        s = 1
        for i in range(P.BATCH_MAX + 300):
            tid = 2 if (i // 5000) % 2 else 1
            rec = {"k": "c", "s": s, "tid": tid, "t0": 100 + s, "f": "cuLaunchKernel",
                   "a": {"f": 77, "gridDimX": 1 + i % 3, "hStream": 5 if i % 7 else 0},
                   "x": {"params": (1 << 20).to_bytes(8, "little") + i.to_bytes(8, "little")}, "r": 0}
            if i % 997 == 5:
                rec["a"]["hStream"] = 1.5          # handed over: its handler
            if i % 1013 == 7:
                rec["a"]["junk"] = [1, {"a": None}]
            if i % 3001 == 11:
                rec["state"] = True                # handed over, compiled by Python, joins the batch
            w.write(rec)
            s += 1
            if i % 4000 == 3999:
                w.write({"k": "c", "s": s, "tid": tid, "f": "cuMemsetD8Async",
                         "a": {"dstDevice": (1 << 20) + 8, "uc": 3, "N": 4, "hStream": 5}, "r": 0})
                w.write({"k": "c", "s": s + 1, "tid": tid, "f": "cuMemcpyDtoDAsync_v2",
                         "a": {"dstDevice": (1 << 20) + 64, "srcDevice": (1 << 20) + 8, "ByteCount": 4, "hStream": 5},
                         "r": 0})
                w.write({"k": "c", "s": s + 2, "tid": tid, "f": "cuModuleGetFunction", "a": {"hfunc": 9}, "r": 0})
                w.write({"k": "rep", "tid": tid, "t": 5, "calls": [{"f": "cuCtxGetDevice", "of": 3, "n": 2}]})
                s += 3
        w.write({"k": "c", "s": s, "tid": 1, "f": "cuCtxSynchronize", "a": {}})       # never returned
    _check_same(p, monkeypatch)


# ---------------------------------------------------------------------------- generated records

_ODD = st.sampled_from([None, 1.5, "s", -3, 1 << 32, (1 << 64) - 1, [1], {"a": 1}, b"\x01", 0])
_STREAMS = st.sampled_from([0, 0, 1, 2, 0x51, 0x52, None])
_ADDRS = st.sampled_from([0x10000, 1 << 20, (1 << 20) + 8, (1 << 20) + 4096, (1 << 20) + (1 << 16), 1 << 40, 0x123])
_SIZES = st.sampled_from([0, 4, 16, 256])
# name -> the arguments its recorded calls carry
_CALLS = {
    "cuLaunchKernel": {"f": st.sampled_from([0x61, 0x62, -5]), "gridDimX": st.integers(1, 3), "blockDimX": st.just(64),
                       "sharedMemBytes": st.just(0), "hStream": _STREAMS},
    "cuLaunchKernel_ptsz": {"f": st.just(0x61), "hStream": _STREAMS},
    "cuEventRecord": {"hEvent": st.sampled_from([0x71, 0x72]), "hStream": _STREAMS},
    "cuEventRecordWithFlags": {"hEvent": st.just(0x71), "hStream": _STREAMS, "flags": st.integers(0, 2)},
    "cuStreamWaitEvent": {"hStream": _STREAMS, "hEvent": st.just(0x72), "Flags": st.integers(0, 1)},
    "cuMemsetD8_v2": {"dstDevice": _ADDRS, "uc": st.integers(0, 255), "N": _SIZES},
    "cuMemsetD16Async": {"dstDevice": _ADDRS, "us": st.integers(0, 9), "N": _SIZES, "hStream": _STREAMS},
    "cuMemsetD32Async_ptsz": {"dstDevice": _ADDRS, "ui": st.integers(0, 9), "N": _SIZES, "hStream": _STREAMS},
    "cuMemcpyDtoD_v2": {"dstDevice": _ADDRS, "srcDevice": _ADDRS, "ByteCount": _SIZES},
    "cuMemcpyDtoDAsync_v2": {"dstDevice": _ADDRS, "srcDevice": _ADDRS, "ByteCount": _SIZES, "hStream": _STREAMS},
    "cuMemcpy": {"dst": _ADDRS, "src": _ADDRS, "ByteCount": _SIZES},
    "cuMemcpyAsync": {"dst": _ADDRS, "src": _ADDRS, "ByteCount": _SIZES, "hStream": _STREAMS},
    "cuStreamSynchronize": {"hStream": _STREAMS},
    "cuEventSynchronize": {"hEvent": st.just(0x71)},
    "cuCtxSynchronize": {},
    "cuCtxSetCurrent": {"ctx": st.sampled_from([0, 0x81, 0x82])},
    "cuCtxPushCurrent_v2": {"ctx": st.sampled_from([0x81, 0])},
    "cuCtxPopCurrent_v2": {"pctx": st.just(0x81)},
    "cuMemcpyDtoH_v2": {"dstHost": st.just(0x5000), "srcDevice": _ADDRS, "ByteCount": st.just(16)},
    "cuStreamQuery": {"hStream": _STREAMS},
    "cuCtxGetDevice": {"device": st.just(0)},
    "cuMemAlloc_v2": {"dptr": st.sampled_from([1 << 20, 1 << 40, -4096]), "bytesize": st.sampled_from([1 << 16, 0])},
    "cuLaunchKernelEx": {"f": st.just(0x61), "config": st.sampled_from([
        struct.pack("<7I4xQQI4x", 2, 1, 1, 64, 1, 1, 0, s, 0, n) for s in (0, 1, 0x51) for n in (0, 1, 2)] + [bytes(40)])},
    "cuModuleGetFunction": {"hfunc": st.just(0x61)},
}
_PARAMS = st.sampled_from([b"", bytes(8), (1 << 20).to_bytes(8, "little") * 2 + (0x10000).to_bytes(8, "little"),
                           ((1 << 20) + 8).to_bytes(8, "little") + bytes(4), "str"])


@st.composite
def _call(draw):
    f = draw(st.sampled_from(sorted(_CALLS)))
    a = {k: draw(v) for k, v in _CALLS[f].items()}
    rec = {"k": "c", "s": draw(st.one_of(st.integers(-2, 60), st.just(1 << 63), st.just("7"))),
           "tid": draw(st.sampled_from([1, 1, 1, 2, None, "t"])), "t0": draw(st.one_of(st.integers(0, 10**6),
                                                                                  st.none())),
           "f": f, "a": a, "r": draw(st.sampled_from([0, 0, 0, 0, 1, None]))}
    if f.startswith("cuLaunch"):
        rec["x"] = {"params": draw(_PARAMS)}
        if f == "cuLaunchKernelEx":           # attribute ids: 2 and 8 value-only, 1 (access policy) not
            ids = draw(st.lists(st.sampled_from([2, 8, 1]), max_size=2))
            rec["x"]["attrs"] = b"".join(struct.pack("<I4x64s", i, bytes(64)) for i in ids)
    if f.startswith("cuMemcpyDtoH"):
        rec["x"] = {"dstHost": {"blob": draw(st.sampled_from(["B1", "B1", "B2", 3]))}}
    if f in ("cuMemcpy", "cuMemcpyAsync") and draw(st.booleans()):
        rec["x"] = {"hostsrc": 1}
    if draw(st.integers(0, 5)) == 0:          # one odd value somewhere
        where = draw(st.sampled_from(["a", "top", "x", "drop"]))
        if where == "a" and a:
            a[draw(st.sampled_from(sorted(a)))] = draw(_ODD)
        elif where == "top":
            rec[draw(st.sampled_from(["s", "tid", "t0", "r", "a", "incomplete", "state", "x", "f"]))] = draw(_ODD)
        elif where == "x":
            rec["x"] = draw(_ODD)
        elif a:
            del a[draw(st.sampled_from(sorted(a)))]
    return rec


_OTHER = st.sampled_from([{"k": "fn", "h": 0x61, "name": "k61"}, {"k": "rep", "tid": 1, "calls": []}, {"k": "ctx", "h": 9},
                          {"k": 5}, {"x": 1}, {"k": "region", "base": 1 << 40, "size": 1 << 30}])


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(_call(), _call(), _call(), _OTHER), max_size=80), st.sampled_from([300, 8192]))
def test_generated_records_plan_the_same(tmp_path_factory, recs, frame_bytes):
    mp = pytest.MonkeyPatch()
    try:
        p = tmp_path_factory.mktemp("gen") / "g.cusnap"
        try:
            with SnapshotWriter(p, {"pid": 1}, frame_bytes=frame_bytes) as w:
                b1 = w.add_blob(bytes(16))
                for rec in recs:
                    rec = dict(rec)
                    x = rec.get("x")
                    if isinstance(x, dict) and isinstance(x.get("dstHost"), dict) and x["dstHost"].get("blob") == "B1":
                        rec["x"] = {**x, "dstHost": {"blob": b1}}
                    w.write(rec)
        except OverflowError:                  # the index's byte totals past 64 bits: no file to read
            assume(False)
        _check_same(p, mp, want_batches=False)
    finally:
        mp.undo()


# ---------------------------------------------------------------------------- garbage

def _plan_frames(frames, use_native: bool):
    """The planner fed frames directly (complete call records, as the pre-scan feeds it); the
    plan's items, or the error the Python decoder raised."""
    ffi = _exffi()
    kw = dict(keep=True, ffi=ffi, pace=True, expected=lambda bid: None)
    if use_native:
        from cudasnap.replay.plannative import NativePlanner, module
        pl = NativePlanner(module(), "gen", lambda f: f.startswith("cuMemAlloc"), None, True, Slots(ffi),
                           Ranges(), **kw)
    else:
        pl = P.Planner(True, Slots(ffi), Ranges(), **kw)

    def one(rec):
        if use_native:
            pl.take()
        if rec.get("k") == "c" and not rec.get("incomplete") and "r" in rec:
            pl.add(rec)

    try:
        for payload, count in frames:
            if use_native and pl.walk(payload, count, 0, False, one):
                continue
            for rec in record_list(payload, count, "gen", 0):
                one(rec)
    except SnapshotError as e:
        return str(e)
    items = pl.finish()
    return [_batch_view(it, ffi) if isinstance(it, P.OpBatch) else ("rec", it) for it in items]


def _pack(recs):
    import msgpack
    return b"".join(msgpack.packb(r) for r in recs)


_GOOD = [{"k": "c", "s": i, "tid": 1, "f": "cuLaunchKernel", "a": {"f": 4, "hStream": 0}, "x": {"params": b"\0" * 8},
          "r": 0} for i in range(6)]


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(st.binary(max_size=300),
                 st.builds(lambda cut, junk: _pack(_GOOD)[:cut] + junk, st.integers(0, 400), st.binary(max_size=8)),
                 st.builds(lambda i, b: bytes(x ^ (b if j == i else 0) for j, x in enumerate(_pack(_GOOD))),
                           st.integers(0, 300), st.integers(1, 255))),
       st.integers(0, 8))
def test_garbage_never_crashes_and_plans_match(payload, count):
    got = _plan_frames([(payload, count)], True)
    want = _plan_frames([(payload, count)], False)
    assert got == want


def test_records_decoded_on_demand(tmp_path, monkeypatch):
    p = tmp_path / "l.cusnap"
    with SnapshotWriter(p, {"pid": 1}) as w:
        for i in range(50):
            w.write({"k": "c", "s": i, "tid": 1, "f": "cuCtxSynchronize", "a": {}, "r": 0})
    monkeypatch.setenv("CUDASNAP_NATIVE_RECORDS", "1")
    rp = Replayer(str(p))
    rp.ctx.reader = SnapshotReader(str(p))
    rp._prescan()
    rp.ctx.reader.close()
    (b,) = rp._plan
    from cudasnap.replay.plannative import LazyRecs
    assert isinstance(b.recs, LazyRecs) and not b.recs.got
    assert b.recs[-1]["s"] == 49 and len(b.recs.got) == 1
    assert [r["s"] for r in b.recs] == list(range(50))


def test_without_the_module_the_python_planner(tmp_path, monkeypatch):
    p = tmp_path / "o.cusnap"
    with SnapshotWriter(p, {"pid": 1}) as w:
        w.write({"k": "c", "s": 1, "tid": 1, "f": "cuCtxSynchronize", "a": {}, "r": 0})
    (_, kind) = _prescan(p, False, monkeypatch)
    assert kind == "Planner"
    (_, kind) = _prescan(p, True, monkeypatch)
    assert kind == "NativePlanner"


def test_one_op_layout_for_python_and_both_c_files():
    """The plan's op is described once (formats/opkinds.py OP_FIELDS): the executor's compiled
    struct has its size and every field's offset, Python packs it with OP_FORMAT, and neither C
    file declares its own."""
    import struct
    from pathlib import Path
    from cudasnap.formats import opkinds as K
    from cudasnap.replay._executor import ffi
    assert struct.calcsize(K.OP_FORMAT) == K.OP_BYTES == ffi.sizeof("ex_op")
    off = 0
    for name, _ctype, _n, fmt in K.OP_FIELDS:       # "<": no padding but the layout's own (4x)
        assert ffi.offsetof("ex_op", name) == off, name
        off += struct.calcsize("<" + fmt)
    root = Path(__file__).resolve().parents[1]
    for c in (root / "replay" / "executor.c", root / "replay" / "plan_walk.c"):
        text = c.read_text()
        assert "} ex_op;" not in text and '#include "opkinds.h"' in text, c
    assert "} ex_op;" in K.c_header() and K.ex_op_cdef() in K.c_header()
