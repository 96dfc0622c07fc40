"""Several processes: capture of a job writes a group manifest; replay runs every rank at once
under a coordinator that passes exported file descriptors between the rank replayers.
On the test double: two processes share a VMM allocation through a POSIX-fd shareable handle
(tests/double/progs/share.c), as NCCL's cuMem transport does."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import clibatch
from cudasnap.formats import SnapshotReader
from cudasnap.formats.group import build, is_manifest, load
from cudasnap.replay.group import GroupProblem, device_map


def _run(double, *args, timeout=120, env=None):
    e = dict(double["env"])
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "cudasnap", *args], env=e, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def job(double, tmp_path):
    """A captured two-process job: (CompletedProcess, manifest path, {pid: snapshot})."""
    out = tmp_path / "job.cusnap"
    cp = _run(double, "capture", "-o", str(out), "--ring-mb", "16", "--", double["progs"]["share"])
    assert cp.returncode == 0, cp.stderr
    man = tmp_path / "job.group.json"
    assert is_manifest(man), cp.stderr
    m = load(man)
    return cp, man, {r["pid"]: r["snapshot"] for r in m["ranks"]}


def test_capture_writes_manifest_with_the_link(job, double, native):
    cp, man, snaps = job
    ref = native(double["progs"]["share"])
    assert cp.stdout == ref.stdout                       # capture changes nothing the program prints
    assert "OWNER CHECKSUM 524800.0" in cp.stdout and "PEER CHECKSUM 524800.0" in cp.stdout
    m = load(man)
    assert len(m["ranks"]) == 2 and m["unmatched"] == []
    owner, peer = m["ranks"]
    (link,) = m["links"]
    assert link["kind"] == "shareable" and link["matched_by"] == "kcmp"
    assert link["from"]["pid"] == owner["pid"] and link["to"]["pid"] == peer["pid"]
    # both ends are in the snapshots: the fd the owner got, the fd the peer imported, the export number
    with SnapshotReader(owner["snapshot"]) as r:
        ex = next(c for c in r.records("c") if c["f"] == "cuMemExportToShareableHandle")
    with SnapshotReader(peer["snapshot"]) as r:
        im = next(c for c in r.records("c") if c["f"] == "cuMemImportFromShareableHandle")
    assert ex["s"] == link["from"]["seq"] and im["s"] == link["to"]["seq"]
    assert ex["a"]["shareableHandle"] == ex["x"]["link"]["fd"] >= 0
    assert ex["x"]["link"]["export"] == 1
    assert im["x"]["link"]["peer_pid"] == owner["pid"] and im["x"]["link"]["peer_export"] == 1
    assert im["a"]["osHandle"] == im["x"]["link"]["fd"]
    assert (ex["x"]["link"]["dev"], ex["x"]["link"]["ino"]) == (im["x"]["link"]["dev"], im["x"]["link"]["ino"])


def test_group_replay_passes_fds_and_verifies_both_ranks(job, double):
    _cp, man, _snaps = job
    t = time.monotonic()
    rp = _run(double, "replay", str(man), "--json")
    assert rp.returncode == 0, rp.stdout + rp.stderr
    d = json.loads(rp.stdout)
    assert d["exit_code"] == 0 and len(d["ranks"]) == 2
    for r in d["ranks"]:
        assert r["exit_code"] == 0 and r["errors"] == []
        assert r["replay"]["d2h_verified"] == 1 and r["replay"]["fell_back"] == 0 and not r["replay"]["mismatches"]
    # the owner's D2H reads what the peer's kernel wrote through the imported mapping
    assert d["ranks"][1]["replay"]["launches"] == 1
    assert time.monotonic() - t < 60


def test_group_replay_from_the_snapshots_and_text_summary(job, double):
    _cp, _man, snaps = job
    rp = _run(double, "replay", *sorted(snaps.values()))
    assert rp.returncode == 0, rp.stdout + rp.stderr
    assert "job: 2 ranks, 2 verified" in rp.stdout and rp.stdout.count(": PASS") == 3


def test_one_rank_alone_says_replay_the_job(job, double):
    _cp, man, _snaps = job
    peer = load(man)["ranks"][1]["snapshot"]
    rp = _run(double, "replay", peer)
    assert rp.returncode == 2
    assert "links another process: replay the whole job" in rp.stdout + rp.stderr


def test_missing_rank_snapshot(job, double):
    _cp, man, _snaps = job
    peer = load(man)["ranks"][1]["snapshot"]
    import os
    os.rename(peer, peer + ".away")
    rp = _run(double, "replay", str(man))
    assert rp.returncode == 2
    assert "snapshot" in rp.stderr and "is missing; the job needs all 2 ranks" in rp.stderr
    assert "Traceback" not in rp.stderr


@pytest.mark.parametrize("victim", ["exporter", "importer"])
def test_dead_peer_replayer_stops_the_job(job, double, victim):
    """A rank replayer killed mid-replay: the others stop with a clear error, exit 2, no hang."""
    _cp, man, _snaps = job
    m = load(man)
    link = m["links"][0]
    rank = 0 if victim == "exporter" else 1
    seq = link["from"]["seq"] if victim == "exporter" else link["to"]["seq"] + 1
    t = time.monotonic()
    rp = _run(double, "replay", str(man), env={"CUDASNAP_GROUP_TEST_KILL": f"{rank}:{seq}"}, timeout=60)
    assert rp.returncode == 2, rp.stdout + rp.stderr
    assert time.monotonic() - t < 30
    assert f"rank {rank}" in rp.stdout and "killed by signal 9" in rp.stdout
    assert "job: 2 ranks, 0 verified" in rp.stdout or "job: 2 ranks, 1 verified" in rp.stdout


def test_import_waits_then_times_out_when_export_never_comes(job, double, tmp_path):
    """A manifest whose link names an export that never happens: the import fails after the
    timeout with the exporter named, exit 2."""
    _cp, man, _snaps = job
    m = json.loads(man.read_text())
    m["links"][0]["from"]["seq"] = 999999
    man.write_text(json.dumps(m))
    rp = _run(double, "replay", str(man), env={"CUDASNAP_GROUP_TIMEOUT": "2"}, timeout=60)
    assert rp.returncode == 2
    assert "call #999999) did not come within 2 s" in rp.stdout or "before exporting it" in rp.stdout, rp.stdout


def _manifest(*uuids, devs=None):
    devs = devs or [0] * len(uuids)
    return {"ranks": [{"rank": i, "pid": 100 + i, "devices": [d], "gpus": ["GPU-a", "GPU-b", "GPU-c", "GPU-d"],
                       "snapshot": f"r{i}"} if u is None else
                      {"rank": i, "pid": 100 + i, "devices": [d], "gpus": [u], "snapshot": f"r{i}"}
                      for i, (u, d) in enumerate(zip(uuids, devs))]}


def test_device_map_rules():
    # torchrun: every rank sees every GPU and records its own ordinal
    m = _manifest(None, None, devs=[0, 1])
    assert device_map(m, None, 2) == [0, 1]
    assert device_map(m, "1,0", 2) == [1, 0]
    with pytest.raises(GroupProblem, match="recorded on 2 GPUs"):
        device_map(m, "0", 2)
    with pytest.raises(GroupProblem, match="needs 2 GPUs .* this machine has 1"):
        device_map(m, None, 1)
    # one visible GPU per process (CUDA_VISIBLE_DEVICES): ordinal 0 each, different GPUs
    m = _manifest("GPU-x", "GPU-y")
    assert device_map(m, None, 4) == [0, 1]
    # two processes recorded on one GPU may share it again
    assert device_map(_manifest("GPU-x", "GPU-x"), None, 1) == [0, 0]
    with pytest.raises(GroupProblem, match="ordinals separated by commas"):
        device_map(m, "a,b", 2)


def test_manifest_pairs_by_file_and_time_without_kcmp(job):
    """Where kcmp was not allowed, an import pairs with the newest earlier export of the same file."""
    _cp, man, snaps = job
    from cudasnap.formats import group as G
    real = G.scan

    def no_kcmp(path):
        s = real(path)
        for im in s["imports"]:
            im["peer_pid"] = im["peer_export"] = None
        return s

    G.scan = no_kcmp
    try:
        m = build(sorted(snaps.values()))
    finally:
        G.scan = real
    (link,) = m["links"]
    assert link["matched_by"] == "time" and link["from"]["seq"] == load(man)["links"][0]["from"]["seq"]


def test_group_timeline_one_trace_and_a_profile_per_rank(job, double, tmp_path):
    _cp, man, _snaps = job
    trace, prof = tmp_path / "job_trace.json", tmp_path / "prof.json"
    rp = _run(double, "replay", str(man), "--profile", "timeline", "--trace", str(trace), "--out", str(prof))
    assert rp.returncode == 0, rp.stdout + rp.stderr
    d = json.loads(trace.read_text())
    names = {(e.get("args") or {}).get("name") for e in d["traceEvents"] if e.get("name") == "process_name"}
    assert {"rank 0: GPU 0", "rank 1: GPU 0"} <= names
    # a track per rank: the peer's kernel sits under rank 1's GPU process
    pid1 = next(e["pid"] for e in d["traceEvents"] if e.get("name") == "process_name"
                and e["args"]["name"] == "rank 1: GPU 0")
    assert any(e.get("ph") == "X" and e.get("pid") == pid1 and "add_one" in e.get("name", "") for e in d["traceEvents"])
    for r in (0, 1):
        rows = json.loads((tmp_path / f"prof.rank{r}.json").read_text())["launches"]
        assert len(rows) == r          # the owner launches nothing, the peer one add_one


def test_legacy_ipc_of_placed_memory_works_under_capture(double, tmp_path):
    """Legacy IPC with the default placement: the driver refuses cuIpcGetMemHandle of VMM
    memory, so the shim answers it for memory it placed (an fd of the physical memory, opened
    by the other process through /proc); the program computes what it does without capture,
    the handles are paired, and the group replay hands the owner's memory to the child."""
    prog = double["progs"]["ipc"]
    ref = subprocess.run([prog], env=double["env"], capture_output=True, text=True, timeout=60)
    assert ref.returncode == 0, ref.stderr
    cp = _run(double, "capture", "-o", str(tmp_path / "reg.cusnap"), "--", prog)
    assert cp.returncode == 0, cp.stderr
    assert sorted(cp.stdout.splitlines()) == sorted(ref.stdout.splitlines())
    m = load(tmp_path / "reg.group.json")
    (link,) = m["links"]
    assert link["kind"] == "ipc" and link["handle"].startswith(b"CSIPC01".hex()) and m["unmatched"] == []
    rp = _run(double, "replay", str(tmp_path / "reg.group.json"), "--json")
    assert rp.returncode == 0, rp.stdout + rp.stderr
    d = json.loads(rp.stdout)
    assert [r["replay"]["d2h_verified"] for r in d["ranks"]] == [1, 1] and all(not r["errors"] for r in d["ranks"])
    assert [r["replay"]["fell_back"] for r in d["ranks"]] == [0, 0], d


def test_legacy_ipc_with_placement_off_replays_as_a_group(double, tmp_path):
    """With --placement off the driver's own IPC handles are recorded and paired, and the
    group replay hands the owner's memory to the child."""
    prog = double["progs"]["ipc"]
    out = tmp_path / "ipc.cusnap"
    cp = _run(double, "capture", "-o", str(out), "--placement", "off", "--", prog)
    assert cp.returncode == 0, cp.stderr
    assert "OWNER CHECKSUM 1048576.0" in cp.stdout and "CHILD CHECKSUM 1048576.0" in cp.stdout
    m = load(tmp_path / "ipc.group.json")
    (link,) = m["links"]
    assert link["kind"] == "ipc" and link["handle"].startswith(b"CDIPC".hex())
    assert [r["pid"] for r in m["ranks"]] == [link["from"]["pid"], link["to"]["pid"]]   # owner first
    with SnapshotReader(m["ranks"][1]["snapshot"]) as r:
        op = next(c for c in r.records("c") if c["f"].startswith("cuIpcOpenMemHandle"))
    assert op["a"]["handle"].hex() == link["handle"] and op["a"]["pdptr"] == link["to"]["dptr"]
    rp = _run(double, "replay", str(tmp_path / "ipc.group.json"), "--json")
    assert rp.returncode == 0, rp.stdout + rp.stderr
    d = json.loads(rp.stdout)
    assert [r["replay"]["d2h_verified"] for r in d["ranks"]] == [1, 1]
    # the owner's recorded address taken: its allocation falls back to cuMemAlloc and goes
    # over as a real IPC handle
    with SnapshotReader(m["ranks"][0]["snapshot"]) as r:
        al = next(c for c in r.records("c") if c["f"].startswith("cuMemAlloc") and c.get("r") == 0)["a"]
    rp = _run(double, "replay", str(tmp_path / "ipc.group.json"), "--json",
              env={"CUDASNAP_REPLAY_TEST_BLOCK": f"{al['dptr']:#x}:{al['bytesize']}"})
    assert rp.returncode == 0, rp.stdout + rp.stderr
    d = json.loads(rp.stdout)
    assert d["ranks"][0]["replay"]["fell_back"] >= 1
    assert [r["replay"]["d2h_verified"] for r in d["ranks"]] == [1, 1]


def test_an_ipc_event_passes_between_the_ranks_of_a_group_replay(double, tmp_path):
    """PyTorch sends a CUDA tensor with an IPC event the receiver waits on: the owner records an
    interprocess event after its upload and hands its handle over with the memory's
    (IPC_EVENT=1); both handles are paired in the manifest and the group replay hands the
    owner's live event to the child, whose wait then comes after the owner's record."""
    prog = double["progs"]["ipc"]
    out = tmp_path / "ev.cusnap"
    cp = _run(double, "capture", "-o", str(out), "--", prog, env={"IPC_EVENT": "1"})
    assert cp.returncode == 0, cp.stderr
    assert "OWNER CHECKSUM 1048576.0" in cp.stdout and "CHILD CHECKSUM 1048576.0" in cp.stdout
    m = load(tmp_path / "ev.group.json")
    assert sorted(ln["kind"] for ln in m["links"]) == ["ipc", "ipc_event"] and m["unmatched"] == []
    ev = next(ln for ln in m["links"] if ln["kind"] == "ipc_event")
    assert ev["handle"].startswith(b"CDIPCEV".hex())
    child = m["ranks"][1]["snapshot"]
    cp = _run(double, "info", child)
    assert cp.returncode == 0 and "does not replay" not in cp.stdout, cp.stdout
    rp = _run(double, "replay", str(tmp_path / "ev.group.json"), "--json")
    assert rp.returncode == 0, rp.stdout + rp.stderr
    d = json.loads(rp.stdout)
    assert [r["replay"]["d2h_verified"] for r in d["ranks"]] == [1, 1]
    assert all(not r["errors"] for r in d["ranks"]), d
    # one rank alone cannot open the other's event: the error names the job to replay
    alone = _run(double, "replay", child)
    assert alone.returncode == 2 and "replay the whole job" in alone.stdout + alone.stderr


def test_info_on_a_manifest(job, double):
    _cp, man, _snaps = job
    cp = _run(double, "info", str(man))
    assert cp.returncode == 0, cp.stderr
    assert "(2 processes)" in cp.stdout and "links    : 1 shareable" in cp.stdout and "rank 1" in cp.stdout


def test_one_process_two_devices_peer_access(double, tmp_path):
    """One process driving two devices (CUDA_DOUBLE_DEVICES=2): capture packs small allocations
    per device; replay puts each recorded device on its own GPU (peer access enabled for real),
    or, with one GPU, folds them onto it; --devices remaps them."""
    two = {"CUDA_DOUBLE_DEVICES": "2"}
    snap = tmp_path / "peer.cusnap"
    cp = _run(double, "capture", "-o", str(snap), "--", double["progs"]["peer"], env=two)
    assert cp.returncode == 0, cp.stderr
    assert "PEER CHECKSUM 1572352.0" in cp.stdout
    with SnapshotReader(snap) as r:
        allocs = [c["a"]["dptr"] for c in r.records("c") if c["f"].startswith("cuMemAlloc")]
    small0, small1 = allocs[1], allocs[3]          # 256 bytes on device 0, then on device 1
    assert small0 >> 21 != small1 >> 21            # never in one 2 MiB slab: each device its own
    rp = _run(double, "replay", str(snap), "--json", env=two)
    assert rp.returncode == 0, rp.stdout + rp.stderr
    d = json.loads(rp.stdout)
    assert d["d2h_verified"] == 1 and d["fell_back"] == 0
    assert any("recorded 0 on GPU 0, recorded 1 on GPU 1" in w for w in d["warnings"]), d["warnings"]
    assert not any("peer access is implicit" in w for w in d["warnings"])
    rp = _run(double, "replay", str(snap), "--json", "--devices", "1,0", env=two)
    assert rp.returncode == 0 and any("recorded 0 on GPU 1" in w for w in json.loads(rp.stdout)["warnings"])
    rp = _run(double, "replay", str(snap), "--json")          # one GPU: folded, still verified
    assert rp.returncode == 0, rp.stdout + rp.stderr
    d = json.loads(rp.stdout)
    assert d["d2h_verified"] == 1 and any("replay on GPU 0 alone" in w for w in d["warnings"])
    rp = _run(double, "replay", str(snap), "--devices", "1", env=two)
    assert rp.returncode == 2 and "give one GPU for each of devices 0..1" in rp.stdout + rp.stderr


def test_hung_peer_replayer_times_out(job, double):
    """A rank that hangs (alive, never progressing): the rank waiting for it gives up after
    the timeout, the coordinator stops the hung one: exit 2, bounded time."""
    _cp, man, _snaps = job
    m = load(man)
    to = m["links"][0]["to"]
    rank = next(r["rank"] for r in m["ranks"] if r["pid"] == to["pid"])
    t = time.monotonic()                            # the importer hangs after importing
    rp = _run(double, "replay", str(man), env={"CUDASNAP_GROUP_TEST_KILL": f"{rank}:{to['seq'] + 1}:stall",
                                               "CUDASNAP_GROUP_TIMEOUT": "3"}, timeout=90)
    assert rp.returncode == 2, rp.stdout + rp.stderr
    assert time.monotonic() - t < 40
    assert f"rank {rank} did not reach the calls recorded before it within 3 s" in rp.stdout, rp.stdout
    assert "stopped by the coordinator" in rp.stdout


def _first_call_us(trace: dict) -> dict:
    """rank -> the trace time (us) of that rank's first replayed driver call."""
    ranks = {e["pid"]: int(e["args"]["name"].split()[1].rstrip(":")) for e in trace["traceEvents"]
             if e.get("name") == "process_name" and e["args"]["name"].startswith("rank ")}
    first: dict = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("pid") in ranks and (e.get("name") or "").startswith("cu"):
            r = ranks[e["pid"]]
            first[r] = min(first.get(r, e["ts"]), e["ts"])
    return first


def test_paced_group_replay_keeps_the_ranks_recorded_offsets(double, tmp_path):
    """--pace recorded in a group: one start for every rank, each call at its recorded offset
    from the group's first call, so a rank that started 400 ms late in the recording starts
    about 400 ms late in the replay too (and together with the others without --pace)."""
    out = tmp_path / "late.cusnap"
    cp = _run(double, "capture", "-o", str(out), "--ring-mb", "16", "--", double["progs"]["share"],
              env={"SHARE_PEER_SLEEP_MS": "400"})
    assert cp.returncode == 0, cp.stderr
    man = tmp_path / "late.group.json"
    m = load(man)
    origin = {}
    for r in m["ranks"]:
        with SnapshotReader(r["snapshot"]) as rd:
            origin[r["rank"]] = next(c["t0"] for c in rd.records("c") if isinstance(c.get("t0"), int))
    recorded_ms = (origin[1] - origin[0]) / 1e6
    assert recorded_ms > 350
    got = {}
    for pace in ("recorded", "fast"):
        trace = tmp_path / f"trace_{pace}.json"
        rp = _run(double, "replay", str(man), "--pace", pace, "--profile", "timeline", "--trace", str(trace), "--json")
        assert rp.returncode == 0, rp.stdout + rp.stderr
        d = json.loads(rp.stdout)
        assert [r["replay"]["d2h_verified"] for r in d["ranks"]] == [1, 1]
        first = _first_call_us(json.loads(trace.read_text()))
        got[pace] = (first[1] - first[0]) / 1e3
    assert abs(got["recorded"] - recorded_ms) < 100, (got, recorded_ms)
    assert got["fast"] < recorded_ms / 2, (got, recorded_ms)


def test_job_options_that_cannot_apply_are_refused(job, double):
    _cp, man, _snaps = job
    rp = _run(double, "replay", str(man), "-k", "add_one")
    assert rp.returncode == 2 and "a job replays every call" in rp.stderr
    rp = _run(double, "replay", str(man), "--device", "1")
    assert rp.returncode == 2 and "--devices" in rp.stderr
    # with --profile the selection goes on to every rank
    rp = _run(double, "replay", str(man), "--profile", "timeline", "-k", "add_one", "--json")
    assert rp.returncode == 0, rp.stderr
    assert json.loads(rp.stdout)["exit_code"] == 0


def test_group_timeline_splits_collectives_into_wait_and_collective(double, tmp_path):
    """Kernels named like NCCL collectives are matched across ranks (name and order) and split
    into the wait for the last rank and the time after it arrived; rank 1 started 300 ms late in
    the recording, so with --pace recorded it arrives last: rank 0's collectives wait for it,
    rank 1's do not (the double's event times are not exact enough to check the amount)."""
    out = tmp_path / "pair.cusnap"
    cp = _run(double, "capture", "-o", str(out), "--ring-mb", "16", "--", double["progs"]["pair"],
              env={"PAIR_LATE_MS": "300"})
    assert cp.returncode == 0, cp.stderr
    assert "RANK 0 SUM 768.0" in cp.stdout and "RANK 1 SUM 768.0" in cp.stdout
    man = tmp_path / "pair.group.json"
    rp = _run(double, "replay", str(man), "--profile", "timeline", "--pace", "recorded", "--json")
    assert rp.returncode == 0, rp.stdout + rp.stderr
    c = json.loads(rp.stdout)["collectives"]
    assert c["matched"] == 3 and c["unmatched"] == 0
    r0, r1 = c["ranks"]["0"], c["ranks"]["1"]
    assert r0["n"] == r1["n"] == 3
    assert r0["wait_us"] > 0 and r1["wait_us"] == 0, c
    rp = _run(double, "replay", str(man), "--profile", "timeline")
    assert rp.returncode == 0, rp.stdout + rp.stderr
    assert "collectives: 3 matched across ranks by kernel name and order" in rp.stdout
    assert "rank 0: 3 kernels" in rp.stdout and "rank 1: 3 kernels" in rp.stdout


def test_ranks_without_a_rank_variable_follow_process_start(monkeypatch):
    """Without RANK-like variables ranks go in the order the processes started (pids wrap),
    ties to the clock tick broken by pid; a rank variable wins over both."""
    from cudasnap.formats import group

    def fake(pid, started, rank_env=None):
        return {"pid": pid, "started": started, "created": 1000.0 - pid, "snapshot": f"p{pid}",
                "devices": [0], "gpus": [], "exports": [], "imports": [], "ipc_get": [], "ipc_open": [],
                "peer": [], **({"rank_env": rank_env} if rank_env is not None else {})}
    scans = {"a": fake(32000, 10.0), "b": fake(300, 10.5), "c": fake(299, 10.5)}
    monkeypatch.setattr(group, "scan", lambda p: scans[p])
    assert [r["pid"] for r in build(["b", "a", "c"])["ranks"]] == [32000, 299, 300]
    scans["b"]["rank_env"] = 0
    assert [r["pid"] for r in build(["b", "a", "c"])["ranks"]] == [300, 32000, 299]


def _paths(node, at=()):
    """Every (path, value) of a JSON document, containers included."""
    yield at, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, at + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, at + (i,))


def test_a_manifest_of_the_wrong_shape_is_refused_in_one_line(job, double, tmp_path):
    """Every value of a job's manifest replaced by one of the wrong type (seeded): replay, info,
    stats and extract of it answer in one line with exit 1 or 2, never a traceback or a hang."""
    import random
    _, man, _ = job
    doc = json.loads(man.read_text())
    rng = random.Random(int(os.environ.get("CUDASNAP_MANIFEST_FUZZ_SEED", "7")))
    paths = [p for p, _ in _paths(doc) if p and p[0] != "cudasnap_group"]
    odd = [None, 1.5, "x", [1], {"a": 1}, -1, 2 ** 63]
    n = int(os.environ.get("CUDASNAP_MANIFEST_FUZZ_N", "12"))
    cmds = []
    for i, path in enumerate(rng.sample(paths, min(n, len(paths)))):
        bad = json.loads(json.dumps(doc))
        node = bad
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = rng.choice([v for v in odd if type(v) is not type(node[path[-1]])])
        f = man.parent / f"fuzz{i}.group.json"
        f.write_text(json.dumps(bad))
        cmds += [(f"{'/'.join(map(str, path))} = {node[path[-1]]!r}: {cmd[0]}", cmd) for cmd in (
            ("replay", str(f)), ("info", str(f)), ("stats", str(f)),
            ("extract", str(f), "--launch", "1", "-o", str(tmp_path / f"x{i}.cusnap")))]
    # each command a process of its own, forked from one that imported the command line once
    for (where, cmd), cp in zip(cmds, clibatch.run([c for _, c in cmds], double["env"], tmp_path / "ran", timeout=90)):
        assert not cp.timed_out, (where, "timed out")
        assert "Traceback" not in cp.stderr, (where, cp.stderr[-1500:])
        assert cp.returncode in (0, 1, 2), (where, cp.returncode, cp.stderr[-800:])
        if cp.returncode == 2:
            assert len(cp.stderr.strip().splitlines()) <= 3, (where, cp.stderr[-800:])
            assert "internal error" not in cp.stderr, (where, cp.stderr[-800:])


def test_manifest_problems_are_named():
    from cudasnap.formats.group import manifest_problem
    good = {"cudasnap_group": 1, "command": ["a"], "unmatched": [],
            "ranks": [{"rank": 0, "pid": 5, "snapshot": "a.cusnap", "devices": [0], "gpus": ["GPU-x"]},
                      {"rank": 1, "pid": 6, "snapshot": "b.cusnap"}],
            "links": [{"kind": "shareable", "from": {"pid": 5, "seq": 9, "export": 1}, "to": {"pid": 6, "seq": 4, "fd": None}}]}
    assert manifest_problem(good) is None
    good["ranks"][1]["gpus"] = [None]            # a GPU whose UUID the recording lacked, as build writes it
    assert manifest_problem(good) is None

    def bad(mutate):
        m = json.loads(json.dumps(good))
        mutate(m)
        return manifest_problem(m)
    assert bad(lambda m: m["ranks"].__setitem__(0, [1])) == "ranks[0] is a list, not a map"
    assert bad(lambda m: m["ranks"][0].__setitem__("snapshot", 5)) == "ranks[0].snapshot is an integer (5), not a snapshot path"
    assert bad(lambda m: m["ranks"][1].__setitem__("rank", 0)) == "ranks[1] and ranks[0] are both rank 0"
    assert bad(lambda m: m["ranks"][0].pop("rank")) == "ranks[0] has no rank"
    assert bad(lambda m: m.__setitem__("links", {})) == "links is a map, not a list"
    assert bad(lambda m: m["links"][0].__setitem__("to", None)) == "links[0].to is null, not a map"
    assert bad(lambda m: m["links"][0]["from"].__setitem__("seq", "9")) == "links[0].from.seq is a string ('9'), not a call number"
    assert bad(lambda m: m.__setitem__("command", "a b")) == "command is a string, not a list of arguments"
