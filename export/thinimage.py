"""A module image as an extract keeps it: a fatbin's SASS for the recorded GPUs' architectures
and every PTX entry; the SASS for other architectures is left out.

Library fatbins (PyTorch's, cuBLAS's) carry SASS for five or six architectures, so the image of
the one module an extract keeps is most of a small extract; its replay on the recorded GPU (or
any of the same major architecture) and PTX's uses (JIT for newer GPUs, simulators) need no
more. Anything not understood is kept whole."""
from __future__ import annotations

import struct
from typing import Iterable, List, Optional, Tuple

from cudasnap.replay.retarget import FATBIN_MAGIC, KIND_ELF, KIND_PTX

_HEAD = struct.Struct("<IHHQ")         # magic, version, header size, size of the entries
_ENTRY = struct.Struct("<HHIQ")        # kind, unknown, entry header size, payload size


def thin(img: bytes, ccs: Iterable[Tuple[int, int]]) -> Optional[Tuple[bytes, List[int]]]:
    """(thinner image, SASS architectures left out) when img is a fatbin holding SASS for an
    architecture whose major no recorded GPU (ccs) has, and each container keeps code for them;
    None to keep the image as it is."""
    majors = {int(c[0]) for c in ccs}
    if not majors or len(img) < _HEAD.size or _HEAD.unpack_from(img, 0)[0] != FATBIN_MAGIC:
        return None
    out = bytearray()
    dropped: List[int] = []
    base = 0
    while base + _HEAD.size <= len(img) and _HEAD.unpack_from(img, base)[0] == FATBIN_MAGIC:
        _m, _ver, hsize, fsize = _HEAD.unpack_from(img, base)
        end = base + hsize + fsize
        if hsize < _HEAD.size or fsize == 0 or end > len(img):
            return None
        kept = bytearray()
        usable = False
        pos = base + hsize
        while pos < end:
            if pos + 64 > end:
                return None
            kind, _u, ehsize, psize = _ENTRY.unpack_from(img, pos)
            size = ehsize + psize
            if ehsize < 64 or kind not in (KIND_PTX, KIND_ELF) or pos + size > end or size % 8:
                return None                   # not understood: the image stays whole
            arch = struct.unpack_from("<I", img, pos + 28)[0]
            if kind == KIND_PTX or arch // 10 in majors:
                kept += img[pos:pos + size]
                usable = True
            else:
                dropped.append(arch)
            pos += size
        if not usable:
            return None                       # nothing here runs on the recorded GPUs: keep it whole
        out += img[base:base + hsize]
        struct.pack_into("<Q", out, len(out) - hsize + 8, len(kept))
        out += kept
        base = end
    if not dropped:
        return None
    out += img[base:]                         # whatever follows the last container
    return bytes(out), sorted(set(dropped))
