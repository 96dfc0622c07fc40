"""Consumer side of the shared-memory ring written by the shim (layout: shim/ring.h)."""
from __future__ import annotations

import mmap
import os
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from . import ring_constants as C
# the wire constants, generated from shim/ring.h (capture/ring_constants.py)
from .ring_constants import (F_T1, F_VALS, INFLIGHT, OFF_CAPACITY, OFF_CLOCK, OFF_CLOCK_NS0,  # noqa: F401
                             OFF_CLOCK_TSC0, OFF_DROPPED, OFF_DROPPED_BYTES, OFF_HEAD, OFF_PID, OFF_PPID,
                             OFF_SEQ, OFF_STATE, OFF_TAIL, OFF_VERSION, PADDING, PUBLISHED, T_BLOB, T_BYTES,
                             T_F64, T_STR, T_VAL, T_VALS)

MAGIC, VERSION, HDR_SIZE = C.RING_MAGIC, C.RING_VERSION, C.RING_HDR
REC_HDR = struct.Struct(C.REC_HDR_FORMAT)   # len, state, type, nfields, fn, seq, tid, t_ns, result, aux
FIELD_HDR = struct.Struct(C.FIELD_HDR_FORMAT)
PAD, PRE, POST, FN, PROC, NOTE = C.REC_PAD, C.REC_PRE, C.REC_POST, C.REC_FN, C.REC_PROC, C.REC_NOTE
BLOB_PIECE, BLOB_END, EXIT, REGION = C.REC_BLOB_PIECE, C.REC_BLOB_END, C.REC_EXIT, C.REC_REGION
CALL, REPEAT, CTX, NVTX = C.REC_CALL, C.REC_REPEAT, C.REC_CTX, C.REC_NVTX
WINDOW, OFF_WIN_REQ = C.REC_WINDOW, C.OFF_WIN_REQ   # window requests: the recorder bumps, the shim acts at its next call
OFF_RECORDER_PID = C.OFF_RECORDER_PID   # the recorder's pid: a state dump waits for space while it lives
OFF_BEAT, OFF_EXIT, OFF_FNCOUNT, OFF_DIGEST = C.OFF_RECORDER_BEAT_NS, C.OFF_EXIT_CODE, C.OFF_FN_COUNT, C.OFF_API_DIGEST
_PAIR_LOCK = threading.Lock()


def state_word(pos: int, kind: int = PUBLISHED) -> int:
    """CS_STATE: the state word of a record of that kind (published, in flight, a pad) at
    ring position pos."""
    return ((((pos >> 3) ^ (pos >> 33)) << 2) & 0xFFFFFFFF) | kind


@dataclass
class RawRecord:
    type: int
    fn: int
    seq: int
    tid: int
    t_ns: int
    result: int
    aux: int
    fields: list = field(default_factory=list)  # (idx, tag, memoryview-or-bytes)
    # set when a field is a view into the ring (poll(pin_blobs=True)): call once when done
    # with it; the ring space is not reused before.
    release: Optional[Callable[[], None]] = None


class Ring:
    """Reads records from one process's ring, in reservation order."""

    def __init__(self, path: str):
        self.path = path
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size < HDR_SIZE:
                raise ValueError(f"{path}: ring file too small")
            self.mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        if self.mm[:8] != MAGIC:
            raise ValueError(f"{path}: not a cudasnap ring")
        version = struct.unpack_from("<I", self.mm, OFF_VERSION)[0]
        if version != VERSION:
            self.mm.close()
            raise ValueError(f"{path}: ring version {version} from the shim, this recorder reads {VERSION}: "
                             f"the preloaded shim comes from another cudasnap build (reinstall: pip install .)")
        self.capacity = struct.unpack_from("<Q", self.mm, OFF_CAPACITY)[0]
        self.mask = self.capacity - 1
        self.pid = struct.unpack_from("<Q", self.mm, OFF_PID)[0]
        self.ppid = struct.unpack_from("<Q", self.mm, OFF_PPID)[0]
        # CLOCK_MONOTONIC (host-wide) when the shim opened the ring, as epoch seconds
        start_ns = struct.unpack_from("<Q", self.mm, C.OFF_START_NS)[0]
        self.started = time.time() - (time.monotonic_ns() - start_ns) / 1e9 if start_ns else None
        self.fn_count = struct.unpack_from("<I", self.mm, OFF_FNCOUNT)[0]
        self.api_digest = bytes(self.mm[OFF_DIGEST:OFF_DIGEST + C.LEN_API_DIGEST]).split(b"\0")[0].decode()
        # record timestamps in TSC ticks: mapped to CLOCK_MONOTONIC ns by the line through the
        # shim's (tsc, ns) pair at ring creation and a fresh pair read here (recalibrate)
        self.tsc = struct.unpack_from("<I", self.mm, OFF_CLOCK)[0] == 1
        self.tsc0, self.ns0 = struct.unpack_from("<QQ", self.mm, OFF_CLOCK_TSC0)
        self._ns_per_tick = 1.0
        self._clock_lib = None
        if self.tsc:
            from cudasnap.shim._shim import lib       # the same code the program ran
            self._clock_lib = lib
            self.recalibrate()
        self.view = memoryview(self.mm)
        # `tail`: where the next record is read. The tail the producers see (OFF_TAIL) may
        # lag behind it while records read with pin_blobs are still in use.
        self.tail = struct.unpack_from("<Q", self.mm, OFF_TAIL)[0]
        self._published = self.tail
        self._pins: dict = {}            # start position -> True, for records still in use
        self._pin_lock = threading.Lock()
        # what a dead producer left unfinished: records stepped over, bytes that could not be read
        self.unpublished_records = 0
        self.unpublished_bytes = 0
        self.unread_bytes = 0

    def recalibrate(self) -> None:
        """Refine the ticks -> ns line with a pair read now (every record decoded after this
        lies between the two pairs, so its error is that of reading a pair, tens of ns)."""
        lib = self._clock_lib
        if lib is None:
            return
        with _PAIR_LOCK:                 # the pair's ns waits in the library for the next call
            t = lib.cs_shim_clock_pair()
            n = lib.cs_shim_clock_ns()
        if t > self.tsc0 + 1000 and n > self.ns0:
            self._ns_per_tick = (n - self.ns0) / (t - self.tsc0)

    def to_ns(self, t: int) -> int:
        """A record timestamp in CLOCK_MONOTONIC ns."""
        if not self.tsc or not t:
            return t
        return self.ns0 + round((t - self.tsc0) * self._ns_per_tick)

    # header fields the producers update
    def head(self) -> int:
        return struct.unpack_from("<Q", self.mm, OFF_HEAD)[0]

    def dropped(self) -> int:
        return struct.unpack_from("<Q", self.mm, OFF_DROPPED)[0]

    def dropped_bytes(self) -> int:
        return struct.unpack_from("<Q", self.mm, OFF_DROPPED_BYTES)[0]

    def seq_issued(self) -> int:
        """Call sequence numbers the shim handed out (every recorded call takes one)."""
        return struct.unpack_from("<Q", self.mm, OFF_SEQ)[0]

    def exited_cleanly(self) -> bool:
        return struct.unpack_from("<I", self.mm, OFF_STATE)[0] == 2

    def request_window(self) -> None:
        """Ask the shim to open/close a window (or take a checkpoint) at its next call."""
        v = struct.unpack_from("<I", self.mm, OFF_WIN_REQ)[0]
        struct.pack_into("<I", self.mm, OFF_WIN_REQ, (v + 1) & 0xFFFFFFFF)

    def beat(self) -> None:
        try:
            struct.pack_into("<Q", self.mm, OFF_BEAT, time.monotonic_ns())
            struct.pack_into("<I", self.mm, OFF_RECORDER_PID, os.getpid())
        except (TypeError, ValueError):     # the ring was closed meanwhile (the process ended)
            pass

    def process_alive(self) -> bool:
        """False once no thread of the process can write to the ring any more. A zombie is
        dead, but a main thread that ended (pthread_exit) leaves a zombie leader while the
        other threads run on: then every thread is looked at."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        if not _zombie(f"/proc/{self.pid}/stat"):
            return True
        try:
            tasks = os.listdir(f"/proc/{self.pid}/task")
        except OSError:
            return False
        return any(not _zombie(f"/proc/{self.pid}/task/{t}/stat") for t in tasks)

    def poll(self, limit: int = 4096, copy_threshold: int = 1 << 16, pin_blobs: bool = False, dead: bool = False):
        """Return up to `limit` published records. Field payloads are copied out of the
        ring, except with pin_blobs: then the payload of a BLOB_PIECE larger than
        copy_threshold is a memoryview into the ring, and the record's `release` must be
        called once when it is no longer needed (from any thread); until then the
        producers cannot reuse that space (they wait, as when the ring is full).
        dead: the producer is gone; a launch record still in flight is read as a PRE
        (its call never returned)."""
        out = []
        mm, view, mask = self.mm, self.view, self.mask
        pending_tail = self.tail
        head = self.head()               # nothing at or past it is a record yet
        pins = []
        for _ in range(limit):
            if pending_tail >= head:
                break
            off = HDR_SIZE + (pending_tail & mask)
            ln, state = struct.unpack_from("<II", mm, off + 0)
            # the state word names the position it was published at: bytes an earlier lap
            # left here never pass for a record
            want = state_word(pending_tail, 0)
            inflight = dead and state == want | INFLIGHT and ln >= REC_HDR.size
            pad = state == want | PADDING and (pending_tail & mask) + ln == self.capacity
            if ((state != want | PUBLISHED and not inflight and not pad) or ln < 8 or ln % 8
                    or pending_tail + ln > head or (pending_tail & mask) + ln > self.capacity):
                break
            # a pad fills the end of the ring: only its length and state are its own
            typ = PAD
            if not pad:
                if ln < REC_HDR.size:
                    break
                (ln, _st, typ, nf, fn, seq, tid, t_ns, result, aux) = REC_HDR.unpack_from(mm, off)
                if inflight:
                    typ = PRE
            if typ != PAD:
                rec = RawRecord(typ, fn, seq, tid, t_ns, result, aux)
                p = off + REC_HDR.size
                end = off + ln
                for _f in range(nf):
                    if p + 8 > end:
                        break
                    idx, tag, flen = FIELD_HDR.unpack_from(mm, p)
                    p += 8
                    if pin_blobs and typ == BLOB_PIECE and flen > copy_threshold and p + flen <= end:
                        data = view[p:p + flen]
                        if rec.release is None:
                            pins.append(pending_tail)
                            rec.release = self._releaser(pending_tail)
                    else:
                        data = bytes(view[p:p + flen])
                    rec.fields.append((idx, tag, data))
                    p += (flen + 7) & ~7
                out.append(rec)
            # clear the header word so the slot reads as unpublished when reused (a pinned
            # record's payload stays intact: the producers' tail has not passed it)
            struct.pack_into("<II", mm, off, 0, 0)
            pending_tail += ln
        if pending_tail != self.tail or pins:
            with self._pin_lock:
                for start in pins:
                    self._pins[start] = True
                self.tail = pending_tail
                self._publish()
        return out

    def _releaser(self, start: int) -> Callable[[], None]:
        def release() -> None:
            with self._pin_lock:
                if self._pins.pop(start, None):
                    self._publish()
        return release

    def _publish(self) -> None:
        """Under _pin_lock: move the producers' tail up to the oldest record still in use."""
        t = next(iter(self._pins)) if self._pins else self.tail
        if t != self._published and not self.mm.closed:
            self._published = t
            struct.pack_into("<Q", self.mm, OFF_TAIL, t)

    def pinned(self) -> int:
        """Records read with pin_blobs and not released yet."""
        return len(self._pins)

    def skip_unpublished(self) -> bool:
        """After the producer died: step over an unpublished record whose length is known
        (counted in unpublished_records/bytes). False when its length is unknown."""
        off = HDR_SIZE + (self.tail & self.mask)
        ln = struct.unpack_from("<I", self.mm, off)[0]
        if ln < 8 or ln % 8 or self.tail + ln > self.head():
            return False
        if ln < REC_HDR.size and (self.tail + ln) & self.mask:
            return False                 # only a pad is that short, and a pad ends the ring
        struct.pack_into("<II", self.mm, off, 0, 0)
        with self._pin_lock:
            self.tail += ln
            self._publish()
        self.unpublished_records += 1
        self.unpublished_bytes += ln
        return True

    def give_up(self) -> int:
        """After the producer died: what is left between tail and head can't be framed
        (a record whose length was never written): count it as unread, return its size."""
        n = max(0, self.head() - self.tail)
        self.unread_bytes += n
        return n

    def close(self) -> None:
        try:
            self.view.release()
            self.mm.close()
        except (BufferError, ValueError):
            pass


def _zombie(stat_path: str) -> bool:
    """A task that has exited (zombie or dead), or is gone."""
    try:
        with open(stat_path, "rb") as f:
            return f.read().rsplit(b") ", 1)[1][:1] in (b"Z", b"X")
    except (OSError, IndexError):
        return True
