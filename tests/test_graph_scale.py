"""Graph mode at scale: its own work grows linearly with the launches, and nothing in it can
wait forever for the GPU.

- On the test double: synthetic training loops (bench/bench_graphmode_scale.py: per step a
  stream-ordered scratch allocation, a memset, launches on two streams, a device-to-device and
  a host-to-device copy, a free) of 2,000 and 16,000 launches, replayed under --profile graph
  in one test; graph mode's own time per launch (its phases, the replay and the timeline check
  left out) at 16k is at most twice that at 2k.
- The CUPTI attribution (records -> graph node ids -> captured operations), by creation records
  and by graph order, on 2,000 and 16,000 nodes: the same ratio.
- The parameter scan for what launches could write looks each distinct word up once.
- The launch gate: a launch that blocks while its stream is held (a big graph filling the
  stream's queue) is released by the gate's timer, and the gate is off afterwards.
- The timeline check takes its reference from graph mode's own replay: one Replayer.run, no
  child process; with CUPTI the replay up to the sequence runs in the C executor, as timeline
  mode's does, and the sequence is recorded from its batches."""
from __future__ import annotations

import importlib.util
import json
import struct
import time
from pathlib import Path
from types import SimpleNamespace

from test_profile import _replay

ROOT = Path(__file__).resolve().parents[1]
RATIO = 3.0          # per-node time at 8x the nodes: linear stays near 1x, quadratic would be 8x (slack for a loaded CI host)


def _bench():
    spec = importlib.util.spec_from_file_location("bench_graphmode_scale", ROOT / "bench" / "bench_graphmode_scale.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _graph(double, snap, out):
    rp = _replay(double, snap, "--profile", "graph", "--repeat", "3", "--warmup", "1", "--out", str(out), timeout=300)
    assert rp.returncode == 0, (rp.stdout + rp.stderr)[-3000:]     # verified: memory put back after the runs
    return json.loads(out.read_text())["summary"]


def test_graph_mode_time_per_launch_does_not_grow_with_the_snapshot(double, tmp_path):
    bench = _bench()
    sizes = (2000, 16000)
    facts = {}
    for n in sizes:
        facts[n] = bench.loop_program(tmp_path / f"loop{n}.cusnap", n)
        assert facts[n]["launches"] == n
    per_launch = {n: [] for n in sizes}
    summaries = {}
    for attempt in range(2):       # a second measurement only when a loaded host made the first one slow
        for n in sizes:
            s = _graph(double, tmp_path / f"loop{n}.cusnap", tmp_path / f"g{n}_{attempt}.json")
            summaries[n] = s
            own = sum(v for k, v in s["phases_s"].items() if k not in bench.NOT_OWN)
            per_launch[n].append(own / n)
        if min(per_launch[16000]) <= RATIO * min(per_launch[2000]):
            break
    for n, s in summaries.items():
        steps = facts[n]["steps"]
        assert "error" not in s, s
        assert s["launches"] == s["launches_timed"] == n, s
        # between the first and the last launch: every step's memset but the first's, copies but the last's
        assert s["memsets"] == steps - 1 and s["copies"] == 2 * (steps - 1), s
        assert s.get("frees_held", 0) >= steps - 1, s
        assert {"building the graph", "instantiating", "timing the graph", "restoring memory"} <= set(s["phases_s"]), s
    ratio = min(per_launch[16000]) / min(per_launch[2000])
    assert ratio <= RATIO, (ratio, per_launch, {n: s["phases_s"] for n, s in summaries.items()})


# --------------------------------------------------------------------------- CUPTI attribution
def _profiler(n_ops):
    from cudasnap.replay.profile.graphmode import GraphProfiler
    g = GraphProfiler(SimpleNamespace(repeat=3, warmup=1), lambda m: None)
    names = ["gemm", "gelu", "adam"]
    g.sequence.launches = [SimpleNamespace(name=names[i % 3]) for i in range(n_ops) if i % 8]
    it = iter(g.sequence.launches)
    g.sequence.ops = [("memset", "cuMemsetD32Async", [], i) if i % 8 == 0 else ("launch", next(it))
                      for i in range(n_ops)]
    return g


def _runs(g, runs=3):
    """CUPTI records of `runs` graph runs: one per captured operation (executable node ids are
    clones: 10**6 + the captured node id), a memset node reported as a kernel, and a driver
    kernel of no node after every 1000 nodes."""
    from cudasnap.replay.profile.graphunits import Rec
    out = []
    t = 0
    for _ in range(runs):
        run = []
        for k, op in enumerate(g.sequence.ops):
            t += 500
            name = op[1].name if op[0] == "launch" else "memset32_aligned1D"
            run.append(Rec(t, t + 300, name, "kernel", 1, 10 ** 6 + k))
            if k % 1000 == 999:
                run.append(Rec(t + 310, t + 320, "driver_internal", "kernel", 0, 0))
        out.append(run)
    created = {k: k for k in range(len(g.sequence.ops))}               # captured node id k: operation k
    clones = {10 ** 6 + k: k for k in range(len(g.sequence.ops))}
    return out, created, clones


def _attribution_time(n_ops, tracked):
    g = _profiler(n_ops)
    runs, created, clones = _runs(g)
    from cudasnap.replay.profile.graphmode import _no_gc
    with _no_gc():                  # as graph mode matches them
        t0 = time.perf_counter()
        g.nodes.per_node(g.sequence.ops, g.sequence.launches, runs, created if tracked else {}, clones if tracked else {})
        dt = time.perf_counter() - t0
    assert g.info["node_mapping"] == ("node creation and clone records" if tracked else "node ids in graph order")
    assert all(len(t) == 3 for t in g.nodes.node_times), "every launch timed in every run"
    assert [e["name"] for e in g.nodes.extra_records] == ["driver_internal"]
    return dt / n_ops


def test_cupti_attribution_time_per_node_does_not_grow_with_the_graph():
    for tracked in (True, False):
        small = min(_attribution_time(2000, tracked) for _ in range(3))
        big = min(_attribution_time(16000, tracked) for _ in range(3))
        assert big <= RATIO * small, (tracked, big, small)


# --------------------------------------------------------------------------- parameter scan
def test_ranges_for_looks_up_each_distinct_parameter_word_once():
    from cudasnap.replay.profile.common import ranges_for
    looked = []

    class Space:
        allocs = {}
        mappings = {}
        moved = False

        def find(self, v):
            if 0x200000000000 <= v < 0x200000000000 + 64 * 4096:
                base = v & ~0xFFF
                return SimpleNamespace(kind="placed", live_base=base, size=4096)
            return None

        def find_mapping(self, v):
            return None

        def held_ranges(self):
            return []

    def raw(name, v):
        looked.append(v)
        raise RuntimeError("CUDA_ERROR_NOT_FOUND")

    from cudasnap.replay.view import ReplayView
    rv = ReplayView(SimpleNamespace(ctx=SimpleNamespace(space=Space(), tr=lambda v: v, raw=raw)))
    # 20,000 launches of a loop: 64 tensors, sizes and strides repeat from step to step
    evs = [SimpleNamespace(rec_params=struct.pack("<QQQi", 0x200000000000 + (i % 64) * 4096, 1 << 20, 0x7777 + i % 5, 3))
           for i in range(20000)]
    ranges = ranges_for(rv, evs, limit=0)
    assert ranges == [(0x200000000000, 64 * 4096)]
    assert sorted(looked) == [1 << 20]          # the one word >= 0x10000 that no allocation holds, once


# --------------------------------------------------------------------------- the launch gate
class _BlockingDriver:
    """A driver whose cuGraphLaunch waits, as for queue space, until the stream is no longer held
    (the host word reached the value the stream waits for)."""

    def __init__(self):
        import ctypes
        self.buf = ctypes.create_string_buffer(8)
        self.calls = []
        self.waiting_for = 0

    def word(self):
        return struct.unpack_from("<I", self.buf.raw)[0]

    def call(self, name, *args):     # the ReplayView call LaunchGate makes
        self.calls.append(name)
        if name == "cuMemHostAlloc":
            import ctypes
            return ctypes.addressof(self.buf)
        if name == "cuMemHostGetDevicePointer":
            return 0xD000
        if name == "cuStreamWaitValue32":
            self.waiting_for = args[2]
        if name == "cuGraphLaunch":
            t_end = time.monotonic() + 10
            while self.word() < self.waiting_for:
                assert time.monotonic() < t_end, "the held stream was never released: deadlock"
                time.sleep(0.001)
        return None


def test_launch_gate_releases_a_launch_that_waits_for_its_held_stream():
    from cudasnap.replay.profile.common import LaunchGate
    d = _BlockingDriver()
    gate = LaunchGate.open(d, "S")
    assert gate is not None and gate.ok
    t0 = time.monotonic()
    LaunchGate.launch_timed(d, gate, "G", "S", "e0", "e1")     # blocks until the gate's timer releases it
    assert time.monotonic() - t0 < 5
    assert not gate.ok and gate.released_late == 1
    d.calls.clear()
    LaunchGate.launch_timed(d, gate, "G", "S", "e0", "e1")     # off from then on: ungated, no wait
    assert d.calls == ["cuEventRecord", "cuGraphLaunch", "cuEventRecord"]
    gate.close()
    assert d.calls[-1] == "cuMemFreeHost"


# --------------------------------------------------------------------------- the timeline check: one replay
ONE_REPLAY = '''
import json, subprocess, sys
from cudasnap.replay import engine
from cudasnap.replay.options import ReplayOptions
from cudasnap.replay.profile import ProfileConfig, profile_replay
import cudasnap.replay.profile.timeline as tl

snap, fake_cupti, check = sys.argv[1], sys.argv[2] == "cupti", json.loads(sys.argv[3])
replays, children = [], []
real_run, real_sub = engine.Replayer.run, subprocess.run


def counted(self):
    replays.append(str(self.path))
    return real_run(self)


def child(argv, *a, **k):
    children.append([str(x) for x in argv])
    return real_sub(argv, *a, **k)


engine.Replayer.run = counted
subprocess.run = child


class FakeCupti:
    """CUPTI as timeline mode sees it on the executor's launches: one kernel record per launch,
    in issue order, no external correlation records; each 20 us."""
    def __init__(self):
        self.kernels, self.copies, self.ext, self.kernel_nodes, self.copy_nodes = [], [], {}, [], []
        self.now = 0
        self.closed = False
    def push(self, e): pass
    def pop(self): pass
    def flush(self):
        if not self.kernels:
            n = int(sys.argv[4])
            self.kernels = [(i + 1, 100000 * i, 100000 * i + 20000, "incr", 7) for i in range(n)]
            self.kernel_nodes = [(0, 0)] * n
    def close(self):
        self.flush()
        self.closed = True
    def timestamp(self):
        self.now += 1
        return self.now


fakes = []
if fake_cupti:              # its records time no graph node: graph mode's own node times take event nodes
    tl.open_cupti = lambda backend, warn: fakes.append(FakeCupti()) or fakes[-1]
run = profile_replay(snap, ProfileConfig(mode="graph", repeat=3, warmup=1, timeline_check=check), ReplayOptions(quiet=True))
print(json.dumps({"exit": run.result.exit_code, "errors": run.result.errors, "native_calls": run.result.native_calls,
                  "replays": replays, "children": children, "summary": run.report["summary"],
                  "launches": run.report["launches"], "fakes_closed": [f.closed for f in fakes]}, default=str))
'''


def _one_replay(double, tmp_path, snap, cupti: bool, check, launches: int = 0):
    p = tmp_path / "one_replay.py"
    p.write_text(ONE_REPLAY)
    env = dict(double["env"])
    env.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    import subprocess
    import sys
    cp = subprocess.run([sys.executable, str(p), str(snap), "cupti" if cupti else "none", json.dumps(check),
                         str(launches)], env=env, capture_output=True, text=True, timeout=300)
    assert cp.stdout.strip(), cp.stderr[-3000:]
    return json.loads(cp.stdout.strip().splitlines()[-1])


def test_timeline_check_takes_its_reference_from_the_same_replay(double, tmp_path):
    """--timeline-check on the double (CUDA events): one Replayer.run, no child process, no phase of a
    second replay; the check compares the 2 ms spin (graph: event nodes; reference: CUDA events
    around each launch of the same replay) and is reported."""
    from test_graph_profile import two_kernel_program
    from cudasnap.replay.profile.graphcheck import REFERENCE
    from cudasnap.replay.profile.graphmode import REFERENCE_PHASE
    snap = tmp_path / "two.cusnap"
    two_kernel_program(snap, spin_ms=2, rounds=2)
    r = _one_replay(double, tmp_path, snap, cupti=False, check=True)
    assert r["exit"] == 0, r["errors"]
    assert r["replays"] == [str(snap)], r["replays"]                 # the graph's replay, no other
    assert not [c for c in r["children"] if "replay" in c], r["children"]
    s = r["summary"]
    t = s["timeline_check"]
    assert t["reference"] == REFERENCE and t["timeline_backend"] == "events"
    assert t["reference_launches"] == 4 and t["compared"] == 1, t   # every launch of the sequence; the spin
    assert REFERENCE_PHASE in s["phases_s"] and "checking against a timeline replay" not in s["phases_s"]
    # off: no reference, no check
    r = _one_replay(double, tmp_path, snap, cupti=False, check=False)
    assert r["exit"] == 0 and "timeline_check" not in r["summary"] and REFERENCE_PHASE not in r["summary"]["phases_s"]
    assert r["replays"] == [str(snap)] and not r["children"]


def test_graph_mode_runs_the_sequence_in_the_executor_with_a_cupti_reference(double, tmp_path):
    """Every launch selected and CUPTI for the reference: the replay up to the sequence runs in
    the C executor (as timeline mode's does), the sequence is recorded from its batches (memsets,
    copies and launches of a training loop), the memory the first launch saw is restored before
    every run (the replay verifies after the runs), and the reference's kernel records, matched
    in issue order, time every launch of the sequence.  One replay, the collector closed."""
    bench = _bench()
    snap = tmp_path / "loop.cusnap"
    facts = bench.loop_program(snap, 2000)
    r = _one_replay(double, tmp_path, snap, cupti=True, check=True, launches=2000)
    assert r["exit"] == 0, r["errors"]
    assert r["native_calls"] > 2000, r["native_calls"]                     # the executor ran the launches
    assert r["replays"] == [str(snap)] and not r["children"]
    assert r["fakes_closed"] and all(r["fakes_closed"])               # the reference's (and node timing's)
    s = r["summary"]
    assert "error" not in s, s
    steps = facts["steps"]
    assert s["launches"] == s["launches_timed"] == 2000, s
    assert s["memsets"] == steps - 1 and s["copies"] == 2 * (steps - 1), s
    assert s["pre_state_restored"] is True and s.get("prelude_ops") == 1, s    # the first step's memset
    assert [x["index"] for x in r["launches"]] == list(range(2000))
    t = s["timeline_check"]
    assert t["timeline_backend"] == "cupti" and t["reference_launches"] == 2000, t
    assert t["compared"] == 0 and t["within"] is None, t           # incr on the double: under 5 us in the graph


def test_steady_graph_times():
    from cudasnap.replay.profile.graphmode import steady
    assert steady([1000.0, 1004.0, 1002.0, 1009.0, 1001.0])
    assert steady([1000.0, 1004.0, 1002.0, 1040.0, 1001.0])        # one slow run among steady ones
    assert not steady([1000.0, 1020.0, 985.0, 1011.0, 990.0])       # noise of about 1.5%
    assert not steady([1000.0]) and not steady([0.0, 0.0])
