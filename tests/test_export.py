"""`cudasnap export` end to end on the CUDA test double: capture a program, export it as a
standalone C program, build it with the C compiler against the double (its cuda.h and
libcuda), run it, check the verification and the exit codes."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cudasnap.formats import SnapshotWriter
from cudasnap.formats.abi import base_name

pytestmark = pytest.mark.skipif(shutil.which("make") is None or shutil.which(os.environ.get("CC", "cc")) is None,
                                reason="needs make and a C compiler")


def _export(snap, out, *args):
    return subprocess.run([sys.executable, "-m", "cudasnap", "export", str(snap), "-o", str(out), *args],
                          capture_output=True, text=True, timeout=120)


def _build(double, out):
    cp = subprocess.run(["make", "-s", "-C", str(out), f"CC={os.environ.get('CC', 'cc')}",
                         f"CFLAGS=-O1 -Wall -I{double['cuda_include']}", f"LDFLAGS=-L{double['libdir']}",
                         "CUDA_HOME=/nonexistent"], capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    return out / "replay"


def _run(double, exe, *args):
    return subprocess.run([str(exe), *args], env=double["env"], capture_output=True, text=True, timeout=120)


def _exported(double, capture, tmp_path, prog, *export_args):
    cp, snap = capture(double["progs"][prog])
    assert cp.returncode == 0, cp.stderr
    out = tmp_path / f"exp_{prog}"
    ex = _export(snap, out, *export_args)
    assert ex.returncode == 0, ex.stdout + ex.stderr
    return snap, out, _build(double, out)


@pytest.mark.parametrize("prog,kernels", [("direct", ["add_one"]), ("chase", ["chase"]),
                                          ("launch_forms", ["fill", "add_one", "saxpy"]),
                                          ("hostfree", ["add_one"])])
def test_exported_program_builds_runs_and_verifies(prog, kernels, double, capture, tmp_path):
    """hostfree's first kernel reads mapped pinned host memory through its host address: the
    program holds that range before the driver loads and pins it where the program had it."""
    _snap, out, exe = _exported(double, capture, tmp_path, prog)
    src = (out / "replay.c").read_text()
    assert "#include <cuda.h>" in src and "reserve_exact(0x" in src
    if prog == "hostfree":
        assert "host_reserve(0x" in src and "host_place(0x" in src and "host_unplace(0x" in src
    assert "CU_LAUNCH_PARAM_BUFFER_POINTER" in src
    run = _run(double, exe)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "OK: " in run.stdout and "device-to-host results verified" in run.stdout
    assert "0 device-to-host results verified" not in run.stdout
    table = run.stdout.split("median us")[1]
    for k in kernels:
        assert k in table, run.stdout


def test_corrupted_expected_result_exits_1(double, capture, tmp_path):
    _snap, out, exe = _exported(double, capture, tmp_path, "chase")
    d2h = sorted((out / "data").glob("d2h-*.bin"))
    assert len(d2h) == 1
    data = bytearray(d2h[0].read_bytes())
    data[9] ^= 0x40
    d2h[0].write_bytes(bytes(data))
    run = _run(double, exe)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "MISMATCH call #" in run.stderr and "cuMemcpyDtoH" in run.stderr and "byte 9" in run.stderr
    assert "FAILED: 1 of 1" in run.stdout


def test_driver_error_and_missing_data_exit_2(double, capture, tmp_path):
    _snap, out, exe = _exported(double, capture, tmp_path, "direct")
    run = _run(double, exe, "-d", "3")
    assert run.returncode == 2 and "only 1 device" in run.stderr
    img = next((out / "data").glob("module-*.bin"))
    good = img.read_bytes()
    img.write_bytes(b"NOT A MODULE IMAGE\n".ljust(len(good), b" "))
    run = _run(double, exe)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "cuModuleLoadData returned CUDA_ERROR_INVALID_IMAGE" in run.stderr
    img.write_bytes(good)
    h2d = next((out / "data").glob("h2d-*.bin"))
    h2d.write_bytes(h2d.read_bytes()[:-1])
    run = _run(double, exe)
    assert run.returncode == 2 and "shorter than expected" in run.stderr, run.stderr
    # data files are found beside the program wherever it is run from, or in -C DIR
    shutil.move(str(out / "data"), str(tmp_path / "elsewhere"))
    run = _run(double, exe)
    assert run.returncode == 2 and "cannot open data file" in run.stderr


def test_call_set_keeps_state_building_calls(double, capture, tmp_path):
    snap, out, exe = _exported(double, capture, tmp_path, "direct", "--calls", "8-10")
    run = _run(double, exe)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "launches: 3" in run.stdout and "OK: 0 device-to-host" in run.stdout


def test_export_refuses_a_call_it_cannot_translate(tmp_path):
    snap = tmp_path / "arr.cusnap"
    with SnapshotWriter(snap, {"argv": ["arr"]}) as w:
        w.write({"k": "c", "s": 0, "tid": 1, "t0": 0, "t1": 1, "f": "cuInit", "a": {"Flags": 0}, "r": 0})
        w.write({"k": "c", "s": 1, "tid": 1, "t0": 2, "t1": 3, "f": "cuArrayCreate_v2",
                 "a": {"pHandle": 0x1234, "pAllocateArray": b"\0" * 24}, "r": 0})
    ex = _export(snap, tmp_path / "out")
    assert ex.returncode == 2
    assert "call #1 cuArrayCreate_v2" in ex.stderr and "cannot translate" in ex.stderr
    assert not (tmp_path / "out" / "replay.c").exists()


def test_extracted_kernel_exports_as_a_standalone_repro(double, capture, tmp_path):
    cp, snap = capture(double["progs"]["chase"])
    assert cp.returncode == 0
    small = tmp_path / "chase_kernel.cusnap"
    ex = subprocess.run([sys.executable, "-m", "cudasnap", "extract", str(snap), "--kernel", "chase", "-o", str(small)],
                        env=double["env"], capture_output=True, text=True, timeout=120)
    assert ex.returncode == 0, ex.stdout + ex.stderr
    out = tmp_path / "repro"
    assert _export(small, out).returncode == 0
    run = _run(double, _build(double, out))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "OK: 10 device-to-host results verified" in run.stdout


def test_extract_with_exact_ranges_exports_and_verifies(double, capture, tmp_path):
    cp, snap = capture(double["progs"]["carve"])
    assert cp.returncode == 0
    small = tmp_path / "saxpy.cusnap"
    ex = subprocess.run([sys.executable, "-m", "cudasnap", "extract", str(snap), "--kernel", "saxpy", "-o", str(small)],
                        env=double["env"], capture_output=True, text=True, timeout=120)
    assert ex.returncode == 0 and "(25.0%)" in ex.stdout, ex.stdout + ex.stderr
    out = tmp_path / "repro"
    assert _export(small, out).returncode == 0
    run = _run(double, _build(double, out))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "OK: 2 device-to-host results verified" in run.stdout


# ------------------------------------------------------------------ every extract exports
_PROGS = [("direct", ()), ("chase", ()), ("launch_forms", ()), ("carve", ()), ("queries", ()), ("unified", ()),
          ("threads", ("5",)), ("reload", ()), ("viaproc", ()), ("windowed", ("3",))]
# host-only calls a framework makes around its launches, spliced into a captured program
_HOST_ONLY = [("cuMemAllocHost_v2", {"pp": 0x7f0000001000, "bytesize": 4096}),
              ("cuMemHostGetDevicePointer_v2", {"pdptr": 0x7f0000001000, "p": 0x7f0000001000, "Flags": 0}),
              ("cuPointerGetAttribute", {"data": 0, "attribute": 1, "ptr": 0x7f0000001000}),
              ("cuCtxGetDevice", {"device": 0}), ("cuDeviceGetAttribute", {"pi": 80, "attrib": 16, "dev": 0}),
              ("cuMemHostGetFlags", {"pFlags": 0, "p": 0x7f0000001000})]


def _translated_or_host_only(f: str) -> bool:
    from cudasnap.export.emit import Emitter
    return Emitter.method_for(f) is not None or Emitter("-").host_only(f)


def _with_host_only_calls(src, dst) -> int:
    """A copy of snapshot src with the _HOST_ONLY calls inserted before its first launch (the
    sequence numbers of the calls after them move up): returns how many were inserted."""
    from cudasnap.formats import SnapshotReader
    with SnapshotReader(src) as r, SnapshotWriter(dst, r.header) as w:
        shift, seen_launch = 0, False
        for rec in r.records():
            rec = dict(rec)
            x = rec.get("x")
            if isinstance(x, dict):
                rec["x"] = {k: ({**v, "blob": w.add_blob(r.blob(v["blob"]))}
                                if isinstance(v, dict) and isinstance(v.get("blob"), str) else v) for k, v in x.items()}
            if rec.get("k") == "c" and isinstance(rec.get("s"), int):
                if not seen_launch and rec.get("f", "").startswith("cuLaunch"):
                    seen_launch = True
                    for i, (f, a) in enumerate(_HOST_ONLY):
                        w.write({"k": "c", "s": rec["s"] + i, "tid": rec.get("tid"), "t0": rec.get("t0", 0),
                                 "t1": rec.get("t0", 0), "f": f, "a": dict(a), "r": 0})
                    shift = len(_HOST_ONLY)
                rec["s"] += shift
            w.write(rec)
    return shift


def test_every_recorded_call_exports_or_is_dropped_as_host_only(double, capture, tmp_path):
    """Every call name the test-double programs record has a C translation or is host-only
    (dropped with a note); a call with device effect and no translation is still refused."""
    from cudasnap.export.emit import export_snapshot
    from cudasnap.formats import SnapshotReader
    names = set()
    for prog, args in _PROGS:
        cp, snap = capture(double["progs"][prog], *args)
        assert cp.returncode == 0, (prog, cp.stderr)
        with SnapshotReader(snap) as r:
            names |= {rec["f"] for rec in r.records(["c"]) if rec.get("r") == 0 and isinstance(rec.get("f"), str)}
        export_snapshot(snap, tmp_path / f"exp_{prog}")       # raises ExportError on an untranslatable call
    missing = sorted(n for n in names if not _translated_or_host_only(n))
    assert not missing, missing
    for f, _a in _HOST_ONLY:
        assert _translated_or_host_only(f), f
    assert not _translated_or_host_only("cuArrayCreate_v2") and not _translated_or_host_only("cuMemcpy3DPeer")


def test_extract_with_host_only_calls_exports_builds_and_verifies(double, capture, tmp_path):
    cp, snap = capture(double["progs"]["chase"])
    assert cp.returncode == 0, cp.stderr
    spliced = tmp_path / "spliced.cusnap"
    assert _with_host_only_calls(snap, spliced) == len(_HOST_ONLY)
    small = tmp_path / "chase_kernel.cusnap"
    ex = subprocess.run([sys.executable, "-m", "cudasnap", "extract", str(spliced), "--kernel", "chase", "-o", str(small)],
                        env=double["env"], capture_output=True, text=True, timeout=120)
    assert ex.returncode == 0, ex.stdout + ex.stderr
    out = tmp_path / "repro"
    e = _export(small, out)
    assert e.returncode == 0, e.stdout + e.stderr
    assert "dropped 1 host-only call(s) without device effect: cuMemHostGetDevicePointer_v2 x1" in e.stdout, e.stdout
    src = (out / "replay.c").read_text()
    assert "dropped host-only (no device effect): cuMemHostGetDevicePointer_v2" in src
    # the whole spliced snapshot too: every inserted name in one comment, each counted in the summary
    full = tmp_path / "full"
    e = _export(spliced, full)
    assert e.returncode == 0, e.stdout + e.stderr
    for f, _a in _HOST_ONLY[1:]:        # pinned host memory: translated as a call without device effect
        assert f"{f} x1" in e.stdout, (f, e.stdout)
    run = _run(double, _build(double, out))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "OK: 10 device-to-host results verified" in run.stdout
    run = _run(double, _build(double, full))
    assert run.returncode == 0 and "OK: " in run.stdout, run.stdout + run.stderr


def test_managed_memory_exports_and_extracts_with_its_host_written_bytes(double, capture, tmp_path):
    """progs/managed.c: the exported program writes the managed bytes recorded with a launch back
    before it and verifies the final ones at the free; an extract of the last launch carries the
    bytes the host wrote before it and exports the same way; a wrong kernel is caught."""
    snap, out, exe = _exported(double, capture, tmp_path, "managed")
    run = _run(double, exe)
    assert run.returncode == 0 and "OK: 1 device-to-host results verified" in run.stdout, run.stdout + run.stderr
    bad = subprocess.run([str(exe)], env=dict(double["env"], CUDA_DOUBLE_CORRUPT="add_one:3"),
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    small = tmp_path / "last.cusnap"
    ex = subprocess.run([sys.executable, "-m", "cudasnap", "extract", str(snap), "--kernel", "add_one#3", "-o", str(small),
                         "--check"], env=double["env"], capture_output=True, text=True, timeout=120)
    assert ex.returncode == 0, ex.stdout + ex.stderr
    e = _export(small, tmp_path / "x")
    assert e.returncode == 0, e.stdout + e.stderr
    run = _run(double, _build(double, tmp_path / "x"))
    assert run.returncode == 0 and "OK: " in run.stdout, run.stdout + run.stderr
