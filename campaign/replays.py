"""Replay commands run on Ray, one per GPU at a time, for `cudasnap bisect --gpus K`: the
k environments of a search round replay at once. Each command runs as it would locally (the
same argv and variables, its profile written where the command says: this machine, or
storage every node shares), pinned to the GPU Ray gave its task."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any, Dict, List, Optional, Tuple

from .engine import EngineError, start_ray
from .worker import die_with_parent


def _run(cmd: List[str], env: Dict[str, str], out: str, timeout: Optional[float]) -> Tuple[int, str, Optional[bytes], float]:
    import ray

    env = dict(env)
    gpus = ray.get_gpu_ids()
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    t0 = time.monotonic()
    # a process of its own: an environment's replay on a Ray node: its variables and driver apply from a process's start
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         preexec_fn=die_with_parent)
    try:
        _, err = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        rc, err = 124, f"the replay ran past {timeout:g} s"
    except BaseException:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        raise
    data = None
    try:
        with open(out, "rb") as f:
            data = f.read()
    except OSError:
        pass
    return rc, err or "", data, time.monotonic() - t0


class RayReplays:
    """run([(cmd, env, out), ...]) -> [(exit code, stderr, seconds)], every command at once
    (Ray queues what exceeds the GPUs); each profile is left at its `out` path here."""

    def __init__(self, address: Optional[str] = None, init_kwargs: Optional[Dict[str, Any]] = None,
                 timeout: Optional[float] = None):
        self.ray = start_ray(address, init_kwargs)
        self.slots = int(self.ray.cluster_resources().get("GPU", 0))
        if self.slots < 1:
            raise EngineError("the Ray cluster has no GPU (num_gpus)")
        self.timeout = timeout
        self._task = self.ray.remote(num_gpus=1, num_cpus=0, max_retries=1)(_run)

    def run(self, jobs: List[Tuple[List[str], Dict[str, str], str]]) -> List[Tuple[int, str, float]]:
        refs = [self._task.remote(cmd, env, out, self.timeout) for cmd, env, out in jobs]
        results = []
        for (cmd, env, out), ref in zip(jobs, refs):
            try:
                rc, err, data, secs = self.ray.get(ref)
            except Exception as e:          # the worker or its node was lost twice
                results.append((2, f"the replay's Ray worker was lost: {' '.join(str(e).split())[:200]}", 0.0))
                continue
            if data is not None and not os.path.exists(out):
                with open(out, "wb") as f:
                    f.write(data)
            results.append((rc, err, secs))
        return results

    def close(self) -> None:
        try:
            self.ray.shutdown()
        except Exception:
            pass
