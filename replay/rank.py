"""One rank of a group replay: its options from the group's document (replay/rankopts.py),
then the replay with the group's rank hook. Run as `python -m cudasnap.replay.rank DOC
SNAPSHOT DEVICE WATCHDOG` by the group coordinator (replay/group.py)."""
from __future__ import annotations

import json
import os
import sys
from typing import List, Optional

from .group import ENV_RANK
from .invocation import ReplayRequest, run_request, typed
from .options import ReplayOptions
from .profile import ProfileConfig
from .rankopts import RANK_HOOK


def load(path: str, rank: int, device: int, watchdog: float):
    """(ReplayOptions, ProfileConfig) of one rank: its device, the group's watchdog, the rank
    hook first, "{rank}" in the output paths made the rank."""
    with open(path) as f:
        doc = json.load(f)
    opts = typed(ReplayOptions, doc["replay"])
    cfg = typed(ProfileConfig, doc["profile"])
    opts.device, opts.watchdog = device, watchdog
    cfg.hooks = [RANK_HOOK] + list(cfg.hooks)
    for k in ("out", "trace"):
        v = getattr(cfg, k)
        if v:
            setattr(cfg, k, v.replace("{rank}", str(rank)))
    return opts, cfg


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        doc, snapshot, device, watchdog = argv
        opts, cfg = load(doc, int(os.environ.get(ENV_RANK, "0")), int(device), float(watchdog))
    except (ValueError, OSError, KeyError, TypeError) as e:
        sys.stderr.write(f"cudasnap: error: rank options: {e}\n")
        return 2
    return run_request(ReplayRequest(snapshot, opts, cfg, json=True))


if __name__ == "__main__":
    sys.exit(main())
