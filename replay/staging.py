"""Big host-to-device copies of captured blobs.

A BlobPipeline reads the blobs of upcoming H2D copies ahead, in replay order: a producer
thread hands slots of one pool (each page-locked with cuMemHostRegister when a copy first uses
it: that needs a context, the reading starts before one exists) to a pool of threads that read, verify and decompress chunks straight into them
(SnapshotReader.chunk_into: positioned reads and zstd release the GIL). Copies then go out
with cuMemcpyHtoDAsync from the slots on a dedicated stream, one event per slot: a slot goes
back to the readers once its event completed. A synchronous copy waits on an event recorded
on the stream it would have run on before its first chunk, and synchronizes the dedicated
stream before it returns, so nothing that follows can see the device memory early.
Host memory stays at the slot pool (PREFETCH_BYTES, or what the blobs need if less), whatever
the size of the copies.
"""
from __future__ import annotations

import collections
import concurrent.futures
import ctypes
import mmap
import os
import queue
import sys
import threading
import time
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Tuple

from cudasnap.formats import CHUNK_SIZE, SnapshotError, SnapshotReader

PREFETCH_MIN = 8 << 20            # blobs read ahead: at least this big
PREFETCH_BYTES = 256 << 20        # slot pool: read ahead at most this much (CUDASNAP_STAGE_MB)
PINNED_MIN = 16 << 20             # synchronous H2D copies at least this big go through staging
STAGE_SLOTS = 3                   # pinned buffers of the fallback path (no read-ahead)
_SLOT = CHUNK_SIZE                # one chunk per slot
CU_STREAM_NON_BLOCKING = 1
CU_EVENT_DISABLE_TIMING = 2
CU_MEMHOSTREGISTER_PORTABLE = 1
CUDA_ERROR_NOT_READY = 600
CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712


def _pool_bytes() -> int:
    try:
        mb = int(os.environ.get("CUDASNAP_STAGE_MB", "0"))
    except ValueError:
        mb = 0
    return mb << 20 if mb > 0 else PREFETCH_BYTES


def _threads() -> int:
    try:
        n = int(os.environ.get("CUDASNAP_STAGE_THREADS", "0"))
    except ValueError:
        n = 0
    return n if n > 0 else max(2, min(8, os.cpu_count() or 2))


class Slot:
    __slots__ = ("k", "view", "addr")

    def __init__(self, k: int, view: memoryview, addr: int):
        self.k, self.view, self.addr = k, view, addr


class BlobPipeline:
    """Reads the chunks of `order` (blob ids, replay order) ahead into a slot pool."""

    def __init__(self, source, order: List[str], nbytes: Optional[int] = None, threads: Optional[int] = None):
        """source: the replay's reader (chunk_into reads it from any thread), or a path to open."""
        self.order = list(order)
        self.pos = 0                       # next blob the consumer may take
        nslots = max(2, (nbytes or _pool_bytes()) // _SLOT)
        self._mem = mmap.mmap(-1, nslots * _SLOT)
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(self._mem))
        whole = memoryview(self._mem)
        self.slots = [Slot(k, whole[k * _SLOT:(k + 1) * _SLOT], self._base + k * _SLOT) for k in range(nslots)]
        self.nbytes = nslots * _SLOT
        self._free: "queue.Queue[Slot]" = queue.Queue()     # filled once the blobs' sizes are known
        self.q: "queue.Queue" = queue.Queue()
        self._stop = threading.Event()
        self.dead = False
        self.stagers: Dict[int, "Stager"] = {}      # per live context
        # slots are page-locked one by one as copies first use them (cuMemHostRegister needs a
        # context; a small snapshot pins only the few slots it needs)
        self._pinned = [False] * nslots
        # what CUDASNAP_STAGE_STATS=1 prints at the end: copies, bytes, seconds in them, seconds
        # of those spent waiting for the readers
        self.stats = {"copies": 0, "bytes": 0, "copy_s": 0.0, "wait_s": 0.0, "threads": threads or _threads()}
        self._t_start = time.perf_counter()
        self._pin_cu: Any = None
        self._pin_failed = False
        self._tls = threading.local()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads or _threads(),
                                                           thread_name_prefix="cudasnap-stage")
        self._t = threading.Thread(target=self._run, args=(source,), daemon=True, name="cudasnap-prefetch")
        self._t.start()

    # ------------------------------------------------------------------ producer
    def _run(self, source) -> None:
        try:
            self.reader = r = SnapshotReader(source) if isinstance(source, (str, os.PathLike)) else source
        except Exception as e:
            self.dead = True
            self.q.put((-1, None, e))
            return
        try:
            need = 0
            for bid in self.order:
                try:
                    need += len(r.blob_chunk_ids(bid)[1])
                except SnapshotError:
                    pass
            for s in self.slots[:max(1, min(len(self.slots), need))]:
                self._free.put(s)
            for k, bid in enumerate(self.order):
                try:
                    _size, cids = r.blob_chunk_ids(bid)
                except SnapshotError as e:
                    self.q.put((k, None, e))
                    continue
                for cid in cids:
                    slot = self._get_slot()
                    if slot is None:
                        return
                    self.q.put((k, slot, self._pool.submit(self._fill, cid, slot)))
                self.q.put((k, None, None))
                if self._stop.is_set():
                    return
        except Exception as e:  # pragma: no cover - defensive: the consumer falls back
            self.dead = True
            self.q.put((-1, None, e))

    def _get_slot(self) -> Optional[Slot]:
        while True:
            try:
                return self._free.get(timeout=0.1)
            except queue.Empty:
                if self._stop.is_set():
                    return None

    def _fill(self, cid: str, slot: Slot) -> int:
        n, self._tls.scratch = self.reader.chunk_into(cid, slot.view, getattr(self._tls, "scratch", None))
        return n

    def release(self, slot: Slot) -> None:
        self._free.put(slot)

    def stop(self) -> None:
        """Stop reading ahead and give the page-locked memory back (copies still queued are
        waited for first)."""
        if os.environ.get("CUDASNAP_STAGE_STATS") == "1" and not self._stop.is_set():
            st = self.stats
            sys.stderr.write(
                f"cudasnap: staging: {st['copies']} copies, {st['bytes'] / 2**30:.2f} GiB in {st['copy_s']:.2f} s "
                f"({st['bytes'] / max(st['copy_s'], 1e-9) / 1e9:.2f} GB/s), {st['wait_s']:.2f} s of it waiting for "
                f"{st['threads']} readers, {sum(self._pinned)} of {len(self.slots)} slots page-locked, "
                f"{time.perf_counter() - self._t_start:.2f} s since the read-ahead started\n")
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        for st in list(self.stagers.values()):
            st.close()
        self.stagers = {}
        for s in self.slots:
            if self._pinned[s.k]:
                try:
                    self._pin_cu.cuMemHostUnregister(s.addr)
                except Exception:
                    pass
                self._pinned[s.k] = False

    def repin(self) -> None:
        """Forget which slots are page-locked (their context is gone): pin them again on use."""
        self._pinned = [False] * len(self.slots)
        self._pin_failed = False

    def pin(self, slot: Slot, ctx) -> None:
        """Page-lock a slot before its first copy (once; after a failure copies run from
        pageable memory, which is slower but correct)."""
        if self._pinned[slot.k] or self._pin_failed:
            return
        cu = ctx.cu
        try:
            code = int(cu.cuMemHostRegister(slot.addr, _SLOT, CU_MEMHOSTREGISTER_PORTABLE)[0])
            ok = code in (0, CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
        except Exception:
            ok = False
        if ok:
            self._pinned[slot.k], self._pin_cu = True, cu
        else:
            self._pin_failed = True
            ctx.note("staging: could not page-lock the read-ahead buffers; big H2D copies run from pageable memory")

    # ------------------------------------------------------------------ consumer
    def take(self, bid: str) -> Optional["Taken"]:
        """The chunks of `bid` when it is among the blobs still ahead (blobs before it that
        were not taken are dropped), else None."""
        if self.dead:
            return None
        try:
            k = self.order.index(bid, self.pos)
        except ValueError:
            return None
        self.pos = k + 1
        return Taken(self, k)

    def _next(self, k: int, idle: Optional[Callable[[], bool]] = None):
        t0 = time.perf_counter()
        try:
            return self._next_item(k, idle)
        finally:
            self.stats["wait_s"] += time.perf_counter() - t0

    def _next_item(self, k: int, idle: Optional[Callable[[], bool]] = None):
        """The next (slot, future) of blob k, (None, None) at its end. Items of blobs the
        consumer skipped are dropped (their slots freed once filled). idle() is called while
        nothing is ready; it returns True when it freed a slot (the producer may need one)."""
        while True:
            try:
                got, slot, item = self.q.get_nowait()
            except queue.Empty:
                if idle is not None and idle():
                    continue
                try:
                    got, slot, item = self.q.get(timeout=0.5)
                except queue.Empty:
                    if not self._t.is_alive() and self.q.empty():
                        raise SnapshotError("blob read-ahead thread ended early") from None
                    continue
            if got == -1:
                self.dead = True
                raise item
            if got != k:
                if slot is not None:
                    item.add_done_callback(lambda _f, s=slot: self.release(s))
                continue
            if slot is None and isinstance(item, Exception):
                raise item
            return slot, item


class Taken:
    """The chunks of one blob, read ahead: iterate for bytes (a copy each), or slots() for the
    page-locked slots themselves (the caller releases each one)."""

    def __init__(self, pipe: BlobPipeline, k: int):
        self.pipe, self.k = pipe, k
        self.done = False

    def __iter__(self) -> Iterator[bytes]:
        for slot, n in self.slots():
            try:
                data = bytes(slot.view[:n])
            finally:
                self.pipe.release(slot)
            yield data

    def slots(self, idle: Optional[Callable[[], bool]] = None) -> Iterator[Tuple[Slot, int]]:
        while not self.done:
            slot, fut = self.pipe._next(self.k, idle)
            if slot is None:
                self.done = True
                return
            t0 = time.perf_counter()
            try:
                n = fut.result()
            except BaseException:
                self.pipe.release(slot)
                self.done = True
                raise
            finally:
                self.pipe.stats["wait_s"] += time.perf_counter() - t0
            yield slot, n


# ---------------------------------------------------------------------------- staged copies

class Stager:
    """The dedicated stream and per-slot events of one context. A slot whose copy was queued
    stays pending until its event completed (asynchronous copies leave theirs pending after
    they return); the oldest pending slot is waited for whenever the readers need one."""

    def __init__(self, ctx, pipe: BlobPipeline):
        self.ctx, self.pipe, self.cu = ctx, pipe, ctx.cu
        self.stream = ctx.raw("cuStreamCreate", CU_STREAM_NON_BLOCKING)
        self.start = ctx.raw("cuEventCreate", CU_EVENT_DISABLE_TIMING)
        self.events = [ctx.raw("cuEventCreate", CU_EVENT_DISABLE_TIMING) for _ in pipe.slots]
        self.pending: Deque[Slot] = collections.deque()

    def close(self) -> None:
        cu = self.cu
        for s in self.pending:          # copies still queued read the slots: let them finish
            try:
                cu.cuEventSynchronize(self.events[s.k])
            except Exception:
                pass
        self.pending.clear()
        for ev in [self.start] + self.events:
            try:
                cu.cuEventDestroy(ev)
            except Exception:
                pass
        try:
            cu.cuStreamDestroy(self.stream)
        except Exception:
            pass

    def free_one(self) -> bool:
        if not self.pending:
            return False
        s = self.pending.popleft()
        self.ctx.raw("cuEventSynchronize", self.events[s.k])
        self.pipe.release(s)
        return True

    def _queue(self, rec, dst: int, taken: Taken, n: int, stream, mine: Optional[List[Slot]]) -> int:
        ctx = self.ctx
        self.pipe.stats["copies"] += 1
        off = 0
        for slot, m in taken.slots(self.free_one):
            if off + m > n:
                self.pipe.release(slot)
                ctx.fail(rec, f"the H2D payload holds more than the copy's {n} bytes")
            try:
                self.pipe.pin(slot, ctx)
                ctx.drv(rec, "cuMemcpyHtoDAsync", dst + off, slot.addr, m, stream)
                ctx.raw("cuEventRecord", self.events[slot.k], stream)
            except BaseException:
                self.pipe.release(slot)   # never queued: nothing reads it
                raise
            self.pending.append(slot)
            if mine is not None:
                mine.append(slot)
            off += m
            self.pipe.stats["bytes"] += m
        return off

    def copy_sync(self, rec, dst: int, taken: Taken, n: int) -> int:
        """A synchronous H2D copy of the blob `taken` to dst: after the work its stream holds,
        and complete when this returns. Returns the bytes copied."""
        ctx, cu = self.ctx, self.cu
        caller = cu.CUstream(2 if "_ptds" in rec["f"] else 1)    # CU_STREAM_PER_THREAD / LEGACY
        ctx.raw("cuEventRecord", self.start, caller)
        ctx.raw("cuStreamWaitEvent", self.stream, self.start, 0)
        mine: List[Slot] = []
        t0 = time.perf_counter()
        try:
            return self._queue(rec, dst, taken, n, self.stream, mine)
        finally:
            try:
                ctx.raw("cuStreamSynchronize", self.stream)
            finally:
                for s in mine:
                    if s in self.pending:
                        self.pending.remove(s)
                        self.pipe.release(s)
                self.pipe.stats["copy_s"] += time.perf_counter() - t0

    def copy_async(self, rec, dst: int, taken: Taken, n: int, stream) -> int:
        """An asynchronous H2D copy on the program's stream: queued in order there; its slots
        go back once their events completed."""
        t0 = time.perf_counter()
        try:
            return self._queue(rec, dst, taken, n, stream, None)
        finally:
            self.pipe.stats["copy_s"] += time.perf_counter() - t0


def _stager(ctx, pipe: BlobPipeline) -> Optional[Stager]:
    """The pipeline's Stager for the current context."""
    try:
        cu_ctx = int(ctx.raw("cuCtxGetCurrent"))
    except Exception:
        return None
    if not cu_ctx:
        return None
    st = pipe.stagers.get(cu_ctx)
    if st is not None:
        try:
            code = int(ctx.cu.cuStreamQuery(st.stream)[0])
        except Exception:
            code = -1
        if code in (0, CUDA_ERROR_NOT_READY):
            return st
        # the context behind this handle was destroyed (a new one may reuse its value): its
        # stream, events and page-locking went with it, and no copy of it can be in flight
        del pipe.stagers[cu_ctx]
        while st.pending:
            pipe.release(st.pending.popleft())
        pipe.repin()
    try:
        st = pipe.stagers[cu_ctx] = Stager(ctx, pipe)
    except Exception:
        return None
    return st


def h2d_from_blob(ctx, rec, n: int) -> bool:
    """A synchronous H2D copy of a captured blob, chunk by chunk as the blob is read (never the
    whole payload in host memory): through the read-ahead slots when the pipeline holds the
    blob, else through STAGE_SLOTS pinned buffers on the copy's own stream. False when this
    path does not apply (the caller copies the whole payload)."""
    if rec.get("r", 0) != 0 or (ctx.space is not None and ctx.space.moved) or not hasattr(ctx, "blob_chunks"):
        return False
    try:
        got = ctx.blob_chunks(rec, "srcHost")
    except Exception:
        return False
    if got is None or got[0] != n:
        return False
    _size, chunks = got
    dst = ctx.tr(rec["a"].get("dstDevice"))
    try:
        if isinstance(chunks, Taken):
            st = _stager(ctx, chunks.pipe)
            if st is not None:
                off = st.copy_sync(rec, dst, chunks, n)
                if off != n:
                    ctx.fail(rec, f"the H2D payload holds {off} bytes, the copy {n}")
                return True
        off = _copy_chunks(ctx, rec, dst, chunks, n)
    except SnapshotError as e:
        ctx.fail(rec, f"blob for srcHost unreadable: {e}")
    if off != n:
        ctx.fail(rec, f"the H2D payload holds {off} bytes, the copy {n}")
    return True


def h2d_async_from_blob(ctx, rec, n: int, stream) -> bool:
    """An asynchronous H2D copy of a captured blob that the read-ahead holds, through its slots
    on the program's stream (never the whole payload in host memory). False when this path does
    not apply: the caller copies the whole payload."""
    if rec.get("r", 0) != 0 or n < PREFETCH_MIN or (ctx.space is not None and ctx.space.moved) \
            or not hasattr(ctx, "blob_chunks"):
        return False
    try:
        got = ctx.blob_chunks(rec, "srcHost")         # a Taken when the read-ahead holds it
    except Exception:
        return False
    if got is None or got[0] != n or not isinstance(got[1], Taken):
        return False
    dst = ctx.tr(rec["a"].get("dstDevice"))
    st = _stager(ctx, got[1].pipe)
    try:
        if st is None:
            off = _copy_chunks(ctx, rec, dst, got[1], n)     # synchronous, but correct
        else:
            off = st.copy_async(rec, dst, got[1], n, stream)
    except SnapshotError as e:
        ctx.fail(rec, f"blob for srcHost unreadable: {e}")
    if off != n:
        ctx.fail(rec, f"the H2D payload holds {off} bytes, the copy {n}")
    return True


def _copy_chunks(ctx, rec, dst: int, chunks, n: int) -> int:
    stage = _Staging.open(ctx, rec) if n >= PINNED_MIN else None
    off = 0
    try:
        for chunk in chunks:
            m = len(chunk)
            if stage is not None and stage.fits(m):
                stage.copy(dst + off, chunk, m)
            else:
                if stage is not None:
                    stage.drain()
                ctx.drv(rec, "cuMemcpyHtoD", dst + off, chunk, m)
            off += m
        if stage is not None:
            stage.drain()
    finally:
        if stage is not None:
            stage.close()
    return off


class _Staging:
    """STAGE_SLOTS pinned host buffers (cuMemHostAlloc) cycled under cuMemcpyHtoDAsync on the
    synchronous copy's stream (legacy default, or per-thread for _ptds), one event per slot:
    the path of blobs nobody read ahead."""

    def __init__(self, ctx, rec, stream, slot: int):
        self.ctx, self.rec, self.stream, self.slot = ctx, rec, stream, slot
        self.bufs, self.events, self.busy = [], [], []
        self.k = 0

    @classmethod
    def open(cls, ctx, rec):
        cu = ctx.cu
        stream = cu.CUstream(2 if "_ptds" in rec["f"] else 1)    # CU_STREAM_PER_THREAD / CU_STREAM_LEGACY
        st = cls(ctx, rec, stream, CHUNK_SIZE)
        try:
            for _ in range(STAGE_SLOTS):
                st.bufs.append(int(ctx.raw("cuMemHostAlloc", CHUNK_SIZE, 0)))
                st.events.append(ctx.raw("cuEventCreate", CU_EVENT_DISABLE_TIMING))
                st.busy.append(False)
        except Exception:
            st.close()
            return None
        return st

    def fits(self, m: int) -> bool:
        return m <= self.slot

    def copy(self, dst: int, chunk, m: int) -> None:
        k = self.k
        self.k = (k + 1) % len(self.bufs)
        if self.busy[k]:
            self.ctx.raw("cuEventSynchronize", self.events[k])
        ctypes.memmove(self.bufs[k], chunk, m)
        self.ctx.drv(self.rec, "cuMemcpyHtoDAsync", dst, self.bufs[k], m, self.stream)
        self.ctx.raw("cuEventRecord", self.events[k], self.stream)
        self.busy[k] = True

    def drain(self) -> None:
        if any(self.busy):
            self.ctx.drv(self.rec, "cuStreamSynchronize", self.stream)
            self.busy = [False] * len(self.busy)

    def close(self) -> None:
        cu = self.ctx.cu
        if any(self.busy):
            try:
                cu.cuStreamSynchronize(self.stream)
            except Exception:
                pass
        for e in self.events:
            try:
                cu.cuEventDestroy(e)
            except Exception:
                pass
        for b in self.bufs:
            try:
                cu.cuMemFreeHost(b)
            except Exception:
                pass
        self.bufs, self.events, self.busy = [], [], []
