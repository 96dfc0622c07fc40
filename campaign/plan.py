"""The campaign file (TOML) and the cells it makes: every snapshot x every environment.

    name = "nightly"                 # optional (default: the file's stem)
    baseline = "plain"               # an [[env]] name, or "run:latest" / "run:N" (a run in the store)

    [rules]                          # all optional
    repeats = 10                     # isolated: timed runs per launch (replay --repeat)
    warmup = 3
    threshold = 5.0                  # percent; a difference within the noise never counts
    noise_factor = 2.0               # rerun when ||diff| - threshold| <= noise_factor x noise
    max_reruns = 2
    confirm = true                   # a verdict needs a confirmation on another GPU that agrees
    pairs = 2                        # rounds of the baseline and its envs on one GPU: B E1 .. En, B E1 .. En
    investigate = 3                  # a verdict is judged again with this many more rounds before it counts
    alpha = 0.01                     # Mann-Whitney U significance a verdict needs
    noise_sigmas = 3.0               # ... and a difference beyond this many x the campaign's noise
    timeout = 1800                   # seconds per replay
    retries = 2                      # crash, timeout, lost node: more tries on another worker
    hold_gpus = true                 # keep each GPU's driver state warm between replays (keeper.py)
    workers = "warm"                 # replays forked by a server per GPU and env (cellserver.py);
                                     # "fresh": a new `cudasnap replay` process each; "kept": one
                                     # process per GPU and env runs replay after replay, each
                                     # giving its driver state back (Replayer.close)

    [[snapshot]]
    path = "snaps/*.cusnap"          # a path or a glob, relative to this file
    kernels = "gemm|attn"            # optional: replay --kernels REGEX
    profile = "isolated"             # or "timeline"

    [[env]]                          # as bisect's ENVS.toml, plus an optional GPU model
    name = "r570"
    vars = { CUDA_MODULE_LOADING = "EAGER" }
    driver = "/opt/drivers/570/libcuda.so.1"
    gpu = "H100"
    control = true                   # it changes nothing: any verdict in it means noise beat the rules
"""
from __future__ import annotations

import glob
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


import xxhash

from cudasnap.compare.envs import TOLERANCE_VAR, Env, env_table, tolerance_value
from cudasnap.formats.limits import MAX_RUNS
from cudasnap.formats.tomlfile import TomlFileError, load_toml


class PlanError(Exception):
    """A campaign file that cannot be run (one line)."""


@dataclass
class Rules:
    repeats: int = 10
    warmup: int = 3
    threshold: float = 5.0
    noise_factor: float = 2.0
    max_reruns: int = 2
    confirm: bool = True
    timeout: float = 1800.0
    retries: int = 2
    hold_gpus: bool = True
    pairs: int = 2
    investigate: int = 3
    alpha: float = 0.01
    noise_sigmas: float = 3.0
    workers: str = "warm"
    tolerance: Optional[str] = None  # CUDASNAP_TOLERANCE of every env that sets none (replay/numerics.py)


WORKERS = ("warm", "fresh", "kept")


@dataclass
class Snapshot:
    path: str
    digest: str                     # xxh3-128 of the file's bytes
    size: int
    kernels: Optional[str] = None
    mode: str = "isolated"


def env_identity(e: Env) -> Dict[str, Any]:
    """What defines an environment; a rebuilt replacement kernel changes it (its file digest)."""
    return {"name": e.name, "vars": dict(sorted(e.vars.items())), "driver": e.driver,
            "driver_digest": _file_digest(e.driver) if e.driver else None, "gpu": e.gpu,
            "replace": replace_digests(e.vars.get("CUDASNAP_REPLACE", ""))}


@dataclass
class Cell:
    snapshot: Snapshot
    env: Env
    key: str                        # stable identity within the campaign file
    baseline_key: Optional[str]     # the cell it is judged against (None: it is the baseline)
    vars: Dict[str, str] = field(default_factory=dict)     # the env's vars as they apply to this snapshot
    not_applied: List[str] = field(default_factory=list)   # CUDASNAP_REPLACE targets it does not record
    control: bool = False           # its env is a control: it should change nothing
    set_aside: Optional[str] = None     # why its snapshot is not replayed (it has nothing to time)

    def identity(self) -> Dict[str, Any]:
        d = env_identity(self.env)
        if self.not_applied:
            d["vars"] = dict(sorted(self.vars.items()))
            d["replace"] = {k: v for k, v in d["replace"].items() if k not in self.not_applied}
            d["replace_not_applied"] = list(self.not_applied)
        return d

    @property
    def label(self) -> str:
        return f"{os.path.basename(self.snapshot.path)} x {self.env.name}"


@dataclass
class Campaign:
    path: str
    name: str
    file_hash: str
    baseline: str                   # env name or "run:..."
    rules: Rules
    snapshots: List[Snapshot]
    envs: List[Env]
    cells: List[Cell]
    controls: List[str] = field(default_factory=list)     # the names of the control envs

    @property
    def set_aside(self) -> Dict[str, str]:
        """snapshot path -> why it is set aside (no cell of it is replayed)."""
        return {c.snapshot.path: c.set_aside for c in self.cells if c.set_aside}

    @property
    def baseline_env(self) -> Optional[str]:
        return None if self.baseline.startswith("run:") else self.baseline


def toml_load(path: str) -> Dict[str, Any]:
    try:
        return load_toml(path, "campaign file")
    except TomlFileError as e:
        raise PlanError(str(e))


def _file_digest(path: str) -> Optional[str]:
    h = xxhash.xxh3_128()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def replace_digests(spec: str) -> Dict[str, Optional[str]]:
    """CUDASNAP_REPLACE='K=FILE;K=FILE' -> {K: digest of FILE}: a rebuild is a new digest."""
    out: Dict[str, Optional[str]] = {}
    for part in (spec or "").split(";"):
        if "=" in part:
            k, f = part.split("=", 1)
            out[k.strip()] = _file_digest(os.path.expanduser(f.strip()))
    return out


def _num(t: Dict[str, Any], key: str, default, kind, lo, where: str, hi=None):
    v = t.get(key, default)
    if kind is bool:
        if not isinstance(v, bool):
            raise PlanError(f"{where}: {key} must be true or false")
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not isinstance(v, int)):
        raise PlanError(f"{where}: {key} must be {'an integer' if kind is int else 'a number'}")
    if isinstance(v, float) and not math.isfinite(v):
        raise PlanError(f"{where}: {key} = {v} is not a finite number")
    if v < lo:
        raise PlanError(f"{where}: {key} must be >= {lo}")
    if hi is not None and v > hi:
        raise PlanError(f"{where}: {key} must be <= {hi}")
    return kind(v)


def _rules(t: Any, where: str) -> Rules:
    if t is None:
        return Rules()
    if not isinstance(t, dict):
        raise PlanError(f"{where}: [rules] must be a table")
    known = set(Rules.__dataclass_fields__)
    unknown = set(t) - known
    if unknown:
        raise PlanError(f"{where}: [rules]: unknown key(s) {', '.join(sorted(unknown))} ({', '.join(sorted(known))})")
    d = Rules()
    return Rules(repeats=_num(t, "repeats", d.repeats, int, 1, where, MAX_RUNS),
                 warmup=_num(t, "warmup", d.warmup, int, 0, where, MAX_RUNS),
                 threshold=_num(t, "threshold", d.threshold, float, 0, where),
                 noise_factor=_num(t, "noise_factor", d.noise_factor, float, 0, where),
                 max_reruns=_num(t, "max_reruns", d.max_reruns, int, 0, where, 100),
                 confirm=_num(t, "confirm", d.confirm, bool, 0, where),
                 timeout=_num(t, "timeout", d.timeout, float, 1, where),
                 retries=_num(t, "retries", d.retries, int, 0, where, 100),
                 hold_gpus=_num(t, "hold_gpus", d.hold_gpus, bool, 0, where),
                 pairs=_num(t, "pairs", d.pairs, int, 1, where, 1000),
                 investigate=_num(t, "investigate", d.investigate, int, 0, where, 1000), alpha=_num(t, "alpha", d.alpha, float, 0, where, 1),
                 noise_sigmas=_num(t, "noise_sigmas", d.noise_sigmas, float, 0, where, 1000),
                 workers=_workers(t, where),
                 tolerance=(tolerance_value(t["tolerance"], f"{where}: [rules] tolerance", PlanError)
                            if t.get("tolerance") is not None else None))


def _workers(t: Dict[str, Any], where: str) -> str:
    w = t.get("workers", "warm")
    if w not in WORKERS:
        raise PlanError(f"{where}: [rules] workers must be {', '.join(repr(x) for x in WORKERS)}, not {w!r}")
    return w


def min_p(n: int) -> float:
    """The smallest two-sided p-value Mann-Whitney U can give for n samples a side."""
    import math
    return min(1.0, 2.0 / math.comb(2 * n, n))


def _check_power(rules: Rules, snaps: List["Snapshot"], where: str) -> None:
    n = rules.repeats * rules.pairs
    if rules.alpha >= 1 or rules.alpha <= 0:
        raise PlanError(f"{where}: [rules] alpha must be between 0 and 1")
    if any(s.mode == "isolated" for s in snaps) and min_p(n) > rules.alpha:
        need = next(k for k in range(1, 64) if min_p(k) <= rules.alpha)
        raise PlanError(f"{where}: [rules] repeats x pairs = {n} timed runs a side cannot reach alpha "
                        f"{rules.alpha:g} (Mann-Whitney needs {need}): raise repeats or pairs")


def _envs(tables: Any, path: str, base: str, controls: List[str]) -> List[Env]:
    if not isinstance(tables, list) or not tables:
        raise PlanError(f"{path}: no [[env]] tables")
    envs: List[Env] = []
    for i, t in enumerate(tables):
        where = f"{path}: [[env]] #{i + 1}"
        name, vs, drv = env_table(t, where, base, ("gpu", "control"), (e.name for e in envs), PlanError)
        ctl = t.get("control", False)
        if not isinstance(ctl, bool):
            raise PlanError(f"{where} ({name}): control must be true or false")
        if ctl:
            controls.append(name)
        if not re.fullmatch(r"[\w.+-]+", name):     # it names store rows and report columns
            raise PlanError(f"{where}: needs a name of letters, digits, _ . + -")
        gpu = t.get("gpu")
        if gpu is not None and (not isinstance(gpu, str) or not re.fullmatch(r"[\w.+-]+", gpu)):
            raise PlanError(f"{where} ({name}): gpu must be a model name such as \"H100\"")
        for kern, dig in replace_digests(vs.get("CUDASNAP_REPLACE", "")).items():
            if dig is None:
                raise PlanError(f"{where} ({name}): CUDASNAP_REPLACE {kern}: its file cannot be read")
        envs.append(Env(i, name, vs, drv, gpu=gpu))
    return envs


def _snapshots(tables: Any, path: str, base: str) -> List[Snapshot]:
    if not isinstance(tables, list) or not tables:
        raise PlanError(f"{path}: no [[snapshot]] tables")
    out: List[Snapshot] = []
    seen = set()
    for i, t in enumerate(tables):
        where = f"{path}: [[snapshot]] #{i + 1}"
        if not isinstance(t, dict):
            raise PlanError(f"{where}: not a table")
        unknown = set(t) - {"path", "kernels", "profile"}
        if unknown:
            raise PlanError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} (path, kernels, profile)")
        pat = t.get("path")
        if not isinstance(pat, str) or not pat:
            raise PlanError(f"{where}: needs a path (a file or a glob)")
        mode = t.get("profile", "isolated")
        from cudasnap.replay.profile.modes import names
        if mode not in names(campaign=True):
            raise PlanError(f"{where}: profile must be {' or '.join(sorted(names(campaign=True)))}, not {mode!r}")
        kern = t.get("kernels")
        if kern is not None:
            if not isinstance(kern, str):
                raise PlanError(f"{where}: kernels must be a regex string")
            try:
                re.compile(kern)
            except re.error as e:
                raise PlanError(f"{where}: kernels: bad regex: {e}")
        full = os.path.join(base, os.path.expanduser(pat))
        hits = sorted(glob.glob(full)) if glob.has_magic(full) else ([full] if os.path.exists(full) else [])
        hits = [h for h in hits if os.path.isfile(h)]
        if not hits:
            raise PlanError(f"{where}: {pat!r} matches no file")
        for h in hits:
            dig = _file_digest(h)
            if dig is None:
                raise PlanError(f"{where}: {h}: cannot be read")
            ident = (dig, kern, mode)
            if ident in seen:
                continue
            seen.add(ident)
            out.append(Snapshot(os.path.abspath(h), dig, os.path.getsize(h), kern, mode))
    return out


def cell_key(s: Snapshot, e: Env) -> str:
    ident = {"snapshot": s.digest, "kernels": s.kernels, "mode": s.mode, "env": env_identity(e)}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24]


def recorded_kernels(path: str) -> Optional[set]:
    """The kernel names a snapshot's index records (None: no index to read them from)."""
    try:
        from cudasnap.formats.reader import SnapshotReader
        r = SnapshotReader(path)
        try:
            summ = r.summary()
        finally:
            close = getattr(r, "close", None)
            if close:
                close()
    except Exception:
        return None
    if not summ or not isinstance(summ.get("fns"), list):
        return None
    return {f[1] for f in summ["fns"] if isinstance(f, (list, tuple)) and len(f) > 1 and isinstance(f[1], str)}


def nothing_to_time(path: str) -> Optional[str]:
    """Why a snapshot has nothing a campaign could time (no kernel launch, no graph launch: a
    torch.compile worker's snapshot, say), from its index; None when it has launches or has no
    index to tell (it is then replayed, and judged as any other)."""
    try:
        from cudasnap.formats.reader import SnapshotReader
        with SnapshotReader(path) as r:
            summ = r.summary()
    except Exception:
        return None
    if not isinstance(summ, dict) or not isinstance(summ.get("kernels"), dict) or not isinstance(summ.get("calls"), dict):
        return None
    if sum(v for v in summ["kernels"].values() if isinstance(v, int)) > 0:
        return None
    if any("GraphLaunch" in str(k) for k in summ["calls"]):
        return None
    return f"it records no kernel launch ({summ.get('records', 0)} records): nothing to time"


def applied_vars(e: Env, names: Optional[set]) -> (Dict[str, str], List[str]):
    """A rebuilt kernel replaces that kernel where a snapshot records it: CUDASNAP_REPLACE
    targets the snapshot does not record are left out of its cell (replay would refuse them)."""
    spec = e.vars.get("CUDASNAP_REPLACE")
    if not spec or names is None:
        return dict(e.vars), []
    keep, dropped = [], []
    for part in spec.split(";"):
        if "=" not in part:
            continue
        target = part.rpartition("=")[0].strip()
        k = target[len("module:"):] if target.startswith("module:") else target
        if target.startswith("0x") or k in names:
            keep.append(part)
        else:
            dropped.append(target)
    v = dict(e.vars)
    if keep:
        v["CUDASNAP_REPLACE"] = ";".join(keep)
    else:
        v.pop("CUDASNAP_REPLACE", None)
    return v, dropped


def load_campaign(path) -> Campaign:
    path = os.fspath(path)
    doc = toml_load(path)
    unknown = set(doc) - {"name", "baseline", "rules", "snapshot", "env"}
    if unknown:
        raise PlanError(f"{path}: unknown key(s) {', '.join(sorted(unknown))} (name, baseline, rules, snapshot, env)")
    base = os.path.dirname(os.path.abspath(path))
    name = doc.get("name", os.path.splitext(os.path.basename(path))[0])
    if not isinstance(name, str) or not name:
        raise PlanError(f"{path}: name must be a string")
    rules = _rules(doc.get("rules"), path)
    controls: List[str] = []
    envs = _envs(doc.get("env"), path, base, controls)
    if rules.tolerance:
        for e in envs:
            e.vars.setdefault(TOLERANCE_VAR, rules.tolerance)
    snaps = _snapshots(doc.get("snapshot"), path, base)
    _check_power(rules, snaps, path)
    bl = doc.get("baseline", envs[0].name)
    if not isinstance(bl, str) or not bl:
        raise PlanError(f"{path}: baseline must be an env name or run:latest / run:N")
    if bl.startswith("run:"):
        if bl != "run:latest" and not re.fullmatch(r"run:\d+", bl):
            raise PlanError(f"{path}: baseline {bl!r}: an earlier run is run:latest or run:N")
    elif bl not in {e.name for e in envs}:
        raise PlanError(f"{path}: baseline {bl!r} is not an [[env]] name ({', '.join(e.name for e in envs)})")
    if bl in controls:
        raise PlanError(f"{path}: baseline {bl!r} is a control: a control is judged against the baseline")
    with open(path, "rb") as f:
        raw = f.read()
    # the file's own bytes plus what it points at: a changed snapshot or replacement is another campaign
    h = hashlib.sha256(raw)
    h.update(json.dumps([[s.digest, s.kernels, s.mode] for s in snaps]).encode())
    h.update(json.dumps([env_identity(e) for e in envs], sort_keys=True).encode())
    h.update(json.dumps(controls).encode())
    cells: List[Cell] = []
    replacing = any("CUDASNAP_REPLACE" in e.vars for e in envs)
    aside = {s.path: nothing_to_time(s.path) for s in snaps}
    if all(aside.values()):
        raise PlanError(f"{path}: no snapshot has a kernel launch to time ({', '.join(sorted(os.path.basename(p) for p in aside))})")
    for s in snaps:
        names = recorded_kernels(s.path) if replacing else None
        keys = {e.name: cell_key(s, e) for e in envs}
        for e in envs:
            bkey = None
            if not bl.startswith("run:") and e.name != bl:
                bkey = keys[bl]
            vs, dropped = applied_vars(e, names)
            cells.append(Cell(s, e, keys[e.name], bkey, vs, dropped, control=e.name in controls,
                              set_aside=aside[s.path]))
    return Campaign(path=os.path.abspath(path), name=name, file_hash=h.hexdigest()[:32], baseline=bl, rules=rules,
                    snapshots=snaps, envs=envs, cells=cells, controls=controls)
