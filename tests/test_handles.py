"""Handles identified at first sight, on the CUDA test double: a function handle value the
driver hands out again for another kernel after its module was unloaded (what JIT autotuners
cause), and a function and a context that reached the program through paths no interception
sees."""
from __future__ import annotations

import json
import subprocess
import sys

from cudasnap.formats import SnapshotReader


def _launch_params(r: SnapshotReader):
    return [(c["a"]["f"], len(c["x"]["params"])) for c in r.records("c") if c["f"].startswith("cuLaunchKernel")]


def test_reused_handles_keep_their_own_layout_and_replay(double, capture, native):
    nat = native(double["progs"]["reload"])
    assert nat.returncode == 0, nat.stderr
    assert "REUSED 7" in nat.stdout           # the double really handed the same value out again
    cp, snap = capture(double["progs"]["reload"])
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout == nat.stdout
    r = SnapshotReader(snap)
    fns = list(r.records("fn"))
    launches = _launch_params(r)
    # saxpy(float, float*, float*, int) packs 28 bytes, add_one(float*, int) 12: each launch
    # carries its own kernel's bytes although both share one handle value
    assert [n for _, n in launches[:8]] == [28, 12] * 4
    reused = launches[0][0]
    names = [f["name"] for f in fns if f["h"] == reused]
    assert names[:8] == ["saxpy", "add_one"] * 4, names
    rp = subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snap)], env=double["env"],
                        capture_output=True, text=True, timeout=120)
    assert rp.returncode == 0, rp.stdout + rp.stderr
    assert "OK: every recorded D2H result reproduced" in rp.stdout
    assert "could not identify" not in rp.stdout and "not created by a recorded call" not in rp.stdout


def test_function_from_an_unseen_path_is_identified_before_its_first_use(double, capture):
    cp, snap = capture(double["progs"]["reload"])
    assert cp.returncode == 0, cp.stderr
    r = SnapshotReader(snap)
    order = [(rec["k"], rec.get("f") or rec.get("name")) for rec in r.records() if rec["k"] in ("c", "fn")]
    attr = order.index(("c", "cuFuncSetAttribute"))
    # the fn record naming `incr` comes before the attribute call that first uses the handle
    assert ("fn", "incr") in order[:attr]
    assert not any(c["f"] == "cuModuleGetFunction" for c in r.records("c")
                   if (c.get("a") or {}).get("name") == "incr")


def test_context_made_current_before_it_is_retained(double, capture):
    """The CUDA runtime's order: the primary context's handle, from a path no interception
    sees, is made current, then retained. At first sight nothing can tell it is the primary
    context (it is not active yet); the ctx record says so and replay learns it from the
    retain that follows."""
    cp, snap = capture(double["progs"]["reload"])
    assert cp.returncode == 0, cp.stderr
    r = SnapshotReader(snap)
    calls = list(r.records("c"))
    set_cur = [c for c in calls if c["f"] == "cuCtxSetCurrent"][-1]
    retain = [c for c in calls if c["f"].startswith("cuDevicePrimaryCtxRetain")][-1]
    assert set_cur["s"] < retain["s"] and retain["a"]["pctx"] == set_cur["a"]["ctx"]
    ctxs = {c["h"]: c for c in r.records("ctx")}
    ident = ctxs[set_cur["a"]["ctx"]]
    assert ident["device"] == 0 and ident["primary"] is None


def test_unified_copies_with_a_host_end_are_captured_and_verified(double, capture, native):
    nat = native(double["progs"]["unified"])
    assert nat.returncode == 0, nat.stderr
    assert "RANGE own 1 size 1000" in nat.stdout
    cp, snap = capture(double["progs"]["unified"])
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout == nat.stdout        # placement packs the small allocation in a slab
    copies = [c for c in SnapshotReader(snap).records("c") if c["f"] in ("cuMemcpy", "cuMemcpyAsync")]
    assert len(copies) == 4
    assert ["hostsrc" in c.get("x", {}) for c in copies] == [True, False, True, False]
    assert ["hostdst" in c.get("x", {}) for c in copies] == [False, True, False, True]
    rp = subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snap), "--json"], env=double["env"],
                        capture_output=True, text=True, timeout=120)
    assert rp.returncode == 0, rp.stdout + rp.stderr
    assert '"d2h_verified": 2' in rp.stdout, rp.stdout
    # capture's named limitation (a kernel could read the pinned buffer directly) reaches the
    # replay's warnings: its verdict holds only for what was recorded
    assert any("host-visible allocation" in w for w in json.loads(rp.stdout)["warnings"]), rp.stdout


def test_managed_memory_the_host_writes_in_place_is_captured_and_verified(double, capture, native):
    """progs/managed.c writes and reads managed memory in place. Capture records the allocation
    with the launches that reach it (the first, and the first after a synchronization: not the
    one straight after another launch) and its final bytes before the free; the replay writes
    the recorded bytes back before those launches and verifies the final ones, so a kernel that
    computes wrong is caught."""
    nat = native(double["progs"]["managed"])
    assert nat.returncode == 0 and "SUMS 6644 55548" in nat.stdout, nat.stdout + nat.stderr
    cp, snap = capture(double["progs"]["managed"])
    assert cp.returncode == 0 and cp.stdout == nat.stdout, cp.stdout + cp.stderr
    calls = list(SnapshotReader(snap).records("c"))
    launches = [c for c in calls if c["f"] == "cuLaunchKernel"]
    assert [len((c.get("x") or {}).get("hostmem") or []) for c in launches] == [1, 0, 1]
    assert launches[0]["x"]["hostmem"][0]["size"] == 4096 and launches[0]["x"]["hostmem"][0]["blob"]
    free = [c for c in calls if c["f"].startswith("cuMemFree")][0]
    assert free["x"]["hostcheck"]["size"] == 4096
    _replay_verifies(double, snap, 1, "add_one:3", "cuMemFree")       # the last launch computes wrong
    # above CUDASNAP_HOSTMEM_MAX_MB (here 0: everything) nothing is copied, and the snapshot says so
    cp, small = capture(double["progs"]["managed"], out=snap.with_name("capped.cusnap"),
                        extra_env={"CUDASNAP_HOSTMEM_MAX_MB": "0"})
    assert cp.returncode == 0 and cp.stdout == nat.stdout, cp.stderr
    recs = list(SnapshotReader(small).records())
    assert not any("hostmem" in (r.get("x") or {}) or "hostcheck" in (r.get("x") or {}) for r in recs)
    assert any("above CUDASNAP_HOSTMEM_MAX_MB" in str(r.get("msg")) for r in recs if r.get("k") == "note")


def test_batched_copies_are_captured_and_replayed(double, capture, native):
    """progs/batch.c copies through cuMemcpyBatchAsync: host sources are recorded before the call,
    host destinations after it; replay runs each copy on the batch's stream and verifies the
    host results, so a kernel that computes wrong in between is caught."""
    nat = native(double["progs"]["batch"])
    assert nat.returncode == 0 and nat.stdout.startswith("BATCH "), nat.stdout + nat.stderr
    cp, snap = capture(double["progs"]["batch"])
    assert cp.returncode == 0 and cp.stdout == nat.stdout, cp.stdout + cp.stderr
    batches = [c for c in SnapshotReader(snap).records("c") if c["f"].startswith("cuMemcpyBatchAsync")]
    assert [(len((c.get("x") or {}).get("batchsrc") or []), len((c.get("x") or {}).get("batchdst") or []))
            for c in batches] == [(3, 0), (0, 0), (0, 3)]
    _replay_verifies(double, snap, 3, "add_one:1", "cuMemcpyBatchAsync")


def test_mapped_pinned_memory_the_host_writes_in_place_is_captured_and_verified(double, capture):
    """progs/hostfree.c hands a kernel pinned host memory mapped for the device (DEVICEMAP) that
    the host filled in place: with CUDASNAP_MAPPED_MEMORY=1 capture records it with that launch
    and its final bytes before cuMemFreeHost; replay writes it back and verifies them, so a
    wrong kernel is caught there. Without the setting, capture and replay name the limitation."""
    cp, plain = capture(double["progs"]["hostfree"])
    assert cp.returncode == 0 and "hostmem" not in str(list(SnapshotReader(plain).records("c")))
    cp, snap = capture(double["progs"]["hostfree"], out=plain.with_name("mapped.cusnap"),
                       extra_env={"CUDASNAP_MAPPED_MEMORY": "1"})
    assert cp.returncode == 0 and "HOSTFREE 3072" in cp.stdout, cp.stdout + cp.stderr
    calls = list(SnapshotReader(snap).records("c"))
    first = [c for c in calls if c["f"] == "cuLaunchKernel"][0]
    assert [m["size"] for m in first["x"]["hostmem"]] == [4096]
    free = [c for c in calls if c["f"] == "cuMemFreeHost"][0]
    assert free["x"]["hostcheck"]["size"] == 4096
    res = _replay_verifies(double, snap, 2, "add_one:1", "cuMemFreeHost")
    assert not any("host-visible allocation" in w for w in res["warnings"]), res["warnings"]


def _replay_verifies(double, snap, verified: int, corrupt: str, where: str) -> dict:
    """`replay --json` exits 0 with `verified` D2H results and no mismatch; with the double's
    kernel `corrupt` (NAME:N) computing wrong, exit 1 naming `where`. Returns the JSON result."""
    rp = subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snap), "--json"], env=double["env"],
                        capture_output=True, text=True, timeout=120)
    assert rp.returncode == 0, rp.stdout + rp.stderr
    res = json.loads(rp.stdout)
    assert res["d2h_verified"] == verified and not res["mismatches"] and not res["errors"], rp.stdout
    bad = subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snap)],
                         env=dict(double["env"], CUDA_DOUBLE_CORRUPT=corrupt), capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 1 and where in bad.stdout + bad.stderr, bad.stdout + bad.stderr
    return res
