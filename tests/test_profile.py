"""Profiling on replay and replay hooks, on the CUDA test double (kernels run as host functions,
synchronously; CUDA events carry host clock times)."""
from __future__ import annotations

import csv
import json
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cudasnap.formats import SnapshotReader
from synth import Synth

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "hooks"


def _replay(double, snap, *args, timeout=120, env_extra=None):
    env = dict(double["env"])
    env.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snap), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def _launches(snap):
    return [c for c in SnapshotReader(snap).records() if c["k"] == "c" and c["f"].startswith("cuLaunch")]


RECORDER_HOOK = textwrap.dedent('''
    import json
    class Recorder:
        def __init__(self, out, fail=""):
            self.f = open(out, "w")
            self.fail = fail.split(",") if fail else []
        def _w(self, kind, **kw):
            self.f.write(json.dumps({"kind": kind, **kw}) + "\\n"); self.f.flush()
        def before_launch(self, ev):
            self._w("before_launch", seq=ev.seq, index=ev.index, name=ev.name, grid=ev.grid, block=ev.block,
                    shmem=ev.shmem, stream=ev.rec_stream, params=ev.params.hex(), layout=ev.layout,
                    values=[v.hex() for v in ev.param_values()], ptrs=ev.pointer_params(), module=ev.module)
            if "before_launch" in self.fail:
                raise RuntimeError("boom before")
        def after_launch(self, ev):
            first = ev.pointer_params()[0][1] if ev.pointer_params() else None
            head = ev.ctx.read_device(first, 16).hex() if first else None
            self._w("after_launch", seq=ev.seq, head=head)
            if "after_launch" in self.fail:
                raise ValueError("boom after")
        def copy(self, ev):
            self._w("copy", seq=ev.seq, direction=ev.direction, nbytes=ev.nbytes)
        def sync(self, ev):
            self._w("sync", seq=ev.seq, call=ev.call)
        def before_graph_launch(self, ev):
            self._w("before_graph_launch", seq=ev.seq)
        def graph_launch(self, ev):
            self._w("graph_launch", seq=ev.seq)
        def end(self, ev):
            self._w("end", exit=ev.result.exit_code)
''')


@pytest.fixture
def recorder(tmp_path):
    p = tmp_path / "rechook.py"
    p.write_text(RECORDER_HOOK)
    return p


def _events(path):
    return [json.loads(l) for l in Path(path).read_text().splitlines()]


def incr_program(path, n=16, launches=3, stream=0):
    """A synthetic session: D = zeros(n) int32; incr(D, n) `launches` times; D2H expects `launches`."""
    s = Synth(path)
    ctx, mod, f_incr = 0x55550000, 0x55560000, 0x55570005
    D = 0x200000000000
    s.double_prologue("incr", f_incr, [[0, 8], [8, 4]], ctx, mod)
    s.call("cuMemAlloc_v2", {"dptr": D, "bytesize": n * 4})
    s.call("cuMemcpyHtoD_v2", {"dstDevice": D, "srcHost": 0x7F0000100000, "ByteCount": n * 4},
           x={"srcHost": s.blob(bytes(n * 4))})
    seqs = [s.launch(f_incr, struct.pack("<Qi", D, n), block=n, stream=stream)["s"] for _ in range(launches)]
    s.expect_d2h(D, [launches] * n)
    s.double_epilogue(frees=[D])
    return {"D": D, "n": n, "seqs": seqs}


# --------------------------------------------------------------------------- hooks
def test_hooks_see_every_launch_with_decoded_params(double, capture, recorder, tmp_path):
    cp, snap = capture(double["progs"]["direct"], "7")
    assert cp.returncode == 0, cp.stderr
    out = tmp_path / "events.jsonl"
    rp = _replay(double, snap, "--hook", f"{recorder}:Recorder?out={out}")
    assert rp.returncode == 0, rp.stdout + rp.stderr
    evs = _events(out)
    rec = _launches(snap)
    before = [e for e in evs if e["kind"] == "before_launch"]
    after = [e for e in evs if e["kind"] == "after_launch"]
    assert [e["seq"] for e in before] == [c["s"] for c in rec] == [e["seq"] for e in after]
    assert len(before) == 7
    alloc = [c for c in SnapshotReader(snap).records() if c["k"] == "c" and c["f"].startswith("cuMemAlloc")][0]
    d = alloc["a"]["dptr"]
    for i, (e, c) in enumerate(zip(before, rec)):
        assert e["name"] == "add_one" and e["index"] == i
        assert e["grid"] == [4, 1, 1] and e["block"] == [256, 1, 1] and e["shmem"] == 0
        assert e["layout"] == [[0, 8], [8, 4]]
        assert bytes.fromhex(e["params"]) == bytes(c["x"]["params"])
        assert int.from_bytes(bytes.fromhex(e["values"][0]), "little") == d
        assert int.from_bytes(bytes.fromhex(e["values"][1]), "little") == 1024
        assert e["ptrs"] == [[0, d]]
        assert e["module"] is not None
    # the hook reads device memory after each launch: element 1 was 1.0, +1 per launch
    for k, e in enumerate(after):
        assert struct.unpack("<4f", bytes.fromhex(e["head"]))[1] == 1.0 + k + 1
    kinds = [e["kind"] for e in evs]
    assert [e["direction"] for e in evs if e["kind"] == "copy"] == ["HtoD", "DtoH"]
    assert "sync" in kinds and kinds[-1] == "end" and kinds.count("end") == 1


def test_hook_exceptions_fail_open(double, capture, recorder, tmp_path):
    cp, snap = capture(double["progs"]["direct"], "5")
    assert cp.returncode == 0
    out = tmp_path / "events.jsonl"
    rp = _replay(double, snap, "--hook", f"{recorder}:Recorder?out={out}&fail=before_launch,after_launch", "--json")
    assert rp.returncode == 0, rp.stdout + rp.stderr
    res = json.loads(rp.stdout)
    assert res["launches"] == 5 and res["d2h_verified"] >= 1 and not res["mismatches"]
    assert "raised RuntimeError: boom before" in rp.stderr and "raised ValueError: boom after" in rp.stderr
    assert any("boom before" in w for w in res["warnings"])
    evs = _events(out)
    assert sum(e["kind"] == "before_launch" for e in evs) == 5     # every launch still reached the hook
    assert evs[-1]["kind"] == "end"


def test_bad_hook_spec_is_one_line_error(double, tmp_path):
    from synth import write_double_program
    p = tmp_path / "syn.cusnap"
    write_double_program(p)
    rp = _replay(double, p, "--hook", "no_such_module_xyz:Hook")
    assert rp.returncode == 2
    assert "cannot import no_such_module_xyz" in rp.stderr and "Traceback" not in rp.stderr


def test_example_hooks(double, capture, tmp_path):
    cp, snap = capture(double["progs"]["direct"], "4")
    assert cp.returncode == 0
    dumps = tmp_path / "dumps"
    rp = _replay(double, snap, "--hook", f"{EXAMPLES / 'bandwidth.py'}:Bandwidth",
                 "--hook", f"{EXAMPLES / 'dump_buffers.py'}:DumpBuffers?kernel=add_one&out={dumps}")
    assert rp.returncode == 0, rp.stdout + rp.stderr
    assert re.search(r"add_one\s+4\s+0\.02", rp.stdout), rp.stdout       # 1024 floats in, out: 2 x 4 KiB... per launch
    idx = [json.loads(l) for l in (dumps / "index.jsonl").read_text().splitlines()]
    assert len(idx) == 4 and all(r["bytes"] == 4096 for r in idx)
    first = struct.unpack("<4f", (dumps / idx[0]["file"]).read_bytes()[:16])
    assert first == (1.0, 2.0, 3.0, 4.0)
    # compare against itself from a changed run: the first differing launch is named
    dumps2 = tmp_path / "dumps2"
    rp = _replay(double, snap, "--hook",
                 f"{EXAMPLES / 'dump_buffers.py'}:DumpBuffers?kernel=add_one&out={dumps2}&compare={dumps}")
    assert rp.returncode == 0 and "0 buffer(s) differ" in rp.stderr, rp.stderr
    rows = [json.loads(l) for l in (dumps / "index.jsonl").read_text().splitlines()]
    rows[2]["sha256"] = "0" * 64
    (dumps / "index.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rp = _replay(double, snap, "--hook",
                 f"{EXAMPLES / 'dump_buffers.py'}:DumpBuffers?kernel=add_one&dump=0&compare={dumps}")
    assert f"first difference: call #{rows[2]['seq']} add_one parameter 0" in rp.stderr, rp.stderr


import re  # noqa: E402


# --------------------------------------------------------------------------- modes
def test_isolated_restores_memory_between_repeats(double, recorder, tmp_path):
    snap = tmp_path / "incr.cusnap"
    facts = incr_program(snap, launches=3)
    out = tmp_path / "prof.json"
    evf = tmp_path / "events.jsonl"
    rp = _replay(double, snap, "--profile", "isolated", "--repeat", "5", "--warmup", "1", "--check-repeats",
                 "--out", str(out), "--hook", f"{recorder}:Recorder?out={evf}")
    # the D2H after the launches expects exactly 3 increments: every repeat started from restored memory
    assert rp.returncode == 0, rp.stdout + rp.stderr
    rep = json.loads(out.read_text())
    rows = rep["launches"]
    assert [r["seq"] for r in rows] == facts["seqs"]
    for r in rows:
        assert len(r["times_us"]) == 5 and r["repeats_identical"] is True
        assert r["min_us"] <= r["median_us"] <= r["max_us"] and "spread_pct" in r
        assert r["saved_bytes"] >= facts["n"] * 4
    # hooks see each launch's own result (1, 2, 3), not the repeats'
    heads = [struct.unpack("<4i", bytes.fromhex(e["head"])) for e in _events(evf) if e["kind"] == "after_launch"]
    assert heads == [(1,) * 4, (2,) * 4, (3,) * 4]
    k = rep["kernels"]
    assert len(k) == 1 and k[0]["name"] == "incr" and k[0]["launches"] == 3 and k[0]["share_pct"] == 100.0
    assert "spread" in rp.stdout and "incr" in rp.stdout


def vmm_incr_program(path, n=16, launches=3):
    """incr on memory the program maps itself (cuMemAddressReserve/Create/Map, as PyTorch's
    expandable segments do); the D2H expects `launches`."""
    s = Synth(path)
    ctx, mod, f_incr = 0x55550000, 0x55560000, 0x55570005
    V, H, size = 0x300000000000, 0xC0000, 2 << 20
    s.double_prologue("incr", f_incr, [[0, 8], [8, 4]], ctx, mod)
    s.call("cuMemAlloc_v2", {"dptr": 0x200000000000, "bytesize": 4096})     # an ordinary allocation beside it
    s.call("cuMemAddressReserve", {"ptr": V, "size": size, "alignment": 0, "addr": V, "flags": 0})
    s.call("cuMemCreate", {"handle": H, "size": size, "prop": None, "flags": 0})
    s.call("cuMemMap", {"ptr": V, "size": size, "offset": 0, "handle": H, "flags": 0})
    s.call("cuMemSetAccess", {"ptr": V, "size": size, "desc": None, "count": 1})
    s.call("cuMemsetD32_v2", {"dstDevice": V, "ui": 0, "N": n})
    seqs = [s.launch(f_incr, struct.pack("<Qi", V, n), block=n)["s"] for _ in range(launches)]
    s.expect_d2h(V, [launches] * n)
    s.call("cuMemUnmap", {"ptr": V, "size": size})
    s.call("cuMemRelease", {"handle": H})
    s.call("cuMemAddressFree", {"ptr": V, "size": size})
    s.double_epilogue()
    return {"seqs": seqs}


def test_isolated_restores_memory_the_program_maps_itself(double, tmp_path):
    snap = tmp_path / "vmm.cusnap"
    facts = vmm_incr_program(snap)
    out = tmp_path / "prof.json"
    rp = _replay(double, snap, "--profile", "isolated", "--repeat", "4", "--warmup", "1", "--check-repeats",
                 "--out", str(out))
    # the D2H expects 3: every repeat started from the mapping's saved contents
    assert rp.returncode == 0, rp.stdout + rp.stderr
    rows = json.loads(out.read_text())["launches"]
    assert [r["seq"] for r in rows] == facts["seqs"]
    assert all(r["repeats_identical"] is True and r["saved_bytes"] >= 2 << 20 for r in rows), rows


def test_isolated_flush_l2_and_launch_selection(double, tmp_path):
    snap = tmp_path / "incr.cusnap"
    facts = incr_program(snap, launches=3)
    out = tmp_path / "prof.json"
    rp = _replay(double, snap, "--profile", "isolated", "--flush-l2", "--repeat", "3",
                 "--launch", str(facts["seqs"][1]), "--out", str(out))
    assert rp.returncode == 0, rp.stdout + rp.stderr
    rows = json.loads(out.read_text())["launches"]
    assert [r["seq"] for r in rows] == [facts["seqs"][1]]


def test_timeline_trace_one_slice_per_launch(double, capture, tmp_path):
    cp, snap = capture(double["progs"]["direct"], "6")
    assert cp.returncode == 0
    trace, out = tmp_path / "trace.json", tmp_path / "prof.csv"
    rp = _replay(double, snap, "--profile", "timeline", "--trace", str(trace), "--out", str(out))
    assert rp.returncode == 0, rp.stdout + rp.stderr
    assert "CUDA events" in rp.stdout          # no CUPTI on the double: the fallback is announced
    data = json.loads(trace.read_text())
    evs = data["traceEvents"]
    kern = [e for e in evs if e.get("ph") == "X" and e["cat"] == "kernel"]
    assert len(kern) == len(_launches(snap)) == 6
    assert all(e["name"] == "add_one" and e["dur"] >= 0 and e["ts"] >= 0 for e in kern)
    assert [e["args"]["seq"] for e in kern] == [c["s"] for c in _launches(snap)]
    assert sorted(e["ts"] for e in kern) == [e["ts"] for e in kern]
    copies = [e for e in evs if e.get("ph") == "X" and e["cat"] == "gpu_memcpy"]
    assert [e["name"] for e in copies] == ["Memcpy HtoD", "Memcpy DtoH"]
    names = {e["args"]["name"] for e in evs if e.get("ph") == "M" and e["name"] == "thread_name"}
    assert "stream 1 (default stream)" in names
    rows = list(csv.DictReader(out.open()))
    assert sum(r["row_type"] == "launch" for r in rows) == 6
    k = [r for r in rows if r["row_type"] == "kernel"]
    assert len(k) == 1 and k[0]["name"] == "add_one" and k[0]["launches"] == "6"
    assert float(k[0]["median_us"]) > 0


def test_timeline_kernel_filter_profiles_but_runs_everything(double, tmp_path):
    from synth import write_double_program
    p = tmp_path / "syn.cusnap"
    write_double_program(p)
    out = tmp_path / "prof.json"
    rp = _replay(double, p, "--profile", "timeline", "--kernels", "^chase$", "--out", str(out), "--json")
    assert rp.returncode == 0, rp.stdout + rp.stderr        # add_one still ran: every D2H verifies
    res = json.loads(rp.stdout)
    assert res["launches"] == 2 and res["filtered"] == 0
    assert [k["name"] for k in res["profile"]["kernels"]] == ["chase"]
    assert [k["name"] for k in json.loads(out.read_text())["kernels"]] == ["chase"]


def test_graph_mode(double, capture, tmp_path):
    cp, snap = capture(double["progs"]["direct"], "8")
    assert cp.returncode == 0
    out = tmp_path / "prof.json"
    rp = _replay(double, snap, "--profile", "graph", "--repeat", "4", "--out", str(out))
    assert rp.returncode == 0, rp.stdout + rp.stderr     # memory restored after the graph runs
    s = json.loads(out.read_text())["summary"]
    assert s["mode"] == "graph" and s["nodes"] == 8 and "error" not in s
    assert len(s["graph_times_us"]) == 4 and s["total_us"] > 0
    assert "graph of 8 launches" in rp.stdout


def test_graph_mode_incr_memory_restored(double, tmp_path):
    snap = tmp_path / "incr.cusnap"
    incr_program(snap, launches=4)
    out = tmp_path / "prof.json"
    rp = _replay(double, snap, "--profile", "graph", "--repeat", "3", "--out", str(out))
    assert rp.returncode == 0, rp.stdout + rp.stderr      # the D2H after still sees exactly 4 increments
    assert json.loads(out.read_text())["summary"]["nodes"] == 4


def test_profile_option_errors(double, tmp_path):
    snap = tmp_path / "incr.cusnap"
    incr_program(snap)
    for args, msg in ((["--profile", "bogus"], "is not one of"),
                      (["--profile", "isolated", "--trace", "t.json"], "--trace needs --profile timeline"),
                      (["--profile", "timeline", "--out", "x.txt"], ".json or .csv"),
                      (["--profile", "timeline", "--kernels", "("], "bad regex")):
        rp = _replay(double, snap, *args)
        assert rp.returncode == 2 and msg in rp.stderr, (args, rp.stderr)


def test_nvtx_flag_replays(double, tmp_path):
    snap = tmp_path / "incr.cusnap"
    incr_program(snap)
    rp = _replay(double, snap, "--nvtx")
    assert rp.returncode == 0, rp.stdout + rp.stderr


# --------------------------------------------------------------------------- units
def test_load_hook_specs(tmp_path):
    from cudasnap.replay.hooks import HookError, load_hook
    p = tmp_path / "h.py"
    p.write_text("class H:\n    def __init__(self, a='1'):\n        self.a = a\n    def end(self, ev): pass\n"
                 "inst = H('x')\n")
    assert load_hook(f"{p}:H?a=7").a == "7"
    assert load_hook(f"{p}:inst").a == "x"
    with pytest.raises(HookError, match="has no Nope"):
        load_hook(f"{p}:Nope")
    with pytest.raises(HookError, match="MODULE:OBJECT"):
        load_hook("justaname")
    with pytest.raises(HookError, match="failed"):
        load_hook(f"{p}:H?b=1")


def test_hook_adapter_and_engine_emit_fail_open():
    from cudasnap.replay.engine import Replayer
    from cudasnap.replay.hooks import HookAdapter

    class Bad:
        def sync(self, ev):
            raise KeyError("x")

    warned = []
    import io
    a = HookAdapter(Bad(), warned.append, stream=io.StringIO())
    for _ in range(5):
        a.on_event("sync", type("E", (), {"seq": 3})())
    assert len(warned) == 3 and "call #3" in warned[0] and "KeyError" in warned[0]

    class BadSub:
        def on_event(self, kind, ev):
            raise RuntimeError("sub")

    rp = Replayer("/nonexistent.cusnap")
    rp.subscribers.append(BadSub())
    rp.emit("sync", type("E", (), {"seq": 9})())
    assert any("raised RuntimeError: sub" in w for w in rp.ctx.res.warnings)


def test_nvtx_emitter_balances_ranges():
    from cudasnap.replay.profile.nvtx import NvtxEmitter

    class Fake:
        def __init__(self):
            self.log = []

        def push(self, m):
            self.log.append(("push", m))

        def pop(self):
            self.log.append(("pop",))

    f = Fake()
    e = NvtxEmitter(impl=f)
    C = type("C", (), {})
    c = C(); c.call, c.seq = "cuLaunchKernel", 5
    l = C(); l.name = "saxpy"
    e.on_event("before_call", c)
    e.on_event("before_launch", l)
    e.on_event("after_launch", l)
    e.on_event("after_call", c)
    c2 = C(); c2.call, c2.seq = "cuMemcpyHtoD_v2", 6
    e.on_event("before_call", c2)            # its handler failed: no after_call
    e.on_event("before_call", c)
    e.on_event("end", None)
    pushes = sum(x[0] == "push" for x in f.log)
    assert pushes == sum(x[0] == "pop" for x in f.log) == 4
    assert f.log[:4] == [("push", "cuLaunchKernel #5"), ("push", "saxpy"), ("pop",), ("pop",)]


def test_report_aggregate_and_trace_units():
    from cudasnap.replay.profile.report import aggregate
    from cudasnap.replay.profile.trace import trace_events
    rows = [{"name": "a", "time_us": 10.0}, {"name": "a", "time_us": 30.0}, {"name": "b", "time_us": 60.0},
            {"name": "c"}]
    k = {r["name"]: r for r in aggregate(rows)}
    assert k["a"]["total_us"] == 40 and k["a"]["median_us"] == 20 and k["a"]["launches"] == 2
    assert k["b"]["share_pct"] == 60.0 and k["c"]["timed"] == 0
    assert [r["name"] for r in aggregate(rows)][:2] == ["b", "a"]
    t = trace_events([{"kind": "kernel", "name": "k", "seq": 1, "stream": 0x99, "start_ns": 5000, "end_ns": 7000},
                      {"kind": "copy", "name": "HtoD 4 B", "seq": 2, "stream": 0, "start_ns": 1000, "end_ns": 2000},
                      {"kind": "kernel", "name": "untimed", "seq": 3, "stream": 0}])
    xs = [e for e in t["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == 2 and xs[0]["ts"] == 4.0 and xs[0]["dur"] == 2.0
    json.dumps(t)


# --------------------------------------------------------------------------- graph capture (graph mode once hung here)
def incr_memset_program(path, n=16, stream=0x5000):
    """incr x2 on a created stream, memsetD32Async(D, 0), incr x2 on the NULL stream, HtoD of 10s,
    incr x1: the D2H expects 11.  The graph must hold the memset and the HtoD to reproduce it."""
    s = Synth(path)
    ctx, mod, f_incr = 0x55550000, 0x55560000, 0x55570005
    D = 0x200000000000
    s.double_prologue("incr", f_incr, [[0, 8], [8, 4]], ctx, mod)
    s.call("cuStreamCreate", {"phStream": stream, "Flags": 0})
    s.call("cuMemAlloc_v2", {"dptr": D, "bytesize": n * 4})
    s.call("cuMemcpyHtoD_v2", {"dstDevice": D, "srcHost": 0x7F0000100000, "ByteCount": n * 4},
           x={"srcHost": s.blob(bytes(n * 4))})
    p = struct.pack("<Qi", D, n)
    seqs = [s.launch(f_incr, p, block=n, stream=stream)["s"] for _ in range(2)]
    s.call("cuMemsetD32Async", {"dstDevice": D, "ui": 0, "N": n, "hStream": stream})
    seqs += [s.launch(f_incr, p, block=n, stream=0)["s"] for _ in range(2)]
    s.call("cuMemcpyHtoD_v2", {"dstDevice": D, "srcHost": 0x7F0000100000, "ByteCount": n * 4},
           x={"srcHost": s.blob(struct.pack(f"<{n}i", *([10] * n)))})
    seqs.append(s.launch(f_incr, p, block=n, stream=stream)["s"])
    s.expect_d2h(D, [11] * n)
    s.double_epilogue(frees=[D])
    return {"D": D, "n": n, "seqs": seqs}


def test_graph_mode_starts_every_run_from_pre_sequence_memory(double, tmp_path):
    snap = tmp_path / "incr.cusnap"
    incr_program(snap, launches=4)              # NULL-stream launches: captured on a stream of our own
    out = tmp_path / "prof.json"
    rp = _replay(double, snap, "--profile", "graph", "--repeat", "3", "--warmup", "1", "--check-repeats",
                 "--out", str(out))
    assert rp.returncode == 0, rp.stdout + rp.stderr
    s = json.loads(out.read_text())["summary"]
    assert "error" not in s, s
    assert s["launches"] == 4 and s["nodes"] == 4 and s["pre_state_restored"] is True
    # every run: 0 -> 4, as the replay did (without the restore the runs would leave 8, 12, ...)
    assert s["repeats_identical"] is True and s["graph_matches_replay"] is True
    assert len(s["graph_times_us"]) == 3


def test_graph_mode_captures_memsets_and_copies_between_launches(double, tmp_path):
    snap = tmp_path / "incr_ms.cusnap"
    facts = incr_memset_program(snap)
    out = tmp_path / "prof.json"
    rp = _replay(double, snap, "--profile", "graph", "--repeat", "2", "--check-repeats", "--out", str(out))
    assert rp.returncode == 0, rp.stdout + rp.stderr     # the D2H after the graph runs still sees 11
    rep = json.loads(out.read_text())
    s = rep["summary"]
    assert "error" not in s, s
    assert s["launches"] == 5 and s["memsets"] == 1 and s["copies"] == 1 and s["nodes"] == 7
    assert s["first_seq"] == facts["seqs"][0] and s["last_seq"] == facts["seqs"][-1]
    assert s["graph_matches_replay"] is True and s["repeats_identical"] is True
    assert [r["seq"] for r in rep["launches"]] == facts["seqs"]
    assert "graph of 5 launches (+2 copies/memsets)" in rp.stdout


def test_graph_mode_selection_keeps_memsets_in_span(double, tmp_path):
    snap = tmp_path / "incr_ms.cusnap"
    facts = incr_memset_program(snap)
    out = tmp_path / "prof.json"
    rp = _replay(double, snap, "--profile", "graph", "--calls", f"{facts['seqs'][1]}-{facts['seqs'][3]}",
                 "--out", str(out))
    assert rp.returncode == 0, rp.stdout + rp.stderr
    s = json.loads(out.read_text())["summary"]
    assert s["launches"] == 3 and s["memsets"] == 1 and s["copies"] == 0 and "error" not in s


def test_graph_mode_skips_launches_inside_recorded_captures(double, capture, tmp_path):
    cp, snap = capture(double["progs"]["launch_forms"])
    assert cp.returncode == 0, cp.stderr
    out = tmp_path / "prof.json"
    rp = _replay(double, snap, "--profile", "graph", "--repeat", "2", "--out", str(out))
    assert rp.returncode == 0, rp.stdout + rp.stderr
    rep = json.loads(out.read_text())
    s = rep["summary"]
    assert "error" not in s, s
    recs = [c for c in SnapshotReader(snap).records() if c["k"] == "c"]
    launches = [c for c in recs if c["f"].startswith("cuLaunch")]
    assert s["skipped_captured_launches"] == 1
    assert s["launches"] == len(launches) - 1 == len(rep["launches"])
    assert s["skipped_ops"] == {"cuGraphLaunch": 2}
    assert any("not captured" in w and "cuGraphLaunch x2" in w for w in rep["warnings"])


WRAPPED = textwrap.dedent('''
    import json, sys
    from cuda.bindings import driver as cu
    from cudasnap.replay.options import ReplayOptions
    from cudasnap.replay.profile import ProfileConfig, profile_replay
    import cudasnap.replay.profile.timeline as tl
    import cudasnap.replay.profile.graphmode as gm

    snap, mode, behaviour = sys.argv[1], sys.argv[2], sys.argv[3]
    log = []

    class FakeCupti:
        """CUPTI stand-in, as real CUPTI behaves with only kernel/memcpy/memset/external-correlation
        kinds enabled: a kernel record for every kernel that runs (the replay's own launches,
        warmups and timed runs alike), no external correlation records (those need API records),
        records delivered only by a flush; timestamps on the records' clock."""
        def __init__(self, silent=False, ext=False, nodes=False):
            self.kernels, self.copies, self.ext, self.stack, self.corr = [], [], {}, [], 0
            self.nodes, self.kernel_nodes, self.pending_nodes = nodes, [], []
            self.now, self.pending, self.silent, self.with_ext, self.flushes = 1000, [], silent, ext, 0
        def push(self, e): self.stack.append(e)
        def pop(self): self.stack.pop()
        def flush(self):
            self.flushes += 1
            self.kernels += self.pending
            self.kernel_nodes += self.pending_nodes
            self.pending, self.pending_nodes = [], []
        def close(self): self.flush()
        def timestamp(self):
            self.now += 1000
            return self.now
        def record(self, n=1, name="incr_cupti", graph=0):
            """n kernel records; with `nodes`, a graph's records carry (graph id, node id) and
            share the cuGraphLaunch call's correlation id, as CUPTI's do."""
            if self.silent:
                return
            if graph:
                self.corr += 1
            for i in range(n):
                if not graph:
                    self.corr += 1
                if self.with_ext and self.stack:
                    self.ext[self.corr] = self.stack[-1]
                start = self.now + 10000
                self.pending.append((self.corr, start, start + 50000, name, 7))
                self.pending_nodes.append((graph, 500 + i) if graph and self.nodes else (0, 0))
                self.now = start + 50000

    fake = (FakeCupti(silent=behaviour == "cupti_silent", nodes=behaviour == "cupti_nodes")
            if behaviour.startswith("cupti") else None)
    if fake is not None:
        tl.open_cupti = gm.open_cupti = lambda backend, warn: fake

    class W:
        def __init__(self):
            self.capturing = False
            self.ours = None
            self.nodes = 0
            self.graph_runs, self.hung = 0, False
        def __getattr__(self, name):
            fn = getattr(cu, name)
            def call(*a):
                log.append(name)
                if name == "cuStreamBeginCapture":
                    if behaviour == "begin_fails":
                        return (cu.CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,)
                    self.capturing, self.ours = True, a[0]
                if name == "cuStreamEndCapture":
                    self.capturing = False
                if name == "cuLaunchKernel" and self.capturing and behaviour == "launch_fails":
                    return (cu.CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,)
                if name in ("cuCtxSynchronize", "cuStreamSynchronize", "cuStreamQuery", "cuEventSynchronize") \\
                        and self.capturing:
                    raise AssertionError(name + " while capturing")
                if name == "cuStreamQuery" and (behaviour == "hang" or self.hung) and self.ours is not None \\
                        and int(a[0]) == int(self.ours):
                    return (cu.CUresult.CUDA_ERROR_NOT_READY,)
                if name == "cuGraphLaunch" and behaviour == "cupti_hang":
                    self.graph_runs += 1
                    if self.graph_runs == 8:     # 2 warmups, 4 timed, CUPTI run 1: run 2 stops at its 2nd kernel
                        fake.record(1, "incr_graph", graph=int(a[0]) & 0xffff or 1)
                        self.hung = True
                        return (cu.CUresult.CUDA_SUCCESS,)
                if name == "cuLaunchKernel" and self.capturing:
                    self.nodes += 1
                r = fn(*a)
                if name == "cuLaunchKernel" and fake is not None and not self.capturing:
                    fake.record()
                if name == "cuGraphLaunch" and fake is not None:
                    fake.record(self.nodes, "incr_graph", graph=int(a[0]) & 0xffff or 1)
                return r
            return call

    extra = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    cfg = ProfileConfig(mode=mode, repeat=4, warmup=2, **extra)
    run = profile_replay(snap, cfg, ReplayOptions(quiet=True, watchdog=2.0), driver=W())
    print(json.dumps({"exit": run.result.exit_code, "errors": run.result.errors, "report": run.report, "log": log},
                     default=str))
''')


def _wrapped(double, tmp_path, snap, mode, behaviour, **cfg):
    p = tmp_path / "wrapped.py"
    p.write_text(WRAPPED)
    env = dict(double["env"])
    env.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    cp = subprocess.run([sys.executable, str(p), str(snap), mode, behaviour, json.dumps(cfg)], env=env, capture_output=True,
                        text=True, timeout=120)
    assert cp.stdout.strip(), cp.stderr
    return json.loads(cp.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("behaviour", ["begin_fails", "launch_fails"])
def test_graph_capture_failure_is_reported_and_replay_goes_on(double, tmp_path, behaviour):
    snap = tmp_path / "incr.cusnap"
    incr_program(snap, launches=3)
    r = _wrapped(double, tmp_path, snap, "graph", behaviour)
    # the replay goes on and its D2H still verifies (memory put back), but no profile was taken:
    # exit 2 with the graph's error, never 0
    assert r["exit"] == 2, r["errors"]
    assert len(r["errors"]) == 1 and r["errors"][0].startswith("graph: "), r["errors"]
    s = r["report"]["summary"]
    assert "error" in s and "total_us" not in s
    if behaviour == "launch_fails":
        assert "stream capture failed at call #" in s["error"] and "incr" in s["error"]
        assert "cuStreamEndCapture" in r["log"]     # the capture was ended, not left open
    assert any(w.startswith("graph: ") for w in r["report"]["warnings"])


def test_graph_run_that_never_finishes_is_reported_not_hung(double, tmp_path):
    snap = tmp_path / "incr.cusnap"
    incr_program(snap, launches=3)
    r = _wrapped(double, tmp_path, snap, "graph", "hang")     # watchdog 2 s: waits give up after 1.6 s
    assert r["exit"] == 2
    s = r["report"]["summary"]
    assert s["hung"] is True and "did not finish within 1.6 s" in s["error"]
    assert any("did not finish" in e and "replay stops" in e for e in r["errors"])


def test_a_traced_graph_run_that_never_finishes_names_where_it_waits(double, tmp_path):
    """CUPTI has delivered the records of the kernels that finished: the first operation of the
    sequence without one is where the graph waits."""
    snap = tmp_path / "incr.cusnap"
    facts = incr_program(snap, launches=3)
    r = _wrapped(double, tmp_path, snap, "graph", "cupti_hang")
    assert r["exit"] == 2
    err = r["report"]["summary"]["error"]
    assert "CUPTI run 2 did not finish within 1.6 s" in err, err
    assert f"; 1 of 3 operations had finished, the first not finished is call #{facts['seqs'][1]} " in err, err


def test_graph_mode_uses_a_non_blocking_stream_and_no_sync_while_capturing(double, tmp_path):
    snap = tmp_path / "incr.cusnap"
    incr_program(snap, launches=3)
    r = _wrapped(double, tmp_path, snap, "graph", "none")      # the wrapper asserts no sync during capture
    assert r["exit"] == 0, r["errors"]
    s = r["report"]["summary"]
    assert "error" not in s and s["launches"] == 3 and len(s["graph_times_us"]) == 4
    log = r["log"]
    b, e = log.index("cuStreamBeginCapture"), log.index("cuStreamEndCapture")
    assert log[b + 1:e] == ["cuLaunchKernel"] * 3
    # without CUPTI, per-node times: the sequence captured again with an event record node around
    # every launch, run once to warm up and 4 times timed
    b2, e2 = log.index("cuStreamBeginCapture", e), log.index("cuStreamEndCapture", e + 1)
    assert log[b2 + 1:e2] == ["cuEventRecordWithFlags"] + ["cuLaunchKernel", "cuEventRecordWithFlags"] * 3
    assert log.count("cuGraphLaunch") == 2 + 4 + 1 + 4
    assert s["per_node_method"] == "event nodes between launches" and s["launches_timed"] == 3


def test_a_profile_says_where_the_replays_time_went(double, tmp_path):
    """run.timings_s: process start to the profile, reading and planning, cuInit and the
    placement reservation, the loop to the first launch, the launches, the rest; they add up to
    no more than the process's life."""
    import time
    snap = tmp_path / "incr.cusnap"
    incr_program(snap, launches=3)
    t0 = time.monotonic()
    r = _wrapped(double, tmp_path, snap, "timeline", "cupti")
    life = time.monotonic() - t0
    t = r["report"]["run"]["timings_s"]
    assert {"to_start", "read_and_plan", "driver_init", "to_first_launch", "launches", "after_loop",
            "read_and_plan.open", "read_and_plan.prescan", "read_and_plan.driver_load", "read_and_plan.profiler_start",
            "driver_init.cuinit", "driver_init.placement", "after_loop.end_state", "after_loop.profile_end",
            "after_loop.report", "loop.module", "loop.memory", "loop.launch", "loop.context"} <= set(t), t
    # the module the program loaded, its image's bytes, its allocation and its H2D copy
    assert t["count.modules_loaded"] == 1 and t["count.module_bytes"] > 0, t
    assert t["count.alloc_bytes"] > 0 and t["count.h2d_bytes"] > 0, t
    secs = {k: v for k, v in t.items() if not k.startswith("count.")}
    assert all(isinstance(v, float) and v >= 0 for v in secs.values()), t
    assert t["to_start"] > 0.05 and t["driver_init"] < t["to_first_launch"] + t["launches"]
    for part in ("read_and_plan", "driver_init", "after_loop"):
        assert sum(v for k, v in t.items() if k.startswith(part + ".")) <= t[part] + 1e-3, (part, t)
    # the calls replayed one by one ran inside the loop
    loop = t["to_first_launch"] + t["launches"]
    assert sum(v for k, v in t.items() if k.startswith("loop.")) <= loop + 1e-3, t
    assert sum(v for k, v in t.items() if k != "driver_init" and "." not in k) < life, (t, life)


def test_graph_mode_per_node_times_from_cupti(double, tmp_path):
    snap = tmp_path / "incr.cusnap"
    incr_program(snap, launches=3)
    r = _wrapped(double, tmp_path, snap, "graph", "cupti")
    s = r["report"]["summary"]
    assert r["exit"] == 0 and "error" not in s, (r["errors"], s)
    assert s["backend"] == "cupti" and len(s["graph_times_us"]) == 4     # totals: event runs without CUPTI
    assert s["cupti_span_us"] == 170.0                                     # 3 kernels of 50 us, 10 us apart
    rows = r["report"]["launches"]
    assert [x["node"] for x in rows] == [0, 1, 2] and all(x["times_us"] == [50.0] * 4 for x in rows)
    assert r["log"].count("cuGraphLaunch") == 2 + 4 + 4


def test_isolated_uses_cupti_durations_and_syncs_before_each_timed_run(double, tmp_path):
    snap = tmp_path / "incr.cusnap"
    facts = incr_program(snap, launches=2)
    r = _wrapped(double, tmp_path, snap, "isolated", "cupti")
    assert r["exit"] == 0, r["errors"]
    rep = r["report"]
    assert rep["summary"]["backend"] == "cupti" and rep["summary"]["warmup"] == 2
    assert not any("CUDA events" in w for w in rep["warnings"])
    rows = rep["launches"]
    assert [x["seq"] for x in rows] == facts["seqs"]
    for x in rows:
        assert x["times_us"] == [50.0] * 4 and x["median_us"] == 50.0
        assert x["spread_pct"] == 0.0 and x["iqr_pct"] == 0.0 and x["noise_pct"] == 0.0 and x["cupti_name"] == "incr_cupti"
    # each run: restore copies, then a stream synchronize, then the launch (no event pairs)
    log = r["log"]
    assert "cuEventRecord" not in log
    launches = [i for i, n in enumerate(log) if n == "cuLaunchKernel"]
    reruns = [i for i in launches if log[i - 1] == "cuStreamSynchronize"]
    assert len(reruns) == 2 * (2 + 4)
    for i in reruns:
        assert "cuMemcpyDtoDAsync" in log[i - 3:i]


def test_isolated_without_cupti_warns_and_uses_events(double, tmp_path):
    snap = tmp_path / "incr.cusnap"
    incr_program(snap, launches=1)
    r = _wrapped(double, tmp_path, snap, "isolated", "none")
    rep = r["report"]
    assert r["exit"] == 0 and rep["summary"]["backend"] == "events"
    assert any("CUDA events" in w and "cupti-python" in w for w in rep["warnings"])
    assert len(rep["launches"][0]["times_us"]) == 4


def test_default_warmup_is_three():
    from cudasnap.replay.profile import ProfileConfig
    assert ProfileConfig().warmup == 3


# --------------------------------------------------------------------------- kernels only inside the program's graphs
def incr_graph_program(path, n=16, graph_launches=3, stream=0x5000, plain_after=0):
    """incr captured into a graph on a created stream (as JAX/XLA command buffers do), the graph
    launched `graph_launches` times (+ `plain_after` plain incr launches); the D2H expects the sum."""
    s = Synth(path)
    ctx, mod, f_incr = 0x55550000, 0x55560000, 0x55570005
    G, GE = 0x66660000, 0x66670000
    D = 0x200000000000
    s.double_prologue("incr", f_incr, [[0, 8], [8, 4]], ctx, mod)
    s.call("cuStreamCreate", {"phStream": stream, "Flags": 0})
    s.call("cuMemAlloc_v2", {"dptr": D, "bytesize": n * 4})
    s.call("cuMemcpyHtoD_v2", {"dstDevice": D, "srcHost": 0x7F0000100000, "ByteCount": n * 4},
           x={"srcHost": s.blob(bytes(n * 4))})
    p = struct.pack("<Qi", D, n)
    s.call("cuStreamBeginCapture_v2", {"hStream": stream, "mode": 0})
    cap = s.launch(f_incr, p, block=n, stream=stream)["s"]
    s.call("cuStreamEndCapture", {"hStream": stream, "phGraph": G})
    s.call("cuGraphInstantiateWithFlags", {"phGraphExec": GE, "hGraph": G, "flags": 0})
    glaunch = [s.call("cuGraphLaunch", {"hGraphExec": GE, "hStream": stream})["s"] for _ in range(graph_launches)]
    plain = [s.launch(f_incr, p, block=n, stream=stream)["s"] for _ in range(plain_after)]
    s.call("cuStreamSynchronize", {"hStream": stream})
    total = graph_launches + plain_after
    s.call("cuMemcpyDtoH_v2", {"dstHost": 0x7F0000200000, "srcDevice": D, "ByteCount": n * 4},
           x={"dstHost": s.blob(struct.pack(f"<{n}i", *([total] * n)))})
    s.call("cuMemFree_v2", {"dptr": D})
    s.call("cuDevicePrimaryCtxRelease_v2", {"dev": 0})
    s.w.write({"k": "end", "exit": 0, "signal": None, "partial": False})
    s.close()
    return {"D": D, "n": n, "captured": cap, "graph_launches": glaunch, "plain": plain}


def test_graph_program_replays(double, tmp_path):
    snap = tmp_path / "g.cusnap"
    incr_graph_program(snap)
    rp = _replay(double, snap, "--json")
    assert rp.returncode == 0, rp.stdout + rp.stderr


def test_hooks_see_graph_launches(double, recorder, tmp_path):
    snap = tmp_path / "g.cusnap"
    facts = incr_graph_program(snap, graph_launches=2)
    out = tmp_path / "events.jsonl"
    rp = _replay(double, snap, "--hook", f"{recorder}:Recorder?out={out}")
    assert rp.returncode == 0, rp.stdout + rp.stderr
    evs = [(e["kind"], e.get("seq")) for e in _events(out) if "graph" in e["kind"]]
    assert evs == [(k, q) for q in facts["graph_launches"] for k in ("before_graph_launch", "graph_launch")]


def test_match_windows_by_time_not_correlation():
    from cudasnap.replay.profile.graphunits import match_windows, node_rows
    ks = [(1, 100, 200, "before", 7),            # the replay's own launch: before every window
          (2, 1100, 1150, "a", 7), (3, 1160, 1190, "b", 7),
          (4, 1500, 1600, "warmup", 7),          # between windows
          (9, 2050, 2080, "a", 7),                # correlation ids mean nothing here
          (5, 995, 1020, "edge", 7)]             # starts before the window, midpoint inside
    w = [(("t", 1000), ("t", 1200)), (("t", 2000), ("t", 2100)), (("t", 3000), ("t", 3100))]
    got = match_windows(ks, w)
    assert [[n for _a, _b, n in run] for run in got] == [["edge", "a", "b"], ["a"], []]
    # flush-index windows (no cupti.get_timestamp)
    assert [[n for _a, _b, n in r] for r in match_windows(ks, [(("n", 1), ("n", 3))])] == [["a", "b"]]
    rows = node_rows([[(0, 50_000, "a"), (60_000, 80_000, "b")], [(0, 40_000, "a"), (50_000, 70_000, "b")]])
    assert [(r["node"], r["name"], r["times_us"]) for r in rows] == [(0, "a", [50.0, 40.0]), (1, "b", [20.0, 20.0])]


def test_isolated_cupti_windows_ignore_the_replays_own_launches(double, tmp_path):
    snap = tmp_path / "incr.cusnap"
    facts = incr_program(snap, launches=3)
    r = _wrapped(double, tmp_path, snap, "isolated", "cupti")
    rep = r["report"]
    assert r["exit"] == 0 and rep["summary"]["backend"] == "cupti", (r["errors"], rep["summary"])
    assert rep["summary"]["launches_profiled"] == 3
    # each timed window holds exactly its run's kernel: 3 launches x 4 timed runs, no more
    assert [len(x["times_us"]) for x in rep["launches"]] == [4, 4, 4]
    assert all(x["timing"] == "cupti" and x["times_us"] == [50.0] * 4 for x in rep["launches"])
    assert not any("no CUPTI kernel record" in w for w in rep["warnings"])
    assert [x["seq"] for x in rep["launches"]] == facts["seqs"]


def test_isolated_cupti_without_records_falls_back_to_events_loudly(double, tmp_path):
    snap = tmp_path / "incr.cusnap"
    incr_program(snap, launches=4)
    r = _wrapped(double, tmp_path, snap, "isolated", "cupti_silent")
    rep = r["report"]
    assert r["exit"] == 0, r["errors"]            # memory still restored: the D2H verifies
    s = rep["summary"]
    assert s["backend"] == "events" and s["launches_profiled"] == 4 and "error" not in s, s
    assert all(x["timing"] == "events" and len(x["times_us"]) == 4 for x in rep["launches"])
    assert any("no CUPTI kernel record" in w and "CUDA events" in w for w in rep["warnings"])
    assert any("timing the rest with CUDA events" in w for w in rep["warnings"])   # gave up after 3


@pytest.mark.parametrize("behaviour", ["cupti", "none"])
def test_isolated_times_graph_launches_as_units(double, tmp_path, behaviour):
    snap = tmp_path / "g.cusnap"
    facts = incr_graph_program(snap, graph_launches=3, plain_after=1)
    r = _wrapped(double, tmp_path, snap, "isolated", behaviour)
    assert r["exit"] == 0, r["errors"]       # every graph run started from the saved memory: D2H sees 4
    rep = r["report"]
    s = rep["summary"]
    assert "error" not in s, s
    assert s["launches_profiled"] == 1 and s["graph_launches_profiled"] == 3 and s["captured_launches"] == 1
    assert any("cuGraphLaunch" in p for p in s["paths"]) and any("one by one" in p for p in s["paths"])
    units = [x for x in rep["launches"] if x.get("unit") == "graph"]
    assert [x["seq"] for x in units] == facts["graph_launches"]
    assert all(len(x["times_us"]) == 4 and x["median_us"] > 0 for x in units)
    if behaviour == "cupti":
        assert s["backend"] == "cupti"
        assert all(x["name"] == "incr_graph" and x["node"] == 0 and x["times_us"] == [50.0] * 4 for x in units)
        k = {x["name"]: x for x in rep["kernels"]}
        assert k["incr_graph"]["launches"] == 3 and k["incr"]["launches"] == 1
        assert s["graph_units"][0]["kernels_per_run"] == 1
    else:
        assert all(x["name"] == f"cuGraphLaunch #{x['seq']}" and x["timing"] == "events" for x in units)
    # each timed graph run: restore, synchronize, then the graph launch
    log = r["log"]
    g = [i for i, n in enumerate(log) if n == "cuGraphLaunch"]
    assert len(g) == 3 * (1 + 2 + 4)
    reruns = [i for i in g if log[i - 1] == "cuStreamSynchronize" or log[i - 1] == "cuEventRecord"]
    assert len(reruns) == 3 * (2 + 4)
    for i in reruns:
        assert "cuMemcpyDtoDAsync" in log[i - 6:i]


@pytest.mark.parametrize("behaviour", ["cupti", "none"])
def test_graph_mode_times_recorded_graph_launches(double, tmp_path, behaviour):
    snap = tmp_path / "g.cusnap"
    facts = incr_graph_program(snap, graph_launches=2)
    r = _wrapped(double, tmp_path, snap, "graph", behaviour)
    assert r["exit"] == 0, r["errors"]
    rep = r["report"]
    s = rep["summary"]
    assert "error" not in s and s["path"] == "recorded graph launches", s
    assert s["graph_launches_timed"] == 2 and s["total_us"] > 0 and s["launches"] == 2
    assert any("only inside the program's own CUDA graphs" in w for w in rep["warnings"])
    assert [x["seq"] for x in rep["launches"]] == facts["graph_launches"]
    if behaviour == "cupti":
        assert s["backend"] == "cupti"
        assert all(x["name"] == "incr_graph" and x["times_us"] == [50.0] * 4 for x in rep["launches"])
    assert all(x["median_us"] > 0 for x in rep["launches"])
    assert r["log"].count("cuGraphLaunch") == 2 * (1 + 2 + 4 + (4 if behaviour == "cupti" else 0))


@pytest.mark.parametrize("behaviour", ["cupti_nodes", "none"])
def test_timeline_times_kernels_run_by_the_programs_graphs(double, tmp_path, behaviour):
    """JAX/XLA command buffers and CUDA-graph PyTorch run their kernels through cuGraphLaunch:
    the launch recorded into the capture is a graph node (no row of its own), and each graph
    launch's kernels get rows (CUPTI), or the launch is timed whole (CUDA events)."""
    snap = tmp_path / "g.cusnap"
    facts = incr_graph_program(snap, graph_launches=3, plain_after=1)
    trace = tmp_path / "t.json"
    r = _wrapped(double, tmp_path, snap, "timeline", behaviour, trace=str(trace))
    assert r["exit"] == 0, r["errors"]
    rep = r["report"]
    s = rep["summary"]
    assert s["captured_launches"] == 1 and s["graph_launches"] == 3, s
    evs = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    if behaviour == "cupti_nodes":
        assert sorted(e["args"]["seq"] for e in evs if e["args"].get("graph node") == 500) == facts["graph_launches"]
    else:
        assert sorted(e["args"]["seq"] for e in evs if e["cat"] == "cuda_graph") == facts["graph_launches"]
    rows = rep["launches"]
    assert facts["captured"] not in [x["seq"] for x in rows]
    if behaviour == "cupti_nodes":
        g = [x for x in rows if x.get("graph_seq") is not None]
        assert [x["seq"] for x in g] == facts["graph_launches"]
        assert all(x["cupti_name"] == "incr_graph" and x["graph_node_id"] == 500 and x["time_us"] == 50.0 for x in g)
        [plain] = [x for x in rows if x.get("graph_seq") is None]
        assert plain["seq"] == facts["plain"][0] and plain["time_us"] == 50.0
        assert s["graph_kernels_timed"] == 3 and s["launches_timed"] == 4
    else:
        assert [x["seq"] for x in rows] == facts["plain"]
        assert len(s["graph_launch_us"]) == 3 and all(t > 0 for t in s["graph_launch_us"])


def test_graph_mode_standard_path_is_named(double, tmp_path):
    snap = tmp_path / "incr.cusnap"
    incr_program(snap, launches=2)
    r = _wrapped(double, tmp_path, snap, "graph", "none")
    assert r["report"]["summary"]["path"] == "captured sequence"


def test_isolated_nothing_timed_is_an_error_not_silence(double, tmp_path):
    snap = tmp_path / "g.cusnap"
    incr_graph_program(snap, graph_launches=1)
    r = _wrapped(double, tmp_path, snap, "isolated", "cupti", kernels="^no_such_kernel$")
    s = r["report"]["summary"]
    assert s["launches_profiled"] == 0 and "no launch was timed" in s["error"], s
    assert any("no launch was timed" in w for w in r["report"]["warnings"])


@pytest.mark.parametrize("mode", ["graph", "isolated"])
def test_profile_modes_relaunch_every_launch_form(double, tmp_path, mode):
    """Relaunches (a graph's capture, isolated repeats) of every launch form the capture sees:
    the extra-buffer form, cuLaunchKernelEx with a cluster attribute, a library kernel cast to
    CUfunction (relaunched through the current context's function), a cooperative launch, a
    cuKernelGetFunction function. On an H200, a library kernel launched by cudaLaunchKernelExC
    failed graph mode's capture with CUDA_ERROR_INVALID_HANDLE."""
    snap = tmp_path / "forms.cusnap"
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "capture", "-o", str(snap), "--",
                         double["progs"]["launch_forms"]], env=double["env"], capture_output=True, text=True,
                        timeout=120)
    assert cp.returncode == 0, cp.stderr
    out = tmp_path / "p.json"
    extra = ["--no-timeline-check"] if mode == "graph" else []
    rp = _replay(double, snap, "--profile", mode, "--repeat", "2", "--warmup", "1", "--out", str(out), *extra)
    assert rp.returncode == 0, rp.stdout + rp.stderr
    rep = json.loads(out.read_text())
    rows = rep["launches"]
    names = {r["name"] for r in rows}
    assert {"add_one", "saxpy"} <= names, names
    timed = [r for r in rows if r.get("median_us") is not None or r.get("time_us") is not None or r.get("times_us")]
    assert timed and len(timed) == len(rows), rows
