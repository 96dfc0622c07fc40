"""Progress of a long simulation on stderr: kernels done of the total, and elapsed time
(a rich bar on a terminal, plain lines elsewhere once the run has taken a while)."""
from __future__ import annotations

import sys
import time

PLAIN_AFTER_S = 10.0     # plain lines only for simulations this long: short ones stay quiet


class Progress:
    def __init__(self, total: int, mode: str, enabled: bool = True, force: bool = False):
        self.total, self.mode, self.done = total, mode, 0
        self.t0 = time.perf_counter()
        self.enabled = enabled and total > 0
        self.force = force
        self.bar = None
        if self.enabled and sys.stderr.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RP, TextColumn, TimeElapsedColumn
            from rich.console import Console
            self.bar = RP(TextColumn(f"simulating ({mode})"), BarColumn(), MofNCompleteColumn(),
                          TextColumn("kernels"), TimeElapsedColumn(), console=Console(stderr=True), transient=True)
            self.task = self.bar.add_task("sim", total=total)
            self.bar.start()

    def step(self, name: str, secs: float) -> None:
        self.done += 1
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(self.task, completed=min(self.done, self.total))
            if self.done >= self.total:          # gone before the replay's report is printed
                self.close()
            return
        el = time.perf_counter() - self.t0
        if self.force or el >= PLAIN_AFTER_S:
            sys.stderr.write(f"cudasnap: simulated {self.done}/{self.total} kernels ({name}: {secs:.1f} s), "
                             f"{el:.1f} s elapsed\n")
            sys.stderr.flush()

    def note(self, text: str) -> None:
        """A line before a long step (a sampled launch): shown with --progress or on a terminal.
        (GPGPU-Sim's functional mode tells nothing per CTA, so a launch is one step.)"""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.console.print(f"cudasnap: {text}")
        elif self.force:
            sys.stderr.write(f"cudasnap: {text}\n")
            sys.stderr.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
            self.enabled = False
