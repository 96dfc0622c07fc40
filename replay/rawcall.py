"""Driver entry points the cuda-python bindings do not wrap (newer than the bindings, or declared
by the overlay for a driver newer than the headers), called through their description entry.

Plain calls (class plain_args: values, handles and value or handle outputs) qualify, and calls
that also pass arrays in (the recorded bytes, passed as they are by a handler): their C signature
is the parameter list's sizes and kinds alone. The callable answers as a binding
does: (CUresult, *outputs), each handle output as the bindings' own handle type when they have
one. It calls the same libcuda.so.1 the bindings loaded, never another driver (a simulator's
stand-in has no symbols to call)."""
from __future__ import annotations

import ctypes
from typing import Callable, Dict, Optional

from cudasnap.formats.vocab import is_plain
from cudasnap.shim.description import load as load_description

from .driverops import handle_int

_made: Dict[str, Optional[Callable]] = {}


def _ctype(desc, ctype_name: str, size: int):
    t = desc.types.get(ctype_name, {})
    if t.get("kind") == "float":
        return ctypes.c_float if size == 4 else ctypes.c_double
    signed = bool(t.get("signed"))
    return {1: (ctypes.c_uint8, ctypes.c_int8), 2: (ctypes.c_uint16, ctypes.c_int16),
            4: (ctypes.c_uint32, ctypes.c_int32), 8: (ctypes.c_uint64, ctypes.c_int64)}[size][signed]


def binding(cu, abi_name: str) -> Optional[Callable]:
    """A callable for ABI symbol `abi_name`, or None (not plain, not exported by the driver, or
    `cu` is not cuda-python's driver module)."""
    if getattr(cu, "__name__", "") != "cuda.bindings.driver":
        return None
    if abi_name in _made:
        return _made[abi_name]
    desc = load_description()
    fn = desc.by_name(abi_name)
    call = None
    if fn is not None and (is_plain(abi_name) or _values_and_arrays(desc, fn)):
        try:
            sym = getattr(ctypes.CDLL("libcuda.so.1"), abi_name)
        except (OSError, AttributeError):
            sym = None
        if sym is not None:
            call = _caller(cu, desc, fn, sym)
    _made[abi_name] = call
    return call


def _values_and_arrays(desc, fn) -> bool:
    """Every parameter a value (no pointer), an output of a value or handle, or an array passed in."""
    for p in fn["params"]:
        if p["kind"] == "val" and "*" in p["ctype"]:
            return False
        if p["kind"] == "out" and desc.types.get(p.get("pointee") or "", {}).get("kind") not in (
                "handle", "int", "enum", "float"):
            return False
        if p["kind"] not in ("val", "out", "array_in"):
            return False
    return True


def _caller(cu, desc, fn, sym) -> Callable:
    params = fn["params"]
    argtypes = []
    for p in params:
        if p["kind"] in ("out", "array_in"):
            argtypes.append(ctypes.c_void_p)
        else:
            argtypes.append(_ctype(desc, p["ctype"], p["size"]))
    sym.argtypes = argtypes
    sym.restype = ctypes.c_int

    def call(*args):
        it = iter(args)
        cargs, outs, keep = [], [], []
        for p in params:
            if p["kind"] == "out":
                buf = _ctype(desc, p["pointee"], p.get("pointee_size") or 8)()
                outs.append((p, buf))
                cargs.append(ctypes.addressof(buf))
            elif p["kind"] == "array_in":
                data = next(it)
                keep.append(ctypes.create_string_buffer(bytes(data), max(len(data), 1)) if data is not None else None)
                cargs.append(ctypes.addressof(keep[-1]) if keep[-1] is not None else None)
            elif desc.types.get(p["ctype"], {}).get("kind") == "float":
                cargs.append(float(next(it)))
            else:
                cargs.append(handle_int(next(it)))
        rc = sym(*cargs)
        vals = []
        for p, buf in outs:
            v = buf.value
            wrap = getattr(cu, p["pointee"], None) if desc.types.get(p["pointee"], {}).get("kind") == "handle" else None
            vals.append(wrap(v) if wrap is not None else v)
        return (rc, *vals)
    return call
