"""Consumer side of the shared-memory ring written by the shim (layout: shim/ring.h)."""
from __future__ import annotations

import mmap
import os
import struct
import time
from dataclasses import dataclass, field

MAGIC = b"CSRING1\0"
HDR_SIZE = 4096
REC_HDR = struct.Struct("<IIHHIQQQiI")  # len, state, type, nfields, fn, seq, tid, t_ns, result, aux
FIELD_HDR = struct.Struct("<HHI")
assert REC_HDR.size == 48

PAD, PRE, POST, FN, PROC, NOTE, BLOB_PIECE, BLOB_END, EXIT, REGION = range(1, 11)
T_VAL, T_BYTES, T_STR, T_BLOB, T_F64 = range(1, 6)

OFF_CAPACITY, OFF_PID, OFF_PPID, OFF_HEAD, OFF_TAIL = 16, 24, 32, 40, 48
OFF_DROPPED, OFF_BEAT, OFF_STATE, OFF_EXIT, OFF_FNCOUNT, OFF_DIGEST = 64, 72, 80, 84, 104, 112


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
        self.capacity = struct.unpack_from("<Q", self.mm, OFF_CAPACITY)[0]
        self.mask = self.capacity - 1
        self.pid = struct.unpack_from("<Q", self.mm, OFF_PID)[0]
        self.ppid = struct.unpack_from("<Q", self.mm, OFF_PPID)[0]
        self.fn_count = struct.unpack_from("<I", self.mm, OFF_FNCOUNT)[0]
        self.api_digest = bytes(self.mm[OFF_DIGEST:OFF_DIGEST + 72]).split(b"\0")[0].decode()
        self.view = memoryview(self.mm)
        self.tail = struct.unpack_from("<Q", self.mm, OFF_TAIL)[0]

    # header fields the producers update
    def head(self) -> int:
        return struct.unpack_from("<Q", self.mm, OFF_HEAD)[0]

    def dropped(self) -> int:
        return struct.unpack_from("<Q", self.mm, OFF_DROPPED)[0]

    def exited_cleanly(self) -> bool:
        return struct.unpack_from("<I", self.mm, OFF_STATE)[0] == 2

    def beat(self) -> None:
        struct.pack_into("<Q", self.mm, OFF_BEAT, time.monotonic_ns())

    def process_alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # a zombie is dead for our purposes
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as f:
                return f.read().split(b") ", 1)[1][:1] != b"Z"
        except OSError:
            return False

    def poll(self, limit: int = 4096, copy_threshold: int = 1 << 16):
        """Yield up to `limit` published records. Field payloads are copied out of the ring
        (the space is reused once tail moves) except that large ones are yielded as
        memoryviews valid until the next call to poll()."""
        out = []
        mm, view, mask = self.mm, self.view, self.mask
        pending_tail = self.tail
        for _ in range(limit):
            off = HDR_SIZE + (pending_tail & mask)
            ln, state = struct.unpack_from("<II", mm, off + 0)
            if state != 1 or ln < REC_HDR.size:
                break
            (ln, _st, typ, nf, fn, seq, tid, t_ns, result, aux) = REC_HDR.unpack_from(mm, off)
            if typ != PAD:
                rec = RawRecord(typ, fn, seq, tid, t_ns, result, aux)
                p = off + REC_HDR.size
                end = off + ln
                for _f in range(nf):
                    if p + 8 > end:
                        break
                    idx, tag, flen = FIELD_HDR.unpack_from(mm, p)
                    p += 8
                    data = bytes(view[p:p + flen])
                    rec.fields.append((idx, tag, data))
                    p += (flen + 7) & ~7
                out.append(rec)
            # release: clear the header word so the slot reads as unpublished when reused
            struct.pack_into("<II", mm, off, 0, 0)
            pending_tail += ln
        if pending_tail != self.tail:
            self.tail = pending_tail
            struct.pack_into("<Q", mm, OFF_TAIL, pending_tail)
        return out

    def stuck_record(self) -> bool:
        """True when the record at tail was reserved but never published (the producer
        died while writing it)."""
        return self.head() != self.tail

    def skip_unpublished(self) -> bool:
        """After the producer died: step over an unpublished record whose length is known."""
        off = HDR_SIZE + (self.tail & self.mask)
        ln = struct.unpack_from("<I", self.mm, off)[0]
        if ln < REC_HDR.size or ln % 8 or self.tail + ln > self.head():
            return False
        struct.pack_into("<II", self.mm, off, 0, 0)
        self.tail += ln
        struct.pack_into("<Q", self.mm, OFF_TAIL, self.tail)
        return True

    def close(self) -> None:
        try:
            self.view.release()
            self.mm.close()
        except (BufferError, ValueError):
            pass
