"""The flight recorder on the test double: `cudasnap capture --flight-recorder=S` writes a
snapshot only on a trigger (an error, death by a signal, SIGKILL from outside, SIGUSR2),
starting at a checkpoint; a clean exit writes nothing."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cudasnap.formats import SnapshotReader


def _cmd(out: Path, *prog, period="0.25", extra=()):
    return [sys.executable, "-m", "cudasnap", "capture", "-o", str(out), "--ring-mb", "16",
            f"--flight-recorder={period}", *extra, "--", *prog]


def _replay(double, snap):
    return subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snap)], env=double["env"],
                          capture_output=True, text=True, timeout=120)


def _native(double, *prog):
    return subprocess.run(list(prog), env=double["env"], capture_output=True, text=True, timeout=60)


def _left(tmp_path):
    return sorted(p.name for p in tmp_path.iterdir())


def _checkpointed(snap) -> dict:
    """The snapshot starts at a checkpoint (not the program's start) and restores memory."""
    r = SnapshotReader(snap)
    recs = list(r.records())
    wins = [x for x in recs if x["k"] == "win"]
    assert [w["op"] for w in wins] == ["checkpoint", "state"], wins
    assert wins[1]["bytes"] >= 4096
    assert any(x.get("state") for x in recs if x["k"] == "c")
    assert r.header["window"]["mode"] == "flight"
    return [x for x in recs if x["k"] == "end"][-1]


def test_illegal_address_writes_a_replayable_snapshot(double, tmp_path):
    prog = [double["progs"]["windowed"], "80", "15", "fail", "70"]
    native = _native(double, *prog)
    cp = subprocess.run(_cmd(tmp_path / "f.cusnap", *prog), env=double["env"], capture_output=True, text=True,
                        timeout=120)
    assert cp.returncode == native.returncode == 1
    assert cp.stdout == native.stdout
    assert _left(tmp_path) == ["f.cusnap"], cp.stderr          # the other checkpoint is gone
    end = _checkpointed(tmp_path / "f.cusnap")
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in end["trigger"]["why"]
    assert "flight recorder: call #" in cp.stderr
    rp = _replay(double, tmp_path / "f.cusnap")
    assert rp.returncode == 0, rp.stdout + rp.stderr
    assert re.search(r"recorded error CUDA_ERROR_ILLEGAL_ADDRESS recurred \(in kernel add_one", rp.stdout), rp.stdout
    assert "0 fell back" in rp.stdout
    # after a sticky error the device memory is not trustworthy: no end state is compared
    assert "end state: none recorded: the trigger (call #" in rp.stdout and "sticky error state" in rp.stdout
    # the 9 MiB buffer that never changes crossed the ring once: later states refer to it
    st = [w for w in SnapshotReader(tmp_path / "f.cusnap").records() if w["k"] == "win" and w["op"] == "state"][0]
    if end["trigger"]["checkpoint"] >= 2:
        assert st["referenced"] >= 9 << 20 and st["copied"] < 1 << 20, st


@pytest.mark.parametrize("action,sig", [("segv", signal.SIGSEGV), ("abort", signal.SIGABRT)])
def test_death_by_signal(double, tmp_path, action, sig):
    prog = [double["progs"]["windowed"], "60", "15", action, "50"]
    cp = subprocess.run(_cmd(tmp_path / "f.cusnap", *prog), env=double["env"], capture_output=True, text=True,
                        timeout=120)
    assert cp.returncode == -sig
    assert _left(tmp_path) == ["f.cusnap"], cp.stderr
    end = _checkpointed(tmp_path / "f.cusnap")
    assert end["signal"] == sig and signal.Signals(sig).name in end["trigger"]["why"]
    rp = _replay(double, tmp_path / "f.cusnap")
    assert rp.returncode == 0, rp.stdout + rp.stderr
    assert "end state: none recorded: the flight recorder does not read device memory at a trigger" in rp.stdout


def test_sigkill_from_outside(double, tmp_path):
    """The ring in shared memory outlives the program: the recorder still writes it."""
    p = subprocess.Popen(_cmd(tmp_path / "f.cusnap", double["progs"]["windowed"], "100000", "10"),
                         env=double["env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stdout:
        if line.strip() == "STEP 60":
            kids = Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()
            assert len(kids) == 1
            os.kill(int(kids[0]), signal.SIGKILL)
            break
    p.stdout.read()
    err = p.stderr.read()
    assert p.wait(timeout=120) == -signal.SIGKILL
    assert _left(tmp_path) == ["f.cusnap"], err
    end = _checkpointed(tmp_path / "f.cusnap")
    assert end["signal"] == signal.SIGKILL
    rp = _replay(double, tmp_path / "f.cusnap")
    assert rp.returncode == 0, rp.stdout + rp.stderr


def test_sigusr2_writes_now(double, tmp_path):
    p = subprocess.Popen(_cmd(tmp_path / "f.cusnap", double["progs"]["windowed"], "70", "15"),
                         env=double["env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = []
    for line in p.stdout:
        out.append(line)
        if line.strip() == "STEP 40":
            p.send_signal(signal.SIGUSR2)
    err = p.stderr.read()
    assert p.wait(timeout=120) == 0, err
    assert "".join(out) == _native(double, double["progs"]["windowed"], "70", "15").stdout   # not forwarded
    assert _left(tmp_path) == ["f.cusnap"], err
    end = _checkpointed(tmp_path / "f.cusnap")
    assert "SIGUSR2" in end["trigger"]["why"]
    assert _replay(double, tmp_path / "f.cusnap").returncode == 0


def test_clean_exit_writes_nothing(double, tmp_path):
    prog = [double["progs"]["windowed"], "40", "10"]
    cp = subprocess.run(_cmd(tmp_path / "f.cusnap", *prog), env=double["env"], capture_output=True, text=True,
                        timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout == _native(double, *prog).stdout
    assert _left(tmp_path) == []
    assert "flight recorder: no trigger, nothing written" in cp.stderr


def test_any_trigger_and_bad_options(double, tmp_path):
    bad = subprocess.run([sys.executable, "-m", "cudasnap", "capture", "--flight-recorder", "--window", "signal",
                          "--", double["progs"]["windowed"], "1"], env=double["env"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    # bare --flight-recorder means 60 s: one segment from the start, still written on the error
    prog = [double["progs"]["windowed"], "5", "0", "fail", "3"]
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "capture", "-o", str(tmp_path / "f.cusnap"),
                         "--ring-mb", "16", "--flight-recorder", "--trigger", "any", "--", *prog],
                        env=double["env"], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 1
    r = SnapshotReader(tmp_path / "f.cusnap")
    assert r.header["window"]["period"] == 60
    assert _replay(double, tmp_path / "f.cusnap").returncode == 0


def test_hang_timeout(double, tmp_path):
    """A launch that does not return for --hang-timeout: the snapshot is written while the
    program still hangs (killme -1 spins a minute inside cuLaunchKernel)."""
    out = tmp_path / "h.cusnap"
    p = subprocess.Popen(_cmd(out, double["progs"]["killme"], "-1", period="10", extra=("--hang-timeout", "1")),
                         env=double["env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while not out.exists() and time.monotonic() - t0 < 30:
        time.sleep(0.1)
    assert out.exists()
    kids = Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()
    os.kill(int(kids[0]), signal.SIGKILL)
    _o, err = p.communicate(timeout=60)
    assert "hang: call #" in err and "cuLaunchKernel did not return" in err
    end = [r for r in SnapshotReader(out).records() if r["k"] == "end"][-1]
    assert "hang" in end["trigger"]["why"]
    rp = _replay(double, out)
    assert rp.returncode == 0 and "never returned" in rp.stdout, rp.stdout


@pytest.mark.parametrize("spare", ["on", "off"])
def test_small_ring_big_working_set_loses_nothing(double, tmp_path, spare):
    """A 1 MiB ring and ~35 MiB of live memory (a 24 MiB buffer, 1 MiB of it rewritten each
    step): 4 MiB chunks go through the ring in parts, state dumps wait for ring space, every
    checkpoint is complete and the snapshot replays with its read-backs verified. With spare
    device memory the program waits only for the device copies and the state drains while it
    runs (its calls meanwhile follow the state in the snapshot); without, it waits for all."""
    prog = [double["progs"]["windowed"], "90", "12", "fail", "80", "24"]
    native = _native(double, *prog)
    cmd = [sys.executable, "-m", "cudasnap", "capture", "-o", str(tmp_path / "f.cusnap"), "--ring-mb", "1",
           "--flight-recorder=0.2", "--", *prog]
    env = dict(double["env"], CUDASNAP_WIN_SPARE="" if spare == "on" else "off")
    cp = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert cp.returncode == native.returncode == 1, cp.stderr
    assert cp.stdout == native.stdout
    assert "dropped" not in cp.stderr and "missing" not in cp.stderr and "partial" not in cp.stderr, cp.stderr
    dumps = re.findall(r"checkpoint \d+: state ([\d.]+) GiB, program paused ([\d.]+) ms .*complete after ([\d.]+) ms"
                       r"(.*spare device memory)?", cp.stderr)
    assert len(dumps) >= 2 and all(float(g) >= 0.03 for g, *_ in dumps), cp.stderr
    assert all(bool(sp) == (spare == "on") for *_, sp in dumps), cp.stderr
    if spare == "on":    # the drain ends after the pause
        assert sum(float(done) for _g, _p, done, _s in dumps) > sum(float(p) for _g, p, _d, _s in dumps), cp.stderr
    end = _checkpointed(tmp_path / "f.cusnap")
    assert not end.get("partial") and not end.get("dropped"), end
    st = [w for w in SnapshotReader(tmp_path / "f.cusnap").records() if w["k"] == "win" and w["op"] == "state"][0]
    assert st["bytes"] >= (24 + 9) << 20, st
    rp = _replay(double, tmp_path / "f.cusnap")
    assert rp.returncode == 0, rp.stdout + rp.stderr
    assert "0 fell back" in rp.stdout and "CUDA_ERROR_ILLEGAL_ADDRESS recurred" in rp.stdout, rp.stdout
    assert re.search(r"D2H verified\s+[1-9]", rp.stdout) and re.search(r"mismatches\s+0", rp.stdout), rp.stdout


def test_exit_without_handlers_writes(double, tmp_path):
    """A program that ends through _exit (status 0, exit handlers skipped) is not a clean end:
    the recorder writes what it kept, as for a death by a signal."""
    prog = [double["progs"]["windowed"], "60", "15", "_exit", "50"]
    cp = subprocess.run(_cmd(tmp_path / "f.cusnap", *prog), env=double["env"], capture_output=True, text=True,
                        timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout == _native(double, *prog).stdout
    assert _left(tmp_path) == ["f.cusnap"], cp.stderr
    end = _checkpointed(tmp_path / "f.cusnap")
    assert end["exit"] == 0 and "without running its exit handlers" in end["trigger"]["why"], end
    rp = _replay(double, tmp_path / "f.cusnap")
    assert rp.returncode == 0, rp.stdout + rp.stderr
