"""Faults beyond pipes (issue 60), as subprocess cases: a stdout that cannot be written (a full
disk, closed, read-only), a closed stdin, a full stderr, for every command with a verdict;
SIGTERM, SIGHUP and SIGINT for every long command (the files, processes and directories each
leaves); two writers at once. Each case runs `python -m cudasnap` as a user would.

Used by tests/test_fault_matrix.py (a sample, in CI) and bench/sweep_bad_inputs.py (all).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Optional

STEADY = {"CUDA_DOUBLE_SLOW": "*:1", "CUDA_DOUBLE_SLOW_FLOOR_US": "2000"}
SLOW_FILL = {"CUDA_DOUBLE_SLOW": "*:1,fill:3", "CUDA_DOUBLE_SLOW_FLOOR_US": "2000"}
CRAWL = {"CUDA_DOUBLE_SLOW": "*:8000"}          # 8 s a kernel: the GPU "works" while interrupted
MARK = "CUDASNAP_FAULT_CASE"                    # set in each case's environment: finds what it left running


def cmd(*args) -> list:
    return [sys.executable, "-m", "cudasnap", *map(str, args)]


def prepare(d: Path, env: Dict[str, str], lib: str, simprog: Optional[str] = None) -> SimpleNamespace:
    """Profiles with and without a regression, a snapshot, a damaged one, stores with each
    verdict, and the work directory, under d."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_compare import three_kernels
    from test_exit_codes import _store
    d.mkdir(parents=True, exist_ok=True)
    snap = three_kernels(d / "three.cusnap")
    procs = {n: subprocess.Popen(cmd("replay", snap, "--profile", "isolated", "--repeat", "5", "--warmup", "1",
                                     "--out", d / f"{n}.json", "-q"), env={**env, **v},
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for n, v in (("a", STEADY), ("slow", SLOW_FILL))}
    procs["t"] = subprocess.Popen(cmd("replay", snap, "--profile", "timeline", "--out", d / "t.json", "-q"), env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for n, p in procs.items():
        assert p.wait(timeout=300) == 0, p.stderr.read()
    data = bytearray(snap.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 64] = b"\xff" * 64
    (d / "damaged.cusnap").write_bytes(bytes(data))
    stores = {"reg": ("done", "SLOWER", "ok"), "infra": ("done", "INFRA", "infra"),
              "int": ("interrupted", "SAME", "ok"), "same": ("done", "SAME", "ok")}
    for n, (status, verdict, cell) in stores.items():
        _store(d / f"{n}.sqlite", status, verdict, cell)
    sim = None
    if simprog and env.get("CUDASNAP_GPGPUSIM"):     # a snapshot with PTX: replay --sim's report
        sim = d / "sim.cusnap"
        ptx = Path(__file__).resolve().parent / "data" / "sim" / "kernels.ptx"
        subprocess.run(cmd("capture", "-q", "-o", sim, "--ring-mb", "16", "--", simprog, ptx), env=env,
                       capture_output=True, timeout=120, check=True)
    return SimpleNamespace(dir=d, snap=snap, damaged=d / "damaged.cusnap", a=d / "a.json", slow=d / "slow.json",
                           env=env, lib=lib, sim=sim)


# ------------------------------------------------------------------ stdout and stdin faults

@dataclass
class StreamCase:
    name: str
    args: list
    want: int                       # the verdict with a working stdout
    env: Dict[str, str] = field(default_factory=dict)


def verdict_commands(w: SimpleNamespace) -> List[StreamCase]:
    """Every command with a verdict, in its variants, and the exit code it has with a reader."""
    corrupt = {"CUDA_DOUBLE_CORRUPT": "fill:3"}
    out = w.dir / "outs"
    c = [StreamCase("info", ["info", w.snap], 0), StreamCase("info --json", ["info", w.snap, "--json"], 0),
         StreamCase("info damaged", ["info", w.damaged], 2),
         StreamCase("dump", ["dump", w.snap], 0), StreamCase("dump jsonl", ["dump", w.snap, "--format", "jsonl"], 0),
         StreamCase("dump --calls", ["dump", w.snap, "--calls", "launches"], 0),
         StreamCase("stats", ["stats", w.snap], 0), StreamCase("stats csv", ["stats", w.snap, "--format", "csv"], 0),
         StreamCase("stats json", ["stats", w.snap, "--format", "json"], 0),
         StreamCase("stats kernels", ["stats", w.snap, "--report", "kernels"], 0),
         StreamCase("stats api", ["stats", w.snap, "--report", "api"], 0),
         StreamCase("stats memory", ["stats", w.snap, "--report", "memory"], 0),
         StreamCase("dump --blobs", ["dump", w.snap, "--blobs"], 0),
         StreamCase("dump memcpy", ["dump", w.snap, "--calls", "memcpy"], 0),
         StreamCase("info damaged --json", ["info", w.damaged, "--json"], 2),
         StreamCase("api", ["api"], 0), StreamCase("api --json", ["api", "--json"], 0),
         StreamCase("api replay", ["api", "--status", "replay"], 0),
         StreamCase("api refused", ["api", "--status", "refused"], 0),
         StreamCase("compare same --json", ["compare", w.a, w.a, "--json"], 0),
         StreamCase("replay mismatch -q", ["replay", w.snap, "-q"], 1, corrupt),
         StreamCase("compare same", ["compare", w.a, w.a], 0),
         StreamCase("compare regression", ["compare", w.a, w.slow, "--threshold", "15"], 1),
         StreamCase("compare regression --json", ["compare", w.a, w.slow, "--threshold", "15", "--json"], 1),
         StreamCase("replay ok", ["replay", w.snap], 0), StreamCase("replay ok --json", ["replay", w.snap, "--json"], 0),
         StreamCase("replay mismatch", ["replay", w.snap], 1, corrupt),
         StreamCase("replay mismatch --json", ["replay", w.snap, "--json"], 1, corrupt),
         StreamCase("export", ["export", w.snap, "-o", out / "exp{n}"], 0),
         StreamCase("extract", ["extract", w.snap, "--kernel", "fill", "-o", out / "ex{n}.cusnap"], 0),
         StreamCase("repair", ["repair", w.damaged, "-o", out / "rep{n}.cusnap"], 0),
         StreamCase("advise profile", ["advise", w.dir / "t.json", "--no-what-if"], 0),
         StreamCase("campaign report same", ["campaign", "report", w.dir / "same.sqlite"], 0),
         StreamCase("campaign report regression", ["campaign", "report", w.dir / "reg.sqlite"], 1),
         StreamCase("campaign report infra", ["campaign", "report", w.dir / "infra.sqlite"], 2),
         StreamCase("campaign report interrupted", ["campaign", "report", w.dir / "int.sqlite"], 2)]
    if getattr(w, "sim", None) is not None:
        c.append(StreamCase("replay --sim", ["replay", w.sim, "--sim", "gpgpu-sim"], 0))
    return c


# how each fault is made (in the child, before exec) and the exit code it must give
STREAM_FAULTS = ("stdout_full", "stdout_closed", "stdout_readonly", "stdin_closed", "stderr_full")


def _fault_fn(kind: str):
    def pre():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if kind == "stdout_full":
            fd = os.open("/dev/full", os.O_WRONLY)
            os.dup2(fd, 1)
        elif kind == "stdout_closed":
            os.close(1)
        elif kind == "stdout_readonly":            # writes fail with EBADF
            fd = os.open("/dev/null", os.O_RDONLY)
            os.dup2(fd, 1)
        elif kind == "stdin_closed":
            os.close(0)
        elif kind == "stderr_full":
            fd = os.open("/dev/full", os.O_WRONLY)
            os.dup2(fd, 2)
    return pre


def want_for(kind: str, verdict: int) -> int:
    """A report that could not be written: 1 stays 1 (and 2 stays 2), a clean run exits 2.
    A closed stdin or a full stderr changes nothing."""
    if kind in ("stdin_closed", "stderr_full"):
        return verdict
    return 2 if verdict == 0 else verdict


@dataclass
class Result:
    cls: str
    name: str
    code: Optional[int]
    want: object
    problems: List[str]
    stderr: str = ""
    took: Optional[float] = None        # signals: from the signal to the exit


def run_stream_cases(w: SimpleNamespace, kinds=STREAM_FAULTS, every: int = 1, parallel: int = 4) -> List[Result]:
    cases = [(k, c) for k in kinds for c in verdict_commands(w)][::every]
    (w.dir / "outs").mkdir(exist_ok=True)
    results, running = [], []
    for n, (kind, c) in enumerate(cases):
        args = [str(a).replace("{n}", str(n)) for a in c.args]
        errf = open(w.dir / "outs" / f"err{n}.txt", "w+")
        p = subprocess.Popen(cmd(*args), env={**w.env, **c.env}, stdout=subprocess.DEVNULL if kind in
                             ("stdin_closed", "stderr_full") else None, stdin=subprocess.DEVNULL,
                             stderr=errf if kind != "stderr_full" else subprocess.DEVNULL,
                             preexec_fn=_fault_fn(kind))
        running.append((kind, c, p, errf))
        while len(running) >= parallel or (n == len(cases) - 1 and running):
            kind_, c_, p_, f_ = running.pop(0)
            results.append(_judge_stream(kind_, c_, p_, f_))
    return results


def _judge_stream(kind, c, p, errf) -> Result:
    try:
        code = p.wait(timeout=300)
    except subprocess.TimeoutExpired:
        p.kill()
        code = p.wait()
    errf.seek(0)
    err = errf.read()
    errf.close()
    want = want_for(kind, c.want)
    problems = []
    if code != want:
        problems.append(f"exit {code}, want {want}")
    if "Traceback" in err or "Exception ignored" in err or "internal error" in err:
        problems.append("traceback: " + err.strip()[-300:])
    if kind.startswith("stdout") and code != c.want and "could not be written" not in err:
        problems.append("no line says the report was not written")
    return Result(f"stream {kind}", c.name, code, want, problems, err[-400:])


# ------------------------------------------------------------------ signals

def _big(path: Path) -> Path:
    from test_exit_codes import _big as big
    return big(path)


def _many(path: Path, n: int = 600_000) -> Path:
    """A snapshot of many small calls: stats takes seconds over it."""
    from synth import Synth
    s = Synth(path)
    ctx, mod, f_fill = 0x55550000, 0x55560000, 0x55570002
    s.w.write({"k": "proc", "driver_version": 13000,
               "gpus": [{"index": 0, "name": "cudasnap test double", "uuid": "GPU-0", "cc": [9, 0], "mem": 1 << 36}]})
    s.double_prologue("fill", f_fill, [[0, 8], [8, 4], [12, 4]], ctx, mod)
    for _ in range(n):
        s.call("cuCtxSynchronize", {})
    s.w.write({"k": "end", "exit": 0, "signal": None, "partial": False})
    s.close()
    return path


def signal_commands(w: SimpleNamespace) -> List[tuple]:
    """(name, args, env, when: seconds or a path whose appearance means mid-run)."""
    d = w.dir / "sig"
    crawl = {**w.env, **CRAWL}
    envs = d / "envs.toml"
    drv = f'driver = "{w.lib}"\n'
    envs.write_text("".join(f'[[env]]\nname = "e{i}"\n{drv}vars = {{ CUDA_DOUBLE_SLOW = "*:4000" }}\n' for i in range(3)))
    big, many = d / "big.cusnap", d / "many.cusnap"
    if not big.exists():
        _big(big)
    if not many.exists():
        _many(many)
    return [
        ("replay", ["replay", w.snap], crawl, 3.0),
        ("replay --profile --out", ["replay", w.snap, "--profile", "isolated", "--out", d / "OUT.json"], crawl, 3.0),
        ("extract --check", ["extract", w.snap, "-o", d / "OUT.cusnap", "--kernel", "fill", "--check"],
         {**w.env, "CUDA_DOUBLE_SLOW": "*:4000"}, "OUT.cusnap"),
        ("export", ["export", big, "-o", d / "OUT"], w.env, "OUT/data"),
        ("stats --out", ["stats", many, "--out", d / "OUT.sqlite"], w.env, 1.8),
        ("advise", ["advise", w.snap, "--out", d / "OUT.json"], {**w.env, "CUDA_DOUBLE_SLOW": "*:4000"}, 5.0),
        ("bisect", ["bisect", w.snap, "--envs", envs, "--repeat", "2", "--warmup", "0"], w.env, 4.0),
    ]


def _marked() -> List[int]:
    """Processes still running that a case started (its mark in their environment)."""
    out = []
    for n in os.listdir("/proc"):
        if not n.isdigit():
            continue
        try:
            with open(f"/proc/{n}/environ", "rb") as f:
                if MARK.encode() in f.read():
                    out.append(int(n))
        except OSError:
            continue
    return out


def run_signal_cases(w: SimpleNamespace, sigs=(signal.SIGTERM, signal.SIGHUP, signal.SIGINT),
                     names: Optional[List[str]] = None) -> List[Result]:
    """Each long command, interrupted mid-run by each signal, all at once: exit 128 + the
    signal within a few seconds, one line saying what it left, no temporary file left beside
    its output, no process of its own still running, no /tmp/cudasnap-* directory of its own."""
    (w.dir / "sig").mkdir(exist_ok=True)
    todo = [(s, c) for s in sigs for c in signal_commands(w) if names is None or c[0] in names]
    procs = []
    t0 = time.monotonic()
    for i, (sig, (name, args, env, when)) in enumerate(todo):
        case = w.dir / "sig" / f"c{i}"
        case.mkdir(exist_ok=True)
        tmp = case / "tmp"
        tmp.mkdir(exist_ok=True)
        args = [str(a).replace("/sig/OUT", f"/sig/c{i}/OUT") for a in args]
        e = {**env, MARK: f"{i}", "TMPDIR": str(tmp)}
        e.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
        p = subprocess.Popen(cmd(*args), env=e, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        mid = (case / when) if isinstance(when, str) else None
        procs.append({"i": i, "sig": sig, "name": name, "p": p, "when": when, "mid": mid, "sent": None,
                      "case": case})
    while any(c["sent"] is None for c in procs) and time.monotonic() - t0 < 180:
        for c in procs:
            if c["sent"] is not None:
                continue
            if c.get("ready") is None and _handles_signals(c["p"].pid):
                c["ready"] = time.monotonic()          # its handlers are in: times count from here
            due = c.get("ready") is not None and (
                c["mid"].exists() if c["mid"] is not None else time.monotonic() - c["ready"] >= c["when"])
            if due or c["p"].poll() is not None:
                c["sent"] = time.monotonic() if c["p"].poll() is None else False
                if c["sent"]:
                    c["p"].send_signal(c["sig"])
        time.sleep(0.01)
    ended: Dict[int, float] = {}
    while len(ended) < len(procs) and time.monotonic() - t0 < 240:
        for c in procs:
            if c["i"] not in ended and c["p"].poll() is not None:
                ended[c["i"]] = time.monotonic()
        time.sleep(0.02)
    results = []
    for c in procs:
        p = c["p"]
        try:
            err = p.communicate(timeout=120)[1]
        except subprocess.TimeoutExpired:
            p.kill()
            err = p.communicate()[1]
        took = ended.get(c["i"], time.monotonic()) - c["sent"] if c["sent"] else None
        want = 128 + int(c["sig"])
        problems = []
        if not c["sent"]:
            problems.append(f"ended (exit {p.returncode}) before it was interrupted")
        elif p.returncode != want:
            problems.append(f"exit {p.returncode}, want {want}")
        lines = [ln for ln in err.splitlines() if ln.strip()]
        if c["sent"] and (not lines or not lines[-1].startswith("cudasnap: interrupted")):
            problems.append(f"the last line {lines[-1:]} does not say what it left")
        if "Traceback" in err:
            problems.append("traceback: " + err.strip()[-300:])
        if took is not None and took > 10:
            problems.append(f"took {took:.1f} s to end")
        time.sleep(0.05)
        left = [str(x.relative_to(c["case"])) for x in c["case"].rglob("*")
                if x.name.endswith((".tmp", "-journal", "-wal", "-shm")) or ".tmp." in x.name]
        dirs = [x.name for x in (c["case"] / "tmp").iterdir()]
        alive = [pid for pid in _marked() if _mark_of(pid) == str(c["i"])]
        if left:
            problems.append(f"temporary files left: {left[:3]}")
        if dirs:
            problems.append(f"temporary directories left: {dirs[:3]}")
        if alive:
            problems.append(f"{len(alive)} process(es) still running")
            for pid in alive:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        results.append(Result(f"signal {signal.Signals(c['sig']).name}", c["name"], p.returncode, want, problems,
                              err[-300:], took))
    return results


def _handles_signals(pid: int) -> bool:
    """Whether the process catches SIGHUP yet (its SigCgt mask): cudasnap has started."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for ln in f:
                if ln.startswith("SigCgt:"):
                    return bool(int(ln.split()[1], 16) & (1 << (int(signal.SIGHUP) - 1)))
    except (OSError, ValueError):
        pass
    return False


def _mark_of(pid: int) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for kv in f.read().split(b"\0"):
                if kv.startswith(MARK.encode() + b"="):
                    return kv.split(b"=", 1)[1].decode()
    except OSError:
        return None
    return None


# ------------------------------------------------------------------ two writers at once

def run_concurrent_writers(w: SimpleNamespace, prog: str, captures: int = 3, repairs: int = 10) -> List[Result]:
    """Two captures to one -o, started together: never both "written" to the same file
    (the second gets its own name, or an error). Two in-place repairs of one damaged file:
    the .orig holds the original bytes, one of them refused or finding it repaired."""
    d = w.dir / "writers"
    d.mkdir(exist_ok=True)
    out = []
    for i in range(captures):
        o = d / f"cap{i}.cusnap"
        ps = [subprocess.Popen(cmd("capture", "-o", o, "--ring-mb", "16", "--", prog, "40"), env=w.env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        res = [(p.wait(timeout=120), p.stderr.read()) for p in ps]
        problems = []
        snaps = sorted(x.name for x in d.glob(f"cap{i}*.cusnap"))
        ok = [r for r in res if r[0] == 0]
        if len(ok) == 2 and len(snaps) < 2:
            problems.append(f"both exited 0 but only {snaps} exist")
        if any("Traceback" in e for _, e in res):
            problems.append("traceback")
        from cudasnap.formats import SnapshotReader, SnapshotError
        for s in snaps:
            try:
                with SnapshotReader(d / s) as r:
                    if r.truncated:
                        problems.append(f"{s} is not closed")
            except SnapshotError as e:
                problems.append(f"{s}: {e}")
        out.append(Result("writers capture", f"two captures to one -o #{i}", ok and len(ok), "each its own file",
                          problems, " | ".join(e.strip()[-200:] for _, e in res)))
    original = w.damaged.read_bytes()
    for i in range(repairs):
        f = d / f"rep{i}.cusnap"
        f.write_bytes(original)
        ps = [subprocess.Popen(cmd("repair", f), env=w.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True) for _ in range(2)]
        res = [(p.wait(timeout=120), p.stderr.read()) for p in ps]
        problems = []
        orig = Path(f"{f}.orig")
        if not orig.exists() or orig.read_bytes() != original:
            problems.append(".orig lost the original bytes")
        if not any(c == 0 for c, _ in res):
            problems.append(f"neither repaired it: {res}")
        if any("Traceback" in e or "internal error" in e for _, e in res):
            problems.append("traceback")
        out.append(Result("writers repair", f"two in-place repairs #{i}", [c for c, _ in res], "one repairs",
                          problems, " | ".join(e.strip()[-200:] for _, e in res)))
    return out


def tally(results: List[Result]) -> Dict[str, Dict[str, int]]:
    by: Dict[str, Dict[str, int]] = {}
    for r in results:
        t = by.setdefault(r.cls, {"cases": 0, "failed": 0})
        t["cases"] += 1
        t["failed"] += bool(r.problems)
    return by
