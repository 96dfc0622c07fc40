"""What a long profiler step is doing, on stderr, and how long each of its phases took.

On a terminal: a rich progress bar whose description names the phase (building the graph,
instantiating, timing, checking); on the replay's own bar when that one is live (rich shows one
live display at a time).  Elsewhere, with --progress: one line per phase.  -q or --no-progress:
nothing.  The wall time of every phase is kept either way (`times`, seconds by phase)."""
from __future__ import annotations

import sys
import time
from typing import Any, Dict, Optional


class _Phase:
    def __init__(self, owner: "PhaseProgress", name: str, total: Optional[int]):
        self.owner, self.name, self.total, self.done = owner, name, total, 0
        self.t0 = time.monotonic()

    def advance(self, n: int = 1) -> None:
        self.done += n
        bar = self.owner._bar
        if bar is not None:
            bar.update(self.owner._task, completed=self.done)

    def __enter__(self) -> "_Phase":
        return self

    def __exit__(self, *exc) -> None:
        self.owner._end(self)


class PhaseProgress:
    def __init__(self, label: str, enabled: Optional[bool] = None, quiet: bool = False, shared=None):
        """enabled: --progress/--no-progress (None: on a terminal); shared: a live rich Progress
        to add the task to."""
        self.label = label
        self.times: Dict[str, float] = {}
        self._bar: Any = None
        self._own = False
        self._task = None
        self._lines = False
        if quiet or enabled is False:
            return
        tty = sys.stderr.isatty()
        if not tty:
            self._lines = bool(enabled)
            return
        if shared is not None:
            self._bar = shared
        else:
            try:
                from rich.console import Console
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
                self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), transient=True, console=Console(stderr=True))
                self._bar.start()
                self._own = True
            except Exception:          # another live display: plain lines instead
                self._bar = None
                self._lines = True
                return
        self._task = self._bar.add_task(f"{label}: starting", total=None)

    def phase(self, name: str, total: Optional[int] = None) -> _Phase:
        """A phase; `with` it, advance() as its items are done."""
        if self._bar is not None:
            self._bar.update(self._task, description=f"{self.label}: {name}", total=total, completed=0)
        elif self._lines:
            sys.stderr.write(f"{self.label}: {name}" + (f" ({total:,})" if total else "") + " ...\n")
            sys.stderr.flush()
        return _Phase(self, name, total)

    def record(self, name: str, seconds: float) -> None:
        """A phase timed elsewhere."""
        self.times[name] = self.times.get(name, 0.0) + seconds

    def _end(self, ph: _Phase) -> None:
        self.times[ph.name] = self.times.get(ph.name, 0.0) + (time.monotonic() - ph.t0)

    def close(self) -> None:
        bar, self._bar = self._bar, None
        if bar is None:
            return
        try:
            if self._own:
                bar.stop()
            else:
                bar.remove_task(self._task)
        except Exception:
            pass
