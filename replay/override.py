"""`replay --launch-override`: replay launches with another grid and/or block size, verifying
the results as usual: a kernel whose results do not depend on its launch geometry (grid-stride
loops) verifies; one that does shows where it differs.

Spec: grid=X[,Y[,Z]] and/or block=X[,Y[,Z]], optionally kernel=REGEX (last; the launches of
matching kernels only).  A block larger than the kernel allows (its maximum threads per block)
is not applied to that launch; the summary counts those."""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

from cudasnap.formats.vocab import in_class, is_launch

from cudasnap.formats.layout import packer

LAUNCH_CONFIG = packer("CUlaunchConfig")   # grid, block, shmem, hStream, attrs, numAttrs
_GRID = ("gridDimX", "gridDimY", "gridDimZ")
_BLOCK = ("blockDimX", "blockDimY", "blockDimZ")


_MAX = 2**32 - 1          # cuLaunchKernel takes unsigned int sizes (what a kernel allows, the replay checks)


def parse(spec: str) -> Tuple[Optional[Tuple[int, int, int]], Optional[Tuple[int, int, int]], Optional[str]]:
    vals: Dict[str, List[str]] = {}
    key = None
    parts = spec.split(",")
    for i, tok in enumerate(parts):
        k, eq, v = tok.partition("=")
        if eq and k.strip() in ("grid", "block", "kernel"):
            key = k.strip()
            if key == "kernel":
                vals[key] = [",".join([v] + parts[i + 1:])]
                break
            vals[key] = [v]
        elif key in ("grid", "block"):
            vals[key].append(tok)
        else:
            raise ValueError(f"--launch-override: cannot read {tok!r} (grid=X,Y,Z,block=X,Y,Z[,kernel=REGEX])")

    def dims(k):
        if k not in vals:
            return None
        try:
            d = [int(x) for x in vals[k]]
        except ValueError:
            raise ValueError(f"--launch-override: {k} takes integers")
        if not 1 <= len(d) <= 3 or min(d) < 1:
            raise ValueError(f"--launch-override: {k} takes 1 to 3 positive sizes")
        if max(d) > _MAX:
            raise ValueError(f"--launch-override: {k}={','.join(map(str, d))}: a size is past what a launch "
                             f"takes ({_MAX}, an unsigned int)")
        return tuple(d + [1] * (3 - len(d)))

    grid, block = dims("grid"), dims("block")
    if grid is None and block is None:
        raise ValueError("--launch-override: give grid=... and/or block=...")
    kern = vals.get("kernel", [None])[0]
    if kern is not None:
        re.compile(kern)
    return grid, block, kern


class LaunchOverride:
    """A replay subscriber: rewrites each launch record's geometry just before it replays."""
    wants_calls = True
    label = "--launch-override"

    def __init__(self, spec: str):
        self.grid, self.block, kern = parse(spec)
        self.rx = re.compile(kern) if kern else None
        self.applied = 0
        self.kernels: set = set()
        self.refused: Dict[str, str] = {}
        self._limits: Dict[int, int] = {}

    def _max_threads(self, rv, rec, h) -> Optional[int]:
        if h in self._limits:
            return self._limits[h]
        try:
            fn = rv.bound_function(rv.resolve_function(rec, h))     # a library kernel: its CUfunction
            cu = rv.driver
            r = cu.cuFuncGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn)
            v = int(r[1]) if int(r[0]) == 0 else None
        except Exception:
            v = None
        self._limits[h] = v
        return v

    def on_event(self, kind, ev) -> None:
        if kind == "end":
            self._report(ev.replay)
            return
        if kind != "before_call":
            return
        rec = ev.rec
        f = rec.get("f") or ""
        if not is_launch(f) or rec.get("r", 0) != 0:
            return
        rv = ev.replay
        a = dict(rec.get("a") or {})
        h = a.get("f")
        name = rv.kernel_name(h, rec.get("s"))
        if self.rx is not None and not self.rx.search(name):
            return
        ex = in_class(f, "config_launch")
        if ex:
            cfg = a.get("config")
            if not isinstance(cfg, (bytes, bytearray)) or len(cfg) < LAUNCH_CONFIG.size:
                return
            t = list(LAUNCH_CONFIG.unpack_from(cfg))
            grid, block = t[0:3], t[3:6]
        else:
            grid = [int(a.get(k, 1)) for k in _GRID]
            block = [int(a.get(k, 1)) for k in _BLOCK]
        new_grid = list(self.grid) if self.grid else grid
        new_block = list(self.block) if self.block else block
        if self.block:
            mx = self._max_threads(rv, rec, h)
            n = new_block[0] * new_block[1] * new_block[2]
            if mx is not None and n > mx:
                self.refused[name] = f"block of {n} threads, the kernel allows {mx}"
                return
        if ex:
            t[0:3], t[3:6] = new_grid, new_block
            buf = bytearray(cfg)
            LAUNCH_CONFIG.pack_into(buf, 0, *t)
            a["config"] = bytes(buf)
        else:
            a.update(zip(_GRID, new_grid))
            a.update(zip(_BLOCK, new_block))
        rec["a"] = a
        self.applied += 1
        self.kernels.add(name)

    def summary(self) -> Dict[str, object]:
        """What was changed: a profile keeps it, so a comparison knows what it measured."""
        return {"grid": list(self.grid) if self.grid else None, "block": list(self.block) if self.block else None,
                "kernel": self.rx.pattern if self.rx else None, "applied": self.applied,
                "kernels": sorted(self.kernels), "refused": dict(sorted(self.refused.items()))}

    def _report(self, rv) -> None:
        g = "x".join(map(str, self.grid)) if self.grid else "as recorded"
        b = "x".join(map(str, self.block)) if self.block else "as recorded"
        rv.warn(f"--launch-override: {self.applied} launch(es) of {len(self.kernels)} kernel(s) replayed with grid {g}, "
                 f"block {b}")
        for k, why in sorted(self.refused.items()):
            rv.warn(f"--launch-override: launches of {k} left as recorded ({why})")
        if not self.applied:           # nothing ran at the size asked: exit 0 would claim it did
            why = "; ".join(f"{k}: {w}" for k, w in sorted(self.refused.items())) or \
                (f"no launch of a kernel matching {self.rx.pattern!r}" if self.rx else "no kernel launch replayed")
            rv.fail(f"--launch-override changed no launch ({why})")
