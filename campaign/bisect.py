"""`cudasnap bisect SNAPSHOT --envs ENVS.toml`: find the first environment where a snapshot's
replay got slower (or stopped reproducing its results).

ENVS.toml lists environments in order, the first good and the last bad:

    [[env]]
    name = "r570"                                  # required, unique
    driver = "/opt/drivers/570.86/libcuda.so.1"    # optional: its directory goes first on LD_LIBRARY_PATH
    device = 0                                     # optional: --device for the replay
    vars = { CUDA_FORCE_PTX_JIT = "1" }            # optional: variables set for the replay

Each replay runs in its own process (`python -m cudasnap replay SNAPSHOT --profile MODE --out
X.json` with the environment's variables), so a driver library or a variable read once at
load time applies. The two ends are replayed first, then a binary search: at most
ceil(log2(n - 1)) more replays. An environment is bad when, compared with the first, a kernel
or the total is SLOWER (`cudasnap compare`'s verdict: beyond the threshold and the noise), or
when its replay no longer reproduces the recorded results (replay exit 1: a correctness
break, reported as such, never as a timing verdict). A replay that cannot run (exit 2) stops
the bisection with its reason. With --gpus K (on Ray: a local runtime, or --address) each
round replays K environments at once, one per GPU: a K-ary search in fewer rounds. Without
--address that search is chosen only where it pays: the first replay, run here, times one
round; a local Ray runtime costs CUDASNAP_BISECT_RAY_START_S (8 s by default) to start, and
when the rounds saved do not cover it, the plain binary search runs here. The result says
which strategy ran and why. CUDASNAP_REPLACE in an environment's vars swaps kernels there
(as `replay --replace`), which bisects compiler builds on one driver."""
from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from cudasnap.formats.console import invoked_command
from cudasnap.formats.tomlfile import TomlFileError, load_toml
from cudasnap.replay.invocation import command as invocation_command
from cudasnap.replay.profile.modes import names

from cudasnap.compare.core import SLOWER, CompareError, compare, facts, load_profile
from cudasnap.compare.envs import TOLERANCE_VAR, Env, env_table, tolerance_value

from .rules import cell_numerics
from .wording import numerics_text


# a local Ray runtime's start, about 7 s on an H200 host (bench/RESULTS.md): what a K-ary
# search must save before it is chosen
RAY_START_S = 8.0



MIN_FREE = 1 << 20            # below this a replay's profile may not fit

class BisectError(Exception):
    """A bisection that cannot proceed (one line)."""


def _toml_load(path: str) -> Dict[str, Any]:
    try:
        return load_toml(path, "ENVS.toml file")
    except TomlFileError as e:
        raise BisectError(str(e))


def load_envs(path) -> List[Env]:
    doc = _toml_load(os.fspath(path))
    tables = doc.get("env")
    if not isinstance(tables, list) or not tables:
        raise BisectError(f"{path}: no [[env]] tables")
    envs: List[Env] = []
    names = set()
    base = os.path.dirname(os.path.abspath(os.fspath(path)))
    for i, t in enumerate(tables):
        where = f"{path}: [[env]] #{i + 1}"
        name, vs, drv = env_table(t, where, base, ("device",), names, BisectError)
        names.add(name)
        dev = t.get("device")
        if dev is not None and (not isinstance(dev, int) or isinstance(dev, bool) or dev < 0):
            raise BisectError(f"{where} ({name}): device must be an ordinal >= 0")
        envs.append(Env(i, name, vs, drv, device=dev))
    if len(envs) < 2:
        raise BisectError(f"{path}: bisect needs at least two environments (the first good, the last bad)")
    return envs


@dataclass
class Outcome:
    env: Env
    order: int                      # 1 = replayed first
    rc: int
    seconds: float
    profile_path: str
    command: str
    status: str = ""                # good | slower | correctness | error
    reason: str = ""
    profile: Optional[Dict[str, Any]] = None
    vs_first: Optional[Dict[str, Any]] = None
    stderr_tail: str = ""
    numerics: Optional[Dict[str, Any]] = None   # rules.cell_numerics of its replay

    def to_dict(self) -> Dict[str, Any]:
        d = {"env": self.env.name, "index": self.env.index, "order": self.order, "replay_exit": self.rc,
             "seconds": round(self.seconds, 3), "status": self.status, "reason": self.reason,
             "profile": self.profile_path, "command": self.command}
        if self.vs_first is not None:
            d["vs_first"] = {"slower": self.vs_first["slower"], "total": self.vs_first["total"]}
        if self.numerics is not None:
            d["numerics"] = self.numerics
        return d


class Bisector:
    def __init__(self, snapshot, envs: List[Env], mode: str = "isolated", kernels: Optional[str] = None,
                 repeat: int = 10, warmup: int = 3, threshold: float = 5.0, workdir: Optional[str] = None,
                 timeout: Optional[float] = None, log=None, pool=None, gpus: int = 1, start_pool=None,
                 pool_start_s: float = RAY_START_S):
        self.snapshot = os.path.abspath(os.fspath(snapshot))
        self.pool = pool                    # replays k environments at once (RayReplays), or None
        self.gpus = gpus
        self.start_pool = start_pool        # starts the pool when the K-ary search pays for it
        self.pool_start_s = pool_start_s
        self.strategy = None                # with --gpus K: {"name": "K-ary" | "binary", "why": ...}
        if pool is not None:
            self.strategy = ({"name": f"{pool.slots}-ary", "why": "the replays run on the given Ray cluster"}
                             if pool.slots > 1 else {"name": "binary", "why": "the Ray cluster has one GPU"})
        self.rounds = 0                     # replays awaited together: one per round
        self._pre: Dict[int, Any] = {}
        self.envs = envs
        self.mode = mode
        self.kernels = kernels
        self.repeat = repeat
        self.warmup = warmup
        self.threshold = threshold
        self.timeout = timeout
        self._tmp = None
        if workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="cudasnap-bisect-")
            workdir = self._tmp.name
        os.makedirs(workdir, exist_ok=True)
        self.workdir = workdir
        self.log = log or (lambda s: None)
        self.done: Dict[int, Outcome] = {}

    # ------------------------------------------------------------------ one replay
    def _driver_dir(self, env: Env) -> Optional[str]:
        if env.driver is None:
            return None
        p = os.path.abspath(env.driver)
        if os.path.isdir(p):
            return p
        if os.path.basename(p) == "libcuda.so.1":
            return os.path.dirname(p)
        # the loader looks for libcuda.so.1: give it that name beside nothing else
        d = os.path.join(self.workdir, "drivers", f"{env.index}")
        os.makedirs(d, exist_ok=True)
        link = os.path.join(d, "libcuda.so.1")
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink(p, link)
        return d

    def environ(self, env: Env) -> Dict[str, str]:
        e = dict(os.environ)
        e.update(env.vars)
        d = self._driver_dir(env)
        if d:
            old = e.get("LD_LIBRARY_PATH", "")
            e["LD_LIBRARY_PATH"] = d + (os.pathsep + old if old else "")
        e.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
        if self.gpus > 1 and self.pool is None and env.device is None:
            # --gpus K searching binary here (K-ary would not pay): each replay sees one GPU, as
            # each replay on Ray does; all K visible made every replay's start slower (on 4 H200s,
            # 11.2 s against 7.4 s for the same 5 replays)
            vis = [v for v in (e.get("CUDA_VISIBLE_DEVICES") or "0").split(",") if v.strip()]
            e["CUDA_VISIBLE_DEVICES"] = vis[0].strip() if vis else "0"
        return e

    def doc(self, env: Env, out: str) -> Dict[str, Any]:
        """The replay of env, as a typed document (replay/invocation.py)."""
        from cudasnap.replay.invocation import profiled
        return profiled(self.snapshot, out, self.mode, self.kernels, self.repeat, self.warmup, env.device)

    def argv(self, env: Env, out: str) -> List[str]:
        """The same replay as a command line, for people (command_text), never run from here."""
        a = ["replay", self.snapshot, "--profile", self.mode, "--out", out, "-q", "--no-progress"]
        if self.mode in names(repeats=True):
            a += ["--repeat", str(self.repeat), "--warmup", str(self.warmup)]
        if self.kernels:
            a += ["--kernels", self.kernels]
        if env.device is not None:
            a += ["--device", str(env.device)]
        return a

    def command_text(self, env: Env, out: str) -> str:
        pre = [f"{k}={shlex.quote(v)}" for k, v in env.vars.items()]
        d = self._driver_dir(env)
        if d:
            pre.append(f"LD_LIBRARY_PATH={shlex.quote(d)}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}")
        return " ".join(pre + ["cudasnap"] + [shlex.quote(x) for x in self.argv(env, out)])

    def run_env(self, i: int) -> Outcome:
        if i in self.done:
            return self.done[i]
        env = self.envs[i]
        out = os.path.join(self.workdir, f"env{i + 1:02d}-{_safe(env.name)}.json")
        if os.path.exists(out) and i not in self._pre:
            os.unlink(out)
        cmd = invocation_command(sys.executable, self.doc(env, out))
        t0 = time.monotonic()
        if i in self._pre:
            rc, err, secs = self._pre.pop(i)
            t0 -= secs
        else:
            try:
                # a process of its own: an environment: its variables and driver apply from a process's start
                cp = subprocess.run(cmd, env=self.environ(env), capture_output=True, text=True, timeout=self.timeout)
                rc, err = cp.returncode, (cp.stderr or "")
            except subprocess.TimeoutExpired:
                rc, err = 124, f"the replay ran past {self.timeout:g} s"
        if rc != 0:
            self._disk()
        o = Outcome(env, len(self.done) + 1, rc, time.monotonic() - t0, out, self.command_text(env, out))
        lines = [ln for ln in err.splitlines() if ln.strip()]
        o.stderr_tail = "\n".join(lines[-5:])
        if rc in (0, 1) and os.path.exists(out):
            try:
                o.profile = load_profile(out)
            except CompareError as e:
                o.status, o.reason = "error", str(e)
        if rc == 1:
            o.status = "correctness"
            o.reason = "the replay no longer reproduces the recorded results (replay exit 1)" + (
                f": {lines[0]}" if lines else "")
        elif rc != 0:
            o.status = "error"
            o.reason = f"the replay could not run (exit {rc})" + (f": {lines[-1]}" if lines else "")
        elif o.profile is None and not o.status:
            o.status, o.reason = "error", "the replay wrote no profile"
        if o.profile is not None and env.driver and not o.status:
            got = (o.profile.get("run") or {}).get("libcuda")
            want = os.path.realpath(env.driver if not os.path.isdir(env.driver)
                                    else os.path.join(env.driver, "libcuda.so.1"))
            if got and os.path.realpath(got) != want:
                o.status = "error"
                o.reason = f"driver {env.driver} requested, but the replay loaded {got}"
        self.done[i] = o
        return o

    def judge(self, i: int) -> Outcome:
        o = self.run_env(i)
        if o.status:
            self._log(o)
            return o
        if i == 0:
            o.status, o.reason = "good", "the reference (first environment)"
        else:
            ref = self.done[0]
            try:
                o.vs_first = compare(ref.profile, o.profile, threshold=self.threshold)
            except CompareError as e:
                o.status, o.reason = "error", str(e)
                self._log(o)
                return o
            if o.vs_first["regressed"]:
                o.status = "slower"
                sl = [k for k in o.vs_first["kernels"] if k["verdict"] == SLOWER]
                parts = [f"{k['name']} {k['ratio']:.2f}x" for k in sl[:4]]
                if o.vs_first["total"]["verdict"] == SLOWER:
                    parts.append(f"total {o.vs_first['total']['ratio']:.2f}x")
                o.reason = "SLOWER than the first: " + ", ".join(parts)
            else:
                o.status = "good"
                t = o.vs_first["total"]
                o.reason = f"same as the first (total {t['ratio']:.3f}x)" if t.get("ratio") else "same as the first"
        o.numerics = cell_numerics([o.profile])
        nt = numerics_text(o.numerics)
        if nt:                            # timed and judged whatever the numerics; they are named
            o.reason += f"; {nt}"
        self._log(o)
        return o

    def _log(self, o: Outcome) -> None:
        self.log(f"[replay {o.order}] env {o.env.index + 1}/{len(self.envs)} {o.env.name!r}: {o.status}"
                 f" ({o.seconds:.1f} s): {o.reason}")

    # ------------------------------------------------------------------ the search
    def _prefetch(self, idx: List[int]) -> None:
        """Replays these environments at once through the pool (one per GPU)."""
        idx = [i for i in idx if i not in self.done and i not in self._pre]
        if self.pool is None or len(idx) < 2:
            return
        self.log(f"[round] {len(idx)} environments at once: {', '.join(self.envs[i].name for i in idx)}")
        jobs = []
        for i in idx:
            env = self.envs[i]
            out = os.path.join(self.workdir, f"env{i + 1:02d}-{_safe(env.name)}.json")
            if os.path.exists(out):
                os.unlink(out)
            jobs.append((invocation_command(sys.executable, self.doc(env, out)), self.environ(env), out))
        for i, r in zip(idx, self.pool.run(jobs)):
            self._pre[i] = r

    def choose(self, replay_s: float) -> None:
        """K-ary or binary, by the time each would still take: a round costs about one replay
        (replay_s, the first one's time), and the K-ary search first pays for Ray's start."""
        n, k = len(self.envs), self.gpus
        left = n - 1                                    # the search's span once both ends are in
        binary = 1 + (math.ceil(math.log2(left)) if left > 1 else 0)
        kary = 1 + (math.ceil(math.log(left) / math.log(k + 1) - 1e-9) if left > 1 else 0)
        est_b, est_k = binary * replay_s, self.pool_start_s + kary * replay_s
        why = (f"a replay takes {replay_s:.1f} s: {binary} more rounds binary ~{est_b:.1f} s, {kary} rounds "
               f"{k}-ary ~{est_k:.1f} s with Ray's start (~{self.pool_start_s:g} s)")
        if est_k < est_b:
            from .engine import EngineError
            try:
                self.pool = self.start_pool()
            except EngineError as e:
                raise _Stop(2, str(e))
            self.pool.slots = min(k, self.pool.slots)
            self.strategy = {"name": f"{self.pool.slots}-ary", "why": why}
        else:
            self.strategy = {"name": "binary", "why": why + ": the K-ary search would not pay"}
        self.log(f"[strategy] {self.strategy['name']}: {self.strategy['why']}")

    def _disk(self) -> None:
        """A full disk under the profiles is named as what it is, never taken for a verdict."""
        try:
            st = os.statvfs(self.workdir)
        except OSError:
            return
        free = st.f_bavail * st.f_frsize
        if free < MIN_FREE:
            raise _Stop(2, f"the disk holding {self.workdir} is full ({free} bytes free): the replays' "
                           f"profiles cannot be written there")

    def run(self) -> Dict[str, Any]:
        n = len(self.envs)
        self._disk()
        if self.pool is None and self.start_pool is not None:
            self.rounds = 2                   # the first here, then the last: a choice in between
            first = self.judge(0)
            if first.status == "good":
                self.choose(first.seconds)
        else:
            k = self.pool.slots if self.pool is not None else 1
            self.rounds = 1 if k > 1 else 2   # the two ends: together where there are GPUs for both
            self._prefetch([0, n - 1])
            first = self.judge(0)
        k = self.pool.slots if self.pool is not None else 1
        if first.status != "good":
            raise _Stop(2, f"the first environment {first.env.name!r} must be good: {first.reason}")
        last = self.judge(n - 1)
        if last.status == "error":
            raise _Stop(2, f"environment {last.env.name!r}: {last.reason}")
        if last.status == "good":
            return self._result(None, 0, f"no regression between {first.env.name!r} and {last.env.name!r}")
        lo, hi = 0, n - 1
        while hi - lo > 1:
            self.rounds += 1
            # k points split (lo, hi) into k + 1 parts (k = 1: the midpoint, a binary search);
            # the first bad point is the new hi, the good point before it the new lo
            m = min(k, hi - lo - 1)
            pts = [(lo + hi) // 2] if m == 1 else sorted(
                {lo + max(1, min(hi - lo - 1, round(j * (hi - lo) / (m + 1)))) for j in range(1, m + 1)})
            self._prefetch(pts)
            outs = [self.judge(mid) for mid in pts]
            for o in outs:
                if o.status == "error":
                    raise _Stop(2, f"environment {o.env.name!r}: {o.reason}")
            for mid, o in zip(pts, outs):
                if o.status == "good":
                    lo = mid
                else:
                    hi = mid
                    break
        return self._result(hi, 1, None, last_good=lo)

    def _result(self, bad: Optional[int], code: int, message: Optional[str], last_good: Optional[int] = None):
        n = len(self.envs)
        res: Dict[str, Any] = {"snapshot": self.snapshot, "mode": self.mode, "threshold_pct": self.threshold,
                               "repeat": self.repeat if self.mode in names(repeats=True) else None,
                               "kernels": self.kernels, "envs": [], "replays": len(self.done),
                               "rounds": self.rounds, "gpus": self.pool.slots if self.pool is not None else 1,
                               "strategy": self.strategy,
                               "max_replays": 2 + (math.ceil(math.log2(n - 1)) if n > 2 else 0),
                               "exit_code": code, "message": message, "workdir": self.workdir}
        for env in self.envs:
            o = self.done.get(env.index)
            d = {"name": env.name, "index": env.index, "vars": env.vars, "driver": env.driver, "device": env.device,
                 "tested": o is not None}
            if o is not None:
                d.update(o.to_dict())
                if o.profile is not None:
                    d["facts"] = facts(o.profile)
            res["envs"].append(d)
        if bad is not None:
            o = self.done[bad]
            res["first_bad"] = {"name": o.env.name, "index": o.env.index, "status": o.status, "reason": o.reason}
            res["last_good"] = ({"name": self.envs[last_good].name, "index": last_good}
                                if last_good is not None else None)
            if o.status == "slower":
                res["kind"] = "timing regression"
                res["vs_first"] = o.vs_first
                lg = self.done.get(last_good) if last_good is not None else None
                if lg is not None and lg.profile is not None and last_good != 0:
                    try:
                        res["vs_last_good"] = compare(lg.profile, o.profile, threshold=self.threshold)
                    except CompareError:
                        pass
                res["regressed_kernels"] = [
                    {k2: k.get(k2) for k2 in ("name", "base_median_us", "candidate_median_us", "base_us",
                                             "candidate_us", "ratio", "diff_pct", "noise_pct", "base_noise_pct",
                                             "candidate_noise_pct", "why")}
                    for k in o.vs_first["kernels"] if k["verdict"] == SLOWER]
            else:
                res["kind"] = "correctness break"
                res["correctness"] = o.stderr_tail
            msg = f"first bad environment: {o.env.name!r} ({o.env.index + 1} of {n}), {res['kind']}"
            if last_good is not None:
                msg += f"; last good: {self.envs[last_good].name!r} ({last_good + 1} of {n})"
            res["message"] = msg
        res["commands"] = {"bisect": invoked_command(), "replays": {o.env.name: o.command for o in self.done.values()}}
        return res

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()


class _Stop(Exception):
    def __init__(self, code: int, msg: str):
        super().__init__(msg)
        self.code = code


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:40] or "env"




def run_bisect_cli(*args, out=None, **kw) -> int:
    """Exit 0: no regression between the ends; 1: the first bad environment found (slower or a
    correctness break), as `compare` exits 1 on a regression; 2: error. Outputs are checked
    before the first replay. Ray's notices (--gpus, --address) go to stderr."""
    from .engine import stdout_while_ray
    with stdout_while_ray() as real:
        return _bisect_cli(*args, out=out or real, **kw)


def _bisect_cli(snapshot, envs_path, mode: str = "isolated", kernels: Optional[str] = None, repeat: int = 10,
                warmup: int = 3, threshold: float = 5.0, html: Optional[str] = None, as_json: bool = False,
                keep: Optional[str] = None, timeout: Optional[float] = None, top: int = 20, out=None,
                force: bool = False, gpus: int = 1, address: Optional[str] = None,
                tolerance: Optional[str] = None) -> int:
    err = sys.stderr

    def fail(msg: str) -> int:
        err.write(f"cudasnap: error: {msg}\n")
        return 2

    if mode not in names(campaign=True):
        return fail(f"--profile must be {' or '.join(sorted(names(campaign=True)))}")
    if repeat < 1:
        return fail("--repeat must be >= 1")
    if threshold < 0:
        return fail("--threshold must be >= 0")
    if kernels:
        import re
        try:
            re.compile(kernels)
        except re.error as e:
            return fail(f"--kernels: bad regex: {e}")
    if not os.path.exists(snapshot):
        return fail(f"{snapshot}: no such file")
    from cudasnap.formats import SnapshotError, SnapshotReader
    try:                                  # a file that is no snapshot: refused before --keep/--html exist
        with SnapshotReader(snapshot):
            pass
    except SnapshotError as e:
        return fail(str(e))
    except IsADirectoryError:
        return fail(f"{snapshot} is a directory: give a snapshot file")
    from cudasnap.formats.outputs import OutputError, check_output
    try:
        if html:
            check_output(html, force, "file", [snapshot, envs_path], "--html")
        if keep:
            check_output(keep, force, "dir", [snapshot, envs_path], "--keep")
    except OutputError as e:
        return fail(str(e))
    if html:
        from cudasnap.compare.html import need_plotly
        why = need_plotly()
        if why:
            return fail(why)
    try:
        envs = load_envs(envs_path)
        if tolerance is not None:         # every env that sets none judges its results so
            tol = tolerance_value(tolerance, "--tolerance", BisectError)
            for e in envs:
                e.vars.setdefault(TOLERANCE_VAR, tol)
    except BisectError as e:
        return fail(str(e))
    log = (lambda s: err.write(s + "\n")) if as_json else (lambda s: (out.write(s + "\n"), out.flush()))
    pool, start_pool, start_s = None, None, RAY_START_S
    if gpus > 1:
        if any(e.device is not None for e in envs):
            return fail("--gpus: an environment names a device; with --gpus each replay gets its own GPU from Ray")
        from .engine import EngineError
        from .replays import RayReplays
        if address:                           # the replays belong on that cluster: no choice
            try:
                pool = RayReplays(address, timeout=timeout)
            except EngineError as e:
                return fail(str(e))
            pool.slots = min(gpus, pool.slots)
        else:
            raw = os.environ.get("CUDASNAP_BISECT_RAY_START_S")
            if raw is not None:
                try:
                    start_s = float(raw)
                except ValueError:
                    start_s = -1.0
                if not (math.isfinite(start_s) and start_s >= 0):
                    return fail(f"CUDASNAP_BISECT_RAY_START_S={raw!r}: give Ray's start time in seconds (>= 0)")

            def start_pool():
                return RayReplays(None, timeout=timeout)
    try:
        b = Bisector(snapshot, envs, mode, kernels, repeat, warmup, threshold, workdir=keep, timeout=timeout, log=log,
                     pool=pool, gpus=gpus, start_pool=start_pool, pool_start_s=start_s)
    except OSError as e:
        if pool is not None:
            pool.close()
        return fail(f"--keep {keep}: {e.strerror or e}")
    try:
        try:
            res = b.run()
        except _Stop as s:
            res = b._result(None, s.code, str(s))
        except KeyboardInterrupt:
            from cudasnap.formats.outputs import Interrupted
            n = len(b.done)
            raise Interrupted(f"{n} environment(s) replayed, their profiles kept in {keep}" if keep else
                              f"{n} environment(s) replayed; no output was written") from None
        except OSError as e:        # the work directory (--keep) could not be written
            return fail(f"{e.filename or b.workdir}: {e.strerror or e}")
        if html:
            from .bisect_html import write_bisect_html
            try:
                write_bisect_html(res, html)
                res["html"] = str(html)
            except OSError as e:
                err.write(f"cudasnap: error: cannot write {html}: {e}\n")
                res["exit_code"] = 2
        if as_json:
            out.write(json.dumps(res, indent=1, default=str) + "\n")
        else:
            render_bisect(res, out, top)
        if res["exit_code"] == 2 and not as_json:
            err.write(f"cudasnap: error: {res['message']}\n")
        return res["exit_code"]
    finally:
        b.close()
        if b.pool is not None:
            b.pool.close()


def render_bisect(res: Dict[str, Any], out, top: int = 20) -> None:
    from cudasnap.compare.render import render_text
    w = out.write
    rounds = f", in {res['rounds']} round(s) on {res['gpus']} GPU(s)" if res.get("rounds") else ""
    w(f"replays: {res['replays']} of {len(res['envs'])} environments (at most {res['max_replays']}){rounds}\n")
    if res.get("strategy"):
        w(f"search: {res['strategy']['name']} ({res['strategy']['why']})\n")
    if res.get("first_bad"):
        w(res["message"] + "\n")
        if res.get("vs_first"):
            render_text(res["vs_first"], out, top,
                        title=f"{res['first_bad']['name']!r} vs the first environment {res['envs'][0]['name']!r}:")
        elif res.get("correctness"):
            w(res["correctness"] + "\n")
    elif res.get("message") and res["exit_code"] != 2:
        w(res["message"] + "\n")
    if res.get("html"):
        w(f"report written to {res['html']}\n")
