"""`cudasnap extract` end to end on the CUDA test double: a small snapshot of selected launches
whose replay verifies against what the original's replay produced."""
from __future__ import annotations

import os
import re
import struct
import subprocess
import sys

import pytest

from cudasnap.formats import SnapshotReader


def _cli(double, *args, timeout=120):
    return subprocess.run([sys.executable, "-m", "cudasnap", *args], env=double["env"], capture_output=True,
                          text=True, timeout=timeout)


def _calls(path):
    return [r for r in SnapshotReader(path).records() if r["k"] == "c"]


def _extract_and_replay(double, snap, out, *sel):
    ex = _cli(double, "extract", str(snap), "-o", str(out), *sel)
    assert ex.returncode == 0, ex.stdout + ex.stderr
    rp = _cli(double, "replay", str(out))
    assert rp.returncode == 0, rp.stdout + rp.stderr
    assert "OK: every recorded D2H result reproduced" in rp.stdout
    return ex, rp


def test_one_launch_restores_its_input_and_expects_its_output(double, capture, tmp_path):
    cp, snap = capture(double["progs"]["direct"])
    assert cp.returncode == 0
    calls = _calls(snap)
    launches = [c for c in calls if c["f"] == "cuLaunchKernel"]
    assert len(launches) == 10
    ex, _ = _extract_and_replay(double, snap, tmp_path / "x.cusnap", "--launch", str(launches[4]["s"]))
    assert "% of" in ex.stdout and " s\n" in ex.stdout.splitlines()[0] + "\n"
    r = SnapshotReader(tmp_path / "x.cusnap")
    xc = [c for c in r.records() if c["k"] == "c"]
    assert [c["f"] for c in xc if c["f"].startswith("cuLaunch")] == ["cuLaunchKernel"]
    assert [c.get("os") for c in xc if c["f"].startswith("cuLaunch")] == [launches[4]["s"]]
    h2d = [c for c in xc if c["f"] == "cuMemcpyHtoD_v2"]
    d2h = [c for c in xc if c["f"] == "cuMemcpyDtoH_v2"]
    assert len(h2d) == 1 and len(d2h) == 1
    before = struct.unpack("<1024f", r.blob(h2d[0]["x"]["srcHost"]["blob"]))
    after = struct.unpack("<1024f", r.blob(d2h[0]["x"]["dstHost"]["blob"]))
    assert before[:3] == (4.0, 5.0, 6.0)          # i + the four add_one launches before it
    assert after[:3] == (5.0, 6.0, 7.0)
    # the last launch's expected result is what the program itself read back
    ex, _ = _extract_and_replay(double, snap, tmp_path / "last.cusnap", "--launch", str(launches[-1]["s"]))
    r2 = SnapshotReader(tmp_path / "last.cusnap")
    got = [c for c in r2.records() if c["k"] == "c" and c["f"] == "cuMemcpyDtoH_v2"][0]
    orig = [c for c in calls if c["f"] == "cuMemcpyDtoH_v2"][0]
    assert r2.blob(got["x"]["dstHost"]["blob"]) == SnapshotReader(snap).blob(orig["x"]["dstHost"]["blob"])


def test_pointer_scanning_restores_what_a_pointer_table_reaches(double, capture, tmp_path):
    cp, snap = capture(double["progs"]["chase"])
    assert cp.returncode == 0
    ex, _ = _extract_and_replay(double, snap, tmp_path / "x.cusnap", "--kernel", "chase")
    assert "memory restored: 10 range(s)" in ex.stdout and "next tensor start" in ex.stdout
    ex, _ = _extract_and_replay(double, snap, tmp_path / "seg.cusnap", "--kernel", "chase", "--ranges", "segment")
    assert "memory restored: 10 range(s)" in ex.stdout and "pointer scanning" in ex.stdout
    ex, _ = _extract_and_replay(double, snap, tmp_path / "all.cusnap", "--kernel", "chase", "--memory", "all")
    assert "every live allocation" in ex.stdout


def test_kernel_occurrence_leaves_out_unneeded_modules(double, capture, tmp_path):
    cp, snap = capture(double["progs"]["launch_forms"])
    assert cp.returncode == 0
    ex, _ = _extract_and_replay(double, snap, tmp_path / "x.cusnap", "--kernel", "add_one#3")
    assert re.search(r"module loads kept 1 \(\d+ B\), left out 1", ex.stdout), ex.stdout
    xc = [c["f"] for c in _calls(tmp_path / "x.cusnap")]
    assert "cuLibraryLoadData" in xc and "cuModuleLoadData" not in xc
    _extract_and_replay(double, snap, tmp_path / "s.cusnap", "--kernel", "sax")
    launches = [c for c in _calls(snap) if c["f"].startswith("cuLaunch")]
    ex, _ = _extract_and_replay(double, snap, tmp_path / "r.cusnap", "--calls",
                                f"{launches[0]['s']}-{launches[-1]['s']}")
    assert re.search(r"module loads kept 2 \(\d+ B\), left out 0", ex.stdout), ex.stdout


def test_extract_refuses_what_it_cannot_find(double, capture, tmp_path):
    cp, snap = capture(double["progs"]["direct"])
    assert cp.returncode == 0
    ex = _cli(double, "extract", str(snap), "-o", str(tmp_path / "x.cusnap"), "--kernel", "add_one#11")
    assert ex.returncode == 2 and "10 found" in ex.stderr
    ex = _cli(double, "extract", str(snap), "-o", str(tmp_path / "x.cusnap"), "--launch", "1", "--kernel", "a")
    assert ex.returncode == 2 and "exactly one of" in ex.stderr
    ex = _cli(double, "extract", str(snap), "-o", str(tmp_path / "x.cusnap"), "--launch", "0")
    assert ex.returncode == 2 and ex.stderr.count("\n") == 1 and "call #0 is cuInit, not a kernel or graph launch" \
        in ex.stderr, ex.stderr
    assert not (tmp_path / "x.cusnap").exists()
    # a launch captured into a graph that no recorded call launches (the graph launches cut out)
    cp, src = capture(double["progs"]["launch_forms"])
    sys.path.insert(0, os.path.dirname(__file__))
    from snapedit import rewrite
    snap = tmp_path / "unlaunched.cusnap"
    rewrite(src, snap, reorder=lambda recs: [r for r in recs if not str(r.get("f", "")).startswith("cuGraphLaunch")])
    captured = [c for c in _calls(snap) if c["f"] == "cuLaunchKernel" and c["a"].get("hStream")][0]
    ex = _cli(double, "extract", str(snap), "-o", str(tmp_path / "x.cusnap"), "--launch", str(captured["s"]))
    assert ex.returncode == 2 and "is captured into a graph that no recorded launch runs" in ex.stderr, ex.stderr
    assert not (tmp_path / "x.cusnap").exists()


TB = 64 << 10          # carve.c: 8 tensors of 64 KiB carved out of one allocation


def _h2d_d2h(path):
    xc = _calls(path)
    return ([(c["a"]["dstDevice"], c["a"]["ByteCount"]) for c in xc if c["f"] == "cuMemcpyHtoD_v2"],
            [(c["a"]["srcDevice"], c["a"]["ByteCount"]) for c in xc if c["f"] == "cuMemcpyDtoH_v2"])


def _carve_base(snap):
    return [c for c in _calls(snap) if c["f"] == "cuMemAlloc_v2"][0]["a"]["dptr"]


def test_exact_ranges_restore_only_the_tensors_a_kernel_uses(double, capture, tmp_path):
    cp, snap = capture(double["progs"]["carve"])
    assert cp.returncode == 0 and "CARVE OK" in cp.stdout, cp.stdout + cp.stderr
    big = _carve_base(snap)
    t = [big + k * TB for k in range(8)]
    # saxpy(2, x=T[2], y=T[6]): only those two tensors, from each pointer to the next tensor start
    out = tmp_path / "x.cusnap"
    ex, rp = _extract_and_replay(double, snap, out, "--kernel", "saxpy", "--check")
    assert "check: replay of" in ex.stdout and "verified" in ex.stdout
    h2d, d2h = _h2d_d2h(out)
    assert h2d == [(t[2], TB), (t[6], TB)]
    assert d2h == [(t[2], TB), (t[6], TB)]
    assert f"restored bytes: {2 * TB} of the {8 * TB} in the 1 allocation(s) they lie in (25.0%)" in ex.stdout
    r = SnapshotReader(out)
    y = [c for c in r.records() if c["k"] == "c" and c["f"] == "cuMemcpyDtoH_v2"][1]
    got = struct.unpack(f"<{TB // 4}f", r.blob(y["x"]["dstHost"]["blob"]))
    assert got[:3] == (2.0 * 2000 + 6000, 2.0 * 2001 + 6001, 2.0 * 2002 + 6002)
    # the old behaviour: the whole allocation
    seg = tmp_path / "seg.cusnap"
    ex, _ = _extract_and_replay(double, snap, seg, "--kernel", "saxpy", "--ranges", "segment")
    assert _h2d_d2h(seg) == ([(big, 8 * TB)], [(big, 8 * TB)])
    assert "pointer scanning" in ex.stdout
    assert out.stat().st_size < seg.stat().st_size


def test_exact_ranges_cover_writes_beyond_them_and_check_refuses_reads_beyond(double, capture, tmp_path):
    cp, snap = capture(double["progs"]["carve"])
    assert cp.returncode == 0
    big = _carve_base(snap)
    t = [big + k * TB for k in range(8)]
    # add_one(T[5]) alone: its range ends at T[6]
    ex, _ = _extract_and_replay(double, snap, tmp_path / "a.cusnap", "--kernel", "add_one#2")
    assert _h2d_d2h(tmp_path / "a.cusnap") == ([(t[5], TB)], [(t[5], TB)])
    # saxpy(3, x=T[1], y=T[4], n = two tensors): it writes T[5] too (found by comparing the
    # allocation before and after, so restored and verified), but reads T[2] unseen: the
    # extract does not verify, and --check says so and names --ranges segment
    out = tmp_path / "b.cusnap"
    ex = _cli(double, "extract", str(snap), "-o", str(out), "--kernel", "saxpy#2", "--ranges", "exact", "--check")
    assert ex.returncode == 1, ex.stdout + ex.stderr
    assert f"written beyond the ranges: {TB} B" in ex.stdout
    h2d, d2h = _h2d_d2h(out)
    assert h2d == [(t[1], TB), (t[4], 2 * TB)] and d2h == h2d
    err = ex.stderr.strip().splitlines()
    assert len(err) == 1 and "does not verify" in err[0] and "DIFFERENT:" in err[0] and "--ranges segment" in err[0]
    rp = _cli(double, "replay", str(out))
    assert rp.returncode == 1
    _extract_and_replay(double, snap, tmp_path / "s.cusnap", "--kernel", "saxpy#2", "--ranges", "segment", "--check")
    # without --ranges, --check extracts again with whole allocations when exact ranges do not verify
    d = tmp_path / "d.cusnap"
    ex = _cli(double, "extract", str(snap), "-o", str(d), "--kernel", "saxpy#2", "--check")
    assert ex.returncode == 0 and "extracting again with --ranges segment" in ex.stdout, ex.stdout + ex.stderr
    assert ex.stdout.rstrip().splitlines()[-1].strip().startswith("check: replay of") and "verified" in ex.stdout
    # with no host memory to compare allocations, the ranges are kept as they are, and the summary says so
    env = {**double["env"], "CUDASNAP_EXTRACT_DIFF_BYTES": "0"}
    ex = subprocess.run([sys.executable, "-m", "cudasnap", "extract", str(snap), "-o", str(tmp_path / "n.cusnap"),
                         "--kernel", "saxpy", "--check"], env=env, capture_output=True, text=True, timeout=120)
    assert ex.returncode == 0 and "1 allocation(s) not compared" in ex.stdout, ex.stdout + ex.stderr
    assert _h2d_d2h(tmp_path / "n.cusnap") == ([(t[2], TB), (t[6], TB)], [(t[2], TB), (t[6], TB)])


def test_boundaries_and_extents_without_a_gpu():
    from cudasnap.export import ranges as R
    b = R.Boundaries.of({0x10000: [1], 0x18000: [2], 0x30000: [3]})
    seg = (0x10000, 0x40000)
    assert R.extent(0x10000, 0, seg, b) == (0x10000, 0x18000)
    assert R.extent(0x10000, 0x9000, seg, b) == (0x10000, 0x19000)      # a copy's length wins
    assert R.extent(0x30000, 0, seg, b) == (0x30000, 0x40000)           # no later start: the end
    assert R.extent(0x31000, 0x20000, seg, b) == (0x31000, 0x40000)     # capped by the allocation
    live = [(0x10000, 0x30000, "placed")]
    find = lambda a: 0 if 0x10000 <= a < 0x40000 else None         # noqa: E731
    # a pointer with flag bits in its low bits (or a 4-byte offset view) reaches from its granule
    assert R.plan([(0x18001, 0), (0x10004, 0), (0x50000, 0)], live, b, find) == {0: [(0x10000, 0x30000)]}
    # a start counts only if a call names it while the pointer's tensor is live: from the
    # pointer's last use before the selection (call 10) to the selection's end
    b2 = R.Boundaries.of({0x10000: [5, 10], 0x14000: [2], 0x30000: [7], 0x38000: [12]})
    assert b2.window(0x10000, 10, 10) == (5, 10)
    assert R.plan([(0x10000, 0)], live, b2, find, (10, 10)) == {0: [(0x10000, 0x30000)]}
    assert R.plan([(0x10000, 0)], live, b2, find) == {0: [(0x10000, 0x14000)]}
    # first named by the selection: live until its next use
    b3 = R.Boundaries.of({0x10000: [10, 20], 0x18000: [15], 0x20000: [25]})
    assert b3.window(0x10000, 10, 10) == (10, 20)
    assert R.plan([(0x10000, 0)], live, b3, find, (10, 10)) == {0: [(0x10000, 0x18000)]}
    assert R.merge([(5, 9), (1, 3), (3, 4)]) == [(1, 4), (5, 9)]
    assert R.subtract([(0, 100)], [(10, 20), (50, 120)]) == [(0, 10), (20, 50)]
    before, after = bytes(10000), bytearray(10000)
    after[5] = after[7000] = after[9999] = 1
    assert R.written(before, bytes(after), 0x1000) == [(0x1005, 0x1006), (0x1000 + 7000, 0x1000 + 10000)]
    # a TMA descriptor: the encoded map found in a launch's parameters reaches its whole tensor
    dims = (64).to_bytes(8, "little") + (32).to_bytes(8, "little")
    tm = R.tensor_map_extent({"tensorMap": b"\x07" * 128, "globalAddress": 0x20000, "tensorRank": 2,
                              "tensorDataType": 7, "globalDim": dims, "globalStrides": (512).to_bytes(8, "little")})
    assert tm == (b"\x07" * 128, 0x20000, 64 * 4 + 31 * 512)
    b.tensor_maps = [tm]
    roots = b.roots_of({"f": "cuLaunchKernel", "x": {"params": b"\0" * 8 + b"\x07" * 128}})
    assert (0x20000, 64 * 4 + 31 * 512) in roots


def test_check_widens_what_the_user_left_to_the_defaults(double, capture, tmp_path):
    """tagged_read reads through a pointer its parameters encode: exact ranges, whole allocations
    and pointer scanning all miss it. --check widens one step at a time to every live allocation,
    and says so; with --memory given, it keeps the user's choice and names the next step."""
    cp, snap = capture(double["progs"]["tagged"])
    assert cp.returncode == 0, cp.stderr
    ex = _cli(double, "extract", str(snap), "-o", str(tmp_path / "x.cusnap"), "--kernel", "tagged_read", "--check")
    assert ex.returncode == 0, ex.stdout + ex.stderr
    assert "extracting again with --ranges segment" in ex.stdout
    assert "extracting again with --memory all" in ex.stdout
    assert "memory restored" in ex.stdout and "every live allocation" in ex.stdout
    assert ex.stdout.rstrip().splitlines()[-1].startswith("  check: replay of") and "verified" in ex.stdout.splitlines()[-1]
    rp = _cli(double, "replay", str(tmp_path / "x.cusnap"))
    assert rp.returncode == 0 and "OK: every recorded D2H result reproduced" in rp.stdout
    ex = _cli(double, "extract", str(snap), "-o", str(tmp_path / "y.cusnap"), "--kernel", "tagged_read",
              "--memory", "reachable", "--ranges", "segment", "--check")
    assert ex.returncode == 1 and "--memory all" in ex.stderr, ex.stdout + ex.stderr
    assert "extracting again" not in ex.stdout


def test_graph_launch_keeps_kernels_captured_through_launch_kernel_ex(double, capture, tmp_path):
    """cuLaunchKernelEx names its stream inside the launch configuration: a capture's kernels
    launched that way are graph nodes too, kept with the graph's building (else the extracted
    graph would miss them and its result would not verify)."""
    cp, snap = capture(double["progs"]["capex"])
    assert cp.returncode == 0, cp.stderr
    glaunch = [c["s"] for c in _calls(snap) if c["f"] == "cuGraphLaunch"]
    assert len(glaunch) == 3
    ex = _cli(double, "extract", str(snap), "-o", str(tmp_path / "g.cusnap"), "--launch", str(glaunch[1]),
              "--ranges", "segment", "--memory", "reachable", "--check")
    assert ex.returncode == 0, ex.stdout + ex.stderr
    xc = [c["f"] for c in _calls(tmp_path / "g.cusnap")]
    assert "cuLaunchKernelEx" in xc and "cuLaunchKernel" in xc


def test_extract_of_a_small_launch_keeps_only_what_it_reads(double, capture, tmp_path):
    """manymods: 8 modules (one a fatbin for four architectures), 4 MiB of unrelated buffers, a
    VMM mapping, a pointer table, two streams and an event; one small add_one. Its extract keeps the kernel's
    module (SASS for the recorded GPU only), its 4 KiB buffer, its stream, and no unrelated
    allocation, function lookup, stream or event; it verifies."""
    from cudasnap.replay.retarget import analyze
    cp, snap = capture(double["progs"]["manymods"])
    assert cp.returncode == 0 and "MANYMODS OK" in cp.stdout, cp.stdout + cp.stderr
    out, whole = tmp_path / "x.cusnap", tmp_path / "all.cusnap"
    ex = _cli(double, "extract", str(snap), "-o", str(out), "--kernel", "add_one#10", "--check")
    assert ex.returncode == 0 and "verified" in ex.stdout.splitlines()[-1], ex.stdout + ex.stderr
    assert "SASS for sm_75, sm_80, sm_100 left out" in ex.stdout
    assert "9 allocation(s) the selection cannot reach" in ex.stdout and "3 function lookup(s)" in ex.stdout
    assert "2 stream(s) and event(s) no kept call names" in ex.stdout
    share = out.stat().st_size / snap.stat().st_size
    assert share < 0.01, f"{out.stat().st_size} B = {100 * share:.2f}% of the snapshot"
    r = SnapshotReader(out)
    xc = [c for c in r.records() if c["k"] == "c"]
    loads = [c for c in xc if c["f"].startswith("cuModuleLoad")]
    assert len(loads) == 1
    img = r.blob(loads[0]["x"]["image"]["blob"])
    assert analyze(img).sass == [90] and loads[0]["x"]["image"]["size"] == len(img)
    assert [c["a"]["bytesize"] for c in xc if c["f"] == "cuMemAlloc_v2"] == [4096]
    assert [c["a"]["name"] for c in xc if c["f"] == "cuModuleGetFunction"] == ["add_one"]
    assert [f["name"] for f in r.records(("fn",))] == ["add_one"]
    assert [c["f"] for c in xc if c["f"].startswith(("cuStream", "cuEvent"))] == ["cuStreamCreate"]   # the launch's
    assert [c["f"] for c in xc if c["f"].startswith("cuMem") and "cpy" not in c["f"]] == [
        "cuMemAddressReserve", "cuMemAlloc_v2"]        # the VMM mapping's memory is left out, its reservation stays
    # every architecture's SASS on request; it verifies too
    ex = _cli(double, "extract", str(snap), "-o", str(whole), "--kernel", "add_one#10", "--sass", "all", "--check")
    assert ex.returncode == 0 and "left out (" not in ex.stdout, ex.stdout + ex.stderr
    load = [c for c in _calls(whole) if c["f"] == "cuModuleLoadData"][0]
    img = SnapshotReader(whole).blob(load["x"]["image"]["blob"])
    assert analyze(img).sass == [75, 80, 90, 100]
    assert out.stat().st_size * 2 < whole.stat().st_size
    # the launch on the VMM mapping keeps it
    ex, _ = _extract_and_replay(double, snap, tmp_path / "v.cusnap", "--kernel", "add_one#9")
    assert {"cuMemCreate", "cuMemMap", "cuMemSetAccess"} <= {c["f"] for c in _calls(tmp_path / "v.cusnap")}
    # a launch through a pointer table keeps the table's targets
    ex, _ = _extract_and_replay(double, snap, tmp_path / "c.cusnap", "--kernel", "chase")
    assert "memory restored: 4 range(s), 8224 B" in ex.stdout


def test_thin_keeps_the_recorded_architecture_and_ptx():
    import struct as st
    from cudasnap.export.thinimage import thin

    def entry(kind, arch, payload):
        payload += b"\0" * (-len(payload) % 8)
        h = bytearray(64)
        st.pack_into("<HHIQ", h, 0, kind, 0, 64, len(payload))
        st.pack_into("<I", h, 28, arch)
        return bytes(h) + payload

    def fatbin(*entries):
        body = b"".join(entries)
        return st.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body

    ptx, s80 = entry(1, 80, b".version 8.0"), entry(2, 80, b"A" * 40)
    s90, s90b = entry(2, 90, b"B" * 24), entry(2, 90, b"C")
    img = fatbin(s80, ptx, s90) + fatbin(s80, s90b)
    got, dropped = thin(img, [(9, 0)])
    assert got == fatbin(ptx, s90) + fatbin(s90b) and dropped == [80]
    assert thin(img, [(8, 6), (9, 0)]) is None                 # every architecture recorded: as it was
    assert thin(fatbin(s80), [(9, 0)]) is None                 # nothing for the recorded GPU: kept whole
    assert thin(fatbin(s80, entry(7, 90, b"?")), [(9, 0)]) is None     # an entry not understood
    assert thin(b"\x7fELF" + bytes(60), [(9, 0)]) is None and thin(img, []) is None


def test_a_texture_over_linear_memory_keeps_that_memory(double, capture, tmp_path):
    """tex_fetch's parameters hold a texture object, not a pointer: the memory its resource
    description names is restored (exact ranges and whole allocations alike)."""
    cp, snap = capture(double["progs"]["texture"])
    assert cp.returncode == 0, cp.stderr
    for ranges in ("exact", "segment"):
        ex = _cli(double, "extract", str(snap), "-o", str(tmp_path / f"{ranges}.cusnap"), "--kernel", "tex_fetch#2",
                  "--ranges", ranges, "--check")
        assert ex.returncode == 0 and "memory restored: 2 range(s), 512 B" in ex.stdout, ex.stdout + ex.stderr


def test_a_texture_over_an_array_gets_the_array_back(double, capture, tmp_path):
    """tex_fetch#1 reads a texture over a CUDA array, outside device memory: the extract restores
    the live arrays whole (a cuMemcpy3D before the selection) and verifies at the first pass; a
    range of array copies and surface writes does too."""
    cp, snap = capture(double["progs"]["texture"])
    assert cp.returncode == 0, cp.stderr
    calls = _calls(snap)
    surf = next(c["s"] for c in calls if c["f"] == "cuLaunchKernel" and c["s"] > next(
        d["s"] for d in calls if d["f"] == "cuSurfObjectCreate"))
    last_copy = max(c["s"] for c in calls if c["f"].startswith("cuMemcpy"))
    for i, how in enumerate((["--kernel", "tex_fetch#1"], ["--calls", f"{surf + 1}-{last_copy}"])):
        out = tmp_path / f"a{i}.cusnap"
        ex = _cli(double, "extract", str(snap), "-o", str(out), *how, "--check")
        assert ex.returncode == 0 and "verified" in ex.stdout and "extracting again" not in ex.stdout, \
            ex.stdout + ex.stderr
        assert "2 CUDA array(s) restored whole (512 B)" in ex.stdout, ex.stdout
        assert [c["f"] for c in _calls(out)].count("cuMemcpy3D_v2") >= 2


def test_texture_objects_are_given_back_between_replays_in_one_process(double, capture, tmp_path):
    """Kernels take a texture object's recorded value from their parameters: a second replay in
    the same process gets the same values only once the first replay's objects are destroyed
    (Replayer.close). An extract keeps its objects alive to its end, as a partial replay does."""
    cp, src = capture(double["progs"]["texture"])
    assert cp.returncode == 0, cp.stderr
    snap = tmp_path / "tex1.cusnap"
    ex = _cli(double, "extract", str(src), "-o", str(snap), "--kernel", "tex_fetch#1")
    assert ex.returncode == 0, ex.stdout + ex.stderr
    assert not any(c["f"] == "cuTexObjectDestroy" for c in _calls(snap))
    code = (f"from cudasnap.replay import replay\n"
            f"codes = [replay({str(snap)!r}, quiet=True).exit_code for _ in range(2)]\n"
            f"print(codes)\n")
    rp = subprocess.run([sys.executable, "-c", code], env=double["env"], capture_output=True, text=True, timeout=120)
    assert rp.returncode == 0 and rp.stdout.strip().splitlines()[-1] == "[0, 0]", rp.stdout + rp.stderr


@pytest.mark.parametrize("how", ["--kernel", "--launch"])
def test_a_kernel_captured_into_a_graph_extracts_the_graph_launch_that_runs_it(double, capture, tmp_path, how):
    """capwin's incr launches are captured into a graph (as PyTorch's CUDA graphs and JAX's
    command buffers hold their kernels): naming one extracts the first launch of that graph,
    says so, and verifies."""
    cp, snap = capture(double["progs"]["capwin"])
    assert cp.returncode == 0, cp.stderr
    calls = _calls(snap)
    begin = next(c["s"] for c in calls if c["f"].startswith("cuStreamBeginCapture"))
    captured = next(c["s"] for c in calls if c["s"] > begin and c["f"] == "cuLaunchKernel")
    graph_launch = next(c["s"] for c in calls if c["s"] > captured and c["f"].startswith("cuGraphLaunch"))
    out = tmp_path / "g.cusnap"
    ex = _cli(double, "extract", str(snap), "-o", str(out), how, "incr#1" if how == "--kernel" else str(captured),
              "--check")
    assert ex.returncode == 0 and "verified" in ex.stdout, ex.stdout + ex.stderr
    assert f"launch #{captured} of incr was captured into a graph: extracting graph launch #{graph_launch}" in ex.stdout
    assert [c.get("os") for c in _calls(out) if c["f"].startswith("cuGraphLaunch")] == [graph_launch]


def test_page_locked_host_memory_stays_only_where_the_launch_reaches_it(double, capture, tmp_path):
    """hostfree's first add_one reads mapped host memory through its parameter: that allocation
    stays; unified's first add_one never touches its pinned buffer: it is left out."""
    for prog, kept in (("hostfree", ["cuMemHostAlloc"]), ("unified", [])):
        cp, snap = capture(double["progs"][prog])
        assert cp.returncode == 0, cp.stderr
        first = [c["s"] for c in _calls(snap) if c["f"] == "cuLaunchKernel"][0]
        out = tmp_path / f"{prog}.x.cusnap"
        ex = _cli(double, "extract", str(snap), "-o", str(out), "--launch", str(first), "--check")
        assert ex.returncode == 0 and "verified" in ex.stdout.splitlines()[-1], ex.stdout + ex.stderr
        assert [c["f"] for c in _calls(out) if c["f"].startswith(("cuMemHostAlloc", "cuMemAllocHost"))] == kept


def test_vmm_mappings_nothing_reaches_go_with_their_memory():
    """A mapping nothing reaches goes with its access setting, unmap, create and release; one
    access setting over a kept and an unreached mapping keeps both; a handle another kept call
    names keeps its mappings."""
    from cudasnap.export.extract import ExtractResult
    from cudasnap.export.extract_prune import Pruner, reached

    def call(s, f, **a):
        return {"k": "c", "s": s, "f": f, "a": a, "r": 0}

    def run(vmm, ints=()):
        return sorted(Pruner(ExtractResult("x"), None).unreached_mappings(
            vmm, lambda lo, hi: reached([0x2000], [], lo, hi), set(ints)))

    A, B, M = 0x1000, 0x2000, 0x1000          # A: nothing points there; B: a pointer does
    base = [call(1, "cuMemCreate", handle=7, size=M), call(2, "cuMemMap", ptr=A, size=M, offset=0, handle=7),
            call(3, "cuMemCreate", handle=8, size=M), call(4, "cuMemMap", ptr=B, size=M, offset=0, handle=8)]
    apart = [call(5, "cuMemSetAccess", ptr=A, size=M), call(6, "cuMemSetAccess", ptr=B, size=M),
             call(7, "cuMemUnmap", ptr=A, size=M), call(8, "cuMemRelease", handle=7)]
    assert run(base + apart) == [1, 2, 5, 7, 8]
    assert run(base + [call(5, "cuMemSetAccess", ptr=A, size=2 * M)]) == []
    assert run(base + apart, ints=[7]) == []


def test_a_hang_before_the_selection_ends_at_the_watchdog_leaving_nothing(double, tmp_path):
    """A kernel that does not return within --watchdog in the replay up to the selection: exit 2,
    the call named, no extract and no temporary file left (the watchdog ends the process at once)."""
    from synth import write_double_program

    def spin_then_add(s, facts):
        s.call("cuModuleGetFunction", {"hfunc": 0x66660001, "hmod": 0x55560000, "name": "spin"})
        s.fn(0x66660001, "spin", 0x55560000, [[0, 4]])
        s.launch(0x66660001, struct.pack("<i", 5000))
        s.launch(0x55570001, struct.pack("<Qi", facts["A"], 64), block=64)

    d = tmp_path / "w"
    d.mkdir()
    snap = d / "hang.cusnap"
    write_double_program(snap, extra_calls=[spin_then_add])
    out = d / "x.cusnap"
    cp = _cli(double, "extract", snap, "--kernel", "add_one#2", "-o", out, "--check", "--watchdog", "0.5")
    assert cp.returncode == 2, cp.stdout + cp.stderr
    assert "watchdog" in cp.stderr and "cuLaunchKernel" in cp.stderr, cp.stderr
    assert sorted(p.name for p in d.iterdir()) == ["hang.cusnap"]
