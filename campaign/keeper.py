"""Keeps a GPU's driver state warm between a campaign's replays.

Every replay is a process of its own, and a process that opens a GPU no other process holds
pays for the driver's start-up: on an H200 (persistence mode on) cuInit and the first context
took 0.36 s of a 1.57 s replay alone and 1.35 s of 2.78 s with four GPUs starting at once;
with a process holding a context on each GPU, 0.20 s and 0.58 s
(bench/diag/diag_concurrent_replays_gpu.py). The worker starts one keeper per GPU of its node
(`ensure`), detached, holding that GPU's primary context and doing no work on it; each replay
renews its heartbeat file, and the keeper ends when the file is gone or has not been renewed
for its idle time (CUDASNAP_KEEPER_IDLE_S, default 30 s). It costs the memory of one context;
on a GPU in an exclusive compute mode it holds nothing (its context would lock replays out).

    python -m cudasnap.campaign.keeper BEAT_FILE IDLE_S      (CUDA_VISIBLE_DEVICES: its GPU)
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from typing import Optional

IDLE_ENV = "CUDASNAP_KEEPER_IDLE_S"
DEFAULT_IDLE_S = 30.0


def keeper_dir() -> str:
    return os.environ.get("CUDASNAP_KEEPER_DIR") or os.path.join(tempfile.gettempdir(), f"cudasnap-keepers-{os.getuid()}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:                       # a finished child of this process is a zombie until reaped
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return True


def ensure(gpu: str, env: Optional[dict] = None) -> Optional[int]:
    """Renews the heartbeat of the keeper of GPU `gpu` (a CUDA_VISIBLE_DEVICES value) on this
    node, starting one when none runs; its pid, None when it cannot start. Never waits for it."""
    d = keeper_dir()
    os.makedirs(d, exist_ok=True)
    key = "".join(c if c.isalnum() else "_" for c in gpu)
    beat, pidfile = os.path.join(d, key + ".beat"), os.path.join(d, key + ".pid")
    with open(beat, "a"):
        os.utime(beat)
    try:
        with open(pidfile) as f:
            pid = int(f.read().strip() or 0)
        if pid and _alive(pid):
            return pid
    except (OSError, ValueError):
        pass
    e = dict(env if env is not None else os.environ)
    e["CUDA_VISIBLE_DEVICES"] = gpu
    idle = e.get(IDLE_ENV) or str(DEFAULT_IDLE_S)
    try:
        # a process of its own: holds the GPU's context between replays, outliving each (they are processes of their own)
        p = subprocess.Popen([sys.executable, "-m", "cudasnap.campaign.keeper", beat, idle], env=e,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    except OSError:
        return None
    with open(pidfile, "w") as f:
        f.write(str(p.pid))
    return p.pid


def release_all() -> int:
    """Ends the keepers of this node (their heartbeat files removed); how many were told."""
    d = keeper_dir()
    n = 0
    try:
        names = os.listdir(d)
    except OSError:
        return 0
    for name in names:
        if name.endswith(".beat"):
            try:
                os.unlink(os.path.join(d, name))
                n += 1
            except OSError:
                pass
    return n


def hold(beat: str, idle_s: float) -> int:
    from cuda.bindings import driver as cu
    if int(cu.cuInit(0)[0]) != 0:
        return 2
    r, dev = cu.cuDeviceGet(0)
    if int(r) != 0:
        return 2
    r, mode = cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, dev)
    if int(r) != 0 or int(mode) != 0:
        return 0           # not the default compute mode: a context held here would lock replays out
    r, ctx = cu.cuDevicePrimaryCtxRetain(dev)
    if int(r) != 0:
        return 2
    cu.cuCtxSetCurrent(ctx)
    while True:
        try:
            age = time.time() - os.stat(beat).st_mtime
        except OSError:
            break                                    # released
        if age > idle_s:
            break
        time.sleep(min(1.0, idle_s / 4))
    cu.cuDevicePrimaryCtxRelease(dev)
    return 0


if __name__ == "__main__":
    sys.exit(hold(sys.argv[1], float(sys.argv[2])))
