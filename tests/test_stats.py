"""`cudasnap stats`: per-API, per-kernel and per-kind summaries, and the nsys-named export."""
from __future__ import annotations

import csv
import json
import sqlite3
import subprocess
import sys

import pytest

from cudasnap.formats import SnapshotReader

TABLES = {"StringIds", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
          "CUPTI_ACTIVITY_KIND_MEMSET", "ENUM_CUDA_MEMCPY_OPER", "ENUM_CUDA_MEM_KIND", "CUDASNAP_META"}


def _stats(*args: str, cwd=None):
    return subprocess.run([sys.executable, "-m", "cudasnap", "stats", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


@pytest.fixture
def snap(double, capture, tmp_path):
    """launch_forms: launches by cuLaunchKernel (params and extra), cuLaunchKernelEx,
    cuLaunchCooperativeKernel, library kernels, a stream capture and graph launches, D2H copies."""
    cp, path = capture(double["progs"]["launch_forms"])
    assert cp.returncode == 0, cp.stderr
    return path


def _calls(path):
    with SnapshotReader(path) as r:
        return [c for c in r.records("c")]


def test_reports_match_the_records(snap):
    calls = _calls(snap)
    cp = _stats(str(snap), "--format", "json")
    assert cp.returncode == 0, cp.stderr
    d = json.loads(cp.stdout)
    api = {r["name"]: r for r in d["api"]}
    want = {}
    for c in calls:
        want.setdefault(c["f"], []).append(c["t1"] - c["t0"])
    assert {n: r["calls"] for n, r in api.items()} == {n: len(v) for n, v in want.items()}
    for n, v in want.items():
        assert api[n]["total_ns"] == sum(v) and api[n]["min_ns"] == min(v) and api[n]["max_ns"] == max(v)
    assert abs(sum(r["time_pct"] for r in d["api"]) - 100.0) < 1e-6
    kern = {r["name"]: r for r in d["kernels"]}
    assert sum(r["launches"] for r in d["kernels"]) == sum(1 for c in calls if c["f"].startswith("cuLaunch"))
    assert kern["fill"]["launches"] == 2 and kern["saxpy"]["launches"] == 1
    assert kern["add_one"]["shapes"] == 2                         # cuLaunchKernelEx used 4x128
    mem = {r["kind"]: r for r in d["memory"]}
    assert mem["D2H"]["count"] == 3 and mem["D2H"]["total_bytes"] == 6144
    assert "replay" in d["device_times"] and "--profile timeline" in d["device_times"]


def test_text_output_is_plain_in_a_pipe(snap):
    cp = _stats(str(snap))
    assert cp.returncode == 0, cp.stderr
    out = cp.stdout
    assert "\x1b[" not in out and "━" not in out and "│" not in out
    assert "CUDA Driver API Summary" in out and "Kernel Launch Summary" in out and "Memory Operations by Kind" in out
    line = next(l for l in out.splitlines() if l.rstrip().endswith(" cuLaunchKernelEx"))
    assert len(line.split()) >= 9                                 # one row, every column, no wrapping
    assert "--profile timeline" in out


def test_csv_reports(snap):
    cp = _stats(str(snap), "--format", "csv", "--report", "kernels", "--report", "memory")
    assert cp.returncode == 0, cp.stderr
    blocks = cp.stdout.strip().split("\n\n")
    assert [b.splitlines()[0] for b in blocks] == ["# kernels", "# memory"]
    rows = list(csv.DictReader(blocks[0].splitlines()[1:]))
    assert {r["Name"]: int(r["Launches"]) for r in rows}["fill"] == 2
    assert rows[0]["Grid"] == "2x1x1"


def test_sqlite_export_has_nsys_tables(snap, tmp_path):
    calls = _calls(snap)
    db = tmp_path / "report.sqlite"
    cp = _stats(str(snap), "--out", str(db))
    assert cp.returncode == 0, cp.stderr
    con = sqlite3.connect(db)
    names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert TABLES <= names
    # the queries people run on an nsys export work here
    kernels = con.execute("SELECT s.value, k.gridX, k.blockX, k.start, k.end, k.correlationId "
                          "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON k.shortName = s.id "
                          "ORDER BY k.correlationId").fetchall()
    launches = [c for c in calls if c["f"].startswith("cuLaunch")]
    assert [k[5] for k in kernels] == [c["s"] for c in launches]
    assert [(k[3], k[4]) for k in kernels] == [(c["t0"], c["t1"]) for c in launches]   # host times
    assert {k[0] for k in kernels} == {"fill", "add_one", "saxpy"}
    assert ("add_one", 4, 128) in {(k[0], k[1], k[2]) for k in kernels}                 # cuLaunchKernelEx
    joined = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
                         "ON r.correlationId = k.correlationId JOIN StringIds n ON n.id = r.nameId "
                         "WHERE n.value LIKE 'cuLaunch%'").fetchone()[0]
    assert joined == len(launches)
    assert con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0] == len(calls)
    copies = con.execute("SELECT m.bytes, e.name FROM CUPTI_ACTIVITY_KIND_MEMCPY m "
                         "JOIN ENUM_CUDA_MEMCPY_OPER e ON e.id = m.copyKind").fetchall()
    assert copies == [(2048, "CUDA_MEMCPY_KIND_DTOH")] * 3
    pid = SnapshotReader(snap).header["pid"]
    gpids = {r[0] for r in con.execute("SELECT globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL")}
    assert gpids == {pid << 24}
    meta = dict(con.execute("SELECT name, value FROM CUDASNAP_META"))
    assert "replay" in meta["device_times"]
    con.close()

    cp = _stats(str(snap), "--out", str(db))
    assert cp.returncode == 2 and "exists" in cp.stderr and "--force-overwrite" in cp.stderr
    assert _stats(str(snap), "-f", "--out", str(db)).returncode == 0


def test_csv_directory_export(snap, tmp_path):
    d = tmp_path / "tables"
    cp = _stats(str(snap), "--out", f"{d}/")
    assert cp.returncode == 0, cp.stderr
    assert {p.stem for p in d.glob("*.csv")} == TABLES
    with open(d / "CUPTI_ACTIVITY_KIND_KERNEL.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 8 and rows[0]["gridX"] == "2" and rows[0]["blockX"] == "256"
    assert _stats(str(snap), "--out", str(d)).returncode == 2           # exists: refused
    assert _stats(str(snap), "--out", str(d), "--force-overwrite").returncode == 0


def test_memsets_and_counted_queries(tmp_path):
    """A synthetic snapshot: memsets by kind and value, identical queries counted at capture."""
    from cudasnap.formats import SnapshotWriter

    p = tmp_path / "syn.cusnap"
    with SnapshotWriter(p, {"format": "cudasnap", "schema": 1, "pid": 7}) as w:
        w.write({"k": "c", "s": 0, "tid": 7, "t0": 100, "t1": 200, "f": "cuMemsetD32_v2",
                 "a": {"dstDevice": 1 << 40, "ui": 5, "N": 256}, "r": 0})
        w.write({"k": "c", "s": 1, "tid": 7, "t0": 300, "t1": 350, "f": "cuMemsetD8Async",
                 "a": {"dstDevice": 1 << 40, "uc": 1, "N": 100, "hStream": 0}, "r": 0})
        w.write({"k": "c", "s": 2, "tid": 7, "t0": 400, "t1": 400, "f": "cuCtxGetDevice", "a": {"device": 0}, "r": 0})
        w.write({"k": "rep", "tid": 7, "t": 500, "calls": [{"f": "cuCtxGetDevice", "of": 2, "n": 9}]})
        w.write({"k": "c", "s": 3, "tid": 7, "t0": 600, "f": "cuCtxSynchronize", "a": {}})     # never returned
    cp = _stats(str(p), "--format", "json")
    assert cp.returncode == 0, cp.stderr
    d = json.loads(cp.stdout)
    mem = {r["kind"]: r for r in d["memory"]}
    assert mem["memset"]["count"] == 2 and mem["memset"]["total_bytes"] == 1024 + 100
    api = {r["name"]: r for r in d["api"]}
    assert api["cuCtxGetDevice"]["calls"] == 1 and api["cuCtxGetDevice"]["counted"] == 9
    assert api["cuCtxSynchronize"]["calls"] == 1 and api["cuCtxSynchronize"]["total_ns"] == 0
    assert "Counted" in _stats(str(p)).stdout
    db = tmp_path / "syn.sqlite"
    assert _stats(str(p), "--out", str(db)).returncode == 0
    con = sqlite3.connect(db)
    assert con.execute("SELECT value, bytes, memKind FROM CUPTI_ACTIVITY_KIND_MEMSET ORDER BY correlationId"
                       ).fetchall() == [(5, 1024, 3), (1, 100, 3)]
    assert con.execute("SELECT end FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId = 3").fetchone() == (None,)
    con.close()


def test_errors_are_one_line(tmp_path):
    for args, msg in (([str(tmp_path / "none.cusnap")], "none.cusnap"),
                      ([str(tmp_path / "none.cusnap"), "--out", "x.txt"], "FILE.sqlite"),
                      ([str(tmp_path / "none.cusnap"), "--out", str(tmp_path / "no" / "x.sqlite")], "no such directory")):
        cp = _stats(*args)
        assert cp.returncode == 2 and cp.stderr.startswith("cudasnap: error: ") and msg in cp.stderr, cp.stderr
        assert len(cp.stderr.strip().splitlines()) == 1
