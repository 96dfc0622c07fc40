"""`cudasnap info`, `dump`, `repair` through the typer app (no GPU)."""
from __future__ import annotations

import json
import struct

import pytest
from typer.testing import CliRunner

from cudasnap.cli import app
from cudasnap.formats import SnapshotReader, SnapshotWriter

try:
    runner = CliRunner(mix_stderr=False)
except TypeError:                    # click >= 8.2 always separates stderr
    runner = CliRunner()


def _stderr(res) -> str:
    try:
        return res.stderr
    except (ValueError, AttributeError):
        return res.output


def make_session(path, close=True, frame_bytes=2 << 20):
    w = SnapshotWriter(path, {"pid": 4242, "host": "box", "argv": ["python", "train.py"]},
                       frame_bytes=frame_bytes)
    s = iter(range(1, 10**6))
    t = [1000]

    def call(f, a, r=0, x=None, ret=True):
        t0 = t[0]
        t[0] += 1000
        rec = {"k": "c", "s": next(s), "tid": 7, "t0": t0, "t1": t0 + 500, "f": f, "a": a}
        if ret:
            rec["r"] = r
        if x:
            rec["x"] = x
        w.write(rec)

    call("cuInit", {"Flags": 0})
    w.write({"k": "proc", "driver_version": 12040,
             "gpus": [{"index": 0, "name": "NVIDIA H100", "uuid": "GPU-1", "cc": [9, 0], "mem": 80 << 30}]})
    img = w.add_blob(b"\x7fELF" + b"\x00" * 5000)
    call("cuModuleLoadData", {"module": 0x100, "image": 0x200}, x={"image": {"blob": img}})
    call("cuLibraryLoadData", {"library": 0x300}, x={"image": {"blob": img}})
    w.write({"k": "fn", "h": 0x400, "name": "gemm_kernel", "kind": "function", "module": 0x100, "params": [[0, 8]]})
    w.write({"k": "fn", "h": 0x500, "name": "relu", "kind": "kernel", "module": None, "params": [[0, 8]]})
    call("cuMemAlloc_v2", {"dptr": 0x7F0000000000, "bytesize": 1 << 20})
    call("cuMemAllocAsync", {"dptr": 0x7F0000100000, "bytesize": 4096, "hStream": 0})
    payload = bytes(range(256)) * 16
    b = w.add_blob(payload)
    call("cuMemcpyHtoD_v2", {"dstDevice": 0x7F0000000000, "srcHost": 0x1000, "ByteCount": 4096},
         x={"src": {"blob": b}})
    call("cuMemcpyHtoDAsync_v2", {"dstDevice": 0x7F0000000000, "srcHost": 0x1000, "ByteCount": 4096, "hStream": 0},
         x={"src": {"blob": w.add_blob(payload)}})
    call("cuMemsetD32_v2", {"dstDevice": 0x7F0000100000, "ui": 0, "N": 1024})
    for _ in range(5):
        call("cuLaunchKernel", {"f": 0x400, "gridDimX": 8, "blockDimX": 128}, x={"params": b"\x01" * 8})
    call("cuLaunchKernelEx", {"config": {"gridDimX": 1}, "f": 0x500})
    call("cuMemcpyDtoDAsync_v2", {"dstDevice": 1, "srcDevice": 2, "ByteCount": 100, "hStream": 0})
    call("cuMemcpyDtoH_v2", {"dstHost": 0x2000, "srcDevice": 0x7F0000000000, "ByteCount": 4096},
         x={"dst": {"blob": b}})
    call("cuStreamSynchronize", {"hStream": 0}, r=700)
    w.write({"k": "note", "level": "warning", "msg": "dropped 2 records"})
    w.write({"k": "note", "level": "info", "msg": "hello"})
    call("cuCtxSynchronize", {}, ret=False)
    w.write({"k": "end", "exit": None, "signal": 9, "partial": True})
    if close:
        w.close()
    else:
        w.abort()
    return path


@pytest.fixture
def snap(tmp_path):
    return make_session(tmp_path / "s.cusnap")


def test_info_json(snap):
    res = runner.invoke(app, ["info", str(snap), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["process"]["pid"] == 4242 and d["process"]["argv"] == ["python", "train.py"]
    assert d["gpus"][0]["name"] == "NVIDIA H100" and d["driver_version"] == 12040
    assert d["calls"]["by_name"]["cuLaunchKernel"] == 5
    assert d["kernels"]["by_name"] == {"gemm_kernel": 5, "relu": 1}
    assert d["memory"]["H2D"] == {"count": 2, "bytes": 8192}
    assert d["memory"]["D2H"] == {"count": 1, "bytes": 4096}
    assert d["memory"]["D2D"] == {"count": 1, "bytes": 100}
    assert d["memory"]["memset"] == {"count": 1, "bytes": 4096}
    assert d["memory"]["alloc"] == {"count": 2, "bytes": (1 << 20) + 4096}
    assert d["modules"] == {"loads": 2, "image_bytes": 2 * 5004}
    assert d["blobs"]["count"] == 2 and d["blobs"]["dedup_ratio"] > 1
    assert d["calls"]["errors"] == 1 and d["calls"]["unreturned"] == 1
    assert d["notes"] == {"warning": 1, "info": 1}
    assert d["end"] == {"exit": None, "signal": 9, "partial": True}
    assert d["truncated"] is False and d["lost_bytes"] == 0
    assert d["duration_s"] > 0


def test_info_text(snap):
    res = runner.invoke(app, ["info", str(snap)])
    assert res.exit_code == 0, res.output
    out = res.stdout
    for needle in ("NVIDIA H100", "gemm_kernel", "cuLaunchKernel", "H2D", "truncated: no", "signal 9",
                   "python train.py"):
        assert needle in out, needle


def test_info_names_calls_replay_would_refuse(snap, tmp_path):
    res = runner.invoke(app, ["info", str(snap), "--json"])
    assert json.loads(res.stdout)["calls"]["replay_unhandled"] == {}
    assert "refused" not in runner.invoke(app, ["info", str(snap)]).stdout
    p = tmp_path / "tex.cusnap"
    w = SnapshotWriter(p, {"pid": 1})
    w.write({"k": "c", "s": 1, "tid": 7, "t0": 1, "t1": 2, "f": "cuInit", "a": {"Flags": 0}, "r": 0})
    for i in range(2):
        w.write({"k": "c", "s": 2 + i, "tid": 7, "t0": 3, "t1": 4, "f": "cuMipmappedArrayCreate",
                 "a": {"pHandle": i + 1}, "r": 0})
    w.close()
    d = json.loads(runner.invoke(app, ["info", str(p), "--json"]).stdout)
    assert d["calls"]["replay_unhandled"] == {"cuMipmappedArrayCreate": 2}
    assert "calls it does not replay: cuMipmappedArrayCreate (2)" in runner.invoke(app, ["info", str(p)]).stdout


def test_info_truncated(tmp_path):
    p = make_session(tmp_path / "t.cusnap", close=False, frame_bytes=300)
    data = p.read_bytes()
    p.write_bytes(data[:-50])
    res = runner.invoke(app, ["info", str(p), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["truncated"] is True and d["lost_bytes"] > 0


def test_dump_text_and_calls(snap):
    res = runner.invoke(app, ["dump", str(snap)])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    n_records = sum(1 for _ in SnapshotReader(snap).records())
    assert len(lines) == n_records
    assert any(l.startswith("#1  7  cuInit(Flags=0) -> CUDA_SUCCESS (0)") for l in lines)
    assert any("cuMemAlloc_v2(dptr=0x7f0000000000, bytesize=0x100000)" in l for l in lines)
    assert any("CUDA_ERROR_ILLEGAL_ADDRESS (700)" in l for l in lines)
    assert any("<never returned>" in l for l in lines)
    assert any(l.startswith("[fn]") and "gemm_kernel" in l for l in lines)
    assert any(l.startswith("[end]") for l in lines)

    res = runner.invoke(app, ["dump", str(snap), "--calls", "launches"])
    lines = res.stdout.splitlines()
    assert len(lines) == 6 and all("cuLaunchKernel" in l for l in lines)
    assert sum("kernel=gemm_kernel" in l for l in lines) == 5

    res = runner.invoke(app, ["dump", str(snap), "--calls", "relu,1-2"])
    assert [l.split()[0] for l in res.stdout.splitlines()] == ["#1", "#2", "#14"]
    res = runner.invoke(app, ["dump", str(snap), "--calls", "errors"])
    assert len(res.stdout.splitlines()) == 2


def test_dump_jsonl(snap):
    res = runner.invoke(app, ["dump", str(snap), "--format", "jsonl", "--calls", "memcpy"])
    assert res.exit_code == 0, res.output
    objs = [json.loads(l) for l in res.stdout.splitlines()]
    assert len(objs) == 4
    assert objs[0]["x"]["src"]["size"] == 4096 and "hex" not in objs[0]["x"]["src"]
    res = runner.invoke(app, ["dump", str(snap), "--format", "jsonl", "--calls", "launches", "--blobs"])
    objs = [json.loads(l) for l in res.stdout.splitlines()]
    assert objs[0]["x"]["params"] == {"hex": "01" * 8, "len": 8}
    res = runner.invoke(app, ["dump", str(snap), "--format", "jsonl", "--calls", "cuMemcpyHtoD_v2", "--blobs"])
    o = json.loads(res.stdout.splitlines()[0])
    assert o["x"]["src"]["hex"].startswith("000102") and o["x"]["src"]["truncated"] is True


def test_dump_bad_args(snap):
    res = runner.invoke(app, ["dump", str(snap), "--format", "xml"])
    assert res.exit_code == 2 and "cudasnap: error:" in _stderr(res)
    res = runner.invoke(app, ["dump", str(snap), "--calls", "9-3"])
    assert res.exit_code == 2 and "cudasnap: error:" in _stderr(res)


@pytest.mark.parametrize("cmd", [["info"], ["info", "--json"], ["dump"], ["repair"]])
def test_corrupt_file_exit_2_one_line(tmp_path, cmd):
    p = tmp_path / "bad.cusnap"
    p.write_bytes(b"CUSNAP\0\0" + struct.pack("<II", 1, 0) + b"\xde\xad" * 40)
    res = runner.invoke(app, [cmd[0], str(p)] + cmd[1:])
    assert res.exit_code == 2
    err = _stderr(res).strip()
    assert err.startswith("cudasnap: error: ") and "bad.cusnap: offset 16:" in err
    assert "\n" not in err and "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_newer_format_version_refused(tmp_path):
    p = tmp_path / "new.cusnap"
    p.write_bytes(b"CUSNAP\0\0" + struct.pack("<II", 3, 0) + b"\0" * 100)
    res = runner.invoke(app, ["info", str(p)])
    assert res.exit_code == 2
    assert "unsupported snapshot format version 3 (this cudasnap reads <= 2)" in _stderr(res)


def test_missing_file(tmp_path):
    res = runner.invoke(app, ["info", str(tmp_path / "nope.cusnap")])
    assert res.exit_code == 2 and "cannot open" in _stderr(res)


def test_repair_cli(tmp_path):
    p = make_session(tmp_path / "r.cusnap", close=False, frame_bytes=300)
    data = p.read_bytes()
    p.write_bytes(data[:-40])
    p.chmod(0o644)
    before = list(SnapshotReader(p).records())
    out = tmp_path / "fixed.cusnap"
    res = runner.invoke(app, ["repair", str(p), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "kept" in res.stdout and "lost" in res.stdout and "skipped" in res.stdout
    r = SnapshotReader(out)
    assert not r.truncated and [x for x in r.records() if x["k"] != "repair"] == before
    assert out.stat().st_mode & 0o777 == 0o644
    res = runner.invoke(app, ["info", str(out)])                # the loss stays visible
    assert res.exit_code == 0 and "repaired : PARTIAL" in res.stdout, res.stdout
    res = runner.invoke(app, ["repair", str(p)])           # in place: the original is kept
    assert res.exit_code == 0
    assert not SnapshotReader(p).truncated and (tmp_path / "r.cusnap.orig").read_bytes() == data[:-40]
    assert p.stat().st_mode & 0o777 == 0o644
    mtime = p.stat().st_mtime_ns
    res = runner.invoke(app, ["repair", str(p)])           # already fine: left alone
    assert res.exit_code == 0 and "intact, nothing to do" in res.stdout
    assert p.stat().st_mtime_ns == mtime


def test_example_file_reads():
    import pathlib
    ex = pathlib.Path(__file__).resolve().parents[1] / "examples" / "synthetic.cusnap"
    if not ex.exists():
        pytest.skip("examples/synthetic.cusnap not generated")
    assert ex.stat().st_size < 200_000
    res = runner.invoke(app, ["info", str(ex), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["kernels"]["by_name"] and d["end"]["exit"] == 0 and not d["truncated"]


def _corrupt_cases(tmp_path):
    """(name, path) of snapshots replay must refuse: one line on stderr, exit 2, no GPU needed."""
    import os
    good = make_session(tmp_path / "good.cusnap", frame_bytes=300)
    data = good.read_bytes()
    r = SnapshotReader(good)
    rec_off = [o for o, k, _ in r.frames() if k == "records"][1]
    r.close()
    cases = {
        "random": os.urandom(4000),
        "bad_checksum": data[:rec_off + 40] + bytes([data[rec_off + 40] ^ 1]) + data[rec_off + 41:],
        "truncated_header": data[:30],
        "version_3": data[:8] + struct.pack("<I", 3) + data[12:],
        "no_calls": data[:r.frames()[1][0]],
    }
    for name, blob in cases.items():
        p = tmp_path / f"{name}.cusnap"
        p.write_bytes(blob)
        yield name, p


@pytest.mark.parametrize("cmd", ["replay", "info", "dump"])
def test_bad_snapshots_are_one_line_exit_2(tmp_path, cmd):
    for name, p in _corrupt_cases(tmp_path):
        if name == "no_calls" and cmd != "replay":
            continue                 # info and dump show an empty snapshot as it is
        res = runner.invoke(app, [cmd, str(p)])
        err = _stderr(res).strip()
        assert res.exit_code == 2, (name, res.output)
        assert err.startswith("cudasnap: error: ") and "\n" not in err, (name, err)
        assert res.exception is None or isinstance(res.exception, SystemExit), name
        if cmd == "replay":
            assert res.stdout == "", (name, res.stdout)
    res = runner.invoke(app, ["replay", str(tmp_path / "no_calls.cusnap")])
    assert "no replayable call in" in _stderr(res)


def test_pipes_get_whole_plain_lines(snap):
    res = runner.invoke(app, ["api"])
    assert res.exit_code == 0
    lines = [l for l in res.stdout.splitlines() if l.split()[:1] == ["cuStreamBeginCapture_v2"]]
    assert len(lines) == 1 and "stream" in lines[0]
    res = runner.invoke(app, ["info", str(snap)])
    assert res.exit_code == 0
    assert not set("│┃━─╇┏") & set(res.stdout), res.stdout
    assert "None" not in res.stdout and "signal 9" in res.stdout
    res = runner.invoke(app, ["dump", str(snap)])
    assert "None" not in res.stdout and "[end] signal=9 partial=true" in res.stdout


def test_help_and_version():
    from importlib.metadata import version
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.stdout.startswith(f"cudasnap {version('cudasnap')}")
    for cmd in ([], ["capture"], ["info"], ["dump"], ["repair"], ["api"], ["replay"]):
        res = runner.invoke(app, cmd + ["--help"])
        assert res.exit_code == 0, cmd
        for junk in ("<bool>", "<path>", "<int>", "<str>", "{", "╭"):
            assert junk not in res.stdout.replace("%q{VAR}", ""), (cmd, junk)     # -o's %q{VAR} is meant
    res = runner.invoke(app, ["replay", "--help"])
    line = next(l for l in res.stdout.splitlines() if "--sync-after-launch" in l)
    assert "Synchronize after every launch (pins failures to a kernel)." in line
