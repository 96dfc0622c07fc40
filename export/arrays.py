"""CUDA arrays live at an extract's selection: their contents, read at the selection and written
back into the extract by a copy before it.

Arrays hold texels outside device memory, where the extract's memory ranges do not reach: a
kernel reading a texture over an array would read an empty one. Each array the kept calls made
before the selection (and did not destroy) is read with cuMemcpy3D (array to host, any of 1D,
2D, 3D and layered) and restored with the same copy the other way, recorded as the program
would have made it (CUDA_MEMCPY3D, its host source a blob)."""
from __future__ import annotations

import ctypes
import struct
from typing import Any, Dict, List, Optional, Tuple

from .emit import base_name

# descriptor sizes of the creating calls' pAllocateArray (CUDA_ARRAY_DESCRIPTOR, CUDA_ARRAY3D_DESCRIPTOR)
_ARRAY_MAKERS = {"cuArrayCreate": 24, "cuArray3DCreate": 40}
_ARRAY_END = "cuArrayDestroy"
# CUarray_format -> bytes per channel (the block-compressed and video formats are not restored)
_FORMAT_BYTES = {0x01: 1, 0x02: 2, 0x03: 4, 0x08: 1, 0x09: 2, 0x0A: 4, 0x10: 2, 0x20: 4}
MT_HOST, MT_ARRAY = 1, 3
COPY3D_SIZE = 200
_SRC, _DST = 0, 88                    # the src and dst halves of CUDA_MEMCPY3D
_MTYPE, _HOST, _ARRAY, _PITCH, _HEIGHT = 32, 40, 56, 72, 80
_EXTENT = 176                         # WidthInBytes, Height, Depth


def live_arrays(prefix_recs: List[Dict[str, Any]]) -> Tuple[List[Tuple[int, int, int, int]], List[str]]:
    """(recorded handle, row bytes, rows, depth) of each array the prefix made and kept alive,
    and notes for those that cannot be restored."""
    made: Dict[int, Optional[Tuple[int, int, int]]] = {}
    notes: List[str] = []
    for rec in sorted(prefix_recs, key=lambda r: r.get("s", 0)):
        b = base_name(rec.get("f") or "")
        a = rec.get("a") or {}
        if b in _ARRAY_MAKERS and isinstance(a.get("pHandle"), int):
            d = a.get("pAllocateArray")
            shape = None
            if isinstance(d, (bytes, bytearray)) and len(d) >= _ARRAY_MAKERS[b]:
                if b == "cuArrayCreate":
                    w, h, fmt, ch = struct.unpack_from("<QQII", d)
                    depth = 0
                else:
                    w, h, depth, fmt, ch = struct.unpack_from("<QQQII", d)
                if fmt in _FORMAT_BYTES and w:
                    shape = (w * ch * _FORMAT_BYTES[fmt], max(h, 1), max(depth, 1))
            made[a["pHandle"]] = shape
            if shape is None:
                notes.append(f"array {a['pHandle']:#x} (call #{rec.get('s')}): its format is not restored; "
                             f"a kernel reading it reads what the replay's driver gives")
        elif b == _ARRAY_END:
            made.pop(a.get("hArray"), None)
    return [(h, *shape) for h, shape in made.items() if shape is not None], notes


def copy3d(row: int, rows: int, depth: int, *, array: int, host: int, to_host: bool) -> bytes:
    """A CUDA_MEMCPY3D between a whole array and tightly packed host memory."""
    raw = bytearray(COPY3D_SIZE)
    arr_side, host_side = (_SRC, _DST) if to_host else (_DST, _SRC)
    struct.pack_into("<I", raw, arr_side + _MTYPE, MT_ARRAY)
    struct.pack_into("<Q", raw, arr_side + _ARRAY, array)
    struct.pack_into("<I", raw, host_side + _MTYPE, MT_HOST)
    struct.pack_into("<Q", raw, host_side + _HOST, host)
    struct.pack_into("<QQ", raw, host_side + _PITCH, row, rows)
    struct.pack_into("<QQQ", raw, _EXTENT, row, rows, depth)
    return bytes(raw)


def read_array(rv, rec_handle: int, row: int, rows: int, depth: int) -> bytes:
    """The contents of a live array (the replay's copy of recorded array rec_handle)."""
    from cudasnap.replay.driverops import handle_int
    buf = ctypes.create_string_buffer(max(row * rows * depth, 1))
    live = handle_int(rv.live_handle(None, rec_handle, "array"))
    raw = copy3d(row, rows, depth, array=live, host=ctypes.addressof(buf), to_host=True)
    p = rv.driver.CUDA_MEMCPY3D()
    ctypes.memmove(int(p.getPtr()), raw, len(raw))
    rv.call("cuMemcpy3D", p)
    return buf.raw[:row * rows * depth]
