"""cudasnap advise on the CUDA test double: findings from a timeline profile alone, what-ifs
measured by replays (a launch-bound stretch as a CUDA graph, a rebuilt kernel), bad input."""
from __future__ import annotations

import json
import struct
import subprocess
import sys

import pytest

from synth import Synth

CTX, MOD = 0x55550000, 0x55560000
F_INCR, F_SPIN, F_SAXPY = 0x55570005, 0x55570006, 0x55570007
D, M, X, Y = 0x200000000000, 0x200000001000, 0x200000002000, 0x200000003000
HOST_GAP_NS = 100_000_000


def _nvtx(s: Synth, op: str, name: str) -> None:
    s.t += 1000                                 # after the last call returned
    s.w.write({"k": "nvtx", "op": op, "tid": 100, "t": s.t, "name": name, "domain": None, "id": 0})


def launch_bound_program(path, n=16, tiny=24):
    """Two NVTX steps of `tiny` incr launches, each followed by a small memset of M, with a
    100 ms host gap between the steps; a 2 ms spin first (the heavy kernel) and a hand-written
    saxpy at the end of step 1 (the library candidate). D2H: D = 2 * tiny, Y = 2 * 1 + 1."""
    s = Synth(path)
    s.double_prologue("incr", F_INCR, [[0, 8], [8, 4]], CTX, MOD)
    for h, name, layout in ((F_SPIN, "spin", [[0, 4]]), (F_SAXPY, "saxpy", [[0, 4], [8, 8], [16, 8], [24, 4]])):
        s.call("cuModuleGetFunction", {"hfunc": h, "hmod": MOD, "name": name})
        s.fn(h, name, MOD, layout)
    for p, data in ((D, bytes(n * 4)), (M, bytes(n * 4)), (X, struct.pack(f"<{n}f", *[1.0] * n)),
                    (Y, struct.pack(f"<{n}f", *[1.0] * n))):
        s.call("cuMemAlloc_v2", {"dptr": p, "bytesize": n * 4})
        s.call("cuMemcpyHtoD_v2", {"dstDevice": p, "srcHost": 0x7F0000100000, "ByteCount": n * 4},
               x={"srcHost": s.blob(data)})
    seqs = {}
    for step in (1, 2):
        if step == 2:
            s.t += HOST_GAP_NS                   # the host away between the steps
        _nvtx(s, "push", f"step {step}")
        if step == 1:
            s.launch(F_SPIN, struct.pack("<i", 2))
        first = None
        for _ in range(tiny):
            r = s.launch(F_INCR, struct.pack("<Qi", D, n), block=n)
            first = first or r["s"]
            s.call("cuMemsetD32Async", {"dstDevice": M, "ui": 7, "N": n, "hStream": 0})
        if step == 1:
            s.launch(F_SAXPY, struct.pack("<f4xQQi", 2.0, X, Y, n), block=n)
        seqs[step] = (first, s.seq)
        _nvtx(s, "pop", f"step {step}")
    s.expect_d2h(D, [2 * tiny] * n)
    s.call("cuMemcpyDtoH_v2", {"dstHost": 0x7F0000200000, "srcDevice": Y, "ByteCount": 4 * n},
           x={"dstHost": s.blob(struct.pack(f"<{n}f", *[3.0] * n))})
    s.double_epilogue(frees=[D, M, X, Y])
    return seqs


def _cli(double, *args, timeout=120):
    env = dict(double["env"])
    env.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    return subprocess.run([sys.executable, "-m", "cudasnap", *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def snap(tmp_path_factory):
    p = tmp_path_factory.mktemp("advise") / "lb.cusnap"
    return p, launch_bound_program(p)


def test_a_launch_bound_program_gets_a_graph_what_if_measured_by_a_replay(double, snap, tmp_path):
    path, seqs = snap
    out, html = tmp_path / "a.json", tmp_path / "a.html"
    cp = _cli(double, "advise", path, "--out", out, "--html", html, "--repeat", "3", "--warmup", "1")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    res = json.loads(out.read_text())
    assert res["profile"]["taken"]["pace"] == "recorded" and res["profile"]["taken"]["exit_code"] == 0
    fs = res["findings"]
    assert [f["at_stake_us"] for f in fs] == sorted((f["at_stake_us"] for f in fs), reverse=True)
    kinds = {f["kind"] for f in fs}
    assert {"launch-bound", "host-gap", "heavy-kernel", "library", "small-transfers"} <= kinds, kinds
    lb = [f for f in fs if f["kind"] == "launch-bound"]
    # the incr loops of both steps; never across the host gap (a loaded host may split a step
    # where it preempted a kernel)
    assert sum(f["evidence"]["kernels"] for f in lb) >= 40, [f["evidence"] for f in lb]
    assert not [f for f in lb if f["evidence"]["first_seq"] < seqs[2][0] <= f["evidence"]["last_seq"]]
    for f in lb:
        e = f["evidence"]
        assert e["idle_pct"] >= 25 and e["holds"]["syncs"] == 0 and e["holds"]["launches"] == e["kernels"]
        w = f["what_if"]
        if not w["measured"]:
            assert "--graphs" in w["why"] and len(lb) > 3
            continue
        # measured by `replay --profile graph --calls A-B`: its exit code and graph times are there
        assert w["replay"]["exit_code"] == 0, w
        assert w["replay"]["command"][:4] == ["cudasnap", "replay", str(path), "--profile"]
        assert f"{e['first_seq']}-{e['last_seq']}" in w["replay"]["command"]
        assert len(w["graph_times_us"]) == 3 and w["graph_us"] > 0 and w["launches"] == e["kernels"]
        assert w["memsets"] >= e["kernels"] - 2 and w["timeline_span_us"] == e["span_us"]
        # the baseline is the stretch as the program ran it (its recorded calls), not the replay's pace
        assert w["baseline_us"] == e["holds"]["recorded_span_us"] and "recorded" in w["baseline"]
        assert w["gain_us"] == pytest.approx(w["baseline_us"] - w["graph_us"], abs=1e-2)
        assert f["at_stake_us"] == pytest.approx(max(w["gain_us"], 0), abs=1e-2) and f["basis"].startswith("measured")
    gap = next(f for f in fs if f["kind"] == "host-gap")
    big = gap["evidence"]["largest"][0]
    # --pace recorded: the replay waits until the step is due (less what it ran late before)
    assert big["gap_us"] >= HOST_GAP_NS / 1e3 / 4 and big["before_seq"] == seqs[2][0]
    assert big["nvtx"] == ["step 1", "step 2"]     # between the steps, named by the recording's ranges
    heavy = next(f for f in fs if f["kind"] == "heavy-kernel")
    assert heavy["kernel"] == "spin" and heavy["evidence"]["total_us"] >= 1900
    lib = next(f for f in fs if f["kind"] == "library")
    assert lib["kernel"] == "saxpy" and "cuBLAS" in lib["evidence"]["library"]
    small = next(f for f in fs if f["kind"] == "small-transfers")
    assert small["evidence"]["count"] == 48 and small["evidence"]["bytes"] == [64]
    assert "launch-bound stretch" in cp.stdout and "what-if: as a CUDA graph" in cp.stdout and "graph replay exit 0" in cp.stdout
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "Plotly.newPlot" in page and "launch-bound stretch" in page
    assert "<script src=" not in page           # plotly.js embedded: the page stands alone
    from test_reports_render import check_rendered
    seen = check_rendered(html, tmp_path)         # drawn by a browser: the bars are on screen
    assert len(seen["charts"]) == 1 and len(seen["charts"][0]["marks"]) == len(fs)


def test_a_profile_alone_gives_findings_and_says_why_no_what_if(double, snap, tmp_path):
    path, _ = snap
    prof = tmp_path / "p.json"
    cp = _cli(double, "replay", path, "--profile", "timeline", "--pace", "recorded", "--out", prof, "-q")
    assert cp.returncode == 0, cp.stderr
    cp = _cli(double, "advise", prof, "--json", "--graphs", "1", "--repeat", "2", "--warmup", "0")
    assert cp.returncode == 0, cp.stderr
    res = json.loads(cp.stdout)                 # the snapshot the profile names is there: measured
    assert res["what_ifs"]["run"] is True and res["snapshot"] == str(path.resolve())
    assert any((f.get("what_if") or {}).get("measured") for f in res["findings"] if f["kind"] == "launch-bound")
    p = json.loads(prof.read_text())
    p["run"]["snapshot"] = p["snapshot"] = str(tmp_path / "moved.cusnap")
    prof.write_text(json.dumps(p))
    cp = _cli(double, "advise", prof, "--json")
    assert cp.returncode == 0, cp.stderr
    res = json.loads(cp.stdout)
    w = res["what_ifs"]
    assert w["run"] is False and "moved.cusnap is not there" in w["why_not"]
    lb = [f for f in res["findings"] if f["kind"] == "launch-bound"]
    assert len(lb) >= 1 and all(f["what_if"]["measured"] is False for f in lb)
    assert all(f["basis"].startswith("estimate") for f in lb)
    # no trace: the memsets come from nowhere, the rest from the timeline alone
    assert {"host-gap", "heavy-kernel", "library"} <= {f["kind"] for f in res["findings"]}
    cp = _cli(double, "advise", prof, "--top", "2")
    assert cp.returncode == 0 and "what-ifs not measured: no snapshot to replay" in cp.stdout
    assert "more findings: --top" in cp.stdout


def test_a_rebuilt_kernel_is_measured_against_the_recorded_one(double, snap, tmp_path):
    path, _ = snap
    img = tmp_path / "incr.cudadouble"
    img.write_text("CUDADOUBLE\nkernel incr\n")
    cp = _cli(double, "advise", path, "--json", "--graphs", "0", "--replace", f"incr={img}", "--repeat", "2",
              "--warmup", "0")
    assert cp.returncode == 0, cp.stderr
    [w] = json.loads(cp.stdout)["what_ifs"]["other"]
    assert w["kind"] == "replace" and w["measured"] and w["verified"], w
    assert w["replay"]["exit_code"] == 0 and w["baseline_replay"]["exit_code"] == 0
    assert "--replace" in w["replay"]["command"] and "--replace" not in w["baseline_replay"]["command"]
    assert w["applied"] == [f"incr={img}"]            # the variant's profile says what it replaced
    [k] = w["kernels"]
    assert k["kernel"] == "incr" and k["launches"] == 48 and k["before_us"] > 0 and k["after_us"] > 0


def test_other_launch_sizes_are_measured_and_verified(double, snap):
    """--launch-override what-ifs: a size the kernel allows (same threads) verifies; too few threads
    breaks the results and says so; a block the kernel cannot take applies to nothing, said why.
    The as-recorded replay is shared by what-ifs of one selection."""
    path, _ = snap
    cp = _cli(double, "advise", path, "--json", "--graphs", "0", "--repeat", "2", "--warmup", "0",
              "--launch-override", "grid=2,block=8,kernel=^incr$", "--launch-override", "grid=1,block=4,kernel=^incr$",
              "--launch-override", "block=4096,kernel=^incr$")
    assert cp.returncode == 0, cp.stderr
    res = json.loads(cp.stdout)
    same, few, big = res["what_ifs"]["other"]
    assert same["kind"] == "launch" and same["measured"] and same["verified"], same
    assert same["applied"]["applied"] == 48 and same["applied"]["block"] == [8, 1, 1]
    assert [k["kernel"] for k in same["kernels"]] == ["incr"]
    assert same["baseline_replay"] == few["baseline_replay"] == big["baseline_replay"]
    assert few["measured"] and not few["verified"] and few["replay"]["exit_code"] == 1
    f = next(f for f in res["findings"] if f["kind"] == "launch" and "grid=1,block=4," in f["title"])
    assert f["advice"] == "The change breaks the results"
    assert big["measured"] is False and "applied to no launch" in big["why"] and "the kernel allows 1024" in big["why"]
    txt = _cli(double, "advise", path, "--graphs", "0", "--repeat", "2", "--warmup", "0",
               "--launch-override", "block=4096,kernel=^incr$")
    assert txt.returncode == 0 and "what-if --launch-override block=4096,kernel=^incr$: not measured" in txt.stdout
    bad = _cli(double, "advise", path, "--launch-override", "grid=x", timeout=60)
    assert bad.returncode == 2 and "grid takes integers" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("case", ["missing", "not_json", "not_profile", "graph_profile", "no_kernels", "manifest", "garbage"])
def test_bad_input_is_one_line_and_exit_2(double, tmp_path, case):
    f = tmp_path / "in.json"
    if case == "not_json":
        f.write_text("{ not json")
    elif case == "not_profile":
        f.write_text(json.dumps({"a": 1}))
    elif case == "graph_profile":
        f.write_text(json.dumps({"summary": {"mode": "graph"}, "launches": [], "kernels": []}))
    elif case == "no_kernels":
        f.write_text(json.dumps({"summary": {"mode": "timeline"}, "launches": [{"seq": 1, "name": "k"}], "kernels": []}))
    elif case == "manifest":
        f.write_text(json.dumps({"cudasnap_group": 1, "ranks": []}))
    elif case == "garbage":
        f = tmp_path / "in.cusnap"
        f.write_bytes(b"\x00garbage" * 64)
    cp = _cli(double, "advise", f if case != "missing" else tmp_path / "nope.cusnap", timeout=60)
    assert cp.returncode == 2, (case, cp.stdout, cp.stderr)
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cudasnap: error:"), (case, cp.stderr)
    assert "Traceback" not in cp.stderr and cp.stdout == ""


def test_outputs_are_checked_before_any_replay(double, snap, tmp_path):
    path, _ = snap
    existing = tmp_path / "a.json"
    existing.write_text("{}")
    for args, msg in (((f"--out={tmp_path / 'no' / 'a.json'}",), "no"),
                      ((f"--out={existing}",), "-f"),
                      ((f"--out={tmp_path / 'a.txt'}",), "--out must name a .json file"),
                      ((f"--html={tmp_path / 'a.json'}",), "--html must name a .html file"),
                      (("--replace", "incr"), "expected KERNEL=FILE")):
        cp = _cli(double, "advise", path, *args, timeout=60)
        assert cp.returncode == 2 and msg in cp.stderr and len(cp.stderr.strip().splitlines()) == 1, (args, cp.stderr)
    assert existing.read_text() == "{}"


# --------------------------------------------------------------------------- the findings' rules, no replay
def _profile(kernels):
    """A timeline profile of (name, start_us, dur_us) kernels."""
    rows = [{"seq": i + 10, "name": n, "start_ns": int(t * 1e3), "end_ns": int((t + d) * 1e3)}
            for i, (n, t, d) in enumerate(kernels)]
    tot: dict = {}
    for n, _t, d in kernels:
        tot[n] = tot.get(n, 0.0) + d
    ks = [{"name": n, "launches": sum(1 for k in kernels if k[0] == n), "total_us": v, "median_us": v,
           "share_pct": v / sum(tot.values()) * 100} for n, v in sorted(tot.items(), key=lambda kv: -kv[1])]
    return {"summary": {"mode": "timeline"}, "launches": rows, "kernels": ks}


def test_launch_bound_stretches_end_at_long_kernels_and_host_gaps_not_at_one_slow_launch():
    from cudasnap.advise.findings import Limits, Timeline, host_gaps, launch_bound
    ks, t = [], 0.0
    for i in range(30):                          # 2 us kernels 8 us apart; one stretched to 60 us
        d = 60.0 if i == 12 else 2.0
        ks.append(("tiny", t, d))
        t += d + 8
    ks.append(("gemm", t, 500.0))                # a long kernel ends the stretch
    t += 500 + 8
    for i in range(20):
        ks.append(("tiny", t, 2.0))
        t += 10
    t += 5000                                    # the host away: a gap splits too
    for i in range(10):
        ks.append(("tiny", t, 2.0))
        t += 10
    tl = Timeline(_profile(ks), [])
    got = [(f["evidence"]["first_seq"], f["evidence"]["last_seq"]) for f in launch_bound(tl, Limits())]
    assert got == [(10, 39), (41, 60), (61, 70)], got
    f = launch_bound(tl, Limits())[0]["evidence"]
    assert f["kernels"] == 30 and f["under_tiny_us"] == 29 and f["idle_us"] == pytest.approx(29 * 8, abs=0.1)
    [g] = host_gaps(tl, Limits(), [])
    assert g["evidence"]["gaps"] == 1 and g["evidence"]["largest"][0]["gap_us"] == pytest.approx(5008, abs=0.1)
    assert g["evidence"]["largest"][0]["before_seq"] == 61


def test_library_candidates_are_hand_written_kernels_only():
    from cudasnap.advise.findings import library_candidates
    names = ["_Z13my_sgemm_tiledPKfS0_Pfiii", "conv2d_forward_kernel", "block_reduce_sum", "_Z6kernelv",
             "ampere_sgemm_128x64_nn", "nvjet_hsh_256x128_64x4_2x1_v_bz_coopA_NTN",
             "_ZN7cutlass7Kernel2I22cutlass_80_tensorop_gemmEEvNT_6ParamsE",
             "_ZN2at6native13reduce_kernelILi512ELi1ENS0_8ReduceOpIfNS0_6SumOpsIffEEjfLi4EEEEEvT1_",
             "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64", "triton_poi_fused_mm_0"]
    p = _profile([(n, i * 10.0, 5.0) for i, n in enumerate(names)])
    for k in p["kernels"]:
        from cudasnap.replay.names import demangle
        k["demangled"] = demangle(k["name"])
    got = {f["kernel"]: f["evidence"]["operation"] for f in library_candidates(p)}
    assert got == {"_Z13my_sgemm_tiledPKfS0_Pfiii": "matrix multiply", "conv2d_forward_kernel": "convolution",
                   "block_reduce_sum": "reduction"}, got


def test_a_gap_is_named_by_the_nvtx_ranges_around_it():
    from cudasnap.advise.findings import nvtx_around
    r = [{"name": "step 1", "start_ns": 0, "end_ns": 1000}, {"name": "step 2", "start_ns": 5000, "end_ns": 9000},
         {"name": "epoch", "start_ns": 0, "end_ns": 20000}, {"name": "fwd", "start_ns": 5500, "end_ns": 7000}]
    assert nvtx_around(r[:2], 1200, 5600) == ["step 1", "step 2"]
    assert nvtx_around(r, 6000, 6500) == ["fwd"]          # the innermost range that holds it


METRICS_H200 = __import__("pathlib").Path(__file__).parent / "data" / "metrics_h200.json"


def test_counters_name_what_bounds_each_kernel():
    """From a metrics profile measured on an H200 (metrics_kernels.cu): the FMA chain is
    compute-bound at ~99% SM throughput, the triad memory-bound with DRAM throughput as % of
    peak; a kernel near neither roof is latency-bound, and low theoretical occupancy is named
    by its limiter."""
    from cudasnap.advise.counters import counter_findings
    p = json.loads(METRICS_H200.read_text())
    by = {f["kernel"]: f for f in counter_findings(p)}
    fma, triad = by["fma_chain"], by["stream_triad"]
    assert fma["kind"] == "compute-bound" and "SM throughput 99% of peak" in fma["title"]
    assert triad["kind"] == "memory-bound" and "DRAM throughput 74% of peak" in triad["title"]
    assert 0 < triad["at_stake_us"] < triad["evidence"]["total_us"]
    k = p["kernels"][1]
    k["metrics"].update({"sm__throughput.avg.pct_of_peak_sustained_elapsed": 12.0,
                         "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": 20.0,
                         "dram__throughput.avg.pct_of_peak_sustained_elapsed": 20.0})
    k["occupancy"].update(theoretical_pct=25.0, limiter=["registers"])
    kinds = {f["kind"]: f for f in counter_findings(p) if f["kernel"] == k["name"]}
    assert set(kinds) == {"latency-bound", "occupancy"}
    assert "limited by registers per thread" in kinds["occupancy"]["title"]


def test_a_tuned_gemm_is_named_at_both_roofs_with_its_tensor_flop_and_memory_unit():
    """The figures an H200 measured for an fp16 8192^3 GEMM (nvjet, tensor cores): SM 93% and
    memory 94.5% of peak are within 10 points, so the finding names both, the memory unit that
    carries the traffic (L1/TEX 98%, not DRAM at 20%) and the fp16 tensor FLOP as % of peak.
    The same kernel's counters with the memory figure 30 points lower make it compute-bound;
    an elementwise kernel at DRAM 85% is memory-bound by DRAM, not by its busier L2."""
    from cudasnap.advise.counters import counter_findings
    from cudasnap.replay.profile import roofline as rl
    m = {"sm__throughput.avg.pct_of_peak_sustained_elapsed": 93.3,
         "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": 94.5,
         "dram__throughput.avg.pct_of_peak_sustained_elapsed": 19.7,
         "l1tex__throughput.avg.pct_of_peak_sustained_active": 98.2,
         "lts__throughput.avg.pct_of_peak_sustained_elapsed": 46.4,
         "gpu__time_duration.sum": 1463584.0, "sm__ops_path_tensor_src_fp16.sum": 1.1167e12,
         "sm__ops_path_tensor_op_hgmma_src_fp16_sparsity_off.sum.peak_sustained": 4096.0 * 132,
         "sm__cycles_elapsed.avg.per_second": 1.755e9, "dram__bytes_read.sum": 1.2e9, "dram__bytes_write.sum": 1.4e8,
         "dram__bytes.sum.peak_sustained": 2560.0, "dram__cycles_elapsed.avg.per_second": 1.9e9}
    roof = rl.kernel_roofline([{"metrics": m}])
    assert roof["dominant"] == "tensor_fp16" and roof["bound"] == "compute"
    assert 75 < roof["pct_of_flop_peak"] < 90, roof
    ew = {"sm__throughput.avg.pct_of_peak_sustained_elapsed": 6.6,
          "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": 85.2,
          "dram__throughput.avg.pct_of_peak_sustained_elapsed": 85.2,
          "l1tex__throughput.avg.pct_of_peak_sustained_active": 30.3,
          "lts__throughput.avg.pct_of_peak_sustained_elapsed": 91.0}
    p = {"kernels": [{"name": "nvjet_hsh_gemm", "total_us": 2927.0, "launches": 2, "metrics": m, "roofline": roof,
                      "occupancy": {"theoretical_pct": 18.8, "limiter": ["registers", "shared_memory"]}},
                     {"name": "vectorized_elementwise_kernel", "total_us": 250.0, "launches": 2, "metrics": ew}]}
    by = {f["kernel"]: f for f in counter_findings(p) if f["kind"] != "occupancy"}
    g = by["nvjet_hsh_gemm"]
    assert g["kind"] == "compute-and-memory-bound", g
    assert "SM throughput 93%" in g["title"] and "L1/TEX throughput 98% of peak, DRAM 20%" in g["title"], g["title"]
    assert "of the fp16 tensor FLOP peak" in g["title"] and g["evidence"]["memory_unit"] == "L1/TEX"
    e = by["vectorized_elementwise_kernel"]
    assert e["kind"] == "memory-bound" and "DRAM throughput 85% of peak" in e["title"], e["title"]
    m["gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"] = 63.0
    m["l1tex__throughput.avg.pct_of_peak_sustained_active"] = 66.0
    g = [f for f in counter_findings(p) if f["kernel"] == "nvjet_hsh_gemm" and f["kind"] != "occupancy"][0]
    assert g["kind"] == "compute-bound" and "SM throughput 93% of peak" in g["title"], g["title"]


H200_SM = {"max_threads_per_sm": 2048, "max_blocks_per_sm": 32, "regs_per_sm": 65536, "smem_per_sm": 233472,
           "reserved_smem_per_block": 1024, "warp_size": 32}         # as cuDeviceGetAttribute gives them on an H200


def _occ_profile(name, block, grid, regs, dev=H200_SM, dynamic=0, shapes=1):
    from cudasnap.replay.profile import metrics_sections as ms
    smem = 1024 + dynamic
    occ = ms.theoretical_occupancy(None, block, ms.occupancy_limits(block, regs, smem, dev), dev)
    occ.update(registers_per_thread=regs, dynamic_smem=dynamic, smem_per_block=smem)
    m = {"sm__throughput.avg.pct_of_peak_sustained_elapsed": 20.0,
         "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": 25.0}
    launches = [{"name": name, "grid": [grid + i, 1, 1], "block": [block, 1, 1]} for i in range(shapes)]
    return {"summary": {"mode": "metrics", "sm_limits": dev}, "launches": launches,
            "kernels": [{"name": name, "launches": len(launches), "total_us": 500.0, "metrics": m, "occupancy": occ}]}


def test_a_block_size_that_raises_occupancy_is_chosen_from_the_kernels_resources():
    """Registers bound a 1024-thread block of 40 registers to one block per SM (50%); 512 threads
    fit three (75%): the nearest size within 5 points of the best, grid scaled to keep the
    threads. A kernel bound by registers at any size, one with dynamic shared memory, one
    launched at several sizes: none, each with its reason."""
    from cudasnap.advise.counters import block_size_candidate
    p = _occ_profile("k", 1024, 100, 40)
    assert p["kernels"][0]["occupancy"]["theoretical_pct"] == 50.0
    cand, why = block_size_candidate(p, "k")
    assert why == "" and cand["block"] == 512 and cand["grid"] == 200 and cand["occupancy_pct"] == 75.0, cand
    assert cand["spec"] == "grid=200,block=512,kernel=^k$"
    cand, why = block_size_candidate(_occ_profile("k", 256, 10, 128), "k")
    assert cand is None and "no block size raises its theoretical occupancy (25%)" in why
    assert "dynamic shared memory" in block_size_candidate(_occ_profile("k", 1024, 1, 40, dynamic=4096), "k")[1]
    assert "2 different sizes" in block_size_candidate(_occ_profile("k", 1024, 1, 40, shapes=2), "k")[1]
    old = _occ_profile("k", 1024, 1, 40)
    del old["summary"]["sm_limits"]
    assert "older cudasnap" in block_size_candidate(old, "k")[1]


def test_a_low_occupancy_kernel_is_replayed_at_a_better_block_size(double, snap, tmp_path):
    """advise --metrics: the low-occupancy finding's what-if replays the kernel at the block size
    its resources favour (here an SM of 8 block slots: 16-thread blocks fill 12.5%) and measures
    it; the replay verifies, so the kernel allows it."""
    path, _ = snap
    dev = dict(H200_SM, max_blocks_per_sm=8)
    mp = tmp_path / "m.json"
    mp.write_text(json.dumps(_occ_profile("incr", 16, 1, 32, dev=dev)))
    cp = _cli(double, "advise", path, "--metrics", mp, "--json", "--graphs", "0", "--repeat", "2", "--warmup", "0")
    assert cp.returncode == 0, cp.stderr
    res = json.loads(cp.stdout)
    f = next(f for f in res["findings"] if f["kind"] == "occupancy")
    w = f["what_if"]
    assert w["kind"] == "launch" and w["measured"] and w["verified"], w
    assert w["occupancy"]["block"] == 256 and w["occupancy"]["from_pct"] == 12.5 and w["occupancy"]["occupancy_pct"] == 100.0
    assert w["applied"]["applied"] == 48 and f["basis"] == "measured: isolated replays at block 256"
    txt = _cli(double, "advise", path, "--metrics", mp, "--graphs", "0", "--repeat", "2", "--warmup", "0")
    assert "block 16 -> 256 (grid 1 -> 1), theoretical occupancy 12.5% -> 100%" in txt.stdout, txt.stdout
    assert "results verified" in txt.stdout
    off = _cli(double, "advise", path, "--metrics", mp, "--json", "--graphs", "0", "--block-sizes", "0")
    f = next(f for f in json.loads(off.stdout)["findings"] if f["kind"] == "occupancy")
    assert f["what_if"]["measured"] is False and "--block-sizes" in f["what_if"]["why"]


def test_advise_takes_counters_with_metrics(double, snap, tmp_path):
    path, _ = snap
    prof = tmp_path / "p.json"
    cp = _cli(double, "replay", path, "--profile", "timeline", "--out", prof, "-q")
    assert cp.returncode == 0, cp.stderr
    cp = _cli(double, "advise", prof, "--metrics", METRICS_H200, "--no-what-if", "--json")
    assert cp.returncode == 0, cp.stderr
    res = json.loads(cp.stdout)
    kinds = {f["kind"] for f in res["findings"]}
    assert {"memory-bound", "compute-bound", "launch-bound"} <= kinds, kinds
    cp = _cli(double, "advise", prof, "--metrics", METRICS_H200, "--no-what-if")
    assert cp.returncode == 0 and "memory-bound: stream_triad" in cp.stdout and "DRAM 74" in cp.stdout, cp.stdout
    # a timeline profile is no metrics profile; a metrics profile is no timeline: one line, exit 2
    for args in (("--metrics", prof), ()):
        cp = _cli(double, "advise", METRICS_H200 if not args else prof, *args, "--no-what-if")
        assert cp.returncode == 2 and len(cp.stderr.strip().splitlines()) == 1, cp.stderr
        assert "metrics" in cp.stderr


def test_a_replay_past_its_timeout_is_exit_124_with_its_reason():
    """advise's replays run in a process of their own, ended at --timeout (a hang or a slow
    what-if): exit 124 and the reason, as the finding quotes it."""
    from cudasnap.advise.source import last_error, run_replay
    from cudasnap.replay.invocation import plain
    cp = run_replay(plain("never-read.cusnap"), 0.01)
    assert cp.returncode == 124 and last_error(cp) == "timed out after 0.01 s"
    assert cp.args[1:3] == ["-m", "cudasnap.replay.invocation"]


def test_advise_takes_its_modes_from_the_registry():
    """Which profile advise reads, and which modes its what-ifs are measured in, are the mode
    registry's (replay/profile/modes.py): advise's own code names no mode."""
    import ast
    from pathlib import Path
    from cudasnap.replay.profile.modes import MODES, for_advise
    assert [for_advise(u).name for u in ("profile", "counters", "stretch", "variant")] == \
        ["timeline", "metrics", "graph", "isolated"]
    with pytest.raises(KeyError):
        for_advise("nothing")
    root = Path(__file__).resolve().parents[1] / "advise"
    found = []
    for p in sorted(root.glob("*.py")):
        tree = ast.parse(p.read_text())
        docs = {id(d.body[0].value) for d in ast.walk(tree) if isinstance(
            d, (ast.Module, ast.FunctionDef, ast.ClassDef)) and d.body and isinstance(d.body[0], ast.Expr)}
        for n in ast.walk(tree):
            if id(n) in docs:
                continue
            if isinstance(n, ast.keyword) and n.arg == "mode" and isinstance(n.value, ast.Constant):
                found.append(f"{p.name}:{n.value.lineno} mode={n.value.value!r}")
            elif isinstance(n, ast.Compare) and "mode" in ast.unparse(n) and any(
                    isinstance(c, ast.Constant) and c.value in MODES for c in [n.left, *n.comparators]):
                found.append(f"{p.name}:{n.lineno} compares with a mode")
            elif isinstance(n, ast.Constant) and isinstance(n.value, str) and any(
                    f"--profile {m}" in n.value for m in MODES):
                found.append(f"{p.name}:{n.lineno} {n.value[:40]!r}")
    assert found == []
