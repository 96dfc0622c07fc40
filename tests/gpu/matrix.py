"""Command x workload matrix: every cudasnap command on one real workload, as a user runs it.

run_workload(name, work, env) runs, in order, on one GPU (CUDA_VISIBLE_DEVICES in env):
  capture      the program under capture: its exit code and stdout equal a native run's
  replay       exit 0, 0 fell back, D2H results verified
  timeline     --profile timeline --out, twice (the second run feeds compare)
  isolated     --profile isolated -c 20
  graph        --profile graph (wall time kept beside timeline's)
  extract:*    extract + export + make + run of three launches: the first launch, the longest
               kernel of the timeline, a library GEMM (cuBLAS/cuBLASLt/CUTLASS names)
  sim          simulator coverage (info --sim --timeline t1.json): how many kernels, and how much
               GPU time, can run on GPGPU-Sim, each n/a kernel's reason; ok where one can (n/a
               where none can); with $CUDASNAP_GPGPUSIM, the first launch's extract replayed there too
  window       capture --window launches:A-B around the middle launches, replayed
  flight       capture --flight-recorder of the program ending through _exit (no exit
               handlers: the recorder's trigger for a process that ended abruptly), replayed
  stats        stats --out X.sqlite: one kernel row per recorded launch
  compare      compare of the two timelines: exit 0 (no regression between identical replays)
  metrics      --profile metrics -c 5 (every default section): exit 0, SM and memory % per kernel
  advise       advise --metrics of those counters (a job: from rank 0's timeline and counters;
               otherwise from the snapshot, its graph what-if measured): exit 0 and findings
CUDASNAP_MATRIX_CELLS=a,b runs only those cells (capture always)
Each cell is {"ok": bool, "s": seconds, "detail": str}; a cell that cannot apply (a workload
with no library GEMM) is {"ok": None, "detail": why}. Used by tests/gpu/test_gpu_matrix.py and
bench/matrix_gpu.py (all workloads, spread over every GPU)."""
from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

PY = sys.executable
HERE = Path(__file__).resolve().parent
W = HERE / "workloads"
GEMM_RX = re.compile(r"gemm|Gemm|GEMM|nvjet|cutlass|xmma|cublas", re.I)
DETERMINISTIC = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "XLA_FLAGS": "--xla_gpu_deterministic_ops=true",
                 "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}

# name -> (program argv or the nvcc source to build, extra env)
WORKLOADS: Dict[str, tuple] = {
    "torch_eager": ([PY, str(W / "torch_eager.py")], {}),
    "torch_compile": ([PY, str(W / "torch_compile.py")], {}),
    "torch_train_compile": ([PY, str(W / "torch_train_compile.py")], {}),
    "torch_libs": ([PY, str(W / "torch_libs.py")], {}),
    "torch_graph": ([PY, str(W / "torch_graph.py")], {}),
    "triton_kernel": ([PY, str(W / "triton_kernel.py")], {}),
    "jax_jit": ([PY, str(W / "jax_jit.py")], {}),
    "jax_train": ([PY, str(W / "jax_train.py")], {}),
    "cupy_libs": ([PY, str(W / "cupy_libs.py")], {}),
    "hf_generate": ([PY, str(W / "hf_generate.py")], {}),
    "vision_amp_train": ([PY, str(W / "vision_amp_train.py")], {}),
    "pyg_gnn": ([PY, str(W / "pyg_gnn.py")], {}),
    "nvcc_ptrs": ("ptrs.cu", {}),
    "nvcc_mt_launch": ("mt_launch.cu", {}),
    # CUDA samples' runtime features; batched copies (refused), conditional nodes and device-side
    # launches (graph mode cannot hold them) are left to test_gpu_samples.py, which checks each
    # part alone
    "nvcc_samples": ("samples.cu managed mapped hostfunc coop cluster bigsmem symbols mempool graphs events printf", {}),
    # a job: two ranks on two GPUs, NCCL (the matrix replays it as a group)
    "ddp_nccl": ([PY, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(W / "ddp_train.py"), "5"],
                 {"NCCL_NVLS_ENABLE": "0"}),
}
JOBS = {"ddp_nccl": 2}        # workloads that need several GPUs: how many
# capture options a user gives such a program: XLA asked to keep its PTX (for the simulator)
CAPTURE_OPTS = {"jax_jit": ["--keep-ptx", "xla"], "jax_train": ["--keep-ptx", "xla"]}
# workloads whose results vary in their last bits from run to run, natively too (float atomics in
# scatter reductions): replays compare D2H results with the tolerance a user would give after
# the mismatch's hint; end-state hashes are exact, so their windows cannot be proven that way
TOLERANCE = {"pyg_gnn": ("--dtype", "f32", "--rtol", "1e-4")}
TIMEOUT = int(os.environ.get("CUDASNAP_MATRIX_TIMEOUT", "300"))
# a hung replay fails its cell after this (healthy calls of every workload take a few seconds)
WATCHDOG = os.environ.get("CUDASNAP_MATRIX_WATCHDOG", "60")

# An nvcc program's flight-recorder variant: the program's main, then _exit (exit handlers skipped)
_EXIT_WRAPPER = r"""
#include <cstdio>
#include <unistd.h>
int workload_main(%s);
int main(int argc, char **argv) { int r = workload_main(%s); fflush(stdout); fflush(stderr); _exit(r); }
"""


class GpuGate:
    """Commands sharing one GPU (bench/matrix_gpu.py --slots): a command that measures time or
    profiles with counters (the timeline profiles compare reads, metrics, advise) runs alone on
    the GPU; the others run side by side. Waiting lone commands go first."""

    def __init__(self):
        self.cond = threading.Condition()
        self.sharing, self.alone_now, self.waiting = 0, False, 0

    @contextlib.contextmanager
    def hold(self, alone: bool):
        with self.cond:
            if alone:
                self.waiting += 1
                while self.alone_now or self.sharing:
                    self.cond.wait()
                self.waiting -= 1
                self.alone_now = True
            else:
                while self.alone_now or self.waiting:
                    self.cond.wait()
                self.sharing += 1
        try:
            yield
        finally:
            with self.cond:
                if alone:
                    self.alone_now = False
                else:
                    self.sharing -= 1
                self.cond.notify_all()


def _cudasnap(*args: str) -> List[str]:
    return [PY, "-m", "cudasnap", *args]


class Matrix:
    def __init__(self, name: str, work: Path, env: Dict[str, str], log: Optional[Callable[[str], None]] = None,
                 gate: Optional[GpuGate] = None):
        self.name, self.work, self.log = name, work, log or (lambda s: None)
        self.gate = gate
        work.mkdir(parents=True, exist_ok=True)
        prog, extra = WORKLOADS[name]
        self.env = {**os.environ, **DETERMINISTIC, **extra, **env}
        self.cells: Dict[str, dict] = {}
        self.tolerance = TOLERANCE.get(name, ())
        self.ranks: List[Path] = []
        # an nvcc workload: "SOURCE.cu [ARG...]"
        src, args = (prog.split()[0], prog.split()[1:]) if isinstance(prog, str) else (None, [])
        self.cmd = self._build(src) + args if src else list(prog)
        self.flight_env = {"WORKLOAD_EXIT_ABRUPTLY": "1"}      # ddp_train.py: each rank ends with _exit
        self.flight_cmd = self._build(src, exit_wrapper=True) + args if src else list(prog) if name in JOBS else [
            PY, "-c", "import os, runpy, sys; sys.argv = sys.argv[1:]; "
                      "runpy.run_path(sys.argv[0], run_name='__main__'); "
                      "sys.stdout.flush(); sys.stderr.flush(); os._exit(0)", *prog[1:]]

    # helpers --------------------------------------------------------------------------------
    def _build(self, src: str, exit_wrapper: bool = False) -> List[str]:
        out = self.work / (Path(src).stem + ("_exit" if exit_wrapper else ""))
        cmd = ["nvcc", "-O2", "-cudart", "static", "-arch=sm_90", "-o", str(out)]
        # a source's own flags, from a first line "// nvcc-flags: ..." (rdc, libraries), go last
        first = (W / src).read_text().split("\n", 1)[0]
        flags = first.split("nvcc-flags:", 1)[1].split() if "nvcc-flags:" in first else []
        if exit_wrapper:
            # -Dmain renames the workload's main; the wrapper is compiled on its own, without it
            text = (W / src).read_text()
            has_args = re.search(r"int\s+main\s*\(\s*int", text) is not None
            wrap = self.work / "exit_wrapper.cu"
            wrap.write_text(_EXIT_WRAPPER % (("int, char **", "argc, argv") if has_args else ("", "")))
            obj = self.work / "exit_wrapper.o"
            subprocess.run(["nvcc", "-c", "-arch=sm_90", "-o", str(obj), str(wrap)], check=True, capture_output=True)
            cmd = [*cmd[:-2], "-o", str(out), "-Dmain=workload_main", str(W / src), str(obj), *flags]
        else:
            cmd += [str(W / src), *flags]
        subprocess.run(cmd, check=True, capture_output=True)
        return [str(out)]

    def run(self, argv: List[str], timeout: int = TIMEOUT, cwd: Optional[Path] = None,
            env: Optional[Dict[str, str]] = None, alone: bool = False) -> subprocess.CompletedProcess:
        """alone: a measurement; with a gate (a GPU shared by several workloads) nothing else
        runs on the GPU meanwhile."""
        try:
            with self.gate.hold(alone) if self.gate is not None else contextlib.nullcontext():
                cp = subprocess.run(argv, env={**self.env, **(env or {})}, capture_output=True, text=True,
                                    timeout=timeout, cwd=str(cwd or self.work))
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            cp = subprocess.CompletedProcess(argv, 124, out, f"timed out after {timeout} s")
        with open(self.work / "commands.log", "a") as f:      # every command's output, for a failed cell
            f.write(f"\n$ {' '.join(map(str, argv))}\n# exit {cp.returncode}\n{cp.stdout[-20000:]}\n{cp.stderr[-20000:]}\n")
        return cp

    @staticmethod
    def selected(key: str) -> bool:
        only = [c for c in os.environ.get("CUDASNAP_MATRIX_CELLS", "").split(",") if c]
        return not only or key == "capture" or any(key == c or key.startswith(c + ":") for c in only)

    def cell(self, key: str, fn: Callable[[], tuple]) -> dict:
        if not self.selected(key):
            return {"ok": None, "s": 0, "detail": "not selected"}      # not recorded
        t0 = time.monotonic()
        try:
            ok, detail = fn()
        except Exception as e:                      # a broken cell must not hide the others
            ok, detail = False, f"{type(e).__name__}: {e}"
        c = {"ok": ok, "s": round(time.monotonic() - t0, 2), "detail": str(detail)[-600:]}
        self.cells[key] = c
        self.log(f"{self.name:>20} {key:<16} {'PASS' if ok else ('n/a' if ok is None else 'FAIL')} "
                 f"{c['s']:7.1f} s  {c['detail'][:160]}")
        return c

    @staticmethod
    def _tail(cp: subprocess.CompletedProcess) -> str:
        return f"exit {cp.returncode}: " + " | ".join((cp.stderr or cp.stdout).strip().splitlines()[-3:])

    def replay_ok(self, snap: Path, *extra: str) -> tuple:
        cp = self.run(_cudasnap("replay", str(snap), "--json", "--watchdog", WATCHDOG, *self.tolerance, *extra))
        try:
            res = json.loads(cp.stdout)
        except json.JSONDecodeError:
            return False, self._tail(cp)
        if self.tolerance and cp.returncode == 1 and res.get("mismatches") and "ranks" not in res \
                and all(m.get("call") == "end state" for m in res["mismatches"]) and res.get("d2h_verified"):
            return None, (f"{res['d2h_verified']} D2H verified within {' '.join(self.tolerance)}; end-state hashes "
                          f"are exact and this program's reductions round differently from run to run")
        # a job: one result per rank, each as a single replay reports it
        parts = [x.get("replay") or {} for x in res["ranks"]] if "ranks" in res else [res]
        for p in parts:                 # bytes of the end state a window verified
            p["end_state_bytes"] = (p.get("endstate") or {}).get("bytes") or 0
        tot = {k: sum(p.get(k) or 0 for p in parts) for k in ("placed", "fell_back", "d2h_verified", "end_state_bytes")}
        ok = cp.returncode == 0 and not tot["fell_back"] and tot["d2h_verified"] + tot["end_state_bytes"] > 0
        msg = " | ".join(str(p.get("message") or "")[:160] for p in parts if p.get("message"))
        if cp.returncode:
            msg += " | " + " | ".join(cp.stderr.strip().splitlines()[-3:])
        return ok, (f"exit {cp.returncode}{f', {len(parts)} ranks' if len(parts) > 1 else ''}: {tot['placed']} placed, "
                    f"{tot['fell_back']} fell back, {tot['d2h_verified']} D2H verified, end state "
                    f"{tot['end_state_bytes']} B; {msg}")

    def recorded_launches(self, snap: Path) -> List[int]:
        """Call numbers of the kernel launches the snapshot recorded (graph nodes are not launches)."""
        from cudasnap.formats import SnapshotReader
        return [c["s"] for c in SnapshotReader(snap).records(kinds=["c"])
                if c["f"].startswith("cuLaunch") and "Host" not in c["f"] and c.get("r") == 0]

    def recorded_graph_launches(self, snap: Path) -> List[int]:
        """Call numbers of the graph launches (extract --launch takes one with its kernels)."""
        from cudasnap.formats import SnapshotReader
        return [c["s"] for c in SnapshotReader(snap).records(kinds=["c"])
                if c["f"].startswith("cuGraphLaunch") and c.get("r") == 0]

    # the matrix -----------------------------------------------------------------------------
    def go(self) -> Dict[str, dict]:
        snap = self.work / f"{self.name}.cusnap"
        native = self.run(self.cmd)

        def capture():
            cp = self.run(_cudasnap("capture", "-o", str(snap), *CAPTURE_OPTS.get(self.name, ()), "--", *self.cmd))
            kept = re.search(r"(PTX kept for .*)\)\s*$", cp.stderr or "", re.M)     # the summary's last flag
            if kept:
                self.ptx_kept = kept.group(1)
            # a job's ranks print in whatever order they get there: the lines are compared as a set
            same = (sorted(cp.stdout.splitlines()) == sorted(native.stdout.splitlines()) if self.name in JOBS
                    else cp.stdout == native.stdout)
            return (cp.returncode == native.returncode == 0 and same and snap.exists(),
                    f"native exit {native.returncode}, capture exit {cp.returncode}, stdout identical {same}; "
                    + " | ".join(cp.stderr.strip().splitlines()[-2:]))
        if not self.cell("capture", capture)["ok"]:
            return self.cells
        target = snap
        if self.name in JOBS:       # the job's group manifest; rank files are STEM.PID.cusnap
            man = snap.with_name(snap.stem + ".group.json")
            target = man if man.exists() else snap
            self.ranks = sorted(p for p in self.work.glob(f"{snap.stem}.*.cusnap"))
        self.cell("replay", lambda: self.replay_ok(target))

        prof: Dict[str, dict] = {}
        walls: Dict[str, float] = {}

        def profile(mode: str, out: str, *extra: str):
            def fn():
                t0 = time.monotonic()
                cp = self.run(_cudasnap("replay", str(target), "--profile", mode, "--out", str(self.work / out),
                                        "--watchdog", WATCHDOG, *self.tolerance, *extra), alone=mode == "timeline")
                walls[out] = time.monotonic() - t0
                path = self.work / out
                if self.name in JOBS:       # each rank writes FILE.rank{N}.json: rank 0's is read
                    path = self.work / out.replace(".json", ".rank0.json")
                if cp.returncode != 0 or not path.exists():
                    return False, self._tail(cp)
                rep = json.loads(path.read_text())
                prof[out] = rep
                rows = rep.get("launches") or []
                timed = sum(1 for r in rows if r.get("time_us") is not None or r.get("median_us") is not None)
                return timed > 0 and timed == len(rows), f"{timed} of {len(rows)} launches timed, {walls[out]:.1f} s"
            return fn
        self.cell("timeline", profile("timeline", "t1.json"))
        self.cell("timeline_2", profile("timeline", "t2.json"))
        self.cell("isolated", profile("isolated", "iso.json", "-c", "20"))
        g = self.cell("graph", profile("graph", "graph.json", "--no-timeline-check"))
        if g["ok"] and "t1.json" in walls:
            g["detail"] += f"; graph/timeline wall {walls['graph.json'] / walls['t1.json']:.2f}x"

        xsnap = self.ranks[0] if self.name in JOBS and self.ranks else snap
        recorded = self.recorded_launches(xsnap)
        # launch rows of the timeline that extract can select: recorded launches, and kernels of
        # graphs (their rows carry the graph launch's call number)
        rec_set = set(recorded) | set(self.recorded_graph_launches(xsnap))
        from cudasnap.formats.vocab import is_collective_kernel     # a collective cannot run alone: not a pick
        launches = sorted((r for r in (prof.get("t1.json") or {}).get("launches") or [] if r.get("seq") in rec_set
                           and not is_collective_kernel(r.get("name"))), key=lambda r: r["seq"])
        picks: Dict[str, Optional[dict]] = {"first": launches[0] if launches else None,
                                            "longest": max(launches, key=lambda r: r.get("time_us") or 0) if launches else None,
                                            "gemm": next((r for r in launches if GEMM_RX.search(r.get("name") or "")), None)}
        for what, row in picks.items():
            if row is None and not self.selected(f"extract:{what}"):
                continue
            if row is None:
                reason = "no library GEMM in this workload" if launches and what == "gemm" else "no timeline"
                self.cells[f"extract:{what}"] = {"ok": None if launches else False, "s": 0, "detail": reason}
                continue
            self.cell(f"extract:{what}", lambda row=row, what=what: self._extract_export(xsnap, row, what))
        sim = self.cell("sim", lambda: self._sim(xsnap))
        if self.sim_coverage is not None:
            sim["coverage"] = self.sim_coverage

        def window():
            n = len(recorded)
            if n < 2:
                return False, "too few launches for a window"
            a = n // 2
            b = min(n - 1, a + max(1, min(50, n // 4)))
            ws = self.work / "win.cusnap"
            cp = self.run(_cudasnap("capture", "-o", str(ws), "--window", f"launches:{a}-{b}", "--", *self.cmd))
            files = sorted(self.work.glob("win*.w1*.cusnap"))
            if cp.returncode != 0 or not files:
                return False, f"window {a}-{b}: " + self._tail(cp)
            if self.name in JOBS:           # each rank's window: replayed together
                man = sorted(self.work.glob("win*.group.json"))
                ok, d = self.replay_ok(man[0]) if man else (False, "no group manifest for the window")
                return ok, f"window launches {a}-{b} ({len(files)} ranks): {d}"
            ok, d = self.replay_ok(files[0])
            return ok, f"window launches {a}-{b} ({files[0].name}): {d}"
        self.cell("window", window)

        def flight():
            fs = self.work / "flight.cusnap"
            cp = self.run(_cudasnap("capture", "-o", str(fs), "--flight-recorder=30", "--", *self.flight_cmd),
                          env=self.flight_env)
            if self.name in JOBS:
                man = sorted(self.work.glob("flight*.group.json"))
                fs = man[0] if man else fs
            if not fs.exists():
                return False, "no snapshot written: " + self._tail(cp)
            ok, d = self.replay_ok(fs)
            return ok and cp.returncode == 0, f"capture exit {cp.returncode}; {d}"
        self.cell("flight", flight)

        def stats():
            db = self.work / "stats.sqlite"
            cp = self.run(_cudasnap("stats", str(xsnap), "--out", str(db)))
            if cp.returncode != 0 or not db.exists():
                return False, self._tail(cp)
            with sqlite3.connect(db) as con:
                k = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
                # every launch is named (an unnamed one: the snapshot lost its kernel's name)
                unnamed = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s"
                                      " ON s.id = k.mangledName WHERE s.value = '' OR s.value LIKE '<%'").fetchone()[0]
            want = len(recorded)
            return k == want and not unnamed, f"{k} kernel rows, {want} launches recorded, {unnamed} unnamed"
        self.cell("stats", stats)

        def compare():
            t1, t2 = (("t1.rank0.json", "t2.rank0.json") if self.name in JOBS else ("t1.json", "t2.json"))
            cp = self.run(_cudasnap("compare", str(self.work / t1), str(self.work / t2)))
            return cp.returncode == 0, self._tail(cp) if cp.returncode else " | ".join(cp.stdout.strip().splitlines()[-2:])
        self.cell("compare", compare)

        def metrics():
            out = "m.json"
            cp = self.run(_cudasnap("replay", str(target), "--profile", "metrics", "-c", "5", "--out",
                                    str(self.work / out), "--watchdog", WATCHDOG, *self.tolerance), alone=True)
            path = self.work / (out.replace(".json", ".rank0.json") if self.name in JOBS else out)
            if cp.returncode == 2 and "a graph's node" in (cp.stdout + cp.stderr):
                (self.work / out).unlink(missing_ok=True)
                return None, "its kernels run only inside the program's CUDA graphs (a limitation: metrics " \
                             "replays launches alone)"
            if cp.returncode != 0 or not path.exists():
                return False, self._tail(cp)
            rep = json.loads(path.read_text())
            ks = [k for k in rep.get("kernels") or [] if k.get("metrics")]
            sol = [k for k in ks if isinstance(k["metrics"].get("sm__throughput.avg.pct_of_peak_sustained_elapsed"),
                                                (int, float))]
            top = max(sol, key=lambda k: k.get("total_us") or 0, default=None)
            s = rep.get("summary") or {}
            d = f"{len(sol)} of {len(ks)} kernels with SOL figures, {s.get('passes')} passes"
            if top:
                m = top["metrics"]
                d += (f"; {(top.get('name') or '?')[:40]}: SM {m['sm__throughput.avg.pct_of_peak_sustained_elapsed']:.0f}%,"
                      f" memory {m.get('gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed') or 0:.0f}%,"
                      f" bound {(top.get('roofline') or {}).get('bound')}")
            return bool(sol) and len(sol) == len(ks), d
        self.cell("metrics", metrics)

        def advise():
            m = self.work / ("m.rank0.json" if self.name in JOBS else "m.json")
            src = self.work / "t1.rank0.json" if self.name in JOBS else target
            out = self.work / "advise.json"
            cp = self.run(_cudasnap("advise", str(src), *(["--metrics", str(m)] if m.exists() else []),
                                    "--out", str(out), "-f"), alone=True)
            if cp.returncode != 0 or not out.exists():
                return False, self._tail(cp)
            f = json.loads(out.read_text()).get("findings") or []
            kinds = sorted({x.get("kind") for x in f})
            return bool(f), f"{len(f)} findings ({', '.join(kinds[:6])})" + ("" if m.exists() else "; no counters")
        self.cell("advise", advise)
        return self.cells

    sim_coverage: Optional[dict] = None
    ptx_kept: Optional[str] = None          # capture's "PTX kept for N of M cubin modules (...)"

    def _sim(self, snap: Path) -> tuple:
        """Coverage from the snapshot and the first timeline; the first launch simulated where a
        build is at hand. ok: some kernel can run there; n/a: none can (the reasons named)."""
        t1 = self.work / ("t1.rank0.json" if self.name in JOBS else "t1.json")
        cp = self.run(_cudasnap("info", str(snap), "--sim", "--json", *(["--timeline", str(t1)] if t1.exists() else [])))
        try:
            doc = json.loads(cp.stdout)
        except json.JSONDecodeError:
            return False, "info --sim: " + self._tail(cp)
        s = doc["summary"]
        self.sim_coverage = {k: s.get(k) for k in ("kernels", "runnable", "launches", "runnable_launches",
                                                   "runnable_time_pct", "na", "snapshot_gaps", "line")}
        self.sim_coverage["ptx_kept"] = self.ptx_kept
        self.sim_coverage["na_kernels"] = [
            {"name": (k["demangled"] or k["name"])[:120], "share_pct": k.get("share_pct"),
             "reasons": [r["reason"] for r in k["reasons"]]} for k in doc["kernels"] if not k["runnable"]]
        detail, ok = s["line"] + (f"; capture: {self.ptx_kept}" if self.ptx_kept else ""), (True if s["runnable"] else None)
        ex, path = self.work / "x_first.cusnap", os.environ.get("CUDASNAP_GPGPUSIM")
        if path and ex.exists():
            cp = self.run(_cudasnap("replay", str(ex), "--sim", "gpgpu-sim", "--sim-path", path, "-q"))
            err = (cp.stderr or "").strip().splitlines()
            refused = cp.returncode == 2 and err and ("has no PTX" in err[0] or "the simulator cannot run it" in err[0])
            detail += f"; first launch on GPGPU-Sim: " + (err[0][:200] if refused else self._tail(cp))
            if not refused and cp.returncode != 0:
                ok = False
        return ok, detail

    def _extract_export(self, snap: Path, row: dict, what: str) -> tuple:
        ex = self.work / f"x_{what}.cusnap"
        cp = self.run(_cudasnap("extract", str(snap), "--launch", str(row["seq"]), "-o", str(ex), "--check"))
        name = (row.get("name") or "?")[:60]
        if cp.returncode != 0:
            return False, f"extract #{row['seq']} {name}: " + self._tail(cp)
        d = self.work / f"x_{what}_c"
        cp = self.run(_cudasnap("export", str(ex), "-o", str(d)))
        if cp.returncode != 0:
            return False, f"export #{row['seq']} {name}: " + self._tail(cp)
        cp = self.run(["make", "-s", "-C", str(d), "CC=gcc", "CUDA_HOME=/usr/local/cuda"])
        if cp.returncode != 0:
            return False, f"build #{row['seq']} {name}: " + self._tail(cp)
        cp = self.run([str(d / "replay")], cwd=d)
        size = ex.stat().st_size / max(1, snap.stat().st_size) * 100
        return cp.returncode == 0, f"#{row['seq']} {name}: extract {size:.1f}% of the file, exported program exit {cp.returncode}"


def run_workload(name: str, work: Path, env: Optional[Dict[str, str]] = None, log=None,
                 gate: Optional[GpuGate] = None) -> Dict[str, dict]:
    return Matrix(name, work, env or {}, log, gate).go()


COLUMNS = ["capture", "replay", "timeline", "isolated", "graph", "extract:first", "extract:longest", "extract:gemm",
           "sim", "window", "flight", "stats", "compare", "metrics", "advise"]


def sim_coverage(rows: List[dict]) -> str:
    """Per workload: the sim column's summary, then each kernel it cannot take, with why."""
    out = []
    for r in rows:
        cov = (r["cells"].get("sim") or {}).get("coverage")
        if not cov:
            continue
        out.append(f"{r['workload']} (run {r.get('run', 1)}): {cov['line']}"
                   + (f"; a whole-snapshot replay also meets {cov['snapshot_gaps']} gap(s)" if cov.get("snapshot_gaps") else "")
                   + (f"; capture: {cov['ptx_kept']}" if cov.get("ptx_kept") else ""))
        for k in cov.get("na_kernels") or []:
            share = f" ({k['share_pct']:.1f}% of GPU time)" if k.get("share_pct") is not None else ""
            out.append(f"  n/a {k['name'][:90]}{share}: {'; '.join(k['reasons'])}")
    return "\n".join(out) + ("\n" if out else "")


def table(rows: List[dict]) -> str:
    """Markdown: one row per (run, workload), one column per command."""
    head = "| run | workload | " + " | ".join(COLUMNS) + " |\n|" + "---|" * (len(COLUMNS) + 2) + "\n"
    lines = []
    for r in rows:
        cells = r["cells"]
        if r.get("not_run"):
            lines.append(f"| {r.get('run', 1)} | {r['workload']} | " + " | ".join(["not run"] * len(COLUMNS)) + " |")
            continue
        marks = []
        for c in COLUMNS:
            v = cells.get(c)
            marks.append("-" if v is None else {True: "ok", False: "**FAIL**", None: "n/a"}[v["ok"]])
            cov = (v or {}).get("coverage")
            if cov:         # the sim column: kernels and GPU time the simulator can take
                pct = cov.get("runnable_time_pct")
                marks[-1] += f" {cov['runnable']}/{cov['kernels']}" + (f", {pct:.0f}%" if pct is not None else "")
        lines.append(f"| {r.get('run', 1)} | {r['workload']} | " + " | ".join(marks) + " |")
    return head + "\n".join(lines) + "\n"
