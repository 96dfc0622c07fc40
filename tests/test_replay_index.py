"""The replay index (replay/index.py): a replay reads its snapshot's records once, and every
later reader of them (preflight, end state, selection, notes, profilers) gets the same records,
in the same order, from that one pass. Counted with bench/count_passes.py's instrumented reader."""
from __future__ import annotations

import importlib.util
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from cudasnap.formats import SnapshotReader
from cudasnap.formats.opened import opened
from cudasnap.replay import ReplayOptions
from cudasnap.replay.engine import Replayer
from synth import Synth, write_double_program

ROOT = Path(__file__).resolve().parents[1]
COUNTER = ROOT / "bench" / "count_passes.py"
KINDS = [("c",), ("c", "fn"), ("fn",), ("proc",), ("nvtx",), ("endstate",), ("c", "ctx", "proc", "nvtx", "endstate")]


def _loop_program(path, launches: int, frame_bytes: int):
    spec = importlib.util.spec_from_file_location("bench_graphmode_scale", ROOT / "bench" / "bench_graphmode_scale.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    orig = Synth.__init__
    try:
        Synth.__init__ = lambda self, p, header=None, frame_bytes=frame_bytes: orig(self, p, header, frame_bytes)
        mod.loop_program(path, launches)
    finally:
        Synth.__init__ = orig


def _odd_records(s: Synth, out) -> None:
    """Records of other kinds between calls, and a call left unfinished at the end."""
    s.w.write({"k": "nvtx", "name": "step", "t0": 1, "t1": 2, "tid": 100})
    s.w.write({"k": "ctx", "h": 0x55550000, "device": 0})
    s.call("cuLibraryGetModule", {"pMod": 0x66, "library": 0x67}, r=0)
    s.launch(0x55570001, struct.pack("<Qi", out["A"], 4), block=4, r=700)          # a failed launch
    s.w.write({"k": "endstate", "none": "test"})
    s.call("cuCtxSynchronize", {}, r=None)


def _snapshots(tmp_path):
    a = tmp_path / "prog.cusnap"
    write_double_program(a, frame_bytes=2048, extra_calls=[_odd_records])
    b = tmp_path / "loop.cusnap"
    _loop_program(b, 600, 4096)
    return [a, b]


@pytest.mark.parametrize("native", ["1", "0"])
def test_the_index_gives_the_records_the_file_holds_in_its_order(tmp_path, monkeypatch, native):
    monkeypatch.setenv("CUDASNAP_NATIVE_RECORDS", native)
    for snap in _snapshots(tmp_path):
        rp = Replayer(snap, ReplayOptions())
        rp.ctx.reader = opened(snap)
        rp._prescan()
        idx = rp.ctx.reader
        assert idx.indexed, snap
        with SnapshotReader(snap) as r:
            for kinds in KINDS:
                assert list(idx.records(kinds)) == list(r.records(kinds)), (snap.name, kinds)
            assert list(rp.index.records()) == [rec for rec in r.records() if rec.get("k") != "b"], snap.name
            assert idx.header == r.header
            from cudasnap.replay.retarget import module_loads
            want, got = module_loads(r), module_loads(idx, records=idx.code_records())
            assert [(d["seq"], d["kernels"], d.get("launched")) for d in got] == \
                [(d["seq"], d["kernels"], d.get("launched")) for d in want]


def test_in_call_order_the_calls_are_kept_as_read(tmp_path):
    """No plan is compiled in call order (the loop sorts the calls): the index keeps them."""
    for snap in _snapshots(tmp_path):
        rp = Replayer(snap, ReplayOptions(call_order=True))
        rp.ctx.reader = opened(snap)
        rp._prescan()
        assert rp._plan is None and rp.ctx.reader.indexed
        with SnapshotReader(snap) as r:
            for kinds in KINDS:
                assert list(rp.ctx.reader.records(kinds)) == list(r.records(kinds)), (snap.name, kinds)


def test_read_once_answers_every_kind_from_one_pass(tmp_path):
    from cudasnap.replay.index import read_once
    for snap in _snapshots(tmp_path):
        with SnapshotReader(snap) as r:
            once = read_once(r)
            want = {kinds: list(r.records(kinds)) for kinds in KINDS}
            header = r.header
        with SnapshotReader(snap) as r2:
            once = read_once(r2)
            assert {kinds: list(once.records(kinds)) for kinds in KINDS} == want
            assert once.header == header


def _counted(double, tmp_path, *child):
    res = tmp_path / "counts.json"
    cp = subprocess.run([sys.executable, str(COUNTER), "--child", str(res), *child], env=double["env"],
                        capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    return json.loads(res.read_text())


def test_a_replay_opens_its_snapshot_once_and_reads_its_records_once(double, tmp_path):
    snap = _snapshots(tmp_path)[1]
    with SnapshotReader(snap) as r:
        frames = sum(1 for f in r.frames() if f[1] == "records")
    assert frames > 3
    runs = {"replay": ["cli", "replay", str(snap), "-q"],
            "timeline": ["cli", "replay", str(snap), "-q", "--profile", "timeline"],
            "isolated": ["cli", "replay", str(snap), "-q", "--profile", "isolated", "--repeat", "1", "--warmup", "0",
                         "-c", "2"],
            "campaign cell": ["cell", str(snap), str(tmp_path / "cell.json")],
            "extract": ["cli", "extract", str(snap), "--kernel", "incr#3", "-o", str(tmp_path / "x.cusnap"), "-f"],
            "export": ["cli", "export", str(snap), "-o", str(tmp_path / "exp"), "-f"]}
    for what, child in runs.items():
        c = _counted(double, tmp_path, *child)
        assert c["opens"] == 1, (what, c["open_sites"])
        if what == "extract":             # its own looks at the records (read_once), then its replay's
            assert c["passes"] == 2 and c["checksum_passes"] == 1, c
            continue
        assert c["passes"] == 1, (what, c["pass_sites"])
        assert c["checksum_passes"] == 1, what
        # every records frame decompressed once, with the header and the index
        assert c["decompressions"] == frames + 2, (what, c)
    # a kept campaign worker replays the same snapshot again: no second open, checksum pass or
    # pass over the records (its first replay's prescan is kept: replay/keep.py)
    c = _counted(double, tmp_path, "kept", str(snap), str(tmp_path / "kept.json"))
    assert (c["opens"], c["checksum_passes"], c["passes"]) == (1, 1, 1), c
    assert c["decompressions"] == frames + 2, c


PRODUCT_DIRS = ("advise", "campaign", "capture", "cli", "compare", "export", "formats", "replay", "shim")


def _product_sources():
    for d in PRODUCT_DIRS:
        for p in sorted((ROOT / d).rglob("*.py")):
            yield p.relative_to(ROOT).as_posix(), p.read_text()


def test_every_replay_goes_through_one_function_and_modes_through_one_table():
    """The command line, campaign cells, bisect steps, ranks and the simulator's worker replay
    through invocation.run_request; what a profile mode is (repeats, CUPTI, campaign timing,
    profiler, renderer) is said once, in replay/profile/modes.py."""
    import re
    entry = {"replay/__init__.py", "replay/profile/__init__.py", "replay/invocation.py"}
    calls = [f for f, src in _product_sources() if f not in entry and re.search(r"run_(replay|profile)_cli\(", src)]
    assert calls == []
    mode_lists = re.compile(r"""\(\s*["'](timeline|isolated|graph|metrics)["']\s*,\s*["'](timeline|isolated|graph|metrics)["']""")
    lists = [f for f, src in _product_sources() if f != "replay/profile/modes.py" and mode_lists.search(src)]
    assert lists == []
