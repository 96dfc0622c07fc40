"""Collective kernels matched across ranks: the wait for peers and the collective's own time."""
from __future__ import annotations

from cudasnap.replay.collectives import compare_ranks, describe, from_launch_rows, is_collective, split_waits

AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def test_the_late_rank_waits_nothing_and_the_others_wait_for_it():
    # two all-reduces: rank 1 arrives 1000 us late to the first, rank 0 300 us late to the second;
    # each collective then takes 60 us on both ranks
    us = 1000
    ranks = {0: [(AR, 0, 1060 * us), ("gemm", 5, 10), (AR, 5000 * us, 5060 * us)],
             1: [(AR, 1000 * us, 1060 * us), (AR, 4700 * us, 5060 * us)]}
    c = split_waits(ranks)
    assert c["matched"] == 2 and c["unmatched"] == 0
    r0, r1 = c["ranks"][0], c["ranks"][1]
    assert r0["n"] == r1["n"] == 2
    assert r0["collective_us"] == r1["collective_us"] == 60
    assert r0["wait_us"] == 500 and r1["wait_us"] == 150          # medians of (1000, 0) and (0, 300)
    assert r0["kernel_us"] == (1060 + 60) / 2
    lines = describe(c)
    assert lines[0].startswith("collectives: 2 matched") and lines[1].startswith("  job: last arrival to the last rank's end 60.0 us")
    assert "rank 1: 2 kernels" in lines[3]


def test_kernels_on_some_ranks_only_are_counted_not_matched():
    rows = {0: [{"name": AR, "start_ns": 0, "end_ns": 10}, {"name": AR, "start_ns": 20, "end_ns": 30}],
            1: [{"name": AR, "start_ns": 0, "end_ns": 10}]}
    c = from_launch_rows(rows)
    assert c["matched"] == 1 and c["unmatched"] == 1


def test_what_counts_as_a_collective():
    assert is_collective(AR) and is_collective("ncclKernel_AllGather_RING_LL_Sum_int8_t")
    assert not is_collective("ampere_sgemm_128x64_nn") and not is_collective(None)
    assert describe(split_waits({0: [("gemm", 0, 1)], 1: []})) == []


def test_mangled_names_count_too():
    assert is_collective("_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE")


def _ring_run(last_order, hop_us=4, base_us=48):
    """Three ranks in a ring; per collective, the rank in last_order arrives last (100 us late)
    and each rank finishes base + hop * (ring distance from that rank) after it."""
    us, ranks = 1000, {0: [], 1: [], 2: []}
    for i, last in enumerate(last_order):
        t = i * 10_000 * us
        for r in ranks:
            start = t + (100 * us if r == last else 0)
            end = t + 100 * us + (base_us + hop_us * ((r - last) % 3)) * us
            ranks[r].append((AR, start, end))
    return split_waits(ranks)


def test_runs_with_other_arrival_orders_compare_per_last_rank():
    # the same ring costs, but rank 2 comes last in one run and rank 0 in the other: plain
    # per-rank medians differ by a hop or two; compared per last-arriving rank they agree
    a = _ring_run([2] * 8 + [0] * 6)
    b = _ring_run([0] * 8 + [2] * 6)
    assert a["ranks"][1]["collective_us"] != b["ranks"][1]["collective_us"]
    assert {"kernel": AR.split("(")[0], "last": 2, "n": 8, "collective_us": 52} in a["ranks"][0]["by_last"]
    assert a["span_us"] in (56, 52)
    cmp = compare_ranks(a, b)
    assert all(v["by"] == "last rank" and v["worst_pct"] == 0 and len(v["cells"]) == 2 for v in cmp.values())
    # a rank that really got slower shows up in every cell
    slow = _ring_run([2] * 8 + [0] * 6, base_us=60)
    assert all(v["worst_pct"] > 10 for v in compare_ranks(slow, b).values())
    # no arrival order in common: compared per ring distance from the last rank
    c = compare_ranks(_ring_run([1] * 6), _ring_run([2] * 6))
    assert all(v["by"] == "ring distance" and v["worst_pct"] == 0 and len(v["cells"]) == 1 for v in c.values())
    # too few instances of any arrival order: nothing to compare
    assert compare_ranks(_ring_run([1] * 3), b)[0] == {"by": None, "cells": [], "worst_pct": None}


# --------------------------------------------------------------------------- profiling a rank of a job
def _rank_snapshot(path, reps=3, n=64, free=False, lead=False):
    """fill launched as an NCCL-named kernel (a collective) between incr launches, one process.
    free: the program frees its buffers after its last D2H (as a job's teardown does); lead: a
    collective first (the stretch then starts after one)."""
    import struct
    from synth import Synth
    s = Synth(path)
    ctx, mod = 0x55550000, 0x55560000
    f_incr, f_coll = 0x55570005, 0x55570002
    s.w.write({"k": "proc", "driver_version": 13000,
               "gpus": [{"index": 0, "name": "cudasnap test double", "uuid": "GPU-0", "cc": [9, 0], "mem": 1 << 36}]})
    s.double_prologue("incr", f_incr, [[0, 8], [8, 4]], ctx, mod)
    # the double's add_one under an NCCL kernel's name, in a module of its own
    nccl_mod, name = 0x55561000, "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
    s.call("cuModuleLoadData", {"module": nccl_mod, "image": 0x7F0000002000},
           x={"image": s.blob(f"CUDADOUBLE\nkernel {name}\n".encode() + b"\0")})
    s.call("cuModuleGetFunction", {"hfunc": f_coll, "hmod": nccl_mod, "name": name})
    s.fn(f_coll, name, nccl_mod, [[0, 8], [8, 4]])
    I, F = 0x200000000000, 0x200000001000
    for p in (I, F):
        s.call("cuMemAlloc_v2", {"dptr": p, "bytesize": n * 4})
    s.call("cuMemcpyHtoD_v2", {"dstDevice": I, "srcHost": 0x7F0000100000, "ByteCount": n * 4},
           x={"srcHost": s.blob(bytes(n * 4))})
    if lead:
        s.launch(f_coll, struct.pack("<Qi", F, n), block=n)
    for r in range(reps):
        s.launch(f_incr, struct.pack("<Qi", I, n), block=n)
        s.launch(f_coll, struct.pack("<Qi", F, n), block=n)
    s.call("cuCtxSynchronize", {})
    s.call("cuMemcpyDtoH_v2", {"dstHost": 0x7F0000200000, "srcDevice": I, "ByteCount": n * 4},
           x={"dstHost": s.blob(struct.pack(f"<{n}i", *([reps] * n)))})
    if free:
        for p in (I, F):
            s.call("cuMemFree_v2", {"dptr": p})
    s.call("cuDevicePrimaryCtxRelease_v2", {"dev": 0})
    s.w.write({"k": "end", "exit": 0, "signal": None, "partial": False})
    s.close()
    return path


def _replay_json(double, snap, *args, env=None):
    import json
    import subprocess
    import sys
    e = dict(double["env"])
    e.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    e.update(env or {})
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snap), "--json", *args], env=e,
                        capture_output=True, text=True, timeout=180)
    return cp, (json.loads(cp.stdout) if cp.stdout.strip().startswith("{") else {})


def test_a_rank_profiles_around_its_collectives(double, tmp_path):
    """In a job, isolated mode runs a collective once (repeated alone it would wait for its peers
    forever) and times the rest; graph mode profiles the longest stretch between collectives, and
    refuses a selection holding one at once, naming it, while the rank replays on (exit 2: no
    profile). Outside a job both profile as usual."""
    snap = _rank_snapshot(tmp_path / "rank.cusnap")
    job = {"CUDASNAP_GROUP_RANK": "0"}
    cp, d = _replay_json(double, snap, "--profile", "isolated", "--repeat", "2", "--warmup", "0", env=job)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    s = d["profile"]["summary"]
    assert s["collective_launches"] == 3 and s["launches_profiled"] == 3, s
    assert {r["name"] for r in d["profile"]["launches"]} == {"incr"}
    assert "--profile timeline times them" in " ".join(d["profile"]["warnings"])
    # graph mode, every launch selected: the longest stretch between collectives
    cp, d = _replay_json(double, snap, "--profile", "graph", "--repeat", "2", "--warmup", "0", env=job)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    s = d["profile"]["summary"]
    assert s["stretch"]["launches"] == 1 and s["stretch"]["collectives"] == 3 and s["launches"] == 1, s
    assert {r["name"] for r in d["profile"]["launches"]} == {"incr"} and d["d2h_verified"] == 1
    # profiled after the replay's last call: a pause between collectives could deadlock with a peer
    assert s.get("profiled_at_end") is True, s
    assert "at the replay's end" in " ".join(d["profile"]["warnings"])
    # launches replayed one by one by their handlers (NCCL's are) hold the stretch too: a
    # collective before it in the graph waited for a peer running a different number of runs
    lead = _rank_snapshot(tmp_path / "lead.cusnap", lead=True)
    cp, d = _replay_json(double, lead, "--profile", "graph", "--repeat", "2", "--warmup", "0",
                         env={**job, "CUDASNAP_FASTPATH": "0"})
    assert cp.returncode == 0, cp.stdout + cp.stderr
    s = d["profile"]["summary"]
    assert s["stretch"]["launches"] == 1 and s["launches"] == 1 and s["nodes"] == 1, s
    assert {r["name"] for r in d["profile"]["launches"]} == {"incr"}
    # a selection holding a collective is refused at once, the rank replaying on
    cp, d = _replay_json(double, snap, "--profile", "graph", "-c", "4", "--repeat", "2", "--warmup", "0", env=job)
    assert cp.returncode == 2, cp.stdout + cp.stderr
    assert "collective launch(es)" in d["profile"]["summary"]["error"] and d["d2h_verified"] == 1, d
    cp, d = _replay_json(double, snap, "--profile", "graph", "--repeat", "2", "--warmup", "0", "--no-timeline-check")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert d["profile"]["summary"]["launches"] == 6


def test_extract_refuses_a_collective_kernel_at_once(double, tmp_path):
    """A collective kernel waits inside for its peers: an extract of one would hang when run
    alone (an NCCL AllGather's --check ran 300 s on an H200). It is refused before any work."""
    import subprocess
    import sys
    import time
    from cudasnap.formats import SnapshotReader
    snap = _rank_snapshot(tmp_path / "rank.cusnap")
    launches = [(c["s"], (c.get("a") or {}).get("f")) for c in SnapshotReader(snap).records(("c",))
                if c["f"].startswith("cuLaunch")]
    coll = next(s for s, f in launches if f == 0x55570002)
    t0 = time.monotonic()
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "extract", str(snap), "--launch", str(coll), "-o",
                         str(tmp_path / "x.cusnap"), "--check"], env=double["env"], capture_output=True, text=True,
                        timeout=120)
    assert cp.returncode == 2 and "collective kernel" in cp.stderr and "cannot run alone" in cp.stderr, cp.stderr
    assert len(cp.stderr.strip().splitlines()) == 1 and time.monotonic() - t0 < 30
    assert not (tmp_path / "x.cusnap").exists()
    incr = next(s for s, f in launches if f == 0x55570005)
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "extract", str(snap), "--launch", str(incr), "-o",
                         str(tmp_path / "y.cusnap"), "--check"], env=double["env"], capture_output=True, text=True,
                        timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr


def test_a_ranks_graph_phase_keeps_memory_the_program_freed_later(double, tmp_path):
    """A job rank's stretch is profiled at the replay's end: the program's frees after it wait
    until then (held by the engine), so the stretch's kernels still find their memory."""
    snap = _rank_snapshot(tmp_path / "rank.cusnap", free=True)
    cp, d = _replay_json(double, snap, "--profile", "graph", "--repeat", "2", "--warmup", "0",
                         env={"CUDASNAP_GROUP_RANK": "0"})
    assert cp.returncode == 0, cp.stdout + cp.stderr
    s = d["profile"]["summary"]
    assert s.get("profiled_at_end") is True and s["stretch"]["launches"] == 1, s
    assert d["d2h_verified"] == 1 and not d["errors"], d
    notes = d.get("warnings") or []
    assert [n for n in notes if "2 call(s) that free memory" in n and "waited for the profile" in n], notes


def test_graph_mode_in_a_job_says_the_rank_is_done_before_it_profiles(tmp_path, monkeypatch):
    """Graph mode profiles a rank's stretch at the replay's end, and may hear the end before the
    group hook does: it marks the rank ended first, or a peer whose last calls were recorded
    after this rank's would wait for this rank while this rank's last collective, still on the
    GPU, waits for the peer (a hang seen on 2 H200s)."""
    from cudasnap.replay import group
    path = tmp_path / "progress"
    group.Progress(str(path), 2, create=True)
    monkeypatch.setenv(group.ENV_PROGRESS, str(path))
    monkeypatch.setenv(group.ENV_NRANKS, "2")
    monkeypatch.setenv(group.ENV_RANK, "1")
    hook = group.RankHook()
    hook.prog.set(1, 1234)
    peer = group.Progress(str(path), 2)
    assert peer.words[1] == 1234
    assert group.peers_text() == "rank 0 still replaying"
    group.rank_done()
    assert peer.words[1] == group.DONE and peer.words[0] == 0
    peer.set(0, group.DONE)
    assert group.peers_text() == "rank 0 ended"
    from cudasnap.replay.profile import graphmode
    assert graphmode.rank_done is group.rank_done
