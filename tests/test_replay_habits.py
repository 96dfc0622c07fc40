"""Replay as people who live in nsys, ncu and the PyTorch profiler expect it, on the CUDA test
double: ncu's kernel selection (-k, regex:, --kernel-name-base, -s, -c) in plain replay and in
every profile mode, cuProfilerStart/Stop passed through and --profiler-range workload, and the
trace laid out as the PyTorch profiler (Kineto) writes one."""
from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from cudasnap.replay.names import demangle, function_name, name_for
from synth import Synth

A_NAME, B_NAME, C_NAME = "_Z4incrPii", "_ZN4demo4incrIiEEvPT_i", "add_one"
MODULE = f"CUDADOUBLE\nkernel {A_NAME}\nkernel {B_NAME}\nkernel {C_NAME}\n".encode()
N = 16


def _replay(double, snap, *args, env=None, timeout=120):
    e = dict(double["env"])
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snap), *args], env=e,
                          capture_output=True, text=True, timeout=timeout)


def names_program(path, pattern: str = "ABABCAB", memset: bool = True):
    """Kernels under C++ names: A = incr(int*, int), B = void demo::incr<int>(int*, int) (both the
    double's incr, on buffers DA and DB), C = add_one on DC; launched in `pattern` order, a
    memset of DA to 0 halfway when `memset`. Returns {"seqs": {letter: [launch seqs]}, "order": [...]}."""
    s = Synth(path)
    ctx, mod = 0x55550000, 0x55560000
    h = {"A": 0x55570001, "B": 0x55570002, "C": 0x55570003}
    names = {"A": A_NAME, "B": B_NAME, "C": C_NAME}
    s.call("cuInit", {"Flags": 0})
    s.call("cuDeviceGet", {"device": 0, "ordinal": 0})
    s.call("cuDevicePrimaryCtxRetain", {"pctx": ctx, "dev": 0})
    s.call("cuCtxSetCurrent", {"ctx": ctx})
    s.call("cuModuleLoadData", {"module": mod, "image": 0x7F0000001000}, x={"image": s.blob(MODULE + b"\0")})
    for k in "ABC":
        s.call("cuModuleGetFunction", {"hfunc": h[k], "hmod": mod, "name": names[k]})
        s.fn(h[k], names[k], mod, [[0, 8], [8, 4]])
    base = 0x200000000000
    buf = {"A": base, "B": base + 0x1000, "C": base + 0x2000}
    for k in "ABC":
        s.call("cuMemAlloc_v2", {"dptr": buf[k], "bytesize": N * 4})
        s.call("cuMemcpyHtoD_v2", {"dstDevice": buf[k], "srcHost": 0x7F0000100000, "ByteCount": N * 4},
               x={"srcHost": s.blob(bytes(N * 4))})
    count = {"A": 0, "B": 0}
    cval = [0.0] * N
    seqs = {"A": [], "B": [], "C": []}
    order = []
    for i, k in enumerate(pattern):
        if memset and i == len(pattern) // 2:
            s.call("cuMemsetD32_v2", {"dstDevice": buf["A"], "ui": 0, "N": N})
            count["A"] = 0
        rec = s.launch(h[k], struct.pack("<Qi", buf[k], N), block=N)
        seqs[k].append(rec["s"])
        order.append(rec["s"])
        if k == "C":
            cval = [v + 1.0 for v in cval]
        else:
            count[k] += 1
    s.call("cuCtxSynchronize", {})
    for k in "ABC":
        want = struct.pack(f"<{N}f", *cval) if k == "C" else struct.pack(f"<{N}i", *([count[k]] * N))
        s.call("cuMemcpyDtoH_v2", {"dstHost": 0x7F0000200000, "srcDevice": buf[k], "ByteCount": N * 4},
               x={"dstHost": s.blob(want)})
    for k in "ABC":
        s.call("cuMemFree_v2", {"dptr": buf[k]})
    s.call("cuDevicePrimaryCtxRelease_v2", {"dev": 0})
    s.w.write({"k": "end", "exit": 0, "signal": None, "partial": False})
    s.close()
    return {"seqs": seqs, "order": order}


SEQ_HOOK = '''
import json
class Seqs:
    def __init__(self, out):
        self.out = out
        self.seqs = []
    def before_launch(self, ev):
        self.seqs.append(ev.seq)
    def end(self, ev):
        with open(self.out, "w") as f:
            json.dump(self.seqs, f)
'''


@pytest.fixture
def prog(tmp_path):
    snap = tmp_path / "names.cusnap"
    facts = names_program(snap)
    hook = tmp_path / "seqhook.py"
    hook.write_text(SEQ_HOOK)
    return snap, facts, hook


# --------------------------------------------------------------------------- names
def test_names_match_cxxfilt_and_ncu_function_base():
    assert demangle(B_NAME) == "void demo::incr<int>(int*, int)"
    assert demangle(A_NAME) == "incr(int*, int)"
    assert function_name(B_NAME) == function_name(A_NAME) == "incr"
    assert function_name(C_NAME) == demangle(C_NAME) == C_NAME == name_for(C_NAME, "mangled")
    torch = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEENS_6detail5ArrayIPcLi1EEEEEviT0_T1_"
    assert function_name(torch) == "vectorized_elementwise_kernel"
    assert function_name("_ZN12_GLOBAL__N_16kernelIiEEvPT_") == "kernel"      # (anonymous namespace)
    assert demangle("_Znot_a_name") == "_Znot_a_name"
    import shutil
    if shutil.which("c++filt"):                   # c++filt's output is the reference
        for n in (A_NAME, B_NAME, torch):
            ref = subprocess.run(["c++filt", n], capture_output=True, text=True).stdout.strip()
            assert demangle(n) == ref


# --------------------------------------------------------------------------- selection
def _letters(facts, seqs):
    back = {s: k for k, v in facts["seqs"].items() for s in v}
    return "".join(back[s] for s in seqs)


# pattern ABABCAB: the launches in order are A B A B C A B
CASES = [
    (["-k", "incr"], "ABABAB"),
    (["-k", "incr", "--kernel-name-base", "demangled"], ""),
    (["-k", "incr(int*, int)", "--kernel-name-base", "demangled"], "AAA"),
    (["-k", "void demo::incr<int>(int*, int)", "--kernel-name-base", "demangled"], "BBB"),
    (["-k", A_NAME, "--kernel-name-base", "mangled"], "AAA"),
    (["-k", "regex:demo"], ""),
    (["-k", "regex:demo", "--kernel-name-base", "demangled"], "BBB"),
    (["-k", "regex:^add"], "C"),
    (["-k", "incr", "-s", "2", "-c", "3"], "ABA"),
    (["--launch-skip", "1", "--launch-count", "2"], "BA"),
    (["-c", "1"], "A"),
    (["-s", "5"], "AB"),
    (["-k", "regex:incr", "--kernels", "demo", "-c", "2"], "BB"),
    (["-k", "nosuch"], ""),
]


@pytest.mark.parametrize("args,want", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_plain_replay_runs_only_the_selected_launches(double, prog, tmp_path, args, want):
    snap, facts, hook = prog
    out = tmp_path / "seqs.json"
    rp = _replay(double, snap, *args, "--hook", f"{hook}:Seqs?out={out}", "--json", "--continue-on-error")
    if not want:                                   # a selection of nothing: one line, exit 2, no replay
        assert rp.returncode == 2 and "no launch of the snapshot matches" in rp.stderr, rp.stdout + rp.stderr
        assert len(rp.stderr.strip().splitlines()) == 1
        assert not out.exists() or json.loads(out.read_text()) == []      # the hook saw no launch
        return
    res = json.loads(rp.stdout)
    assert not res["errors"], rp.stdout + rp.stderr
    assert _letters(facts, json.loads(out.read_text())) == want
    assert res["launches"] == len(want) and res["filtered"] >= 7 - len(want)
    # a D2H result a left-out launch decides is not compared: no false mismatch, and it is counted
    assert rp.returncode == 0 and not res["mismatches"], rp.stdout
    assert (res["d2h_left_out"] > 0) == (len(want) < 7)


@pytest.mark.parametrize("args,want", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_timeline_profiles_the_same_launches_and_runs_every_call(double, prog, tmp_path, args, want):
    snap, facts, _hook = prog
    out = tmp_path / "prof.json"
    rp = _replay(double, snap, "--profile", "timeline", *args, "--out", str(out), "--json")
    if not want:                                   # a profile of nothing: one line, exit 2, nothing written
        assert rp.returncode == 2 and "no launch of the snapshot matches" in rp.stderr, rp.stdout + rp.stderr
        assert not out.exists()
        return
    assert rp.returncode == 0, rp.stdout + rp.stderr           # every launch ran: every D2H verifies
    res = json.loads(rp.stdout)
    assert res["launches"] == 7 and res["filtered"] == 0
    rows = json.loads(out.read_text())["launches"]
    assert _letters(facts, [r["seq"] for r in rows]) == want
    for r in rows:                                   # the recorded (mangled) name stays; demangled beside it
        assert r["name"] in (A_NAME, B_NAME, C_NAME) and r["demangled"] == demangle(r["name"])


@pytest.mark.parametrize("args", [[], ["--profile", "timeline"]], ids=["plain", "timeline"])
def test_json_owns_stdout_when_kernels_print(double, prog, args):
    """A kernel's printf reaches file descriptor 1 through the driver: with --json it goes to
    stderr, so `replay --json | jq` still reads one document."""
    snap, _facts, _hook = prog
    rp = _replay(double, snap, *args, "--json", env={"CUDA_DOUBLE_PRINTF": "1"})
    assert rp.returncode == 0, rp.stdout + rp.stderr
    assert json.loads(rp.stdout)["launches"] == 7
    assert rp.stderr.count("double kernel printf") == 7
    plain = _replay(double, snap, *args, env={"CUDA_DOUBLE_PRINTF": "1"})        # without --json: stdout
    assert plain.returncode == 0 and plain.stdout.count("double kernel printf") == 7, plain.stdout + plain.stderr


@pytest.mark.parametrize("mode", ["isolated", "graph"])
def test_other_profile_modes_select_the_same_launches(double, prog, tmp_path, mode):
    snap, facts, _hook = prog
    out = tmp_path / "prof.json"
    rp = _replay(double, snap, "--profile", mode, "--repeat", "2", "--warmup", "0", "-k", "incr", "-s", "2",
                 "-c", "3", "--out", str(out))
    assert rp.returncode == 0, rp.stdout + rp.stderr
    rows = json.loads(out.read_text())["launches"]
    assert _letters(facts, sorted(r["seq"] for r in rows if "seq" in r)) == "ABA"


def test_selection_option_errors(double, prog):
    snap, _facts, _hook = prog
    for args, msg in ((["-k", "regex:("], "--kernel-name: bad regex"),
                      (["-k", "regex:"], "--kernel-name: give a name"),
                      (["-c", "0"], "--launch-count"),
                      (["-s", "-1"], "--launch-skip"),
                      (["--kernel-name-base", "bogus"], "--kernel-name-base"),
                      (["--profile", "timeline", "-k", "regex:["], "bad regex")):
        rp = _replay(double, snap, *args)
        assert rp.returncode == 2 and msg in rp.stderr, (args, rp.stderr)
        assert len(rp.stderr.strip().splitlines()) == 1, rp.stderr


# --------------------------------------------------------------------------- profiler range
def _plog(path):
    return [tuple(l.split()) for l in Path(path).read_text().splitlines()] if Path(path).exists() else []


def test_recorded_profiler_start_stop_are_called_on_replay(double, capture, tmp_path):
    cp, snap = capture(double["progs"]["nvtx_client"], "3")
    assert cp.returncode == 0, cp.stderr
    log = tmp_path / "prof.log"
    rp = _replay(double, snap, env={"CUDA_DOUBLE_PROFILER_LOG": str(log)})
    assert rp.returncode == 0, rp.stdout + rp.stderr
    # recorded: after the H2D copy, around the 3 launches
    assert _plog(log) == [("cuProfilerStart", "1"), ("cuProfilerStop", "4")]
    assert "recorded cuProfilerStart x1, cuProfilerStop x1 called as recorded" in rp.stdout


@pytest.mark.parametrize("prog_name,args,ops", [("nvtx_client", ["3"], 5), ("direct", ["6"], 8)])
def test_profiler_range_workload_brackets_the_workload(double, capture, tmp_path, prog_name, args, ops):
    """Start right before the first launch/copy/memset (after context, placement and module
    set-up), stop after the last one; recorded ones ignored. `direct` replays its launches
    through the native batch path."""
    cp, snap = capture(double["progs"][prog_name], *args)
    assert cp.returncode == 0, cp.stderr
    log = tmp_path / "prof.log"
    rp = _replay(double, snap, "--profiler-range", "workload", "--json", env={"CUDA_DOUBLE_PROFILER_LOG": str(log)})
    assert rp.returncode == 0, rp.stdout + rp.stderr
    assert _plog(log) == [("cuProfilerStart", "0"), ("cuProfilerStop", str(ops))]
    res = json.loads(rp.stdout)
    p = res["profiler"]
    assert p["range"] == "workload" and p["starts"] == 1 and p["stops"] == 1
    assert p.get("ignored", 0) == (2 if prog_name == "nvtx_client" else 0)
    from cudasnap.formats import SnapshotReader
    calls = [c for c in SnapshotReader(snap).records() if c["k"] == "c"]
    work = [c["s"] for c in calls if c["f"].startswith(("cuLaunch", "cuMemcpy", "cuMemset"))]
    assert p["first_seq"] == work[0] and p["last_seq"] == work[-1]
    text = _replay(double, snap, "--profiler-range", "workload", env={"CUDA_DOUBLE_PROFILER_LOG": str(log)})
    assert f"cuProfilerStart before call #{work[0]}, cuProfilerStop after call #{work[-1]}" in text.stdout


def test_profiler_range_with_a_selection_and_a_profile(double, prog, tmp_path):
    snap, facts, _hook = prog
    log = tmp_path / "prof.log"
    # plain replay leaving the last launch out: the range still closes after the last workload call
    rp = _replay(double, snap, "--profiler-range", "workload", "-k", "regex:^add", "--continue-on-error",
                 env={"CUDA_DOUBLE_PROFILER_LOG": str(log)})
    assert rp.returncode == 0 and "not compared" in rp.stdout     # what the left-out kernels decide is not compared
    # ops: 3 H2D, C, memset, 3 D2H (the memset is halfway: before C)
    assert _plog(log) == [("cuProfilerStart", "0"), ("cuProfilerStop", "8")]
    log.unlink()
    rp = _replay(double, snap, "--profile", "timeline", "--profiler-range", "workload",
                 env={"CUDA_DOUBLE_PROFILER_LOG": str(log)})
    assert rp.returncode == 0, rp.stdout + rp.stderr
    assert _plog(log) == [("cuProfilerStart", "0"), ("cuProfilerStop", str(3 + 7 + 1 + 3))]


# --------------------------------------------------------------------------- Kineto-style trace
ALLOWED_PH = set("XBEiIMsftbenCPOND")


def check_chrome_trace(data):
    """The Chrome trace event format's rules, as Perfetto's and chrome://tracing's JSON importers
    apply them: a traceEvents list of objects with a phase; integer pid/tid; numeric ts (us) on
    every event but metadata; complete events with a non-negative dur; flow starts matched by a
    flow end with the same id and category, not before it; async begin/end pairs matched by id;
    complete events on one thread properly nested (no partial overlap)."""
    assert isinstance(data, dict) and isinstance(data["traceEvents"], list)
    json.dumps(data)
    tracks = {}
    flows, asyncs = {}, {}
    for e in data["traceEvents"]:
        assert isinstance(e, dict) and e.get("ph") in ALLOWED_PH, e
        assert isinstance(e.get("name"), str), e
        assert isinstance(e.get("pid"), int) and isinstance(e.get("tid"), int), e
        assert 0 <= e["pid"] < 2 ** 31 and 0 <= e["tid"] < 2 ** 31, e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "process_labels", "process_sort_index", "thread_name",
                                 "thread_sort_index") and isinstance(e.get("args"), dict), e
            continue
        assert isinstance(e.get("ts"), (int, float)) and e["ts"] >= 0, e
        if "args" in e:
            assert isinstance(e["args"], dict)
        if e["ph"] == "X":
            assert isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0, e
            assert isinstance(e.get("cat"), str), e
            tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
        elif e["ph"] in "sf":
            flows.setdefault((e["cat"], e["id"]), {})[e["ph"]] = e
        elif e["ph"] in "be":
            asyncs.setdefault((e["cat"], e["id"]), {})[e["ph"]] = e
    for key, fl in flows.items():
        assert set(fl) == {"s", "f"}, key
        assert fl["f"]["ts"] >= fl["s"]["ts"], key
        assert fl["f"].get("bp") == "e"
    for key, a in asyncs.items():
        assert set(a) == {"b", "e"} and a["e"]["ts"] >= a["b"]["ts"], key
    for key, spans in tracks.items():
        stack = []
        for b, e in sorted(spans, key=lambda x: (x[0], -x[1])):
            while stack and stack[-1] <= b:
                stack.pop()
            assert not stack or e <= stack[-1] + 1e-3, (key, b, e, stack)
            stack.append(e)
    return data


def test_trace_kineto_layout_with_nvtx_flows_and_memsets(double, capture, tmp_path):
    cp, snap = capture(double["progs"]["nvtx_client"], "3")
    assert cp.returncode == 0, cp.stderr
    trace, out = tmp_path / "trace.json.gz", tmp_path / "prof.json"
    rp = _replay(double, snap, "--profile", "timeline", "--trace", str(trace), "--out", str(out))
    assert rp.returncode == 0, rp.stdout + rp.stderr
    data = check_chrome_trace(json.load(gzip.open(trace, "rt")))
    evs = data["traceEvents"]
    kern = [e for e in evs if e.get("cat") == "kernel"]
    rows = json.loads(out.read_text())["launches"]
    assert [e["args"]["correlation"] for e in kern] == [r["seq"] for r in rows]       # the --out rows
    for e, r in zip(kern, rows):
        assert e["pid"] == 0 and e["args"]["device"] == 0 and e["tid"] == e["args"]["stream"]
        assert e["name"] == demangle(r["name"]) and e["args"]["mangled"] == r["name"]
        assert e["dur"] == pytest.approx(r["time_us"], abs=0.002)
    host = [e for e in evs if e.get("cat") == "cuda_driver"]
    recorded_pid = json.loads(subprocess.run([sys.executable, "-m", "cudasnap", "info", str(snap), "--json"],
                                             env=double["env"], capture_output=True, text=True).stdout)["process"]["pid"]
    assert {e["pid"] for e in host} == {recorded_pid}
    launches = [e for e in host if e["name"].startswith("cuLaunch")]
    assert len(launches) == 3
    starts = {e["id"]: e for e in evs if e["ph"] == "s"}
    ends = {e["id"]: e for e in evs if e["ph"] == "f"}
    for c, k in zip(launches, kern):               # an arrow from each launch call to its kernel
        seq = c["args"]["correlation"]
        assert starts[seq]["ts"] == c["ts"] and starts[seq]["cat"] == "ac2g" and starts[seq]["tid"] == c["tid"]
        assert ends[seq]["ts"] == k["ts"] and (ends[seq]["pid"], ends[seq]["tid"]) == (k["pid"], k["tid"])
    cats = {e.get("cat") for e in evs}
    assert {"kernel", "gpu_memcpy", "cuda_driver", "ac2g", "nvtx"} <= cats
    # NVTX ranges of the recording, on their own track, around the replayed calls they enclosed
    nv = [e for e in evs if e.get("cat") == "nvtx"]
    tracks = {e["tid"] for e in nv}
    assert len(tracks) == 1 and not tracks & {e["tid"] for e in host}
    steps = [e for e in nv if e["ph"] == "X" and e["name"] == "registered step"]
    assert len(steps) == 3 and all(s["args"]["domain"] == "mylib" for s in steps)
    for s, c in zip(steps, launches):
        assert s["ts"] <= c["ts"] and c["ts"] + c["dur"] <= s["ts"] + s["dur"] + 1e-3
    outer = [e for e in nv if e["ph"] == "X" and e["name"] == "step"]
    order = [e["name"] for e in nv if e["ph"] == "X"]
    assert order.index("step") < order.index("registered step")     # the outer range first
    assert len(outer) == 3
    assert [e["ph"] for e in nv if e["name"] == "async range"] == ["b", "e"]
    assert [e["name"] for e in nv if e["ph"] == "i"] == ["marker"]
    names = {(e["pid"], e["args"]["name"]) for e in evs if e["ph"] == "M" and e["name"] == "process_name"}
    assert (0, "GPU 0") in names


def test_trace_memsets_are_not_copies_and_names_are_demangled(double, prog, tmp_path):
    snap, facts, _hook = prog
    trace = tmp_path / "trace.json"
    rp = _replay(double, snap, "--trace", str(trace))             # --trace alone: timeline mode
    assert rp.returncode == 0, rp.stdout + rp.stderr
    evs = check_chrome_trace(json.loads(trace.read_text()))["traceEvents"]
    memsets = [e for e in evs if e.get("cat") == "gpu_memset"]
    assert len(memsets) == 1 and memsets[0]["name"] == "Memset (Device)" and memsets[0]["args"]["bytes"] == N * 4
    copies = [e for e in evs if e.get("cat") == "gpu_memcpy"]
    assert len(copies) == 6 and not any("memset" in e["name"].lower() for e in copies)
    kern = [e for e in evs if e.get("cat") == "kernel"]
    assert {e["name"] for e in kern} == {"incr(int*, int)", "void demo::incr<int>(int*, int)", "add_one"}
    assert {e["args"]["mangled"] for e in kern} == {A_NAME, B_NAME, C_NAME}
    assert [e["args"]["correlation"] for e in kern] == facts["order"]
    ms = next(e for e in evs if e.get("cat") == "cuda_driver" and e["name"].startswith("cuMemset"))
    assert any(e["ph"] == "s" and e["id"] == ms["args"]["correlation"] for e in evs)


def test_trace_unit_without_host_calls():
    from cudasnap.replay.profile.trace import trace_events
    t = trace_events([{"kind": "memset", "seq": 4, "stream": 0, "bytes": 64, "start_ns": 2000, "end_ns": 3000},
                      {"kind": "kernel", "name": B_NAME, "seq": 5, "stream": 0x99, "start_ns": 5000, "end_ns": 7000,
                       "grid": [1, 1, 1], "block": [32, 1, 1], "shmem": 0}], device=3)
    check_chrome_trace(t)
    xs = [e for e in t["traceEvents"] if e["ph"] == "X"]
    assert [(e["cat"], e["name"], e["pid"], e["ts"], e["dur"]) for e in xs] == [
        ("gpu_memset", "Memset (Device)", 3, 0.0, 1.0), ("kernel", "void demo::incr<int>(int*, int)", 3, 3.0, 2.0)]
    assert xs[0]["tid"] != xs[1]["tid"]                           # two streams, two tracks


def test_trace_loads_in_perfetto_trace_processor(double, prog, tmp_path):
    """Perfetto's own JSON importer, where the `perfetto` package and a trace_processor_shell
    binary are at hand (the package downloads the binary on first use: without network, give
    one in PERFETTO_TP_BIN)."""
    tp_mod = pytest.importorskip("perfetto.trace_processor")
    snap, facts, _hook = prog
    trace = tmp_path / "trace.json"
    rp = _replay(double, snap, "--trace", str(trace))
    assert rp.returncode == 0, rp.stdout + rp.stderr
    cfg = tp_mod.TraceProcessorConfig(bin_path=os.environ.get("PERFETTO_TP_BIN"), load_timeout=20)
    try:
        tp = tp_mod.TraceProcessor(trace=str(trace), config=cfg)
    except Exception as e:        # no binary and no network to fetch one
        pytest.skip(f"Perfetto's trace processor cannot start here: {type(e).__name__}: {e}")
    try:
        rows = {r.category: r.n for r in tp.query("select category, count(*) as n from slice group by category")}
    finally:
        tp.close()
    assert rows.get("kernel") == 7 and rows.get("gpu_memset") == 1 and rows.get("gpu_memcpy") == 6
    assert rows.get("cuda_driver", 0) > 7
