"""The group manifest of a capture that recorded several processes (formats/group.py).

Written after every snapshot is closed: at OUT itself when the first process made no CUDA
call (torchrun's or mpirun's launcher: `cudasnap replay OUT` then replays the job), else
beside it as STEM.group.json (so that globs of *.cusnap find snapshots only)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

from cudasnap.formats.group import build, save


def manifest_path(out: Path, snapshots: List[Path]) -> Path:
    return out if out not in snapshots and not out.exists() else out.with_name(out.stem + ".group.json")


def write_manifest(out: Path, snapshots: List[Path], command: List[str]) -> Optional[Path]:
    """Write the manifest for `snapshots` (two or more); returns its path, None when it
    could not be written (said on stderr: the snapshots themselves are fine)."""
    if len(snapshots) < 2:
        return None
    path = manifest_path(out, snapshots)
    try:
        m = build(snapshots, command)
        save(m, path)
    except Exception as e:      # a snapshot unreadable after all, a full disk
        print(f"cudasnap: warning: group manifest {path} not written: {e}", file=sys.stderr)
        return None
    for u in m.get("unmatched", []):
        print(f"cudasnap: warning: process {u.get('pid')} call #{u.get('seq')}: {u.get('why')}", file=sys.stderr)
    return path
