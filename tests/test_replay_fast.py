"""The replay engine's launch fast path (native batches of plain launches) and the streamed
H2D copy path give the same results as the per-call path, on the test-double driver."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import pytest

from synth import Synth

MODES = ["0", "python", "1"]


def _replay(double, snap, mode, *args, extra_env=None):
    env = dict(double["env"])
    env.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    env["CUDASNAP_FASTPATH"] = mode
    env.update(extra_env or {})
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snap), "--json", *args], env=env,
                        capture_output=True, text=True, timeout=120)
    assert cp.stdout.strip(), f"replay printed no JSON (exit {cp.returncode}): {cp.stderr[-2000:]}"
    return cp, json.loads(cp.stdout)


def incr_session(path, n=16, launches=200, bad_at=None, h2d_bytes=None, queries=True, tids=(100,)):
    """D = zeros(n) (or h2d_bytes of data); incr(D, n) `launches` times, with queries between
    launches; D2H of D expects `launches` in every element.  bad_at: that launch gets an
    illegal pointer (the double fails it at launch time)."""
    s = Synth(path)
    ctx, mod, f_incr = 0x55550000, 0x55560000, 0x55570005
    D = 0x200000000000
    s.double_prologue("incr", f_incr, [[0, 8], [8, 4]], ctx, mod)
    size = max(n * 4, h2d_bytes or 0)
    s.call("cuMemAlloc_v2", {"dptr": D, "bytesize": size})
    init = bytes(n * 4)
    if h2d_bytes:
        init = bytes(n * 4) + os.urandom(h2d_bytes - n * 4)
    s.call("cuMemcpyHtoD_v2", {"dstDevice": D, "srcHost": 0x7F0000100000, "ByteCount": len(init)},
           x={"srcHost": s.blob(init)})
    seqs = []
    for i in range(launches):
        p = struct.pack("<Qi", 0x10 if i == bad_at else D, n)
        seqs.append(s.launch(f_incr, p, block=n, r=0)["s"])
        if queries and i % 3 == 0:
            s.call("cuCtxGetCurrent", {"pctx": ctx})
    s.call("cuCtxSynchronize", {})
    s.call("cuMemcpyDtoH_v2", {"dstHost": 0x7F0000200000, "srcDevice": D, "ByteCount": n * 4},
           x={"dstHost": s.blob(struct.pack(f"<{n}i", *([launches] * n)))})
    if h2d_bytes:
        s.call("cuMemcpyDtoH_v2", {"dstHost": 0x7F0000300000, "srcDevice": D + n * 4, "ByteCount": len(init) - n * 4},
               x={"dstHost": s.blob(init[n * 4:])})
    s.call("cuMemFree_v2", {"dptr": D})
    s.w.write({"k": "end", "exit": 0, "signal": None, "partial": False})
    s.close()
    return seqs


KEYS = ("exit_code", "launches", "calls", "skipped", "d2h_verified", "d2h_bytes", "last_seq", "errors", "by_family")


@pytest.mark.parametrize("mode", MODES)
def test_fast_path_matches_the_per_call_path(double, tmp_path, mode):
    snap = tmp_path / "incr.cusnap"
    incr_session(snap, launches=1000)
    cp0, base = _replay(double, snap, "0")
    cp, got = _replay(double, snap, mode)
    assert base["exit_code"] == 0 and base["launches"] == 1000 and base["d2h_verified"] == 1, cp0.stdout
    assert {k: got.get(k) for k in KEYS} == {k: base.get(k) for k in KEYS}
    assert got["first_launch_mono"] <= got["last_launch_mono"]


@pytest.mark.parametrize("mode", MODES)
def test_failing_launch_in_a_batch_is_reported_on_its_call(double, tmp_path, mode):
    snap = tmp_path / "bad.cusnap"
    seqs = incr_session(snap, launches=50, bad_at=20)
    cp, r = _replay(double, snap, mode)
    assert r["exit_code"] == 2 and r["launches"] == 20
    assert len(r["errors"]) == 1 and r["errors"][0].startswith(f"call #{seqs[20]} cuLaunchKernel: replay returned")
    cp, r = _replay(double, snap, mode, "--continue-on-error")
    assert r["launches"] == 49 and len(r["errors"]) == 1 and r["d2h_verified"] == 1 and r["mismatches"]


def test_hooks_keep_the_per_launch_path(double, tmp_path):
    snap = tmp_path / "incr.cusnap"
    incr_session(snap, launches=30)
    hook = tmp_path / "count.py"
    out = tmp_path / "n.txt"
    hook.write_text("class H:\n    n = 0\n    def after_launch(self, ev):\n        H.n += 1\n"
                    f"    def end(self, ev):\n        open({str(out)!r}, 'w').write(str(H.n))\n")
    cp, r = _replay(double, snap, "1", "--hook", f"{hook}:H")
    assert r["exit_code"] == 0 and out.read_text() == "30"


@pytest.mark.parametrize("prefetch", ["0", "1"])
def test_big_h2d_streams_through_pinned_staging(double, tmp_path, prefetch):
    snap = tmp_path / "big.cusnap"
    incr_session(snap, launches=5, h2d_bytes=(24 << 20) + 4096)
    cp, r = _replay(double, snap, "1", extra_env={"CUDASNAP_PREFETCH": prefetch})
    assert r["exit_code"] == 0 and r["d2h_verified"] == 2 and not r["mismatches"], (r["errors"], cp.stderr)


# ---------------------------------------------------------------------------- mixed plain calls
CFG = struct.Struct("<7I4xQQI4x")      # CUlaunchConfig


CLUSTER_1 = struct.pack("<II3I52x", 4, 0, 1, 1, 1)     # CUlaunchAttribute: CLUSTER_DIMENSION (1, 1, 1)


def mixed_session(path, steps=40, bad=None, unknown_event_at=None, spin_at=None, tamper_at=None, attrs=False):
    """A framework-like mix on the double: per step context switches (set, push, pop), add_one(A) and incr(B)
    (the second through cuLaunchKernelEx), event record + stream wait, async memsets, a D2D copy
    C <- A, a unified cuMemcpyAsync D <- B, queries, stream syncs; D2H of C and D every 10 steps.
    bad: step whose memset targets unallocated memory (the double fails it); unknown_event_at:
    step whose wait names an event no recorded call created; spin_at: step with a 5 s kernel;
    tamper_at: step whose D2H of C expects a wrong value; attrs: the cuLaunchKernelEx carries a
    launch attribute (a cluster dimension)."""
    s = Synth(path)
    ctx, mod, f_add, f_incr, f_spin = 0x55550000, 0x55560000, 0x55570001, 0x55570005, 0x55570006
    S1, S2, E = 0x5001, 0x5002, 0x6001
    n = 16
    A, B, C, D = 0x200000000000, 0x200000001000, 0x200000002000, 0x200000003000
    s.double_prologue("add_one", f_add, [[0, 8], [8, 4]], ctx, mod)
    s.call("cuModuleGetFunction", {"hfunc": f_incr, "hmod": mod, "name": "incr"})
    s.fn(f_incr, "incr", mod, [[0, 8], [8, 4]])
    s.call("cuModuleGetFunction", {"hfunc": f_spin, "hmod": mod, "name": "spin"})
    s.fn(f_spin, "spin", mod, [[0, 4]])
    s.call("cuStreamCreate", {"phStream": S1, "Flags": 0})
    s.call("cuStreamCreate", {"phStream": S2, "Flags": 0})
    s.call("cuEventCreate", {"phEvent": E, "Flags": 0})
    for p in (A, B, C, D):
        s.call("cuMemAlloc_v2", {"dptr": p, "bytesize": n * 4})
        s.call("cuMemsetD8_v2", {"dstDevice": p, "uc": 0, "N": n * 4})
    for i in range(steps):
        s.call("cuCtxSetCurrent", {"ctx": ctx})
        s.launch(f_add, struct.pack("<Qi", A, n), block=n, stream=S1)
        cfg = CFG.pack(1, 1, 1, n, 1, 1, 0, S1, 0x7FFF1000 if attrs else 0, 1 if attrs else 0)
        s.call("cuLaunchKernelEx", {"config": cfg, "f": f_incr, "kernelParams": 0x7FFF0000, "extra": 0},
               x={"params": struct.pack("<Qi", B, n), **({"attrs": CLUSTER_1} if attrs else {})})
        s.call("cuEventRecord", {"hEvent": E, "hStream": S1})
        s.call("cuStreamWaitEvent", {"hStream": S2, "hEvent": 0x6666 if i == unknown_event_at else E, "Flags": 0})
        s.call("cuCtxGetCurrent", {"pctx": ctx})
        s.call("cuCtxPushCurrent_v2", {"ctx": ctx})
        s.call("cuCtxPopCurrent_v2", {"pctx": ctx})
        s.call("cuMemsetD32Async", {"dstDevice": 0x10 if i == bad else C, "ui": i, "N": n, "hStream": S2})
        s.call("cuMemcpyDtoDAsync_v2", {"dstDevice": C, "srcDevice": A, "ByteCount": n * 4, "hStream": S2})
        s.call("cuMemcpyAsync", {"dst": D, "src": B, "ByteCount": n * 4, "hStream": S2})
        if i == spin_at:
            s.launch(f_spin, struct.pack("<i", 5000), stream=S1)
        if i % 5 == 4:
            s.call("cuStreamSynchronize", {"hStream": S2})
        if i % 10 == 9:
            s.call("cuMemcpyDtoH_v2", {"dstHost": 0x7F0000200000, "srcDevice": C, "ByteCount": n * 4},
                   x={"dstHost": s.blob(struct.pack(f"<{n}f", *([float(i + 1 + (i == tamper_at))] * n)))})
            s.call("cuMemcpyDtoH_v2", {"dstHost": 0x7F0000300000, "srcDevice": D, "ByteCount": n * 4},
                   x={"dstHost": s.blob(struct.pack(f"<{n}i", *([i + 1] * n)))})
    s.call("cuCtxSynchronize", {})
    s.call("cuEventSynchronize", {"hEvent": E})
    s.call("cuEventDestroy_v2", {"hEvent": E})
    s.w.write({"k": "end", "exit": 0, "signal": None, "partial": False})
    s.close()


MIXED_KEYS = KEYS + ("mismatches", "filtered", "errors_recurred", "d2h_unverified", "pace")


def test_executor_matches_the_per_call_path_on_a_mixed_snapshot(double, tmp_path):
    snap = tmp_path / "mixed.cusnap"
    mixed_session(snap, steps=40)
    _cp0, base = _replay(double, snap, "0")
    assert base["exit_code"] == 0 and base["d2h_verified"] == 8 and base["launches"] == 80, base["errors"]
    for mode in ("python", "1"):
        cp, got = _replay(double, snap, mode)
        assert {k: got.get(k) for k in MIXED_KEYS} == {k: base.get(k) for k in MIXED_KEYS}, (mode, cp.stderr)
        assert len(got["sync_mono"]) == len(base["sync_mono"]) == 10   # 8 stream, 1 context, 1 event
        assert [q for q, _t in got["sync_mono"]] == [q for q, _t in base["sync_mono"]]
        assert all(a[1] <= b[1] for a, b in zip(got["sync_mono"], got["sync_mono"][1:]))
        assert got["first_launch_mono"] <= got["last_launch_mono"]
        assert (got["native_calls"] > 300) == (mode == "1")


def test_executor_runs_launches_with_value_only_attributes(double, tmp_path):
    """cuLaunchKernelEx with a cluster dimension (as cuBLASLt's GEMMs launch) runs in the
    executor with its attributes as recorded: the same results as call by call."""
    snap = tmp_path / "attrs.cusnap"
    mixed_session(snap, steps=20, attrs=True)
    _cp0, base = _replay(double, snap, "0")
    assert base["exit_code"] == 0 and base["launches"] == 40, base["errors"]
    _cp, got = _replay(double, snap, "1")
    assert {k: got.get(k) for k in MIXED_KEYS} == {k: base.get(k) for k in MIXED_KEYS}
    assert got["native_calls"] >= 40 * 3         # the Ex launches among them


@pytest.mark.parametrize("extra", [(), ("--continue-on-error",)])
def test_executor_reports_a_mismatch_with_its_writer(double, tmp_path, extra):
    """A wrong D2H result names the last writer of its source (C <- A copies carry add_one):
    the same with batches as call by call."""
    snap = tmp_path / "mixed.cusnap"
    mixed_session(snap, steps=30, tamper_at=19)
    _cp0, base = _replay(double, snap, "0", *extra)
    _cp, got = _replay(double, snap, "1", *extra)
    assert base["exit_code"] == 1 and len(base["mismatches"]) == 1
    assert "add_one" in json.dumps(base["mismatches"])
    assert {k: got.get(k) for k in MIXED_KEYS} == {k: base.get(k) for k in MIXED_KEYS}


@pytest.mark.parametrize("which", ["bad", "unknown_event_at"])
def test_executor_stops_on_the_same_call_with_the_same_error(double, tmp_path, which):
    snap = tmp_path / "err.cusnap"
    mixed_session(snap, steps=30, **{which: 13})
    _cp0, base = _replay(double, snap, "0")
    assert base["exit_code"] == 2 and len(base["errors"]) == 1, base["errors"]
    for mode in ("python", "1"):
        _cp, got = _replay(double, snap, mode)
        assert {k: got.get(k) for k in MIXED_KEYS} == {k: base.get(k) for k in MIXED_KEYS}, mode
    _cp0, base = _replay(double, snap, "0", "--continue-on-error")
    _cp, got = _replay(double, snap, "1", "--continue-on-error")
    assert base["errors"] and {k: got.get(k) for k in MIXED_KEYS} == {k: base.get(k) for k in MIXED_KEYS}


def test_executor_watchdog_names_the_call_in_progress(double, tmp_path):
    snap = tmp_path / "spin.cusnap"
    mixed_session(snap, steps=20, spin_at=7)
    from cudasnap.formats import SnapshotReader
    seq = next(r["s"] for r in SnapshotReader(snap).records("c") if (r.get("x") or {}).get("params") == struct.pack("<i", 5000))
    env = dict(double["env"], CUDASNAP_FASTPATH="1")
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snap), "--watchdog", "0.5"], env=env,
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 2
    assert "watchdog" in cp.stderr and f"call #{seq} cuLaunchKernel" in cp.stderr, cp.stderr


def test_pace_recorded_keeps_the_recorded_gaps(double, tmp_path):
    """Synth spaces calls 1 us apart: 40 steps of ~12 calls take >= 0.5 ms paced; the result
    says which pace ran and is otherwise the same."""
    snap = tmp_path / "mixed.cusnap"
    mixed_session(snap, steps=40)
    _cp, fast = _replay(double, snap, "1")
    _cp, paced = _replay(double, snap, "1", "--pace", "recorded")
    assert fast["pace"] == "fast" and paced["pace"] == "recorded"
    assert {k: paced.get(k) for k in KEYS} == {k: fast.get(k) for k in KEYS}
    from cudasnap.formats import SnapshotReader
    recs = [r for r in SnapshotReader(snap).records("c")]
    span = (recs[-1]["t0"] - recs[0]["t0"]) * 1e-9
    assert paced["loop_end_mono"] - paced["loop_start_mono"] >= span * 0.9
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snap), "--pace", "slow"], env=double["env"],
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 2 and "Traceback" not in cp.stderr


TIMELINE_FAKE_CUPTI = '''
import json, sys
from cudasnap.replay.options import ReplayOptions
from cudasnap.replay.profile import ProfileConfig, profile_replay
import cudasnap.replay.profile.timeline as tl

snap, n = sys.argv[1], int(sys.argv[2])


class FakeCupti:
    """CUPTI as it behaves without API records: one kernel record per kernel, in issue order
    (correlation ids ascending), no external correlation records."""
    def __init__(self):
        self.kernels, self.copies, self.ext, self.kernel_nodes, self.copy_nodes = [], [], {}, [], []
        self.now = 0
    def push(self, e): pass
    def pop(self): pass
    def flush(self):
        if not self.kernels:
            self.kernels = [(i + 1, 1000 * i, 1000 * i + 100 + i, "k", 7) for i in range(n)]
            self.kernel_nodes = [(0, 0)] * n
    def close(self): self.flush()
    def timestamp(self):
        self.now += 1
        return self.now


tl.open_cupti = lambda backend, warn: FakeCupti()
run = profile_replay(snap, ProfileConfig(mode="timeline"), ReplayOptions(quiet=True))
print(json.dumps({"exit": run.result.exit_code, "native_calls": run.result.native_calls,
                  "launches": run.result.launches, "rows": run.report["launches"]}, default=str))
'''


def test_timeline_with_cupti_runs_in_the_executor_and_times_every_launch(double, tmp_path):
    snap = tmp_path / "mixed.cusnap"
    mixed_session(snap, steps=20)
    from cudasnap.formats import SnapshotReader
    seqs = [r["s"] for r in SnapshotReader(snap).records("c") if r["f"].startswith("cuLaunch")]
    p = tmp_path / "fake.py"
    p.write_text(TIMELINE_FAKE_CUPTI)
    env = dict(double["env"], CUDASNAP_FASTPATH="1")
    cp = subprocess.run([sys.executable, str(p), str(snap), str(len(seqs))], env=env, capture_output=True, text=True,
                        timeout=120)
    r = json.loads(cp.stdout.strip().splitlines()[-1])
    assert r["exit"] == 0 and r["launches"] == len(seqs) and r["native_calls"] > 100, cp.stderr
    rows = sorted(r["rows"], key=lambda x: x["seq"])
    assert [x["seq"] for x in rows] == seqs
    assert [x["index"] for x in rows] == list(range(len(seqs)))
    # the i-th kernel record (issue order) times the i-th launch: durations 100 + i ns
    assert [round(x["time_us"] * 1e3) for x in rows] == [100 + i for i in range(len(seqs))]
    assert {x["name"] for x in rows} == {"add_one", "incr"}


@pytest.mark.parametrize("extra", [("--profiler-range", "workload"), ("--calls", "40-200"), ("--threads",)])
def test_executor_options_match_the_per_call_path(double, tmp_path, extra):
    """--profiler-range workload starts and stops inside batches at the same calls; selections
    and --threads (which keep every call on its handler) count the same."""
    snap = tmp_path / "mixed.cusnap"
    mixed_session(snap, steps=20)
    _cp0, base = _replay(double, snap, "0", *extra)
    _cp, got = _replay(double, snap, "1", *extra)
    assert base["exit_code"] == 0, base["errors"]     # --calls: results the selection does not decide are not compared
    if extra[0] == "--calls":
        assert base["d2h_left_out"] > 0 and not base["mismatches"]
    assert {k: got.get(k) for k in MIXED_KEYS + ("profiler",)} == {k: base.get(k) for k in MIXED_KEYS + ("profiler",)}
    if extra[0] == "--profiler-range":
        assert got["profiler"]["starts"] == got["profiler"]["stops"] == 1 and got["native_calls"] > 100


STREAMED = '''
import json, sys
from cudasnap.replay import plan
from cudasnap.replay.engine import Replayer
from cudasnap.replay.options import ReplayOptions
plan.PLAN_MAX_OPS = 50               # too big to keep: compiled again while the loop reads
r = Replayer(sys.argv[1], ReplayOptions(quiet=True)).run()
print(json.dumps(r.to_dict(), default=str))
'''


def test_executor_streams_a_plan_too_big_to_keep(double, tmp_path):
    snap = tmp_path / "mixed.cusnap"
    mixed_session(snap, steps=30)
    _cp0, base = _replay(double, snap, "0")
    p = tmp_path / "streamed.py"
    p.write_text(STREAMED)
    env = dict(double["env"], CUDASNAP_FASTPATH="1")
    env.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    cp = subprocess.run([sys.executable, str(p), str(snap)], env=env, capture_output=True, text=True, timeout=120)
    got = json.loads(cp.stdout.strip().splitlines()[-1])
    assert {k: got.get(k) for k in MIXED_KEYS} == {k: base.get(k) for k in MIXED_KEYS}, cp.stderr
    assert got["native_calls"] > 200
