"""A group replay's rank options as one typed document.

The command line builds the options once (ReplayOptions, ProfileConfig); the group writes them
to a JSON file and each rank's replayer (`python -m cudasnap.replay.rank DOC SNAPSHOT DEVICE
WATCHDOG`, replay/rank.py) reads them back: no option is turned into argv and parsed again.
"{rank}" in the output paths becomes the rank."""
from __future__ import annotations

import dataclasses
import json
from typing import List

from .options import ReplayOptions

RANK_HOOK = "cudasnap.replay.group:RankHook"


def dump(path: str, opts: ReplayOptions, cfg) -> None:
    """Write the rank options (cfg: a ProfileConfig) to path."""
    doc = {"replay": dataclasses.asdict(opts), "profile": dataclasses.asdict(cfg)}
    with open(path, "w") as f:
        json.dump(doc, f)


def rank_command(python: str, doc: str, snapshot: str, device: int, watchdog: float) -> List[str]:
    return [python, "-m", "cudasnap.replay.rank", doc, snapshot, str(device), repr(float(watchdog))]
