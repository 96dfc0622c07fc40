"""The README's Ray cluster recipe followed as written, on this machine only: a token, a head
started by `ray start --head` with two fake GPUs, a campaign through `--address ray://HEAD:PORT`
with the token, and a bisect through `--address auto`. And a campaign without --address starts
a runtime of its own whatever address file an earlier `ray start` left behind.

The head runs in its own session (process group) with its own HOME (the token) and temp dir,
all on 127.0.0.1 (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps Ray off the machine's other
addresses), and the whole group is killed afterwards: nothing of it outlives the module."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from test_compare import three_kernels  # noqa: E402

RAY = [sys.executable, "-m", "ray.scripts.scripts"]          # the `ray` command of this Python
FLOOR = 'CUDA_DOUBLE_SLOW_FLOOR_US = "4000", CUDA_DOUBLE_CLOCK = "virtual"'


def _campaign(path: Path, snap: Path) -> Path:
    """Two cells: the baseline and `fill` planted 4x slower, few repeats (a slowdown that large
    needs no more)."""
    path.write_text(f'name = "cluster"\nbaseline = "plain"\n[rules]\nrepeats = 3\nwarmup = 1\nthreshold = 20\n'
                    f'max_reruns = 1\ntimeout = 120\n[[snapshot]]\npath = "{snap}"\n'
                    f'[[env]]\nname = "plain"\nvars = {{ CUDA_DOUBLE_SLOW = "*:1", {FLOOR} }}\n'
                    f'[[env]]\nname = "slowfill"\nvars = {{ CUDA_DOUBLE_SLOW = "*:1,fill:4", {FLOOR} }}\n')
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _group_alive(pgid: int) -> bool:
    """A process of the group still runs (zombies waiting for init to reap them do not count)."""
    for st in Path("/proc").glob("[0-9]*/stat"):
        try:
            f = st.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(f[2]) == pgid and f[0] != "Z":
            return True
    return False


def _kill_group(pgid: int) -> None:
    """SIGTERM the group, then SIGKILL what is left; returns once no process of it runs."""
    for sig, wait in ((signal.SIGTERM, 3), (signal.SIGKILL, 10)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not _group_alive(pgid):
                return
            time.sleep(0.2)


def _base_env(double, root: Path) -> dict:
    env = dict(double["env"], RAY_TMPDIR=str(root), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
               RAY_USAGE_STATS_ENABLED="0")
    for k in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(k, None)
    return env


def _start_head(env: dict, root: Path):
    """`RAY_AUTH_MODE=token ray start --head` with two fake GPUs, blocking in a session of its
    own; up when its client server answers, and the runtime-env agent that a client's session
    needs (it starts last). Ray gives the raylet 30 s to register, which a
    loaded 2-core machine can miss: one more try then."""
    for _ in range(2):
        port, client, agent = _free_port(), _free_port(), _free_port()
        with open(root / "head.log", "w") as log:
            proc = subprocess.Popen(RAY + ["start", "--head", "--block", "--node-ip-address", "127.0.0.1",
                                           "--port", str(port), "--ray-client-server-port", str(client),
                                           "--runtime-env-agent-port", str(agent),
                                           "--temp-dir", str(root / "ray"), "--num-cpus", "2", "--num-gpus", "2",
                                           "--resources", '{"gpu_model:H100": 2}', "--include-dashboard", "false",
                                           "--disable-usage-stats"],
                                    env=dict(env, RAY_AUTH_MODE="token"), stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if all(_listening(p) for p in (client, agent)) and (root / "ray" / "ray_current_cluster").exists():
                return proc, client
            time.sleep(0.5)
        _kill_group(proc.pid)
        proc.wait(timeout=10)
    pytest.fail("ray start --head did not come up: " + (root / "head.log").read_text()[-3000:])


@contextlib.contextmanager
def _head(double):
    root = Path(tempfile.mkdtemp(prefix="csray", dir="/tmp"))   # short: Ray's socket paths must fit
    (root / "home").mkdir()
    env = _base_env(double, root)
    env["HOME"] = str(root / "home")
    # README: `ray get-auth-token --generate`, then `RAY_AUTH_MODE=token ray start --head --num-gpus N`
    try:
        tok = subprocess.run(RAY + ["get-auth-token", "--generate"], env=env, capture_output=True, text=True,
                             timeout=120)
        assert tok.returncode == 0 and tok.stdout.strip(), tok.stderr[-2000:]
        proc, client = _start_head(env, root)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    try:
        snaps = root / "snaps"
        snaps.mkdir()
        three_kernels(snaps / "s0.cusnap", n=64)
        yield {"root": root, "env": env, "token": tok.stdout.strip(), "client": client, "snaps": snaps}
    finally:
        _kill_group(proc.pid)
        proc.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)


def _client_logs(root: Path) -> str:
    """The tails of the head's client-server logs (why a ray:// session did not start)."""
    out = []
    for f in sorted((root / "ray").glob("session_latest/logs/ray_client_server*")):
        out.append(f"--- {f.name}\n" + f.read_text(errors="replace")[-1500:])
    return "\n".join(out)


def _cli(env, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", "cudasnap", *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_the_readme_cluster_recipe(double, tmp_path):
    """One head for both (one test, so that xdist's workers never start two):
    - `--address ray://127.0.0.1:PORT` with RAY_AUTH_MODE=token and RAY_AUTH_TOKEN, from a HOME
      that holds no token: the planted regression is found on the head's two fake GPUs;
    - bisect `--address auto` finds the head by its address file (RAY_TMPDIR) and the token in
      HOME, and replays there, two environments a round."""
    with _head(double) as head:
        (tmp_path / "home").mkdir()
        env = dict(head["env"], HOME=str(tmp_path / "home"), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=head["token"])
        camp = _campaign(tmp_path / "camp.toml", head["snaps"] / "s0.cusnap")
        for store in ("st.sqlite", "st2.sqlite"):
            cp = _cli(env, "campaign", "run", camp, "-o", tmp_path / store, "--address",
                      f"ray://127.0.0.1:{head['client']}", "--json")
            # Ray's client server, on a loaded 2-core machine, at times fails to start the first
            # session of a fresh head ("Initialization failure from server"): one more try then
            if "Initialization failure from server" not in cp.stderr:
                break
        assert cp.returncode == 1, cp.stdout[-2000:] + cp.stderr[-2000:] + _client_logs(head["root"])
        res = json.loads(cp.stdout)
        assert res["cells"] == 2 and res["ran"] == 2 and res["failed"] == 0 and res["gpus"] == 2, res
        assert {(g["env"], g["kernel"]) for g in res["report"]["regressions"]} == {("slowfill", "fill")}

        steady = f'{{ CUDA_DOUBLE_SLOW = "*:1", {FLOOR} }}'
        slow = f'{{ CUDA_DOUBLE_SLOW = "*:1,fill:4", {FLOOR} }}'
        envs = tmp_path / "envs.toml"
        envs.write_text("".join(f'[[env]]\nname = "e{i}"\nvars = {steady if i < 2 else slow}\n' for i in range(4)))
        cp = _cli(head["env"], "bisect", head["snaps"] / "s0.cusnap", "--envs", envs, "--repeat", "3", "--warmup",
                  "1", "--threshold", "30", "--gpus", "2", "--address", "auto", "--json")
        assert cp.returncode == 1, cp.stdout[-2000:] + cp.stderr[-2000:]
        res = json.loads(cp.stdout)
        assert res["first_bad"]["name"] == "e2" and res["gpus"] == 2 and res["strategy"]["name"] == "2-ary", res


def test_local_campaign_ignores_a_stale_cluster_address(double, tmp_path):
    """An address file left by a head that died (RAY_TMPDIR/ray/ray_current_cluster, naming a
    port nothing listens on) and RAY_ADDRESS: a campaign without --address starts its own
    runtime all the same (here with two fake GPUs, as the local runtime of a GPU machine)."""
    root = Path(tempfile.mkdtemp(prefix="csray", dir="/tmp"))
    try:
        (root / "ray").mkdir()
        stale = f"127.0.0.1:{_free_port()}"
        (root / "ray" / "ray_current_cluster").write_text(stale)
        snaps = root / "snaps"
        snaps.mkdir()
        three_kernels(snaps / "s0.cusnap", n=64)
        camp = _campaign(tmp_path / "camp.toml", snaps / "s0.cusnap")
        env = dict(_base_env(double, root), RAY_AUTH_MODE="disabled", RAY_ADDRESS=stale)
        script = ("import sys\nfrom cudasnap.campaign import Store, load_campaign\n"
                  "from cudasnap.campaign.run import run_campaign\n"
                  f"sys.exit(run_campaign(load_campaign({str(camp)!r}), Store({str(tmp_path / 'st.sqlite')!r}), None, "
                  "False, False, True, True, init_kwargs=dict(num_cpus=2, num_gpus=2, "
                  "resources={'gpu_model:H100': 2})))\n")
        proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=300)
        finally:
            _kill_group(proc.pid)
        assert proc.returncode == 1, out[-2000:] + err[-2000:]
        res = json.loads(out)
        assert res["ran"] == 2 and res["failed"] == 0 and res["gpus"] == 2, res
        assert {(g["env"], g["kernel"]) for g in res["report"]["regressions"]} == {("slowfill", "fill")}
        assert (root / "ray" / "ray_current_cluster").read_text() == stale      # not ours to touch
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_failed_connection_says_how_authentication_is_set(monkeypatch):
    from cudasnap.campaign import engine

    def refuse(**kw):
        assert kw["address"] == "ray://127.0.0.1:10001"
        raise ConnectionError("ray client connection timeout")
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refuse)
    with pytest.raises(engine.EngineError) as e:
        engine.start_ray("ray://127.0.0.1:10001")
    msg = str(e.value)
    assert "\n" not in msg and "ray client connection timeout" in msg
    assert "RAY_AUTH_MODE=token" in msg and "RAY_AUTH_TOKEN" in msg


def test_without_an_address_ray_gets_local(monkeypatch):
    """No --address: ray.init is told "local", so neither RAY_ADDRESS nor an address file decides."""
    from cudasnap.campaign import engine
    seen = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.update(kw))
    engine.start_ray(None, {"num_gpus": 2})
    assert seen["address"] == "local" and seen["num_gpus"] == 2
    seen.clear()
    engine.start_ray("auto")
    assert seen["address"] == "auto" and "num_gpus" not in seen


def test_ray_notices_never_reach_the_json_on_stdout(monkeypatch, capsys):
    """Ray's threads print their notices ("(raylet) A worker died or was killed ...") on stdout
    while replays run; seen in the recipe above, in front of bisect's --json document. While
    bisect and campaign run, stdout is stderr: their own output goes to the real stdout only."""
    from cudasnap.campaign import bisect

    def body(*args, out=None, **kw):
        print("(raylet) A worker died or was killed while executing a task")      # as Ray's thread would
        out.write(json.dumps({"exit_code": 1}) + "\n")
        return 1

    monkeypatch.setattr(bisect, "_bisect_cli", body)
    assert bisect.run_bisect_cli("s.cusnap", "envs.toml", as_json=True, gpus=2) == 1
    got = capsys.readouterr()
    assert json.loads(got.out) == {"exit_code": 1} and "(raylet)" in got.err
    assert sys.stdout is not sys.stderr
