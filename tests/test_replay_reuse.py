"""Several replays in one process (a campaign worker that keeps its driver): Replayer.close()
gives back the placed memory, its reserved ranges and the contexts, so that the next replay
places every allocation at its recorded address again and verifies, where before it fell back
from every one and failed."""
from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from synth import BASE, Synth, write_double_program

RUNNER = """
import json, sys, io
from cudasnap.replay.engine import Replayer
from cudasnap.replay.options import ReplayOptions
out = []
for path in sys.argv[1:]:
    rp = Replayer(path, ReplayOptions(quiet=True), out=io.StringIO())
    r = rp.run()
    out.append({"path": path, "exit": r.exit_code, "placed": r.placed, "fell_back": r.fell_back,
                "verified": r.d2h_verified, "host_moved": r.host_relocated, "errors": r.errors[:1],
                "closed": rp.close()})
print(json.dumps(out))
"""


def _leaky(path) -> None:
    """A program that ends without freeing its memory nor releasing its context (a crash, or a
    program that leaves cleanup to the driver): a kernel's result is verified."""
    _leaky_variant(path, 1.0)


def _leaky_variant(path, delta: float) -> None:
    """_leaky whose D2H result expects each value plus delta (delta 1: what the kernel makes)."""
    s = Synth(path)
    s.double_prologue("add_one", 0x55570001, [[0, 8], [8, 4]])
    n = 256
    s.call("cuMemAlloc_v2", {"dptr": BASE, "bytesize": n * 4})
    vals = [float(i) for i in range(n)]
    s.call("cuMemcpyHtoD_v2", {"dstDevice": BASE, "srcHost": 0x7F0000100000, "ByteCount": n * 4},
           x={"srcHost": s.blob(struct.pack(f"<{n}f", *vals))})
    s.launch(0x55570001, struct.pack("<Qi", BASE, n), block=n)
    s.call("cuCtxSynchronize", {})
    s.call("cuMemcpyDtoH_v2", {"dstHost": 0x7F0000200000, "srcDevice": BASE, "ByteCount": n * 4},
           x={"dstHost": s.blob(struct.pack(f"<{n}f", *[v + delta for v in vals]))})
    s.w.write({"k": "end", "exit": 0, "signal": None, "partial": False})
    s.close()


def _run(double, *paths):
    cp = subprocess.run([sys.executable, "-c", RUNNER, *map(str, paths)], env=double["env"], capture_output=True,
                        text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr[-3000:]
    return json.loads(cp.stdout.strip().splitlines()[-1])


def test_replays_in_one_process_each_place_at_the_recorded_addresses(double, tmp_path):
    tidy, leaky = tmp_path / "tidy.cusnap", tmp_path / "leaky.cusnap"
    write_double_program(tidy)
    _leaky(leaky)
    rows = _run(double, tidy, leaky, tidy, leaky, leaky)
    for r in rows:
        assert r["exit"] == 0 and r["fell_back"] == 0 and r["verified"] >= 1, r
        assert r["closed"]["failed"] == 0 and r["closed"]["spans"] >= 1 and r["closed"]["contexts"] >= 1, r
    assert [r["placed"] for r in rows] == [rows[0]["placed"], 1, rows[0]["placed"], 1, 1]
    # the leaky program's memory was still allocated at its end: close() freed it
    assert all(r["closed"]["allocations"] == 1 for r in rows if r["path"] == str(leaky))


def test_pinned_host_memory_is_placed_again_by_the_next_replay(double, capture):
    """A program whose kernel reads mapped pinned host memory: each replay in the process maps
    it at its recorded address again, and its device memory too (close gave back the reserved
    ranges of both)."""
    cp, snap = capture(double["progs"]["hostfree"])
    assert cp.returncode == 0, cp.stderr
    rows = _run(double, snap, snap, snap)
    for r in rows:
        assert r["exit"] == 0 and r["fell_back"] == 0 and r["host_moved"] == 0, r
    assert rows[0]["placed"] == rows[1]["placed"] == rows[2]["placed"] >= 1, rows


def test_without_close_the_next_replay_falls_back(double, tmp_path):
    """What close() is for: the first replay's reservations still hold the recorded addresses."""
    leaky = tmp_path / "leaky.cusnap"
    _leaky(leaky)
    runner = RUNNER.replace('"closed": rp.close()', '"closed": None')
    cp = subprocess.run([sys.executable, "-c", runner, str(leaky), str(leaky)], env=double["env"],
                        capture_output=True, text=True, timeout=120)
    rows = json.loads(cp.stdout.strip().splitlines()[-1])
    assert rows[0]["placed"] == 1 and rows[1]["placed"] == 0 and rows[1]["fell_back"] == 1, rows


def test_a_kept_campaign_worker_runs_replay_after_replay_in_one_process(double, tmp_path):
    """[rules] workers = "kept": the replay server's kept child profiles snapshot after
    snapshot without a new process, each verified with its memory at the recorded addresses;
    a replay that fails (exit 2) ends the child and the next request gets a new one."""
    import os
    from cudasnap.campaign import cellserver
    from cudasnap.replay.invocation import profiled
    tidy, leaky = tmp_path / "tidy.cusnap", tmp_path / "leaky.cusnap"
    write_double_program(tidy)
    _leaky(leaky)
    client = cellserver.Client(dict(os.environ, **double["env"]))
    try:
        reps = []
        for i, snap in enumerate((tidy, leaky, tidy, leaky)):
            out = tmp_path / f"p{i}.json"
            reps.append(client.run(dict(profiled(str(snap), str(out), "timeline"), timeout=60, kept=True)))
            assert reps[-1]["exit_code"] == 0 and out.exists(), reps[-1]
            run = json.loads(out.read_text())["run"]
            assert run["exit_code"] == 0
        assert len({r["kept_pid"] for r in reps}) == 1, reps          # one process for all four
        assert all(r["closed"]["spans"] >= 1 and r["closed"]["failed"] == 0 for r in reps), reps
        assert reps[0]["fork_s"] > 0 and all(r["fork_s"] == 0 for r in reps[1:])
        bad = profiled(str(tidy), str(tmp_path / "bad.json"), "timeline")
        bad["replay"]["pace"] = "sometimes"                            # refused by the replay: exit 2
        rep = client.run(dict(bad, timeout=60, kept=True))
        assert rep["exit_code"] == 2 and "--pace" in rep["stderr_tail"], rep
        again = client.run(dict(profiled(str(leaky), str(tmp_path / "again.json"), "timeline"), timeout=60, kept=True))
        assert again["exit_code"] == 0 and again["kept_pid"] != reps[0]["kept_pid"], again
    finally:
        client.kill()


def test_a_kept_worker_leaves_after_its_last_replay(double, tmp_path):
    """CUDASNAP_KEPT_MAX_REPLAYS bounds what one kept process accumulates: after that many
    replays it leaves and the next request gets a new one."""
    import os
    from cudasnap.campaign import cellserver
    from cudasnap.replay.invocation import profiled
    snap = tmp_path / "tidy.cusnap"
    write_double_program(snap)
    client = cellserver.Client(dict(os.environ, **double["env"], CUDASNAP_KEPT_MAX_REPLAYS="2"))
    try:
        pids = []
        for i in range(5):
            rep = client.run(dict(profiled(str(snap), str(tmp_path / f"p{i}.json"), "timeline"), timeout=60, kept=True))
            assert rep["exit_code"] == 0, rep
            pids.append(rep["kept_pid"])
        assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4], pids
    finally:
        client.kill()


KEPT = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
from count_passes import instrument
counts = instrument()
from cudasnap.replay import keep, plannative
decoded = [0]
_one = plannative.record_one
def record_one(*a):
    decoded[0] += 1
    return _one(*a)
plannative.record_one = record_one
from cudasnap.replay.engine import close_replays, track_replays
from cudasnap.replay.invocation import profiled, run
track_replays()
rows = []
for i, path in enumerate(sys.argv[3:]):
    if path.startswith("rewrite:"):      # the file rewritten in place, its size and mtime kept
        src, dst = path.split(":")[1:]
        st = os.stat(dst)
        data = open(src, "rb").read()
        assert len(data) == st.st_size
        with open(dst, "r+b") as f:
            f.write(data)
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
        continue
    kernels = None
    if path.startswith("k="):            # k=REGEX:PATH: this replay profiles only those kernels
        kernels, path = path[2:].split(":", 1)
    was = (counts["passes"], counts["decompressions"], decoded[0], keep.stats["prescans_built"], keep.stats["images_read"],
           keep.stats["blobs_read"])
    out = os.path.join(sys.argv[2], f"r{i}.json")
    rc = run(profiled(path, out, MODE, kernels=kernels, repeat=2, warmup=0), checked=True)
    closed = close_replays()
    doc = json.load(open(out))
    run_ = doc["run"]
    now = (counts["passes"], counts["decompressions"], decoded[0], keep.stats["prescans_built"], keep.stats["images_read"],
           keep.stats["blobs_read"])
    rows.append({"path": path, "rc": rc, "exit": run_["exit_code"], "closed": closed,
                 "kernels": sorted({k["name"] for k in doc.get("kernels") or []}),
                 "reused": run_["timings_s"].get("count.plan_reused"),
                 **dict(zip(("passes", "decompressions", "records_decoded", "plans_built", "images_read", "blobs_read"),
                            [b - a for a, b in zip(was, now)]))})
print(json.dumps(rows))
"""


@pytest.mark.parametrize("mode", ["timeline", "isolated"])
def test_a_kept_workers_later_replays_of_a_snapshot_decode_and_plan_nothing(double, tmp_path, mode):
    """In a kept worker (track_replays), the second and later replays of a snapshot take the
    first one's prescan (plan, index, slots, D2H expectations), its decoded module images and
    small H2D sources: no pass over the records, no frame decompressed, no record decoded, no
    plan built, no image or H2D source read; each still replays every call and verifies, from
    memory given back by close()."""
    tidy, leaky = tmp_path / "tidy.cusnap", tmp_path / "leaky.cusnap"
    write_double_program(tidy)
    _leaky(leaky)
    bench = str(Path(__file__).resolve().parents[1] / "bench")
    cp = subprocess.run([sys.executable, "-c", KEPT.replace("MODE", repr(mode)), bench, str(tmp_path),
                         *map(str, (tidy, leaky, tidy, leaky, tidy))],
                        env=double["env"], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr[-3000:]
    rows = json.loads(cp.stdout.strip().splitlines()[-1])
    for r in rows:
        assert r["rc"] == 0 and r["exit"] == 0 and r["closed"]["failed"] == 0 and r["closed"]["spans"] >= 1, r
    first, later = rows[:2], rows[2:]
    for r in first:
        assert r["passes"] >= 1 and r["plans_built"] == 1 and r["images_read"] == 1 and r["reused"] == 0, r
        assert r["blobs_read"] >= 1, r
    for r in later:
        assert (r["passes"], r["decompressions"], r["records_decoded"], r["plans_built"], r["images_read"],
                r["blobs_read"]) == (0, 0, 0, 0, 0, 0), r
        assert r["reused"] == 1, r


def test_a_kept_pass_serves_a_later_replay_with_another_kernel_filter(double, tmp_path):
    """The kernel filter is not an option the pass reads: a later replay of the snapshot with
    `--kernels` takes the kept pass and still profiles only the kernels it names."""
    snap = tmp_path / "tidy.cusnap"
    write_double_program(snap)
    bench = str(Path(__file__).resolve().parents[1] / "bench")
    cp = subprocess.run([sys.executable, "-c", KEPT.replace("MODE", repr("timeline")), bench, str(tmp_path),
                         str(snap), f"k=add_one:{snap}", str(snap)],
                        env=double["env"], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr[-3000:]
    every, only, again = json.loads(cp.stdout.strip().splitlines()[-1])
    assert every["exit"] == only["exit"] == again["exit"] == 0, (every, only, again)
    assert "add_one" in every["kernels"] and len(every["kernels"]) > 1, every
    assert only["kernels"] == ["add_one"] and only["reused"] == 1 and only["plans_built"] == 0, only
    assert again["kernels"] == every["kernels"] and again["reused"] == 1, again


def test_a_kept_prescan_carries_every_field_the_pass_sets():
    """keep.py hands a later replay the pass's fields listed in prescan._FOUND: a field the
    pass sets and the list lacks would be missing (or the first replay's) in that replay."""
    import ast
    from cudasnap.replay import prescan
    tree = ast.parse(Path(prescan.__file__).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Prescan")
    set_here = {t.attr for n in ast.walk(cls) if isinstance(n, (ast.Assign, ast.AnnAssign))
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                for t in (t.elts if isinstance(t, ast.Tuple) else [t])
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    assert set_here - {"ctx"} == set(prescan._FOUND), set_here ^ set(prescan._FOUND)


def test_a_kept_worker_keeps_a_bounded_number_of_prescans(monkeypatch):
    """CUDASNAP_KEEP_PLANS: the least recently taken prescan goes first; one in use stays, and
    one taken is not handed to another replay until release()."""
    from cudasnap.replay import keep
    monkeypatch.setattr(keep, "_on", True)
    monkeypatch.setattr(keep, "_prescans", {})
    monkeypatch.setattr(keep, "KEEP_PLANS", 2)
    monkeypatch.setattr(keep, "stats", dict(keep.stats))
    for k in ("a", "b"):
        keep.put(k, {"scan": k})
    keep.release()
    assert keep.take("a")["scan"] == "a" and keep.take("a") is None      # in use: the caller builds its own
    keep.put("c", {"scan": "c"})                                       # b, least recently taken, goes
    assert set(keep._prescans) == {"a", "c"}
    keep.release()
    assert keep.take("b") is None and keep.take("c")["scan"] == "c"


def test_a_warm_servers_forked_replays_take_the_pass_it_made_ahead(double, tmp_path):
    """[rules] workers = "warm": the server makes a snapshot's pass once, before its first fork
    (engine.plan_ahead, no driver work), and every replay forked after takes it: its profile
    says the plan was reused, and each verifies."""
    import os
    from cudasnap.campaign import cellserver
    from cudasnap.replay.invocation import profiled
    tidy, leaky = tmp_path / "tidy.cusnap", tmp_path / "leaky.cusnap"
    write_double_program(tidy)
    _leaky(leaky)
    client = cellserver.Client(dict(os.environ, **double["env"]))
    try:
        for i, snap in enumerate((tidy, leaky, tidy, leaky)):
            out = tmp_path / f"w{i}.json"
            rep = client.run(dict(profiled(str(snap), str(out), "timeline"), timeout=60))
            assert rep["exit_code"] == 0 and "kept_pid" not in rep, rep
            run = json.loads(out.read_text())["run"]
            assert run["exit_code"] == 0 and run["timings_s"]["count.plan_reused"] == 1, run["timings_s"]
    finally:
        client.kill()


def test_a_kept_prescans_mutable_findings_are_each_replays_own():
    """A replay that takes a kept prescan adds to its own D2H read-ahead (a plan compiled as the
    loop reads it, in call order or too big to keep, reads more): the kept dict, and the 64 MiB
    read-ahead budget it was counted against, stay as the pass left them."""
    from types import SimpleNamespace
    from cudasnap.replay import prescan
    from cudasnap.replay.index import ReplayIndex
    from cudasnap.replay.slots import Slots
    scan = {k: None for k in prescan._FOUND}
    scan.update(slots=Slots(None), index=ReplayIndex(), expected={"a": b"1234"}, expected_bytes=4, incomplete=[],
                malformed=[], unhandled={"cuX": [1, 3]}, h2d_order=[], host_ranges=[], ipc_shared=[])
    kept = {"scan": scan, "notes": [], "names_in": {}, "code_loads": [], "ctx_ids": {}, "fns": {}, "fn_versions": {},
            "func_names": {}}
    reader = SimpleNamespace(blob_size=lambda bid: 4, blob=lambda bid: b"5678", path="x")
    for _ in range(2):
        ctx = SimpleNamespace(res=SimpleNamespace(warnings=[], phases={}), handles=SimpleNamespace(_all={}), funcs={},
                              reader=reader, opt=SimpleNamespace(pace="fast"))
        p = prescan.Prescan(ctx, True, False)
        p._adopt(kept)
        assert p.expected == {"a": b"1234"} and p.expected is not scan["expected"]
        assert p.expected_blob("b") == b"5678" and p.expected_bytes == 8
        assert ctx.reader.blob("b") == b"5678"            # the replay's reader reads its own read-ahead
        p.unhandled["cuX"][0] += 1
        p.incomplete.append({})
    assert scan["expected"] == {"a": b"1234"} and scan["expected_bytes"] == 4
    assert scan["unhandled"] == {"cuX": [1, 3]} and scan["incomplete"] == []


def test_a_snapshot_rewritten_with_its_size_and_mtime_is_replayed_anew(double, tmp_path):
    """cp -p or rsync -t rewrite a snapshot keeping its size and modification time: a kept
    worker's next replay of it reads the new file (its change time tells), nothing kept for the
    old one is taken: here the new version expects other results and fails verification."""
    snap, other = tmp_path / "snap.cusnap", tmp_path / "other.cusnap"
    _leaky(snap)
    size = snap.stat().st_size
    for delta in range(2, 200):                 # another program's results, in a file of the same size
        _leaky_variant(other, float(delta))
        if other.stat().st_size == size:
            break
    else:
        pytest.skip("no variant of the same size")
    bench = str(Path(__file__).resolve().parents[1] / "bench")
    cp = subprocess.run([sys.executable, "-c", KEPT.replace("MODE", repr("timeline")), bench, str(tmp_path),
                         str(snap), str(snap), f"rewrite:{other}:{snap}", str(snap)],
                        env=double["env"], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr[-3000:]
    first, again, rewritten = json.loads(cp.stdout.strip().splitlines()[-1])
    assert first["exit"] == again["exit"] == 0 and again["reused"] == 1, (first, again)
    assert rewritten["reused"] == 0 and rewritten["plans_built"] == 1 and rewritten["passes"] >= 1, rewritten
    assert rewritten["images_read"] == 1 and rewritten["exit"] != 0, rewritten


def test_opened_tells_a_rewrite_that_kept_size_and_mtime(tmp_path):
    import os
    from cudasnap.formats.opened import opened
    snap, other = tmp_path / "a.cusnap", tmp_path / "b.cusnap"
    _leaky_variant(snap, 1.0)
    r1 = opened(snap)
    assert opened(snap) is r1
    st = snap.stat()
    _leaky_variant(other, 1.0)
    snap.write_bytes(other.read_bytes())
    os.utime(snap, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert snap.stat().st_size == st.st_size and snap.stat().st_mtime_ns == st.st_mtime_ns
    r2 = opened(snap)
    assert r2 is not r1 and r2.identity != r1.identity


def test_what_is_kept_is_bounded_and_dropped_with_its_file_version(monkeypatch, tmp_path):
    """keep.py keys everything by the file version: the first use of a newer version of a path
    drops the older one's prescans, payloads and facts; payloads and the prescans' D2H
    read-ahead share CUDASNAP_KEEP_MB, the least recently used dropped first."""
    from types import SimpleNamespace
    from cudasnap.formats.opened import identity
    from cudasnap.replay import keep
    monkeypatch.setattr(keep, "_on", True)
    for name, v in (("_prescans", {}), ("_data", {}), ("_facts", {}), ("_current", {}), ("_data_bytes", 0),
                    ("stats", dict(keep.stats)), ("KEEP_BYTES", 100), ("KEEP_PLANS", 4)):
        monkeypatch.setattr(keep, name, v)
    path = tmp_path / "s.cusnap"
    path.write_bytes(b"one")
    blobs = {"x": b"a" * 40, "y": b"b" * 40, "z": b"c" * 40}
    old = SimpleNamespace(path=str(path), identity=identity(path), blob=blobs.__getitem__)
    k_old = (keep.reader_key(old), True)
    keep.put(k_old, {"scan": 1, "bytes": 10})
    keep.fact(("image_info", keep.reader_key(old), "x"), lambda: "found")
    assert keep.image(old, "x") == blobs["x"] and keep.image(old, "y") == blobs["y"]
    assert keep.used_bytes() == 90
    keep.image(old, "x")                                   # x used last: y goes first
    keep.image(old, "z")
    assert set(b for _, b in keep._data) == {"x", "z"} and keep.used_bytes() <= 100
    keep.release()
    keep.put((keep.reader_key(old), False), {"scan": 2, "bytes": 95})   # payloads go, then idle prescans
    assert keep.used_bytes() <= 100 and not keep._data and list(keep._prescans) == [(keep.reader_key(old), False)]
    path.write_bytes(b"three")                             # a newer version of the path
    new = SimpleNamespace(path=str(path), identity=identity(path), blob=blobs.__getitem__)
    keep.image(new, "x")
    assert not keep._prescans and not keep._facts and all(k[0] == new.identity for k in keep._data)
    assert keep.used_bytes() == 40


def test_invalid_keep_bounds_read_as_their_defaults():
    import os
    code = "from cudasnap.replay import keep; print(keep.KEEP_BYTES >> 20, keep.KEEP_PLANS)"
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                        env=dict(os.environ, CUDASNAP_KEEP_MB="lots", CUDASNAP_KEEP_PLANS="4.5"))
    assert cp.returncode == 0 and cp.stdout.split() == ["1024", "4"], cp.stderr


def test_a_warm_server_plans_ahead_again_once_its_pass_was_dropped(monkeypatch, tmp_path):
    """The server's record of the passes it made ahead follows keep.py: a pass dropped for
    its bounds is made again for the next fork; one still kept is not; a rewrite is planned anew."""
    import os
    from cudasnap.campaign import cellserver
    from cudasnap.replay import engine, keep
    snap = tmp_path / "s.cusnap"
    _leaky(snap)
    made = []
    kept = {}

    def plan_ahead(path, options):
        made.append(path)
        kept[len(made)] = True
        return (len(made),)
    monkeypatch.setattr(engine, "plan_ahead", plan_ahead)
    monkeypatch.setattr(keep, "kept", lambda key: kept.get(key[0], False))
    srv = cellserver._Server.__new__(cellserver._Server)
    srv.planned = {}
    req = {"snapshot": str(snap), "replay": {}}
    srv._plan_ahead(req)
    srv._plan_ahead(req)
    assert len(made) == 1
    kept[1] = False                                        # keep.put dropped it
    srv._plan_ahead(req)
    assert len(made) == 2
    st = snap.stat()
    snap.write_bytes(snap.read_bytes())
    os.utime(snap, ns=(st.st_atime_ns, st.st_mtime_ns))
    srv._plan_ahead(req)
    assert len(made) == 3 and len(srv.planned) == 1
