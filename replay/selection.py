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
  selection names the same launches in plain replay and in every profile mode.

A selection of nothing is an error (nothing()). A plain replay of part of a snapshot compares
only the D2H results that part determines (StaleResults) and counts the others."""
from __future__ import annotations

import re
from typing import Any, Callable, Dict, Mapping, Optional, Set

from cudasnap.formats.abi import base_name
from cudasnap.formats.layout import recorded_stream
from cudasnap.formats.vocab import in_class, is_launch, selectable

from .names import BASES, name_for


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


def track_capture(rec: Mapping[str, Any], capturing: Set[Any]) -> bool:
    """A successful stream capture begin or end, followed in `capturing` (the recorded streams
    in capture, for launches recorded there: graph nodes, not run then). True when rec was one."""
    if rec.get("r", 0) != 0 or rec.get("incomplete"):
        return False
    b = base_name(rec.get("f") or "")
    if in_class(b, "begins_capture"):
        capturing.add((rec.get("a") or {}).get("hStream"))
        return True
    if in_class(b, "ends_capture"):
        capturing.discard((rec.get("a") or {}).get("hStream"))
        return True
    return False


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
        self.calls_text = calls
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
        self.not_alone = 0                           # counting, alone_only: launches left out

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
            parts.append(f"--calls {self.calls_text}")
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

    def prepare(self, rv, alone_only: bool = False, skip_name: Optional[Callable[[str], bool]] = None) -> "LaunchSelection":
        """Counting: walk the replayer's recorded launches in call order and keep the seqs of
        those selected. Names are those the replay resolves (rv, a ReplayView: kernel_name).
        alone_only (modes that replay each launch alone: metrics): -s/-c count only launches
        that run on their own, not those recorded into a stream capture (graph nodes) nor those
        skip_name refuses (a job's collectives)."""
        self.func_names = rv.function_names
        if not self.counting or self.chosen is not None:
            return self
        chosen: Set[int] = set()
        n = 0
        hi = None if self.count is None else self.skip + self.count
        capturing: Set[Any] = set()
        for rec in rv.snapshot.records(("c",)):
            f = rec.get("f") or ""
            if alone_only and track_capture(rec, capturing):
                continue
            if not is_launch(f) or rec.get("r", 0) != 0 or rec.get("incomplete") or "r" not in rec:
                continue
            s = rec.get("s")
            if not isinstance(s, int):
                continue
            name = rv.kernel_name((rec.get("a") or {}).get("f"), s)
            if not self._match(rec, name):
                continue
            if alone_only and ((capturing and recorded_stream(f, rec.get("a") or {}) in capturing)
                               or (skip_name is not None and skip_name(name or ""))):
                self.not_alone += 1
                continue
            n += 1
            if n > self.skip and (hi is None or n <= hi):
                chosen.add(s)
            if hi is not None and n >= hi and self.launch is None:
                break
        self.chosen = chosen
        self.matched = n
        return self

    def nothing(self, rv) -> Optional[str]:
        """Why this selection selects no recorded work (a launch, or with --calls also a copy,
        memset or graph launch), or None when it selects some. After prepare(rv)."""
        if self.everything:
            return None
        launches = last = 0
        for rec in rv.snapshot.records(("c",)):
            f = rec.get("f") or ""
            if isinstance(rec.get("s"), int):
                last = rec["s"]
            if "r" not in rec or rec.get("incomplete") or rec.get("r", 0) != 0:
                continue
            if is_launch(f):
                launches += 1
                if self.rec(rec, rv.kernel_name((rec.get("a") or {}).get("f"), rec.get("s"))):
                    return None
            elif self.sel is not None and self.launch is None and not self.name_filter and not self.counting \
                    and selectable(f) and self.calls_only(rec):
                return None
        if self.counting and self.matched:
            return (f"-s {self.skip} skips every one of the {self.matched} launch(es) the other filters select"
                    if self.skip >= self.matched else f"{self.describe()}: selects no launch")
        if self.counting and self.not_alone:
            return (f"{self.describe()}: every one of the {self.not_alone} launch(es) the other filters select was "
                    f"recorded into a stream capture (a graph's node) or is a collective, and this mode replays "
                    f"launches alone (--profile isolated and timeline time the program's graph launches)")
        if self.sel is not None and not self.name_filter and self.launch is None:
            return (f"--calls {self.calls_text}: no launch, copy or memset of the snapshot is among those calls "
                    f"(its calls are #0-#{last})")
        return f"{self.describe()}: no launch of the snapshot matches ({launches} launch(es) recorded)"

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


_SKIP_DST_KEYS = ("dstDevice", "dst", "dptr")
_PTR_KEYS = ("dstDevice", "srcDevice", "dst", "src", "ptr", "dptr")


class StaleResults:
    """Which D2H results a partial replay determines. A launch, copy or memset the selection
    leaves out makes what it would have written stale; a selected launch that touches stale
    memory makes every allocation it touches stale too (a kernel's reads and writes are not
    told apart); a copy from stale memory makes its destination stale. A D2H whose source is
    stale is not compared: the work that decides it did not run. Tracked per allocation, the
    grain at which the replay knows what a launch writes; a left-out graph launch (whose
    writes are not known here) makes everything stale. A launch touches what its parameters
    point to and, through pointer tables the host uploaded (arrays of device pointers, as
    batched GEMMs and gathers take), what those point to."""

    LINK_SCAN_MAX = 64 << 10          # uploads scanned for device pointers (pointer tables are small)

    def __init__(self, space_of: Callable[[], Any], read_upload: Optional[Callable[[Any], Optional[bytes]]] = None):
        self._space_of = space_of
        self._read = read_upload
        self._stale: Dict[int, Any] = {}      # id(Alloc) -> Alloc (held, so ids stay unique)
        self._links: Dict[int, list] = {}     # id(Alloc) -> the allocations its uploaded pointers name
        self.everything = False
        self.launch_left_out = False          # a left-out kernel may have written an array (a surface)
        self.left_out = 0

    def _allocs(self, addrs) -> list:
        sp = self._space_of()
        if sp is None:
            return []
        out = []
        for v in addrs:
            if isinstance(v, int) and v >= 0x10000:
                a = sp.find(v)
                if a is not None:
                    out.append(a)
        return out

    @staticmethod
    def _param_words(rec) -> list:
        p = (rec.get("x") or {}).get("params")
        if not isinstance(p, (bytes, bytearray)):
            return []
        p = bytes(p)
        return [int.from_bytes(p[o:o + 8], "little") for o in range(0, len(p) - 7, 8)]

    def _reach(self, allocs) -> list:
        """allocs and what their uploaded pointer tables name, transitively."""
        if not self._links:
            return allocs
        out, seen, todo = [], set(), list(allocs)
        while todo:
            a = todo.pop()
            if id(a) in seen:
                continue
            seen.add(id(a))
            out.append(a)
            todo.extend(self._links.get(id(a), ()))
        return out

    def _upload(self, rec) -> None:
        """An H2D copy: the device pointers its data holds, as links of its destination."""
        a = rec.get("a") or {}
        n = a.get("ByteCount")
        dst = self._allocs([a.get("dstDevice")])
        if not dst or not isinstance(n, int) or n > self.LINK_SCAN_MAX or n < 8:
            return
        data = self._read(rec)
        if not data:
            return
        words = [int.from_bytes(data[o:o + 8], "little") for o in range(0, len(data) - 7, 8)]
        linked = [x for x in self._allocs(words) if x is not dst[0]]
        if linked:
            self._links[id(dst[0])] = list({id(x): x for x in linked}.values())
        else:
            self._links.pop(id(dst[0]), None)

    def _mark(self, allocs) -> None:
        for a in allocs:
            self._stale[id(a)] = a

    def _any(self, allocs) -> bool:
        return self.everything or any(id(a) in self._stale for a in allocs)

    def skipped(self, rec: Mapping[str, Any]) -> None:
        """A launch, copy, memset or graph launch the selection left out."""
        f = rec.get("f") or ""
        a = rec.get("a") or {}
        if is_launch(f):
            self.launch_left_out = True
            self._mark(self._reach(self._allocs(self._param_words(rec))))
        elif "GraphLaunch" in f or "pCopy" in a or not any(k in a for k in _SKIP_DST_KEYS):
            self.everything = True
        else:
            self._mark(self._allocs(a.get(k) for k in _SKIP_DST_KEYS))

    def ran(self, rec: Mapping[str, Any]) -> None:
        """A call the selection kept: carry staleness through launches and device copies."""
        f = rec.get("f") or ""
        if self._read is not None and in_class(f, "h2d_copy"):
            self._upload(rec)
        if not self._stale and not self.everything:
            return
        a = rec.get("a") or {}
        if is_launch(f):
            touched = self._reach(self._allocs(self._param_words(rec)))
            if self._any(touched):
                self._mark(touched)
        elif in_class(f, "copy_group") and not in_class(f, "h2d_copy") and not in_class(f, "d2h_copy"):
            if self._any(self._allocs(a.get(k) for k in ("srcDevice", "src"))):
                self._mark(self._allocs(a.get(k) for k in _SKIP_DST_KEYS))

    def stale(self, src) -> bool:
        """Is a D2H result read from recorded address src ("array": from a CUDA array, which
        surfaces let kernels write unseen) undetermined by the selection? Counts it when so."""
        if src == "array":
            hit = self.everything or self.launch_left_out
        else:
            hit = self.everything or (self._stale and src is not None and self._any(self._allocs([src])))
        if hit:
            self.left_out += 1
            return True
        return False
