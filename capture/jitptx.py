"""PTX of JIT-compiled modules, kept at capture. Triton (and torch.compile's Triton kernels)
writes each kernel's PTX beside its cubin in its cache (DIR/<hash>/<name>.ptx and .cubin); the
driver sees only the cubin. A loaded image whose bytes equal a cached cubin's gets that PTX
recorded with it (formats/jitptx.py), for the simulator, which runs PTX only."""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Tuple

from cudasnap.formats.container import blob_id_of

DIRS_ENV = "CUDASNAP_PTX_DIRS"      # more directories to search, ':'-separated
_DEPTH = 4                           # inductor: DIR/triton/<device>/<hash>/<name>.cubin


def cache_dirs(env: Dict[str, str]) -> List[Tuple[str, str]]:
    """(directory, what it is) to search, from the captured program's environment: Triton's
    cache (TRITON_CACHE_DIR, else TRITON_HOME's or HOME's .triton/cache), torch.compile's
    (TORCHINDUCTOR_CACHE_DIR, else /tmp/torchinductor_USER), and CUDASNAP_PTX_DIRS."""
    out: List[Tuple[str, str]] = []
    if env.get("TRITON_CACHE_DIR"):
        out.append((env["TRITON_CACHE_DIR"], "triton cache"))
    for home in (env.get("TRITON_HOME"), env.get("HOME")):
        if home:
            out.append((os.path.join(home, ".triton", "cache"), "triton cache"))
    user = env.get("USER") or env.get("LOGNAME") or _user()
    ind = env.get("TORCHINDUCTOR_CACHE_DIR") or (f"/tmp/torchinductor_{user}" if user else "")
    if ind:
        out.append((ind, "torch.compile cache"))
    for d in (env.get(DIRS_ENV) or "").split(":"):
        if d:
            out.append((d, DIRS_ENV))
    seen, uniq = set(), []
    for d, what in out:
        d = os.path.abspath(d)
        if d not in seen:
            seen.add(d)
            uniq.append((d, what))
    return uniq


def _user() -> str:
    try:
        import getpass
        return getpass.getuser()
    except Exception:
        return ""


class PtxFinder:
    """Cubins of the cache directories indexed by size; a directory that changed since the
    last walk (a kernel compiled meanwhile) is walked again on a miss."""

    def __init__(self, env: Dict[str, str]):
        self.dirs = cache_dirs(env)
        self.by_size: Dict[int, List[Tuple[str, str]]] = {}
        self.mtimes: Dict[str, float] = {}

    def _walk(self) -> None:
        self.by_size.clear()
        self.mtimes.clear()
        for top, what in self.dirs:
            stack = [(top, 0)]
            while stack:
                d, depth = stack.pop()
                try:
                    self.mtimes[d] = os.stat(d).st_mtime
                    it = list(os.scandir(d))
                except OSError:
                    self.mtimes[d] = -1.0        # not there yet: looked at again on a miss
                    continue
                for e in it:
                    try:
                        if e.is_dir(follow_symlinks=False):
                            if depth < _DEPTH:
                                stack.append((e.path, depth + 1))
                        elif e.name.endswith(".cubin"):
                            self.by_size.setdefault(e.stat().st_size, []).append((e.path, what))
                    except OSError:
                        continue

    def _changed(self) -> bool:
        for d, t in self.mtimes.items():
            try:
                if os.stat(d).st_mtime != t:
                    return True
            except OSError:
                if t != -1.0:
                    return True
        return False

    def find(self, image_blob: str, size: int) -> Optional[Tuple[bytes, str, str]]:
        """(PTX, what kept it, the cubin's path) for the image of that blob id and size."""
        if not self.dirs or size <= 0:
            return None
        if not self.mtimes:
            self._walk()
        hit = self._match(image_blob, size)
        if hit is None and self._changed():
            self._walk()
            hit = self._match(image_blob, size)
        return hit

    def _match(self, image_blob: str, size: int) -> Optional[Tuple[bytes, str, str]]:
        for path, what in self.by_size.get(size, ()):
            try:
                with open(path, "rb") as f:
                    if blob_id_of(f.read()) != image_blob:
                        continue
                with open(path[:-len(".cubin")] + ".ptx", "rb") as f:
                    return f.read(), what, path
            except OSError:
                continue
        return None


def program_env(pid: int) -> Dict[str, str]:
    """The process's environment as it started (what its caches are named by)."""
    env: Dict[str, str] = {}
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                k, _, v = item.decode("utf-8", "replace").partition("=")
                if k:
                    env[k] = v
    except OSError:
        pass
    return env
