"""The exit-code rule that pipes and signals cannot bend, on the CUDA test double.

Closed stdout: every command with a verdict runs with its stdout a pipe whose reader is gone
(EPIPE at the first write, as `cmd | head -c1` once head has left) and keeps the exit code it
has with a reader. SIGINT: every long command, interrupted mid-run, exits 130 with one line
saying what it left, and leaves no half-written output. All subprocesses of a class start
together, so the module takes the time of its slowest case."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from cudasnap.formats import SnapshotReader
from synth import Synth
from double.fixtures import VIRTUAL_CLOCK as VIRTUAL
from test_compare import three_kernels

STEADY = {"CUDA_DOUBLE_SLOW": "*:1", "CUDA_DOUBLE_SLOW_FLOOR_US": "2000", **VIRTUAL}
SLOW_FILL = {"CUDA_DOUBLE_SLOW": "*:1,fill:3", "CUDA_DOUBLE_SLOW_FLOOR_US": "2000", **VIRTUAL}
CRAWL = {"CUDA_DOUBLE_SLOW": "*:4000"}          # 2 s a kernel: a command still running when interrupted


def _cmd(*args) -> list:
    return [sys.executable, "-m", "cudasnap", *map(str, args)]


def _env(double, extra=None) -> dict:
    e = dict(double["env"])
    e.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    e.update(extra or {})
    return e


def _default_sigint():
    signal.signal(signal.SIGINT, signal.SIG_DFL)     # whatever the test run inherited


def _closed_stdout(cases):
    """Starts every case with stdout a pipe no one reads; returns [(name, want, rc, stderr)]."""
    procs = []
    for name, args, env, want in cases:
        r, w = os.pipe()
        os.close(r)                                  # the reader is gone: the first write is EPIPE
        p = subprocess.Popen(_cmd(*args), env=env, stdout=w, stderr=subprocess.PIPE, text=True)
        os.close(w)
        procs.append((name, want, p))
    out = []
    for name, want, p in procs:
        err = p.communicate(timeout=300)[1]
        out.append((name, want, p.returncode, err))
    return out


def _store(path: Path, status: str, verdict: str, cell_status: str = "ok") -> Path:
    """A campaign store with one run of one cell (no Ray needed to read it)."""
    from cudasnap.campaign.store import Store
    st = Store(path)
    camp = SimpleNamespace(name="ci", path="/c.toml", file_hash="h" * 32, baseline="a",
                           rules=SimpleNamespace(__dict__={}))
    run, _ = st.open_run(camp, "0", None, True)
    row = {"cell_key": "k", "snapshot": "/s.cusnap", "snapshot_digest": "d", "snapshot_id": None, "kernels": None,
           "mode": "isolated", "env": "b", "env_json": "{}", "is_baseline": 0, "baseline_cell_id": None,
           "gpu_req": None, "gpu_model": None, "device_uuid": None, "driver_version": None, "libcuda": None,
           "host": "h", "status": cell_status, "verdict": verdict, "regressed": int(verdict == "SLOWER"),
           "exit_code": 0, "attempts": 1, "reruns": 0, "confirmed": None, "wall_s": 1.0, "replay_s": 1.0,
           "error": "set aside: nothing to time" if cell_status == "n/a" else None, "finished": "2026-01-01T00:00:00Z"}
    st.add_cell(run, row, [], None)
    if status != "running":
        st.close_run(run, status, [], 0)
    st.close()
    return path


@pytest.fixture(scope="module")
def work(double, tmp_path_factory):
    d = tmp_path_factory.mktemp("exitcodes")
    snap = three_kernels(d / "three.cusnap")
    profs = {}
    ps = {n: subprocess.Popen(_cmd("replay", snap, "--profile", "isolated", "--repeat", "5", "--warmup", "1",
                                   "--out", d / f"{n}.json", "-q"), env=_env(double, v),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
          for n, v in (("a", STEADY), ("slow", SLOW_FILL))}
    for n, p in ps.items():
        assert p.wait(timeout=300) == 0, p.stderr.read()
        profs[n] = d / f"{n}.json"
    damaged = d / "damaged.cusnap"
    data = bytearray(snap.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 64] = b"\xff" * 64
    damaged.write_bytes(bytes(data))
    lib = Path(double["libdir"]) / "libcuda.so.1"
    envs = d / "envs.toml"
    envs.write_text("".join(f'[[env]]\nname = "e{i}"\ndriver = "{lib}"\nvars = {{ '
                            + ", ".join(f'{k} = "{x}"' for k, x in (SLOW_FILL if i >= 1 else STEADY).items()) + " }\n"
                            for i in range(3)))
    return SimpleNamespace(dir=d, snap=snap, damaged=damaged, envs=envs, **profs)


def test_a_closed_stdout_keeps_the_verdict(double, work, record_property):
    d = work.dir
    e = _env(double)
    cases = [
        ("compare regression", ["compare", work.a, work.slow, "--threshold", "15"], e, 1),
        ("compare regression --json", ["compare", work.a, work.slow, "--threshold", "15", "--json"], e, 1),
        ("compare same", ["compare", work.a, work.a], e, 0),
        ("replay mismatch", ["replay", work.snap], _env(double, {"CUDA_DOUBLE_CORRUPT": "fill:3"}), 1),
        ("replay mismatch --json", ["replay", work.snap, "--json"], _env(double, {"CUDA_DOUBLE_CORRUPT": "fill:3"}), 1),
        ("replay ok", ["replay", work.snap], e, 0),
        ("replay ok --json", ["replay", work.snap, "--json"], e, 0),
        ("bisect regression", ["bisect", work.snap, "--envs", work.envs, "--repeat", "5", "--warmup", "1",
                               "--threshold", "15"], e, 1),
        ("info damaged", ["info", work.damaged], e, 2),
        ("info", ["info", work.snap], e, 0),
        ("dump", ["dump", work.snap], e, 0),
        ("stats", ["stats", work.snap], e, 0),
        ("api", ["api"], e, 0),
        ("export", ["export", work.snap, "-o", d / "exp"], e, 0),
        ("campaign report regression", ["campaign", "report", _store(d / "reg.sqlite", "done", "SLOWER")], e, 1),
        ("campaign report infra", ["campaign", "report", _store(d / "infra.sqlite", "done", "INFRA", "infra")], e, 2),
        ("campaign report interrupted", ["campaign", "report", _store(d / "int.sqlite", "interrupted", "SAME")], e, 2),
        ("campaign report left running", ["campaign", "report", _store(d / "run.sqlite", "running", "SAME")], e, 2),
        ("campaign report set aside", ["campaign", "report", _store(d / "na.sqlite", "done", "N/A", "n/a")], e, 0),
        ("campaign report not a store", ["campaign", "report", work.a], e, 2),
    ]
    wrong, tracebacks, problems = 0, 0, []
    for name, want, rc, err in _closed_stdout(cases):
        if rc != want:
            wrong += 1
            problems.append(f"{name}: exit {rc}, want {want}: {err.strip()[-300:]}")
        if "Traceback" in err or "Exception ignored" in err or "BrokenPipe" in err:
            tracebacks += 1
            problems.append(f"{name}: {err.strip()[-300:]}")
    record_property("ci_summary", f"exit codes: {len(cases)} closed-stdout cases, {wrong} wrong exit codes, "
                                  f"{tracebacks} tracebacks")
    assert not problems, "\n".join(problems)
    # the same verdicts with a reader, and the report says why it is not green
    cp = subprocess.run(_cmd("campaign", "report", d / "int.sqlite"), env=e, capture_output=True, text=True)
    assert cp.returncode == 2 and "interrupted before every cell was done" in cp.stdout
    assert "no regression in the cells done" in cp.stdout
    cp = subprocess.run(_cmd("campaign", "report", d / "na.sqlite"), env=e, capture_output=True, text=True)
    assert cp.returncode == 0 and "s.cusnap: set aside: nothing to time" in cp.stdout and "N/A" in cp.stdout


def _big(path: Path) -> Path:
    """A snapshot whose export writes ~150 MB of payload files: still exporting when interrupted."""
    s = Synth(path)
    ctx, mod, f_fill = 0x55550000, 0x55560000, 0x55570002
    s.w.write({"k": "proc", "driver_version": 13000,
               "gpus": [{"index": 0, "name": "cudasnap test double", "uuid": "GPU-0", "cc": [9, 0], "mem": 1 << 36}]})
    s.double_prologue("fill", f_fill, [[0, 8], [8, 4], [12, 4]], ctx, mod)
    n = 1 << 20
    p = 0x200000000000
    s.call("cuMemAlloc_v2", {"dptr": p, "bytesize": n})
    for i in range(150):
        s.call("cuMemcpyHtoD_v2", {"dstDevice": p, "srcHost": 0x7F0000100000, "ByteCount": n},
               x={"srcHost": s.blob(os.urandom(n))})
    s.launch(f_fill, (p).to_bytes(8, "little") + (7).to_bytes(4, "little") + (n // 4).to_bytes(4, "little"), block=64)
    s.call("cuCtxSynchronize", {})
    s.call("cuMemFree_v2", {"dptr": p})
    s.call("cuDevicePrimaryCtxRelease_v2", {"dev": 0})
    s.w.write({"k": "end", "exit": 0, "signal": None, "partial": False})
    s.close()
    return path


def test_sigint_is_130_and_says_what_it_left(double, work, tmp_path, record_property):
    d = tmp_path
    crawl = _env(double, CRAWL)
    lib = Path(double["libdir"]) / "libcuda.so.1"
    slow_envs = d / "envs.toml"
    slow_envs.write_text("".join(f'[[env]]\nname = "e{i}"\ndriver = "{lib}"\nvars = {{ CUDA_DOUBLE_SLOW = "*:4000" }}\n'
                                 for i in range(3)))
    big = _big(d / "big.cusnap")
    # name, args, env, when (seconds, or a path whose appearance means "mid-run"), what the line says
    cases = [
        ("replay", ["replay", work.snap], crawl, 6.0, "no output was written"),
        ("replay --profile --out", ["replay", work.snap, "--profile", "isolated", "--out", d / "p.json"], crawl, 6.0,
         "no output was written"),
        ("extract --check", ["extract", work.snap, "-o", d / "ex.cusnap", "--kernel", "fill", "--check"], crawl,
         d / "ex.cusnap", "ex.cusnap was written whole, but its --check did not finish"),
        ("export", ["export", big, "-o", d / "exp"], double["env"], d / "exp" / "data", "no output was written"),
        ("advise", ["advise", work.snap, "--out", d / "adv.json"], crawl, 8.0, "no output was written"),
        ("bisect", ["bisect", work.snap, "--envs", slow_envs, "--keep", d / "keep", "--repeat", "2", "--warmup", "0"],
         double["env"], 6.0, "profiles kept in"),
    ]
    procs = []
    t0 = time.monotonic()
    for name, args, env, when, says in cases:
        p = subprocess.Popen(_cmd(*args), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             preexec_fn=_default_sigint)
        procs.append([name, p, when, says, None])
    while any(c[4] is None for c in procs) and time.monotonic() - t0 < 90:
        for c in procs:
            name, p, when, says, sent = c
            if sent is None and (time.monotonic() - t0 >= when if isinstance(when, float) else Path(when).exists()):
                c[4] = p.poll() is None             # False: it ended before it could be interrupted
                if c[4]:
                    p.send_signal(signal.SIGINT)
        time.sleep(0.01)
    # capture: the program's own fate passes through (killme dies of SIGINT, so does cudasnap: 130 in a shell)
    out = d / "k.cusnap"
    cap = subprocess.Popen(_cmd("capture", "-o", out, "--", double["progs"]["killme"]), env=double["env"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)
    assert cap.stdout.readline().startswith("READY")
    time.sleep(0.2)
    cap.send_signal(signal.SIGINT)
    problems, tracebacks = [], 0
    for name, p, when, says, sent in procs:
        err = p.communicate(timeout=120)[1]
        lines = [ln for ln in err.splitlines() if ln.strip()]
        if not sent:
            problems.append(f"{name}: ended (exit {p.returncode}) before it was interrupted")
        elif p.returncode != 130:
            problems.append(f"{name}: exit {p.returncode}, want 130: {err.strip()[-300:]}")
        elif not lines or not lines[-1].startswith("cudasnap: interrupted: ") or says not in lines[-1]:
            problems.append(f"{name}: the last line {lines[-1:]} does not say {says!r}")
        if "Traceback" in err:
            tracebacks += 1
            problems.append(f"{name}: {err.strip()[-300:]}")
    cap.communicate(timeout=60)
    if cap.returncode != -signal.SIGINT:
        problems.append(f"capture: exit {cap.returncode}, want death by SIGINT")
    record_property("ci_summary", f"exit codes: {len(cases) + 1} SIGINT cases, {len(problems)} wrong exit codes or "
                                  f"lines, {tracebacks} tracebacks")
    assert not problems, "\n".join(problems)
    # what they left: no half-written file, no temporary; the extract whole and readable
    assert not (d / "p.json").exists() and not (d / "adv.json").exists() and not (d / "exp").exists()
    assert not [f for f in os.listdir(d) if f.endswith(".tmp")]
    with SnapshotReader(d / "ex.cusnap") as r:
        assert not r.truncated
    with SnapshotReader(out) as r:
        assert not r.truncated and next(iter(r.records("end")))["signal"] == signal.SIGINT
    assert (d / "keep").is_dir()
