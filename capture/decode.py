"""Turn raw ring records into schema records (formats/SCHEMA.md), using the API description.

Pre- and post-call records are merged into one call record when the call returns; a call
still open when the process died is written without a result (`r` absent)."""
from __future__ import annotations

import bisect
import os
import struct
from typing import Optional

from cudasnap.formats.vocab import in_class, is_launch

from . import ring as R
from .ring_constants import (F_ATTRS, F_BATCHDST, F_BATCHSRC, F_CODE, F_DIGEST, F_HANDLE, F_HOSTCHECK,  # noqa: F401
                             F_HOSTDST, F_HOSTMEM, F_HOSTSRC, F_IMAGE,
                             F_INFO, F_KIND, F_LAYOUT, F_LINK, F_MODULE, F_MSG, F_NAME, F_PARAMS, F_REPEATS,
                             F_WRAPPED)

LINK_KINDS = {1: "export", 2: "import"}
# fields holding a list of blob references: field -> (x key, each entry's key, counter of bytes)
REF_LISTS = {F_HOSTMEM: ("hostmem", "addr", "h2d_bytes"), F_BATCHSRC: ("batchsrc", "i", "h2d_bytes"),
             F_BATCHDST: ("batchdst", "i", "d2h_bytes")}
EXTRA_NAMES = {F_PARAMS: "params", F_ATTRS: "attrs", F_IMAGE: "image", F_HOSTSRC: "hostsrc", F_HOSTDST: "hostdst",
               F_HOSTCHECK: "hostcheck"}
INFO_ROW = 256 + 16 + 24
WINDOW_OPS = {1: "open", 2: "close", 3: "state", 4: "checkpoint", 5: "endstate"}
ENDSTATE_CHUNK = 4 << 20             # shim_blob.c CS_CHUNK: the end-state hash chunk
NVTX_OPS = {1: "push", 2: "pop", 3: "start", 4: "end", 5: "mark", 6: "domain"}
# pinned host allocations, whose memory kernels can read without an API call (UVA); managed
# memory, and with CUDASNAP_MAPPED_MEMORY=1 pinned memory mapped for the device (DEVICEMAP),
# reached by a launch are recorded with it (shim_hostmem.c)
DEVICEMAP = 2
SIGNED_C = {"int", "long", "short", "long long", "signed char", "int32_t", "int64_t", "ssize_t"}


class Decoder:
    """Stateful per-process decoder: holds open calls and blob serial -> blob id."""

    def __init__(self, desc, blob_sink, clock=None):
        self.fns = sorted(desc.functions, key=lambda f: f["name"])  # same order as the C table
        self.types = desc.types
        self.blob_sink = blob_sink      # put_chunk(digest, data, release), add_blob_chunks(size, digests) -> id (a SnapshotWriter)
        self.clock = clock or (lambda t: t)   # record timestamp -> ns (Ring.to_ns)
        self.blobs: dict[int, tuple[str, int]] = {}
        self.parts: dict[tuple, bytearray] = {}    # (blob serial, chunk index) -> parts so far
        self.open: dict[int, dict] = {}
        self.counts = {"calls": 0, "launches": 0, "h2d_bytes": 0, "d2h_bytes": 0, "blob_bytes": 0, "notes": 0,
                       "host_visible_allocs": 0, "collapsed": 0,
                       # what the snapshot misses, as far as the records tell
                       "undecodable": 0, "lost_payloads": 0, "lost_payload_bytes": 0, "nvtx": 0}
        self.seqs = SeqSet()            # sequence numbers of the call records written
        # NVTX: domain names by id, open push ranges per (thread, domain), open start ranges by id
        self.nvtx_domains: dict[int, str] = {}
        self.nvtx_stacks: dict[tuple, list] = {}
        self.nvtx_started: dict[int, str | None] = {}

    def _value(self, p: dict, data: bytes, i: int):
        """Argument i of an 8-byte-per-value field, as the C type means it."""
        if p.get("float") or p.get("abi_class") in ("float", "sse"):
            return struct.unpack_from("<d", data, 8 * i)[0]
        v = struct.unpack_from("<Q", data, 8 * i)[0]
        size = min(p.get("size", 8), 8)
        if size < 8:
            v &= (1 << (8 * size)) - 1         # the shim stores registers as passed
        if self._signed(p) and v >> (8 * size - 1):
            v -= 1 << (8 * size)               # sign-extend negative ints (priorities...)
        return v

    # the capture's environment is the program's: the shim's setting, as the shim reads it
    mapped = os.environ.get("CUDASNAP_MAPPED_MEMORY", "") == "1"

    def _count(self, name: str, result: int, args: Optional[dict] = None) -> None:
        if is_launch(name):
            self.counts["launches"] += 1
        elif result == 0 and in_class(name, "pins_host") and not (self.mapped and int((args or {}).get("Flags") or 0)
                                                                     & DEVICEMAP):
            self.counts["host_visible_allocs"] += 1

    def _signed(self, p: dict) -> bool:
        ct = p.get("ctype", "")
        if ct in SIGNED_C:
            return True
        t = self.types.get(ct)
        return bool(t and t.get("kind") in ("int", "enum") and t.get("signed"))

    def _blobref(self, data: bytes) -> dict:
        serial, size = struct.unpack_from("<QQ", data)
        ent = self.blobs.get(serial)
        if ent is None:
            if serial or size:           # (serial 0 and size 0: a NULL buffer, nothing to send)
                self.counts["lost_payloads"] += 1
                self.counts["lost_payload_bytes"] += size
            return {"blob": None, "size": size, "lost": True}
        return {"blob": ent[0], "size": ent[1]}

    def _emit(self, call: dict) -> None:
        self.counts["calls"] += 1
        self.seqs.add(call["s"])

    def _fields(self, fn: dict, rec: R.RawRecord, args: dict, extra: dict, post: bool) -> None:
        params = fn["params"]
        for idx, tag, data in rec.fields:
            if tag == R.T_VALS:
                for i, p in enumerate(params[: len(data) // 8]):
                    args[p["name"]] = self._value(p, data, i)
                continue
            if idx >= 0x100:
                if idx in EXTRA_NAMES:
                    extra[EXTRA_NAMES[idx]] = self._blobref(data) if tag == R.T_BLOB else data
                elif idx == F_WRAPPED:
                    wid = struct.unpack("<q", data)[0]
                    extra["wrapped"] = self.fns[wid]["name"] if 0 <= wid < len(self.fns) else None
                elif idx in REF_LISTS:
                    # {u64 key, blob serial, size} each: managed memory a launch reaches (its base),
                    # a batch of copies' host sources and destinations (the copy's index)
                    name, key, count = REF_LISTS[idx]
                    refs = [{key: struct.unpack_from("<Q", data, o)[0], **self._blobref(data[o + 8:o + 24])}
                            for o in range(0, len(data) - 23, 24)]
                    extra[name] = refs
                    self.counts[count] += sum(m["size"] for m in refs)
                elif idx == F_LINK and len(data) >= 64:
                    extra["link"] = _link(data)
                continue
            if idx >= len(params):
                continue
            p = params[idx]
            name = p["name"]
            if tag == R.T_VAL:
                if not post:
                    args[name] = self._value(p, data, 0)
            elif tag == R.T_F64:
                args[name] = struct.unpack("<d", data)[0]
            elif tag == R.T_STR:
                args[name] = data.decode("utf-8", "replace")
            elif tag == R.T_BLOB:
                ref = self._blobref(data)
                extra[name] = ref
                key = "d2h_bytes" if post else "h2d_bytes"
                self.counts[key] += ref["size"]
            elif tag == R.T_BYTES:
                if post and p["kind"] == "out" and len(data) <= 8:
                    args[name] = int.from_bytes(data, "little")
                elif post and p["kind"] in ("inout_struct",):
                    extra[name + ".out"] = data
                else:
                    args[name] = data

    def feed(self, rec: R.RawRecord) -> list[dict]:
        """Consume one raw record; return schema records now complete."""
        t = rec.type
        rec.t_ns = self.clock(rec.t_ns)
        if t == R.BLOB_PIECE:
            # one new chunk with its digest (the shim hashed it); a payload still in the ring
            # comes with rec.release: the sink calls it once done
            release, rec.release = rec.release, None
            d = {idx: data for idx, _tag, data in rec.fields}
            if F_DIGEST not in d or F_CODE in d:
                # a chunk sent in parts (a ring too small for it): gathered until the last one
                key = (rec.seq, rec.aux)
                buf = self.parts.setdefault(key, bytearray())
                buf += d.get(0, b"")
                if release is not None:
                    release()
                if F_DIGEST not in d:
                    return []
                data, release = bytes(self.parts.pop(key)), None
            else:
                data = d.get(0, b"")
            if rec.fn == 1 and getattr(self.blob_sink, "takes_state", False):   # a window state's
                self.blob_sink.put_chunk(bytes(d.get(F_DIGEST, b"")), data, release, state=True)
            else:
                self.blob_sink.put_chunk(bytes(d.get(F_DIGEST, b"")), data, release)
            return []
        if t == R.BLOB_END:
            d = {idx: data for idx, _tag, data in rec.fields}
            size = struct.unpack("<Q", d[0])[0] if 0 in d else 0
            digests = bytes(d.get(F_DIGEST, b""))
            chunks = [digests[i:i + 16] for i in range(0, len(digests), 16)]
            if rec.fn == 1 and getattr(self.blob_sink, "takes_state", False):
                bid = self.blob_sink.add_blob_chunks(size, chunks, state=True)
            else:
                bid = self.blob_sink.add_blob_chunks(size, chunks)
            self.blobs[rec.seq] = (bid, size)
            self.counts["blob_bytes"] += size
            return []
        if t == R.PRE:
            if rec.fn >= len(self.fns):
                self.counts["undecodable"] += 1
                return [{"k": "note", "level": "warning", "msg": f"call to unknown API id {rec.fn}"}]
            fn = self.fns[rec.fn]
            args: dict = {}
            extra: dict = {}
            self._fields(fn, rec, args, extra, post=False)
            call = {"k": "c", "s": rec.seq, "tid": rec.tid, "t0": rec.t_ns, "f": fn["name"], "a": args}
            if extra:
                call["x"] = extra
            if rec.aux == 2:
                call["state"] = True     # written by the shim at a window start (shim_window.c)
            self.open[rec.seq] = call
            return []
        if t == R.CALL:
            if rec.fn >= len(self.fns):
                self.counts["undecodable"] += 1
                return []
            fn = self.fns[rec.fn]
            args, extra = {}, {}
            self._fields(fn, rec, args, extra, post=True)
            t1 = next((self.clock(struct.unpack("<Q", data)[0]) for idx, _tag, data in rec.fields if idx == R.F_T1),
                      rec.t_ns)
            call = {"k": "c", "s": rec.seq, "tid": rec.tid, "t0": rec.t_ns, "t1": t1, "f": fn["name"],
                    "a": args, "r": rec.result}
            if extra:
                call["x"] = extra
            self._emit(call)
            self._count(fn["name"], rec.result, args)
            return [call]
        if t == R.POST:
            call = self.open.pop(rec.seq, None)
            if call is None:
                return []                # its PRE is missing: the call counts as missing
            if rec.fn >= len(self.fns):
                self.counts["undecodable"] += 1
                self.open[rec.seq] = call
                return []
            fn = self.fns[rec.fn]
            extra = call.setdefault("x", {})
            self._fields(fn, rec, call["a"], extra, post=True)
            if not extra:
                del call["x"]
            call["t1"] = rec.t_ns
            call["r"] = rec.result
            self._emit(call)
            self._count(fn["name"], rec.result, call["a"])
            return [call]
        if t == R.FN:
            d = {idx: data for idx, _tag, data in rec.fields}
            lay = d.get(F_LAYOUT, b"")
            pairs = list(struct.iter_unpack("<II", lay[: len(lay) // 8 * 8]))
            return [{
                "k": "fn",
                "h": struct.unpack("<Q", d[F_HANDLE])[0] if F_HANDLE in d else 0,
                "kind": "kernel" if (F_KIND in d and struct.unpack("<Q", d[F_KIND])[0] == 1) else "function",
                "module": struct.unpack("<Q", d[F_MODULE])[0] if F_MODULE in d else None,
                "name": d.get(F_NAME, b"").decode("utf-8", "replace"),
                "params": [list(p) for p in pairs],
            }]
        if t == R.PROC:
            d = {idx: data for idx, _tag, data in rec.fields}
            ver = struct.unpack("<Q", d.get(F_CODE, bytes(8)))[0]
            info = d.get(F_INFO, b"")
            gpus = []
            for i in range(len(info) // INFO_ROW):
                row = info[i * INFO_ROW:(i + 1) * INFO_ROW]
                maj, mnr, mem = struct.unpack_from("<iiQ", row, 272)
                gpus.append({
                    "index": i,
                    "name": row[:256].split(b"\0")[0].decode("utf-8", "replace"),
                    "uuid": "GPU-" + _uuid(row[256:272]),
                    "cc": [maj, mnr],
                    "mem": mem,
                })
            return [{"k": "proc", "driver_version": ver, "gpus": gpus}]
        if t == R.NOTE:
            self.counts["notes"] += 1
            msg = rec.fields[0][2].decode("utf-8", "replace") if rec.fields else ""
            return [{"k": "note", "level": "warning", "msg": msg, "t": rec.t_ns}]
        if t == R.REGION:
            d = {idx: data for idx, _tag, data in rec.fields}
            return [{"k": "region", "base": struct.unpack("<Q", d[F_HANDLE])[0],
                     "size": struct.unpack("<Q", d[F_CODE])[0], "purpose": "placement"}]
        if t == R.CTX:
            d = {idx: data for idx, _tag, data in rec.fields}
            dev = struct.unpack("<q", d.get(F_CODE, b"\xff" * 8))[0]
            return [{"k": "ctx", "h": struct.unpack("<Q", d[F_HANDLE])[0] if F_HANDLE in d else 0,
                     "device": dev if dev >= 0 else None,
                     "primary": {0: False, 1: True}.get(struct.unpack("<Q", d.get(F_KIND, bytes(8)))[0])}]
        if t == R.REPEAT:
            data = rec.fields[0][2] if rec.fields else b""
            calls = []
            for fid, n, of in struct.iter_unpack("<IIQ", data[: len(data) // 16 * 16]):
                if fid < len(self.fns) and n:
                    calls.append({"f": self.fns[fid]["name"], "of": of, "n": n})
                    self.counts["calls"] += n
                    self.counts["collapsed"] += n
            return [{"k": "rep", "tid": rec.tid, "t": rec.t_ns, "calls": calls}] if calls else []
        if t == R.NVTX:
            return self._nvtx(rec)
        if t == R.WINDOW:
            d = {idx: data for idx, _tag, data in rec.fields}
            val = lambda k: struct.unpack("<Q", d[k])[0] if k in d else 0
            if rec.fn == 5:             # a live range's hashes when a window closed (shim_window.c)
                return [{"k": "endstate", "n": rec.seq, "why": bytes(d.get(F_MSG, b"")).decode("utf-8", "replace"),
                         "addr": val(F_CODE), "size": val(F_KIND), "launches": val(F_HANDLE),
                         "hash": "cs_hash_chunks", "chunk": ENDSTATE_CHUNK,
                         "h": bytes(d[F_INFO]) if F_INFO in d else None,
                         "tail": bytes(d[F_LAYOUT]) if F_LAYOUT in d else None}]
            return [{"k": "win", "op": WINDOW_OPS.get(rec.fn, str(rec.fn)), "n": rec.seq,
                     "why": bytes(d.get(F_MSG, b"")).decode("utf-8", "replace"), "bytes": val(F_CODE),
                     "ranges": val(F_KIND), "launches": val(F_HANDLE), "t": rec.t_ns,
                     **_dump_stats(bytes(d.get(F_INFO, b"")))}]
        if t == R.EXIT:
            return []
        return []

    def _nvtx(self, rec: R.RawRecord) -> list[dict]:
        """An NVTX event (shim_nvtx.c). A pop or an end carries no message: it gets the name of
        the range it closes (the thread's innermost push of that domain, the start of that id)."""
        d = {idx: data for idx, _tag, data in rec.fields}
        name = d[F_NAME].decode("utf-8", "replace") if F_NAME in d else None
        dom_id = struct.unpack("<Q", d[F_HANDLE])[0] if F_HANDLE in d else 0
        op = NVTX_OPS.get(rec.fn)
        if op is None:
            self.counts["undecodable"] += 1
            return []
        if op == "domain":
            self.nvtx_domains[rec.seq] = name or ""
            return []
        domain = self.nvtx_domains.get(dom_id, f"domain {dom_id}") if dom_id else None
        if op == "push":
            self.nvtx_stacks.setdefault((rec.tid, dom_id), []).append(name)
        elif op == "pop":
            st = self.nvtx_stacks.get((rec.tid, dom_id))
            name = st.pop() if st else None
        elif op == "start":
            self.nvtx_started[rec.seq] = name
        elif op == "end":
            name = self.nvtx_started.pop(rec.seq, None)
        self.counts["nvtx"] += 1
        return [{"k": "nvtx", "op": op, "name": name, "domain": domain, "id": rec.seq, "tid": rec.tid,
                 "t": rec.t_ns}]

    def finish(self) -> list[dict]:
        """Calls that never returned (the program died inside them), in entry order."""
        out = []
        for seq in sorted(self.open):
            call = self.open[seq]
            call["incomplete"] = True
            out.append(call)
            self._emit(call)
        self.open.clear()
        n = self.counts["host_visible_allocs"]
        if n:
            # named limitation: kernels can read these without an API call, and capture does
            # not snapshot them at launches
            out.append({"k": "note", "level": "warning", "msg":
                        f"limitation: {n} host-visible allocation(s) (pinned/mapped host memory); "
                        f"what kernels read from them directly, without a copy call, is not captured"})
            self.counts["notes"] += 1
        return out


def _dump_stats(b: bytes) -> dict:
    """A window state record's account (shim_window.c): bytes copied D2H, bytes referenced
    unchanged from the previous state, bytes hashed on the GPU, hashing and dump time (until
    the state was drained); then the program's pause, the wait for the previous state's
    drain and the spare device memory used."""
    if len(b) < 40:
        return {}
    copied, referenced, hashed, hash_ns, dump_ns = struct.unpack_from("<5Q", b)
    out = {"copied": copied, "referenced": referenced, "hashed": hashed, "hash_ns": hash_ns, "dump_ns": dump_ns}
    if len(b) >= 64:
        out["pause_ns"], out["wait_ns"], out["spare"] = struct.unpack_from("<3Q", b, 40)
    return out


class SeqSet:
    """Distinct integers seen, as sorted disjoint runs [start, end): call sequence numbers
    arrive almost in order, so there are few runs at any time. Counts repeats."""

    def __init__(self):
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.count = 0
        self.repeats = 0

    def add(self, s: int) -> None:
        starts, ends = self.starts, self.ends
        i = bisect.bisect_right(starts, s)       # runs[i-1] starts at or before s
        if i and s < ends[i - 1]:
            self.repeats += 1
            return
        self.count += 1
        joins_left = i and ends[i - 1] == s
        joins_right = i < len(starts) and starts[i] == s + 1
        if joins_left and joins_right:
            ends[i - 1] = ends[i]
            del starts[i], ends[i]
        elif joins_left:
            ends[i - 1] = s + 1
        elif joins_right:
            starts[i] = s
        else:
            starts.insert(i, s)
            ends.insert(i, s + 1)

    def missing_below(self, n: int) -> int:
        """How many of 0..n-1 were not seen."""
        seen = 0
        for a, b in zip(self.starts, self.ends):
            if a >= n:
                break
            seen += min(b, n) - a
        return n - seen


def _uuid(b: bytes) -> str:
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _link(data: bytes) -> dict:
    """CS_F_LINK (shim_share.c): an exported or imported POSIX fd, the file it is, and for
    an import the exporting process and its export number when they were found."""
    kind, fd, dev, ino, pid, no, peer, err = struct.unpack_from("<8q", data)
    out = {"kind": LINK_KINDS.get(kind, str(kind)), "fd": fd, "dev": dev, "ino": ino, "pid": pid}
    if kind == 1:
        out["export"] = no
    else:
        out["peer_pid"] = peer or None
        out["peer_export"] = no if peer else None
        if err:
            out["match_errno"] = err
    return out
