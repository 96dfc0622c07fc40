"""Memory in the exported program: placement (every allocation mapped at its recorded address,
planned at export time by the replayer's address-space manager against PlanDriver, which writes
C), virtual memory calls, copies and memsets.  MemoryCalls is a part of Emitter
(export/emit.py): it reads and writes the emitter's space, pdrv, data files and lines."""
from __future__ import annotations

import re
import struct
from typing import List

from cudasnap.formats.vocab import alloc_range, in_class
from cudasnap.replay.hostplace import recorded_range as host_range

from .ctext import lit, ref
from .result import ExportError

PLACE_GRAN = 2 << 20              # granule the placement plan is aligned to (checked when run)


class PlanDriver:
    """The replayer's address-space manager calls this 'driver' at export time: each operation
    becomes a line of C (placement is planned by the same code that places allocations on replay)."""

    def __init__(self, em):
        self.em = em
        self.lines: List[str] = []

    def reserve(self, size, addr, align=0):
        raise ExportError("placement: a range outside the planned zones needed a reservation")

    def free_va(self, addr, size):
        pass

    def create(self, size):
        k = self.em.slots.new("phys")
        self.lines.append(f"mem_create(&{ref('phys', k)}, {lit(size)});")
        return k

    def map(self, addr, size, handle, offset=0):
        self.lines.append(f"mem_map({lit(addr)}, {lit(size)}, {ref('phys', handle)});")

    def set_access(self, addr, size, flags=None):
        self.lines.append(f"set_access({lit(addr)}, {lit(size)}, {3 if flags is None else int(flags)});")

    def unmap(self, addr, size):
        self.lines.append(f'CKN("cuMemUnmap", cuMemUnmap({lit(addr)}, {lit(size)}));')

    def release(self, handle):
        self.lines.append(f'CKN("cuMemRelease", cuMemRelease({ref("phys", handle)}));')

    def mem_alloc(self, size):
        raise ExportError("placement: an allocation lies outside the planned zones")

    def mem_free(self, addr):
        pass

    def take(self) -> List[str]:
        out, self.lines = self.lines, []
        return out


class MemoryCalls:
    """Emitter's translation of allocations, mappings, copies and memsets."""

    def plan_placement(self) -> None:
        from cudasnap.replay.placement import AddressSpace
        self.pdrv = PlanDriver(self)
        self.space = AddressSpace(self.pdrv, PLACE_GRAN)
        spans = self.space.plan(self.ranges, self.regions)
        self.reserve_lines = []
        for sp in spans:
            sp.reserved, sp.live = True, sp.start
            self.reserve_lines.append(f"reserve_exact({lit(sp.start)}, {lit(sp.size)}, 0);")

    def flush_plan(self, rec) -> None:
        ops = self.pdrv.take()
        if ops:
            self.emit(rec, *ops)
        else:
            self.comment(rec, "inside memory already mapped at its recorded address")

    def e_alloc(self, rec) -> None:
        rng = alloc_range(rec)
        if rng is None:
            self.fail(rec, "the recorded allocation has no address or size")
        if in_class(rec["f"], "managed_alloc"):
            self.note_once("managed", "managed memory is replayed as device memory at its recorded address")
        self.space.alloc(rng[0], rng[1], rec.get("s"))
        self.flush_plan(rec)

    def e_host_pin(self, rec) -> None:
        """Pinned host memory at its recorded address (kernels reach mapped memory by it)."""
        addr, size = host_range(rec)
        if not addr or size <= 0:
            self.res.no_effect += 1
            return
        self.host_pinned[addr] = size
        portable = int((rec.get("a") or {}).get("Flags", 0) or 0) & 0x1
        self.emit(rec, f"host_place({lit(addr)}, {lit(size)}, {portable});")

    def e_host_unpin(self, rec) -> None:
        p = (rec.get("a") or {}).get("p")
        size = self.host_pinned.pop(p, None)
        if size is None:
            self.res.no_effect += 1
            return
        self.emit(rec, f"host_unplace({lit(p)}, {lit(size)});")

    def e_free(self, rec) -> None:
        p = rec["a"].get("dptr")
        check = self.data_file("d2h", rec, "hostcheck", required=False)
        if check is not None and self.space.find(p or 0) is not None:
            # managed memory's final bytes, read in place by the program: verified before the free
            self.res.d2h_bytes += check[1]
            self.emit(rec, f"ctx_sync(); d2h({lit(p)}, \"{check[0]}\", {lit(check[1])}, (CUstream)0, 0);")
        if self.space.free(p) is None:
            self.res.no_effect += 1
            return
        self.flush_plan(rec)

    def e_free_async(self, rec) -> None:
        a = rec["a"]
        if self.in_capture(rec, a.get("hStream")):
            self.note_once("capfree", f"call #{rec.get('s')}: frees captured into graphs are not performed")
            self.res.no_effect += 1
            return
        s = self.stream(rec, a.get("hStream"))
        self.space.free(a.get("dptr"))
        self.emit(rec, f"stream_sync({s});", *self.pdrv.take())

    def e_reserve(self, rec) -> None:
        a = rec["a"]
        ptr, size = a.get("ptr"), int(a.get("size", 0))
        sp = self.space.span_of(ptr, size) if ptr else None
        self.space.add_vmm(ptr, size, ptr, rec.get("s"))
        if sp is not None and sp.reserved:
            self.virtual.add(ptr)
            self.comment(rec, f"{ptr:#x}: inside the reserved placement zone")
            return
        self.emit(rec, f"reserve_exact({lit(ptr)}, {lit(size)}, {lit(int(a.get('alignment', 0) or 0))});")

    def e_address_free(self, rec) -> None:
        a = rec["a"]
        ptr = a.get("ptr")
        self.space.free(ptr)
        if ptr in self.virtual:
            self.virtual.discard(ptr)
            self.res.no_effect += 1
            return
        self.emit(rec, f"CK(cuMemAddressFree({lit(ptr)}, {lit(int(a.get('size', 0)))}));")

    def e_mem_create(self, rec) -> None:
        a = rec["a"]
        i = self.slots.new("memh", a.get("handle"))
        self.emit(rec, f"mem_create(&{ref('memh', i)}, {lit(int(a.get('size', 0)))});")

    def e_mem_release(self, rec) -> None:
        h = rec["a"].get("handle")
        self.emit(rec, f"CK(cuMemRelease({self.handle(rec, 'memh', h, 'allocation handle')}));")
        self.slots.drop("memh", h)

    def e_mem_map(self, rec) -> None:
        a = rec["a"]
        h = self.handle(rec, "memh", a.get("handle"), "allocation handle")
        self.emit(rec, f"CK(cuMemMap(TR({lit(a.get('ptr'))}), {lit(int(a.get('size', 0)))}, "
                       f"{lit(int(a.get('offset', 0) or 0))}, {h}, 0));")

    def e_mem_unmap(self, rec) -> None:
        a = rec["a"]
        self.emit(rec, f"CK(cuMemUnmap(TR({lit(a.get('ptr'))}), {lit(int(a.get('size', 0)))}));")

    def e_mem_access(self, rec) -> None:
        a = rec["a"]
        desc = a.get("desc")
        flags = 3
        if isinstance(desc, (bytes, bytearray)) and len(desc) >= 12:
            flags = struct.unpack_from("<I", desc, 8)[0]
        self.emit(rec, f"set_access(TR({lit(a.get('ptr'))}), {lit(int(a.get('size', 0)))}, {flags});")

    def e_h2d(self, rec) -> None:
        a = rec["a"]
        n = int(a.get("ByteCount", 0))
        if n == 0:
            self.res.no_effect += 1
            return
        name, size = self.data_file("h2d", rec, "srcHost")
        if size != n:
            self.fail(rec, f"the H2D payload holds {size} bytes, the copy {n}")
        self.res.h2d_bytes += n
        if "Async" in rec["f"]:
            hs = a.get("hStream")
            self.emit(rec, f"h2d({lit(a.get('dstDevice'))}, \"{name}\", {lit(n)}, {self.stream(rec, hs)}, "
                           f"{2 if self.in_capture(rec, hs) else 1});")
        else:
            self.emit(rec, f"h2d({lit(a.get('dstDevice'))}, \"{name}\", {lit(n)}, (CUstream)0, 0);")

    def e_d2h(self, rec) -> None:
        a = rec["a"]
        n = int(a.get("ByteCount", 0))
        got = self.data_file("d2h", rec, "dstHost", required=False)
        if got is not None and got[1] != n:
            self.fail(rec, f"the recorded D2H result holds {got[1]} bytes, the copy {n}")
        name = f"\"{got[0]}\"" if got else "NULL"
        if got:
            self.res.d2h_bytes += n
        if "Async" in rec["f"]:
            hs = a.get("hStream")
            cap = self.in_capture(rec, hs)
            if cap:
                self.note_once("capd2h", "device-to-host copies captured into graphs are not verified")
            self.emit(rec, f"d2h({lit(a.get('srcDevice'))}, {'NULL' if cap else name}, {lit(n)}, "
                           f"{self.stream(rec, hs)}, {2 if cap else 1});")
        else:
            self.emit(rec, f"d2h({lit(a.get('srcDevice'))}, {name}, {lit(n)}, (CUstream)0, 0);")

    def e_d2d(self, rec) -> None:
        a = rec["a"]
        n = int(a.get("ByteCount", 0))
        if in_class(rec["f"], "d2d_copy"):
            dst, src = a.get("dstDevice"), a.get("srcDevice")
        else:
            dst, src = a.get("dst"), a.get("src")
            if self.space.find(dst or 0) is None or self.space.find(src or 0) is None:
                self.note_once(f"uni{rec.get('s')}", f"call #{rec.get('s')} {rec['f']}: an end of the copy is not "
                                                     f"device memory of the recording (host memory?); left out")
                self.res.no_effect += 1
                return
        if "Async" in rec["f"]:
            self.emit(rec, f"CK(cuMemcpyDtoDAsync(TR({lit(dst)}), TR({lit(src)}), {lit(n)}, "
                           f"{self.stream(rec, a.get('hStream'))}));")
        else:
            self.emit(rec, f"CK(cuMemcpyDtoD(TR({lit(dst)}), TR({lit(src)}), {lit(n)}));")

    def e_copy2d(self, rec) -> None:
        a = rec["a"]
        cp = a.get("pCopy")
        if not isinstance(cp, (bytes, bytearray)) or len(cp) < 128:
            self.fail(rec, "the CUDA_MEMCPY2D struct was not captured")
        cp = bytes(cp[:128])
        w, h = struct.unpack_from("<QQ", cp, 112)
        types = [struct.unpack_from("<I", cp, base + 16)[0] for base in (0, 56)]
        if 3 in types:
            self.fail(rec, "2D copies with CUDA arrays are not exported")
        self.sections.add("copy2d")
        src_name, src_n, dst_name, dst_n = "NULL", 0, "NULL", 0
        if types[0] == 1:
            pitch = max(struct.unpack_from("<Q", cp, 48)[0], w)
            n = pitch * (h - 1) + w if h and w else 0
            got = self.data_file("h2d", rec, "hostsrc", required=n > 0)
            if got is not None:
                src_name, src_n = f"\"{got[0]}\"", got[1]
                self.res.h2d_bytes += got[1]
        cap = "Async" in rec["f"] and self.in_capture(rec, a.get("hStream"))
        if types[1] == 1:
            pitch = max(struct.unpack_from("<Q", cp, 56 + 48)[0], w)
            dst_n = pitch * (h - 1) + w if h and w else 0
            ref_ = (rec.get("x") or {}).get("hostdst")
            if isinstance(ref_, dict) and isinstance(ref_.get("blob"), str) and self.reader.has_blob(ref_["blob"]) and not cap:
                fname = f"d2h-{rec.get('s')}-rows.bin"
                self.data[fname] = ("rows", (ref_["blob"], w, h, pitch))
                dst_name = f"\"{fname}\""
                self.res.d2h_bytes += w * h
        k = self.descs.setdefault(cp, len(self.descs))
        if "Async" in rec["f"]:
            s = self.stream(rec, a.get("hStream"))
            self.emit(rec, f"copy2d(D{k}, {src_name}, {lit(src_n)}, {dst_name}, {lit(dst_n)}, {s}, {2 if cap else 1});")
        else:
            self.emit(rec, f"copy2d(D{k}, {src_name}, {lit(src_n)}, {dst_name}, {lit(dst_n)}, (CUstream)0, 0);")

    def e_memset(self, rec) -> None:
        a = rec["a"]
        f = rec["f"]
        m = re.match(r"cuMemset(D2D|D)(8|16|32)", f)
        width = m.group(2)
        val = a.get({"8": "uc", "16": "us", "32": "ui"}[width], 0)
        dst = f"TR({lit(a.get('dstDevice'))})"
        if m.group(1) == "D2D":
            name = f"cuMemsetD2D{width}"
            args = [dst, lit(int(a.get("dstPitch", 0))), lit(int(val)), lit(int(a.get("Width", 0))),
                    lit(int(a.get("Height", 0)))]
        else:
            name = f"cuMemsetD{width}"
            args = [dst, lit(int(val)), lit(int(a.get("N", 0)))]
        if "Async" in f:
            name += "Async"
            args.append(self.stream(rec, a.get("hStream")))
        self.emit(rec, f"CK({name}({', '.join(args)}));")
