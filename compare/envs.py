"""The `[[env]]` table that bisect's ENVS.toml and a campaign file share: a name, variables
(CUDASNAP_REPLACE included) and a driver path; each caller adds its own keys (bisect: device,
campaign: gpu)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Optional, Tuple


@dataclass
class Env:
    """One environment to replay in, as bisect and a campaign read it."""
    index: int
    name: str
    vars: Dict[str, str] = field(default_factory=dict)
    driver: Optional[str] = None
    device: Optional[int] = None        # bisect: the GPU ordinal it asks for
    gpu: Optional[str] = None           # campaign: the GPU model it asks for ("H100")


TOLERANCE_VAR = "CUDASNAP_TOLERANCE"


def tolerance_value(v: Any, where: str, error: Callable[[str], Exception]) -> str:
    """A tolerance as replay's --tolerance takes it, checked; raises error(message)."""
    from cudasnap.replay.numerics import parse_tolerance
    if not isinstance(v, str):
        raise error(f"{where} must be a string such as \"torch\", \"rtol=1e-5,atol=1e-8\" or \"ulp:2\"")
    try:
        parse_tolerance(v, where)
    except ValueError as e:
        raise error(str(e))
    return v


def env_table(t: Any, where: str, base: str, extra: Iterable[str], taken: Iterable[str],
              error: Callable[[str], Exception]) -> Tuple[str, Dict[str, str], Optional[str]]:
    """(name, vars as strings, driver path made absolute) of one [[env]] table; raises
    error(message) on a table that is not one. `extra`: the caller's own keys; `taken`: names
    already used."""
    if not isinstance(t, dict):
        raise error(f"{where}: not a table")
    keys = ["name", "vars", "driver", "tolerance", *extra]
    unknown = set(t) - set(keys)
    if unknown:
        raise error(f"{where}: unknown key(s) {', '.join(sorted(unknown))} ({', '.join(keys)})")
    name = t.get("name")
    if not isinstance(name, str) or not name:
        raise error(f"{where}: needs a name")
    if name in set(taken):
        raise error(f"{where}: name {name!r} used twice")
    vars_ = t.get("vars", {})
    if not isinstance(vars_, dict) or not all(isinstance(v, (str, int, float, bool)) for v in vars_.values()):
        raise error(f"{where} ({name}): vars must be a table of strings or numbers")
    for k, v in vars_.items():          # what execve cannot pass
        if not k or "=" in k or "\0" in k:
            raise error(f"{where} ({name}): variable {k!r}: an environment variable's name holds no '=' or NUL")
        if "\0" in str(v):
            raise error(f"{where} ({name}): variable {k}: its value holds a NUL byte")
    if t.get("tolerance") is not None:      # replay reads it from its environment
        vars_ = dict(vars_, **{TOLERANCE_VAR: tolerance_value(t["tolerance"], f"{where} ({name}): tolerance", error)})
    drv = t.get("driver")
    if drv is not None:
        if not isinstance(drv, str) or not drv:
            raise error(f"{where} ({name}): driver must be a path")
        drv = os.path.join(base, os.path.expanduser(drv))
        if not os.path.exists(drv):
            raise error(f"{where} ({name}): driver {drv}: no such file")
        why = _not_a_driver(drv)
        if why:
            raise error(f"{where} ({name}): driver {drv}: {why}")
    return name, {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in vars_.items()}, drv


def _not_a_driver(path: str) -> Optional[str]:
    """Why path cannot be a libcuda (a directory holding libcuda.so.1, or a shared library):
    found here, not as a loader error inside a replay or a Ray worker."""
    from cudasnap.formats.inputs import input_problem
    if os.path.isdir(path):
        return None if os.path.exists(os.path.join(path, "libcuda.so.1")) else "a directory without libcuda.so.1"
    why = input_problem(path)
    if why:
        return why.split(" is ", 1)[-1] if " is " in why else why
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        return e.strerror or str(e)
    return None if magic == b"\x7fELF" else "not a shared library (no ELF header)"
