"""What the profiling diagnostics under bench/ share: replay a snapshot under one --profile mode
and return its per-kernel medians (by CUPTI name)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cudasnap.replay.profile.report import kernel_medians

GRAPH_ARGS = ("--repeat", "10", "--warmup", "3", "--no-timeline-check")


def profile_medians(snapshot, mode: str, out: Path, *extra: str) -> dict:
    """`cudasnap replay SNAPSHOT --profile MODE --out OUT` (graph mode with GRAPH_ARGS); exits
    with the replay's message when it fails."""
    args = [*(GRAPH_ARGS if mode == "graph" else ()), *extra]
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snapshot), "--profile", mode, "--out", str(out),
                         "--watchdog", "120", "-q", *args], capture_output=True, text=True)
    if cp.returncode != 0:
        sys.exit(f"replay --profile {mode} {' '.join(extra)} failed ({cp.returncode}): {cp.stderr[-1500:]}")
    return kernel_medians(json.loads(out.read_text()))
