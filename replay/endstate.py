"""A window's end state (formats/SCHEMA.md, "endstate" records).

When a capture window closes, the shim hashes every live allocation in 4 MiB chunks with
cs_hash_chunks (shim/hash_kernel.cu; on the host, the same sum, where its module does not
load). After the window's calls, replay hashes the same ranges at their recorded addresses
the same way and compares, so a window without a device-to-host copy still proves that it
reproduced device memory. A difference is a mismatch (exit 1) naming the allocation, the
chunk and the last kernel that wrote it."""
from __future__ import annotations

import ctypes
import re
import struct
from pathlib import Path
from typing import Any, Dict, List, Optional

CHUNK = 4 << 20
_WORDS = CHUNK // 16
_STAGE = 64 << 20
_K1, _K2, _K3, _K4 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 0xD6E8FEB86659FD93
_PARAMS = struct.Struct("<QQQI4xQ")     # cs_hash_chunks(p, nwords, chunk_words, blocks_per_chunk, out)
_BPC, _THREADS = 8, 256


def hash_ptx() -> bytes:
    """The PTX the shim embeds (shim/shim_hash_ptx.h), as its C string literal holds it."""
    from importlib import resources
    try:
        text = resources.files("cudasnap.shim").joinpath("shim_hash_ptx.h").read_text()
    except Exception:
        text = (Path(__file__).resolve().parents[1] / "shim" / "shim_hash_ptx.h").read_text()
    lines = re.findall(r'^\s*"(.*)\\n"', text, flags=re.M)
    return ("\n".join(ln.replace('\\"', '"').replace("\\\\", "\\") for ln in lines) + "\n").encode() + b"\0"


def host_hashes(data, first_word: int = 0, out: Optional[List[int]] = None) -> List[int]:
    """cs_hash_chunks on the host: add the 16-byte words of `data` (a multiple of 16 bytes,
    starting at word `first_word` of the range) into the per-chunk sums `out`."""
    import numpy as np
    w = np.frombuffer(data, dtype="<u8")
    n = len(w) // 2
    out = out if out is not None else []
    pos = 0
    while pos < n:
        word = first_word + pos
        c, inner = divmod(word, _WORDS)
        take = min(n - pos, _WORDS - inner)
        a, b = w[2 * pos:2 * (pos + take):2], w[2 * pos + 1:2 * (pos + take):2]
        i = np.arange(inner, inner + take, dtype=np.uint64)
        h = (a ^ (i * np.uint64(_K1))) * np.uint64(_K2)
        h ^= (b + i) * np.uint64(_K3)
        h ^= h >> np.uint64(31)
        h *= np.uint64(_K4)
        while len(out) <= c:
            out.append(0)
        out[c] = (out[c] + int(h.sum(dtype=np.uint64))) & 0xFFFFFFFFFFFFFFFF
        pos += take
    return out


class _Hasher:
    """Hashes device ranges on the replay device: the kernel where its module loads, else the
    host from D2H copies (the test double, old drivers)."""

    def __init__(self, rp):
        self.rp = rp
        self.fn = None
        self.module = None
        self.where = "host"
        try:
            self.module = rp.ctx.raw("cuModuleLoadData", hash_ptx())
            self.fn = rp.ctx.raw("cuModuleGetFunction", self.module, b"cs_hash_chunks")
            self.where = "GPU"
        except Exception:
            self.fn = None

    def hashes(self, addr: int, n16: int) -> List[int]:
        nch = (n16 + CHUNK - 1) // CHUNK
        if not nch:
            return []
        if self.fn is not None and addr % 16 == 0:
            try:
                return self._gpu(addr, n16, nch)
            except Exception:
                pass
        out: List[int] = [0] * nch
        buf = ctypes.create_string_buffer(min(n16, _STAGE))
        for off in range(0, n16, _STAGE):
            ln = min(_STAGE, n16 - off)
            self.rp.ctx.raw("cuMemcpyDtoH", ctypes.addressof(buf), addr + off, ln)
            host_hashes(memoryview(buf)[:ln], off // 16, out)
        return out

    def _gpu(self, addr: int, n16: int, nch: int) -> List[int]:
        rp = self.rp
        dev = int(rp.ctx.raw("cuMemAlloc", nch * 8))
        try:
            rp.ctx.raw("cuMemsetD8", dev, 0, nch * 8)
            pb = ctypes.create_string_buffer(_PARAMS.pack(addr, n16 // 16, _WORDS, _BPC, dev), _PARAMS.size)
            size = ctypes.c_size_t(_PARAMS.size)
            extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(pb), 2, ctypes.addressof(size), 0)
            rp.ctx.raw("cuLaunchKernel", self.fn, nch * _BPC, 1, 1, _THREADS, 1, 1, 0, 0, None, ctypes.addressof(extra))
            host = ctypes.create_string_buffer(nch * 8)
            rp.ctx.raw("cuMemcpyDtoH", ctypes.addressof(host), dev, nch * 8)
            return list(struct.unpack(f"<{nch}Q", host.raw))
        finally:
            rp.ctx.raw("cuMemFree", dev)

    def close(self) -> None:
        if self.module is not None:
            try:
                self.rp.ctx.raw("cuModuleUnload", self.module)
            except Exception:
                pass


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def check_window(rp) -> Optional[Dict[str, Any]]:
    """After a replay's calls: compare the end state a window snapshot recorded, if any."""
    from cudasnap.formats import SnapshotError
    from .errors import DriverCallError, ReplayError
    try:
        r = rp.ctx.reader              # the replay index's records: no pass over the file
        hdr = r.header or {}
        if not hdr.get("window") or hdr.get("extracted_from"):   # an extract verifies its own results
            return None
        records = list(r.records(["endstate"]))
    except SnapshotError as e:
        raise ReplayError(f"end state: {e}")
    none = next((r["none"] for r in records if isinstance(r.get("none"), str)), None)
    if none:
        rp.ctx.res.endstate = {"ranges": 0, "verified": 0, "bytes": 0, "mismatches": 0, "skipped": none}
        return rp.ctx.res.endstate
    if not records:
        rp.ctx.res.endstate = {"ranges": 0, "verified": 0, "bytes": 0, "mismatches": 0,
                           "skipped": "the window recorded none (it ended with the program, or capture predates it)"}
        return rp.ctx.res.endstate
    try:
        return check(rp, records)
    except DriverCallError as e:
        raise ReplayError(f"end state: {e}")


def check(rp, records: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Compare the recorded end state with the replay device's memory. Returns the account
    (also in rp.ctx.res.endstate): ranges, verified ranges and bytes, where hashed, why not."""
    res = rp.ctx.res
    acct: Dict[str, Any] = {"ranges": len(records), "verified": 0, "bytes": 0, "mismatches": 0, "skipped": None}
    res.endstate = acct
    why_not = None
    if not getattr(rp.selection, "everything", True):
        why_not = "the selection replays only part of the window"
    elif res.errors or rp.incomplete or res.truncated:
        why_not = "the replay did not run every call of the window"
    elif not rp.initialized:
        why_not = "no call of the window reached the device"
    elif getattr(rp.ctx.cu, "sample", None):
        why_not = "a simulator ran part of a launch (--sim-max-ctas): only what its sample wrote is judged"
    if why_not:
        acct["skipped"] = why_not
        return acct
    rp.ensure_init()
    hasher = _Hasher(rp)
    acct["where"] = hasher.where
    try:
        rp.ctx.raw("cuCtxSynchronize")
        for rec in records:
            _one(rp, hasher, rec, acct)
    finally:
        hasher.close()
    return acct


def _one(rp, hasher: _Hasher, rec: Dict[str, Any], acct: Dict[str, Any]) -> None:
    addr, size = rec.get("addr"), rec.get("size")
    h, tail = rec.get("h"), rec.get("tail")
    if not isinstance(addr, int) or not isinstance(size, int) or h is None or rec.get("hash") != "cs_hash_chunks" \
            or rec.get("chunk", CHUNK) != CHUNK:
        acct["unrecorded"] = acct.get("unrecorded", 0) + 1      # capture could not read it
        return
    space = rp.ctx.space
    live = space.translate(addr) if space is not None else addr
    n16 = size & ~15
    want = list(struct.unpack(f"<{len(h) // 8}Q", h))
    got = hasher.hashes(live, n16)
    tail_got = b""
    if tail:
        buf = ctypes.create_string_buffer(len(tail))
        rp.ctx.raw("cuMemcpyDtoH", ctypes.addressof(buf), live + n16, len(tail))
        tail_got = buf.raw
    bad = [c for c in range(len(want)) if c >= len(got) or got[c] != want[c]]
    if tail and tail_got != tail:
        bad.append(len(want))
    if not bad:
        acct["verified"] += 1
        acct["bytes"] += size
        return
    acct["mismatches"] += 1
    c = bad[0]
    lo = c * CHUNK
    hi = min(size, lo + CHUNK) if c < len(want) else size
    alloc = space.find(addr) if space is not None else None
    writer = alloc.last_writer if alloc is not None else None
    exp = struct.pack("<Q", want[c]) if c < len(want) else tail
    gotb = (struct.pack("<Q", got[c]) if c < len(got) else b"") if c < len(want) else tail_got
    from .verify import Mismatch
    m = Mismatch(rp.ctx.res.last_seq or 0, "end state", lo, exp, gotb, len(bad), size, addr, writer,
                 note=f"end-state chunk {c} of {len(want) + (1 if tail else 0)}")
    rp.ctx.res.mismatches.append(m.to_dict())
    w = f"; last written by #{writer[0]} {writer[1]}" if writer else "; no replayed call wrote it"
    rp.ctx.mismatch_text.append(
        f"end state: allocation {addr:#x} ({size} bytes){'' if live == addr else f' (at {live:#x})'}: "
        f"chunk {c} (bytes {lo}-{hi}) differs from the window's close: hash expected {exp.hex()} got {gotb.hex()}; "
        f"{len(bad)} chunk(s) differ{w}" + (f"; {ROUNDING_NOTE}" if _rounding_seen(rp) else ""))


# End-state hashes are exact, so reductions that round differently from run to run change them too.
ROUNDING_NOTE = ("hashes are exact: after D2H results that differed as float rounding does (or CLOSE under a tolerance), "
                 "a program whose reductions round differently from run to run changes them as well")


def _rounding_seen(rp) -> bool:
    return bool(rp.ctx.res.rounding_mismatches) or bool((rp.ctx.res.numerics or {}).get("close")) \
        or not rp.ctx.tol.tol.exact


def summary_line(acct: Optional[Dict[str, Any]]) -> Optional[str]:
    if not acct:
        return None
    if acct.get("skipped"):
        if not acct["ranges"]:
            return f"end state: none recorded: {acct['skipped']}"
        return f"end state: {acct['ranges']} allocation(s) recorded, not compared: {acct['skipped']}"
    line = (f"end state: {acct['verified']} allocation(s), {_mib(acct['bytes'])} verified "
            f"(hashed on the {'GPU' if acct.get('where') == 'GPU' else 'host'})")
    if acct.get("mismatches"):
        line += f", {acct['mismatches']} differ"
    if acct.get("unrecorded"):
        line += f", {acct['unrecorded']} not recorded (capture could not read them)"
    return line
