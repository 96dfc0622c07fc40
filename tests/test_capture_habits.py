"""Capture as nsys users expect it: -o's %-sequences, no silent overwrite, signals forwarded
to the program, the display driver in the header; and the Python API (cudasnap.capture.run)."""
from __future__ import annotations

import os
import pty
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from cudasnap.formats import SnapshotReader


def _cmd(*args: str) -> list:
    return [sys.executable, "-m", "cudasnap", "capture", "--ring-mb", "16", *args]


# ------------------------------------------------------------------ -o expansion

def test_expand_output_sequences():
    from cudasnap.capture.runner import expand_output, uses_pid

    env = {"JOB": "j42", "EMPTY": ""}
    assert expand_output("run.%p.cusnap", pid=77, env=env) == "run.77.cusnap"
    assert expand_output("%h-%q{JOB}-%p%%.cusnap", pid=5, env=env, host="node1") == "node1-j42-5%.cusnap"
    assert expand_output("a%q{EMPTY}b", env=env) == "ab"
    assert expand_output("r.%p.cusnap", env=env) == "r.%p.cusnap"           # pid not known yet
    assert uses_pid("x.%p") and not uses_pid("x.%%p") and not uses_pid("x")
    assert expand_output("x.%%p", pid=1, env=env) == "x.%p"
    for bad, why in (("a%x", "%x is not known"), ("a%", "trailing %"), ("%q{NOPE}", "NOPE is not set"),
                     ("%qX", "%q needs"), ("%q{}", "names no")):
        with pytest.raises(ValueError, match=why):
            expand_output(bad, pid=1, env=env)


def test_percent_p_names_the_snapshot_after_the_program(double, tmp_path):
    """%p is the program's pid (the header's), a child's snapshot is STEM.PID.cusnap beside it;
    %h and %q{VAR} expand too."""
    env = dict(double["env"], CUDASNAP_TEST_TAG="tagged")
    cp = subprocess.run(_cmd("-o", str(tmp_path / "run-%h-%q{CUDASNAP_TEST_TAG}.%p.cusnap"), "--",
                             double["progs"]["child"]), env=env, capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    host = socket.gethostname()
    snaps = sorted(tmp_path.glob("*.cusnap"))
    assert len(snaps) == 2, snaps
    by_pid = {SnapshotReader(s).header["pid"]: s for s in snaps}
    roots = [s for pid, s in by_pid.items() if s.name == f"run-{host}-tagged.{pid}.cusnap"]
    assert len(roots) == 1, snaps
    root_pid = SnapshotReader(roots[0]).header["pid"]
    (child,) = [s for s in snaps if s != roots[0]]
    child_pid = SnapshotReader(child).header["pid"]
    assert child.name == f"run-{host}-tagged.{root_pid}.{child_pid}.cusnap"
    assert SnapshotReader(child).header["ppid"] == root_pid


def test_bad_output_template_is_refused_before_the_program_runs(tmp_path):
    marker = tmp_path / "ran"
    cp = subprocess.run(_cmd("-o", str(tmp_path / "x%z.cusnap"), "--", "touch", str(marker)),
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 2 and not marker.exists()
    assert cp.stderr.strip().splitlines() == [cp.stderr.strip()] and "%z is not known" in cp.stderr


# ------------------------------------------------------------------ overwriting

def test_existing_snapshot_is_refused_unless_forced(double, tmp_path):
    out = tmp_path / "direct.cusnap"
    out.write_bytes(b"precious")
    marker = tmp_path / "ran"
    cp = subprocess.run(_cmd("-o", str(out), "--", "touch", str(marker)), env=double["env"],
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 2, cp.stderr
    assert not marker.exists()                                   # refused before the program started
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cudasnap: error: ") and "exists" in lines[0]
    assert "--force-overwrite" in lines[0]
    assert out.read_bytes() == b"precious"

    for flag in ("-f", "--force-overwrite"):
        cp = subprocess.run(_cmd(flag, "-o", str(out), "--", double["progs"]["direct"], "2"), env=double["env"],
                            capture_output=True, text=True, timeout=120)
        assert cp.returncode == 0, cp.stderr
        with SnapshotReader(out) as r:
            assert not r.truncated and r.header["options"]["command"] == [double["progs"]["direct"], "2"]


def test_existing_file_named_by_percent_p_is_refused_before_the_program_runs(tmp_path, monkeypatch):
    """With %p the name is known once the pid is: still before the program runs."""
    from cudasnap.capture import runner

    real = runner._spawn_gated
    seen = {}

    def spawn(command, env, mask):
        pid, gate = real(command, env, mask)
        (tmp_path / f"x.{pid}.cusnap").write_text("old")        # the name the program will get
        seen["pid"] = pid
        return pid, gate

    monkeypatch.setattr(runner, "_spawn_gated", spawn)
    marker = tmp_path / "ran"
    res = runner.capture(["touch", str(marker)], tmp_path / "x.%p.cusnap", ring_mb=1)
    assert res.exit_code == 2 and "exists" in res.error, res
    assert not marker.exists()
    assert (tmp_path / f"x.{seen['pid']}.cusnap").read_text() == "old"


def test_devices_and_fifos_are_not_refused(tmp_path):
    from cudasnap.capture.runner import output_problem

    assert output_problem(Path("/dev/null")) is None
    f = tmp_path / "f.cusnap"
    f.write_text("")
    assert "exists" in output_problem(f) and output_problem(f, force=True) is None


# ------------------------------------------------------------------ signals

def _default_signals():
    # cudasnap leaves alone what its parent ignores (nohup's SIGHUP): the tests start it with
    # every forwarded signal at its default, whatever the test run itself inherited
    from cudasnap.capture.runner import FORWARDED_SIGNALS
    for s in FORWARDED_SIGNALS:
        signal.signal(s, signal.SIG_DFL)


def _start(double, out: Path, *extra_env):
    p = subprocess.Popen(_cmd("-o", str(out), "--", double["progs"]["sigwait"]), env=double["env"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_signals)
    assert p.stdout.readline().strip() == "READY"
    return p


def _expect(p, line: str) -> None:
    got = p.stdout.readline().strip()
    assert got == line, (got, line)


def test_sigterm_to_cudasnap_reaches_the_program(double, tmp_path):
    """SIGTERM sent to cudasnap is forwarded: the program's handler runs, it makes one more
    launch and exits 0; capture exits 0 with every call recorded."""
    out = tmp_path / "sig.cusnap"
    p = _start(double, out)
    os.kill(p.pid, signal.SIGUSR1)
    _expect(p, f"GOT {int(signal.SIGUSR1)}")
    os.kill(p.pid, signal.SIGHUP)
    _expect(p, f"GOT {int(signal.SIGHUP)}")
    os.kill(p.pid, signal.SIGTERM)
    _expect(p, f"GOT {int(signal.SIGTERM)}")
    _expect(p, "LAUNCHES 2")
    rest, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "GOT" not in rest                      # each signal arrived once
    with SnapshotReader(out) as r:
        launches = [c for c in r.records("c") if c["f"] == "cuLaunchKernel"]
        assert len(launches) == 2 and not r.truncated


def test_program_killed_by_forwarded_signal_kills_cudasnap_alike(double, tmp_path):
    """killme has no handler: SIGINT sent to cudasnap ends it, cudasnap dies of SIGINT after
    closing the snapshot."""
    out = tmp_path / "k.cusnap"
    p = subprocess.Popen(_cmd("-o", str(out), "--", double["progs"]["killme"]), env=double["env"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_signals)
    assert p.stdout.readline().startswith("READY")
    time.sleep(0.2)
    os.kill(p.pid, signal.SIGINT)
    p.communicate(timeout=60)
    assert p.returncode == -signal.SIGINT
    with SnapshotReader(out) as r:
        assert not r.truncated
        end = next(iter(r.records("end")))
        assert end["signal"] == signal.SIGINT


def test_terminal_interrupt_reaches_the_program_once(double, tmp_path):
    """^C at a terminal: the kernel signals the whole foreground group, so cudasnap does not
    forward its own copy; the program sees one SIGINT and the capture completes."""
    out = tmp_path / "tty.cusnap"
    try:
        pid, fd = pty.fork()
    except OSError as e:                           # pragma: no cover - no pseudo-terminals here
        pytest.skip(f"no pseudo-terminal: {e}")
    if pid == 0:                                   # pragma: no cover - the child execs at once
        try:
            os.execve(sys.executable, _cmd("-o", str(out), "--", double["progs"]["sigwait"]), double["env"])
        finally:
            os._exit(127)
    buf = b""

    def until(token: bytes, timeout: float = 60) -> bool:
        nonlocal buf
        end = time.monotonic() + timeout
        while token not in buf and time.monotonic() < end:
            if select.select([fd], [], [], 0.1)[0]:
                try:
                    buf += os.read(fd, 4096)
                except OSError:
                    break
        return token in buf

    try:
        assert until(b"READY"), buf
        os.write(fd, b"\x03")
        assert until(b"GOT 2"), buf
        time.sleep(0.5)
        os.kill(pid, signal.SIGTERM)
        assert until(b"LAUNCHES 2"), buf
        until(b"\x00", timeout=2)                  # the rest of the output
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0, buf
    assert buf.count(b"GOT 2") == 1, buf
    with SnapshotReader(out) as r:
        assert not r.truncated


def _info(signo, code, sender):
    return SimpleNamespace(si_signo=signo, si_code=code, si_pid=sender)


def test_forwarder_sends_each_signal_once(monkeypatch):
    """The forwarding rules, one by one: a signal sent to cudasnap goes to the program; one the
    kernel sent to the whole group (a terminal's) does not (the program got it); nor one the
    program sent; after the program ended nothing is sent."""
    from cudasnap.capture import runner

    child = subprocess.Popen(["sleep", "30"])
    sent = []
    monkeypatch.setattr(runner.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    fwd = runner._Forwarder(False)
    try:
        fwd.pid = child.pid
        fwd._handle(_info(signal.SIGTERM, 0, 4242))                       # kill(cudasnap)
        fwd._handle(_info(signal.SIGINT, runner._SI_KERNEL, 0))             # ^C to the group
        fwd._handle(_info(signal.SIGUSR1, 0, child.pid))                   # from the program
        assert sent == [(child.pid, signal.SIGTERM)]
        monkeypatch.setattr(runner._Forwarder, "_same_group", staticmethod(lambda pid: False))
        fwd._handle(_info(signal.SIGINT, runner._SI_KERNEL, 0))             # program left the group
        assert sent[-1] == (child.pid, signal.SIGINT)
        fwd.program_ended()
        fwd._handle(_info(signal.SIGUSR2, 0, 4242))
        assert len(sent) == 2
    finally:
        monkeypatch.undo()
        fwd.close()
        child.kill()
        child.wait()


def test_ignored_signals_are_not_forwarded(double, tmp_path):
    """nohup: a SIGHUP cudasnap ignores is not forwarded (the program inherits the ignoring)."""
    out = tmp_path / "nohup.cusnap"
    p = subprocess.Popen(["nohup", *_cmd("-o", str(out), "--", double["progs"]["sigwait"])], env=double["env"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "READY"
    os.kill(p.pid, signal.SIGHUP)
    time.sleep(0.3)
    os.kill(p.pid, signal.SIGTERM)
    rest, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert rest.splitlines() == [f"GOT {int(signal.SIGTERM)}", "LAUNCHES 2"], rest


# ------------------------------------------------------------------ display driver

def test_display_driver_version_from_proc(tmp_path):
    from cudasnap.capture.runner import _proc_driver_version

    closed = tmp_path / "closed"
    closed.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Thu Nov  6 05:51:24 UTC 2025\n"
                      "GCC version:  gcc version 12.2.0\n")
    opened = tmp_path / "open"
    opened.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  575.57.08  Release Build  "
                      "(dvs-builder@U16-I3-B12-2-1)  Sat May 24 10:31:56 UTC 2025\n")
    assert _proc_driver_version(str(closed)) == "580.159.04"
    assert _proc_driver_version(str(opened)) == "575.57.08"
    assert _proc_driver_version(str(tmp_path / "none")) is None


def test_info_shows_display_and_cuda_driver(double, capture, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from cudasnap.capture import runner
    from cudasnap.cli import app

    cp, snap = capture(double["progs"]["direct"], "1")
    assert cp.returncode == 0, cp.stderr
    expected = runner.display_driver_version()           # None on a machine without NVIDIA's driver
    with SnapshotReader(snap) as r:
        assert r.header["options"].get("display_driver") == expected
    res = CliRunner().invoke(app, ["info", str(snap)])
    assert res.exit_code == 0
    assert f"driver   : {expected or '-'} (CUDA 13.0)" in res.output

    monkeypatch.setattr(runner, "display_driver_version", lambda: "580.159.04")
    monkeypatch.setenv("LD_LIBRARY_PATH", double["env"]["LD_LIBRARY_PATH"])
    res2 = runner.capture([double["progs"]["direct"], "1"], tmp_path / "dd.cusnap", ring_mb=16)
    assert res2.ok, res2
    res = CliRunner().invoke(app, ["info", str(res2.snapshot)])
    assert "driver   : 580.159.04 (CUDA 13.0)" in res.output
    res = CliRunner().invoke(app, ["info", "--json", str(res2.snapshot)])
    assert '"display_driver": "580.159.04"' in res.output


# ------------------------------------------------------------------ Python API

def test_python_api_capture_run(double, tmp_path, monkeypatch):
    import cudasnap

    monkeypatch.setenv("LD_LIBRARY_PATH", double["env"]["LD_LIBRARY_PATH"])
    res = cudasnap.capture.run([double["progs"]["child"]], out=tmp_path / "api.%p.cusnap", ring_mb=16)
    assert res.exit_code == 0 and res.returncode == 0 and res.error is None, res
    assert len(res.snapshots) == 2 and res.snapshot == res.snapshots[0]
    assert res.snapshot.name.startswith("api.") and res.snapshot.exists()
    with cudasnap.SnapshotReader(res.snapshot) as r:
        assert res.snapshot.name == f"api.{r.header['pid']}.cusnap"

    again = cudasnap.capture.run([double["progs"]["direct"], "1"], out=res.snapshot)
    assert again.exit_code == 2 and "exists" in again.error and again.snapshots == []
    missing = cudasnap.capture.run(["/no/such/program"], out=tmp_path / "m.cusnap")
    assert missing.exit_code == 127 and missing.returncode is None

    failed = cudasnap.capture.run([double["progs"]["nocuda"]], out=tmp_path / "n.cusnap")
    assert failed.exit_code == 3 and failed.returncode == 3 and failed.snapshot is None


def test_import_cudasnap_is_light():
    """`import cudasnap` loads no part and no cuda-python; names come on first use."""
    code = ("import sys, cudasnap; assert 'cudasnap.formats' not in sys.modules; "
            "assert not any(m.startswith('cuda.') or m == 'cuda' for m in sys.modules); "
            "assert cudasnap.SnapshotReader.__name__ == 'SnapshotReader'; "
            "assert callable(cudasnap.capture.run) and callable(cudasnap.replay.replay); "
            "assert cudasnap.CaptureResult.__name__ == 'CaptureResult'; "
            "assert not any(m.startswith('cuda.') for m in sys.modules); print('ok')")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert cp.returncode == 0 and cp.stdout.strip() == "ok", cp.stderr


def test_package_is_typed():
    import cudasnap

    assert (Path(cudasnap.__file__).parent / "py.typed").is_file()
