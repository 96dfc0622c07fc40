"""`--profile isolated`: each selected launch runs warmup + repeat more times, its memory
restored to the pre-launch contents before every run, as Nsight Compute's kernel replay does.

Which memory a launch writes is not known, so (like NCU) everything it could touch is saved:
every live replayed allocation when they all fit in `save_limit` bytes, else every allocation
a pointer-sized parameter points into.  Saved copies live in device memory (cuMemAlloc +
cuMemcpyDtoD) and are copied back on the launch's stream before each run.  Every run starts
from the pre-launch contents, so after the last one memory holds exactly one application of
the kernel, and replay (with its D2H verification) continues as recorded.

Timing: CUPTI kernel activity records (cupti-python; the same source as timeline mode) give
each run's kernel duration on the GPU, without launch latency or the restore copies.  Each run
is: restore the saved memory (and flush L2 with --flush-l2) on the launch's stream, synchronize,
launch.  Without CUPTI, CUDA events around each run are the fallback (with a warning: they
include launch gaps, so they read higher and spread more).  Spread over the timed repeats is
reported as (max - min) / median (spread_pct) and as the interquartile range (iqr_pct)."""
from __future__ import annotations

import statistics
from typing import Any, Callable, Dict, List, Optional, Tuple

SAVE_KINDS = ("placed", "fallback", "global")


def _merge(ranges: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    out: List[List[int]] = []
    for lo, n in sorted((b, s) for b, s in ranges if s > 0):
        hi = lo + n
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi - lo) for lo, hi in out]


def ranges_for(rp, launches, limit: int) -> List[Tuple[int, int]]:
    """Live (base, size) ranges the given launch events could write."""
    sp = rp.space
    allocs = [a for a in (sp.allocs.values() if sp else []) if a.kind in SAVE_KINDS]
    if allocs and sum(a.size for a in allocs) <= limit:
        return _merge([(a.live_base, a.size) for a in allocs])
    out = []
    for ev in launches:
        raw = ev.rec_params
        for off in range(0, len(raw) - 7, 8):
            v = int.from_bytes(raw[off:off + 8], "little")
            if v < 0x10000:
                continue
            a = sp.find(v) if sp else None
            if a is not None and a.kind in SAVE_KINDS:
                out.append((a.live_base, a.size))
                continue
            live = rp.tr(v)
            try:  # program VMM mappings and memory the placement does not know
                base, size = rp.raw("cuMemGetAddressRange", live)
                out.append((int(base), int(size)))
            except Exception:
                pass
    return _merge(out)


class MemorySaver:
    def __init__(self, rp, ranges: List[Tuple[int, int]]):
        self.rp = rp
        self.ranges = ranges
        self.copies: List[Tuple[int, int, int]] = []      # live, backup, size

    @property
    def nbytes(self) -> int:
        return sum(n for _b, _bk, n in self.copies)

    def save(self) -> None:
        rp = self.rp
        rp.raw("cuCtxSynchronize")
        self.skipped = []
        try:
            for base, n in self.ranges:
                bk = int(rp.raw("cuMemAlloc", n))
                try:
                    rp.raw("cuMemcpyDtoD", bk, base, n)
                except Exception:        # not (or no longer) device memory: nothing a kernel writes
                    rp.raw("cuMemFree", bk)
                    self.skipped.append((base, n))
                    continue
                self.copies.append((base, bk, n))
            rp.raw("cuCtxSynchronize")
        except Exception:
            self.free()
            raise

    def restore(self, stream) -> None:
        for base, bk, n in self.copies:
            self.rp.raw("cuMemcpyDtoDAsync", base, bk, n, stream)

    def keep_only(self, live: List[Tuple[int, int]]) -> int:
        """Drop saved ranges that are no longer inside live memory (freed since the save);
        returns how many were dropped."""
        keep, drop = [], []
        for c in self.copies:
            (keep if any(lo <= c[0] and c[0] + c[2] <= lo + n for lo, n in live) else drop).append(c)
        self.copies = keep
        for _b, bk, _n in drop:
            try:
                self.rp.raw("cuMemFree", bk)
            except Exception:
                pass
        return len(drop)

    def digest(self, backup: bool = False) -> str:
        """sha256 of the saved ranges as they are now (or of the saved copies)."""
        import hashlib
        rp = self.rp
        rp.raw("cuCtxSynchronize")
        h = hashlib.sha256()
        for base, bk, n in self.copies:
            buf = bytearray(n)
            rp.raw("cuMemcpyDtoH", buf, bk if backup else base, n)
            h.update(buf)
        return h.hexdigest()

    def free(self) -> None:
        for _b, bk, _n in self.copies:
            try:
                self.rp.raw("cuMemFree", bk)
            except Exception:
                pass
        self.copies = []


class L2Flusher:
    def __init__(self, rp):
        self.rp = rp
        try:
            l2 = int(rp.raw("cuDeviceGetAttribute", rp.cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, rp.dev))
        except Exception:
            l2 = 0
        self.size = max(2 * l2, 8 << 20)
        self.buf = int(rp.raw("cuMemAlloc", self.size))
        self.n = 0

    def flush(self, stream) -> None:
        self.n += 1
        self.rp.raw("cuMemsetD8Async", self.buf, self.n & 0xFF, self.size, stream)

    def close(self) -> None:
        try:
            self.rp.raw("cuMemFree", self.buf)
        except Exception:
            pass


def stats(times_us: List[float]) -> Dict[str, Any]:
    if not times_us:
        return {}
    med = statistics.median(times_us)
    d = {"median_us": med, "min_us": min(times_us), "max_us": max(times_us), "mean_us": statistics.fmean(times_us)}
    d["spread_pct"] = (d["max_us"] - d["min_us"]) / med * 100 if med > 0 else 0.0
    if len(times_us) >= 4:
        q = statistics.quantiles(times_us, n=4)
        d["iqr_pct"] = (q[2] - q[0]) / med * 100 if med > 0 else 0.0
    return d


EVENT_WARNING = ("isolated: CUPTI (cupti-python) is not available: timing repeats with CUDA events, which include "
                 "launch gaps (higher, noisier times); install cupti-python for kernel durations from CUPTI")


class IsolatedProfiler:
    mode = "isolated"
    label = "isolated profiler"

    def __init__(self, cfg, warn: Callable[[str], None]):
        self.cfg = cfg
        self.warn = warn
        self.rp = None
        self.sel = None
        self.rows: List[Dict[str, Any]] = []
        self.flusher: Optional[L2Flusher] = None
        self.saved_bytes = 0
        self.backend = "events"
        self.cupti = None
        self._next_ext = 1
        self._matched = False

    def on_event(self, kind: str, ev) -> None:
        if kind == "start":
            from . import Selection
            from .timeline import open_cupti
            self.rp = ev.replayer
            self.sel = Selection(self.cfg, self.rp.func_names)
            self.cupti = open_cupti(self.cfg.backend, self.warn)
            if self.cupti is not None:
                self.backend = "cupti"
            else:
                self.warn(EVENT_WARNING)
        elif kind == "before_launch" and self.sel(ev):
            if ev.ctx.capturing:       # recorded into a graph, not run now; syncing would break the capture
                return
            self._save(ev)
        elif kind == "after_launch" and "isolated" in ev.data:
            self._repeat(ev)
        elif kind in ("teardown", "end"):
            if self.flusher is not None:
                self.flusher.close()
                self.flusher = None
            if kind == "end":
                self._finish_cupti()

    def _save(self, ev) -> None:
        rp = self.rp
        saver = MemorySaver(rp, ranges_for(rp, [ev], self.cfg.save_limit))
        try:
            saver.save()
        except Exception as e:
            self.warn(f"isolated: call #{ev.seq} {ev.name}: could not save its memory ({e}); launch not profiled")
            return
        self.saved_bytes = max(self.saved_bytes, saver.nbytes)
        ev.data["isolated"] = saver

    def _repeat(self, ev) -> None:
        rp, cfg = self.rp, self.cfg
        saver: MemorySaver = ev.data.pop("isolated")
        row: Dict[str, Any] = {"seq": ev.seq, "index": ev.index, "name": ev.name, "stream": ev.rec_stream,
                               "grid": list(ev.grid), "block": list(ev.block), "shmem": ev.shmem,
                               "saved_bytes": saver.nbytes}
        evs: List[Tuple] = []
        try:
            if cfg.flush_l2 and self.flusher is None:
                self.flusher = L2Flusher(rp)
            s = ev.stream
            digests: List[str] = []
            if self.cupti is not None:
                exts = []
                for i in range(cfg.warmup + cfg.repeat):
                    # restore (and flush), wait for it, then the run alone: CUPTI times the kernel itself
                    saver.restore(s)
                    if self.flusher is not None:
                        self.flusher.flush(s)
                    rp.raw("cuStreamSynchronize", s)
                    if i < cfg.warmup:
                        ev.ctx.relaunch()
                    else:
                        ext = self._next_ext
                        self._next_ext += 1
                        exts.append(ext)
                        self.cupti.push(ext)
                        try:
                            ev.ctx.relaunch()
                        finally:
                            self.cupti.pop()
                    if cfg.check_repeats and i >= cfg.warmup:
                        digests.append(saver.digest())
                rp.raw("cuStreamSynchronize", s)
                row["_exts"] = exts              # durations arrive with CUPTI's buffers (at the end)
            else:
                for i in range(cfg.warmup + cfg.repeat):
                    # queued back to back (no host wait): the event pair sits right around the kernel
                    saver.restore(s)
                    if self.flusher is not None:
                        self.flusher.flush(s)
                    e0 = rp.raw("cuEventCreate", 0)
                    e1 = rp.raw("cuEventCreate", 0)
                    evs.append((e0, e1) if i >= cfg.warmup else (e0, e1, "warmup"))
                    rp.raw("cuEventRecord", e0, s)
                    ev.ctx.relaunch()
                    rp.raw("cuEventRecord", e1, s)
                    if cfg.check_repeats and i >= cfg.warmup:
                        digests.append(saver.digest())
                rp.raw("cuCtxSynchronize")
                times = [float(rp.raw("cuEventElapsedTime", p[0], p[1])) * 1e3 for p in evs if len(p) == 2]
                row["times_us"] = times
                row.update(stats(times))
            if cfg.check_repeats:
                row["repeats_identical"] = len(set(digests)) <= 1
                if not row["repeats_identical"]:
                    self.warn(f"isolated: call #{ev.seq} {ev.name}: written memory differs between repeats "
                              f"(nondeterministic kernel, or it writes memory outside what was saved)")
        except Exception as e:
            self.warn(f"isolated: call #{ev.seq} {ev.name}: {type(e).__name__}: {e}")
            row["error"] = str(e)
            row.pop("_exts", None)
            try:  # leave memory as one run of the kernel left it, if we can
                rp.raw("cuCtxSynchronize")
            except Exception:
                pass
        finally:
            for p in evs:
                for e in p[:2]:
                    try:
                        rp.cu.cuEventDestroy(e)
                    except Exception:
                        pass
            saver.free()
        self.rows.append(row)

    def _finish_cupti(self) -> None:
        """Match CUPTI kernel records to the timed runs by external correlation id."""
        c = self.cupti
        if c is None or self._matched:
            return
        self._matched = True
        try:
            c.close()
        except Exception as e:
            self.warn(f"isolated: CUPTI flush failed ({type(e).__name__}: {e})")
        dur: Dict[int, Tuple[float, str]] = {}
        for corr, t0, t1, name, _sid in c.kernels:
            ext = c.ext.get(corr)
            if ext is not None:
                dur[ext] = ((t1 - t0) / 1e3, name)
        lost = 0
        for row in self.rows:
            exts = row.pop("_exts", None)
            if exts is None:
                continue
            got = [dur[e] for e in exts if e in dur]
            lost += len(exts) - len(got)
            times = [t for t, _n in got]
            row["times_us"] = times
            if got:
                row["cupti_name"] = got[0][1]
                row.update(stats(times))
        if lost:
            self.warn(f"isolated: {lost} timed run(s) had no CUPTI kernel record")

    def launch_rows(self) -> List[Dict[str, Any]]:
        self._finish_cupti()
        return [{k: v for k, v in r.items() if not k.startswith("_")} for r in self.rows]

    def summary(self) -> Dict[str, Any]:
        ok = [r for r in self.rows if "median_us" in r]
        d = {"mode": "isolated", "backend": self.backend, "launches_profiled": len(ok), "repeat": self.cfg.repeat,
             "warmup": self.cfg.warmup, "flush_l2": self.cfg.flush_l2, "max_saved_bytes": self.saved_bytes}
        if ok:
            d["total_us"] = sum(r["median_us"] for r in ok)
            d["max_spread_pct"] = max(r["spread_pct"] for r in ok)
        return d
