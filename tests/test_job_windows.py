"""Windows, flight-recorder snapshots and extracts of a multi-process job.

On the test double: tests/double/progs/jobwin.c runs two ranks that share VMM buffers through
POSIX-fd shareable handles (as NCCL's cuMem transport does) and read each other's buffer every
step. A capture in windows writes one group manifest per window index (STEM.wN.group.json), the
flight recorder one for its snapshots, and `cudasnap extract` of one rank's launch replays the
job up to it and writes an extract that stands alone (imported memory a plain allocation)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cudasnap.formats import SnapshotReader
from cudasnap.formats.group import is_manifest, load

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def jobwin(double, tmp_path_factory):
    """The two-rank program, built against the double."""
    sys.path.insert(0, str(HERE / "double"))
    try:
        from build import CFLAGS
    finally:
        sys.path.pop(0)
    exe = tmp_path_factory.mktemp("jobwin") / "jobwin"
    src = HERE / "double" / "progs" / "jobwin.c"
    cc = os.environ.get("CC", "gcc")
    subprocess.run([cc, *CFLAGS, f"-I{HERE / 'double'}", f"-I{HERE / 'double' / 'progs'}", "-o", str(exe), str(src),
                    f"-L{double['libdir']}", "-lcuda", "-ldl", "-lpthread"], check=True, capture_output=True)
    return str(exe)


def _run(double, *args, timeout=120, env=None):
    e = dict(double["env"])
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "cudasnap", *args], env=e, capture_output=True, text=True,
                          timeout=timeout)


def _checksums(out: str) -> dict:
    return {ln.split()[1]: ln.split()[3] for ln in out.splitlines() if ln.startswith("RANK ")}


def _passes(double, target, n=2, env=None):
    rp = _run(double, "replay", str(target), "--json", env=env)
    assert rp.returncode == 0, rp.stdout + rp.stderr
    d = json.loads(rp.stdout)
    assert d["exit_code"] == 0 and len(d["ranks"]) == n
    for r in d["ranks"]:
        assert r["exit_code"] == 0 and r["errors"] == [], r
        assert r["replay"]["fell_back"] == 0 and not r["replay"]["mismatches"]
    return d


def test_window_of_a_job_has_a_manifest_and_replays_as_a_group(double, jobwin, tmp_path, native):
    ref = native(jobwin, "8")
    out = tmp_path / "win.cusnap"
    # launches 3-8: from the middle of step 1 (its saxpy) to step 4's add_one, on both ranks
    cp = _run(double, "capture", "-o", str(out), "--ring-mb", "16", "--window", "launches:3-8", "--", jobwin, "8")
    assert cp.returncode == 0, cp.stderr
    assert _checksums(cp.stdout) == _checksums(ref.stdout) and len(_checksums(ref.stdout)) == 2
    man = tmp_path / "win.w1.group.json"
    assert is_manifest(man), cp.stderr
    assert f"group manifest {man}: 2 processes" in cp.stderr
    m = load(man)
    assert len(m["ranks"]) == 2 and m["unmatched"] == []
    assert sorted(Path(r["snapshot"]).name.split(".")[-2] for r in m["ranks"]) == ["w1", "w1"]
    # each rank's window imports the other's buffer in its state prologue: two links, both ways
    links = m["links"]
    assert len(links) == 2 and {ln["kind"] for ln in links} == {"shareable"}
    assert {(ln["from"]["pid"], ln["to"]["pid"]) for ln in links} == {(m["ranks"][0]["pid"], m["ranks"][1]["pid"]),
                                                                      (m["ranks"][1]["pid"], m["ranks"][0]["pid"])}
    for r in m["ranks"]:
        with SnapshotReader(r["snapshot"]) as rd:
            assert (rd.header or {}).get("window", {}).get("n") == 1
    d = _passes(double, man)
    for r in d["ranks"]:
        b = r["replay"]
        assert b["launches"] >= 4 and b["d2h_verified"] >= 2
        es = b["endstate"]
        assert es["ranges"] == 3 and es["verified"] == 3 and es["mismatches"] == 0
    # one rank's window alone links the other process: the error names the window's manifest
    alone = _run(double, "replay", m["ranks"][1]["snapshot"])
    assert alone.returncode == 2
    assert f"replay the whole job (its group manifest, or all its snapshots) with `cudasnap replay {man}`" \
        in alone.stdout + alone.stderr


def test_a_jobs_window_opens_and_closes_at_one_cut_of_its_ranks(double, jobwin, tmp_path, native):
    """With the launcher's numbering (LOCAL_WORLD_SIZE, LOCAL_RANK) the ranks meet before each
    state is taken (shim_window_jobcut.c): the window replays as a group, the program's output
    is unchanged, and nobody waited for a missing rank. A rank that never comes (a world of 3)
    is waited for CUDASNAP_JOB_CUT_MS once, then said."""
    ref = native(jobwin, "6")
    job = {"LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    out = tmp_path / "cut.cusnap"
    cp = _run(double, "capture", "-o", str(out), "--ring-mb", "16", "--window", "launches:3-8", "--", jobwin, "6",
              env=job)
    assert cp.returncode == 0, cp.stderr
    assert _checksums(cp.stdout) == _checksums(ref.stdout)
    notes = [n for f in tmp_path.glob("cut*.w1.cusnap") for n in _notes(f)]
    assert len(list(tmp_path.glob("cut*.w1.cusnap"))) == 2 and not [n for n in notes if "rank of the job" in n], notes
    _passes(double, tmp_path / "cut.w1.group.json")
    out = tmp_path / "missing.cusnap"
    cp = _run(double, "capture", "-o", str(out), "--ring-mb", "16", "--window", "launches:3-8", "--", jobwin, "6",
              env={**job, "LOCAL_WORLD_SIZE": "3", "CUDASNAP_JOB_CUT_MS": "300"})
    assert cp.returncode == 0, cp.stderr
    assert _checksums(cp.stdout) == _checksums(ref.stdout)
    for f in tmp_path.glob("missing*.w1.cusnap"):
        assert any("not every rank of the job reached the window's open within 300 ms" in n for n in _notes(f))


@pytest.mark.parametrize("lazy", [False, True], ids=["loaded", "lazy"])
def test_a_rank_behind_in_collectives_runs_on_to_the_cut(double, jobwin, tmp_path, native, lazy):
    """At launch 4, rank 0 has launched two collectives and rank 1 one: rank 1 runs on to its
    second before its state is taken, so both windows start after the same collective. lazy:
    functions have no name until loaded (CUDA_MODULE_LOADING=LAZY, NCCL's kernels): the
    collectives are still recognised, and fn records still carry names."""
    env = {"JOBWIN_COLL": "1", **({"DOUBLE_LAZY_FUNCTIONS": "1"} if lazy else {})}
    ref = subprocess.run([jobwin, "6"], env={**double["env"], **env}, capture_output=True, text=True, timeout=60)
    out = tmp_path / "coll.cusnap"
    cp = _run(double, "capture", "-o", str(out), "--ring-mb", "16", "--window", "launches:4-8", "--", jobwin, "6",
              env={**env, "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    assert cp.returncode == 0, cp.stderr
    assert _checksums(cp.stdout) == _checksums(ref.stdout) and len(_checksums(ref.stdout)) == 2
    opened = {}
    for f in tmp_path.glob("coll*.w1.cusnap"):
        with SnapshotReader(f) as r:
            recs = list(r.records())
        opened[f.name] = next(x["launches"] for x in recs if x.get("k") == "win" and x.get("op") == "open")
        assert all(x.get("name") for x in recs if x.get("k") == "fn"), [x for x in recs if x.get("k") == "fn"]
        assert not [n for n in _notes(f) if "rank of the job" in n]
    assert sorted(opened.values()) == [4, 5], opened
    _passes(double, tmp_path / "coll.w1.group.json")
    if lazy:
        # loading a function at its launch may wait for a collective that waits for a peer: the
        # replay loads the functions it will launch with their module, before any launch
        _passes(double, tmp_path / "coll.w1.group.json", env={**env, "DOUBLE_LOAD_AT_LAUNCH_FAILS": "1"})


@pytest.mark.parametrize("kind", ["library", "module"])
def test_code_loaded_mid_run_loads_before_the_jobs_first_launch(double, jobwin, tmp_path, native, kind):
    """Each rank loads a library (or a module) after its first step and launches a kernel of it
    from then on (JOBWIN_LIB, as the runtime loads a library at a kernel's first use, XLA a
    module per executable). On a GPU a function loaded then waits for the device, where a
    collective waits for the peer: the job's replay loads the code and its kernels when the
    context comes, before any launch (a load after a launch fails on the double with
    DOUBLE_LOAD_AFTER_LAUNCH_FAILS)."""
    env = {"JOBWIN_LIB": kind, "DOUBLE_LAZY_FUNCTIONS": "1"}
    ref = subprocess.run([jobwin, "4"], env={**double["env"], **env}, capture_output=True, text=True, timeout=60)
    assert ref.returncode == 0, ref.stderr
    out = tmp_path / "lib.cusnap"
    cp = _run(double, "capture", "-o", str(out), "--", jobwin, "4", env=env)
    assert cp.returncode == 0, cp.stderr
    assert _checksums(cp.stdout) == _checksums(ref.stdout) and len(_checksums(ref.stdout)) == 2
    man = tmp_path / "lib.group.json"
    assert is_manifest(man), cp.stderr
    d = _passes(double, man, env={**env, "DOUBLE_LOAD_AFTER_LAUNCH_FAILS": "1"})
    for r in d["ranks"]:
        assert r["replay"]["launches"] == 4 * 2 + 3 and r["replay"]["d2h_verified"] == 4


def test_library_kernels_load_when_their_context_becomes_current(double, tmp_path):
    """The runtime loads libraries before any context exists, so their kernels cannot load with
    them: they load in the context when the program retains it, before any launch (a launch
    that must load its function fails on the double with DOUBLE_LOAD_AT_LAUNCH_FAILS)."""
    import struct
    from synth import DOUBLE_MODULE, Synth
    path = tmp_path / "lib.cusnap"
    s = Synth(path)
    lib, kern, ctx, buf = 0x55561000, 0x55570009, 0x55550000, 0x200000000000
    s.call("cuInit", {"Flags": 0})
    s.call("cuLibraryLoadData", {"library": lib, "code": 0x7F0000001000}, x={"image": s.blob(DOUBLE_MODULE + b"\0")})
    s.call("cuDeviceGet", {"device": 0, "ordinal": 0})
    s.call("cuDevicePrimaryCtxRetain", {"pctx": ctx, "dev": 0})
    s.call("cuCtxSetCurrent", {"ctx": ctx})
    s.call("cuMemAlloc_v2", {"dptr": buf, "bytesize": 64})
    s.call("cuLibraryGetKernel", {"pKernel": kern, "library": lib, "name": "fill"})
    s.fn(kern, "fill", 0, [[0, 8], [8, 4], [12, 4]], kind="kernel")    # the shim names no module for a CUkernel
    s.launch(kern, struct.pack("<QIi", buf, 7, 16), block=16)
    s.expect_d2h(buf, [7] * 16)
    s.double_epilogue(frees=[buf])
    env = {"DOUBLE_LAZY_FUNCTIONS": "1"}
    rp = _run(double, "replay", str(path), "--json", env=env)
    assert rp.returncode == 0, rp.stdout + rp.stderr
    rp = _run(double, "replay", str(path), "--json", env={**env, "DOUBLE_LOAD_AT_LAUNCH_FAILS": "1"})
    assert rp.returncode == 0, rp.stdout[-1500:] + rp.stderr
    assert json.loads(rp.stdout)["d2h_verified"] == 1


def _notes(path):
    with SnapshotReader(path) as r:
        return [x.get("msg") or "" for x in r.records() if x.get("k") == "note"]


def test_window_group_replay_holds_on_repeated_captures(double, jobwin, tmp_path):
    """Where the windows open at different moments of the ranks, state copies and the end state
    are ordered by when they were taken (a window opening mid-step on one rank)."""
    for i, spec in enumerate(("launches:4-7", "launches:2-9")):
        out = tmp_path / f"w{i}.cusnap"
        cp = _run(double, "capture", "-o", str(out), "--ring-mb", "16", "--window", spec, "--", jobwin, "6")
        assert cp.returncode == 0, cp.stderr
        _passes(double, tmp_path / f"w{i}.w1.group.json")


def test_flight_recorder_snapshots_of_a_job_replay_as_a_group(double, jobwin, tmp_path):
    out = tmp_path / "flight.cusnap"
    env = {"JOBWIN_EXIT": "1"}                               # each rank ends through _exit(0)
    # a period longer than the run: every rank's snapshot starts with its process (the
    # recorder's checkpoints are per process; ranks kept at different checkpoints are noted)
    cp = _run(double, "capture", "-o", str(out), "--ring-mb", "16", "--flight-recorder=30", "--", jobwin, "6",
              env=env)
    assert cp.returncode == 0, cp.stderr
    assert cp.stderr.count("ended without running its exit handlers") == 2, cp.stderr
    man = tmp_path / "flight.group.json"
    assert is_manifest(man), cp.stderr
    m = load(man)
    assert len(m["ranks"]) == 2 and len(m["links"]) == 2
    d = _passes(double, man)
    for r in d["ranks"]:
        assert r["replay"]["d2h_verified"] >= 1 and r["replay"]["launches"] >= 2


@pytest.fixture
def whole_job(double, jobwin, tmp_path):
    out = tmp_path / "job.cusnap"
    cp = _run(double, "capture", "-o", str(out), "--ring-mb", "16", "--", jobwin, "4")
    assert cp.returncode == 0, cp.stderr
    m = load(tmp_path / "job.group.json")
    return m


def _launches(snap):
    with SnapshotReader(snap) as r:
        return [c for c in r.records("c") if c["f"].startswith("cuLaunchKernel")], list(r.records("c"))


def test_extract_of_one_rank_stands_alone_and_exports(double, whole_job, tmp_path):
    peer = whole_job["ranks"][1]["snapshot"]
    launches, calls = _launches(peer)
    sax = launches[5]                      # step 2's saxpy: acc += 0.5 * the other rank's buffer
    assert sax["x"]["params"][:4] == bytes.fromhex("0000003f")
    x = tmp_path / "x.cusnap"
    cp = _run(double, "extract", peer, "--launch", str(sax["s"]), "-o", str(x), "--check")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "replayed up to the selection with the job's other ranks (job.group.json)" in cp.stdout
    assert f"check: replay of {x} verified" in cp.stdout
    with SnapshotReader(x) as r:
        recs = list(r.records("c"))
        fs = [c["f"] for c in recs]
        assert not any("Shareable" in f or "Ipc" in f for f in fs)
        assert fs.count("cuMemCreate") == 2            # its own buffer, and the import as a plain one
        # the expected result of acc is the program's own: the other rank's buffer held, at the
        # selection, what that rank had written (replayed with it up to there)
        acc = next(c for c in recs if c["f"] == "cuMemcpyDtoH_v2" and c["a"]["ByteCount"] == 4096)
        got = r.blob(acc["x"]["dstHost"]["blob"])
    with SnapshotReader(peer) as r:
        after = next(c for c in calls if c["s"] > sax["s"] and c["f"].startswith("cuMemcpyDtoH"))
        assert r.blob(after["x"]["dstHost"]["blob"]) == got
    # alone: replay and a standalone C program
    rp = _run(double, "replay", str(x))
    assert rp.returncode == 0, rp.stdout + rp.stderr
    ex = tmp_path / "xc"
    cp = _run(double, "export", str(x), "-o", str(ex))
    assert cp.returncode == 0, cp.stdout + cp.stderr
    mk = subprocess.run(["make", "-s", "-C", str(ex), f"CC={os.environ.get('CC', 'cc')}",
                         f"CFLAGS=-O1 -Wall -I{double['cuda_include']}", f"LDFLAGS=-L{double['libdir']}",
                         "CUDA_HOME=/nonexistent"], capture_output=True, text=True, timeout=300)
    assert mk.returncode == 0, mk.stdout + mk.stderr
    run = subprocess.run([str(ex / "replay")], env=double["env"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "OK:" in run.stdout, run.stdout + run.stderr


def test_extract_of_a_rank_without_its_manifest_says_why(double, whole_job, tmp_path):
    peer = whole_job["ranks"][1]["snapshot"]
    os.unlink(tmp_path / "job.group.json")
    launches, _calls = _launches(peer)
    cp = _run(double, "extract", peer, "--launch", str(launches[1]["s"]), "-o", str(tmp_path / "x.cusnap"))
    assert cp.returncode == 2
    assert "links another process" in cp.stderr and "no group manifest beside" in cp.stderr
    assert "Traceback" not in cp.stderr


def test_extract_of_a_legacy_ipc_rank(double, tmp_path):
    """cuIpcOpenMemHandle memory becomes a cuMemAlloc_v2 of the exporter's size at its address."""
    out = tmp_path / "ipc.cusnap"
    cp = _run(double, "capture", "-o", str(out), "--placement", "off", "--ring-mb", "16", "--",
              double["progs"]["ipc"])
    assert cp.returncode == 0, cp.stderr
    m = load(tmp_path / "ipc.group.json")
    child = m["ranks"][1]["snapshot"]
    launches, calls = _launches(child)
    opened = next(c for c in calls if c["f"] == "cuIpcOpenMemHandle")
    x = tmp_path / "xi.cusnap"
    cp = _run(double, "extract", child, "--launch", str(launches[0]["s"]), "-o", str(x), "--check")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    with SnapshotReader(x) as r:
        recs = list(r.records("c"))
    alloc = next(c for c in recs if c["f"] == "cuMemAlloc_v2")
    assert alloc["a"] == {"dptr": opened["a"]["pdptr"], "bytesize": 4 << 20}
    assert not any("Ipc" in c["f"] for c in recs)
