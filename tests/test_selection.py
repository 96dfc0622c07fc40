"""Selections that mean what they say, on the CUDA test double: `extract --calls A-B` keeps the
range's work with what it depends on; a replay of part of a snapshot compares only the D2H
results that part determines and says how many it left out; a selection of nothing, an invalid
regex or a profile without kernel times is one line and exit 2; the Python API returns the
CLI's exit codes."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from cudasnap.formats import SnapshotReader, SnapshotWriter


def _cli(double, *args, timeout=180):
    return subprocess.run([sys.executable, "-m", "cudasnap", *map(str, args)], env=double["env"],
                          capture_output=True, text=True, timeout=timeout)


def _calls(path):
    return [r for r in SnapshotReader(path) if r["k"] == "c"]


def _captured(double, capture, prog):
    """A capture of a test-double program (conftest's capture fixture), checked."""
    cp, snap = capture(double["progs"][prog])
    assert cp.returncode == 0, cp.stderr
    return snap


def _one_line_error(cp):
    assert cp.returncode == 2, cp.stdout + cp.stderr
    assert "Traceback" not in cp.stdout + cp.stderr
    lines = [ln for ln in cp.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("cudasnap"), cp.stderr
    return lines[0]


@pytest.fixture(scope="module")
def snaps(double, tmp_path_factory):
    """direct: 10 launches on one buffer then one D2H; windowed: 10 rounds of H2D, two
    launches on a fresh stream, two D2H; chase: pointer tables uploaded before its launch."""
    d = tmp_path_factory.mktemp("sel")
    out = {}
    for prog in ("direct", "windowed", "chase", "carve"):
        p = d / f"{prog}.cusnap"
        cp = subprocess.run([sys.executable, "-m", "cudasnap", "capture", "-o", str(p), "--ring-mb", "16", "--",
                             double["progs"][prog]], env=double["env"], capture_output=True, text=True, timeout=120)
        assert cp.returncode == 0, cp.stderr
        out[prog] = p
    return out


# ---------------------------------------------------------------- extract --calls
@pytest.mark.parametrize("prog,rng", [("direct", "10-40"), ("carve", "3-33"), ("chase", "20-50"), ("windowed", "13-40")])
def test_extract_calls_keeps_the_launches_and_what_they_depend_on(double, snaps, tmp_path, prog, rng):
    out = tmp_path / "x.cusnap"
    cp = _cli(double, "extract", snaps[prog], "--calls", rng, "-o", out, "--check")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "check: replay of" in cp.stdout and "verified" in cp.stdout
    m = re.search(r"kept (\d+) launch\(es\) and (\d+) other work call\(s\), with (\d+) call\(s\) they depend on",
                  cp.stdout)
    assert m, cp.stdout
    lo, hi = map(int, rng.split("-"))
    orig = _calls(snaps[prog])
    last_work = max(c["s"] for c in orig if lo <= c["s"] <= hi
                    and c["f"].startswith(("cuLaunch", "cuMemcpy", "cuMemset", "cuGraphLaunch")))
    in_range = [c for c in orig if lo <= c["s"] <= last_work and c["f"].startswith("cuLaunch")]
    assert int(m.group(1)) == len(in_range) > 0         # every launch of the range, none lost
    kept = _calls(out)
    assert sorted(c.get("os") for c in kept if c["f"].startswith("cuLaunch")) == [c["s"] for c in in_range]
    # what the launches use was made before the range too: nothing is left unknown on replay
    assert "creating call was not replayed" not in cp.stdout + cp.stderr


def test_extract_calls_direct_keeps_every_launch_of_the_range(double, snaps, tmp_path):
    """The reported case: 10-40 on a 23-call snapshot keeps the 8 launches #10-#17 and the D2H
    that reads their result; the teardown after it (free, unload, context destroy) is left out."""
    out = tmp_path / "d.cusnap"
    cp = _cli(double, "extract", snaps["direct"], "--calls", "10-40", "-o", out)
    assert cp.returncode == 0, cp.stderr
    assert "kept 8 launch(es)" in cp.stdout and "3 call(s) after the range's last work left out" in cp.stdout
    kept = [c["f"] for c in _calls(out)]
    assert "cuCtxDestroy_v2" not in kept and kept.count("cuLaunchKernel") == 8
    rp = _cli(double, "replay", out)
    assert rp.returncode == 0 and "OK: every recorded D2H result reproduced" in rp.stdout, rp.stdout + rp.stderr


def test_extract_calls_keeps_the_lookups_its_selected_calls_name(double, capture, tmp_path):
    """A range holding cuKernelGetFunction of a library kernel launched only after it (the
    runtime asks for the function, then launches; PyTorch on an H200): the kernel's lookup and its
    library stay in the extract, or its replay stops at an unknown kernel."""
    snap = _captured(double, capture, "launch_forms")
    calls = _calls(snap)
    get = next(c["s"] for c in calls if c["f"] == "cuKernelGetFunction")
    first = next(c["s"] for c in calls if c["f"] == "cuGraphLaunch")
    copy = next(c["s"] for c in calls if c["s"] > get and c["f"].startswith("cuMemcpyDtoH"))
    assert not any(c["f"].startswith("cuLaunch") for c in calls if first <= c["s"] <= copy)
    out = tmp_path / "k.cusnap"
    ex = _cli(double, "extract", snap, "--calls", f"{first}-{copy}", "-o", out, "--check")
    assert ex.returncode == 0 and "verified" in ex.stdout, ex.stdout + ex.stderr
    assert "extracting again" not in ex.stdout
    kept = _calls(out)
    assert [c["f"] for c in kept].count("cuLibraryGetKernel") >= 1
    assert any(c["f"] == "cuKernelGetFunction" for c in kept)


def _reload_range(calls):
    """From the memset after the last launch on: a cuFuncSetAttribute before it names a function
    the program got outside the driver API (no lookup call), of a module the extract leaves out."""
    last = max(c["s"] for c in calls if c["f"].startswith("cuLaunch"))
    return next(c["s"] for c in calls if c["s"] > last and c["f"].startswith("cuMemset")), calls[-1]["s"]


def _windowed_range(calls):
    """From a D2H after a stream's synchronization through that stream's destruction: the stream
    was made before the range and only its destruction, in the range, names it."""
    fs = [c["f"] for c in calls]
    i = next(i for i in range(1, len(calls)) if fs[i].startswith("cuMemcpyDtoH") and fs[i - 1] == "cuStreamSynchronize")
    j = next(j for j in range(i, len(calls)) if fs[j].startswith("cuStreamDestroy"))
    k = next(k for k in range(j, len(calls)) if fs[k].startswith(("cuMemcpy", "cuLaunch")))   # work after it
    return calls[i]["s"], calls[k]["s"]


@pytest.mark.parametrize("prog,choose", [("reload", _reload_range), ("windowed", _windowed_range)])
def test_extract_calls_keeps_every_handle_a_kept_call_names(double, capture, tmp_path, prog, choose):
    snap = _captured(double, capture, prog)
    lo, hi = choose(_calls(snap))
    out = tmp_path / "x.cusnap"
    ex = _cli(double, "extract", snap, "--calls", f"{lo}-{hi}", "-o", out, "--check")
    assert ex.returncode == 0 and "verified" in ex.stdout, ex.stdout + ex.stderr
    assert "extracting again" not in ex.stdout, ex.stdout


def test_extract_calls_writes_a_multithreaded_range_in_call_order(double, capture, tmp_path):
    """Threads' records lie in a snapshot in the order their buffers were written, so a thread's
    allocation (#s) can come in the file after other threads' later calls. An extract whose range
    starts after that allocation keeps it, before the range, and verifies. The capture of 4
    threads is rewritten with one thread's records from its allocation on moved to the end (an
    order captures show now and then)."""
    sys.path.insert(0, os.path.dirname(__file__))
    from snapedit import rewrite
    src = _captured(double, capture, "threads")
    src_calls = _calls(src)
    main_tid = src_calls[0]["tid"]
    s_alloc, tid = min((c["s"], c["tid"]) for c in src_calls if c["f"].startswith("cuMemAlloc"))

    def late(recs):
        # the first allocating thread's calls from its allocation on, as one block after the other
        # threads' calls (before the main thread's teardown, which follows the join)
        moved = [r for r in recs if r.get("k") == "c" and r.get("tid") == tid and r["s"] >= s_alloc]
        ids = {id(r) for r in moved}
        rest = [r for r in recs if id(r) not in ids]
        at = next(i for i, r in enumerate(rest) if r.get("k") == "c" and r["tid"] == main_tid and r["s"] > s_alloc)
        return rest[:at] + moved + rest[at:]

    snap = tmp_path / "late.cusnap"
    rewrite(src, snap, reorder=late)
    rp = _cli(double, "replay", snap)
    assert rp.returncode == 0, rp.stdout + rp.stderr
    calls = _calls(snap)
    order = [c["s"] for c in calls]
    # the range starts at the first launch after the allocation (the thread's own launches all
    # lie in it, whatever order the threads ran in)
    first = min(c["s"] for c in calls if c["s"] > s_alloc and c["f"] == "cuLaunchKernel")
    # a call of the range comes first in the file, before the allocation it needs
    assert min(order.index(x) for x in order if x >= first) < order.index(s_alloc)
    out = tmp_path / "x.cusnap"
    ex = _cli(double, "extract", snap, "--calls", f"{first}-{max(order)}", "-o", out, "--check")
    assert ex.returncode == 0 and "verified" in ex.stdout, ex.stdout + ex.stderr
    kept = [c.get("os") for c in _calls(out) if c.get("os") is not None]
    assert s_alloc in kept and kept == sorted(kept)


@pytest.mark.parametrize("cut", ["start", "end"])
def test_extract_calls_never_cut_a_stream_capture(double, capture, tmp_path, cut):
    """A range that starts or ends inside a stream capture (a launch between
    cuStreamBeginCapture and cuStreamEndCapture): memory cannot be read while the capture is
    open (cuCtxSynchronize fails), so the extract grows to the whole capture, says so, and
    verifies."""
    snap = _captured(double, capture, "launch_forms")
    calls = _calls(snap)
    begin = next(c["s"] for c in calls if c["f"].startswith("cuStreamBeginCapture"))
    end = next(c["s"] for c in calls if c["f"] == "cuStreamEndCapture")
    captured = next(c["s"] for c in calls if begin < c["s"] < end and c["f"].startswith("cuLaunch"))
    before = max(c["s"] for c in calls if c["s"] < begin and c["f"].startswith("cuLaunch"))
    copy = next(c["s"] for c in calls if c["s"] > end and c["f"].startswith("cuMemcpyDtoH"))
    rng, kept = ((f"{captured}-{copy}", (begin, copy)) if cut == "start" else (f"{before}-{captured}", (before, end)))
    out = tmp_path / "c.cusnap"
    ex = _cli(double, "extract", snap, "--calls", rng, "-o", out, "--check")
    assert ex.returncode == 0 and "verified" in ex.stdout, ex.stdout + ex.stderr
    assert f"the range cut a stream capture: kept #{kept[0]}-#{kept[1]}" in ex.stdout, ex.stdout
    got = {c.get("os") for c in _calls(out)}
    assert {begin, captured, end} <= got and max(x for x in got if x is not None) == kept[1], sorted(got - {None})


@pytest.mark.parametrize("rng,why", [("24-54", "the snapshot's calls are #0-#22"),
                                     ("20-22", "no launch, copy or memset in that range"),
                                     ("5-3", "empty range"), ("x", "takes a range")])
def test_extract_calls_that_select_nothing_are_refused(double, snaps, tmp_path, rng, why):
    out = tmp_path / "n.cusnap"
    line = _one_line_error(_cli(double, "extract", snaps["direct"], "--calls", rng, "-o", out))
    assert why in line
    assert not out.exists()


# ---------------------------------------------------------------- partial replays
@pytest.mark.parametrize("sel", [["-c", "5"], ["-s", "8"], ["-c", "3", "-s", "2"], ["--calls", "9-19"],
                                 ["-k", "regex:nothing_like_it|add"]])
def test_partial_replay_never_reports_a_false_mismatch(double, snaps, sel):
    cp = _cli(double, "replay", snaps["direct"], *sel)
    out = cp.stdout + cp.stderr
    assert cp.returncode == 0, out
    assert "DIFFERENT:" not in out
    if sel[0] != "-k":                      # every launch matches -k here: nothing is partial
        # the one D2H reads the buffer every launch wrote: nothing to compare, and it says so
        assert "0 D2H result(s) verified" in out and "1 D2H result(s) not compared" in out
        assert "every recorded D2H result reproduced" not in out


@pytest.mark.parametrize("what", ["the first graph launch", "the copies after the graphs"])
def test_partial_replay_builds_captured_graphs_whole(double, capture, tmp_path, what):
    """Work issued to a stream in capture adds graph nodes and runs nothing: a partial replay
    replays it whatever the selection, or the graph lacks nodes the program then queries
    (capnodes asks cuGraphGetNodes) and the replay stops."""
    snap = _captured(double, capture, "capnodes")
    calls = _calls(snap)
    graphs = [c["s"] for c in calls if c["f"].startswith("cuGraphLaunch")]
    copies = [c["s"] for c in calls if c["f"].startswith("cuMemcpyDtoH") and c["s"] > graphs[-1]]
    rng = f"{graphs[0]}-{graphs[0]}" if what == "the first graph launch" else f"{copies[0]}-{copies[-1]}"
    cp = _cli(double, "replay", snap, "--calls", rng)
    out = cp.stdout + cp.stderr
    assert cp.returncode == 0 and "DIFFERENT:" not in out, out


def test_partial_replay_compares_what_the_selection_determines(double, snaps):
    """windowed: each round writes fresh buffers; -c 1 keeps the first launch only, so the D2H
    of the buffer it alone wrote is compared and the others are counted as left out."""
    cp = _cli(double, "replay", snaps["windowed"], "-c", "1", "--json")
    assert cp.returncode == 0, cp.stderr
    d = json.loads(cp.stdout)
    assert d["d2h_verified"] >= 1 and d["d2h_left_out"] >= 1 and not d["mismatches"]
    assert d["d2h_verified"] + d["d2h_left_out"] == 21           # every recorded D2H accounted for
    full = json.loads(_cli(double, "replay", snaps["windowed"], "--json").stdout)
    assert full["d2h_verified"] == 21 and full["d2h_left_out"] == 0


@pytest.mark.parametrize("sel,why", [(["-k", "nomatch"], "no launch of the snapshot matches"),
                                     (["--calls", "9999"], "its calls are #0-#22"),
                                     (["-s", "50"], "skips every one of the 10 launch(es)"),
                                     (["-k", "regex:("], "bad regex"), (["--kernels", "("], "bad regex")])
def test_empty_or_invalid_selection_is_one_line_exit_2(double, snaps, sel, why):
    assert why in _one_line_error(_cli(double, "replay", snaps["direct"], *sel))


@pytest.mark.parametrize("sel", [["-k", "nomatch"], ["--calls", "9999"], ["-s", "50"]])
def test_profile_of_nothing_is_refused_and_writes_nothing(double, snaps, tmp_path, sel):
    out = tmp_path / "p.json"
    _one_line_error(_cli(double, "replay", snaps["direct"], "--profile", "timeline", "--out", out, *sel))
    assert not out.exists()


def test_compare_refuses_a_profile_without_kernel_times(double, snaps, tmp_path):
    good = tmp_path / "a.json"
    cp = _cli(double, "replay", snaps["direct"], "--profile", "timeline", "--out", good)
    assert cp.returncode == 0, cp.stderr
    d = json.loads(good.read_text())
    d["launches"] = []
    (d.get("summary") or {}).pop("graph", None)
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps(d))
    for a, b in ((good, empty), (empty, good), (empty, empty)):
        line = _one_line_error(_cli(double, "compare", a, b))
        assert "no kernel times" in line and "empty.json" in line
    assert _cli(double, "compare", good, good).returncode == 0


# ---------------------------------------------------------------- the Python API
def test_python_replay_returns_the_cli_exit_codes(double, snaps, tmp_path):
    zero = tmp_path / "zero.cusnap"
    with SnapshotWriter(zero, {"argv": ["none"]}) as w:
        w.write({"k": "end", "exit": 0, "signal": None, "partial": False})
    code = ("import json, sys\nfrom cudasnap.replay import replay\n"
            "rs = [replay(p, **json.loads(k)) for p, k in json.loads(sys.argv[1])]\n"
            "print(json.dumps([[r.exit_code, r.placed, r.fell_back] for r in rs]))")
    cases = [(zero, {}), (tmp_path / "missing.cusnap", {}), (snaps["direct"], {"kernel_name": "nomatch"}),
             (snaps["direct"], {"dtype": "f99"}), (snaps["direct"], {}), (snaps["direct"], {"launch_count": 5})]
    cp = subprocess.run([sys.executable, "-c", code, json.dumps([(str(p), json.dumps(k)) for p, k in cases])],
                        env=double["env"], capture_output=True, text=True, timeout=180)
    assert cp.returncode == 0, cp.stderr
    rows = json.loads(cp.stdout.strip().splitlines()[-1])
    got = [r[0] for r in rows]
    # each replay gives the driver state back: the next one of the process places its memory at
    # the recorded addresses again
    assert rows[4][1] == rows[5][1] > 0 and rows[4][2] == rows[5][2] == 0, rows
    cli = [_cli(double, "replay", zero).returncode, _cli(double, "replay", tmp_path / "missing.cusnap").returncode,
           _cli(double, "replay", snaps["direct"], "-k", "nomatch").returncode]
    assert got == cli + [2, 0, 0]


def test_partial_selection_still_catches_a_real_mismatch(tmp_path):
    """Leaving work out suppresses only the comparisons it decides: a selection that keeps the
    kernel whose recorded result was tampered with still reports the mismatch."""
    from test_replay_unit import _program, _run
    p = tmp_path / "bad.cusnap"
    _program(p, tamper=True)
    res, _ = _run(p, calls="launches,memcpy", continue_on_error=True)      # every launch and copy kept
    assert res.exit_code == 1 and len(res.mismatches) == 1 and res.d2h_left_out == 0
    res, _ = _run(p, calls="memcpy", continue_on_error=True)                # the kernel left out
    assert res.exit_code == 0 and not res.mismatches and res.d2h_left_out == 1 and res.d2h_verified == 1


def test_staleness_follows_uploaded_pointer_tables():
    """A gather reads buffers through a table of device pointers the host uploaded: when the
    launch that filled a buffer is left out, the gather's output is stale too (nvcc_ptrs -s 1
    reported a false MISMATCH on an H200 before)."""
    import struct
    from cudasnap.replay.selection import StaleResults

    class Alloc:
        def __init__(self, base, size):
            self.base, self.size = base, size

    allocs = [Alloc(0x7000000000 + i * 0x100000, 0x1000) for i in range(4)]      # B0, B1, table, out
    B0, B1, T, O = allocs

    class Space:
        def find(self, v):
            return next((a for a in allocs if a.base <= v < a.base + a.size), None)

    table = struct.pack("<QQ", B0.base, B1.base)
    st = StaleResults(lambda: Space(), lambda rec: table)
    st.ran({"f": "cuMemcpyHtoD_v2", "a": {"dstDevice": T.base, "ByteCount": len(table)}})
    st.skipped({"f": "cuLaunchKernel", "a": {}, "x": {"params": struct.pack("<Qif", B0.base, 16, 1.0)}})
    assert not st.stale(O.base)
    st.ran({"f": "cuLaunchKernel", "a": {}, "x": {"params": struct.pack("<QQi", T.base, O.base, 2)}})
    assert st.stale(O.base) and st.left_out == 1
    # without the table's contents the gather would look determined
    st2 = StaleResults(lambda: Space())
    st2.skipped({"f": "cuLaunchKernel", "a": {}, "x": {"params": struct.pack("<Qif", B0.base, 16, 1.0)}})
    st2.ran({"f": "cuLaunchKernel", "a": {}, "x": {"params": struct.pack("<QQi", T.base, O.base, 2)}})
    assert not st2.stale(O.base)
