"""cudasnap campaign on the CUDA test double and a local Ray runtime (2 CPUs, 2 fake GPUs that
are all "H100"s), shared by the module's tests: the CLI connects to it by address.

The double's kernels are host functions; CUDA_DOUBLE_SLOW gives every kernel a steady floor
and slows `fill` in one environment (the planted regression)."""
from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from cudasnap.campaign import rules as R  # noqa: E402
from cudasnap.campaign.store import TABLES, Store  # noqa: E402
from test_compare import THREE_PTX, three_kernels  # noqa: E402

STEADY = 'CUDA_DOUBLE_SLOW = "*:1", CUDA_DOUBLE_SLOW_FLOOR_US = "4000", CUDA_DOUBLE_CLOCK = "virtual"'
ENVS = f"""
[[env]]
name = "plain"
vars = {{ {STEADY} }}
[[env]]
name = "eager"
vars = {{ {STEADY}, CUDA_MODULE_LOADING = "EAGER" }}
[[env]]
name = "slowfill"
gpu = "H100"
vars = {{ CUDA_DOUBLE_SLOW = "*:1,fill:4", CUDA_DOUBLE_SLOW_FLOOR_US = "4000", CUDA_DOUBLE_CLOCK = "virtual" }}
"""
RULES = """
[rules]
repeats = 7
warmup = 1
threshold = 20
max_reruns = 1
timeout = 120
retries = 2
"""


@pytest.fixture(scope="module")
def cluster(double, tmp_path_factory):
    """One Ray runtime for the module; its workers inherit the double on LD_LIBRARY_PATH and
    the kill hook's path."""
    d = tmp_path_factory.mktemp("campaign")
    saved = {k: os.environ.get(k) for k in ("LD_LIBRARY_PATH", "CUDASNAP_CAMPAIGN_TEST_KILL", "CUDASNAP_CACHE",
                                            "RAY_AUTH_MODE", "CUDASNAP_KEEPER_DIR")}
    os.environ["CUDASNAP_KEEPER_DIR"] = str(d / "keepers")
    os.environ["RAY_AUTH_MODE"] = "disabled"        # a private test runtime: the CLI connects without a token
    os.environ["LD_LIBRARY_PATH"] = double["env"]["LD_LIBRARY_PATH"]
    os.environ["CUDASNAP_CAMPAIGN_TEST_KILL"] = str(d / "kill-one-worker")
    os.environ["CUDASNAP_CACHE"] = str(d / "cache")
    ray.init(address="local", num_cpus=2, num_gpus=2, resources={"gpu_model:H100": 2}, include_dashboard=False,
             log_to_driver=False)        # "local": never a cluster an earlier `ray start` left its address for
    snaps = d / "snaps"
    snaps.mkdir()
    for i, n in enumerate((64, 96, 128, 160)):
        three_kernels(snaps / f"s{i}.cusnap", n=n)
    try:
        yield {"address": ray.get_runtime_context().gcs_address, "dir": d, "snaps": snaps,
               "kill": d / "kill-one-worker", "env": dict(double["env"], RAY_AUTH_MODE="disabled", CUDASNAP_KEEPER_DIR=str(d / "keepers"))}
    finally:
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _campaign(path: Path, snaps: str, envs: str = ENVS, baseline: str = "plain", rules: str = "") -> Path:
    path.write_text(f'name = "ci"\nbaseline = "{baseline}"\n{RULES}{rules}\n[[snapshot]]\npath = "{snaps}"\n{envs}')
    return path


def _cli(cluster, *args, timeout=300):
    e = dict(cluster["env"])
    e.pop("CUDASNAP_CAMPAIGN_TEST_KILL", None)
    return subprocess.run([sys.executable, "-m", "cudasnap", *map(str, args)], env=e, capture_output=True,
                          text=True, timeout=timeout)


NOOP = f"""
[[env]]
name = "noop"
control = true
vars = {{ {STEADY}, CUDASNAP_CAMPAIGN_NOTHING = "1" }}
"""


def test_planted_regression_found_and_attributed(cluster, tmp_path, record_property):
    """The planted slowdown: each candidate replayed A B A B with its baseline on one GPU, found
    by Mann-Whitney beyond the bar, confirmed on the other GPU; the control env, which changes
    nothing, gives no verdict and the report states the rate."""
    envs = ENVS.replace('name = "eager"\nvars = {{ {STEADY}, CUDA_MODULE_LOADING = "EAGER" }}'.format(STEADY=STEADY),
                        NOOP.split("[[env]]\n", 1)[1])
    assert 'name = "noop"' in envs and "eager" not in envs
    # the replays run in kept workers: one process per GPU and env, replay after replay
    camp = _campaign(tmp_path / "camp.toml", f"{cluster['snaps']}/s[01].cusnap", envs=envs, rules='workers = "kept"\n')
    store = tmp_path / "st.sqlite"
    cp = _cli(cluster, "campaign", "run", camp, "-o", store, "--address", cluster["address"], "--json")
    assert cp.returncode == 1, cp.stdout[-2000:] + cp.stderr[-2000:]
    res = json.loads(cp.stdout)
    assert res["cells"] == 6 and res["ran"] == 6 and res["skipped"] == 0 and res["failed"] == 0
    cost = res["cost"]
    assert cost["workers"] == "kept" and cost["fixed_s_per_replay"] is not None, cost
    per_v = cost["replays_per_verdict"]
    assert set(per_v) == {"BASELINE", "SAME", "SLOWER"} and per_v["SLOWER"] > per_v["SAME"], per_v
    # where each snapshot's replays spent their time, the kept worker's give-back included
    ph = cost["phases_by_snapshot"]
    assert set(ph) == {"s0.cusnap", "s1.cusnap"}, ph
    assert all({"launches", "read_and_plan.prescan", "loop.module", "close"} <= set(p) for p in ph.values()), ph
    # each env's kept worker replays a snapshot again from its first replay's plan
    assert all(0 < p["count.plan_reused"] < 1 for p in ph.values()), ph
    from cudasnap.campaign.run import phase_lines
    lines = phase_lines(ph)
    assert len(lines) == 3 and all("launches" in ln and "module loads" in ln for ln in lines[1:]), lines
    record_property("ci_summary", f"campaign 2x3 in kept workers (replay after replay in one process): fixed cost "
                                  f"{cost['fixed_s_per_cell']:.3f} s per cell ({cost['fixed_s_per_cell_started']:.3f} once "
                                  f"the servers are up), {cost['fixed_s_per_replay']:.3f} s per "
                                  f"replay ({cost['replays_per_cell']:g} replays a cell; per verdict {per_v})")
    rep = res["report"]
    assert {(g["env"], g["kernel"]) for g in rep["regressions"]} == {("slowfill", "fill")}
    assert len(rep["regressions"]) == 2                          # every snapshot, that kernel only
    for g in rep["regressions"]:
        assert g["first_run"] == 1 and g["confirmed"] == 1 and g["confirm_note"] == "confirmed on another GPU"
        assert g["confirm_gpu"] != g["gpu"] and g["bar_pct"] >= 20 and g["p_value"] <= 0.01
        assert g["last_good"]["env"] == "plain"
        assert [(x["dimension"], x["what"]) for x in g["differences"]] == [("variable", "CUDA_DOUBLE_SLOW")]
    for m in rep["matrix"]:
        assert m["cells"]["plain"]["verdict"] == "BASELINE"
        assert m["cells"]["slowfill"]["verdict"] == "SLOWER" and m["cells"]["slowfill"]["slower"] == ["fill"]
        assert m["cells"]["noop"]["verdict"] == "SAME" and m["cells"]["noop"]["control"]
    ctl = rep["controls"]
    assert (ctl["envs"], ctl["cells"], ctl["verdicts"], ctl["comparisons"]) == (["noop"], 2, 0, 6), ctl
    assert rep["exit_reason"] == "a regression"
    assert [(v["env"], v["kernel"], v["verdict"]) for v in rep["verdicts"]] == [("slowfill", "fill", "SLOWER")] * 2
    db = sqlite3.connect(store)
    assert db.execute("SELECT COUNT(*) FROM cells WHERE gpu_req='H100' AND status='ok'").fetchone()[0] == 2
    # one task per snapshot: the baseline and both envs in rounds on one GPU (B E1 E2 B E1 E2),
    # each baseline replay serving both envs of its round
    for snap, in db.execute("SELECT DISTINCT snapshot FROM cells"):
        rows = db.execute("SELECT c.env, a.side, a.round, a.visible_devices, a.node_id, a.started FROM attempts a "
                          "JOIN cells c ON c.cell_key=a.cell_key WHERE c.snapshot=? AND a.purpose='measure' "
                          "ORDER BY a.started, a.id", (snap,)).fetchall()
        assert len({(r[3], r[4]) for r in rows}) == 1
        for env in ("slowfill", "noop"):
            assert [(r[1], r[2]) for r in rows if r[0] == env] == [("baseline", 1), ("candidate", 1), ("baseline", 2),
                                                                   ("candidate", 2)]
        base = [r[5] for r in rows if r[0] == "plain"]
        assert len(base) == 2 and base == [r[5] for r in rows if r[0] == "noop" and r[1] == "baseline"]
    # a verdict is judged again on more rounds before it counts (3 rounds: 6 replays)
    inv = db.execute("SELECT c.env, COUNT(*) FROM attempts a JOIN cells c ON c.cell_key=a.cell_key "
                     "WHERE a.purpose='investigate' GROUP BY c.cell_key").fetchall()
    assert sorted(inv) == [("slowfill", 6), ("slowfill", 6)], inv
    conf = db.execute("SELECT c.gpu, a.visible_devices FROM cells c JOIN attempts a ON a.cell_key=c.cell_key"
                      " WHERE a.purpose='confirm' AND c.env='slowfill'").fetchall()
    assert len(conf) == 8 and all(not g.split("@")[0].endswith(":" + v) for g, v in conf)
    k = db.execute("SELECT campaign_noise_pct, bar_pct, confirm_diff_pct FROM kernel_results WHERE kernel='fill' "
                   "AND verdict='SLOWER'").fetchall()
    assert len(k) == 2 and all(n is not None and b >= 20 and c > 100 for n, b, c in k), k
    assert db.execute("SELECT status, exit_code FROM runs").fetchall() == [("done", 1)]
    _keepers_held_and_released(cluster)
    # the report reads the store alone: text, JSON and HTML with the trend plotted
    html = tmp_path / "r.html"
    cp = _cli(cluster, "campaign", "report", store, "--html", html)
    assert cp.returncode == 1, cp.stderr
    lines = [ln for ln in cp.stdout.splitlines() if ln.startswith("- ")]
    assert len(lines) == 2 and all("env 'slowfill': kernel fill" in ln and "(bar +-" in ln for ln in lines)
    assert "variable CUDA_DOUBLE_SLOW: *:1 -> *:1,fill:4" in cp.stdout
    assert "controls: 0 verdict(s) in 6 kernel comparisons" in cp.stdout
    assert sum("vs bar +-" in ln and "confirmed on another GPU" in ln for ln in cp.stdout.splitlines()) == 2
    page = html.read_text()
    assert "plotly" in page and "kernel medians per run" in page and "slowfill" in page
    assert "Verdicts and their noise" in page and "controls: 0 verdict(s)" in page
    cp = _cli(cluster, "campaign", "report", store, "--html", html)
    assert cp.returncode == 2 and "exists" in cp.stderr and len(cp.stderr.strip().splitlines()) == 1


NULL_ENVS = (("plain", False, ""), ("noop", True, ', CUDASNAP_CAMPAIGN_NOTHING = "1"'),
             ("eager", False, ', CUDA_MODULE_LOADING = "EAGER"'), ("lazy", False, ', CUDA_MODULE_LOADING = "LAZY"'),
             ("conns", False, ', CUDA_DEVICE_MAX_CONNECTIONS = "8"'), ("noop2", True, ', CUDASNAP_CAMPAIGN_NOTHING = "2"'))


def _null_envs(bias: str, planted: str = "") -> str:
    """The six no-op environments, every one on the biased GPU; planted: an env that is the
    baseline's but for `fill` running 2x slower."""
    out = ""
    for n, control, more in NULL_ENVS:
        slow = '"*:1,fill:2"' if n == planted else '"*:1"'
        more = "" if n == planted else more
        out += (f'[[env]]\nname = "{n}"\n{"control = true" if control else ""}\n'
                f'vars = {{ CUDA_DOUBLE_SLOW = {slow}, CUDA_DOUBLE_SLOW_FLOOR_US = "2000", CUDA_DOUBLE_CLOCK = "virtual", {bias}{more} }}\n')
    return out


def _null_campaign(path: Path, snaps: str, envs: str, workers: str = "warm") -> Path:
    """5 timed runs a side and pair (10 a side: Mann-Whitney reaches 1e-5), kernels of 2 ms."""
    path.write_text(f'name = "ci"\nbaseline = "plain"\n[rules]\nrepeats = 5\nwarmup = 1\nthreshold = 20\n'
                    f'max_reruns = 1\ntimeout = 120\nretries = 2\nworkers = "{workers}"\n'
                    f'[[snapshot]]\npath = "{snaps}"\n{envs}')
    return path


def test_null_campaign_8x6_then_one_planted_2x(cluster, tmp_path, record_property):
    """The issue's CI campaign: 8 snapshots x 6 environments, all no-ops, one fake GPU 25%
    slower: 0 verdicts but SAME, the controls' rate reported, the fixed cost per cell measured
    (replays forked by a server per GPU and env). Then one env with `fill` planted 2x slower:
    found in every snapshot, attributed to the variable, exit 1; nothing else."""
    snaps = tmp_path / "snaps"
    snaps.mkdir()
    for i in range(8):
        three_kernels(snaps / f"n{i}.cusnap", n=32 + 16 * i)
    bias = 'CUDA_DOUBLE_SLOW_VISIBLE = "1:1.25"'
    camp = _null_campaign(tmp_path / "null.toml", f"{snaps}/n*.cusnap", _null_envs(bias))
    store = tmp_path / "null.sqlite"
    cp = _cli(cluster, "campaign", "run", camp, "-o", store, "--address", cluster["address"], "--json", timeout=600)
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-2000:]
    res = json.loads(cp.stdout)
    rep = res["report"]
    assert res["cells"] == 48 and res["ran"] == 48 and res["failed"] == 0
    assert rep["verdicts"] == [] and rep["verdict_counts"] == {"BASELINE": 8, "SAME": 40}, rep["verdict_counts"]
    ctl = rep["controls"]
    assert (ctl["envs"], ctl["cells"], ctl["verdicts"], ctl["comparisons"], ctl["rate"]) == (["noop", "noop2"], 16, 0, 48, 0)
    db = sqlite3.connect(store)
    assert {r[0] for r in db.execute("SELECT visible_devices FROM attempts")} == {"0", "1"}
    assert db.execute("SELECT COUNT(*) FROM attempts WHERE outcome<>'ok'").fetchone()[0] == 0
    # the offset was there: the baselines on GPU 1 (every kernel a 2 ms floor) 25% slower
    per_gpu: dict = {}
    for gpu, us in db.execute("SELECT c.gpu, k.median_us FROM cells c JOIN kernel_results k ON k.cell_id=c.id "
                              "WHERE c.is_baseline=1"):
        per_gpu.setdefault(gpu.split("@")[0][-1], []).append(us)
    assert sorted(per_gpu) == ["0", "1"] and min(per_gpu["1"]) > 1.15 * max(per_gpu["0"]), per_gpu
    cost = res["cost"]
    # one task per snapshot: the baseline replayed once a round for all five envs
    assert cost["workers"] == "warm" and cost["fixed_s_per_cell"] is not None and cost["replays"] >= 8 * 6 * 2
    assert cost["replays_per_cell"] <= 2.5 and cost["replays_per_verdict"]["SAME"] < 3, cost
    assert cost["server_starts"] <= 2 * 6 * 4, cost      # a server per GPU and env in each Ray worker, not per replay
    record_property("ci_summary", f"campaign 8x6 null (one GPU 25% slower): 0 verdicts in 40 cells, controls 0 of "
                                  f"{ctl['comparisons']}; fixed cost {cost['fixed_s_per_cell']:.3f} s per cell, "
                                  f"{cost['fixed_s_per_replay']:.3f} s per replay ({cost['replays_per_cell']:g} replays "
                                  f"a cell, shared baselines, warm workers; per verdict {cost['replays_per_verdict']}), "
                                  f"{res['cells_wall_s']:.1f} s on 2 fake GPUs")
    # the same campaign, `fill` 2x slower in one env, in kept workers (replay after replay in one
    # process): found in all 8 snapshots, attributed, exit 1
    camp = _null_campaign(tmp_path / "planted.toml", f"{snaps}/n*.cusnap", _null_envs(bias, planted="conns"), "kept")
    store = tmp_path / "planted.sqlite"
    cp = _cli(cluster, "campaign", "run", camp, "-o", store, "--address", cluster["address"], "--json", timeout=600)
    assert cp.returncode == 1, cp.stdout[-3000:] + cp.stderr[-2000:]
    res = json.loads(cp.stdout)
    rep = res["report"]
    assert {(g["env"], g["kernel"]) for g in rep["regressions"]} == {("conns", "fill")} and len(rep["regressions"]) == 8
    for g in rep["regressions"]:
        assert g["confirmed"] == 1 and [(x["dimension"], x["what"]) for x in g["differences"]] == \
            [("variable", "CUDA_DOUBLE_SLOW")], g
    assert rep["verdict_counts"] == {"BASELINE": 8, "SAME": 32, "SLOWER": 8}, rep["verdict_counts"]
    assert rep["controls"]["verdicts"] == 0 and rep["exit_reason"] == "a regression"
    kept = res["cost"]
    assert kept["workers"] == "kept" and kept["fixed_s_per_replay"] is not None, kept
    record_property("ci_summary", f"campaign 8x6 with fill 2x slower in one env: found in {len(rep['regressions'])} of 8 "
                                  f"snapshots, attributed to CUDA_DOUBLE_SLOW, exit 1; kept workers: fixed cost "
                                  f"{kept['fixed_s_per_cell']:.3f} s per cell, {kept['fixed_s_per_replay']:.3f} s per "
                                  f"replay ({kept['replays_per_cell']:g} replays a cell; per verdict "
                                  f"{kept['replays_per_verdict']}); {res['cells_wall_s']:.1f} s")


def test_a_control_with_a_verdict_means_noise_exceeds_the_rules(cluster, tmp_path):
    """A control env that does change something (a planted slowdown): its verdict makes the run
    and the report exit 2, "noise exceeds the rules"."""
    envs = f"""
[[env]]
name = "plain"
vars = {{ {STEADY} }}
[[env]]
name = "noop"
control = true
vars = {{ CUDA_DOUBLE_SLOW = "*:1,fill:4", CUDA_DOUBLE_SLOW_FLOOR_US = "4000", CUDA_DOUBLE_CLOCK = "virtual" }}
"""
    camp = _campaign(tmp_path / "camp.toml", f"{cluster['snaps']}/s0.cusnap", envs=envs)
    store = tmp_path / "st.sqlite"
    cp = _cli(cluster, "campaign", "run", camp, "-o", store, "--address", cluster["address"])
    assert cp.returncode == 2, cp.stdout[-2000:] + cp.stderr[-2000:]
    assert "noise exceeds the rules: control env 'noop' judged SLOWER on s0.cusnap" in cp.stdout
    assert "controls: 1 verdict(s) in 3 kernel comparisons" in cp.stdout
    cp = _cli(cluster, "campaign", "report", store, "--json")
    rep = json.loads(cp.stdout)
    assert cp.returncode == 2 and rep["exit_reason"] == "noise exceeds the rules"
    assert rep["controls"]["noise_exceeds"][0]["env"] == "noop" and rep["controls"]["rate"] == 1 / 3
    assert sqlite3.connect(store).execute("SELECT exit_code FROM runs").fetchall() == [(2,)]


def test_a_slower_swap_with_last_bit_differences_is_timed_and_its_numerics_shown(cluster, tmp_path):
    """An env swapping in add_one rebuilt (CUDASNAP_REPLACE) that runs 4x slower and rounds
    otherwise: its results are CLOSE, so the cell is timed and judged SLOWER, its numerics beside
    the verdict (store, text, HTML); the control stays SAME."""
    snap = tmp_path / "ptx.cusnap"
    three_kernels(snap, n=64, image=THREE_PTX)
    rebuilt = tmp_path / "add_one.ptx"
    rebuilt.write_bytes(THREE_PTX)
    envs = f"""
[[env]]
name = "plain"
vars = {{ {STEADY} }}
[[env]]
name = "noop"
control = true
vars = {{ {STEADY}, CUDASNAP_CAMPAIGN_NOTHING = "1" }}
[[env]]
name = "rebuilt"
vars = {{ CUDA_DOUBLE_SLOW = "*:1,add_one:4", CUDA_DOUBLE_SLOW_FLOOR_US = "4000", CUDA_DOUBLE_CLOCK = "virtual", CUDASNAP_REPLACE = "add_one={rebuilt}", CUDA_DOUBLE_PERTURB = "add_one:ulp:2" }}
"""
    camp = _campaign(tmp_path / "camp.toml", snap, envs=envs, rules='confirm = false\n')
    store = tmp_path / "st.sqlite"
    cp = _cli(cluster, "campaign", "run", camp, "-o", store, "--address", cluster["address"])
    assert cp.returncode == 1, cp.stdout[-2000:] + cp.stderr[-2000:]
    cp = _cli(cluster, "campaign", "report", store, "--json")
    rep = json.loads(cp.stdout)
    assert cp.returncode == 1 and rep["verdict_counts"] == {"BASELINE": 1, "SAME": 1, "SLOWER": 1}, rep["verdict_counts"]
    m = rep["matrix"][0]["cells"]
    assert m["rebuilt"]["verdict"] == "SLOWER" and m["rebuilt"]["slower"] == ["add_one"]
    num = m["rebuilt"]["numerics"]
    assert num["outcome"] == "CLOSE" and 0 < num["max_rel"] < 1e-6 and num["max_ulp"] >= 1, num
    assert m["noop"]["verdict"] == "SAME" and m["noop"]["numerics"]["outcome"] == "EXACT"
    assert [g["kind"] for g in rep["regressions"]] == ["timing regression"]
    text = _cli(cluster, "campaign", "report", store).stdout
    assert re.search(r"- ptx\.cusnap in env 'rebuilt': kernel add_one \+\d+\.\d%.*; numerics CLOSE: max rel \S+, "
                     r"\d+ ULP, within torch\.testing's per-type defaults;", text), text
    row = sqlite3.connect(store).execute("SELECT numerics FROM cells WHERE env='rebuilt'").fetchone()
    assert json.loads(row[0])["outcome"] == "CLOSE"


def _keepers_held_and_released(cluster):
    """A keeper per GPU held its driver state while the replays ran; the run's end told them
    to go (their heartbeat files removed), and they went."""
    kd = cluster["dir"] / "keepers"
    pids = [int(p.read_text()) for p in kd.glob("*.pid")]
    assert len(pids) == 2, sorted(x.name for x in kd.iterdir())
    assert not list(kd.glob("*.beat"))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(_running(p) for p in pids):
        time.sleep(0.2)
    assert not any(_running(p) for p in pids)


def test_keeper_holds_until_released_and_never_on_an_exclusive_gpu(double, tmp_path):
    beat = tmp_path / "0.beat"
    beat.write_text("")
    env = dict(double["env"])
    cmd = [sys.executable, "-m", "cudasnap.campaign.keeper", str(beat), "30"]
    p = subprocess.Popen(cmd, env=env)
    time.sleep(2.5)
    assert p.poll() is None                        # holding while its heartbeat is fresh
    beat.unlink()
    assert p.wait(timeout=20) == 0                 # released
    beat.write_text("")
    p = subprocess.Popen(cmd, env=dict(env, DOUBLE_COMPUTE_MODE="3"))
    assert p.wait(timeout=20) == 0                 # exclusive process mode: holds nothing, at once


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_worker_killed_mid_cell_is_retried(cluster, tmp_path):
    """A worker killed while its replay runs (here a fresh process per replay, [rules] workers =
    "fresh": the replay handed over as a typed document all the same): the cell is retried."""
    # the replays take host time (4 ms a launch) while their measured times stay planted: the
    # kill, 0.3 s into the worker, lands while its replay runs
    envs = ENVS.split("[[env]]\nname = \"slowfill\"")[0].replace(
        'CUDA_DOUBLE_CLOCK = "virtual"', 'CUDA_DOUBLE_CLOCK = "virtual", CUDA_DOUBLE_WALL_US = "4000"')
    camp = _campaign(tmp_path / "camp.toml", f"{cluster['snaps']}/s0.cusnap", baseline="plain",
                     rules='pairs = 1\nworkers = "fresh"\n', envs=envs)
    store = tmp_path / "st.sqlite"
    cluster["kill"].write_text("")
    cp = _cli(cluster, "campaign", "run", camp, "-o", store, "--address", cluster["address"], "--ship")
    assert not cluster["kill"].exists(), "no replay claimed the kill hook"
    assert cp.returncode == 0, cp.stdout[-2000:] + cp.stderr[-2000:]
    db = sqlite3.connect(store)
    # the task lost served both cells of the snapshot: each is tried again on its own
    lost = db.execute("SELECT cell_key, error FROM attempts WHERE outcome='lost'").fetchall()
    assert len(lost) == 2 and len({k for k, _ in lost}) == 2, lost
    for key, _ in lost:
        st = db.execute("SELECT status, attempts FROM cells WHERE cell_key=?", (key,)).fetchone()
        assert st[0] == "ok" and st[1] >= 2
        assert db.execute("SELECT purpose FROM attempts WHERE cell_key=? ORDER BY n", (key,)).fetchall()[1][0] == "retry"
    assert db.execute("SELECT COUNT(*) FROM cells WHERE status='ok'").fetchone()[0] == 2
    # --ship: the snapshot reached the node through the object store, into the cache by digest
    assert any(p.suffix == ".cusnap" for p in (cluster["dir"] / "cache" / "snapshots").iterdir())
    assert "0 server start" not in cp.stdout and "fresh workers" in cp.stdout


def test_stopped_campaign_resumes_only_unfinished_cells(cluster, tmp_path):
    # each launch also takes 10 ms of host time (unmeasured): the snapshot that runs after the
    # first two cannot finish between the poll that sees 2 cells and the SIGINT
    envs = ENVS.split("[[env]]\nname = \"slowfill\"")[0].replace(
        'CUDA_DOUBLE_CLOCK = "virtual"', 'CUDA_DOUBLE_CLOCK = "virtual", CUDA_DOUBLE_WALL_US = "10000"')
    camp = _campaign(tmp_path / "camp.toml", f"{cluster['snaps']}/s[012].cusnap", rules="pairs = 1\n", envs=envs)
    store = tmp_path / "st.sqlite"
    e = dict(cluster["env"])
    tmp = tmp_path / "tmp"                 # the run's own temporary directory: what it leaves is seen
    tmp.mkdir()
    e["TMPDIR"] = str(tmp)
    p = subprocess.Popen([sys.executable, "-m", "cudasnap", "campaign", "run", str(camp), "-o", str(store),
                          "--address", cluster["address"]], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    deadline = time.monotonic() + 180
    n = 0
    while time.monotonic() < deadline and p.poll() is None:
        if store.exists():
            try:
                n = sqlite3.connect(store).execute("SELECT COUNT(*) FROM cells").fetchone()[0]
            except sqlite3.Error:
                n = 0
            if n >= 2:
                break
        time.sleep(0.1)
    assert p.poll() is None, "the campaign ended before it could be stopped"
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, out + err
    db = sqlite3.connect(store)
    done = db.execute("SELECT COUNT(*) FROM cells").fetchone()[0]
    assert 2 <= done < 6 and "run the same command again" in err
    # whole cells only: every ok cell has its kernels and its profile
    assert db.execute("SELECT COUNT(*) FROM cells c WHERE status='ok' AND NOT EXISTS "
                      "(SELECT 1 FROM profiles p WHERE p.cell_id=c.id)").fetchone()[0] == 0
    assert db.execute("SELECT COUNT(DISTINCT cell_id) FROM kernel_results").fetchone()[0] == done
    assert db.execute("SELECT status FROM runs").fetchone()[0] == "interrupted"
    db.close()
    assert err.strip().splitlines()[-1].startswith("cudasnap: interrupted: ") and "marked interrupted" in err, err
    time.sleep(1)
    assert not list(tmp.iterdir())         # the cells' work directories went with the run
    # an interrupted run is an infrastructure failure, never "no regression"
    cp = _cli(cluster, "campaign", "report", store)
    assert cp.returncode == 2 and "interrupted before every cell was done" in cp.stdout, cp.stdout + cp.stderr
    cp = _cli(cluster, "campaign", "run", camp, "-o", store, "--address", cluster["address"], "--json")
    assert cp.returncode == 0, cp.stdout[-2000:] + cp.stderr[-2000:]
    res = json.loads(cp.stdout)
    assert res["resumed"] and res["skipped"] == done and res["ran"] == 6 - done
    db = sqlite3.connect(store)
    assert db.execute("SELECT COUNT(*) FROM cells").fetchone()[0] == 6
    assert db.execute("SELECT COUNT(DISTINCT cell_key) FROM cells").fetchone()[0] == 6
    assert db.execute("SELECT status, sessions FROM runs").fetchall() == [("done", 2)]
    # the same campaign again: nothing left to run, and Ray is not even started
    cp = _cli(cluster, "campaign", "run", camp, "-o", store, "--address", cluster["address"])
    assert cp.returncode == 0 and "ran 0 cells, skipped 6" in cp.stdout, cp.stdout + cp.stderr


def test_a_snapshot_with_no_launch_is_set_aside(cluster, tmp_path):
    """A compiler worker's snapshot (no kernel launch) among the glob: named and set aside when
    planned, its cells N/A; the exit code is that of the real verdicts."""
    from synth import Synth
    snaps = tmp_path / "snaps"
    snaps.mkdir()
    (snaps / "torch_main.cusnap").write_bytes((cluster["snaps"] / "s0.cusnap").read_bytes())
    s = Synth(snaps / "torch_compile.4242.cusnap")
    s.w.write({"k": "proc", "driver_version": 13000, "gpus": []})
    s.call("cuInit", {"Flags": 0})
    s.w.write({"k": "end", "exit": 0, "signal": None, "partial": False})
    s.close()
    camp = _campaign(tmp_path / "camp.toml", f"{snaps}/torch_*.cusnap", envs=ENVS.split("[[env]]\nname = \"slowfill\"")[0])
    # run as `campaign run ... | head` would: its stdout's reader gone before the first line
    e = dict(cluster["env"])
    e.pop("CUDASNAP_CAMPAIGN_TEST_KILL", None)
    r, w = os.pipe()
    os.close(r)
    p = subprocess.Popen([sys.executable, "-m", "cudasnap", "campaign", "run", str(camp), "-o", str(tmp_path / "st.sqlite"),
                          "--address", cluster["address"]], env=e, stdout=w, stderr=subprocess.PIPE, text=True)
    os.close(w)
    err = p.communicate(timeout=300)[1]
    assert p.returncode == 0, err[-2000:]
    db = sqlite3.connect(tmp_path / "st.sqlite")
    assert db.execute("SELECT status, exit_code FROM runs").fetchall() == [("done", 0)]
    assert sorted(db.execute("SELECT status, COUNT(*) FROM cells GROUP BY status").fetchall()) == [("n/a", 2), ("ok", 2)]
    db.close()
    cp = _cli(cluster, "campaign", "report", tmp_path / "st.sqlite", "--json")
    rep = json.loads(cp.stdout)
    assert cp.returncode == 0 and rep["infra_failures"] == [] and rep["exit_code"] == 0
    assert rep["set_aside"] == [{"snapshot": "torch_compile.4242.cusnap",
                                 "why": "set aside: it records no kernel launch (3 records): nothing to time"}]
    cp = _cli(cluster, "campaign", "report", tmp_path / "st.sqlite")
    assert cp.returncode == 0 and "torch_compile.4242.cusnap: set aside" in cp.stdout, cp.stdout + cp.stderr


def _schema_doc() -> dict:
    text = (Path(__file__).resolve().parents[1] / "campaign" / "SCHEMA.md").read_text()
    tables, cur = {}, None
    for ln in text.splitlines():
        m = re.match(r"## (\w+)", ln)
        if m:
            cur = tables.setdefault(m.group(1), [])
            continue
        m = re.match(r"\| ([a-z_, ]+) \|", ln)
        if cur is not None and m and m.group(1) != "column":
            cur += [c.strip() for c in m.group(1).split(",")]
    return tables


def test_store_schema_is_documented(tmp_path):
    s = Store(tmp_path / "s.sqlite")
    live = {t: [r[1] for r in s.db.execute(f"PRAGMA table_info({t})")]
            for (t,) in s.db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert live == TABLES
    assert _schema_doc() == TABLES
    s.close()
    assert Store(tmp_path / "s.sqlite", create=False).db.execute("SELECT value FROM meta").fetchone()[0] == "2"


@pytest.mark.parametrize("content, msg", [
    ("[[env]\n", "not valid TOML"),
    ('[[snapshot]]\npath = "nothing*.cusnap"\n[[env]]\nname = "a"\n', "matches no file"),
    ('baseline = "nosuch"\n[[snapshot]]\npath = "x.cusnap"\n[[env]]\nname = "a"\n', "is not an [[env]] name"),
    ('[[snapshot]]\npath = "x.cusnap"\nprofile = "graph"\n[[env]]\nname = "a"\n', "profile must be"),
    ('[rules]\nrepeats = 0\n[[snapshot]]\npath = "x.cusnap"\n[[env]]\nname = "a"\n', "repeats must be >= 1"),
    ('[rules]\nrepeats = 2\n[[snapshot]]\npath = "x.cusnap"\n[[env]]\nname = "a"\n', "cannot reach alpha 0.01"),
    ('[[snapshot]]\npath = "x.cusnap"\n[[env]]\nname = "a"\n[[env]]\nname = "b"\ncontrol = 1\n',
     "control must be true or false"),
])
def test_bad_campaign_is_one_line(double, tmp_path, content, msg):
    (tmp_path / "x.cusnap").write_bytes(b"x")
    (tmp_path / "c.toml").write_text(content)
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "campaign", "run", str(tmp_path / "c.toml"), "-o",
                         str(tmp_path / "s.sqlite")], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 2 and msg in cp.stderr and len(cp.stderr.strip().splitlines()) == 1, cp.stderr
    assert not (tmp_path / "s.sqlite").exists()


def test_without_ray_is_one_line(tmp_path):
    fake = tmp_path / "noray"
    fake.mkdir()
    (fake / "ray.py").write_text("raise ImportError('No module named ray')\n")
    (tmp_path / "x.cusnap").write_bytes(b"x")
    (tmp_path / "c.toml").write_text('[[snapshot]]\npath = "x.cusnap"\n[[env]]\nname = "a"\n')
    e = dict(os.environ, PYTHONPATH=str(fake))
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "campaign", "run", str(tmp_path / "c.toml")], env=e,
                        capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert cp.returncode == 2 and "Ray, which is not installed" in cp.stderr, cp.stderr
    assert len(cp.stderr.strip().splitlines()) == 1


def test_report_bad_input(tmp_path):
    (tmp_path / "junk.sqlite").write_text("not sqlite at all, just text " * 20)
    for args, msg in (([str(tmp_path / "none.sqlite")], "no such store"),
                      ([str(tmp_path / "junk.sqlite")], "not"),
                      ([str(tmp_path / "junk.sqlite"), "--since", "yesterday"], None)):
        cp = subprocess.run([sys.executable, "-m", "cudasnap", "campaign", "report", *args], capture_output=True,
                            text=True, timeout=60)
        assert cp.returncode == 2 and len(cp.stderr.strip().splitlines()) == 1, cp.stderr
        if msg:
            assert msg in cp.stderr


# --------------------------------------------------------------------------- rules, unit
def test_decision_on_small_samples():
    """Mann-Whitney U and the bar decide on a few timed runs a side: the same distribution is
    SAME; a shift beyond the bar is SLOWER; the same shift within the campaign's noise is SAME.
    The issue's case: kernels of 8-20 us on GPUs whose speeds differ by 11-13% gave FASTER when
    the baseline ran on one GPU and the candidate on another; paired on one GPU, nothing."""
    import random
    rng = random.Random(44)

    def runs(us, n=14, sd=0.01, speed=1.0):
        return [us * speed * (1 + rng.gauss(0, sd)) for _ in range(n)]

    assert R.decide(runs(10), runs(10), 5.0, 1.0)["verdict"] == "SAME"
    d = R.decide(runs(10), runs(13), 5.0, 1.0)
    assert d["verdict"] == "SLOWER" and d["p_value"] < 0.001 and d["bar_pct"] == 5.0
    assert R.decide(runs(10), runs(7), 5.0, 1.0)["verdict"] == "FASTER"
    d = R.decide(runs(10), runs(13), 5.0, 12.0)                  # 3 x 12% campaign noise: a 36% bar
    assert d["verdict"] == "SAME" and d["bar_pct"] == 36.0 and "within" in d["why"]
    d = R.decide([10.0, 20.0] * 5, [11.0, 21.0] * 5, 5.0, 0.5)  # medians +6.7%, beyond the bar; not significant
    assert d["verdict"] == "SAME" and "not significant" in d["why"], d
    assert R.decide(runs(10, n=3), runs(13, n=3), 5.0, 1.0)["verdict"] is None   # the test cannot reach alpha
    # a timeline profile's kernel launched thousands of times a side (CuPy's, on the H200: C(n, k)
    # beyond any float raised OverflowError, and every cell of the snapshot was INCOMPARABLE)
    assert R.decide(runs(10, n=1500), runs(10, n=1400), 5.0, 1.0)["verdict"] == "SAME"
    assert R.decide(runs(10, n=1500), runs(13, n=1400), 5.0, 1.0)["verdict"] == "SLOWER"
    gpus = {"gpu0": 1.0, "gpu1": 0.88}                        # gpu1 12% faster
    for us in (8.0, 12.0, 20.0):
        unpaired = R.decide(runs(us, speed=gpus["gpu0"]), runs(us, speed=gpus["gpu1"]), 5.0, 1.0)
        assert unpaired["verdict"] == "FASTER"                # the false verdict the issue saw
        for g, speed in gpus.items():
            assert R.decide(runs(us, speed=speed), runs(us, speed=speed), 5.0, 1.0)["verdict"] == "SAME"


def test_campaign_noise_from_null_ratios():
    """The noise model: run-to-run ratios of each paired task (A2/A1, B2/B1) on every GPU, and a
    control's ratios against its baseline, which its own judgement leaves out."""
    from cudasnap.campaign.noise import NoiseModel

    def prof(us, n=7):
        return _prof([[us] * n])
    nm = NoiseModel()
    assert nm.noise("s", "k") is None
    nm.add_task("s", "e1", False, "h:0", [prof(10.0), prof(10.2)], [prof(20.0), prof(20.0)])
    nm.add_task("s", "e2", False, "h:1", [prof(11.0), prof(11.0)], [prof(11.0), prof(10.9)])
    # |log ratios| of k: 2%, 0, 0, 0.9% -> median 0.45%, x 1.4826
    assert nm.noise("s", "k") == pytest.approx(1.4826 * 100 * 0.0091 / 2, rel=0.05)
    assert nm.sources("s", "k") == {"run": 4, "control": 0, "gpus": 2}
    nm.add_task("s", "ctl", True, "h:0", [prof(10.0), prof(10.0)], [prof(15.0), prof(15.0)])
    assert nm.noise("s", "k", exclude_env="ctl") < 1.0 < nm.noise("s", "k", exclude_env="e1")
    assert nm.gpu_offset("s", "k") == pytest.approx((11.0 - 10.0) / 10.5 * 100)   # per-GPU medians 10, 11


def _paired_engine(tmp_path, gpus):
    """An Engine without Ray around a real store and the real judgement: paired results are
    handed to it, submissions recorded."""
    from types import SimpleNamespace
    from cudasnap.campaign import engine as E
    from cudasnap.campaign.plan import Rules
    s = Store(tmp_path / "p.sqlite")
    camp = SimpleNamespace(name="n", path="/n.toml", file_hash="h", baseline="plain", rules=Rules(threshold=10.0),
                           baseline_env="plain")
    rid, _ = s.open_run(camp, "0.1.0", None, fresh=True)
    eng = object.__new__(E.Engine)
    eng.c, eng.store, eng.run_id, eng.gpus = camp, s, rid, gpus
    eng.inflight, eng.states, eng.hosts, eng._skip_ids, eng.base_profiles, eng.deferred = {}, {}, set(), {}, {}, []
    eng.counts = {"ran": 0, "failed": 0, "regressed": 0}
    eng.noise, eng.on_event, eng.sent = E.NoiseModel(), (lambda kind, info: None), []
    eng.ray = SimpleNamespace(cancel=lambda ref: None)
    eng.paired = lambda cell: True

    def submit(st, purpose, with_bytes=False):
        eng.sent.append(purpose)
        return f"ref-{len(eng.sent)}"
    eng._submit = submit
    cell = SimpleNamespace(key="c1", baseline_key="base", control=False, identity=lambda: {},
                           snapshot=SimpleNamespace(path="/s/a.cusnap", digest="d", kernels=None, mode="isolated"),
                           env=SimpleNamespace(name="slow", gpu=None))
    st = eng.states["c1"] = E.CellState(cell)
    rng = __import__("random").Random(3)

    def pair_result(cand_us, gpu="h:0", node="n1"):
        def replay(side, rnd, us):
            p = _prof([[us * (1 + rng.gauss(0, 0.01)) for _ in range(7)] for _ in range(3)])
            return {"side": side, "round": rnd, "exit_code": 0, "profile": p, "visible_devices": gpu[-1], "proc_s": 0.1}
        runs = [replay("baseline", 1, 100.0), replay("candidate", 1, cand_us), replay("baseline", 2, 100.0),
                replay("candidate", 2, cand_us)]
        return {"runs": runs, "gpu": f"{gpu}@{node}", "host": "h", "node_id": node, "queue_s": 0.0}
    return eng, st, s, pair_result


def test_one_gpu_verdict_stands_unconfirmed(tmp_path):
    """With one GPU there is no other to confirm on: the verdict stands, and the store and the
    report say "unconfirmed: one GPU"."""
    import io
    from cudasnap.campaign.report import build_report, render_text
    eng, st, s, pair_result = _paired_engine(tmp_path, gpus=1)
    eng._handle(st, "measure", 0.0, pair_result(150.0))
    assert eng.sent == ["investigate"] and not st.done        # more rounds before the verdict counts
    eng._handle(st, "investigate", 0.0, pair_result(150.0))
    assert eng.sent == ["investigate"] and st.done and st.verdict == "SLOWER"
    row = s.db.execute("SELECT verdict, confirmed, confirm_note, gpu, confirm_gpu FROM cells").fetchone()
    assert tuple(row) == ("SLOWER", None, "unconfirmed: one GPU", "h:0@n1", None)
    assert [tuple(r) for r in s.db.execute("SELECT side, round FROM attempts ORDER BY n")] == \
        [("baseline", 1), ("candidate", 1), ("baseline", 2), ("candidate", 2)] * 2
    rep = build_report(s, ending=True)
    out = io.StringIO()
    render_text(rep, out)
    assert rep["exit_code"] == 1 and "unconfirmed: one GPU" in out.getvalue()
    assert "controls: none" in out.getvalue()


def test_a_verdict_holds_only_when_the_other_gpu_agrees(tmp_path):
    """Two GPUs: the verdict waits for a confirmation on the other one; one that lands on the
    same GPU is sent again; a confirmation that finds nothing leaves the cell UNCONFIRMED."""
    from cudasnap.campaign.report import build_report
    eng, st, s, pair_result = _paired_engine(tmp_path, gpus=2)
    eng._handle(st, "measure", 0.0, pair_result(150.0))
    eng._handle(st, "investigate", 0.0, pair_result(150.0, gpu="h:1"))   # on the other GPU: still not the measurement's
    assert eng.sent == ["investigate", "confirm"] and not st.done
    eng._handle(st, "confirm", 0.0, {"wrong_gpu": True, "gpu": "h:0@n1"})     # Ray put it on the same GPU
    assert len(eng.deferred) == 1 and st.bounces == 1
    eng.deferred = [(0.0,) + eng.deferred[0][1:]]
    eng._resubmit_due()
    assert eng.sent == ["investigate", "confirm", "confirm"] and not eng.deferred
    eng._handle(st, "confirm", 0.0, pair_result(100.0, gpu="h:1"))
    row = s.db.execute("SELECT verdict, confirmed, confirm_note, confirm_gpu, regressed FROM cells").fetchone()
    assert tuple(row) == ("UNCONFIRMED", 0, "not confirmed on another GPU", "h:1@n1", 0)
    k = s.db.execute("SELECT verdict, diff_pct, confirm_diff_pct FROM kernel_results WHERE kernel='k'").fetchone()
    assert k[0] == "UNCONFIRMED" and k[1] > 40 and abs(k[2]) < 5
    assert build_report(s, ending=True)["exit_code"] == 0


def test_a_shared_baseline_serves_every_env_and_a_false_control_verdict_is_investigated(tmp_path):
    """One task per snapshot, rounds B E1 E2: the baseline cell finished from its baseline side,
    each env judged beside the baseline replays of its own rounds, each baseline replay counted
    once (cost, noise) and in shares per cell. A control whose first rounds read 30% slower (a
    false verdict) is judged again on more rounds before it counts, and they clear it."""
    import random
    from types import SimpleNamespace
    from cudasnap.campaign import engine as E
    eng, _, s, _ = _paired_engine(tmp_path, gpus=1)
    eng.states.clear()
    eng.cost, eng.counts = E._new_cost(), {"ran": 0, "failed": 0, "regressed": 0, "set_aside": 0}
    snap = SimpleNamespace(path="/s/a.cusnap", digest="d", kernels=None, mode="isolated")

    def cell(key, env, base_key, control=False):
        return SimpleNamespace(key=key, baseline_key=base_key, control=control, identity=lambda: {}, snapshot=snap,
                               env=SimpleNamespace(name=env, gpu=None))
    cells = [cell("b", "plain", None), cell("e", "eager", "b"), cell("n", "noop", "b", control=True)]
    eng.by_key = {c.key: c for c in cells}
    for c in cells:
        eng.states[c.key] = E.CellState(c)
    eng.paired = lambda c: c.baseline_key is not None
    eng.gpus = 2                                 # more GPUs than snapshots: the envs split over them
    assert [([x.base.cell.key] if x.base else []) + [m.cell.key for m in x.members] for x in eng.groups(cells)] == \
        [["b", "e"], ["n"]]
    eng.gpus = 1
    [g] = eng.groups(cells)
    assert g.base is eng.states["b"] and [m.cell.key for m in g.members] == ["e", "n"]
    rng = random.Random(5)

    def rep(side, rnd, cand, us):
        p = _prof([[us * (1 + rng.gauss(0, 0.01)) for _ in range(7)] for _ in range(3)])
        return {"side": side, "round": rnd, "cand": cand, "exit_code": 0, "profile": p, "visible_devices": "0",
                "proc_s": 0.3, "started": 1.0e9 + rnd, "ended": 1.0e9 + rnd}
    where = {"gpu": "h:0@n1", "host": "h", "node_id": "n1", "queue_s": 0.0}
    runs = [x for r in (1, 2) for x in (rep("baseline", r, None, 100.0), rep("candidate", r, 0, 100.0),
                                          rep("candidate", r, 1, 130.0))]
    eng._handle(g, "measure", 0.0, dict(where, runs=runs))
    b, e, n = (eng.states[k] for k in "ben")
    assert b.verdict == "BASELINE" and e.verdict == "SAME" and not n.done and eng.sent == ["investigate"]
    assert eng.cost["replays"] == 6 and eng.noise.sources("d/isolated/", "k") == {"run": 3, "control": 2, "gpus": 1}
    assert (b.replays, e.replays, n.replays) == pytest.approx((2 / 3, 2 + 2 / 3, 2 + 2 / 3))
    assert [tuple(r) for r in s.db.execute("SELECT cell_key, side, round FROM attempts ORDER BY id")] == \
        [("b", "baseline", 1), ("b", "baseline", 2)] + [(k, sd, r) for k in "en" for r in (1, 2)
                                                        for sd in ("baseline", "candidate")]
    inv = [x for r in (1, 2, 3) for x in (rep("baseline", r, 0, 100.0), rep("candidate", r, 0, 100.0))]
    eng._handle(n, "investigate", 0.0, dict(where, runs=inv))
    assert n.verdict == "SAME" and n.replays == pytest.approx(2 + 2 / 3 + 6)
    cost = eng.cost_summary()
    assert cost["replays"] == 12 and cost["replays_per_cell"] == 4.0
    assert cost["replays_per_verdict"] == {"BASELINE": 0.67, "SAME": 5.67}
    assert s.db.execute("SELECT COUNT(*) FROM attempts WHERE purpose='investigate'").fetchone()[0] == 6


def test_a_version_1_store_gains_the_new_columns(tmp_path):
    import sqlite3 as sq
    from cudasnap.campaign import store as S
    path = tmp_path / "v1.sqlite"
    db = sq.connect(path)
    v1 = S._DDL
    for added in (S._ADDED_IN_2, S._ADDED_LATER):
        for table, cols in added.items():
            for name, decl in cols:
                v1 = re.sub(rf",\s*{name} {re.escape(decl)}", "", v1)
    v1 = v1.replace(", UNIQUE", ", UNIQUE")
    db.executescript(v1)
    db.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    db.commit()
    db.close()
    assert not {"confirm_note", "numerics"} & {r[1] for r in sq.connect(path).execute("PRAGMA table_info(cells)")}
    s = Store(path, create=False)
    assert [r[1] for r in s.db.execute("PRAGMA table_info(cells)")] == TABLES["cells"]
    assert s.db.execute("SELECT value FROM meta").fetchone()[0] == "2"



def _prof(times):
    return {"summary": {"mode": "isolated"}, "kernels": [],
            "launches": [{"seq": i, "name": "k", "times_us": t, "median_us": sorted(t)[len(t) // 2]}
                         for i, t in enumerate(times)]}


def test_merge_pools_repeats_and_borderline_band():
    m = R.merge_profiles([_prof([[10, 11, 12]]), _prof([[13, 14, 15]])])
    assert m["launches"][0]["times_us"] == [10, 11, 12, 13, 14, 15] and m["launches"][0]["median_us"] == 12.5
    assert m["kernels"][0]["launches"] == 1 and m["summary"]["runs_pooled"] == 2
    res = {"kernels": [{"name": "a", "diff_pct": 6.0, "noise_pct": 1.0}, {"name": "b", "diff_pct": 30.0, "noise_pct": 1.0},
                       {"name": "c", "diff_pct": -4.5, "noise_pct": 0.5}], "total": {"diff_pct": 1.0, "noise_pct": 0.1}}
    assert R.borderline(res, 5.0, 2.0) == ["a", "c"]
    assert R.outcome_of(0, True) == "ok" and R.outcome_of(1, True) == "mismatch" and R.outcome_of(-9, False) == "crash"
    assert R.outcome_of(124, False) == "timeout" and R.outcome_of(2, False) == "error" and R.outcome_of(0, False) == "error"


def test_history_attribution_across_runs(tmp_path):
    """Three nights of one campaign: night 2's driver update slows a kernel; night 3 still has
    it. The report names the driver as what differs from the last good cell (night 1) and
    night 2 as the first run where the regression appeared."""
    from types import SimpleNamespace
    from cudasnap.campaign.plan import Rules
    from cudasnap.campaign.report import build_report
    s = Store(tmp_path / "h.sqlite")
    camp = SimpleNamespace(name="nightly", path="/n.toml", file_hash="h", baseline="run:latest", rules=Rules())
    for night, (drv, ms, verdict) in enumerate([(12080, 1.00, "SAME"), (13000, 1.30, "SLOWER"),
                                               (13000, 1.31, "SLOWER")], start=1):
        rid, _ = s.open_run(camp, "0.1.0", None, fresh=True)
        env = {"name": "plain", "vars": {}, "driver": None, "driver_digest": None, "gpu": None, "replace": {},
               "driver_version": drv, "gpu_model": "H100"}
        for snap, slow in (("a", True), ("b", False)):
            v = verdict if slow else "SAME"
            s.add_cell(rid, {"cell_key": snap, "snapshot": f"/s/{snap}.cusnap", "snapshot_digest": snap,
                             "mode": "isolated", "env": "plain", "env_json": json.dumps(env), "is_baseline": 0,
                             "status": "ok", "verdict": v, "regressed": int(v == "SLOWER"), "attempts": 1,
                             "reruns": 0, "finished": "2026-01-0%dT00:00:00Z" % night},
                       [{"kernel": "gemm", "median_us": 1000 * (ms if slow else 1.0), "ratio": ms if slow else 1.0,
                         "diff_pct": ((ms if slow else 1.0) - 1) * 100, "verdict": v},
                        {"kernel": "relu", "median_us": 50.0, "ratio": 1.0, "diff_pct": 0.0, "verdict": "SAME"}],
                       {"summary": {}, "launches": [], "kernels": []})
        s.close_run(rid, "done", ["n1"], 1 if verdict == "SLOWER" else 0)
    rep = build_report(s)
    assert rep["run"]["id"] == 3 and rep["exit_code"] == 1
    assert [(g["snapshot"], g["kernel"], g["first_run"]) for g in rep["regressions"]] == [("a.cusnap", "gemm", 2)]
    g = rep["regressions"][0]
    assert g["last_good"]["run"] == 1 and g["differences"] == [
        {"dimension": "driver", "what": "driver version", "good": 12080, "bad": 13000}]
    trend = next(h for h in rep["history"] if h["snapshot"] == "a.cusnap" and h["kernel"] == "gemm")
    assert [p["median_us"] for p in trend["points"]] == [1000.0, 1300.0, 1310.0]
    from cudasnap.campaign.report import ReportError
    with pytest.raises(ReportError):
        build_report(s, since="2099-01-01T00:00:00Z")
    assert build_report(s, run=1)["exit_code"] == 0
    # a value of a type its column does not hold (a store edited by hand): named, one line
    s.db.execute("UPDATE kernel_results SET median_us='2026-13-99' WHERE kernel='relu' AND cell_id=1")
    s.close()
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "campaign", "report", str(tmp_path / "h.sqlite"), "--json"],
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 2 and len(cp.stderr.strip().splitlines()) == 1, cp.stderr
    assert "a damaged campaign store: kernel_results row 2: median_us is text ('2026-13-99'), not a number" in cp.stderr


def test_bisect_k_ary_on_two_gpus(cluster, tmp_path):
    """bisect --gpus 2: each round replays two environments at once through Ray; the first
    slow environment of seven is found."""
    steady = '{ CUDA_DOUBLE_SLOW = "*:1", CUDA_DOUBLE_SLOW_FLOOR_US = "4000", CUDA_DOUBLE_CLOCK = "virtual" }'
    slow = '{ CUDA_DOUBLE_SLOW = "*:1,fill:4", CUDA_DOUBLE_SLOW_FLOOR_US = "4000", CUDA_DOUBLE_CLOCK = "virtual" }'
    envs = tmp_path / "envs.toml"
    envs.write_text("".join(f'[[env]]\nname = "e{i}"\nvars = {steady if i < 3 else slow}\n' for i in range(7)))
    cp = _cli(cluster, "bisect", cluster["snaps"] / "s0.cusnap", "--envs", envs, "--repeat", "7", "--warmup", "1",
              "--threshold", "30", "--gpus", "2", "--address", cluster["address"], "--json")
    assert cp.returncode == 1, cp.stdout[-2000:] + cp.stderr[-2000:]
    res = json.loads(cp.stdout)
    assert res["first_bad"]["name"] == "e3" and res["last_good"]["name"] == "e2"
    rounds = [ln for ln in cp.stderr.splitlines() if ln.startswith("[round] 2 environments at once")]
    assert len(rounds) >= 2, cp.stderr            # the two ends, then two points of (0, 6)
    # 7 environments: a binary search needs 2 rounds for the ends and 3 more; two at a time, 1 + 2
    assert res["gpus"] == 2 and res["rounds"] == 3, res


def test_cells_longest_first_by_their_past_times(tmp_path):
    """A run orders its cells by how long they took in earlier runs (LPT: the last GPU to
    finish waits less for a long cell submitted late); a cell never run is estimated from its
    snapshot's size at the others' seconds per byte."""
    from types import SimpleNamespace
    from cudasnap.campaign.engine import Engine
    from cudasnap.campaign.plan import Cell, Env, Rules, Snapshot
    s = Store(tmp_path / "t.sqlite")
    camp = SimpleNamespace(name="n", path="/n.toml", file_hash="h", baseline="plain", rules=Rules())
    rid, _ = s.open_run(camp, "0.1.0", None, fresh=True)
    # past: small.cusnap (1 MB) took 90 s, big.cusnap (100 MB) 10 s
    for key, digest, wall in (("small", "d-small", 90.0), ("big", "d-big", 10.0)):
        s.add_cell(rid, {"cell_key": key, "snapshot": f"/s/{key}.cusnap", "snapshot_digest": digest,
                         "mode": "isolated", "env": "plain", "env_json": "{}", "is_baseline": 1, "status": "ok",
                         "verdict": "SAME", "regressed": 0, "attempts": 1, "reruns": 0, "wall_s": wall,
                         "finished": "2026-01-01T00:00:00Z"}, [], None)
    s.close_run(rid, "done", ["n1"], 0)
    env = Env(index=0, name="plain")
    cells = [Cell(snapshot=Snapshot(f"/s/{k}.cusnap", d, size), env=env, key=k, baseline_key=None)
             for k, d, size in (("big", "d-big", 100_000_000), ("small", "d-small", 1_000_000),
                                ("new", "d-new", 50_000_000))]
    order = Engine._longest_first(SimpleNamespace(store=s), cells)
    # new: 50 MB at the median of 90 s/MB and 0.1 s/MB (45.05 s/MB) = about 2,250 s
    assert [c.key for c in order] == ["new", "small", "big"]


def _engine_stub(monkeypatch, verdicts):
    """An Engine without Ray: submissions recorded, judgements scripted (one per _advance:
    (regressed, borderline)), the store a list."""
    from types import SimpleNamespace
    from cudasnap.campaign import engine as E
    eng = object.__new__(E.Engine)
    eng.c = SimpleNamespace(rules=SimpleNamespace(threshold=10.0, noise_factor=2.0, max_reruns=1, confirm=True),
                            baseline_env="plain")
    eng.gpus, eng.inflight, eng.states, eng.hosts = 4, {}, {}, set()
    eng.run_id, eng._skip_ids, eng.base_profiles = 1, {}, {"base": {"tag": "base"}}
    eng.counts = {"ran": 0, "failed": 0, "regressed": 0}
    eng.noise, eng.deferred = E.NoiseModel(), []
    eng.on_event = lambda kind, info: None
    eng.cancelled, eng.sent, eng.finished = [], [], []
    eng.ray = SimpleNamespace(cancel=lambda ref: eng.cancelled.append(ref))
    eng.store = SimpleNamespace(add_attempt=lambda run, key, a: eng.sent.append(("attempt", a["purpose"], a["outcome"])),
                                add_cell=lambda run, row, kernels, prof: eng.finished.append(row["verdict"]) or 7)

    def submit(st, purpose, with_bytes=False):
        ref = f"{purpose}#{len(eng.sent)}"
        eng.inflight[ref] = (st, purpose, 0.0)
        eng.sent.append(("submit", purpose))
        return ref
    eng._submit = submit
    script = iter(verdicts)

    def judge(base, cand, thr):
        if cand.get("tag") == "confirm":
            return {"regressed": True, "faster": False, "slower": ["k"]}
        reg, bl = next(script)
        return {"regressed": reg, "faster": False, "slower": ["k"] if reg else [], "bl": bl}
    monkeypatch.setattr(E.R, "judge", judge)
    monkeypatch.setattr(E.R, "borderline", lambda res, thr, f: res["bl"] if "bl" in res else False)
    monkeypatch.setattr(E.R, "slower", lambda res: res["slower"])
    monkeypatch.setattr(E.R, "merge_profiles", lambda ps: ps[-1] if ps else None)
    monkeypatch.setattr(E.R, "kernel_rows", lambda res, prof, unconfirmed, *a: [])
    eng.paired = lambda cell: False         # the unpaired flow: a baseline of an earlier run
    cell = SimpleNamespace(key="c1", baseline_key="base", snapshot=SimpleNamespace(path="s", digest="d", kernels=None,
                           mode="timeline"), env=SimpleNamespace(name="e", gpu=None), identity=lambda: {})
    st = E.CellState(cell)
    eng.states["c1"] = st
    return eng, st


def _arrive(eng, st, purpose, profile=None, lost=False):
    ref = next(r for r, v in eng.inflight.items() if v[1] == purpose)
    del eng.inflight[ref]
    res = {"lost": True} if lost else {"exit_code": 0, "profile": profile or {"tag": purpose}, "proc_s": 1.0}
    eng._handle(st, purpose, 0.0, res)


def test_a_borderline_regression_at_the_tail_confirms_beside_its_reruns(monkeypatch):
    """An idle GPU runs the confirmation with the reruns; it counts only when the reruns still
    find the regression, and is judged alone, as one sent after them."""
    eng, st = _engine_stub(monkeypatch, [(True, True), (True, False)])
    eng._submit(st, "measure")
    _arrive(eng, st, "measure")
    assert [x for x in eng.sent if x[0] == "submit"][1:] == [("submit", "rerun"), ("submit", "rerun-baseline"),
                                                            ("submit", "confirm")]
    _arrive(eng, st, "confirm", profile={"tag": "confirm"})     # first in: waits for the reruns
    assert not eng.finished
    _arrive(eng, st, "rerun")
    _arrive(eng, st, "rerun-baseline")
    assert eng.finished == ["SLOWER"] and not eng.cancelled


def test_a_confirmation_sent_ahead_is_cancelled_when_the_reruns_clear_the_cell(monkeypatch):
    eng, st = _engine_stub(monkeypatch, [(True, True), (False, False)])
    eng._submit(st, "measure")
    _arrive(eng, st, "measure")
    _arrive(eng, st, "rerun")
    _arrive(eng, st, "rerun-baseline")
    assert eng.finished == ["SAME"] and len(eng.cancelled) == 1
    _arrive(eng, st, "confirm", lost=True)                   # the cancelled task's end
    assert eng.finished == ["SAME"] and eng.sent[-1] == ("attempt", "confirm", "cancelled")


def test_no_confirmation_ahead_while_every_gpu_has_work(monkeypatch):
    eng, st = _engine_stub(monkeypatch, [(True, True), (True, False), (True, False)])
    eng.gpus = 3                                             # measure done; rerun, rerun-baseline and 1 more queued
    eng.inflight["other"] = (None, "measure", 0.0)
    eng._submit(st, "measure")
    _arrive(eng, st, "measure")
    assert ("submit", "confirm") not in eng.sent
    _arrive(eng, st, "rerun")
    _arrive(eng, st, "rerun-baseline")
    assert eng.sent[-1] == ("submit", "confirm") and not eng.finished
    _arrive(eng, st, "confirm", profile={"tag": "confirm"})
    assert eng.finished == ["SLOWER"]


def test_the_example_campaign_files_plan(tmp_path):
    """examples/nightly.toml and the README's campaign file are campaigns the planner takes."""
    import re
    import shutil
    from pathlib import Path
    from cudasnap.campaign.plan import load_campaign
    root = Path(__file__).resolve().parent.parent
    c = load_campaign(root / "examples" / "nightly.toml")
    assert c.baseline == "plain" and len(c.cells) == 3 * len(list((root / "examples").glob("*_h200.cusnap")))
    assert c.controls == ["noop"] and [x.control for x in c.cells[:3]] == [False, False, True]
    toml = re.search(r"```toml\n(.*?)```", (root / "README.md").read_text(), re.S).group(1)
    (tmp_path / "snaps").mkdir()
    shutil.copy(root / "examples" / "synthetic.cusnap", tmp_path / "snaps" / "a.cusnap")
    fake_driver = tmp_path / "opt" / "r580" / "libcuda.so.1"
    fake_driver.parent.mkdir(parents=True)
    fake_driver.write_bytes(b"\x7fELF")
    (tmp_path / "c.toml").write_text(toml.replace("/opt/r580/", f"{fake_driver.parent}/"))
    c = load_campaign(tmp_path / "c.toml")
    assert [e.name for e in c.envs] == ["plain", "noop", "r580"] and c.envs[2].gpu == "H100" and len(c.cells) == 3
    assert c.controls == ["noop"]


def test_html_report_at_scale(tmp_path):
    """40 kernels of long C++ names in a snapshot: the chart plots the top 8 (the regressed one
    first), the other 32 are listed under it; names are demangled and shortened, the full name
    in a tooltip; every verdict links to its evidence (its replays: side, round, GPU)."""
    pytest.importorskip("plotly")
    from types import SimpleNamespace
    from cudasnap.campaign.plan import Rules
    from cudasnap.campaign.report import build_report
    from cudasnap.campaign.report_html import html_report
    s = Store(tmp_path / "big.sqlite")
    camp = SimpleNamespace(name="big", path="/b.toml", file_hash="h", baseline="plain", rules=Rules())
    rid, _ = s.open_run(camp, "0.1.0", None, fresh=True)
    names = [f"_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_13BinaryFunctorIfffNS0_15binary_internal"
             f"10MulFunctorIfEEEESt5arrayIPcLm{i}EEEEviT0_T1_" for i in range(40)]
    env = {"name": "x", "vars": {}, "driver": None, "driver_digest": None, "gpu": None, "replace": {}}
    for key, e_name, base in (("b", "plain", 1), ("c", "slow", 0)):
        kern = [{"kernel": n, "median_us": 100.0 - i + (50 if (i == 20 and not base) else 0), "ratio": 1.0,
                 "diff_pct": 50.0 if (i == 20 and not base) else 0.0, "p_value": 0.002, "bar_pct": 10.0,
                 "verdict": ("SLOWER" if (i == 20 and not base) else "SAME") if not base else None}
                for i, n in enumerate(names)]
        cid = s.add_cell(rid, {"cell_key": key, "snapshot": "/s/big.cusnap", "snapshot_digest": "d", "mode": "timeline",
                               "env": e_name, "env_json": json.dumps(dict(env, name=e_name)), "is_baseline": base,
                               "status": "ok", "verdict": "BASELINE" if base else "SLOWER", "regressed": 1 - base,
                               "attempts": 4, "reruns": 0, "finished": "2026-01-01T00:00:00Z", "gpu": "h:0@n1",
                               "baseline_cell_id": None if base else 1}, kern, {"summary": {}, "launches": [], "kernels": []})
        if not base:
            for n, (side, rnd) in enumerate((("baseline", 1), ("candidate", 1), ("baseline", 2), ("candidate", 2)), 1):
                s.add_attempt(rid, key, {"purpose": "measure", "outcome": "ok", "exit_code": 0, "host": "h",
                                         "visible_devices": "0", "proc_s": 1.5, "side": side, "round": rnd})
    s.close_run(rid, "done", ["h"], 1)
    rep = build_report(s)
    page = html_report(rep)
    assert len(rep["verdicts"]) == 1 and len(rep["verdicts"][0]["runs"]) == 4
    # the chart: 8 traces per snapshot and env plotted (JSON inside the page), the regressed kernel among them
    assert "top 8 of 40 kernels" in page
    assert "32 more kernel(s) of big.cusnap" in page
    legend = re.findall(r'"name":"(slow|plain): ([^"]*)"', page)
    legend = [json.loads(f'"{n}"') for _, n in legend]
    assert 8 <= len(legend) <= 16 and all(len(n) <= 40 for n in legend), legend[:3]
    assert all(n.startswith("vectorized_elementwise_ker") for n in legend), legend[:3]     # no namespaces
    # names shortened, full demangled name on hover (read as JSON: plotly may write '…' as \u2026)
    hovers = [json.loads(f'"{h}"') for h in re.findall(r'"hovertemplate":"((?:[^"\\]|\\.)*)"', page)]
    assert any("vectorized_elementwise_kernel&lt;4, at::native::BinaryFunctor&lt;…&gt;" in h for h in hovers), hovers[:2]
    assert "title='void at::native::vectorized_elementwise_kernel&lt;4, at::native::BinaryFunctor&lt;float, float" in page
    # every verdict links to an anchor that exists, with its four replays
    links = set(re.findall(r"href='#(v[0-9a-f-]+)'", page))
    ids = set(re.findall(r"id='(v[0-9a-f-]+)'", page))
    assert links and links <= ids
    ev = page.split(f"id='{next(iter(ids))}'", 1)[1]
    assert ev.count("<tr>") >= 5 and "candidate" in ev and "baseline" in ev
