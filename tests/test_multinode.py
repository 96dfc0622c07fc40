"""A campaign on several Ray nodes, simulated on this machine by Ray's own multi-node test
cluster (ray.cluster_utils.Cluster): a head without GPUs and two nodes of two fake GPUs each,
every node with its own snapshot cache (CUDASNAP_CACHE), the snapshots shipped through Ray's
object store (--ship), as on hosts without shared storage. One node is removed while cells run
on it: its cells run again on the other, every cell completes once, and nothing is counted twice."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from test_compare import three_kernels  # noqa: E402

STEADY = 'CUDA_DOUBLE_SLOW = "*:1", CUDA_DOUBLE_SLOW_FLOOR_US = "2000", CUDA_DOUBLE_CLOCK = "virtual", CUDA_DOUBLE_WALL_US = "2000"'


@pytest.fixture
def nodes(double, tmp_path):
    saved = {k: os.environ.get(k) for k in ("LD_LIBRARY_PATH", "RAY_AUTH_MODE")}
    os.environ["LD_LIBRARY_PATH"] = double["env"]["LD_LIBRARY_PATH"]      # the nodes' workers load the double
    os.environ["RAY_AUTH_MODE"] = "disabled"
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0, "include_dashboard": False})
    gpu_nodes = []
    try:
        for i in range(2):
            gpu_nodes.append(c.add_node(num_cpus=1, num_gpus=2, resources={"gpu_model:H100": 2},
                                        env_vars={"CUDASNAP_CACHE": str(tmp_path / f"cache{i}")}))
        c.wait_for_nodes()
        yield {"cluster": c, "gpu_nodes": gpu_nodes, "address": c.address,
               "env": dict(double["env"], RAY_AUTH_MODE="disabled")}
    finally:
        c.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_a_node_lost_mid_campaign_reruns_its_cells_elsewhere(nodes, tmp_path, record_property):
    snaps = tmp_path / "snaps"
    snaps.mkdir()
    # a snapshot's cells are one task: twice as many snapshots as GPUs, so that the node still
    # runs one when it is removed
    for i in range(8):
        three_kernels(snaps / f"m{i}.cusnap", n=32 + 16 * i)
    envs = "".join(f'[[env]]\nname = "{n}"\nvars = {{ {STEADY}{more} }}\n' for n, more in (
        ("plain", ""), ("eager", ', CUDA_MODULE_LOADING = "EAGER"'), ("conns", ', CUDA_DEVICE_MAX_CONNECTIONS = "8"')))
    camp = tmp_path / "camp.toml"
    camp.write_text(f'name = "nodes"\nbaseline = "plain"\n[rules]\nrepeats = 5\nwarmup = 1\nthreshold = 20\n'
                    f'max_reruns = 1\ntimeout = 120\nretries = 3\n[[snapshot]]\npath = "{snaps}/m*.cusnap"\n{envs}')
    store = tmp_path / "st.sqlite"
    p = subprocess.Popen([sys.executable, "-m", "cudasnap", "campaign", "run", str(camp), "-o", str(store),
                          "--address", nodes["address"], "--ship", "--json"], env=nodes["env"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = nodes["gpu_nodes"][1]
    vid = victim.node_id
    # remove the node once it has finished a cell and holds a snapshot whose cells are still
    # running there: a shipped snapshot lands in the node's own cache when its task starts, and
    # its cells reach the store only when the task ends
    cache = tmp_path / "cache1" / "snapshots"
    deadline = time.monotonic() + 240
    removed_at = None
    seen_running: set = set()
    while time.monotonic() < deadline and p.poll() is None:
        try:
            db = sqlite3.connect(store)
            done_there = db.execute("SELECT COUNT(*) FROM attempts WHERE node_id=?", (vid,)).fetchone()[0]
            finished = {r[0] for r in db.execute("SELECT DISTINCT snapshot_digest FROM cells")}
            cells = db.execute("SELECT COUNT(*) FROM cells").fetchone()[0]
            db.close()
        except sqlite3.Error:
            done_there, finished, cells = 0, set(), 0
        there = {f.stem for f in cache.glob("*.cusnap")} if cache.is_dir() else set()
        running = there - finished
        # seen running on two polls 0.2 s apart: a task that has just returned (its cells not
        # yet in the store) is not taken for one still running
        if done_there >= 1 and running and running & seen_running:
            nodes["cluster"].remove_node(victim, allow_graceful=False)
            removed_at = cells
            break
        seen_running = running if done_there >= 1 else set()
        time.sleep(0.2)
    out, err = p.communicate(timeout=600)
    assert removed_at is not None, f"the node never had a cell running after finishing one: {err[-2000:]}"
    assert p.returncode == 0, out[-3000:] + err[-3000:]
    res = json.loads(out)
    assert res["cells"] == 24 and res["ran"] == 24 and res["failed"] == 0
    rep = res["report"]
    assert rep["verdict_counts"] == {"BASELINE": 8, "SAME": 16}, rep["verdict_counts"]
    db = sqlite3.connect(store)
    # every cell once, each finished ok
    assert db.execute("SELECT COUNT(*), COUNT(DISTINCT cell_key) FROM cells").fetchone() == (24, 24)
    assert db.execute("SELECT COUNT(*) FROM cells WHERE status<>'ok'").fetchone()[0] == 0
    lost = db.execute("SELECT cell_key, node_id FROM attempts WHERE outcome='lost'").fetchall()
    assert lost, "no task was lost with the node"
    for key, _ in lost:
        # the lost cell ran again after the loss, on the node that stayed
        later = db.execute("SELECT node_id, outcome FROM attempts WHERE cell_key=? AND outcome='ok' ORDER BY n",
                           (key,)).fetchall()
        assert later and later[-1][0] != vid, (key, later)
    # nothing counted twice: a cell's kernels once, and each paired cell's timings from whole pairs only
    assert db.execute("SELECT COUNT(DISTINCT cell_id) FROM kernel_results").fetchone()[0] == 24
    assert db.execute("SELECT COUNT(*) FROM (SELECT cell_id, kernel FROM kernel_results GROUP BY cell_id, kernel "
                      "HAVING COUNT(*) > 1)").fetchone()[0] == 0
    for key, n_base, n_cand in db.execute(
            "SELECT cell_key, SUM(side='baseline' AND outcome='ok'), SUM(side='candidate' AND outcome='ok') "
            "FROM attempts WHERE side IS NOT NULL AND cell_key IN (SELECT cell_key FROM cells WHERE is_baseline=0) "
            "GROUP BY cell_key"):
        assert n_base == n_cand, (key, n_base, n_cand)
    nodes_used = {r[0] for r in db.execute("SELECT DISTINCT node_id FROM attempts WHERE outcome='ok'")}
    assert len(nodes_used) == 2
    # the snapshots reached each node through the object store, into that node's own cache
    for i in range(2):
        assert any(f.suffix == ".cusnap" for f in (tmp_path / f"cache{i}" / "snapshots").iterdir())
    record_property("ci_summary", f"campaign on 2 Ray nodes x 2 fake GPUs, one node removed after {removed_at} cells: "
                                  f"24 of 24 cells done once, {len(lost)} lost task(s) rerun on the other node")
