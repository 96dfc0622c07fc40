"""Verification of recorded D2H results against what replay reads back."""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

DTYPES = {"f32": ("<f4", 4), "f16": ("<f2", 2), "bf16": (None, 2), "f64": ("<f8", 8),
          "u8": ("<u1", 1), "i32": ("<i4", 4), "u32": ("<u4", 4), "i64": ("<i8", 8)}


@dataclass
class Tolerance:
    rtol: float = 0.0
    atol: float = 0.0
    dtype: Optional[str] = None

    @property
    def exact(self) -> bool:
        return self.dtype is None or (self.rtol == 0.0 and self.atol == 0.0)


@dataclass
class Mismatch:
    seq: int
    call: str
    offset: int               # byte offset of the first divergence within the copied range
    expected: bytes           # a few bytes around the divergence (from offset)
    got: bytes
    count: int                # differing bytes (exact) or elements (tolerance)
    size: int
    src: Optional[int] = None  # recorded device address read
    writer: Optional[Tuple[int, str]] = None  # (seq, name) of the last kernel/copy that wrote the buffer
    dtype: Optional[str] = None
    expected_val: Any = None
    got_val: Any = None
    note: str = ""
    hint: str = ""            # what the difference looks like, where it suggests a cause
    cause: str = ""           # a cause the replay knows of (the simulator's math library)
    numerics: Optional[Any] = None   # numerics.Judgement where the element type is known

    def judge(self, j) -> None:
        """Name the first element beyond the tolerance, in its type (numerics.measure)."""
        self.numerics = j
        if j.dtype and j.first is not None:
            esz = DTYPES[j.dtype][1]
            self.offset = j.first * esz
            self.expected = b""
            self.got = b""
            self.dtype, self.expected_val, self.got_val, self.note = j.dtype, j.expected_val, j.got_val, "tol"
            self.count = j.differing

    def describe(self) -> str:
        w = f"; last written by #{self.writer[0]} {self.writer[1]}" if self.writer else ""
        where = f" (device {self.src + self.offset:#x})" if self.src else ""
        vals = ""
        if self.dtype:
            vals = f" [{self.dtype}: expected {self.expected_val!r}, got {self.got_val!r}]"
        j = self.numerics
        if j is not None and j.dtype:
            idx = self.offset // DTYPES[j.dtype][1]
            text = (f"call #{self.seq} {self.call}: first divergence at byte offset {self.offset} (element {idx}){where}: "
                    f"expected {self.expected_val!r} got {self.got_val!r}; {j.numbers()}{w}")
            if j.would_pass:
                text += f"; CLOSE under {j.would_pass}, but bit-exact applies here"
            return text + (f"; {self.cause}" if self.cause else "")
        unknown = f" ({j.dtype_source})" if j is not None and j.dtype_source else ""
        return (f"call #{self.seq} {self.call}: first divergence at byte offset {self.offset}{where}: "
                f"expected {self.expected.hex()} got {self.got.hex()}{vals}; "
                f"{self.count} {'elements' if self.dtype and self.note == 'tol' else 'bytes'} differ of {self.size}{w}"
                + unknown + (f"; {self.hint}" if self.hint else "") + (f"; {self.cause}" if self.cause else ""))

    def to_dict(self) -> Dict[str, Any]:
        return {"seq": self.seq, "call": self.call, "offset": self.offset, "expected": self.expected.hex(),
                "got": self.got.hex(), "count": self.count, "size": self.size,
                "src": hex(self.src) if self.src else None,
                "writer": list(self.writer) if self.writer else None, "dtype": self.dtype,
                "expected_val": _jsonable(self.expected_val), "got_val": _jsonable(self.got_val),
                **({"hint": self.hint} if self.hint else {}),
                **({"cause": self.cause} if self.cause else {}),
                **({"numerics": self.numerics.to_dict()} if self.numerics is not None else {})}


def _jsonable(v):
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return str(v)
    return v


def _bf16_to_f32(b: bytes) -> float:
    return struct.unpack("<f", b"\0\0" + b[:2])[0]


def decode_value(b: bytes, dtype: str):
    if dtype == "bf16":
        return _bf16_to_f32(b)
    fmt = {"f32": "<f", "f16": "<e", "f64": "<d", "u8": "<B", "i32": "<i", "u32": "<I", "i64": "<q"}[dtype]
    return struct.unpack(fmt, b[: struct.calcsize(fmt)])[0]


def _as_array(data: bytes, dtype: str):
    import numpy as np
    n = len(data)
    if dtype == "bf16":
        u = np.frombuffer(data, dtype="<u2", count=n // 2).astype(np.uint32) << 16
        return u.view(np.float32).astype(np.float64)
    npt, sz = DTYPES[dtype]
    return np.frombuffer(data, dtype=npt, count=n // sz).astype(np.float64)


def compare(expected: bytes, got: bytes, tol: Tolerance, *, seq: int = 0, call: str = "",
            src: Optional[int] = None, writer=None) -> Optional[Mismatch]:
    """None when equal (byte-exact, or within rtol/atol for the dtype); else the first divergence."""
    expected = bytes(expected)
    got = bytes(got)
    if expected == got:
        return None
    size = len(expected)
    if len(got) != size:
        return Mismatch(seq, call, min(size, len(got)), b"", b"", abs(size - len(got)), size, src, writer,
                        note=f"length differs: expected {size}, got {len(got)}")
    if tol.exact or tol.dtype not in DTYPES:
        m = _exact_mismatch(expected, got, tol.dtype, seq, call, src, writer)
        if tol.dtype is None:
            m.hint = rounding_hint(expected, got)
        return m
    import numpy as np
    esz = DTYPES[tol.dtype][1]
    ea, ga = _as_array(expected, tol.dtype), _as_array(got, tol.dtype)
    with np.errstate(invalid="ignore"):
        bad = ~(np.isclose(ga, ea, rtol=tol.rtol, atol=tol.atol, equal_nan=True))
    tail = size - (size // esz) * esz
    if tail and expected[-tail:] != got[-tail:]:
        pass  # handled as exact below when no element differs
    idx = np.nonzero(bad)[0]
    if len(idx) == 0:
        if tail and expected[-tail:] != got[-tail:]:
            return _exact_mismatch(expected, got, None, seq, call, src, writer)
        return None
    i = int(idx[0])
    off = i * esz
    return Mismatch(seq, call, off, expected[off:off + esz], got[off:off + esz], int(len(idx)), size, src, writer,
                    tol.dtype, float(ea[i]), float(ga[i]), note="tol")


def _exact_mismatch(expected: bytes, got: bytes, dtype, seq, call, src, writer) -> Mismatch:
    try:
        import numpy as np
        e = np.frombuffer(expected, dtype=np.uint8)
        g = np.frombuffer(got, dtype=np.uint8)
        diff = np.nonzero(e != g)[0]
        first, count = int(diff[0]), int(len(diff))
    except ImportError:
        diffs = [i for i in range(len(expected)) if expected[i] != got[i]]
        first, count = diffs[0], len(diffs)
    m = Mismatch(seq, call, first, expected[first:first + 8], got[first:first + 8], count, len(expected), src, writer)
    if dtype in DTYPES:
        esz = DTYPES[dtype][1]
        eo = first - first % esz
        if eo + esz <= len(expected):
            m.dtype = dtype
            m.offset = eo
            m.expected, m.got = expected[eo:eo + esz], got[eo:eo + esz]
            m.expected_val = decode_value(m.expected, dtype)
            m.got_val = decode_value(m.got, dtype)
    return m


# Differences this small, read as float32, are what a reduction whose order changes between runs
# gives (floating-point atomics, split-K GEMMs, unordered scatter): not a replay defect.
ROUNDING_RTOL = 1e-3


def rounding_hint(expected: bytes, got: bytes) -> str:
    """A hint where every differing float32 element of two equal-sized buffers is finite and
    within ROUNDING_RTOL of the recorded one, else ''."""
    if len(expected) != len(got) or len(expected) % 4 or not expected:
        return ""
    try:
        import numpy as np
    except ImportError:
        return ""
    e = np.frombuffer(expected, dtype="<u4")
    g = np.frombuffer(got, dtype="<u4")
    idx = np.nonzero(e != g)[0]
    if len(idx) == 0:
        return ""
    ev = e[idx].view(np.float32).astype(np.float64)
    gv = g[idx].view(np.float32).astype(np.float64)
    if not (np.isfinite(ev).all() and np.isfinite(gv).all()):
        return ""
    scale = np.maximum(np.abs(ev), np.abs(gv))
    if (scale == 0).any() or (scale < 1e-30).any():
        return ""
    rel = float(np.max(np.abs(gv - ev) / scale))
    if rel > ROUNDING_RTOL:
        return ""
    return (f"read as float32, the {len(idx)} differing element(s) are within {rel:.1e} relative of the "
            f"recorded values, as a reduction whose order changes from run to run (floating-point "
            f"atomics, unordered scatter) gives; if two native runs of the program differ too, `--dtype f32 "
            f"--rtol {max(1e-6, rel * 4):.0e}` accepts differences this small")
