"""The command line of a replay in a process of its own: a typed document (replay/invocation.py)
carried whole to `python -m cudasnap.replay.invocation`. A replay runs in the caller's process
(invocation.run_request) unless isolation is the point; each site that starts a process says
why on the line before (tests/test_structure.py lists them). Below the profilers, so that any of
them can start one without importing the replay's entry point."""
from __future__ import annotations

import json
from typing import Any, Dict, List


def command(python: str, doc: Dict[str, Any]) -> List[str]:
    """The fresh process that runs doc (carried whole: it needs no file a Ray node may lack)."""
    return [python, "-m", "cudasnap.replay.invocation", json.dumps(doc)]
