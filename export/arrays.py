"""CUDA arrays live at an extract's selection: their contents, read at the selection and written
back into the extract by a copy before it.

Arrays hold texels outside device memory, where the extract's memory ranges do not reach: a
kernel reading a texture over an array would read an empty one. Each array the kept calls made
before the selection (and did not destroy) is read with cuMemcpy3D (array to host, any of 1D,
2D, 3D and layered) and restored with the same copy the other way, recorded as the program
would have made it (CUDA_MEMCPY3D, its host source a blob). Which calls make and destroy
arrays, and the layouts of their descriptors and of the copy, come from the API description."""
from __future__ import annotations

import ctypes
import struct
from typing import Any, Dict, List, Optional, Tuple

from cudasnap.formats.layout import offsetof, sizeof
from cudasnap.formats.vocab import in_class, typed_params

# CUarray_format -> bytes per channel (the block-compressed and video formats are not restored)
_FORMAT_BYTES = {0x01: 1, 0x02: 2, 0x03: 4, 0x08: 1, 0x09: 2, 0x0A: 4, 0x10: 2, 0x20: 4}
MT_HOST, MT_ARRAY = 1, 3               # CUmemorytype
_M3D = "CUDA_MEMCPY3D"


def _field(d: bytes, struct_name: str, name: str, fmt: str) -> int:
    try:
        off = offsetof(struct_name, name)
    except KeyError:                   # a 2D descriptor has no Depth
        return 0
    return struct.unpack_from(fmt, d, off)[0]


def _shape(rec: Dict[str, Any]) -> Optional[Tuple[int, int, int]]:
    """(row bytes, rows, depth) of the array a creating call describes, None when unknown."""
    a = rec.get("a") or {}
    desc = next(((p, t) for p, what, t in typed_params(rec.get("f") or "") if what == "struct"), None)
    if desc is None or not isinstance(a.get(desc[0]), (bytes, bytearray)) or len(a[desc[0]]) < sizeof(desc[1]):
        return None
    d, t = a[desc[0]], desc[1]
    fmt, ch = _field(d, t, "Format", "<I"), _field(d, t, "NumChannels", "<I")
    w, h, depth = _field(d, t, "Width", "<Q"), _field(d, t, "Height", "<Q"), _field(d, t, "Depth", "<Q")
    if fmt not in _FORMAT_BYTES or not w:
        return None
    return w * ch * _FORMAT_BYTES[fmt], max(h, 1), max(depth, 1)


def live_arrays(prefix_recs: List[Dict[str, Any]]) -> Tuple[List[Tuple[int, int, int, int]], List[str]]:
    """(recorded handle, row bytes, rows, depth) of each array the prefix made and kept alive,
    and notes for those that cannot be restored."""
    made: Dict[int, Optional[Tuple[int, int, int]]] = {}
    notes: List[str] = []
    for rec in sorted(prefix_recs, key=lambda r: r.get("s", 0)):
        f, a = rec.get("f") or "", rec.get("a") or {}
        params = typed_params(f)
        out = next((p for p, what, kind in params if what == "makes" and kind == "array"), None)
        if out is not None and isinstance(a.get(out), int):
            made[a[out]] = shape = _shape(rec)
            if shape is None:
                notes.append(f"array {a[out]:#x} (call #{rec.get('s')}): its format is not restored; "
                              f"a kernel reading it reads what the replay's driver gives")
        elif in_class(f, "destroys"):
            h = next((a.get(p) for p, what, kind in params if what == "handle" and kind == "array"), None)
            made.pop(h, None)
    return [(h, *shape) for h, shape in made.items() if shape is not None], notes


def copy3d(row: int, rows: int, depth: int, *, array: int, host: int, to_host: bool) -> bytes:
    """A CUDA_MEMCPY3D between a whole array and tightly packed host memory."""
    raw = bytearray(sizeof(_M3D))
    arr, hst = ("src", "dst") if to_host else ("dst", "src")
    struct.pack_into("<I", raw, offsetof(_M3D, arr + "MemoryType"), MT_ARRAY)
    struct.pack_into("<Q", raw, offsetof(_M3D, arr + "Array"), array)
    struct.pack_into("<I", raw, offsetof(_M3D, hst + "MemoryType"), MT_HOST)
    struct.pack_into("<Q", raw, offsetof(_M3D, hst + "Host"), host)
    struct.pack_into("<Q", raw, offsetof(_M3D, hst + "Pitch"), row)
    struct.pack_into("<Q", raw, offsetof(_M3D, hst + "Height"), rows)
    for name, v in (("WidthInBytes", row), ("Height", rows), ("Depth", depth)):
        struct.pack_into("<Q", raw, offsetof(_M3D, name), v)
    return bytes(raw)


def read_array(rv, rec_handle: int, row: int, rows: int, depth: int) -> bytes:
    """The contents of a live array (the replay's copy of recorded array rec_handle)."""
    from cudasnap.replay.driverops import handle_int
    buf = ctypes.create_string_buffer(max(row * rows * depth, 1))
    live = handle_int(rv.live_handle(None, rec_handle, "array"))
    raw = copy3d(row, rows, depth, array=live, host=ctypes.addressof(buf), to_host=True)
    p = getattr(rv.driver, _M3D)()
    ctypes.memmove(int(p.getPtr()), raw, len(raw))
    rv.call("cuMemcpy3D", p)
    return buf.raw[:row * rows * depth]
