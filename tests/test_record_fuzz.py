"""Records of the wrong type, not just damaged bytes: a snapshot whose call records carry odd
values (floats, strings, None, lists, maps, 2**63 where the recorder writes ints; a function
name that is not a string) must never make a command print a traceback, report an internal
error, hang or exit outside 0/1/2. Checksums catch damaged bytes (the fault matrix); these
records are well-formed msgpack, as a foreign or hand-edited file would be.

Seeded, small by default; CUDASNAP_RECORD_FUZZ_N (mutations per program) and
CUDASNAP_RECORD_FUZZ_SEED widen it for a longer local run."""
from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

import clibatch
from cudasnap.formats import SnapshotReader
from snapedit import rewrite

ODD = [1.5, -1, 0, 2**64 - 1, 2**63, "x", "", None, [1], {"a": 1}, b"\x00\x01", True]
TOP = ["r", "f", "s", "tid", "t0", "t1", "x", "a"]
PROGS = ["chase", "launch_forms", "memops", "graphnodes"]


@pytest.mark.parametrize("prog", PROGS)
def test_odd_values_in_call_records(prog, double, capture, tmp_path):
    cp, snap = capture(double["progs"][prog])
    assert cp.returncode == 0, cp.stderr
    calls = [c for c in SnapshotReader(snap).records() if c.get("k") == "c"]
    seed = int(os.environ.get("CUDASNAP_RECORD_FUZZ_SEED", "1"))
    rnd = random.Random(f"{seed}:{prog}")
    env = dict(double["env"])
    env.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    env.pop("CUDASNAP_DEBUG", None)
    found, cmds = [], []
    for it in range(int(os.environ.get("CUDASNAP_RECORD_FUZZ_N", "3"))):
        edits: dict = {}
        for _ in range(rnd.randint(1, 3)):
            c = rnd.choice(calls)
            a = c.get("a") or {}
            if a and rnd.random() < 0.8:
                edits.setdefault(c["s"], []).append(("a", rnd.choice(sorted(a)), rnd.choice(ODD)))
            else:
                edits.setdefault(c["s"], []).append(("top", rnd.choice(TOP), rnd.choice(ODD)))

        def mutate(rec):
            for where, key, val in edits.get(rec.get("s"), []) if rec.get("k") == "c" else []:
                if where == "top":
                    rec[key] = val
                elif isinstance(rec.get("a"), dict):
                    rec["a"][key] = val
        bad = tmp_path / f"odd{it}.cusnap"
        try:
            rewrite(snap, bad, lambda rec, _r, _w: mutate(rec))
        except OverflowError:               # the index's byte totals past 64 bits: no file to read
            continue
        cmds += [(edits, cmd) for cmd in (
            ["replay", str(bad)], ["replay", str(bad), "--profile", "isolated", "--repeat", "1"],
            ["info", str(bad)], ["dump", str(bad)], ["stats", str(bad)],
            ["extract", str(bad), "--launch", "1", "-o", str(tmp_path / f"e{it}.cusnap"), "-f"],
            ["export", str(bad), "-o", str(tmp_path / f"x{it}"), "-f"])]
    # each command a process of its own, forked from one that imported the command line once
    for (edits, cmd), p in zip(cmds, clibatch.run([c for _, c in cmds], env, tmp_path / "ran", timeout=90)):
        if p.timed_out:
            found.append((cmd[0], edits, "timed out"))
            continue
        out = p.stdout + p.stderr
        if "Traceback" in out or "internal error" in out or p.returncode not in (0, 1, 2):
            found.append((cmd[0], edits, p.returncode, out[-600:]))
    assert not found, found


def _leaves(d, path=()):
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(d, list):
        for i, v in enumerate(d[:5]):
            yield from _leaves(v, path + (i,))
    yield path


def test_odd_values_in_profile_json(double, capture, tmp_path):
    """The same for the profile JSON compare and advise read: a value of the wrong type anywhere
    is a one-line error naming it (or a result), never a traceback or an internal error."""
    import copy
    import json
    cp, snap = capture(double["progs"]["launch_forms"])
    assert cp.returncode == 0, cp.stderr
    env = dict(double["env"])
    env.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    env.pop("CUDASNAP_DEBUG", None)
    prof = tmp_path / "p.json"
    r = subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snap), "--profile", "timeline", "--out",
                        str(prof), "-q"], env=env, capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr
    base = json.loads(prof.read_text())
    paths = [p for p in _leaves(base) if p]
    rnd = random.Random(int(os.environ.get("CUDASNAP_RECORD_FUZZ_SEED", "1")))
    found, cmds = [], []
    for it in range(4 * int(os.environ.get("CUDASNAP_RECORD_FUZZ_N", "3"))):
        d = copy.deepcopy(base)
        for _ in range(rnd.randint(1, 3)):
            *parent, last = rnd.choice(paths)
            cur = d
            try:
                for p in parent:
                    cur = cur[p]
                cur[last] = rnd.choice([v for v in ODD if not isinstance(v, bytes)])    # JSON has no bytes
            except (KeyError, IndexError, TypeError):
                pass                                # an earlier edit replaced the way there
        m = tmp_path / f"m{it}.json"
        m.write_text(json.dumps(d))
        cmds += [["compare", str(prof), str(m)], ["compare", str(m), str(prof)], ["advise", str(m), "--no-what-if"]]
    for cmd, p in zip(cmds, clibatch.run(cmds, env, tmp_path / "ran", timeout=90)):
        out = p.stdout + p.stderr
        if p.timed_out or "Traceback" in out or "internal error" in out or p.returncode not in (0, 1, 2):
            found.append((cmd[0], p.returncode, out[-400:]))
    assert not found, found


def test_a_profile_of_the_wrong_shape_is_named_by_its_part():
    from cudasnap.replay.profile.report import shape_problem
    ok = {"summary": {"mode": "timeline"}, "launches": [{"seq": 3, "name": "k", "grid": [1, 1, 1], "time_us": 2.5}],
          "kernels": [{"name": "k", "median_us": 2.5, "occupancy": {"limiter": ["registers"]}}], "run": {"gpu": {}}}
    assert shape_problem(ok) is None
    for edit, why in (((("launches", 0, "time_us"), [1]), "launches[0].time_us is a list, not a number"),
                      ((("launches", 0, "grid"), [1, "x"]), "launches[0].grid is not a list of sizes"),
                      ((("kernels", 0, "name"), 7), "kernels[0].name is int, not a string"),
                      ((("kernels", 0, "occupancy"), {"limiter": [[1]]}), "kernels[0].occupancy.limiter is not a list"),
                      ((("run", "gpu"), "H100"), "run.gpu is a string, not a map"),
                      ((("launches", 0, "seq"), True), "launches[0].seq is a boolean, not a number")):
        import copy
        d = copy.deepcopy(ok)
        (path, val) = edit
        cur = d
        for p in path[:-1]:
            cur = cur[p]
        cur[path[-1]] = val
        assert why in (shape_problem(d) or ""), (edit, shape_problem(d))
    assert shape_problem([]) == "the document is a list, not a map"
