"""Integrity before work: every frame's checksum verified, in one ordered read, before a
command lets the GPU or its output do anything with a snapshot (replay, export, extract)."""
from __future__ import annotations

import sys
import time
from typing import Optional

from .container import SnapshotError

SHOW_AFTER_S = 1.0          # a progress bar appears once the check has taken this long


class _Bar:
    """A transient rich progress bar on stderr, started only when the check runs long."""

    def __init__(self, label: str, quiet: bool):
        self.t0 = time.monotonic()
        self.label = label
        self.on = not quiet and sys.stderr.isatty()
        self.prog = None
        self.task = None

    def __call__(self, done: int, total: int) -> None:
        if not self.on:
            return
        if self.prog is None:
            if time.monotonic() - self.t0 < SHOW_AFTER_S:
                return
            try:
                from rich.console import Console
                from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                                           TimeRemainingColumn, TransferSpeedColumn)
                self.prog = Progress(TextColumn(self.label), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                                     TimeRemainingColumn(), transient=True, console=Console(stderr=True))
                self.prog.start()
                self.task = self.prog.add_task(self.label, total=total)
            except Exception:       # no terminal features: check without a bar
                self.on = False
                return
        self.prog.update(self.task, completed=done)

    def close(self) -> None:
        if self.prog is not None:
            self.prog.stop()


def check_integrity(reader, quiet: bool = False) -> Optional[str]:
    """None when every frame of the open SnapshotReader verifies; else one line naming the
    first damaged frame (its offset) and what to do. A process's shared reader
    (formats/opened.py) is checked once."""
    done = getattr(reader, "checked", None)
    if done is not None:
        return done or None
    bar = _Bar("checking snapshot integrity", quiet)
    problem = None
    try:
        reader.check_payloads(bar)
    except SnapshotError as e:
        problem = f"{e} (a damaged snapshot: `cudasnap repair` keeps every frame that still reads)"
    finally:
        bar.close()
    if getattr(reader, "shared", False):
        reader.checked = problem or ""
    return problem


def damaged_frames(reader, limit: int = 8, quiet: bool = False) -> list:
    """[(offset, kind, problem)] of frames whose checksum fails (at most limit), reading on
    past each: what `info` reports. A file read by scanning has only the frames that verified."""
    from .container import KIND_NAMES
    bad = []
    frames = list(reader._frames)
    total = frames[-1].end if frames else 0
    bar = _Bar("checking frames", quiet)
    try:
        for fr in frames:
            try:
                reader._read_frame(fr.offset, decode=False)
            except SnapshotError as e:
                msg = str(e)
                prefix = f"{reader.path}: offset {fr.offset}: "
                bad.append((fr.offset, KIND_NAMES.get(fr.kind, "?"), msg[len(prefix):] if msg.startswith(prefix) else msg))
                if len(bad) >= limit:
                    break
            bar(fr.end, total)
    finally:
        bar.close()
    return bad


def damage_warning(reader) -> Optional[str]:
    """One line for commands that read only some frames (dump, stats): the frames whose checksum
    fails, as `info` lists them, or None."""
    bad = damaged_frames(reader, quiet=True)
    if not bad:
        return None
    off, kind, why = bad[0]
    return (f"{reader.path}: {len(bad)}{'+' if len(bad) >= 8 else ''} damaged frame(s), the first a {kind} frame at "
            f"offset {off} ({why}); `cudasnap info` lists them, `cudasnap repair` keeps what still reads")
