"""Capture windows: the recorder's side (the shim's is shim/shim_window.c).

A `WindowRouter` stands where a process's SnapshotWriter stands (the decoder's blob sink
and the recorder's record sink). It keeps the records a replay needs to rebuild the state
at any point (`StateKeeper`: contexts, modules, functions, allocations, streams, events,
graphs, settings; a destroyed object's records leave), and writes one snapshot per window:
the kept state, then the memory contents the shim wrote at the window start (cuMemcpyHtoD
records flagged `state`), then the calls inside the window (formats/SCHEMA.md, "Windows").
The flight recorder (flight.py) drives the same segments from checkpoints and triggers."""
from __future__ import annotations

import collections
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from cudasnap.formats.abi import base_name
from cudasnap.formats.vocab import COLLECTIVE_KERNEL, in_class

_HANDLE_MIN = 0x10000                           # smaller values are counts, flags, enums


_base = base_name


class StateKeeper:
    """The live state's records, in call order. `out` / `val` parameter kinds come from the
    API description: a call's outputs are the handles it made, its inputs the ones it uses."""

    def __init__(self, desc):
        self.desc = desc
        self.calls: "collections.OrderedDict[int, dict]" = collections.OrderedDict()
        self.made: Dict[int, int] = {}                       # handle -> seq of the call that made it
        self.users: Dict[int, set] = collections.defaultdict(set)   # handle -> seqs using it
        self.pending: "collections.OrderedDict[int, int]" = collections.OrderedDict()   # destroy seq -> handle
        self.other: "collections.OrderedDict[Any, dict]" = collections.OrderedDict()    # fn/ctx/proc/region
        self.capturing = 0
        self.capture_calls: Optional[List[int]] = None       # seqs kept inside the one open capture
        self.capture_groups: Dict[int, List[int]] = {}       # EndCapture seq -> its capture's seqs
        self.last_current: Dict[Any, int] = {}               # tid -> seq of its kept cuCtxSetCurrent
        self._kinds: Dict[str, list] = {}
        self._classes: Dict[str, str] = {}                   # ABI name -> window_class (shim/overlay.py)
        self.gets: Dict[tuple, int] = {}                     # identical lookups kept once

    def _class(self, f: str) -> str:
        """The description's window_class of an ABI name (state for a name it does not know)."""
        c = self._classes.get(f)
        if c is None:
            fn = self.desc.by_name(f)
            c = self._classes[f] = (fn or {}).get("window_class") or "state"
        return c

    def _params(self, f: str) -> list:
        ps = self._kinds.get(f)
        if ps is None:
            fn = self.desc.by_name(f)
            ps = self._kinds[f] = [(p["name"], p["kind"]) for p in (fn["params"] if fn else [])]
        return ps

    def _handles(self, rec) -> tuple:
        """(handles made, handles used: [(position among inputs, value)])."""
        a = rec.get("a") or {}
        made, used, i = [], [], 0
        for name, kind in self._params(rec["f"]):
            v = a.get(name)
            if kind == "out":
                if isinstance(v, int) and v >= _HANDLE_MIN:
                    made.append(v)
            elif kind in ("val", "opaque"):
                if isinstance(v, int) and v >= _HANDLE_MIN:
                    used.append((i, v))
                i += 1
        return made, used

    def add_other(self, rec) -> None:
        k = rec["k"]
        key = (k, rec.get("h")) if k in ("fn", "ctx") else (k, len(self.other) if k == "region" else None)
        self.other.pop(key, None)
        self.other[key] = rec

    def feed(self, rec) -> None:
        """One call record (state records flagged by the shim are not state calls)."""
        f = rec.get("f") or ""
        if rec.get("r") != 0 or rec.get("state") or rec.get("incomplete"):
            return
        cls = self._class(f)
        if cls == "capture_begin":
            self.capturing += 1
            # one capture at a time: its calls leave with the graph it makes (several at once
            # interleave on forked streams, so those stay)
            self.capture_calls = [] if self.capturing == 1 else None
        elif cls == "capture_end":
            self.capturing = max(0, self.capturing - 1)
            self._keep(rec)
            if self.capturing == 0 and self.capture_calls is not None:
                self.capture_groups[rec["s"]] = self.capture_calls
            self.capture_calls = None
            return
        if self.capturing:          # a stream capture builds a graph: all of it is state
            self._keep(rec)
            if self.capture_calls is not None:
                self.capture_calls.append(rec["s"])
            return
        if cls == "work":
            return
        if cls in ("destroy", "unmap"):
            self._destroy(rec)
            return
        b = _base(f)
        tid = rec.get("tid")
        if in_class(b, "sets_current"):
            prev = self.last_current.get(tid)
            if prev is not None and next(reversed(self.calls), None) == prev:
                self._drop({prev})              # nothing kept after it: the new one replaces it
            self._keep(rec)
            self.last_current[tid] = rec["s"]
            return
        if in_class(b, "pops_context"):
            last = next(reversed(self.calls), None)
            if last is not None and in_class(self.calls[last]["f"], "pushes_context") and self.calls[last].get("tid") == tid:
                self._drop({last})              # a push/pop pair with nothing between: no state
                return
        if "Get" in b:                  # an identical lookup again (per launch, in some runtimes)
            key = (f, repr(sorted((rec.get("a") or {}).items())))
            if key in self.gets and self.gets[key] in self.calls:
                return
            self.gets[key] = rec["s"]
        self._keep(rec)

    def _keep(self, rec) -> None:
        s = rec["s"]
        self.calls[s] = rec
        made, used = self._handles(rec)
        for h in made:
            self.made[h] = s
        for _i, h in used:
            self.users[h].add(s)

    def _drop(self, seqs: set) -> None:
        seqs = set(seqs)
        for s in list(seqs):            # a captured graph's maker takes its capture along
            seqs.update(self.capture_groups.pop(s, ()))
        for s in seqs:
            rec = self.calls.pop(s, None)
            if rec is None:
                continue
            made, used = self._handles(rec)
            for h in made:
                if self.made.get(h) == s:
                    del self.made[h]
            for _i, h in used:
                u = self.users.get(h)
                if u is not None:
                    u.discard(s)
                    if not u:
                        del self.users[h]
            self.pending.pop(s, None)

    def _closure(self, h: int, unmap: bool) -> Optional[set]:
        """Records to drop when h is destroyed: its maker (not for an unmap) and the calls
        that act on it (h as their first handle input), and so on for what those made; None
        when another kept call still uses one of them (then nothing is dropped)."""
        out: set = set()
        todo = [(h, unmap)]
        while todo:
            x, only_users = todo.pop()
            maker = None if only_users else self.made.get(x)
            if maker is not None:
                out.add(maker)
            for s in list(self.users.get(x, ())):
                if s in out:
                    continue
                _m, used = self._handles(self.calls[s])
                if used and used[0] == (0, x) and _m and in_class(self.calls[s].get("f") or "", "instantiates"):
                    return None            # an executable graph outlives the graph it came from
                if used and used[0] == (0, x):
                    out.add(s)
                    for h2 in _m:
                        todo.append((h2, False))
                elif s != maker:
                    return None            # used by a call that outlives it (a mapping of a released handle...)
        return out

    def _destroy(self, rec) -> None:
        _made, used = self._handles(rec)
        if not used or used[0][0] != 0:
            return                                 # destroys nothing this state knows
        h = used[0][1]
        drop = self._closure(h, self._class(rec["f"]) == "unmap")
        if drop is None:
            self._keep(rec)                        # keep both; dropped once nothing uses it
            self.pending[rec["s"]] = h
            return
        self._drop(drop)
        if drop:
            self._retry()

    def _retry(self) -> None:
        for s, h in list(self.pending.items()):
            if s not in self.calls:
                continue
            drop = self._closure(h, False)
            if drop is not None:
                self._drop(drop | {s})

    def records(self) -> List[dict]:
        """The state as records: identities first, then the kept calls in call order."""
        return list(self.other.values()) + list(self.calls.values())


@dataclass
class Segment:
    """One snapshot being written: a window, or the stretch since a flight-recorder checkpoint."""
    n: int
    path: Path                   # where it is written (flight: a temporary name)
    writer: Any
    why: str = ""
    state_bytes: int = 0
    state_ranges: int = 0
    state_records: int = 0
    calls: int = 0
    t0: float = field(default_factory=time.monotonic)
    first_seq: Optional[int] = None
    last_seq: Optional[int] = None
    blobs: set = field(default_factory=set)
    chunks: set = field(default_factory=set)     # digests given to this segment's writer
    dump: dict = field(default_factory=dict)     # the shim's account of the state dump


def _blob_ids(rec) -> List[str]:
    out = []
    for v in (rec.get("x") or {}).values():
        if isinstance(v, dict) and isinstance(v.get("blob"), str):
            out.append(v["blob"])
    return out


class WindowRouter:
    """Stands in for a process's SnapshotWriter in a windowed capture (module docstring)."""

    CACHE_BYTES = 256 << 20          # recent chunks kept until their blob is known to be state
    takes_state = True               # the decoder says which chunks and blobs are a window state's

    def __init__(self, base: Path, header: dict, desc, make_writer: Callable[[Path, dict], Any], window: dict):
        self.base = Path(base)
        self.header = header
        self.make_writer = make_writer
        self.window = window         # {"spec": str, "mode": str, ...}
        self.state = StateKeeper(desc)
        self.lock = threading.RLock()
        self.blobdefs: Dict[str, tuple] = {}            # blob id -> (size, [digest bytes])
        self.cache: "collections.OrderedDict[bytes, bytes]" = collections.OrderedDict()
        self.cache_bytes = 0
        self.retained: Dict[bytes, bytes] = {}          # chunks of kept state blobs
        self.active: List[Segment] = []                 # newest last
        self.outputs: List[Path] = []
        self.windows: List[dict] = []                   # summaries of written windows
        self.in_state = False                           # between a window's open and its state end
        self.serial = 0
        self.stats: dict = {}
        self.ring = None
        self.decoder = None
        self.chunk_home: Dict[bytes, Segment] = {}      # digest -> the newest segment holding it
        self.nvtx_open: List[dict] = []                 # NVTX ranges open now (push/start records)
        self.missing_chunks = 0
        # the program's records that came while the newest segment's state was still being
        # drained by the shim (shim_window_drain.c): that segment gets them after its state
        self.deferred: List[dict] = []

    # ---------------------------------------------------------------- blob sink
    def put_chunk(self, digest: bytes, data, release=None, state: bool = False) -> str:
        with self.lock:
            digest = bytes(digest)
            targets = self.active[-1:] if state else self.active
            keep = not state
            copy = bytes(data) if (keep or len(targets) > 1 or not targets) else None
            for i, seg in enumerate(targets):
                seg.chunks.add(digest)
                self.chunk_home[digest] = seg
                if copy is None and i == len(targets) - 1:
                    seg.writer.put_chunk(digest, data, release)
                    release = None
                else:
                    seg.writer.put_chunk(digest, copy)
            if release is not None:
                release()
            if keep and digest not in self.retained:
                self.cache[digest] = copy
                self.cache_bytes += len(copy)
                while self.cache_bytes > self.CACHE_BYTES and self.cache:
                    _d, old = self.cache.popitem(last=False)
                    self.cache_bytes -= len(old)
            return digest.hex()

    def add_blob_chunks(self, size: int, digests: List[bytes], state: bool = False) -> str:
        from cudasnap.formats.container import blob_id
        with self.lock:
            digests = [bytes(d) for d in digests]
            bid = blob_id(digests)
            self.blobdefs[bid] = (size, digests)
            for seg in (self.active[-1:] if state else self.active):
                self._define(seg, bid, size, digests)
            return bid

    def _define(self, seg: Segment, bid: str, size: int, digests: List[bytes]) -> bool:
        """Define a blob in a segment, giving it the chunks it lacks (kept in memory, or read
        back from the snapshot that has them: a chunk the shim found unchanged since the last
        state dump comes as a reference only); False when one is nowhere."""
        for dg in digests:
            if dg not in seg.chunks:
                data = self.retained.get(dg) or self.cache.get(dg) or self._fetch(dg)
                if data is None:
                    self.missing_chunks += 1
                    return False
                seg.writer.put_chunk(dg, data)
                seg.chunks.add(dg)
                self.chunk_home[dg] = seg
        seg.writer.add_blob_chunks(size, digests)
        seg.blobs.add(bid)
        return True

    # ---------------------------------------------------------------- records
    def write(self, rec: dict) -> None:
        with self.lock:
            k = rec.get("k")
            if k == "win":
                self._on_window(rec)
                return
            if k == "end":
                self._on_end(rec)
                return
            if k == "c":
                self._on_call(rec)
                return
            if k in ("fn", "ctx", "proc", "region"):
                self.state.add_other(rec)
                self._pin(rec)
            if k == "rep":
                return                      # counts of queries that may lie outside the segment
            if k == "nvtx":
                self._track_nvtx(rec)
            for seg in self._targets():
                seg.writer.write(rec)
            if self.in_state and self.active:
                self.deferred.append(rec)

    def _targets(self) -> List[Segment]:
        """Where a program's record goes now: every open segment, except one whose state is
        still coming (the record waits in `deferred` for it)."""
        if self.in_state and self.active:
            return self.active[:-1]
        return self.active

    def _on_call(self, rec: dict) -> None:
        self.state.feed(rec)
        if rec.get("s") in self.state.calls:
            self._pin(rec)
        targets = self.active[-1:] if rec.get("state") else self._targets()
        for seg in targets:
            self._ensure_blobs(seg, rec)
            seg.writer.write(rec)
            if rec.get("state"):
                seg.state_records += 1
            else:
                seg.calls += 1
                seg.first_seq = rec["s"] if seg.first_seq is None else seg.first_seq
                seg.last_seq = rec["s"]
        if self.in_state and self.active and not rec.get("state"):
            self.deferred.append(rec)
        self._after_call(rec)

    def _write_deferred(self, seg: Segment) -> None:
        recs, self.deferred = self.deferred, []
        for rec in recs:
            if rec.get("k") == "c":
                self._ensure_blobs(seg, rec)
                seg.calls += 1
                seg.first_seq = rec["s"] if seg.first_seq is None else seg.first_seq
                seg.last_seq = rec["s"]
            seg.writer.write(rec)

    def _track_nvtx(self, rec: dict) -> None:
        """NVTX ranges open at any moment, so a window starts inside the ranges it is in."""
        op = rec.get("op")
        if op == "push":
            self.nvtx_open.append(rec)
        elif op == "pop":
            for i in range(len(self.nvtx_open) - 1, -1, -1):
                o = self.nvtx_open[i]
                if o.get("op") == "push" and o.get("tid") == rec.get("tid") and o.get("domain") == rec.get("domain"):
                    del self.nvtx_open[i]
                    break
        elif op == "start":
            self.nvtx_open.append(rec)
        elif op == "end":
            self.nvtx_open = [o for o in self.nvtx_open if not (o.get("op") == "start" and o.get("id") == rec.get("id"))]
        del self.nvtx_open[:-256]          # a program that never pops: keep the newest

    def _after_call(self, rec: dict) -> None:
        """Hook for the flight recorder (triggers on errors)."""

    def _pin(self, rec: dict) -> None:
        for bid in _blob_ids(rec):
            d = self.blobdefs.get(bid)
            if d is None:
                continue
            for dg in d[1]:
                if dg not in self.retained:
                    data = self.cache.get(dg)
                    if data is not None:
                        self.retained[dg] = data

    def _ensure_blobs(self, seg: Segment, rec: dict) -> None:
        """A kept record written into a segment that started after its blob was sent."""
        for bid in _blob_ids(rec):
            if bid in seg.blobs:
                continue
            d = self.blobdefs.get(bid)
            if d is None:
                continue
            self._define(seg, bid, d[0], d[1])

    def _fetch(self, dg: bytes) -> Optional[bytes]:
        """A chunk's data from the segment file that holds it."""
        from cudasnap.formats.container import FRAME_SIZE, decode_payload, parse_frame_header
        seg = self.chunk_home.get(dg)
        if seg is None:
            return None
        cid = dg.hex()
        off = seg.writer._chunk_off.get(cid) if hasattr(seg.writer, "_chunk_off") else None
        if off is None and seg in self.active:
            seg.writer.flush()              # still queued: write it out first
            off = seg.writer._chunk_off.get(cid)
        if off is None:
            return None
        try:
            fd = os.open(seg.path, os.O_RDONLY)
        except OSError:
            return None
        try:
            head = os.pread(fd, FRAME_SIZE, off)
            _kind, codec, raw_len, comp_len, _x, _n = parse_frame_header(head, seg.path, off)
            raw = decode_payload(os.pread(fd, comp_len, off + FRAME_SIZE), codec, raw_len, seg.path, off)
        except Exception:  # a damaged or moved file: the blob is then reported lost
            return None
        finally:
            os.close(fd)
        return bytes(raw[16:]) if bytes(raw[:16]) == dg else None

    # ---------------------------------------------------------------- segments
    def _segment_path(self, n: int) -> Path:
        stem = self.base.name[: -len(".cusnap")] if self.base.name.endswith(".cusnap") else self.base.name
        return self.base.with_name(f"{stem}.w{n}.cusnap")

    def _open_segment(self, n: int, why: str, path: Path, launches: Optional[int] = None) -> Segment:
        hdr = dict(self.header)
        hdr["window"] = {**self.window, "n": n, "why": why, "launch": launches}
        seg = Segment(n, path, self.make_writer(path, hdr), why)
        for rec in self.state.records():
            if rec.get("k") == "c":
                self._ensure_blobs(seg, rec)
            seg.writer.write(rec)
        seg.state_records = len(self.state.calls)
        for rec in self.nvtx_open:          # the ranges the window starts inside
            seg.writer.write(rec)
        self.active.append(seg)
        return seg

    def _on_window(self, rec: dict) -> None:
        op = rec.get("op")
        if op in ("open", "checkpoint"):
            self.serial += 1
            self._start(rec)
            self.in_state = True
        elif op == "state":
            self.in_state = False
            if self.active:
                seg = self.active[-1]
                seg.state_bytes, seg.state_ranges = rec.get("bytes", 0), rec.get("ranges", 0)
                seg.dump = {k: rec[k] for k in ("copied", "referenced", "hashed", "hash_ns", "dump_ns", "pause_ns",
                                                "wait_ns", "spare") if k in rec}
                seg.writer.write(rec)
                self._write_deferred(seg)
            self.deferred = []
        elif op == "close":
            self.in_state = False
            while self.active:
                self._close_segment(self.active.pop(), rec, None)

    def _start(self, rec: dict) -> None:
        """A window opens (the flight recorder overrides: a checkpoint)."""
        while self.active:                 # a window never nests: close what is open
            self._close_segment(self.active.pop(), rec, None)
        seg = self._open_segment(self.serial, rec.get("why", ""), self._segment_path(self.serial), rec.get("launches"))
        seg.writer.write(rec)

    def _close_segment(self, seg: Segment, rec: Optional[dict], end: Optional[dict]) -> None:
        if rec is not None and rec.get("k") == "win":
            seg.writer.write(rec)
        e = dict(end) if end else {"k": "end", "exit": None, "signal": None, "partial": False}
        for key in ("seq_issued", "seq_written", "calls_missing"):
            e.pop(key, None)                # they count the whole run, not this window
        e["window"] = {"n": seg.n, "why": seg.why, "state_bytes": seg.state_bytes, "calls": seg.calls,
                       "ended_by": "program end" if end else (rec or {}).get("why", "")}
        seg.writer.write(e)
        seg.writer.close()
        self.outputs.append(seg.path)
        self.windows.append({"n": seg.n, "path": str(seg.path), "calls": seg.calls, "state_bytes": seg.state_bytes,
                             "state_ranges": seg.state_ranges, "why": seg.why, **seg.dump})

    def _on_end(self, rec: dict) -> None:
        while self.active:
            self._close_segment(self.active.pop(), None, rec)

    # ---------------------------------------------------------------- writer protocol
    def tick(self) -> None:
        """Called often from the recorder's watcher thread (time windows, flight checkpoints)."""

    def flush(self) -> None:
        if not self.lock.acquire(blocking=False):   # busy copying chunks: the next flush will do
            return
        try:
            for seg in self.active:
                seg.writer.flush()
        finally:
            self.lock.release()

    def close(self) -> None:
        with self.lock:
            while self.active:
                self._close_segment(self.active.pop(), None, None)

    def summary(self) -> List[str]:
        if not self.windows:
            return [f"window {self.window.get('spec')}: never opened; no snapshot written"]
        return [f"window {w['n']} ({w['why']}): {w['path']}: {w['calls']:,} calls, state {w['state_bytes']:,} bytes "
                f"in {w['state_ranges']} ranges{copied_note(w)}{_paused(w)}" for w in self.windows]


class TimeWindows(WindowRouter):
    """time:S-E: the recorder asks the shim to open at S and close at E seconds from start."""

    def __init__(self, *a, start_s: float, end_s: float, **kw):
        super().__init__(*a, **kw)
        self.t_start = time.monotonic()
        self.marks = [start_s, end_s]

    def tick(self) -> None:
        if self.ring is None or not self.marks:
            return
        if time.monotonic() - self.t_start >= self.marks[0]:
            self.marks.pop(0)
            try:
                self.ring.request_window()
            except (ValueError, BufferError):     # the ring was closed meanwhile (the end)
                pass


def _paused(w: dict) -> str:
    if not w.get("pause_ns"):
        return ""
    return (f"; program paused {w['pause_ns'] / 1e6:.1f} ms for it"
            + (f", complete after {w['dump_ns'] / 1e6:.1f} ms" if w.get("spare") else ""))


def copied_note(w: dict) -> str:
    if not w.get("referenced"):
        return ""
    return f" ({w.get('copied', 0):,} copied, {w['referenced']:,} unchanged since the previous state)"


LAUNCH_MAX = 2 ** 63 - 1          # the shim counts launches in a signed 64-bit integer


def parse_window_spec(spec: str) -> Dict[str, Any]:
    """`--window SPEC` -> {"mode", "spec", and the mode's values}; ValueError with one line."""
    s = spec.strip()
    kind, _, rest = s.partition(":")
    kind = kind.lower()
    if kind == "launches":
        m = re.fullmatch(r"(\d+)-(\d+)", rest)
        if not m or int(m.group(1)) > int(m.group(2)):
            raise ValueError(f"--window {spec}: launches:A-B needs launch numbers A <= B (from 0)")
        if int(m.group(1)) > LAUNCH_MAX:
            raise ValueError(f"--window {spec}: launch numbers go up to {LAUNCH_MAX}")
        # a B past what the shim counts to means "to the end": it is read as that count
        return {"mode": "launches", "spec": s, "a": int(m.group(1)), "b": min(int(m.group(2)), LAUNCH_MAX)}
    if kind in ("nvtx", "kernel"):
        name, k = rest, 0
        m = re.fullmatch(r"(.*)#\s*([+-]?\d+)", rest)       # #-1 too: refused, not read as a name
        if m:
            name, k = m.group(1), int(m.group(2))
            if k < 1:
                raise ValueError(f"--window {spec}: #K counts from 1")
        if not name:
            raise ValueError(f"--window {spec}: {kind}: needs a {'range name' if kind == 'nvtx' else 'kernel regex'}")
        if kind == "kernel":
            try:
                re.compile(name)
            except re.error as e:
                raise ValueError(f"--window {spec}: the kernel regex does not compile ({e})")
        return {"mode": kind, "spec": s, "name": name, "k": k}
    if kind == "time":
        m = re.fullmatch(r"(\d+(?:\.\d*)?)-(\d+(?:\.\d*)?)", rest)
        if not m or float(m.group(1)) >= float(m.group(2)):
            raise ValueError(f"--window {spec}: time:S-E needs seconds S < E")
        return {"mode": "time", "spec": s, "start": float(m.group(1)), "end": float(m.group(2))}
    if kind in ("signal", "profiler") and not rest:
        return {"mode": kind, "spec": s}
    raise ValueError(f"--window {spec}: not a window (launches:A-B, nvtx:NAME[#K], kernel:REGEX[#K], "
                     f"profiler, signal, time:S-E)")


def window_env(win: Dict[str, Any], context: int = 0) -> Dict[str, str]:
    """The shim's environment for a window (shim_window.c)."""
    mode = win["mode"]
    # in a job, windows open at one cut of the ranks' collective launches (shim_window_jobcut.c)
    env = {"CUDASNAP_WINDOW": "time" if mode == "time" else mode, "CUDASNAP_COLLECTIVE_RX": COLLECTIVE_KERNEL.pattern}
    if mode == "launches":
        env.update(CUDASNAP_WIN_A=str(win["a"]), CUDASNAP_WIN_B=str(win["b"]))
    if mode in ("nvtx", "kernel"):
        env.update(CUDASNAP_WIN_NAME=win["name"], CUDASNAP_WIN_K=str(win["k"]))
    if mode == "kernel":
        env["CUDASNAP_WIN_CONTEXT"] = str(context)
    return env


# what the runner sets itself for the shim, never the user's setting
_RUNNER_VARS = {"CUDASNAP_SESSION", "CUDASNAP_RING_MB", "CUDASNAP_PLACEMENT", "CUDASNAP_LD_PRELOAD",
                "CUDASNAP_DEBUG"}
_WINDOW_VARS = {"CUDASNAP_WINDOW", "CUDASNAP_WIN_A", "CUDASNAP_WIN_B", "CUDASNAP_WIN_NAME", "CUDASNAP_WIN_K",
                "CUDASNAP_WIN_CONTEXT"}


def env_window(environ: Dict[str, str]) -> Optional[Dict[str, Any]]:
    """A window the shim would open from the environment (CUDASNAP_WINDOW and its values), as
    --window gives it, with "from" naming the variables; None when none is set. ValueError
    (one line) for a value that is not a window."""
    mode = environ.get("CUDASNAP_WINDOW")
    if mode is None:
        return None
    m = mode.strip().lower()
    g = environ.get
    said = "CUDASNAP_WINDOW=" + mode + "".join(f" {k}={environ[k]}" for k in sorted(_WINDOW_VARS - {"CUDASNAP_WINDOW"})
                                               if k in environ)
    if m not in ("launches", "nvtx", "kernel", "profiler", "signal"):
        raise ValueError(f"{said}: not a window the shim opens by itself (launches, nvtx, kernel, profiler, "
                         f"signal); unset it, or use --window (time:S-E) or --flight-recorder")
    for k in ("CUDASNAP_WIN_A", "CUDASNAP_WIN_B", "CUDASNAP_WIN_K", "CUDASNAP_WIN_CONTEXT"):
        if k in environ and not environ[k].strip().isdigit():
            raise ValueError(f"{said}: {k}={environ[k]} is not a whole number; unset it or use --window")
    if m == "launches":
        spec = f"launches:{g('CUDASNAP_WIN_A', '0')}-{g('CUDASNAP_WIN_B', str(LAUNCH_MAX))}"
    elif m in ("nvtx", "kernel"):
        spec = f"{m}:{g('CUDASNAP_WIN_NAME', '')}#{g('CUDASNAP_WIN_K', '1')}"
    else:
        spec = m
    try:
        win = parse_window_spec(spec)
    except ValueError as e:
        raise ValueError(f"{said}: not a capture window ({str(e).split(': ', 1)[-1]}); unset it or use --window")
    if m == "kernel":
        try:
            win["context"] = int(g("CUDASNAP_WIN_CONTEXT", "0"))
        except ValueError:
            raise ValueError(f"{said}: CUDASNAP_WIN_CONTEXT is not a number")
    win["from"] = said
    return win


# the shim's other variables: each changes what is recorded or how (tests/test_faults.py keeps
# this list equal to the names the shim's sources read)
SHIM_SETTINGS = {"CUDASNAP_ALL_QUERIES", "CUDASNAP_MAPPED_MEMORY", "CUDASNAP_HOSTMEM_MAX_MB", "CUDASNAP_CLOCK",
                 "CUDASNAP_COPY_THREADS", "CUDASNAP_WIN_HASH", "CUDASNAP_WIN_SPARE", "CUDASNAP_JOB_CUT",
                 "CUDASNAP_JOB_CUT_MS", "CUDASNAP_COLLECTIVE_RX"}


def env_settings(environ: Dict[str, str]) -> Dict[str, str]:
    """The shim's variables set by the user (they change what is recorded): echoed at the
    start and kept in the snapshot's options."""
    return {k: environ[k] for k in sorted(SHIM_SETTINGS) if k in environ}
