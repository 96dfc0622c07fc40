"""Which launches a replay selects: one object for plain replay (the launches executed) and
for every profile mode (the launches profiled; every call still runs).

Filters, as Nsight Compute names them, all of which a launch must pass:
- `-k/--kernel-name NAME` the kernel's name in the chosen base equals NAME; `regex:RX` searches RX
  in it. `--kernel-name-base function|demangled|mangled` (default function: the bare function
  name, replay/names.py).
- `--kernels RX` a regex searched in the recorded (mangled) name; `--calls SET` a call set
  (formats/callset.py); `--launch SEQ` the launch with that call sequence number.
- `-s/--launch-skip N`, `-c/--launch-count N`: of the launches that pass the filters above,
  counted in recorded call order, skip the first N and then take at most N. Recorded launch
  calls count (those that returned CUDA_SUCCESS), whichever mode replays them, so a
  selection names the same launches in plain replay and in every profile mode."""
from __future__ import annotations

import re
from typing import Any, Callable, Dict, Mapping, Optional, Set

from .names import BASES, name_for


def is_launch_call(f: str) -> bool:
    return f.startswith("cuLaunch") and not f.startswith("cuLaunchHostFunc")


def check(kernels: Optional[str] = None, calls: Optional[str] = None, kernel_name: Optional[str] = None,
          name_base: str = "function", launch_skip: int = 0, launch_count: Optional[int] = None) -> Optional[str]:
    """An error message for options that cannot select, or None."""
    if kernels:
        try:
            re.compile(kernels)
        except re.error as e:
            return f"--kernels: bad regex: {e}"
    if kernel_name is not None:
        if not kernel_name or kernel_name == "regex:":
            return "--kernel-name: give a name, or regex:EXPRESSION"
        if kernel_name.startswith("regex:"):
            try:
                re.compile(kernel_name[6:])
            except re.error as e:
                return f"--kernel-name: bad regex: {e}"
    if name_base not in BASES:
        return f"--kernel-name-base must be one of {', '.join(BASES)}"
    if launch_skip is not None and launch_skip < 0:
        return "--launch-skip must be >= 0"
    if launch_count is not None and launch_count < 1:
        return "--launch-count must be >= 1"
    if calls:
        from cudasnap.formats import parse_callset
        try:
            parse_callset(calls)
        except ValueError as e:
            return f"--calls: {e}"
    return None


class LaunchSelection:
    """Which launches are selected (see the module doc). Counting (-s/-c) needs the recorded
    launches in order: prepare(replayer) reads them once, after the replayer's first pass."""

    def __init__(self, kernels: Optional[str] = None, calls: Optional[str] = None, kernel_name: Optional[str] = None,
                 name_base: str = "function", launch_skip: int = 0, launch_count: Optional[int] = None,
                 launch: Optional[int] = None, func_names: Optional[Mapping[Any, str]] = None):
        err = check(kernels, calls, kernel_name, name_base, launch_skip, launch_count)
        if err:
            raise ValueError(err)
        self.rx = re.compile(kernels) if kernels else None
        self.sel: Optional[Callable] = None
        if calls:
            from cudasnap.formats import parse_callset
            self.sel = parse_callset(calls)
        self.name_base = name_base
        self.kname: Optional[str] = None
        self.kname_rx = None
        if kernel_name is not None:
            if kernel_name.startswith("regex:"):
                self.kname_rx = re.compile(kernel_name[6:])
            else:
                self.kname = kernel_name
        self.launch = launch
        self.skip = int(launch_skip or 0)
        self.count = launch_count
        self.func_names: Mapping[Any, str] = func_names if func_names is not None else {}
        self.chosen: Optional[Set[int]] = None       # counting: the selected launches' seqs
        self.matched = 0                             # counting: launches that passed the filters

    @classmethod
    def of(cls, o, func_names=None) -> "LaunchSelection":
        """From ReplayOptions or ProfileConfig (attributes kernels, calls, kernel_name,
        kernel_name_base, launch_skip, launch_count, launch)."""
        return cls(getattr(o, "kernels", None), getattr(o, "calls", None), getattr(o, "kernel_name", None),
                   getattr(o, "kernel_name_base", None) or "function", getattr(o, "launch_skip", 0) or 0,
                   getattr(o, "launch_count", None), getattr(o, "launch", None), func_names)

    # ------------------------------------------------------------------ what is asked
    @property
    def counting(self) -> bool:
        return bool(self.skip) or self.count is not None

    @property
    def name_filter(self) -> bool:
        return self.rx is not None or self.kname is not None or self.kname_rx is not None

    @property
    def everything(self) -> bool:
        return not self.name_filter and self.sel is None and self.launch is None and not self.counting

    def describe(self) -> str:
        parts = []
        if self.kname is not None:
            parts.append(f"-k {self.kname}")
        if self.kname_rx is not None:
            parts.append(f"-k regex:{self.kname_rx.pattern}")
        if self.kname is not None or self.kname_rx is not None:
            parts.append(f"--kernel-name-base {self.name_base}")
        if self.rx is not None:
            parts.append(f"--kernels {self.rx.pattern}")
        if self.sel is not None:
            parts.append("--calls")
        if self.launch is not None:
            parts.append(f"--launch {self.launch}")
        if self.skip:
            parts.append(f"-s {self.skip}")
        if self.count is not None:
            parts.append(f"-c {self.count}")
        return " ".join(parts)

    # ------------------------------------------------------------------ matching
    def matches_name(self, name: Optional[str]) -> bool:
        """The name filters (-k on its base, --kernels on the recorded name)."""
        name = name or ""
        if self.rx is not None and not self.rx.search(name):
            return False
        if self.kname is not None or self.kname_rx is not None:
            n = name_for(name, self.name_base) or ""
            if self.kname is not None and n != self.kname:
                return False
            if self.kname_rx is not None and not self.kname_rx.search(n):
                return False
        return True

    def _match(self, rec: Mapping[str, Any], name: Optional[str]) -> bool:
        if self.launch is not None and rec.get("s") != self.launch:
            return False
        if self.sel is not None and not self.sel(rec, self.func_names):
            return False
        return self.matches_name(name)

    def prepare(self, rp) -> "LaunchSelection":
        """Counting: walk the replayer's recorded launches in call order and keep the seqs of
        those selected. Names are those the replay resolves (rp.kernel_name_of)."""
        self.func_names = rp.func_names
        if not self.counting or self.chosen is not None:
            return self
        chosen: Set[int] = set()
        n = 0
        hi = None if self.count is None else self.skip + self.count
        for rec in rp.reader.records(("c",)):
            f = rec.get("f") or ""
            if not is_launch_call(f) or rec.get("r", 0) != 0 or rec.get("incomplete") or "r" not in rec:
                continue
            s = rec.get("s")
            if not isinstance(s, int):
                continue
            if not self._match(rec, rp.kernel_name_of((rec.get("a") or {}).get("f"), s)):
                continue
            n += 1
            if n > self.skip and (hi is None or n <= hi):
                chosen.add(s)
            if hi is not None and n >= hi and self.launch is None:
                break
        self.chosen = chosen
        self.matched = n
        return self

    def rec(self, rec: Mapping[str, Any], name: Optional[str]) -> bool:
        """Is this launch record selected (name: its recorded kernel name)?"""
        if self.chosen is not None:
            return rec.get("s") in self.chosen
        return self._match(rec, name)

    def __call__(self, ev) -> bool:
        """A LaunchEvent (replay/events.py)."""
        return self.rec({"k": "c", "s": ev.seq, "f": ev.call, "a": {"f": ev.rec_function}}, ev.name)

    def calls_only(self, rec: Mapping[str, Any]) -> bool:
        """Copies, memsets and graph launches: only --calls selects among them."""
        return self.sel is None or bool(self.sel(rec, self.func_names))
