"""Re-targeting: what code each recorded module image carries (SASS architectures, PTX), whether
it can run on the replay GPU, the preflight that says so before anything runs, and the PTX a
forced JIT (`replay --jit ptx`) loads instead of the image.

Formats: an ELF cubin (SASS for one architecture, from e_flags); a fatbin (one or more
concatenated containers of entries: kind 1 PTX, kind 2 ELF, each with its architecture; an
entry may be compressed: LZ4's block format, or zstd as CUDA 13 compresses PTX); PTX text
(`.target sm_XX`).
"""
from __future__ import annotations

import re
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from cudasnap.formats.vocab import code_lookup, in_class, is_launch

FATBIN_MAGIC = 0xBA55ED50
ELF_MAGIC = b"\x7fELF"
FLAG_LZ4, FLAG_ZSTD = 0x2000, 0x8000      # entry flags: compressed payload
KIND_PTX, KIND_ELF = 1, 2


@dataclass
class Entry:
    kind: str                 # "sass" | "ptx"
    arch: int                 # 90 for sm_90 / compute_90
    offset: int               # payload offset in the image
    size: int                 # payload bytes as stored
    compressed: str = ""      # "" | "lz4" | "zstd"
    raw_size: int = 0         # decompressed size (compressed entries)


@dataclass
class ImageInfo:
    format: str               # "cubin" | "fatbin" | "ptx" | "unknown"
    entries: List[Entry] = field(default_factory=list)

    @property
    def sass(self) -> List[int]:
        return sorted({e.arch for e in self.entries if e.kind == "sass"})

    @property
    def ptx(self) -> List[int]:
        return sorted({e.arch for e in self.entries if e.kind == "ptx"})

    def describe(self) -> str:
        if self.format == "unknown":
            return "format not recognised"
        parts = [f"sm_{a} SASS" for a in self.sass] + [f"compute_{a} PTX" for a in self.ptx]
        comp = sorted({e.compressed for e in self.entries if e.compressed})
        return f"{self.format}: {', '.join(parts) or 'no code'}{f' ({comp[0]}-compressed entries)' if comp else ''}"


def elf_arch(img: bytes) -> Optional[int]:
    """SASS architecture of a CUDA ELF (e_flags; its layout changed with ABI version 8)."""
    if len(img) < 52 or img[:4] != ELF_MAGIC:
        return None
    off = 48 if img[4] == 2 else 36
    (flags,) = struct.unpack_from("<I", img, off)
    sm = (flags >> 8) & 0xFF if img[8] >= 8 else flags & 0xFF
    return sm or None


def analyze(img: bytes) -> ImageInfo:
    if not img:
        return ImageInfo("unknown")
    if img[:4] == ELF_MAGIC:
        sm = elf_arch(img)
        return ImageInfo("cubin", [Entry("sass", sm, 0, len(img))] if sm else [])
    if len(img) >= 16 and struct.unpack_from("<I", img, 0)[0] == FATBIN_MAGIC:
        entries: List[Entry] = []
        base = 0
        while base + 16 <= len(img) and struct.unpack_from("<I", img, base)[0] == FATBIN_MAGIC:
            _ver, hsize, fsize = struct.unpack_from("<HHQ", img, base + 4)
            pos, end = base + hsize, min(len(img), base + hsize + fsize)
            while pos + 64 <= end:
                kind, _u, ehsize, psize = struct.unpack_from("<HHIQ", img, pos)
                if ehsize < 64 or kind not in (KIND_PTX, KIND_ELF):
                    break
                csize = struct.unpack_from("<Q", img, pos + 16)[0] & 0xFFFFFFFF
                arch = struct.unpack_from("<I", img, pos + 28)[0]
                flags = struct.unpack_from("<Q", img, pos + 40)[0]
                raw = struct.unpack_from("<Q", img, pos + 56)[0]
                comp = "zstd" if flags & FLAG_ZSTD else "lz4" if flags & FLAG_LZ4 else ""
                entries.append(Entry("ptx" if kind == KIND_PTX else "sass", arch, pos + ehsize,
                                     csize if comp and csize else psize, comp, raw if comp else psize))
                pos += ehsize + psize
            if fsize == 0:
                break
            base += hsize + fsize
        return ImageInfo("fatbin", entries)
    head = img[:65536]
    if b".version" in head or b".target" in head:
        m = re.search(rb"\.target\s+sm_(\d+)", head)
        return ImageInfo("ptx", [Entry("ptx", int(m.group(1)) if m else 0, 0, len(img))])
    return ImageInfo("unknown")


def verdict(info: ImageInfo, cc: Tuple[int, int]) -> Tuple[str, str]:
    """("sass" | "jit" | "none" | "unknown", words) for running this image on compute capability cc.
    SASS runs on the same major architecture at an equal or higher minor; PTX is JIT-compiled
    for any GPU at or above its target."""
    dev = cc[0] * 10 + cc[1]
    if info.format == "unknown":
        return "unknown", "format not recognised (left to the driver)"
    if any(s // 10 == cc[0] and s <= dev for s in info.sass):
        return "sass", f"SASS for sm_{dev}"
    ptx = [p for p in info.ptx if p <= dev]
    if ptx:
        return "jit", f"PTX only (compute_{max(ptx)}): JIT-compiled for sm_{dev}"
    return "none", f"neither SASS for sm_{dev} nor PTX at or below it"


# ------------------------------------------------------------------------------ PTX extraction
def lz4_block(src: bytes, out_size: int) -> bytes:
    """Decode an LZ4 block (the compression of fatbin entries)."""
    out = bytearray()
    i, n = 0, len(src)
    while i < n:
        tok = src[i]
        i += 1
        lit = tok >> 4
        if lit == 15:
            while i < n:
                b = src[i]
                i += 1
                lit += b
                if b != 255:
                    break
        out += src[i:i + lit]
        i += lit
        if i >= n or len(out) >= out_size:
            break
        off = src[i] | (src[i + 1] << 8)
        i += 2
        ml = (tok & 15) + 4
        if (tok & 15) == 15:
            while i < n:
                b = src[i]
                i += 1
                ml += b
                if b != 255:
                    break
        if off == 0 or off > len(out):
            raise ValueError("corrupt compressed entry")
        start = len(out) - off
        if off >= ml:
            out += out[start:start + ml]
        else:
            for k in range(ml):
                out.append(out[start + k])
    return bytes(out[:out_size])


def ptx_of(img: bytes, cc: Optional[Tuple[int, int]] = None) -> Optional[Tuple[int, bytes]]:
    """(target, PTX text, NUL-terminated) from an image: the highest PTX entry the GPU can JIT
    (at or below cc), else the highest one.  None when the image holds no PTX.  ValueError when
    the PTX entry cannot be decoded."""
    info = analyze(img)
    cands = [e for e in info.entries if e.kind == "ptx"]
    if not cands:
        return None
    dev = cc[0] * 10 + cc[1] if cc else 1 << 30
    ok = [e for e in cands if e.arch <= dev] or cands
    e = max(ok, key=lambda x: x.arch)
    import zstandard
    try:
        data = _entry_bytes(img, e)
    except zstandard.ZstdError as err:
        raise ValueError(f"the compute_{e.arch} PTX entry did not decompress: {err}")
    data = data.split(b"\0", 1)[0]
    if b".version" not in data[:4096] and b".target" not in data[:65536]:
        raise ValueError(f"the compute_{e.arch} PTX entry did not decode to PTX text")
    return e.arch, data + b"\0"


def _entry_bytes(img: bytes, e: Entry) -> bytes:
    data = img[e.offset:e.offset + e.size]
    if e.compressed == "zstd":
        import zstandard
        return zstandard.ZstdDecompressor().decompress(data, max_output_size=max(e.raw_size, 1) + 64)
    return lz4_block(data, e.raw_size) if e.compressed else data


# the device runtime's launch entry in SASS: cudaLaunchDevice(V2) up to CUDA 11, then
# __cudaCDP2LaunchDeviceV2 and its __cuda_syscall_cnpv2LaunchDeviceV2
_DEVICE_LAUNCH_RX = re.compile(rb"cudaLaunchDevice|CDP2LaunchDevice|cnpv2LaunchDevice")


def launches_from_device(img: bytes) -> bool:
    """Does the image's SASS launch kernels from the device (dynamic parallelism: it links the
    device runtime's launch entry)?"""
    if img[:4] == ELF_MAGIC:
        return _DEVICE_LAUNCH_RX.search(img) is not None
    for e in analyze(img).entries:
        if e.kind == "sass":
            try:
                if _DEVICE_LAUNCH_RX.search(_entry_bytes(img, e)):
                    return True
            except Exception:
                continue
    return False


# ------------------------------------------------------------------------------ snapshots
def loaded_images(reader):
    """(call record, image blob id) of every module/library load whose image the snapshot holds."""
    from .codecalls import code_calls
    for rec in code_calls(reader):
        ref = (rec.get("x") or {}).get("image")
        if in_class(rec.get("f") or "", "loads_code") and isinstance(ref, dict) \
                and isinstance(ref.get("blob"), str) and reader.has_blob(ref["blob"]):
            yield rec, ref["blob"]


def device_launching_loads(reader) -> List[int]:
    """Call numbers of the module/library loads whose code launches kernels from the device."""
    return [rec.get("s") for rec, bid in loaded_images(reader) if launches_from_device(reader.blob(bid))]


def image_info(reader, bid: str):
    """What a module image holds; read once per snapshot in a kept worker (keep.py)."""
    from . import keep
    if not keep.enabled():          # nothing kept: no file identity needed (info reads through a view)
        return analyze(reader.blob(bid))
    return keep.fact(("image_info", keep.reader_key(reader), bid), lambda: analyze(keep.image(reader, bid)))


def module_loads(reader, with_images: bool = True, records=None) -> List[Dict[str, Any]]:
    """Every module/library load of a snapshot: seq, call, result, handle, image info, and the
    kernels looked up in it or launched from it. records: what to read instead of the
    snapshot's call and "fn" records (a replay index's code_records)."""
    loads: List[Dict[str, Any]] = []
    by_handle: Dict[Any, Dict[str, Any]] = {}
    parent: Dict[Any, Any] = {}
    fn_module: Dict[Any, Any] = {}
    names: Dict[Any, str] = {}
    launched: set = set()
    for rec in reader.records(("c", "fn")) if records is None else records:
        if rec.get("k") == "fn":
            h = rec.get("h")
            names.setdefault(h, rec.get("name") or "")
            if rec.get("module") is not None:
                fn_module.setdefault(h, rec.get("module"))
            continue
        f = rec.get("f") or ""
        a = rec.get("a") or {}
        if in_class(f, "loads_code"):
            h = a.get("module") or a.get("library")
            ent = {"seq": rec.get("s"), "call": f, "r": rec.get("r"), "handle": h, "kernels": set(), "size": 0,
                   "info": ImageInfo("unknown")}
            ref = (rec.get("x") or {}).get("image")
            if isinstance(ref, dict) and isinstance(ref.get("blob"), str) and reader.has_blob(ref["blob"]):
                ent["size"] = reader.blob_size(ref["blob"])
                if with_images:
                    try:
                        ent["info"] = image_info(reader, ref["blob"])
                    except Exception:
                        pass
            loads.append(ent)
            if h:
                by_handle[h] = ent
        elif rec.get("r") == 0 and code_lookup(f):
            # a lookup (class refers_code): the handle it makes, from the one it looks in
            made, src, _kind = code_lookup(f)
            out = a.get(made)
            parent[out] = a.get(src)
            if in_class(f, "asks_by_name") and isinstance(a.get("name"), str):
                names[out] = a["name"]
        elif is_launch(f):
            launched.add(a.get("f"))
    for h in launched | set(parent):
        cur, hops = h, 0
        while cur in parent and cur not in by_handle and hops < 6:
            cur, hops = parent[cur], hops + 1
        if cur not in by_handle:
            m = fn_module.get(h)
            while m in parent and m not in by_handle and hops < 12:
                m, hops = parent[m], hops + 1
            cur = m
        ent = by_handle.get(cur)
        if ent is not None:
            name = names.get(h)
            if name:
                ent["kernels"].add(name)
            if h in launched:
                ent.setdefault("launched", set()).add(name or f"{h:#x}")
    return loads


def device_cc(device: int) -> Tuple[Optional[Tuple[int, int]], str]:
    """(compute capability, name) of GPU `device` through cuda.bindings; (None, why) without one."""
    try:
        from cuda.bindings import driver as cu  # type: ignore
    except Exception as e:
        return None, f"cuda-python unavailable ({type(e).__name__})"
    try:
        if int(cu.cuInit(0)[0]) != 0:
            return None, "cuInit failed"
        r, dev = cu.cuDeviceGet(device)
        if int(r) != 0:
            return None, f"no device {device}"
        A = cu.CUdevice_attribute
        mj = cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)[1]
        mn = cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)[1]
        name = cu.cuDeviceGetName(64, dev)[1]
        name = name.split(b"\0", 1)[0].decode(errors="replace") if isinstance(name, bytes) else str(name)
        return (int(mj), int(mn)), name
    except Exception as e:  # a broken driver: leave it to the replay to report
        return None, f"{type(e).__name__}: {e}"


def preflight(reader, device: int = 0, jit: Optional[str] = None, out=None, quiet: bool = False,
              err=None) -> int:
    """Before replaying (after the replay's pass over the records: reader is the replay's, an
    IndexedReader, or a snapshot path): for each module, whether it has SASS for this GPU, only
    PTX (JIT), or neither.  Returns 2 (and says why on err) when a launched kernel's module
    cannot run here, or when --jit ptx meets a module without PTX; else 0.  Unknown formats are
    left to the driver."""
    import os
    import sys
    from cudasnap.formats.opened import opened
    out = out or sys.stdout
    err = err or sys.stderr
    cc, name = device_cc(device)
    if cc is None:
        return 0                       # the replay reports a missing GPU or driver itself
    try:
        if isinstance(reader, (str, os.PathLike)):
            reader = opened(reader)
        code = getattr(reader, "code_records", None)
        loads = module_loads(reader, records=code() if code is not None else None)
    except Exception:                  # a damaged snapshot: the replay says how far it reads
        return 0
    if not loads or all(ld["info"].format == "unknown" for ld in loads):
        return 0
    dev = cc[0] * 10 + cc[1]
    lines, bad = [], []
    for ld in loads:
        kind, words = verdict(ld["info"], cc)
        if jit == "ptx" and ld["info"].format != "unknown":
            kind, words = ("jit", "--jit ptx: loaded from its PTX") if ld["info"].ptx else ("none", "--jit ptx: no PTX in it")
        launched = sorted(ld.get("launched") or ())
        kern = f"; kernels launched: {', '.join(launched[:4])}{' ...' if len(launched) > 4 else ''}" if launched else ""
        lines.append(f"  call #{ld['seq']} {ld['call']} ({ld['info'].describe()}): {words}{kern}")
        if kind == "none" and (launched or jit == "ptx"):
            bad.append(ld)
    if not quiet or bad:
        out.write(f"preflight: {len(loads)} module image(s) on {name} (sm_{dev})\n")
        for ln in lines:
            out.write(ln + "\n")
    if bad:
        ld = bad[0]
        what = "has no PTX to JIT" if jit == "ptx" else f"has no code for sm_{dev}"
        err.write(f"cudasnap: error: preflight: module of call #{ld['seq']} {ld['call']} {what} "
                         f"({ld['info'].describe()}); kernels that cannot run: "
                         f"{', '.join(sorted(ld.get('launched') or ld['kernels']) or ['?'])}; nothing was replayed\n")
        return 2
    return 0


# ------------------------------------------------------------------------------ replay hooks
def jit_image(ctx, rec, img: bytes) -> bytes:
    """With --jit ptx: the image's PTX (for the load to JIT-compile), else the image."""
    if getattr(ctx.opt, "jit", None) != "ptx":
        return img
    try:
        got = ptx_of(img, ctx.device_cc)
    except ValueError as e:
        ctx.fail(rec, f"--jit ptx: {e}")
    if got is None:
        ctx.fail(rec, f"--jit ptx: the module image holds no PTX ({analyze(img).describe()})")
    ctx.jit_t0 = time.perf_counter()
    ctx.jit_what = f"compute_{got[0]} PTX, {len(got[1]) - 1} bytes"
    return got[1]


def jit_done(ctx, rec) -> None:
    t0 = ctx.jit_t0
    if t0 is None:
        return
    ctx.jit_t0 = None
    ctx.note(f"--jit ptx: call #{rec.get('s')} {rec.get('f')}: loaded from {ctx.jit_what}; load with JIT took "
            f"{(time.perf_counter() - t0) * 1000:.1f} ms")
