"""A replay to run, as one typed document instead of a rebuilt command line.

Campaign cells, bisect steps and their replay servers hand a replay over as the options the
command line would have built (ReplayOptions, ProfileConfig), never as argv parsed again:

    {"snapshot": PATH, "replay": {ReplayOptions fields}, "profile": {ProfileConfig fields}}

`run(doc)` replays it in this process, as `cudasnap replay` does; `python -m
cudasnap.replay.invocation DOC` runs one in a fresh process (DOC: the document itself, a file
holding it, or `-` for stdin), for an environment that needs its own."""
from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any, Dict, List, Optional

from .options import ReplayOptions


def profiled(snapshot: str, out: str, mode: str, kernels: Optional[str] = None, repeat: int = 10,
             warmup: int = 3, device: Optional[int] = None) -> Dict[str, Any]:
    """What `replay SNAP --profile MODE --out OUT -q --no-progress [--repeat R --warmup W]
    [--kernels K] [--device N]` runs with (repeats only where the mode repeats)."""
    from .profile import ProfileConfig
    cfg = ProfileConfig(mode=mode, kernels=kernels, out=out)
    if mode in ("isolated", "graph"):
        cfg.repeat, cfg.warmup = repeat, warmup
    opts = ReplayOptions(quiet=True, progress=False)
    if device is not None:
        opts.device = device
    return {"snapshot": snapshot, "replay": dataclasses.asdict(opts), "profile": dataclasses.asdict(cfg)}


def plain(snapshot: str, device: int = 0) -> Dict[str, Any]:
    """What `replay SNAP --device N` runs with: replay and verify, no profile."""
    return {"snapshot": snapshot, "replay": dataclasses.asdict(ReplayOptions(device=device)), "profile": None}


def _typed(cls, d: Dict[str, Any]):
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s): {', '.join(unknown)}")
    return cls(**d)


def run(doc: Dict[str, Any], checked: bool = False) -> int:
    """Replays doc in this process; its exit code (0 verified, 1 mismatch, 2 error). checked:
    the snapshot has passed the preflight check in this process already."""
    from .profile import ProfileConfig, run_profile_cli
    from . import run_replay_cli
    opts = _typed(ReplayOptions, doc["replay"])
    if doc.get("profile") is None:
        return run_replay_cli(doc["snapshot"], opts, False)
    return run_profile_cli(doc["snapshot"], opts, _typed(ProfileConfig, doc["profile"]), False, checked=checked)


def command(python: str, doc: Dict[str, Any]) -> List[str]:
    """The fresh process that runs doc (carried whole: it needs no file a Ray node may lack)."""
    return [python, "-m", "cudasnap.replay.invocation", json.dumps(doc)]


def main(argv: List[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: python -m cudasnap.replay.invocation DOC|DOC.json|-\n")
        return 2
    a = argv[0]
    try:
        if a.lstrip().startswith("{"):
            doc = json.loads(a)
        elif a == "-":
            doc = json.load(sys.stdin)
        else:
            with open(a) as f:
                doc = json.load(f)
        return run(doc)
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.stderr.write(f"cudasnap: error: replay document {a[:60]}: {e}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
