"""What every profiler mode shares: which launches are profiled (Selection), saving and
restoring the memory a launch could write (MemorySaver), and the spread of timed repeats
(stats). A leaf of replay/profile/: it imports no profiler module."""
from __future__ import annotations

import math
import os
import statistics
import struct
from contextlib import nullcontext
from typing import Any, Dict, List, Optional, Tuple

from ..collectives import is_collective
from ..group import ENV_RANK
from ..selection import LaunchSelection


def Selection(cfg, rv, alone_only: bool = False) -> LaunchSelection:
    """Which launches are profiled: the selection of cfg (a ProfileConfig), prepared on the
    replay view rv (after its first pass; -s/-c count the recorded launches, with alone_only
    those that can replay alone: not graph nodes, nor a job's collectives). rv may be a mapping
    of function names (no counting then)."""
    if isinstance(rv, dict):
        return LaunchSelection.of(cfg, rv)
    skip = is_collective if alone_only and os.environ.get(ENV_RANK) else None
    return LaunchSelection.of(cfg, rv.function_names).prepare(rv, alone_only, skip)


def _merge(ranges: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    out: List[List[int]] = []
    for lo, n in sorted((b, s) for b, s in ranges if s > 0):
        hi = lo + n
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi - lo) for lo, hi in out]


def ranges_for(rv, launches, limit: int) -> List[Tuple[int, int]]:
    """Live (base, size) ranges the given launch events could write: everything writable when it
    fits in `limit` bytes, else the ranges their pointer-sized parameters point into."""
    allocs = rv.writable_ranges()
    if allocs and sum(n for _b, n in allocs) <= limit:
        return _merge(allocs)
    words = set()            # each distinct value once: a loop's launches repeat the same pointers
    for ev in launches:
        raw = ev.rec_params
        if len(raw) >= 8:
            words.update(struct.unpack_from(f"<{len(raw) // 8}Q", raw))
    out = []
    for v in sorted(words):
        if v >= 0x10000:
            r = rv.writable_range_of(v)
            if r is not None:
                out.append(r)
    return _merge(out)


class MemorySaver:
    def __init__(self, rv, ranges: List[Tuple[int, int]]):
        self.rv = rv
        self.ranges = ranges
        self.copies: List[Tuple[int, int, int]] = []      # live, backup, size

    @property
    def nbytes(self) -> int:
        return sum(n for _b, _bk, n in self.copies)

    def save(self) -> None:
        rv = self.rv
        rv.call("cuCtxSynchronize")
        self.skipped = []
        try:
            for base, n in self.ranges:
                bk = int(rv.call("cuMemAlloc", n))
                try:
                    rv.call("cuMemcpyDtoD", bk, base, n)
                except Exception:        # not (or no longer) device memory: nothing a kernel writes
                    rv.call("cuMemFree", bk)
                    self.skipped.append((base, n))
                    continue
                self.copies.append((base, bk, n))
            rv.call("cuCtxSynchronize")
        except Exception:
            self.free()
            raise

    def restore(self, stream) -> None:
        for base, bk, n in self.copies:
            self.rv.call("cuMemcpyDtoDAsync", base, bk, n, stream)

    def keep_only(self, live: List[Tuple[int, int]]) -> int:
        """Drop saved ranges that are no longer inside live memory (freed since the save);
        returns how many were dropped."""
        keep, drop = [], []
        for c in self.copies:
            (keep if any(lo <= c[0] and c[0] + c[2] <= lo + n for lo, n in live) else drop).append(c)
        self.copies = keep
        for _b, bk, _n in drop:
            try:
                self.rv.call("cuMemFree", bk)
            except Exception:
                pass
        return len(drop)

    def digest(self, backup: bool = False) -> str:
        """sha256 of the saved ranges as they are now (or of the saved copies)."""
        import hashlib
        rv = self.rv
        rv.call("cuCtxSynchronize")
        h = hashlib.sha256()
        for base, bk, n in self.copies:
            buf = bytearray(n)
            rv.call("cuMemcpyDtoH", buf, bk if backup else base, n)
            h.update(buf)
        return h.hexdigest()

    def free(self) -> None:
        for _b, bk, _n in self.copies:
            try:
                self.rv.call("cuMemFree", bk)
            except Exception:
                pass
        self.copies = []


def replays_alone(prof, ev, mode: str, how: str) -> bool:
    """Can launch ev be replayed alone from saved memory (isolated, metrics)? Not one captured
    into a graph (it does not run now), nor, in a job, a collective (alone it would wait for its
    peers forever: it runs once, in its place). Counts what it leaves out on prof (skipped_captured,
    skipped_collectives) and says the latter once; `how` ends that line."""
    if ev.ctx.capturing:
        prof.skipped_captured += 1
        return False
    if prof.in_job and is_collective(ev.name):
        prof.skipped_collectives += 1
        if prof.skipped_collectives == 1:
            prof.warn(f"{mode}: collective launches ({ev.name[:60]}...) run once, {how}: they wait for their peers")
        return False
    return True


def base_row(ev, saver) -> Dict[str, Any]:
    """The columns every per-launch row of a mode that replays launches from saved memory
    (isolated, metrics) starts with."""
    return {"seq": ev.seq, "index": ev.index, "name": ev.name, "stream": ev.rec_stream,
            "grid": list(ev.grid), "block": list(ev.block), "shmem": ev.shmem, "saved_bytes": saver.nbytes}


def save_before(prof, ev, mode: str) -> None:
    """Save the memory launch ev may write (prof.cfg.save_limit), so that it can be replayed from
    there: the saver goes to ev.data[mode]; a launch whose memory could not be saved gets a row
    with the error (prof: rv, cfg, rows, saved_bytes, warn)."""
    rv = prof.rv
    saver = MemorySaver(rv, ranges_for(rv, [ev], prof.cfg.save_limit))
    try:
        saver.save()
    except Exception as e:
        prof.warn(f"{mode}: call #{ev.seq} {ev.name}: could not save its memory ({e}); launch not profiled")
        prof.rows.append(base_row(ev, saver) | {"error": f"memory not saved: {e}"})
        return
    prof.saved_bytes = max(prof.saved_bytes, saver.nbytes)
    ev.data[mode] = saver


def stats(times_us: List[float]) -> Dict[str, Any]:
    """Spread of the timed repeats, as nvbench computes it: noise_pct is the sample standard
    deviation (n - 1) over the mean; iqr_pct the interquartile range over the median, from
    inclusive quartiles (the sample's own minimum and maximum are quartiles 0 and 4)."""
    if not times_us:
        return {}
    med = statistics.median(times_us)
    n = len(times_us)
    mean = math.fsum(times_us) / n
    d = {"median_us": med, "min_us": min(times_us), "max_us": max(times_us), "mean_us": mean}
    d["spread_pct"] = (d["max_us"] - d["min_us"]) / med * 100 if med > 0 else 0.0
    # in floats: statistics.stdev is exact (fractions) and costs ~100 us a row, seconds for a graph's rows
    sd = math.sqrt(math.fsum((t - mean) ** 2 for t in times_us) / (n - 1)) if n > 1 else 0.0
    d["noise_pct"] = sd / mean * 100 if mean > 0 else 0.0
    if len(times_us) >= 4:
        q = statistics.quantiles(times_us, n=4, method="inclusive")
        d["iqr_pct"] = (q[2] - q[0]) / med * 100 if med > 0 else 0.0
    return d


def destroy_all(cu, made) -> None:
    """Destroy (name, handle) pairs in reverse order of making; errors are ignored (cleanup)."""
    for name, h in reversed(made):
        try:
            getattr(cu, name)(h)
        except Exception:
            pass


class LaunchGate:
    """Holds a stream until the host has issued what follows (cuStreamWaitValue32 on a word of
    mapped host memory that the host then writes).  CUDA events around a graph launch otherwise
    also time the host submitting the graph while the GPU waits for it: ~16 us per launch of a
    small JAX graph, and more for graphs of thousands of nodes.  Gated, the start event marks
    the GPU beginning the graph.  open() returns None where stream memory operations are not
    available (the caller times ungated).

    A launch can wait for the stream it is issued to: a graph of thousands of nodes fills the
    stream's queue, and cuGraphLaunch blocks until the GPU drains it, which a held stream never
    does.  So the hold is released by a timer after RELEASE_AFTER_S whatever the host is doing;
    a gate that had to be released that way is off from then on (`ok` false): its launches are
    timed ungated, which for a graph that large adds a negligible share."""

    RELEASE_AFTER_S = 0.05

    def __init__(self, rv, stream):
        import ctypes
        import threading
        self.rv, self.stream, self.value = rv, stream, 0
        self.released_late = 0
        self._lock = threading.Lock()
        self._timer = None
        self.host = int(rv.call("cuMemHostAlloc", 4, 0x02))          # CU_MEMHOSTALLOC_DEVICEMAP
        self.word = ctypes.c_uint32.from_address(self.host)
        self.word.value = 0
        try:
            self.dptr = rv.call("cuMemHostGetDevicePointer", self.host, 0)
        except Exception:
            self.close()
            raise

    @classmethod
    def open(cls, rv, stream) -> Optional["LaunchGate"]:
        try:
            gate = cls(rv, stream)
        except Exception:
            return None
        try:                      # a trial hold and release: stream memory operations work here
            with gate:
                pass
            rv.call("cuStreamSynchronize", stream)
        except Exception:
            gate.close()
            return None
        return gate

    @property
    def ok(self) -> bool:
        """Never had to be released by its timer: launches issued under it do not block."""
        return self.released_late == 0

    def __enter__(self) -> "LaunchGate":
        import threading
        self.value += 1
        self.rv.call("cuStreamWaitValue32", self.stream, self.dptr, self.value, 0)   # CU_STREAM_WAIT_VALUE_GEQ
        t = threading.Timer(self.RELEASE_AFTER_S, self._release_late, (self.value,))
        t.daemon = True
        self._timer = t
        t.start()
        return self

    def _release_late(self, value: int) -> None:
        with self._lock:
            if self.host and self.word.value < value:     # still issuing: the launch waits for the stream
                self.word.value = value
                self.released_late += 1

    def __exit__(self, *exc) -> None:
        t, self._timer = self._timer, None
        if t is not None:
            t.cancel()
        with self._lock:
            self.word.value = self.value      # released even when issuing failed: never a stuck stream

    @staticmethod
    def launch_timed(rv, gate: Optional["LaunchGate"], exe, stream, e0, e1) -> None:
        """e0, cuGraphLaunch(exe), e1 on stream, issued while `gate` (if any, and ok) holds the
        stream."""
        with gate if gate is not None and gate.ok else nullcontext():
            rv.call("cuEventRecord", e0, stream)
            rv.call("cuGraphLaunch", exe, stream)
            rv.call("cuEventRecord", e1, stream)

    def close(self) -> None:
        t, self._timer = self._timer, None
        if t is not None:
            t.cancel()
        with self._lock:
            host, self.host = self.host, 0
            if host:
                self.word.value = 0xFFFFFFFF  # nothing may still wait on it
        if host:
            try:
                self.rv.call("cuStreamSynchronize", self.stream)
            except Exception:
                pass
            try:
                self.rv.call("cuMemFreeHost", host)
            except Exception:
                pass
