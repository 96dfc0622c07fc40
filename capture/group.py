"""The group manifest of a capture that recorded several processes (formats/group.py).

Written after every snapshot is closed: at OUT itself when the first process made no CUDA
call (torchrun's or mpirun's launcher: `cudasnap replay OUT` then replays the job), else
beside it as STEM.group.json (so that globs of *.cusnap find snapshots only).

A capture in windows writes one manifest per window index across the processes,
STEM.wN.group.json (window N of every process that opened it: each rank's window starts from
its own state, and the links its prologue keeps are paired as in a whole job). The flight
recorder's snapshots (one per process that met a trigger) get one manifest, named as a whole
job's."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from cudasnap.formats.group import build, save


def manifest_path(out: Path, snapshots: List[Path]) -> Path:
    return out if out not in snapshots and not out.exists() else out.with_name(out.stem + ".group.json")


def window_manifest_path(out: Path, n: int) -> Path:
    stem = out.name[: -len(".cusnap")] if out.name.endswith(".cusnap") else out.name
    return out.with_name(f"{stem}.w{n}.group.json")


def job_sets(out: Path, procs: Sequence[Any], saved: Sequence[Path],
             window: Optional[Dict[str, Any]] = None) -> List[Tuple[Path, List[Path], Optional[str]]]:
    """The manifests a capture writes: (where, the snapshots it names, a note or None).
    procs: the recorder's processes (the first one started first); saved: the snapshots
    written whole. Whole snapshots: one manifest when every process wrote exactly one.
    Windows: one per window index that two or more processes opened. Flight recorder: one
    for the snapshots of the processes that met a trigger (two or more)."""
    saved = set(Path(p) for p in saved)
    mode = (window or {}).get("mode")
    if not mode:
        whole = [Path(pc.path) for pc in procs if _outs(pc) == [Path(pc.path)] and Path(pc.path) in saved]
        return [(out, whole, None)] if len(whole) > 1 and len(whole) == len(procs) else []
    if mode == "flight":
        snaps = [p for pc in procs for p in _outs(pc) if p in saved]
        return [(out, snaps, None)] if len(snaps) > 1 else []
    by_n: Dict[int, List[Path]] = {}
    opened = 0
    for pc in procs:
        ws = getattr(pc.writer, "windows", None) or []
        if ws:
            opened += 1
        for w in ws:
            p = Path(w.get("path", ""))
            if p in saved and isinstance(w.get("n"), int):
                by_n.setdefault(w["n"], []).append(p)
    sets = []
    for n in sorted(by_n):
        members = by_n[n]
        if len(members) < 2:
            continue
        note = None
        if len(members) < opened:
            note = (f"window {n} was opened by {len(members)} of the {opened} processes that opened windows: "
                    f"its manifest names those")
        sets.append((window_manifest_path(out, n), members, note))
    return sets


def _outs(pc) -> List[Path]:
    outs = getattr(pc.writer, "outputs", None)
    return [Path(p) for p in outs] if outs is not None else [Path(pc.path)]


def write_manifest(out: Path, snapshots: List[Path], command: List[str], exact: bool = False) -> Optional[Path]:
    """Write the manifest for `snapshots` (two or more); returns its path, None when it
    could not be written (said on stderr: the snapshots themselves are fine). exact: at
    `out` itself (a window's manifest), else where manifest_path says."""
    if len(snapshots) < 2:
        return None
    path = out if exact else manifest_path(out, snapshots)
    try:
        m = build(snapshots, command)
        save(m, path)
    except Exception as e:      # a snapshot unreadable after all, a full disk
        print(f"cudasnap: warning: group manifest {path} not written: {e}", file=sys.stderr)
        return None
    for u in m.get("unmatched", []):
        print(f"cudasnap: warning: process {u.get('pid')} call #{u.get('seq')}: {u.get('why')}", file=sys.stderr)
    return path
