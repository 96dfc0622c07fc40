"""Runs a campaign's cells on Ray.

Each replay is a Ray task asking for one GPU (num_gpus=1) and, when its environment names a
GPU model, a sliver of the custom resource `gpu_model:MODEL` that every node registers for
its GPUs (`ray start --resources '{"gpu_model:H100": 8}'`; a local runtime registers it
itself; Ray's own `accelerator_type:MODEL` is used when a cluster has no gpu_model). Ray
places the tasks; this module decides what to run next (rules.py) and writes each finished
cell to the store at once. A snapshot's baseline cell and the candidate cells judged against
it are one task on one GPU, in rounds B E1 .. En (worker.group_task): each baseline replay
serves every env of its round. A verdict is judged again on more rounds (purpose
"investigate"), then confirmed by a task of baseline and candidate on another GPU, or another
node where the cluster has one (worker.pair_task); a lost task's cells are tried again each
on its own. Snapshots reach a node by path (the same node, or shared storage
holding the same bytes, checked by digest) or once through Ray's object store into a
node-local cache keyed by digest."""
from __future__ import annotations

import contextlib
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from . import rules as R
from .noise import NoiseModel
from .plan import Campaign, Cell
from .store import Store, now_iso
from .worker import gpu_label


@contextlib.contextmanager
def stdout_while_ray():
    """Ray's threads print their notices (a node lost, a worker killed) on stdout: while Ray
    runs, stdout is stderr, so that the command's own output (--json above all) stays whole.
    Yields the real stdout, for that output."""
    real = sys.stdout
    sys.stdout = sys.stderr
    try:
        yield real
    finally:
        sys.stdout = real

# a confirmation that lands on the GPU it must avoid is sent again after a pause; after this
# many tries it runs where it lands (no other GPU came free)
MAX_BOUNCES = 20


class EngineError(Exception):
    """Ray cannot run the campaign (one line, exit 2)."""


def gpu_model(name: str) -> Optional[str]:
    """'NVIDIA H100 80GB HBM3' -> 'H100'; 'NVIDIA GeForce RTX 4090' -> 'RTX4090'."""
    n = re.sub(r"^(NVIDIA|Tesla|Quadro)\s+", "", name.strip(), flags=re.I)
    n = re.sub(r"^GeForce\s+", "", n, flags=re.I)
    m = re.match(r"RTX\s*(\w*\d+\w*)|([A-Z]+\d+\w*)", n)
    if not m:
        return None
    return "RTX" + m.group(1) if m.group(1) else m.group(2)


def local_gpus() -> Optional[List[str]]:
    """The names of this machine's GPUs that CUDA_VISIBLE_DEVICES leaves visible (as Ray counts
    them); None when nvidia-smi cannot tell (Ray then finds the GPUs itself)."""
    try:
        cp = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,name", "--format=csv,noheader"],
                            capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return None
    except (OSError, subprocess.TimeoutExpired):
        return []
    if cp.returncode != 0:
        return []
    rows = [[x.strip() for x in ln.split(",", 2)] for ln in cp.stdout.splitlines() if ln.count(",") >= 2]
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is None:
        return [r[2] for r in rows]
    want = [v.strip() for v in vis.split(",") if v.strip()]
    return [r[2] for r in rows if r[0] in want or any(r[1].startswith(w) for w in want if w.startswith("GPU-"))]


def start_ray(address: Optional[str], init_kwargs: Optional[Dict[str, Any]] = None):
    try:
        import ray
    except ImportError:
        raise EngineError("campaigns run on Ray, which is not installed: pip install 'cudasnap[campaign]'")
    if ray.is_initialized():
        return ray
    import logging
    logging.getLogger("ray").setLevel(logging.ERROR)            # Ray's notices are not ours to print
    kw: Dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
    # No address: a runtime of our own ("local"), never the cluster that RAY_ADDRESS or an
    # earlier `ray start` (its address file outlives a head that died) would point ray.init at.
    kw["address"] = address or "local"
    if address:
        pass                                                    # the cluster has its own resources
    elif init_kwargs:
        kw.update(init_kwargs)
    else:
        names = local_gpus()
        if names == []:
            raise EngineError("this machine has no GPU (nvidia-smi lists none): give --address of a Ray cluster")
        models: Dict[str, int] = {}
        names = names or []
        for n in names:
            m = gpu_model(n)
            if m:
                models[f"gpu_model:{m}"] = models.get(f"gpu_model:{m}", 0) + 1
        if models:
            kw["resources"] = models
    try:
        ray.init(**kw)
    except Exception as e:
        what = f"the Ray cluster at {address}" if address else "a local Ray runtime"
        msg = ' '.join(str(e).split())
        # often token authentication: `ray start` turns it on where ~/.ray/auth_token exists (a
        # local ray.init writes one), and a client that names an address must opt in
        if address:
            raise EngineError(f"cannot reach {what}: {msg[:200]}; if the cluster uses token authentication, "
                              f"set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN to the head's `ray get-auth-token`")
        raise EngineError(f"cannot start {what}: {msg[:300]}")
    return ray


@dataclass
class CellState:
    cell: Cell
    profiles: List[Dict[str, Any]] = field(default_factory=list)
    failures: int = 0
    attempts: int = 0
    reruns: int = 0
    confirming: bool = False
    confirm_profile: Optional[Dict[str, Any]] = None
    confirm_ref: Any = None           # a confirmation run sent ahead of its reruns (an idle GPU)
    base_extra: List[Dict[str, Any]] = field(default_factory=list)     # baseline replays pooled for this cell
    pending: int = 0                  # rerun replays still out
    bad_nodes: List[str] = field(default_factory=list)
    first_submit: Optional[float] = None
    proc_s: float = 0.0
    last: Optional[Dict[str, Any]] = None
    waiting: bool = False             # measured, waiting for its baseline
    done: bool = False
    verdict: Optional[str] = None
    cell_id: Optional[int] = None
    status: Optional[str] = None
    pairs: List[Dict[str, Any]] = field(default_factory=list)     # paired tasks: base, cand, gpu, host, node
    confirm_pair: Optional[Dict[str, Any]] = None
    bounces: int = 0                  # a confirmation landed on a GPU it must avoid
    replays: float = 0.0              # its replays, a shared baseline replay counted in shares
    investigated: int = 0             # more rounds run for a control's verdict


@dataclass
class Group:
    """A snapshot's baseline and its candidate cells, replayed together on one GPU in rounds
    B E1 ... En (worker.group_task); base: the baseline cell, finished from the same replays,
    or None (finished earlier, or its GPU model differs)."""
    base_cell: Cell
    base: Optional[CellState]
    members: List[CellState]
    model: Optional[str]


class Engine:
    def __init__(self, campaign: Campaign, store: Store, run_id: int, address: Optional[str] = None,
                 init_kwargs: Optional[Dict[str, Any]] = None, ship: bool = False,
                 on_event: Optional[Callable[[str, Dict[str, Any]], None]] = None):
        self.c = campaign
        self.store = store
        self.run_id = run_id
        self.ship = ship
        self.on_event = on_event or (lambda kind, info: None)
        self.ray = start_ray(address, init_kwargs)
        self.hosts: set = set()
        self._blobs: Dict[str, Any] = {}
        self._base_run: Optional[int] = None
        self._skip_ids: Dict[str, int] = {}
        self._resources()
        ray = self.ray

        from .worker import cell_task, group_task, pair_task
        self._task = ray.remote(max_retries=0)(cell_task)
        self._pair = ray.remote(max_retries=0)(pair_task)
        self._group = ray.remote(max_retries=0)(group_task)
        self.noise = NoiseModel()
        self.deferred: List[Any] = []     # (when, state, purpose): confirmations sent again
        self.driver_node = ray.get_runtime_context().get_node_id()
        # the cells' work directories on this node live here, so that the run removes them all
        # when it ends, even those of replays killed with their workers by an interrupt
        import tempfile
        self.work_root = tempfile.mkdtemp(prefix="cudasnap-campaign-")

    # ------------------------------------------------------------------ resources
    def _resources(self) -> None:
        total = self.ray.cluster_resources()
        self.gpus = int(total.get("GPU", 0))
        if self.gpus < 1:
            raise EngineError("the Ray cluster has no GPU (num_gpus): campaigns replay one cell per GPU")
        self.model_key: Dict[str, str] = {}
        for e in self.c.envs:
            if not e.gpu:
                continue
            for key in (f"gpu_model:{e.gpu}", f"accelerator_type:{e.gpu}"):
                if total.get(key, 0) > 0:
                    self.model_key[e.gpu] = key
                    break
            else:
                have = sorted(k.split(":", 1)[1] for k in total if k.startswith(("gpu_model:", "accelerator_type:")))
                raise EngineError(f"env {e.name!r} needs a {e.gpu} GPU; the Ray cluster offers "
                                  f"{', '.join(have) or 'no GPU model resource'}")

    def slots(self) -> int:
        return self.gpus

    # ------------------------------------------------------------------ submission
    def _spec(self, cell: Cell) -> Dict[str, Any]:
        s, e, r = cell.snapshot, cell.env, self.c.rules
        return {"path": s.path, "digest": s.digest, "size": s.size, "ship": self.ship, "mode": s.mode,
                "kernels": s.kernels, "vars": cell.vars, "driver": e.driver, "repeat": r.repeats, "warmup": r.warmup,
                "timeout": r.timeout, "hold_gpu": r.hold_gpus, "work_root": self.work_root, "workers": r.workers}

    def paired(self, cell: Cell) -> bool:
        """A cell replayed beside its baseline on one GPU: its baseline is an env of this run
        and one GPU model suits both."""
        if cell.baseline_key is None:
            return False
        base = self.by_key[cell.baseline_key].env.gpu
        return base is None or cell.env.gpu is None or base == cell.env.gpu

    def _submit(self, st: CellState, purpose: str, with_bytes: bool = False):
        if purpose != "rerun-baseline" and self.paired(st.cell):
            return self._submit_pair(st, purpose, with_bytes)
        # a baseline rerun replays the baseline's snapshot and env, for this cell's judgement
        cell = self.by_key[st.cell.baseline_key] if purpose == "rerun-baseline" else st.cell
        opts: Dict[str, Any] = {"num_gpus": 1, "num_cpus": 0}
        if cell.env.gpu:
            opts["resources"] = {self.model_key[cell.env.gpu]: 0.001}
        if st.bad_nodes:
            alive = [n["NodeID"] for n in self.ray.nodes() if n.get("Alive") and n["NodeID"] not in st.bad_nodes
                     and n.get("Resources", {}).get("GPU", 0) > 0]
            if alive:
                from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
                opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(alive[st.failures % len(alive)], soft=True)
        refs = []
        if with_bytes or self.ship:
            refs = [self._blob(cell.snapshot)]
        if st.first_submit is None:
            st.first_submit = time.monotonic()
        ref = self._task.options(**opts).remote(self._spec(cell), refs, self.driver_node, time.time())
        self.inflight[ref] = (st, purpose, time.monotonic())
        self.on_event("submit", {"cell": cell, "purpose": purpose})
        return ref

    def _submit_pair(self, st: CellState, purpose: str, with_bytes: bool = False):
        cell = st.cell
        base = self.by_key[cell.baseline_key]
        opts: Dict[str, Any] = {"num_gpus": 1, "num_cpus": 0}
        model = cell.env.gpu or base.env.gpu
        if model:
            opts["resources"] = {self.model_key[model]: 0.001}
        gpu_nodes = []
        if st.bad_nodes or purpose == "confirm":
            gpu_nodes = [n["NodeID"] for n in self.ray.nodes() if n.get("Alive")
                         and n.get("Resources", {}).get("GPU", 0) > 0]
        avoid = None
        if purpose == "confirm" and st.bounces < MAX_BOUNCES:
            # another GPU; another node where the cluster has one with a GPU
            # the GPUs of the measurement; an investigation's are more rounds of it, anywhere
            meas = [p for p in st.pairs if not p.get("inv")] or st.pairs
            used = {p["node"] for p in meas}
            others = [n for n in gpu_nodes if n not in used and n not in st.bad_nodes]
            avoid = [p["gpu"] for p in meas] + (sorted(used) if others else [])
            if others:
                from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
                opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(others[st.bounces % len(others)], soft=True)
            elif st.bounces and self._node_gpus(st.pairs[0]["node"]) >= 2:
                # Ray gave the GPU to avoid again (it hands out a node's free GPUs lowest first):
                # two GPUs of the node hold one that is not it
                opts["num_gpus"] = 2
        if st.bad_nodes and "scheduling_strategy" not in opts:
            alive = [n for n in gpu_nodes if n not in st.bad_nodes]
            if alive:
                from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
                opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(alive[st.failures % len(alive)], soft=True)
        refs = [self._blob(cell.snapshot)] if (with_bytes or self.ship) else []
        if st.first_submit is None:
            st.first_submit = time.monotonic()
        rounds = self.c.rules.investigate if purpose == "investigate" else self.c.rules.pairs
        ref = self._pair.options(**opts).remote(self._spec(base), self._spec(cell), rounds, refs,
                                                self.driver_node, time.time(), avoid)
        self.inflight[ref] = (st, purpose, time.monotonic())
        self.on_event("submit", {"cell": cell, "purpose": purpose})
        return ref

    def groups(self, cells: List[Cell]) -> List[Any]:
        """What the run submits first, in the cells' order: a Group for each snapshot's baseline
        and its paired cells (one per GPU model they need), a CellState for any other cell."""
        out: List[Any] = []
        for c in cells:
            if not self.paired(c):
                continue
            base = self.by_key[c.baseline_key]
            g = next((g for g in out if g.base_cell.key == c.baseline_key
                      and (g.model is None or c.env.gpu in (None, g.model))), None)
            if g is None:
                g = Group(base, None, [], base.env.gpu or c.env.gpu)
                out.append(g)
            g.model = g.model or c.env.gpu
            g.members.append(self.states[c.key])
        for c in cells:
            if self.paired(c):
                continue
            g = next((g for g in out if g.base_cell.key == c.key and g.base is None
                      and (c.env.gpu is None or g.model in (None, c.env.gpu))), None)
            if g is not None:
                g.base = self.states[c.key]
            else:
                out.append(self.states[c.key])
        # fewer tasks than GPUs: the largest groups split (each half with its own baseline
        # replays), so that no GPU waits while one runs every env of a snapshot
        while len(out) < self.gpus:
            big = max((x for x in out if isinstance(x, Group) and len(x.members) > 1),
                      key=lambda x: len(x.members), default=None)
            if big is None:
                break
            half = len(big.members) // 2
            out.append(Group(big.base_cell, None, big.members[half:], big.model))
            big.members = big.members[:half]
        first = {id(x): min(cells.index(m.cell) for m in ([x.base] if x.base else []) + x.members)
                 if isinstance(x, Group) else cells.index(x.cell) for x in out}
        return sorted(out, key=lambda x: first[id(x)])

    def _submit_group(self, g: Group, purpose: str, with_bytes: bool = False):
        opts: Dict[str, Any] = {"num_gpus": 1, "num_cpus": 0}
        if g.model:
            opts["resources"] = {self.model_key[g.model]: 0.001}
        refs = [self._blob(g.base_cell.snapshot)] if (with_bytes or self.ship) else []
        sts = ([g.base] if g.base else []) + g.members
        for st in sts:
            if st.first_submit is None:
                st.first_submit = time.monotonic()
        ref = self._group.options(**opts).remote(self._spec(g.base_cell), [self._spec(m.cell) for m in g.members],
                                                 self.c.rules.pairs, refs, self.driver_node, time.time(), None)
        self.inflight[ref] = (g, purpose, time.monotonic())
        for st in sts:
            self.on_event("submit", {"cell": st.cell, "purpose": purpose})
        return ref

    def _node_gpus(self, node_id: Optional[str]) -> int:
        for n in self.ray.nodes():
            if n.get("NodeID") == node_id and n.get("Alive"):
                return int(n.get("Resources", {}).get("GPU", 0))
        return 0

    def _resubmit_due(self) -> None:
        now = time.monotonic()
        due = [d for d in self.deferred if d[0] <= now]
        self.deferred = [d for d in self.deferred if d[0] > now]
        for _, st, purpose in due:
            if st.done:
                continue
            ref = self._submit(st, purpose)
            if purpose == "confirm":
                st.confirm_ref = ref

    def _blob(self, snap):
        if snap.digest not in self._blobs:
            with open(snap.path, "rb") as f:
                self._blobs[snap.digest] = self.ray.put(f.read())
        return self._blobs[snap.digest]

    # ------------------------------------------------------------------ the run
    def run(self, skip: Dict[str, int]) -> Dict[str, Any]:
        """Runs every cell not in skip (finished earlier: cell_key -> cell id). Returns counts."""
        ray = self.ray
        self._skip_ids = dict(skip)
        self.inflight: Dict[Any, Any] = {}
        self.states: Dict[str, CellState] = {}
        self.by_key = {c.key: c for c in self.c.cells}
        self.base_profiles: Dict[str, Optional[Dict[str, Any]]] = {}    # baseline cell key -> profile
        self.counts = {"cells": len(self.c.cells), "skipped": 0, "ran": 0, "failed": 0, "regressed": 0, "set_aside": 0}
        self.cost = _new_cost()
        order = self._longest_first(self.c.cells)
        for cell in order:
            if cell.key in skip:
                self.counts["skipped"] += 1
                if cell.baseline_key is None:
                    row = self.store.cell(skip[cell.key])
                    self.base_profiles[cell.key] = (self.store.profile(skip[cell.key])
                                                    if row is not None and row["status"] == "ok" else None)
                continue
            st = self.states[cell.key] = CellState(cell)
            if cell.set_aside:          # nothing to time: written N/A, never replayed
                self._finish(st, "n/a", R.NOT_TIMED, error=f"set aside: {cell.set_aside}")
        # controls first: their ratios are part of the noise the other cells are judged against
        todo = sorted((c for c in order if c.key in self.states and not c.set_aside), key=lambda c: not c.control)
        for x in self.groups(todo):
            if isinstance(x, Group):
                self._submit_group(x, "measure")
            else:
                self._submit(x, "measure")
        self.on_event("start", dict(self.counts, slots=self.slots()))
        try:
            while self.inflight or self.deferred:
                self._resubmit_due()
                nxt = min((d[0] for d in self.deferred), default=None)
                if not self.inflight:
                    time.sleep(max(0.0, nxt - time.monotonic()))
                    continue
                wait = 1.0 if nxt is None else max(0.01, min(1.0, nxt - time.monotonic()))
                ready, _ = ray.wait(list(self.inflight), num_returns=1, timeout=wait)
                for ref in ready:
                    st, purpose, t_sub = self.inflight.pop(ref)
                    try:
                        res = ray.get(ref)
                    except Exception as e:      # worker or node lost, task failed in Ray
                        res = {"exit_code": None, "lost": True, "error": _one_line(e)}
                    self._handle(st, purpose, t_sub, res)
                self.on_event("tick", {"inflight": len(self.inflight)})
            self.counts["cost"] = self.cost_summary()
        except KeyboardInterrupt:
            # nothing is cancelled here: when this driver leaves, Ray ends its job's workers and
            # each replay dies with its worker (PDEATHSIG); cancelling first races Ray's replies
            raise
        return self.counts

    def _count_cost(self, r: Dict[str, Any], snapshot: Optional[str] = None) -> None:
        c = self.__dict__.setdefault("cost", _new_cost())
        if r.get("proc_s") is None:
            return
        t = ((r.get("profile") or {}).get("run") or {}).get("timings_s")
        if isinstance(t, dict) and snapshot:
            # where its replays' time went (run.timings_s), summed per snapshot; the kept
            # worker's give-back after the replay as "close"
            ph = c["phases"].setdefault(os.path.basename(snapshot), {})
            for k, v in list(t.items()) + [("close", r.get("close_s")), ("process", r.get("proc_s"))]:
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    n_v = ph.setdefault(k, [0, 0.0])
                    n_v[0] += 1
                    n_v[1] += v
        c["replays"] += 1
        c["proc_s"] += r["proc_s"]
        if r.get("fixed_s") is not None:
            c["timed"] += 1
            c["fixed_s"] += r["fixed_s"]
        if r.get("server_start_s"):
            c["server_starts"] += 1
            c["server_start_s"] += r["server_start_s"]

    def cost_summary(self) -> Dict[str, Any]:
        """What the run's replays cost beyond their launches (fixed_s: process or fork, imports,
        reading, cuInit, contexts, modules, memory, the report), per replay and per cell."""
        c = self.cost
        cells = max(1, self.counts["ran"] - self.counts.get("set_aside", 0))
        per_replay = c["fixed_s"] / c["timed"] if c["timed"] else None
        per_cell = (c["fixed_s"] + c["server_start_s"]) / cells if c["timed"] else None
        return {"replays": c["replays"], "replays_per_cell": round(c["replays"] / cells, 2),
                "fixed_s_per_replay": round(per_replay, 4) if per_replay is not None else None,
                "fixed_s_per_cell": round(per_cell, 4) if per_cell is not None else None,
                # the same once the servers are up (their start is paid once a night per GPU and env)
                "fixed_s_per_cell_started": round(c["fixed_s"] / cells, 4) if c["timed"] else None,
                "replay_s": round(c["proc_s"], 3), "server_starts": c["server_starts"],
                "server_start_s": round(c["server_start_s"], 3), "workers": self.c.rules.workers,
                # a shared baseline replay counts in equal shares to the cells it served
                "replays_per_verdict": {v: round(sum(x) / len(x), 2) for v, x in sorted(c["by_verdict"].items())},
                # per snapshot, the mean of each phase of run.timings_s over its replays
                "phases_by_snapshot": {snap: {k: round(tot / n, 4) for k, (n, tot) in ph.items()}
                                       for snap, ph in sorted(c["phases"].items())}}

    def _longest_first(self, cells: List[Cell]) -> List[Cell]:
        """The cells by expected time, longest first, so that the last GPU to finish waits less
        for a long cell submitted late: a cell's wall time in earlier runs of the store where it
        has one, else its snapshot's size at the seconds per byte of the cells that have one
        (else the size alone)."""
        try:
            past = self.store.past_seconds()
        except Exception:              # an older store: order by size
            past = {}

        def size(c) -> int:
            return int(getattr(c.snapshot, "size", 0) or 0)

        def seen(c) -> Optional[float]:
            return past.get((c.snapshot.digest, c.env.name, c.snapshot.mode, c.snapshot.kernels))

        rates = [seen(c) / size(c) for c in cells if seen(c) and size(c)]
        rate = statistics.median(rates) if rates else None

        def cost(c) -> float:
            t = seen(c)
            if t:
                return t
            return size(c) * rate if rate else float(size(c))
        return sorted(cells, key=lambda c: -cost(c))

    def _handle(self, st: Any, purpose: str, t_sub: float, res: Dict[str, Any]) -> None:
        if isinstance(st, Group):
            self._handle_group(st, purpose, t_sub, res)
            return
        if res.get("wrong_gpu"):
            st.bounces += 1
            self.deferred.append((time.monotonic() + min(2.0, 0.05 * 1.5 ** st.bounces), st, purpose))
            return
        if res.get("need_bytes"):
            self._submit(st, purpose, with_bytes=True)
            return
        if res.get("runs") is not None:
            self._handle_pair(st, purpose, t_sub, res)
            return
        st.attempts += 1
        self._count_cost(res, st.cell.snapshot.path)
        if res.get("proc_s") is not None:
            st.replays += 1
        if res.get("host"):
            self.hosts.add(res["host"])
        prof = res.get("profile")
        out = "lost" if res.get("lost") else R.outcome_of(res.get("exit_code"), prof is not None)
        if st.done and out == "lost":
            out = "cancelled"             # a confirmation run sent ahead and not needed
        err = res.get("error") or (res.get("stderr_tail") or None if out != "ok" else None)
        gpu = ((prof or {}).get("run") or {}).get("gpu") or {}
        st.proc_s += res.get("proc_s") or 0.0
        self.store.add_attempt(self.run_id, st.cell.key, {
            "purpose": purpose, "outcome": out, "exit_code": res.get("exit_code"), "host": res.get("host"),
            "node_id": res.get("node_id"), "gpu_uuid": gpu.get("uuid"), "visible_devices": res.get("visible_devices"),
            "queue_s": res.get("queue_s"), "proc_s": res.get("proc_s"), "wall_s": time.monotonic() - t_sub,
            "error": err, "started": now_iso(res["started"]) if res.get("started") else None,
            "ended": now_iso(res["ended"]) if res.get("ended") else None})
        self.on_event("attempt", {"cell": st.cell, "purpose": purpose, "outcome": out, "error": err})
        if out in R.RETRYABLE:
            self._retry_or_fail(st, purpose, out, err, res)
            return
        if st.done:
            return                        # a confirmation run sent ahead and not needed
        st.last = res
        if out == "mismatch":
            self._finish(st, "mismatch", R.MISMATCH, error=err)
            return
        if st.cell.baseline_key is None and self.c.baseline_env is not None and prof is not None:
            self.noise.add_baseline(_snap_key(st.cell), gpu_label(res.get("host"), res.get("node_id"),
                                                                  res.get("visible_devices")), prof)
        if purpose == "confirm":
            st.confirm_profile = prof
            st.confirm_ref = None
            if st.pending > 0:
                return                    # sent ahead: judged when the reruns are in
        elif purpose == "rerun-baseline":
            st.base_extra.append(prof)
        else:
            st.profiles.append(prof)
        if purpose in ("rerun", "rerun-baseline"):
            st.pending -= 1
            if st.pending > 0:
                return
        self._advance(st)

    def _retry_or_fail(self, st: CellState, purpose: str, out: str, err: Optional[str], res: Dict[str, Any]) -> None:
        st.failures += 1
        if res.get("node_id"):
            st.bad_nodes.append(res["node_id"])
        if st.done:
            return                        # a confirmation run sent ahead and not needed
        if st.failures <= self.c.rules.retries:
            self._submit(st, "retry" if purpose == "measure" else purpose)
            return
        st.last = res
        self._finish(st, "infra", R.INFRA, error=f"{out} after {st.failures} tries: {err or ''}".strip())

    def _handle_group(self, g: Group, purpose: str, t_sub: float, res: Dict[str, Any]) -> None:
        """A shared-baseline task's replays: the baseline cell finished from its baseline side,
        each candidate judged on its own rounds beside the baseline replays of those rounds."""
        sts = ([g.base] if g.base else []) + g.members
        if res.get("need_bytes"):
            self._submit_group(g, purpose, with_bytes=True)
            return
        if res.get("runs") is None:       # the task lost: each cell tried again on its own
            for st in sts:
                self._handle(st, purpose, t_sub, res)
            return
        runs = res["runs"]
        for r in runs:
            self._count_cost(r, g.base_cell.snapshot.path)
        base = [r for r in runs if r["side"] == "baseline"]
        base_ok = all(r["exit_code"] == 0 and r.get("profile") is not None for r in base)
        share = len(sts)
        if g.base is not None:
            self._handle_base(g.base, purpose, t_sub, res, base, share)
        subs = [[r for r in runs if r["side"] == "baseline" or r.get("cand") == i] for i in range(len(g.members))]
        if base_ok:                       # the noise: each baseline replay counted once
            ok = [(m, [r["profile"] for r in sub if r["side"] == "candidate"]) for m, sub in zip(g.members, subs)
                  if all(r["exit_code"] == 0 and r.get("profile") is not None for r in sub)]
            self.noise.add_group(_snap_key(g.base_cell), res.get("gpu"), [r["profile"] for r in base],
                                 [(m.cell.env.name, m.cell.control, p) for m, p in ok])
        for m, sub in zip(g.members, subs):
            self._handle_pair(m, purpose, t_sub, dict(res, runs=sub), share=share)

    def _handle_base(self, st: CellState, purpose: str, t_sub: float, res: Dict[str, Any],
                     base: List[Dict[str, Any]], share: int) -> None:
        """The baseline cell of a shared-baseline task: its replays are the task's baseline side."""
        wall = time.monotonic() - t_sub
        bad = None
        for r in base:
            prof = r.get("profile")
            out = R.outcome_of(r.get("exit_code"), prof is not None)
            err = r.get("stderr_tail") or None if out != "ok" else None
            st.attempts += 1
            st.replays += 1.0 / share
            st.proc_s += (r.get("proc_s") or 0.0) / share
            self.store.add_attempt(self.run_id, st.cell.key, {
                "purpose": purpose, "outcome": out, "exit_code": r.get("exit_code"), "host": res.get("host"),
                "node_id": res.get("node_id"), "gpu_uuid": (((prof or {}).get("run") or {}).get("gpu") or {}).get("uuid"),
                "visible_devices": r.get("visible_devices"), "queue_s": res.get("queue_s"), "proc_s": r.get("proc_s"),
                "wall_s": wall, "error": err, "started": now_iso(r["started"]) if r.get("started") else None,
                "ended": now_iso(r["ended"]) if r.get("ended") else None, "side": "baseline", "round": r.get("round")})
            if out != "ok" and bad is None:
                bad = (r, out, err)
            elif out == "ok":
                st.profiles.append(prof)
        last = dict(base[-1], host=res.get("host"), node_id=res.get("node_id")) if base else dict(res)
        self.on_event("attempt", {"cell": st.cell, "purpose": purpose, "outcome": bad[1] if bad else "ok",
                                  "error": bad[2] if bad else None})
        if bad is not None and bad[1] in R.RETRYABLE:
            st.profiles = []
            self._retry_or_fail(st, purpose, bad[1], bad[2], last)
            return
        st.last = last
        if bad is not None:
            self._finish(st, "mismatch", R.MISMATCH, error=bad[2])
            return
        self._advance(st)

    def _handle_pair(self, st: CellState, purpose: str, t_sub: float, res: Dict[str, Any], share: int = 0) -> None:
        """A paired task's replays, each an attempt row; then the cell judged on all its pairs."""
        if res.get("host"):
            self.hosts.add(res["host"])
        bad = None
        wall = time.monotonic() - t_sub
        for r in res["runs"]:
            prof = r.get("profile")
            out = R.outcome_of(r.get("exit_code"), prof is not None)
            err = r.get("stderr_tail") or None if out != "ok" else None
            gpu = ((prof or {}).get("run") or {}).get("gpu") or {}
            st.attempts += 1
            shared = share and r.get("side") == "baseline"
            if not share:                 # a shared task's replays were counted once, as a whole
                self._count_cost(r, st.cell.snapshot.path)
            if r.get("proc_s") is not None:
                st.replays += 1.0 / share if shared else 1.0
            st.proc_s += (r.get("proc_s") or 0.0) / (share if shared else 1)
            self.store.add_attempt(self.run_id, st.cell.key, {
                "purpose": purpose, "outcome": out, "exit_code": r.get("exit_code"), "host": res.get("host"),
                "node_id": res.get("node_id"), "gpu_uuid": gpu.get("uuid"), "visible_devices": r.get("visible_devices"),
                "queue_s": res.get("queue_s"), "proc_s": r.get("proc_s"), "wall_s": wall, "error": err,
                "started": now_iso(r["started"]) if r.get("started") else None,
                "ended": now_iso(r["ended"]) if r.get("ended") else None, "side": r.get("side"), "round": r.get("round")})
            if out != "ok" and bad is None:
                bad = (r, out, err)
        last = dict(res["runs"][-1], host=res.get("host"), node_id=res.get("node_id")) if res["runs"] else dict(res)
        self.on_event("attempt", {"cell": st.cell, "purpose": purpose, "outcome": bad[1] if bad else "ok",
                                  "error": bad[2] if bad else None})
        if bad is not None and bad[1] in R.RETRYABLE:
            self._retry_or_fail(st, purpose, bad[1], bad[2], last)
            return
        if st.done:
            return                        # a confirmation sent ahead and not needed
        st.last = last
        if bad is not None:               # a replay that no longer reproduces its results
            if bad[0].get("side") == "candidate":
                self._finish(st, "mismatch", R.MISMATCH, error=bad[2])
            else:
                self._finish(st, "no-baseline", R.NO_BASELINE,
                             error=f"the baseline replayed beside it did not reproduce its results: {bad[2] or ''}".strip())
            return
        pair = {"base": [r["profile"] for r in res["runs"] if r["side"] == "baseline"],
                "cand": [r["profile"] for r in res["runs"] if r["side"] == "candidate"],
                "gpu": res.get("gpu"), "host": res.get("host"), "node": res.get("node_id"),
                "uuid": (((res["runs"][-1].get("profile") or {}).get("run") or {}).get("gpu") or {}).get("uuid")}
        if not share:                     # a shared task adds its noise once (_handle_group)
            self.noise.add_task(_snap_key(st.cell), st.cell.env.name, st.cell.control, pair["gpu"], pair["base"],
                                pair["cand"])
        if purpose == "confirm":
            st.confirm_pair = pair
            st.confirm_ref = None
            if st.pending > 0:
                return                    # sent ahead: judged when the reruns are in
        else:
            st.pairs.append(dict(pair, inv=purpose == "investigate"))
        if purpose in ("rerun", "investigate"):
            st.pending -= 1
            if st.pending > 0:
                return
        self._advance_paired(st)

    def _judge_pairs(self, st: CellState, pairs: List[Dict[str, Any]]) -> Dict[str, Any]:
        cell, rules = st.cell, self.c.rules
        snap = _snap_key(cell)
        excl = cell.env.name if cell.control else None
        return R.judge_paired([x for p in pairs for x in p["base"]], [x for p in pairs for x in p["cand"]],
                              rules.threshold, lambda k: self.noise.noise(snap, k, excl), rules.noise_sigmas,
                              rules.alpha)

    def _advance_paired(self, st: CellState) -> None:
        rules = self.c.rules
        merged = R.merge_profiles([x for p in st.pairs for x in p["cand"]])
        try:
            res = self._judge_pairs(st, st.pairs)     # with the noise known now
        except Exception as e:
            self._finish(st, "error", R.INCOMPARABLE, profile=merged, error=_one_line(e))
            return
        verdict = bool(R.slower(res) or R.faster(res))
        if st.confirm_pair is None and R.borderline(res, rules.threshold, rules.noise_factor) \
                and st.reruns < rules.max_reruns:
            st.reruns += 1
            st.pending = 1
            self._submit(st, "rerun")
            if verdict and rules.confirm and self.gpus > 1 and not st.confirming and self._idle_gpus() > 0:
                # a GPU would wait idle: the confirmation runs beside the rerun, used only if it
                # still finds the verdict
                st.confirming = True
                st.confirm_ref = self._submit(st, "confirm")
            return
        first = R.SLOWER_ if res["regressed"] else (R.FASTER_ if R.faster(res) else R.SAME_)
        if first != R.SAME_ and not st.investigated and rules.investigate:
            # every verdict, a control's or not, is judged again on more rounds before it counts,
            # so that the controls' rate is the rate of the verdicts reported
            st.investigated = rules.investigate
            st.pending = 1
            self._submit(st, "investigate")
            return
        if first == R.SAME_ or not rules.confirm:
            self._finish(st, "ok", first, profile=merged, res=res)
            return
        if self.gpus < 2:
            self._finish(st, "ok", first, profile=merged, res=res, note="unconfirmed: one GPU")
            return
        if st.confirm_pair is None:
            if not st.confirming:
                st.confirming = True
                st.confirm_ref = self._submit(st, "confirm")
            return                        # judged when it is in
        cp = st.confirm_pair
        try:
            conf = self._judge_pairs(st, [cp])
        except Exception as e:
            self._finish(st, "error", R.INCOMPARABLE, profile=merged, error=_one_line(e))
            return
        s1, f1, s2, f2 = set(R.slower(res)), set(R.faster(res)), set(R.slower(conf)), set(R.faster(conf))
        agreed_s, agreed_f = s1 & s2, f1 & f2
        v = R.SLOWER_ if agreed_s else (R.FASTER_ if agreed_f else R.UNCONFIRMED)
        meas = [p for p in st.pairs if not p.get("inv")] or st.pairs
        where = ("the same GPU (no other came free)" if cp["gpu"] in {p["gpu"] for p in meas} else
                 "another node" if cp["node"] not in {p["node"] for p in meas} else "another GPU")
        note = f"confirmed on {where}" if v != R.UNCONFIRMED else f"not confirmed on {where}"
        self._finish(st, "ok", v, profile=merged, res=res, confirmed=int(v != R.UNCONFIRMED),
                     unconfirmed=tuple((s1 - s2) | (f1 - f2)), conf=conf, note=note)

    def _baseline_of(self, st: CellState):
        """(ready, profile) of the cell's baseline: profile None when the baseline did not measure."""
        cell = st.cell
        if cell.baseline_key is None:
            if self.c.baseline_env is not None:
                return True, None
            return True, self._run_baseline(cell)
        if cell.baseline_key in self.base_profiles:
            return True, self.base_profiles[cell.baseline_key]
        return False, None

    def _run_baseline(self, cell: Cell):
        rid = self._base_run
        if rid is None:
            return None
        row = self.store.find_cell(rid, cell.snapshot.digest, cell.env.name, cell.snapshot.mode, cell.snapshot.kernels)
        return self.store.profile(row["id"]) if row is not None else None

    def _advance(self, st: CellState) -> None:
        cell = st.cell
        merged = R.merge_profiles(st.profiles)
        if cell.baseline_key is None and self.c.baseline_env is not None:
            self._finish(st, "ok", R.BASELINE, profile=merged)
            return
        ready, base = self._baseline_of(st)
        if not ready:
            st.waiting = True
            return
        st.waiting = False
        if base is None:
            why = ("its baseline cell did not measure" if cell.baseline_key else
                   f"no cell of this snapshot and env in the baseline run ({self.c.baseline})")
            self._finish(st, "no-baseline", R.NO_BASELINE, profile=merged, error=why)
            return
        if st.base_extra:
            base = R.merge_profiles([base] + st.base_extra)
        thr, rules = self.c.rules.threshold, self.c.rules
        try:
            res = R.judge(base, merged, thr)
        except Exception as e:
            self._finish(st, "error", R.INCOMPARABLE, profile=merged, error=_one_line(e))
            return
        if R.borderline(res, thr, rules.noise_factor) and st.reruns < rules.max_reruns:
            # both sides again: a noisy baseline blurs a difference as much as a noisy candidate
            st.reruns += 1
            st.pending = 1
            self._submit(st, "rerun")
            if cell.baseline_key is not None:
                st.pending += 1
                self._submit(st, "rerun-baseline")
            if res["regressed"] and rules.confirm and not st.confirming and self._idle_gpus() > 0:
                # a GPU would wait idle: the confirmation runs beside the reruns, used only if
                # they still find the regression (it is judged alone, as one sent after them)
                st.confirming = True
                st.confirm_ref = self._submit(st, "confirm")
            return
        if not res["regressed"] or not rules.confirm:
            v = R.SLOWER_ if res["regressed"] else (R.FASTER_ if res["faster"] else R.SAME_)
            self._finish(st, "ok", v, profile=merged, res=res, confirmed=None)
            return
        if st.confirm_profile is None:
            if not st.confirming:
                st.confirming = True
                self._submit(st, "confirm")
            return                        # judged when it is in
        # the confirmation run, judged alone, must find the same kernels slower
        try:
            conf = R.judge(base, st.confirm_profile, thr)
        except Exception as e:
            self._finish(st, "error", R.INCOMPARABLE, profile=merged, error=_one_line(e))
            return
        first, again = set(R.slower(res)), set(R.slower(conf))
        agreed = first & again
        unconfirmed = tuple(first - again)
        v = R.SLOWER_ if agreed else R.UNCONFIRMED
        self._finish(st, "ok", v, profile=merged, res=res, confirmed=1 if agreed else 0, unconfirmed=unconfirmed)

    def _idle_gpus(self) -> int:
        """GPU slots no submitted replay waits for (every cell is submitted at the start, so
        only the run's tail has any)."""
        return self.slots() - len(self.inflight)

    def _finish(self, st: CellState, status: str, verdict: str, profile=None, res=None, error=None,
                confirmed=None, unconfirmed=(), conf=None, note=None) -> None:
        cell = st.cell
        if st.confirm_ref is not None:    # sent ahead, not needed: its GPU goes back to the run
            try:
                self.ray.cancel(st.confirm_ref)
            except Exception:
                pass
            st.confirm_ref = None
        prof = profile or (st.last or {}).get("profile")
        run = (prof or {}).get("run") or {}
        gpu = run.get("gpu") or {}
        base_id = None
        if cell.baseline_key is not None:
            bs = self.states.get(cell.baseline_key)
            base_id = bs.cell_id if bs is not None else self._skip_ids.get(cell.baseline_key)
        row = {"cell_key": cell.key, "snapshot": cell.snapshot.path, "snapshot_digest": cell.snapshot.digest,
               "snapshot_id": run.get("snapshot_id"), "kernels": cell.snapshot.kernels, "mode": cell.snapshot.mode,
               "env": cell.env.name, "env_json": _json(dict(cell.identity(), driver_version=run.get("driver_version"),
                                      gpu_model=_model(gpu.get("name")))),
               "is_baseline": int(cell.baseline_key is None and self.c.baseline_env is not None),
               "baseline_cell_id": base_id, "gpu_req": cell.env.gpu,
               "gpu_model": _model(gpu.get("name")),
               "device_uuid": gpu.get("uuid"), "driver_version": run.get("driver_version"),
               "libcuda": run.get("libcuda"), "host": (st.last or {}).get("host"), "status": status,
               "verdict": verdict, "regressed": int(verdict in R.REGRESSIONS), "exit_code": (st.last or {}).get("exit_code"),
               "attempts": st.attempts, "reruns": st.reruns, "confirmed": confirmed,
               "wall_s": time.monotonic() - (st.first_submit or time.monotonic()), "replay_s": st.proc_s,
               "error": error, "finished": now_iso(), "control": int(getattr(cell, "control", False)),
               "confirm_note": note}
        cands = [prof] + list(st.profiles) + [p for pr in st.pairs for p in pr.get("cand") or []]
        num = R.cell_numerics(cands)
        row["numerics"] = _json(num) if num else None
        last = st.last or {}
        row["gpu"] = (st.pairs[0]["gpu"] if st.pairs else
                      gpu_label(last.get("host"), last.get("node_id"), last.get("visible_devices")) if last else None)
        if st.pairs:
            row["device_uuid"] = row["device_uuid"] or st.pairs[0]["uuid"]
        if conf is not None and st.confirm_pair is not None:
            row["confirm_gpu"], row["confirm_device_uuid"] = st.confirm_pair["gpu"], st.confirm_pair["uuid"]
        snap = _snap_key(cell)
        kernels = (R.kernel_rows(res, prof, unconfirmed, conf, lambda k: self.noise.gpu_offset(snap, k))
                   if prof is not None else [])
        st.cell_id = self.store.add_cell(self.run_id, row, kernels, prof if status in ("ok", "no-baseline") else None)
        st.done, st.verdict, st.status = True, verdict, status
        if status != "n/a":
            self.__dict__.setdefault("cost", _new_cost())["by_verdict"].setdefault(verdict, []).append(st.replays)
        self.counts["set_aside" if status == "n/a" else "ran"] += 1
        if status in ("infra", "error"):
            self.counts["failed"] += 1
        if row["regressed"]:
            self.counts["regressed"] += 1
        self.on_event("cell", {"cell": cell, "status": status, "verdict": verdict, "error": error,
                               "slower": R.slower(res) if res and verdict == R.SLOWER_ else []})
        if cell.baseline_key is None and self.c.baseline_env is not None:
            self.base_profiles[cell.key] = prof if status == "ok" else None
            for other in self.states.values():
                if other.waiting and other.cell.baseline_key == cell.key:
                    self._advance(other)

    def set_baseline_run(self, run_id: Optional[int]) -> None:
        self._base_run = run_id

    def shutdown(self) -> None:
        if self.c.rules.hold_gpus:
            from .keeper import release_all
            release_all()          # this node's keepers end now; other nodes' after their idle time
        try:
            self.ray.shutdown()
        except Exception:
            pass
        import shutil
        shutil.rmtree(self.work_root, ignore_errors=True)


def _new_cost() -> Dict[str, Any]:
    return {"replays": 0, "proc_s": 0.0, "fixed_s": 0.0, "timed": 0, "server_starts": 0, "server_start_s": 0.0,
            "by_verdict": {}, "phases": {}}


def _snap_key(cell: Cell) -> str:
    s = cell.snapshot
    return f"{s.digest}/{s.mode}/{s.kernels or ''}"


def _model(name: Optional[str]) -> Optional[str]:
    return (gpu_model(name) or name) if name else None


def _json(d) -> str:
    import json
    return json.dumps(d, sort_keys=True, default=str)


def _one_line(e: BaseException) -> str:
    s = " ".join(str(e).split())
    return f"{type(e).__name__}: {s[:300]}"

