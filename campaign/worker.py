"""What runs on a Ray worker for one replay of a cell: the replay, with the environment's
variables and driver, pinned to the GPU Ray gave the task (CUDA_VISIBLE_DEVICES), forked by a
replay server that stays up for that GPU and environment (cellserver.py); with [rules]
workers = "kept" run by that server's one kept process, replay after replay; with "fresh" in a
new process of its own. Either way the replay is handed over as a typed
document (replay/invocation.py). Servers and replays die with the
worker (PDEATHSIG), so a lost worker never leaves a replay holding its GPU."""
from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

import xxhash

from cudasnap.formats.opened import version
from . import keeper

# a test hook: when this file exists, the first replay to claim it (by removing it) has its
# worker SIGKILLed while the replay runs, as a lost worker would
KILL_HOOK = "CUDASNAP_CAMPAIGN_TEST_KILL"
_verified: Dict[tuple, str] = {}


def cache_dir() -> str:
    d = os.environ.get("CUDASNAP_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "cudasnap")
    return os.path.join(d, "snapshots")


def _digest(path: str) -> str:
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def local_snapshot(spec: Dict[str, Any], same_node: bool, blob: Optional[bytes]) -> Optional[str]:
    """The snapshot's path on this node: the driver's own path (same node, or shared storage
    holding the same bytes), a cached copy, or the bytes from the object store written to the
    cache. None: the driver must send the bytes."""
    path, digest, size = spec["path"], spec["digest"], spec["size"]
    if not spec.get("ship"):
        if same_node and os.path.isfile(path):
            return path
        try:
            st = os.stat(path)
            k = (path,) + version(st)          # a rewrite that kept size and mtime is digested again
            if st.st_size == size and (_verified.get(k) == digest or _digest(path) == digest):
                _verified[k] = digest
                return path
        except OSError:
            pass
    cached = os.path.join(cache_dir(), digest + ".cusnap")
    if os.path.isfile(cached) and os.path.getsize(cached) == size:
        return cached
    if blob is None:
        return None
    os.makedirs(os.path.dirname(cached), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(cached), prefix=f".{digest}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, cached)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return cached


def die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except OSError:
        pass
    os.setsid()


def _driver_dir(driver: str) -> str:
    """A directory holding the driver as libcuda.so.1, for LD_LIBRARY_PATH; stable, so that a
    replay server started with it outlives the cell that started it."""
    p = os.path.abspath(driver)
    if os.path.isdir(p):
        return p
    if os.path.basename(p) == "libcuda.so.1":
        return os.path.dirname(p)
    d = os.path.join(tempfile.gettempdir(), f"cudasnap-drivers-{os.getuid()}", xxhash.xxh3_64_hexdigest(p))
    os.makedirs(d, exist_ok=True)
    link = os.path.join(d, "libcuda.so.1")
    if os.path.realpath(link) != p:
        tmp = f"{link}.{os.getpid()}"
        os.symlink(p, tmp)
        os.replace(tmp, link)
    return d


def _cell_env(spec: Dict[str, Any], visible: str) -> Dict[str, str]:
    env = dict(os.environ)
    env.update(spec["vars"])
    env.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    env.pop(KILL_HOOK, None)
    if visible:
        env["CUDA_VISIBLE_DEVICES"] = visible
    if spec.get("driver"):
        d = _driver_dir(spec["driver"])
        old = env.get("LD_LIBRARY_PATH", "")
        env["LD_LIBRARY_PATH"] = d + (os.pathsep + old if old else "")
    return env


def _request(spec: Dict[str, Any], snap: str, out: str) -> Dict[str, Any]:
    from cudasnap.replay.invocation import profiled
    return profiled(snap, out, spec["mode"], spec.get("kernels"), spec["repeat"], spec["warmup"])


def _fresh(spec: Dict[str, Any], env: Dict[str, str], snap: str, out: str) -> Dict[str, Any]:
    """One replay in a new process of its own ([rules] workers = "fresh")."""
    from cudasnap.replay.invocation import command
    cmd = command(sys.executable, _request(spec, snap, out))
    t0 = time.monotonic()
    # a process of its own: workers = "fresh": an environment's variables and driver apply from a process's start
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         preexec_fn=die_with_parent)
    _maybe_kill_self()
    try:
        _, err = p.communicate(timeout=spec["timeout"])
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        rc, err = 124, f"the replay ran past {spec['timeout']:g} s"
    except BaseException:           # cancelled: the replay goes with the task
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        raise
    lines = [ln for ln in (err or "").splitlines() if ln.strip()]
    return {"exit_code": rc, "stderr_tail": "\n".join(lines[-5:]), "proc_s": time.monotonic() - t0}


def _warm(spec: Dict[str, Any], env: Dict[str, str], snap: str, out: str) -> Dict[str, Any]:
    """One replay forked by this worker's replay server for the cell's GPU and environment."""
    from . import cellserver
    key = (env.get("CUDA_VISIBLE_DEVICES"), env.get("LD_LIBRARY_PATH"), tuple(sorted(spec["vars"].items())))
    req = dict(_request(spec, snap, out), timeout=spec["timeout"], kept=spec.get("workers") == "kept")
    t0 = time.monotonic()
    try:
        client, new = cellserver.client_for(key, env)
        t_run = time.monotonic()
        _maybe_kill_self()
        rep = client.run(req)
    except cellserver.ServerGone as e:
        cellserver.drop(key)
        return {"exit_code": None, "stderr_tail": str(e), "proc_s": time.monotonic() - t0, "server_lost": True}
    except BaseException:           # cancelled: the server and its replay go with the task
        cellserver.drop(key)
        raise
    rep["server_start_s"] = round(t_run - t0, 4) if new else 0.0
    return rep


def run_replay(spec: Dict[str, Any], gpu_ids: List[Any], snap: str) -> Dict[str, Any]:
    """One replay, by the worker's replay server (or a new process: [rules] workers = "fresh");
    the result without any Ray type in it."""
    res: Dict[str, Any] = {"host": socket.gethostname(), "visible_devices": ",".join(str(g) for g in gpu_ids),
                           "started": time.time()}
    root = spec.get("work_root")        # the driver's, on its node: removed when the run ends
    with tempfile.TemporaryDirectory(prefix="cudasnap-cell-", dir=root if root and os.path.isdir(root) else None) as work:
        out = os.path.join(work, "cell.json")
        env = _cell_env(spec, res["visible_devices"] if gpu_ids else "")
        if gpu_ids and spec.get("hold_gpu"):
            keeper.ensure(res["visible_devices"])   # the next replays on this GPU start warm
        r = (_fresh if spec.get("workers") == "fresh" else _warm)(spec, env, snap, out)
        res.update(r)
        rc = res["exit_code"]
        res["profile"] = None
        if rc in (0, 1) and os.path.exists(out):
            try:
                with open(out) as f:
                    res["profile"] = json.load(f)
            except (OSError, ValueError) as e:
                res["stderr_tail"] += f"\nprofile unreadable: {e}"
        if res["profile"] is not None:
            t = (res["profile"].get("run") or {}).get("timings_s") or {}
            if isinstance(t.get("launches"), (int, float)):
                # what the replay cost beyond its launches: process or fork, imports, reading,
                # cuInit, contexts, modules, memory, the report
                res["fixed_s"] = max(0.0, res["proc_s"] - t["launches"])
        if res["profile"] is not None and spec.get("driver"):
            got = (res["profile"].get("run") or {}).get("libcuda")
            want = os.path.realpath(spec["driver"] if not os.path.isdir(spec["driver"])
                                    else os.path.join(spec["driver"], "libcuda.so.1"))
            if got and os.path.realpath(got) != want:
                res["exit_code"] = 2
                res["stderr_tail"] = f"driver {spec['driver']} requested, but the replay loaded {got}"
                res["profile"] = None
    res["ended"] = time.time()
    return res


def _maybe_kill_self() -> None:
    hook = os.environ.get(KILL_HOOK)
    if not hook:
        return
    try:
        os.unlink(hook)             # claimed: only one replay is killed
    except OSError:
        return
    # at once: a replay (or a task of several) may end within any delay, the worker then dying idle
    os.kill(os.getpid(), signal.SIGKILL)


def cell_task(spec: Dict[str, Any], blob_refs: List[Any], driver_node: str, submitted: float) -> Dict[str, Any]:
    """The body of the Ray task (engine.py wraps it with its resources)."""
    import ray

    ctx = ray.get_runtime_context()
    node = ctx.get_node_id()
    queue_s = max(0.0, time.time() - submitted)
    blob = None
    snap = local_snapshot(spec, node == driver_node, None)
    if snap is None and blob_refs:
        blob = ray.get(blob_refs[0])
        snap = local_snapshot(spec, node == driver_node, blob)
    if snap is None:
        return {"need_bytes": True, "node_id": node, "host": socket.gethostname()}
    res = run_replay(spec, list(ray.get_gpu_ids()), snap)
    res["node_id"] = node
    res["queue_s"] = queue_s
    return res


def gpu_label(host: Optional[str], node_id: Optional[str], visible: Optional[str]) -> str:
    """A GPU of the cluster: host, Ray's GPU id there and the node (hosts may share a name)."""
    return f"{host or '?'}:{visible or '-'}" + (f"@{node_id[:8]}" if node_id else "")


def pair_task(base_spec: Dict[str, Any], cand_spec: Dict[str, Any], rounds: int, blob_refs: List[Any],
              driver_node: str, submitted: float, avoid: Optional[List[str]] = None) -> Dict[str, Any]:
    """A candidate and its baseline replayed on one GPU, interleaved A B A B (rounds pairs), so
    that the GPU and the time of day cancel in their ratio. avoid: GPUs (gpu_label) or nodes it
    must not run on (a confirmation): it returns at once with wrong_gpu, to be sent again (Ray
    cannot be told which GPU of a node: sent again, it asks for two and uses one it may)."""
    return group_task(base_spec, [cand_spec], rounds, blob_refs, driver_node, submitted, avoid)


def group_task(base_spec: Dict[str, Any], cand_specs: List[Dict[str, Any]], rounds: int, blob_refs: List[Any],
               driver_node: str, submitted: float, avoid: Optional[List[str]] = None) -> Dict[str, Any]:
    """A baseline and every candidate env of its snapshot on one GPU, in rounds B E1 E2 ... En:
    one baseline replay serves each env of its round, still beside it in time. A candidate that
    fails leaves the rounds (the others go on); a baseline that fails ends them. Each run says
    its side, round and candidate (cand: its index in cand_specs)."""
    import ray

    ctx = ray.get_runtime_context()
    node = ctx.get_node_id()
    host = socket.gethostname()
    gpus = list(ray.get_gpu_ids())
    if len(gpus) > 1:
        # given two GPUs to be sure of one it may use: the first it need not avoid, the other idle
        ok = [g for g in gpus if gpu_label(host, node, str(g)) not in (avoid or [])]
        gpus = ok[:1] or gpus[:1]
    label = gpu_label(host, node, ",".join(str(g) for g in gpus))
    if avoid and (label in avoid or node in avoid):
        return {"wrong_gpu": True, "node_id": node, "host": host, "gpu": label}
    queue_s = max(0.0, time.time() - submitted)
    snap = local_snapshot(base_spec, node == driver_node, None)
    if snap is None and blob_refs:
        snap = local_snapshot(base_spec, node == driver_node, ray.get(blob_refs[0]))
    if snap is None:
        return {"need_bytes": True, "node_id": node, "host": host}
    runs: List[Dict[str, Any]] = []
    live = list(range(len(cand_specs)))
    for i in range(rounds):
        for side, j in [("baseline", None)] + [("candidate", j) for j in live]:
            r = run_replay(base_spec if j is None else cand_specs[j], gpus, snap)
            r.update(side=side, round=i + 1, cand=j)
            runs.append(r)
            if r["exit_code"] != 0 or r.get("profile") is None:
                if j is None:
                    return {"runs": runs, "node_id": node, "host": host, "gpu": label, "queue_s": queue_s}
                live.remove(j)
        if not live:
            break
    return {"runs": runs, "node_id": node, "host": host, "gpu": label, "queue_s": queue_s}
