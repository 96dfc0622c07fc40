"""`--profile metrics` on the CUDA test double: the command line, selection, restored memory
between passes, outputs (table, JSON, CSV, HTML, the stats SQLite table) and the roofline and
occupancy maths.  CI has no CUPTI: the counter collector is replaced by a fake through the
CUDASNAP_METRICS_COLLECTOR seam (replay/profile/metrics_cupti.py); without it and without
CUPTI's profiler the profile is an error, exit 2."""
from __future__ import annotations

import csv
import json
import sqlite3
import struct
import subprocess
import sys
import textwrap

import pytest

from cudasnap.replay.profile import metrics_sections as ms
from cudasnap.replay.profile import roofline as rl
from synth import Synth

FAKE = textwrap.dedent('''
    import json, os
    from cudasnap.replay.profile.metrics_cupti import MetricsUnavailable

    VALUES = {
        "gpu__time_duration.sum": 2.0e6,                                  # 2 ms
        "sm__throughput.avg.pct_of_peak_sustained_elapsed": 61.5,
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": 40.0,
        "dram__throughput.avg.pct_of_peak_sustained_elapsed": 35.0,
        "sm__warps_active.avg.pct_of_peak_sustained_active": 48.0,
        "l1tex__t_sector_hit_rate.pct": 12.5, "lts__t_sector_hit_rate.pct": 55.0,
        "dram__bytes_read.sum": 1.5e8, "dram__bytes_write.sum": 0.5e8,
        "sm__sass_thread_inst_executed_op_fadd_pred_on.sum": 1.0e8,
        "sm__sass_thread_inst_executed_op_fmul_pred_on.sum": 1.0e8,
        "sm__sass_thread_inst_executed_op_ffma_pred_on.sum": 9.0e8,
        "sm__sass_thread_inst_executed_op_dadd_pred_on.sum": 0.0,
        "sm__sass_thread_inst_executed_op_dmul_pred_on.sum": 0.0,
        "sm__sass_thread_inst_executed_op_dfma_pred_on.sum": 0.0,
        "sm__sass_thread_inst_executed_op_hadd_pred_on.sum": 0.0,
        "sm__sass_thread_inst_executed_op_hmul_pred_on.sum": 0.0,
        "sm__sass_thread_inst_executed_op_hfma_pred_on.sum": 0.0,
        "sm__sass_thread_inst_executed_op_ffma_pred_on.sum.peak_sustained": 512.0,
        "sm__sass_thread_inst_executed_op_dfma_pred_on.sum.peak_sustained": 256.0,
        "sm__sass_thread_inst_executed_op_hfma_pred_on.sum.peak_sustained": 1024.0,
        "sm__cycles_elapsed.avg.per_second": 1.5e9,
        "dram__bytes.sum.peak_sustained": 64.0,
        "dram__cycles_elapsed.avg.per_second": 2.5e9,
        "smsp__custom_metric.sum": 7.0,
    }

    class Fake:
        name = "fake collector"
        chip = "GH100"
        def __init__(self, dev):
            self.log = os.environ["FAKE_LOG"]
            self.n = int(os.environ.get("FAKE_PASSES", "3"))
            self._w({"open": dev})
        def _w(self, d):
            with open(self.log, "a") as f:
                f.write(json.dumps(d) + "\\n")
        def prepare(self, metrics, warn, alternative, quiet=frozenset()):
            unknown = set(filter(None, os.environ.get("FAKE_UNKNOWN", "").split(",")))
            chosen, dropped = {}, []
            for m in metrics:
                alt = alternative(m)
                if m not in unknown:
                    chosen[m] = m
                elif alt and alt not in unknown:
                    chosen[m] = alt
                else:
                    dropped.append(m)
            if dropped:
                warn("metrics: unknown: " + ",".join(dropped))
            self.metrics = list(dict.fromkeys(chosen.values()))
            return chosen
        def passes(self):
            return self.n
        def collect(self, ctx, prepare, launch, sync):
            for _ in range(self.n):
                prepare(); launch(); sync()
            self._w({"collect": ctx, "passes": self.n})
            return {m: VALUES.get(m.replace("smsp__sass", "sm__sass"), 1.0) for m in self.metrics}, self.n
        def close(self):
            self._w({"close": True})

    def make(dev):
        return Fake(dev)

    def unavailable(dev):
        raise MetricsUnavailable("libcupti has no range profiler (test)")
''')

# the fake's figures, and what the roofline makes of them
FLOP = 1.0e8 + 1.0e8 + 2 * 9.0e8                 # fadd + fmul + 2 x ffma
BYTES = 2.0e8
PEAK32 = 2 * 512.0 * 1.5e9
BW = 64.0 * 2.5e9


def incr_program(path, n=16, launches=3):
    """D = zeros(n) int32; incr(D, n) `launches` times; the D2H expects `launches`."""
    s = Synth(path)
    ctx, mod, f_incr = 0x55550000, 0x55560000, 0x55570005
    D = 0x200000000000
    s.double_prologue("incr", f_incr, [[0, 8], [8, 4]], ctx, mod)
    s.call("cuMemAlloc_v2", {"dptr": D, "bytesize": n * 4})
    s.call("cuMemcpyHtoD_v2", {"dstDevice": D, "srcHost": 0x7F0000100000, "ByteCount": n * 4},
           x={"srcHost": s.blob(bytes(n * 4))})
    seqs = [s.launch(f_incr, struct.pack("<Qi", D, n), block=n)["s"] for _ in range(launches)]
    s.expect_d2h(D, [launches] * n)
    s.double_epilogue(frees=[D])
    return seqs


@pytest.fixture
def fake(tmp_path):
    (tmp_path / "fakecoll.py").write_text(FAKE)
    return tmp_path


def _run(double, fake, *args, collector="fakecoll:make", extra_env=None, cmd="replay"):
    env = dict(double["env"])
    env.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    env["PYTHONPATH"] = str(fake) + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["FAKE_LOG"] = str(fake / "fake.log")
    if collector:
        env["CUDASNAP_METRICS_COLLECTOR"] = collector
    else:
        env.pop("CUDASNAP_METRICS_COLLECTOR", None)
    env.update(extra_env or {})
    return subprocess.run([sys.executable, "-m", "cudasnap", cmd, *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=120)


def _log(fake):
    p = fake / "fake.log"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


# ------------------------------------------------------------------ the command
def test_metrics_profiles_each_launch_from_restored_memory(double, fake, tmp_path):
    snap = tmp_path / "incr.cusnap"
    seqs = incr_program(snap, launches=3)
    out = tmp_path / "m.json"
    rp = _run(double, fake, snap, "--profile", "metrics", "--out", out)
    # the D2H after the launches expects exactly 3 increments: every pass started from restored memory
    assert rp.returncode == 0, rp.stdout + rp.stderr
    rep = json.loads(out.read_text())
    s = rep["summary"]
    assert s["mode"] == "metrics" and s["backend"] == "fake collector" and s["chip"] == "GH100"
    assert s["sections"] == list(ms.DEFAULT_SECTIONS) and s["passes"] == 3 and s["launches_profiled"] == 3
    assert "error" not in s
    rows = rep["launches"]
    assert [r["seq"] for r in rows] == seqs
    for r in rows:
        assert r["passes"] == 3 and r["metrics"]["gpu__time_duration.sum"] == 2.0e6 and r["time_us"] == 2000.0
        assert set(r["metrics"]) == set(ms.plan([], None)[1])
        assert r["saved_bytes"] >= 64
        assert r["roofline"]["bound"] == "compute"
    log = _log(fake)
    assert sum(1 for x in log if "collect" in x) == 3 and log[-1] == {"close": True}
    k = rep["kernels"]
    assert len(k) == 1 and k[0]["name"] == "incr" and k[0]["launches"] == 3 and k[0]["passes"] == 3
    assert k[0]["metrics"]["lts__t_sector_hit_rate.pct"] == 55.0
    roof = k[0]["roofline"]
    assert roof["flop_total"] == pytest.approx(3 * FLOP) and roof["dram_bytes"] == pytest.approx(3 * BYTES)
    assert roof["intensity"] == pytest.approx(FLOP / BYTES)
    assert roof["achieved_flops"] == pytest.approx(FLOP / 2e-3)
    assert roof["peaks"]["fp32_flops"] == pytest.approx(PEAK32) and roof["peaks"]["source"] == "counters"
    assert roof["pct_of_roof"] == pytest.approx(FLOP / 2e-3 / min(PEAK32, FLOP / BYTES * BW) * 100)
    assert rep["sections"]["SpeedOfLight"][0]["metric"] == "sm__throughput.avg.pct_of_peak_sustained_elapsed"
    # the table
    assert "profile (metrics, fake collector, GH100): 3 launches, 3 pass(es) each" in rp.stdout
    assert "SM %" in rp.stdout and "61.5%" in rp.stdout and "55.0%" in rp.stdout and "compute" in rp.stdout


def test_metrics_selection_sections_and_raw_metrics(double, fake, tmp_path):
    snap = tmp_path / "incr.cusnap"
    seqs = incr_program(snap, launches=4)
    out = tmp_path / "m.json"
    rp = _run(double, fake, snap, "--profile", "metrics", "-k", "incr", "-s", "1", "-c", "2",
              "--section", "SpeedOfLight", "--section", "memory", "--metrics", "smsp__custom_metric.sum", "--out", out,
              extra_env={"FAKE_PASSES": "2"})
    assert rp.returncode == 0, rp.stdout + rp.stderr
    rep = json.loads(out.read_text())
    assert [r["seq"] for r in rep["launches"]] == seqs[1:3]
    s = rep["summary"]
    assert s["sections"] == ["SpeedOfLight", "MemoryWorkloadAnalysis"] and s["passes"] == 2
    want = [m for m, _l, _u in ms.SECTIONS["SpeedOfLight"] + ms.SECTIONS["MemoryWorkloadAnalysis"]]
    assert s["metrics"] == want + ["smsp__custom_metric.sum"]
    r = rep["launches"][0]
    assert set(r["metrics"]) == set(s["metrics"]) and r["metrics"]["smsp__custom_metric.sum"] == 7.0
    assert "occupancy" not in r and "roofline" not in r
    assert "smsp__custom_metric.sum" in rp.stdout and "L2 hit" in rp.stdout and "occ" not in rp.stdout


def test_launch_counts_skip_graph_nodes_metrics_cannot_replay_alone(double, fake, tmp_path):
    """A program whose first launch was captured into a graph (as JAX's command buffers are):
    -c 2 profiles the first two launches that run on their own; with none left, exit 2 and
    the message says every selected launch was a graph's node."""
    from test_profile import incr_graph_program
    snap = tmp_path / "g.cusnap"
    facts = incr_graph_program(snap, graph_launches=2, plain_after=3)
    out = tmp_path / "m.json"
    rp = _run(double, fake, snap, "--profile", "metrics", "-c", "2", "--out", out)
    assert rp.returncode == 0, rp.stdout + rp.stderr
    rep = json.loads(out.read_text())
    assert [r["seq"] for r in rep["launches"]] == facts["plain"][:2]
    rp = _run(double, fake, snap, "--profile", "metrics")          # every launch: the graph's node is named
    assert rp.returncode == 0 and "not profiled: 1 launch(es) recorded into a stream capture" in rp.stdout, rp.stdout
    snap2 = tmp_path / "g2.cusnap"
    incr_graph_program(snap2, graph_launches=2)
    rp = _run(double, fake, snap2, "--profile", "metrics", "-c", "2", "--out", tmp_path / "m2.json")
    assert rp.returncode == 2, rp.stdout + rp.stderr
    assert "a graph's node" in rp.stdout + rp.stderr and "--profile isolated" in rp.stdout + rp.stderr


def test_metrics_alternative_spelling_and_unknown_metrics(double, fake, tmp_path):
    snap = tmp_path / "incr.cusnap"
    incr_program(snap, launches=1)
    out = tmp_path / "m.json"
    unknown = "sm__sass_thread_inst_executed_op_ffma_pred_on.sum,lts__t_sector_hit_rate.pct"
    rp = _run(double, fake, snap, "--profile", "metrics", "--out", out, extra_env={"FAKE_UNKNOWN": unknown})
    assert rp.returncode == 0, rp.stdout + rp.stderr
    rep = json.loads(out.read_text())
    s = rep["summary"]
    assert s["collected_as"] == {"sm__sass_thread_inst_executed_op_ffma_pred_on.sum":
                                 "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"}
    assert s["not_collected"] == ["lts__t_sector_hit_rate.pct"]
    m = rep["launches"][0]["metrics"]
    assert m["sm__sass_thread_inst_executed_op_ffma_pred_on.sum"] == 9.0e8 and "lts__t_sector_hit_rate.pct" not in m
    assert any("unknown: lts__t_sector_hit_rate.pct" in w for w in rep["warnings"])


def test_metrics_outputs_csv_html_and_stats_table(double, fake, tmp_path):
    snap = tmp_path / "incr.cusnap"
    seqs = incr_program(snap, launches=2)
    js, cs, page = tmp_path / "m.json", tmp_path / "m.csv", tmp_path / "roof.html"
    rp = _run(double, fake, snap, "--profile", "metrics", "--out", js)
    assert rp.returncode == 0, rp.stderr
    pytest.importorskip("plotly")
    rp = _run(double, fake, snap, "--profile", "metrics", "--out", cs, "--html", page)
    assert rp.returncode == 0, rp.stderr
    rows = list(csv.DictReader(cs.open()))
    assert [r["row_type"] for r in rows] == ["launch", "launch", "kernel"]
    assert [int(r["seq"]) for r in rows[:2]] == seqs
    assert float(rows[0]["dram__bytes_read.sum"]) == 1.5e8 and rows[0]["roofline.bound"] == "compute"
    assert float(rows[2]["roofline.intensity"]) == pytest.approx(FLOP / BYTES)
    text = page.read_text()
    assert "plotly" in text and "arithmetic intensity" in text and "incr" in text and "fp32 roof" in text
    # the stats export with the metrics table: correlationId joins the kernel rows
    db = tmp_path / "x.sqlite"
    st = _run(double, fake, snap, "--out", db, "--kernel-metrics", js, cmd="stats")
    assert st.returncode == 0, st.stderr
    assert "CUDASNAP_KERNEL_METRICS" in st.stderr
    con = sqlite3.connect(db)
    got = con.execute("SELECT m.correlationId, m.value FROM CUDASNAP_KERNEL_METRICS m JOIN CUPTI_ACTIVITY_KIND_KERNEL k "
                      "ON k.correlationId = m.correlationId WHERE m.metricName = 'gpu__time_duration.sum' "
                      "ORDER BY 1").fetchall()
    assert got == [(seqs[0], 2.0e6), (seqs[1], 2.0e6)]
    secs = {r[0] for r in con.execute("SELECT DISTINCT section FROM CUDASNAP_KERNEL_METRICS")}
    assert secs == set(ms.DEFAULT_SECTIONS)
    bound = con.execute("SELECT textValue, source FROM CUDASNAP_KERNEL_METRICS WHERE metricName = "
                        "'cudasnap__roofline_bound'").fetchall()
    assert bound == [("compute", "derived")] * 2
    con.close()
    # a profile of another mode is refused, with one line
    iso = tmp_path / "iso.json"
    iso.write_text(json.dumps({"summary": {"mode": "isolated"}}))
    st = _run(double, fake, snap, "--out", tmp_path / "y.sqlite", "--kernel-metrics", iso, cmd="stats")
    assert st.returncode == 2 and "is not a metrics profile" in st.stderr


def test_metrics_without_cupti_is_exit_2(double, fake, tmp_path):
    snap = tmp_path / "incr.cusnap"
    incr_program(snap, launches=2)
    out = tmp_path / "m.json"
    rp = _run(double, fake, snap, "--profile", "metrics", "--out", out, collector="fakecoll:unavailable")
    assert rp.returncode == 2, rp.stdout + rp.stderr
    assert "CUPTI's profiler is not available: libcupti has no range profiler (test)" in rp.stdout + rp.stderr
    assert "replayed" in rp.stdout or "verified" in rp.stdout         # the replay itself still ran
    try:
        import cupti  # noqa: F401
    except Exception:
        # the real collector, where cupti-python is not installed (CI): the same exit 2
        rp = _run(double, fake, snap, "--profile", "metrics", collector=None)
        assert rp.returncode == 2, rp.stdout + rp.stderr
        assert "CUPTI's profiler is not available: cupti-python is not available" in rp.stdout + rp.stderr


@pytest.mark.parametrize("args, msg", [
    (["--profile", "metrics", "--section", "Bogus"], "--section Bogus: not a section"),
    (["--profile", "isolated", "--section", "Occupancy"], "--section has no effect without --profile metrics"),
    (["--metrics", "dram__bytes.sum"], "--metrics has no effect without --profile metrics"),
    (["--profile", "metrics", "--metrics", "a b"], "is not a metric name"),
    (["--profile", "metrics", "--html", "x.txt"], "--html must name a .html file"),
])
def test_metrics_bad_options_are_exit_2(double, fake, tmp_path, args, msg):
    snap = tmp_path / "incr.cusnap"
    incr_program(snap, launches=1)
    rp = _run(double, fake, snap, *args)
    assert rp.returncode == 2 and msg in rp.stderr, rp.stdout + rp.stderr
    assert "Traceback" not in rp.stderr


# ------------------------------------------------------------------ maths
def test_roofline_point_memory_and_compute_bound():
    peaks = {"fp32_flops": 60e12, "fp64_flops": 30e12, "fp16_flops": None, "dram_bytes_per_s": 3e12}
    mem = rl.point({"fp32": 1e9, "fp64": 0.0, "fp16": 0.0}, 4e9, 2e6, peaks)     # 0.25 FLOP/B, 2 ms
    assert mem["intensity"] == 0.25 and mem["ridge"] == 20.0 and mem["bound"] == "memory"
    assert mem["roof_flops"] == pytest.approx(0.25 * 3e12)
    assert mem["achieved_flops"] == pytest.approx(5e11) and mem["achieved_bytes_per_s"] == pytest.approx(2e12)
    assert mem["pct_of_roof"] == pytest.approx(5e11 / 7.5e11 * 100) and mem["pct_of_dram_peak"] == pytest.approx(66.67, 0.01)
    comp = rl.point({"fp32": 1e6, "fp64": 4e10, "fp16": None}, 1e8, 2e6, peaks)   # fp64 dominant, 400 FLOP/B
    assert comp["dominant"] == "fp64" and comp["bound"] == "compute" and comp["roof_flops"] == 30e12
    assert comp["pct_of_flop_peak"] == pytest.approx((4e10 + 1e6) / 2e-3 / 30e12 * 100)
    copy = rl.point({"fp32": 0.0, "fp64": 0.0, "fp16": 0.0}, 1e9, 1e6, peaks)     # a copy kernel: no FLOP
    assert copy["bound"] == "memory" and copy["dominant"] is None and copy["pct_of_roof"] == pytest.approx(1e12 / 3e12 * 100)
    assert "error" in rl.point({}, 1e9, 1e6, peaks)


def test_flops_and_metric_peaks():
    v = {f"sm__sass_thread_inst_executed_op_{p}{op}_pred_on.sum": 1.0 for p in "fdh" for op in ("add", "mul", "fma")}
    assert ms.flops(v) == {"fp32": 4.0, "fp64": 4.0, "fp16": 4.0}
    del v["sm__sass_thread_inst_executed_op_hmul_pred_on.sum"]
    assert ms.flops(v)["fp16"] is None
    p = ms.metric_peaks({"sm__sass_thread_inst_executed_op_ffma_pred_on.sum.peak_sustained": 16896.0,
                         "sm__cycles_elapsed.avg.per_second": 1.98e9, "dram__bytes.sum.peak_sustained": 1536.0,
                         "dram__cycles_elapsed.avg.per_second": 2.6e9})
    assert p["fp32_flops"] == pytest.approx(2 * 16896 * 1.98e9) and p["fp64_flops"] is None
    assert p["dram_bytes_per_s"] == pytest.approx(1536 * 2.6e9)
    fb = rl.peaks_of({}, {"fp32_flops": 5e13, "dram_bytes_per_s": 3e12})
    assert fb["fp32_flops"] == 5e13 and fb["source"] == "measured"


H100 = {"max_threads_per_sm": 2048, "max_blocks_per_sm": 32, "regs_per_sm": 65536, "smem_per_sm": 233472,
        "warp_size": 32}


@pytest.mark.parametrize("threads, regs, smem, limits, pct, limiter", [
    (256, 32, 0, {"warps": 8, "blocks": 32, "registers": 8, "shared_memory": None}, 100.0, ["registers", "warps"]),
    (256, 128, 0, {"warps": 8, "blocks": 32, "registers": 2, "shared_memory": None}, 25.0, ["registers"]),
    (128, 40, 1024 + 64 * 1024, {"warps": 16, "blocks": 32, "registers": 12, "shared_memory": 3}, 18.75, ["shared_memory"]),
    (32, 16, 0, {"warps": 64, "blocks": 32, "registers": 128, "shared_memory": None}, 50.0, ["blocks"]),
])
def test_occupancy_limits_and_limiter(threads, regs, smem, limits, pct, limiter):
    got = ms.occupancy_limits(threads, regs, smem, H100)
    assert got == limits
    occ = ms.theoretical_occupancy(None, threads, got, H100)
    assert occ["theoretical_pct"] == pytest.approx(pct) and occ["limiter"] == limiter and occ["source"] == "estimate"
    drv = ms.theoretical_occupancy(1, threads, got, H100)       # the driver's answer wins
    assert drv["active_blocks_per_sm"] == 1 and drv["source"] == "driver"


def test_sections_plan_and_names():
    assert ms.section_name("memoryworkload") == "MemoryWorkloadAnalysis" and ms.section_name("SOL") == "SpeedOfLight"
    assert ms.section_name("nope") is None
    names, metrics = ms.plan([], "a.sum, b.pct")
    assert names == [] and metrics == ["a.sum", "b.pct"]
    names, metrics = ms.plan(["Occupancy", "occupancy"], None)
    assert names == ["Occupancy"] and metrics == ["sm__warps_active.avg.pct_of_peak_sustained_active"]
    assert len(set(ms.plan([], None)[1])) == len(ms.plan([], None)[1])
    assert ms.alternative("sm__sass_x.sum") == "smsp__sass_x.sum" and ms.alternative("dram__x") is None


def test_cupti_struct_sizes_match_the_headers():
    """The cffi declarations give the sizes CUDA 13.5's headers give (checked there with gcc:
    sizeof and the *_STRUCT_SIZE macros); cffi is here, no CUPTI is needed."""
    from cudasnap.replay.profile import metrics_cupti as mc
    ffi = mc.make_ffi()
    want = {"CUpti_RangeProfiler_SetConfig_Params": 90, "CUpti_RangeProfiler_Enable_Params": 32,
            "CUpti_RangeProfiler_Stop_Params": 41, "CUpti_RangeProfiler_GetCounterDataSize_Params": 64,
            "CUpti_RangeProfiler_CounterData_GetRangeInfo_Params": 56, "CUpti_Device_GetChipName_Params": 32,
            "CUpti_RangeProfiler_CounterDataImage_Initialize_Params": 40, "CUpti_Profiler_Initialize_Params": 16}
    assert {n: mc.struct_size(ffi, n) for n in want} == want
    assert ffi.offsetof("CUpti_RangeProfiler_SetConfig_Params", "range") == 56
    assert ffi.offsetof("CUpti_RangeProfiler_SetConfig_Params", "targetNestingLevel") == 88


def test_fma_ptx_is_well_formed():
    for t in ("f32", "f64"):
        p = rl.fma_ptx(t).decode()
        assert p.count(f"fma.rn.{t}") == rl.FMA_UNROLL * 8 and f".entry cudasnap_peak_{t}" in p
        assert "{" in p and p.count("{") == p.count("}")
