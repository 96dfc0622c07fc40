"""What an export reports: ExportError (the snapshot cannot be exported, naming the call) and
ExportResult (the counts and notes `cudasnap export` prints)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional


class ExportError(Exception):
    """The snapshot cannot be exported (exit code 2); the message names the call."""


@dataclass
class ExportResult:
    outdir: str
    c_file: str
    program: str
    calls: int = 0                    # recorded calls translated
    launches: int = 0
    queries_skipped: int = 0
    host_only: Dict[str, int] = field(default_factory=dict)   # dropped calls without device effect, by name
    failed_skipped: int = 0           # calls that failed when recorded (they had no effect)
    filtered: int = 0                 # left out by --calls
    no_effect: int = 0                # hints, host-only calls: nothing to replay
    h2d_files: int = 0
    h2d_bytes: int = 0
    d2h_files: int = 0
    d2h_bytes: int = 0
    modules: int = 0
    kernels: int = 0
    stopped_at: Optional[int] = None  # the call the recorded program died in
    notes: List[str] = field(default_factory=list)
    elapsed_s: float = 0.0
