"""Integrity before work: replay, export and extract check every frame's checksum before the
GPU or the output does anything, and refuse a damaged snapshot with one line naming the frame's
offset; `info` reports damaged frames; printing commands exit 0 when their reader goes away."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from cudasnap.formats import SnapshotError, SnapshotReader, SnapshotWriter
from cudasnap.formats.integrity import check_integrity, damaged_frames


def _cli(double, *args, timeout=120, **kw):
    return subprocess.run([sys.executable, "-m", "cudasnap", *map(str, args)], env=double["env"],
                          capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture(scope="module")
def snap(double, tmp_path_factory):
    p = tmp_path_factory.mktemp("integ") / "windowed.cusnap"
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "capture", "-o", str(p), "--ring-mb", "16", "--",
                         double["progs"]["windowed"]], env=double["env"], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    return p


def _flip(src, dst, kind, which=-1):
    """A copy of src with one bit flipped in the middle of a `kind` frame's payload; its offset."""
    with SnapshotReader(src) as r:
        fr = [f for f in r.frames() if f[1] == kind][which]
    data = bytearray(open(src, "rb").read())
    data[fr[0] + 32 + fr[2] // 2] ^= 0x10
    open(dst, "wb").write(data)
    return fr[0]


@pytest.mark.parametrize("kind", ["chunk", "records"])
def test_damaged_frame_is_refused_before_any_work(double, snap, tmp_path, kind):
    bad = tmp_path / f"bad_{kind}.cusnap"
    off = _flip(snap, bad, kind)
    ex_out, exp_out = tmp_path / "x.cusnap", tmp_path / "exported"
    for args in (["replay", bad], ["replay", bad, "-c", "1"], ["extract", bad, "--calls", "10-40", "-o", ex_out],
                 ["export", bad, "-o", exp_out], ["replay", bad, "--profile", "timeline"]):
        cp = _cli(double, *args)
        assert cp.returncode == 2, (args, cp.stdout, cp.stderr)
        assert "Traceback" not in cp.stdout + cp.stderr
        lines = [ln for ln in cp.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and f"offset {off}" in lines[0] and "checksum" in lines[0], (args, cp.stderr)
        assert "placement:" not in cp.stdout and "calls replayed" not in cp.stdout    # no replay ran
    assert not ex_out.exists() and not exp_out.exists()
    code = "import sys\nfrom cudasnap.replay import replay\nr = replay(sys.argv[1])\nprint(r.exit_code, r.errors[0])"
    cp = subprocess.run([sys.executable, "-c", code, str(bad)], env=double["env"], capture_output=True, text=True,
                        timeout=120)
    assert cp.stdout.startswith("2 ") and f"offset {off}" in cp.stdout, cp.stdout + cp.stderr


def test_info_reports_damaged_frames(double, snap, tmp_path):
    bad = tmp_path / "bad.cusnap"
    off = _flip(snap, bad, "chunk")
    cp = _cli(double, "info", bad)
    assert cp.returncode == 0, cp.stderr            # every record still reads
    line = next(ln for ln in cp.stdout.splitlines() if ln.startswith("damaged"))
    assert "YES" in line and f"chunk at offset {off}" in line and "repair" in line
    d = json.loads(_cli(double, "info", bad, "--json").stdout)
    assert d["damaged_frames"] == [{"offset": off, "kind": "chunk", "problem": "frame payload checksum mismatch"}]
    clean = _cli(double, "info", snap)
    assert "damaged" not in clean.stdout
    assert json.loads(_cli(double, "info", snap, "--json").stdout)["damaged_frames"] == []


def test_check_payloads_reads_every_frame_in_order(tmp_path):
    p = tmp_path / "s.cusnap"
    with SnapshotWriter(p, {"argv": ["t"]}, level=1) as w:
        for i in range(6):
            data = os.urandom(1 << 20) if i % 2 else bytes(1 << 20)     # stored and compressed chunks
            bid = w.add_blob(data)
            w.write({"k": "c", "s": i, "f": "cuMemcpyHtoD_v2", "a": {"ByteCount": len(data)},
                     "x": {"srcHost": {"blob": bid}}, "r": 0})
    seen = []
    with SnapshotReader(p) as r:
        r.check_payloads(lambda done, total: seen.append((done, total)))
        assert check_integrity(r) is None and damaged_frames(r) == []
        frames = r.frames()
    assert len(seen) == len(frames) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert seen[-1][0] == seen[-1][1] == frames[-1][0] + 32 + frames[-1][2]
    for kind in ("chunk", "records"):
        for which in (0, 1, -1):
            q = tmp_path / f"f_{kind}{which}.cusnap"
            try:
                off = _flip(p, q, kind, which)
            except IndexError:
                continue
            with SnapshotReader(q) as r:
                with pytest.raises(SnapshotError, match=f"offset {off}"):
                    r.check_payloads()
                assert f"offset {off}" in check_integrity(r, quiet=True)
                assert [o for o, _k, _w in damaged_frames(r)] == [off]


def test_check_payloads_costs_about_a_read(tmp_path):
    """64 MiB of incompressible and compressible chunks: the check decodes nothing."""
    p = tmp_path / "big.cusnap"
    with SnapshotWriter(p, {"argv": ["t"]}, level=1) as w:
        for i in range(16):
            data = os.urandom(4 << 20) if i % 2 else (bytes(range(256)) * (1 << 14))[:4 << 20] + bytes([i])
            w.write({"k": "c", "s": i, "f": "cuMemcpyHtoD_v2", "a": {}, "x": {"srcHost": {"blob": w.add_blob(data)}},
                     "r": 0})
    with SnapshotReader(p) as r:
        t0 = time.monotonic()
        r.check_payloads()
        dt = time.monotonic() - t0
    assert dt < 3.0, f"checking {os.path.getsize(p) >> 20} MiB took {dt:.2f} s"


def test_snapshot_reader_is_iterable_and_documented(snap):
    assert SnapshotReader.__doc__ and "for rec in r" in SnapshotReader.__doc__
    with SnapshotReader(snap) as r:
        recs = list(r)
        assert recs == list(r.records()) and any(x["k"] == "c" for x in recs)


@pytest.mark.parametrize("cmd", [["info"], ["dump"], ["stats"], ["info", "--json"]])
def test_printing_into_a_closed_pipe_exits_0(double, snap, cmd):
    r, w = os.pipe()
    os.close(r)                       # the reader is gone before the first line: EPIPE for sure
    try:
        cp = subprocess.run([sys.executable, "-m", "cudasnap", cmd[0], str(snap), *cmd[1:]], env=double["env"],
                            stdout=w, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(w)
    assert cp.returncode == 0, cp.stderr
    assert "Traceback" not in cp.stderr
