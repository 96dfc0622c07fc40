"""What code a module image carries: SASS architectures and PTX targets (ELF cubin, fatbin, PTX)."""
from __future__ import annotations

import re
import struct
from typing import Optional, Set, Tuple

FATBIN_MAGIC = 0xBA55ED50
ELF_MAGIC = b"\x7fELF"


def _elf_sm(img: bytes) -> Optional[int]:
    if len(img) < 52 or img[:4] != ELF_MAGIC:
        return None
    abiver = img[8]
    is64 = img[4] == 2
    off = 48 if is64 else 36
    (flags,) = struct.unpack_from("<I", img, off)
    if abiver >= 8 or img[7] == 0x41 and abiver >= 8:
        return (flags >> 8) & 0xFF
    return flags & 0xFF


def analyze(img: bytes) -> Optional[Tuple[Set[int], Set[int]]]:
    """(sass sm set, ptx sm set) or None when the format is not recognised."""
    if not img:
        return None
    if img[:4] == ELF_MAGIC:
        sm = _elf_sm(img)
        return ({sm} if sm else set(), set())
    if len(img) >= 16 and struct.unpack_from("<I", img, 0)[0] == FATBIN_MAGIC:
        sass, ptx = set(), set()
        _ver, hsize, fsize = struct.unpack_from("<HHQ", img, 4)
        pos, end = hsize, min(len(img), hsize + fsize)
        while pos + 32 <= end:
            kind, _u, ehsize, psize = struct.unpack_from("<HHIQ", img, pos)
            arch = struct.unpack_from("<I", img, pos + 28)[0] if pos + 32 <= end else 0
            if ehsize == 0:
                break
            if kind == 1:
                ptx.add(arch)
            elif kind == 2:
                sass.add(arch)
            pos += ehsize + psize
        return sass, ptx
    head = img[:4096]
    m = re.search(rb"\.target\s+sm_(\d+)", head)
    if m:
        return set(), {int(m.group(1))}
    return None


def runnable(img: bytes, cc: Tuple[int, int]) -> Optional[str]:
    """None when the image can run on compute capability cc (or is not recognised); else why not."""
    got = analyze(img)
    if got is None:
        return None
    sass, ptx = got
    dev = cc[0] * 10 + cc[1]
    if any(s // 10 == cc[0] and s <= dev for s in sass):
        return None
    if any(p <= dev for p in ptx):
        return None
    have = ", ".join([f"sm_{s}" for s in sorted(sass)] + [f"compute_{p} (PTX)" for p in sorted(ptx)]) or "nothing"
    return f"no SASS for sm_{dev} and no PTX at or below it (image has {have})"


def jit_needed(img: bytes, cc: Tuple[int, int]) -> bool:
    """Does the driver JIT PTX here where the recording ran SASS: SASS for other GPUs only, PTX
    it can compile? (A PTX-only image was JIT-compiled when recorded too.)"""
    got = analyze(img)
    if got is None:
        return False
    sass, ptx = got
    dev = cc[0] * 10 + cc[1]
    return bool(sass) and not any(s // 10 == cc[0] and s <= dev for s in sass) and any(p <= dev for p in ptx)
