"""One rank of a job replayed in this process, the others in the background (an extract of
one rank of a job: export/extract.py). The coordinator's parts are replay/group.py's."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

from .group import (DEFAULT_TIMEOUT, DEFAULT_WATCHDOG, ENV_NRANKS, ENV_OWNERS, ENV_PID, ENV_PROGRESS, ENV_RANK,
                    ENV_SOCKET, ENV_TIMEOUT, RankHook, LinkStore, Progress, device_map, gpu_count, owners_doc,
                    reset_client, serve_links)


class RankSession:
    """One rank of a job replayed in this process (by a caller's own Replayer: an extract of
    one rank), every other rank replaying in the background as in a group replay, so that the
    links and the cross-rank order hold up to where the caller stops. Inside `with`, the
    environment names the group (client() and RankHook find it); `hook()` is the rank's
    RankHook, to subscribe first (its start rendezvous runs at the replay's start). On exit the
    other ranks are stopped: they are not waited for. `device`: the GPU this rank replays on."""

    def __init__(self, manifest: Dict[str, Any], rank: int, devices: Optional[str] = None):
        self.m = manifest
        self.rank = rank
        self.devices = devices
        self.procs: List[subprocess.Popen] = []
        self.tmp: Optional[str] = None
        self.device = 0
        self._env_old: Dict[str, Optional[str]] = {}
        self.failed: Optional[str] = None

    def __enter__(self) -> "RankSession":
        from . import rankopts
        from .options import ReplayOptions
        from .profile import ProfileConfig
        ranks = self.m["ranks"]
        ds = device_map(self.m, self.devices, gpu_count())
        self.device = ds[self.rank]
        timeout = float(os.environ.get(ENV_TIMEOUT, DEFAULT_TIMEOUT))
        self.tmp = tmp = tempfile.mkdtemp(prefix="cudasnap-rank-")
        doc = os.path.join(tmp, "options.json")
        rankopts.dump(doc, ReplayOptions(quiet=True), ProfileConfig())
        sock_path = os.path.join(tmp, "sock")
        self.store = LinkStore(self.m, timeout)
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.srv.bind(sock_path)
        self.srv.listen(len(ranks) * 2)
        self.stop = threading.Event()
        threading.Thread(target=serve_links, args=(self.srv, self.store, self.stop), daemon=True).start()
        self.prog = Progress(os.path.join(tmp, "progress"), len(ranks), create=True)
        owners = os.path.join(tmp, "owners.json")
        with open(owners, "w") as f:
            json.dump(owners_doc(self.m), f)
        common = {ENV_SOCKET: sock_path, ENV_PROGRESS: os.path.join(tmp, "progress"), ENV_NRANKS: str(len(ranks)),
                  ENV_TIMEOUT: str(timeout), ENV_OWNERS: owners}
        try:
            for r, d in zip(ranks, ds):
                if r["rank"] == self.rank:
                    continue
                env = dict(os.environ)
                env.update(common)
                env.update({ENV_PID: str(r["pid"]), ENV_RANK: str(r["rank"])})
                cmd = rankopts.rank_command(sys.executable, doc, r["snapshot"], d, DEFAULT_WATCHDOG)
                # a process of its own: the job's other ranks, one each, as the job ran
                self.procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                                   stderr=open(os.path.join(tmp, f"err{r['rank']}"), "wb")))
        except BaseException:
            self._close()
            raise
        mine = dict(common)
        mine.update({ENV_PID: str(ranks[self.rank]["pid"]), ENV_RANK: str(self.rank)})
        for k, v in mine.items():
            self._env_old[k] = os.environ.get(k)
            os.environ[k] = v
        reset_client()
        threading.Thread(target=self._watch, daemon=True).start()
        return self

    def hook(self) -> RankHook:
        h = RankHook()
        h.front = True
        return h

    def _watch(self) -> None:
        """Another rank that failed stops this one's waits (abort); one that ended is known to
        the imports waiting for its exports."""
        others = [r for r in self.m["ranks"] if r["rank"] != self.rank]
        seen = set()
        while not self.stop.is_set():
            for r, p in zip(others, self.procs):
                if p.pid in seen or p.poll() is None:
                    continue
                seen.add(p.pid)
                how = "ended" if p.returncode == 0 else (f"was killed by signal {-p.returncode}" if p.returncode < 0
                                                         else f"failed (exit {p.returncode})")
                self.store.rank_ended(r["pid"], how)
                if p.returncode not in (0, 1) and self.failed is None:
                    err = ""
                    try:
                        with open(os.path.join(self.tmp, f"err{r['rank']}"), "rb") as f:
                            lines = [ln for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
                        err = f": {lines[-1]}" if lines else ""
                    except OSError:
                        pass
                    self.failed = f"rank {r['rank']} (pid {r['pid']}) {how}{err}"
                    self.prog.abort()
            time.sleep(0.05)

    def __exit__(self, *exc) -> None:
        self._close()

    def _close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        if getattr(self, "stop", None) is not None:
            self.stop.set()
            self.srv.close()
            self.store.close()
        reset_client()
        for k, v in self._env_old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._env_old = {}
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None
