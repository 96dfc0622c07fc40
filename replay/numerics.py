"""Three outcomes for a compared D2H result: EXACT (bit for bit), CLOSE (every element of its
float type within the tolerance) and DIFFERENT; the element type (given per result or kernel,
else read from the PTX of the kernel that last wrote the buffer) and the tolerance in use."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

EXACT, CLOSE, DIFFERENT = "EXACT", "CLOSE", "DIFFERENT"
FLOATS = frozenset(("f32", "f16", "bf16", "f64"))
TYPE_NAMES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64", "int": "integer"}
_ALIASES = {"f32": "f32", "float32": "f32", "float": "f32", "f16": "f16", "float16": "f16", "half": "f16",
            "bf16": "bf16", "bfloat16": "bf16", "f64": "f64", "float64": "f64", "double": "f64",
            "int": "int", "integer": "int", "exact": "int"}
# torch.testing.assert_close's defaults (rtol, atol) per type
TORCH = {"f32": (1.3e-6, 1e-5), "f16": (1e-3, 1e-5), "bf16": (1.6e-2, 1e-5), "f64": (1e-7, 1e-7)}
_BITS = {"f32": ("<u4", 32), "f16": ("<u2", 16), "bf16": ("<u2", 16), "f64": ("<u8", 64)}
ENV = "CUDASNAP_TOLERANCE"
FORMS = "exact, torch (torch.testing's per-type defaults), rtol=R,atol=A or ulp:N"


def type_of(text: str) -> Optional[str]:
    return _ALIASES.get(text.strip().lower())


@dataclass
class Tolerance:
    kind: str = "exact"            # exact | torch | rel (rtol/atol) | ulp
    rtol: float = 0.0
    atol: float = 0.0
    ulp: int = 0

    @property
    def exact(self) -> bool:
        return self.kind == "exact"

    def describe(self) -> str:
        if self.kind == "torch":
            return "torch.testing's per-type defaults"
        if self.kind == "rel":
            return f"rtol={self.rtol:g},atol={self.atol:g}"
        if self.kind == "ulp":
            return f"ulp:{self.ulp}"
        return "bit-exact"

    def bounds(self, dtype: str) -> Tuple[float, float]:
        return TORCH[dtype] if self.kind == "torch" else (self.rtol, self.atol)


def parse_tolerance(text: str, where: str = "--tolerance") -> Tolerance:
    """A Tolerance from one of FORMS; ValueError with a one-line reason."""
    t = (text or "").strip().lower()
    if t in ("exact", "bit-exact", "none"):
        return Tolerance()
    if t in ("torch", "default"):
        return Tolerance("torch")
    m = re.fullmatch(r"ulp:(\d+)", t)
    if m:
        return Tolerance("ulp", ulp=int(m.group(1))) if int(m.group(1)) else Tolerance()
    parts = dict(p.split("=", 1) for p in t.split(",") if "=" in p)
    if parts and len(parts) == len(t.split(",")) and set(parts) <= {"rtol", "atol"}:
        try:
            r, a = float(parts.get("rtol", 0)), float(parts.get("atol", 0))
        except ValueError:
            r = a = -1.0
        if r >= 0 and a >= 0 and r == r and a == a:
            return Tolerance("rel", rtol=r, atol=a) if (r or a) else Tolerance()
    raise ValueError(f"{where} {text!r}: expected {FORMS}")


@dataclass
class Policy:
    """The tolerance a replay judges with and why: given (--exact, --tolerance, CUDASNAP_TOLERANCE,
    --rtol/--atol) or by target (bit-exact for the same kernels on a GPU; torch's defaults where
    the target legitimately rounds otherwise)."""
    tol: Tolerance = field(default_factory=Tolerance)
    given: Optional[str] = None                        # where an explicit choice came from
    reasons: List[str] = field(default_factory=list)   # why the target may round otherwise

    def add_reason(self, why: str) -> None:
        if why not in self.reasons:
            self.reasons.append(why)
            if self.given is None:
                self.tol = Tolerance("torch")

    def line(self) -> str:
        if self.given is not None:
            return (f"numerics: {self.tol.describe()} ({self.given})"
                    + ("" if self.tol.exact else "; CLOSE within it passes"))
        if not self.reasons:
            return "numerics: bit-exact (the same kernels on a GPU); --tolerance to accept rounding"
        return (f"numerics: CLOSE within torch.testing's per-type tolerance passes ({'; '.join(self.reasons)}); "
                f"--exact for bit-exact")


def policy_of(opt, env: Optional[Dict[str, str]] = None) -> Policy:
    """ValueError for a malformed --tolerance or CUDASNAP_TOLERANCE."""
    import os
    env = os.environ if env is None else env
    if getattr(opt, "exact", False):
        return Policy(Tolerance(), "--exact")
    if getattr(opt, "tolerance", None):
        return Policy(parse_tolerance(opt.tolerance), "--tolerance")
    if opt.rtol or opt.atol:
        return Policy(Tolerance("rel", rtol=opt.rtol, atol=opt.atol), "--rtol/--atol")
    if env.get(ENV, "").strip():
        return Policy(parse_tolerance(env[ENV], ENV), ENV)
    return Policy()


# ------------------------------------------------------------------------------ element types
def parse_dtype_specs(specs: List[str]) -> List[Tuple[Optional[str], str]]:
    """--dtype TYPE | CALL=TYPE | KERNEL=TYPE -> [(selector or None, type)]; ValueError naming a bad one."""
    out = []
    for sp in specs or []:
        sel, eq, ty = sp.rpartition("=")
        t = type_of(ty)
        if t is None or (eq and not sel.strip()):
            raise ValueError(f"--dtype {sp!r}: expected TYPE, CALL=TYPE or KERNEL=TYPE with TYPE one of "
                             f"f32, f16, bf16, f64, int")
        if sel.strip() and not sel.strip().lstrip("#").isdigit():
            try:
                re.compile(sel.strip())
            except re.error as e:
                raise ValueError(f"--dtype {sp!r}: the kernel pattern: {e}")
        out.append((sel.strip() or None, t))
    return out


_ENTRY = re.compile(r"\.entry\s+([\w$.]+)\s*\(")
# global or generic (a pointer the compiler could not prove global) stores and atomics
_STORE = re.compile(r"\b(?:st|red|atom)((?:\.[A-Za-z0-9_:]+)*?)\.(f16x2|bf16x2|f32|f64|f16|bf16|[bus](?:8|16|32|64))\b")
_NOT_GLOBAL = re.compile(r"\.(?:shared|local|param|const)\b")
_BF16 = re.compile(r"\.bf16(?:x2)?\b")
# float arithmetic: untyped .b32/.b64 stores (Triton writes floats so) of a kernel computing in f32/f64
_FARITH = {w: re.compile(r"\b(?:add|sub|mul|fma|mad|div|ex2|lg2|rcp|rsqrt|sqrt|max|min|neg|abs|tanh)(?:\.[a-z0-9]+)*\." + t + r"\b")
           for w, t in (("32", "f32"), ("64", "f64"))}
_F16 = re.compile(r"\.f16(?:x2)?\b")


# Approximate instructions whose results reach a kernel's output as they are (not seeds that
# Newton steps refine, as rcp.approx.f64 is in division): a GPU's special-function unit and a
# simulator computing them with a math library differ in the last bits.
APPROX = re.compile(r"\b(?:(?:sin|cos|lg2|ex2|tanh)\.approx|(?:rsqrt|sqrt|rcp)\.approx(?:\.ftz)?\.f32|div\.(?:approx|full)(?:\.ftz)?\.f32)"
                    r"(?:\.ftz)?(?:\.f32|\.f16|\.bf16|\.f16x2|\.bf16x2)?\b")


def ptx_approx_ops(ptx: str) -> Dict[str, List[str]]:
    """Entry -> the approximate instructions (APPROX) it uses, each once, sorted."""
    ms = list(_ENTRY.finditer(ptx))
    return {m.group(1): sorted(set(APPROX.findall(ptx[m.end():ms[i + 1].start() if i + 1 < len(ms) else len(ptx)])))
            for i, m in enumerate(ms)}


# A float mul without a rounding mode whose result an add or sub without one takes: ptxas may
# contract the two into one FMA (PTX allows it; one rounding on the GPU), a PTX interpreter
# rounds each.
_MUL = re.compile(r"\bmul\.(f32|f64)[ \t]+(%\w+)")
_ADD = re.compile(r"\b(?:add|sub)\.(f32|f64)[ \t]+%\w+[ \t]*,([^;\n]*)")


def ptx_contractions(ptx: str) -> Dict[str, List[str]]:
    """Entry -> the types (f32, f64) of its mul/add pairs ptxas may fuse (above), sorted."""
    ms = list(_ENTRY.finditer(ptx))
    out: Dict[str, List[str]] = {}
    for i, m in enumerate(ms):
        body = ptx[m.end():ms[i + 1].start() if i + 1 < len(ms) else len(ptx)]
        muls: Dict[str, set] = {}
        for t, d in _MUL.findall(body):
            muls.setdefault(t, set()).add(d)
        out[m.group(1)] = sorted({t for t, ops in _ADD.findall(body)
                                  if set(re.findall(r"%\w+", ops)) & muls.get(t, set())})
    return out


def ptx_store_types(ptx: str) -> Dict[str, Tuple[Optional[str], str]]:
    """Entry -> (type, how it was read) from its global stores: one float type, "int", or None
    where it stores none or floats and integers both (a buffer could be either: bit-exact)."""
    out: Dict[str, Tuple[Optional[str], str]] = {}
    ms = list(_ENTRY.finditer(ptx))
    for i, m in enumerate(ms):
        body = ptx[m.end():ms[i + 1].start() if i + 1 < len(ms) else len(ptx)]
        kinds, raw = set(), set()
        for mods, t in _STORE.findall(body):
            if _NOT_GLOBAL.search(mods):
                continue
            raw.add(t)
            if t in ("f32", "f64", "f16", "bf16"):
                kinds.add(t)
            elif t in ("f16x2", "bf16x2"):
                kinds.add(t[:-2])
            elif t[1:] == "16" and (_BF16.search(body) or _F16.search(body)):
                # halves live in .b16 registers: the arithmetic names the type
                kinds.add("bf16" if _BF16.search(body) and not _F16.search(body) else
                          "f16" if not _BF16.search(body) else "mixed16")
            elif t[0] == "b" and t[1:] in _FARITH and _FARITH[t[1:]].search(body):
                kinds.add("f" + t[1:])     # bits stored from a float computation
            else:
                kinds.add("int")
        shown = f"global stores of {', '.join(sorted(raw))}" if raw else ""
        if len(kinds) == 1 and next(iter(kinds)) in FLOATS | {"int"}:
            out[m.group(1)] = (next(iter(kinds)), shown)
        else:
            out[m.group(1)] = (None, shown or "no global stores")
    return out


class TypeOracle:
    """The element type of a result: a --dtype given for its call or writer, else the writer
    kernel's PTX stores (read lazily from the snapshot's module images, once each)."""

    def __init__(self, reader, specs: List[Tuple[Optional[str], str]]):
        self.reader = reader
        self.specs = specs
        self._ptx: Optional[Dict[str, Tuple[Optional[str], str]]] = None
        self._approx: Dict[str, List[str]] = {}
        self._fused: Dict[str, List[str]] = {}
        self._loads: Optional[List[Any]] = None

    def of(self, seq: int, writer) -> Tuple[Optional[str], str]:
        wname = writer[1] if writer else None
        for sel, t in self.specs:
            if sel is None:
                continue
            if sel.lstrip("#").isdigit():
                if int(sel.lstrip("#")) == seq:
                    return self._given(t, f"--dtype {sel}={t}")
            elif wname and re.search(sel, wname):
                return self._given(t, f"--dtype {sel}={t}")
        for sel, t in self.specs:
            if sel is None:
                return self._given(t, f"--dtype {t}")
        if not wname:
            return None, "no writer known"
        got = self._from_ptx(wname)
        if got is None:
            return None, f"no PTX of {wname} in the snapshot"
        t, shown = got
        if t == "int":
            return None, f"integers: the PTX of {wname}: {shown}"
        return t, f"the PTX of {wname}: {shown}"

    @staticmethod
    def _given(t: str, src: str) -> Tuple[Optional[str], str]:
        return (t if t in FLOATS else None), src

    def _from_ptx(self, name: str):
        if self._ptx is None:
            self._ptx = {}
            self._loads = self._images()
        while name not in self._ptx and self._loads:
            img = self._loads.pop(0)
            try:
                from .retarget import ptx_of
                got = img() if getattr(img, "is_ptx", False) else ptx_of(img())
            except Exception:             # an image we cannot read: its kernels stay unknown
                continue
            if got is not None:
                text = got[1].split(b"\0", 1)[0].decode("utf-8", "replace")
                for k, v in ptx_store_types(text).items():
                    self._ptx.setdefault(k, v)
                for k, v in ptx_approx_ops(text).items():
                    self._approx.setdefault(k, v)
                for k, v in ptx_contractions(text).items():
                    self._fused.setdefault(k, v)
        return self._ptx.get(name)

    def approx(self, name: str) -> List[str]:
        """The approximate instructions kernel name's PTX uses (none where its PTX is unknown)."""
        self._from_ptx(name)
        return self._approx.get(name, [])

    def contractions(self, name: str) -> List[str]:
        """The float types whose mul/add pairs ptxas may fuse in kernel name (ptx_contractions)."""
        self._from_ptx(name)
        return self._fused.get(name, [])

    def _images(self) -> List[Any]:
        out = []
        if self.reader is None:
            return out
        from .codecalls import code_calls
        for rec in code_calls(self.reader):
            ref = (rec.get("x") or {}).get("image")
            if isinstance(ref, dict) and isinstance(ref.get("blob"), str) and self.reader.has_blob(ref["blob"]):
                out.append(lambda b=ref["blob"]: bytes(self.reader.blob(b)))
        # PTX a JIT compiler kept beside a SASS-only image (Triton's cache), recorded at capture
        from cudasnap.formats.jitptx import kept_ptx
        try:
            kept = kept_ptx(self.reader)
        except Exception:
            kept = {}
        for k in kept.values():
            load = (lambda t=k["ptx"]: (0, bytes(t)))
            load.is_ptx = True
            out.append(load)
        return out


# ------------------------------------------------------------------------------ measuring
@dataclass
class Judgement:
    outcome: str
    dtype: Optional[str] = None
    dtype_source: str = ""
    elements: int = 0
    differing: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    max_ulp: int = 0
    first: Optional[int] = None        # first element beyond the tolerance (DIFFERENT)
    expected_val: Any = None
    got_val: Any = None
    would_pass: Optional[str] = None   # under --exact: the type's default tolerance would accept it

    def numbers(self) -> str:
        return (f"{TYPE_NAMES.get(self.dtype or '', '?')} ({self.dtype_source}): {self.differing} of {self.elements} "
                f"elements differ, max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g}, max {self.max_ulp} ULP")

    def to_dict(self) -> Dict[str, Any]:
        d = {"outcome": self.outcome, "dtype": self.dtype, "dtype_source": self.dtype_source,
             "elements": self.elements, "differing": self.differing, "max_abs": _num(self.max_abs),
             "max_rel": _num(self.max_rel), "max_ulp": self.max_ulp}
        if self.first is not None:
            d.update(first_index=self.first, expected_val=_num(self.expected_val), got_val=_num(self.got_val))
        return d


def _num(v):
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return str(v)
    return v


def _values(data: bytes, dtype: str):
    import numpy as np
    ut, bits = _BITS[dtype]
    n = len(data) // (bits // 8)
    u = np.frombuffer(data, dtype=ut, count=n)
    if dtype == "bf16":
        v = (u.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    else:
        v = u.view({"f32": "<f4", "f16": "<f2", "f64": "<f8"}[dtype]).astype(np.float64)
    # ordered integers: adjacent floats differ by 1 (ULP distance)
    mag = u & np.array((1 << (bits - 1)) - 1, dtype=u.dtype)
    neg = (u >> np.array(bits - 1, dtype=u.dtype)).astype(bool)
    o = mag.astype(np.float64 if bits == 64 else np.int64)
    return v, np.where(neg, -o, o), u


def measure(expected: bytes, got: bytes, dtype: str, tol: Tolerance) -> Judgement:
    """Judge two equal-sized buffers of dtype elements (bytes not a whole element compared exactly)."""
    import numpy as np
    esz = _BITS[dtype][1] // 8
    ev, eo, eu = _values(expected, dtype)
    gv, go, gu = _values(got, dtype)
    j = Judgement(EXACT, dtype, elements=len(ev))
    diff = eu != gu
    both_nan = np.isnan(ev) & np.isnan(gv)
    diff &= ~both_nan
    idx = np.nonzero(diff)[0]
    tail = len(expected) - len(ev) * esz
    tail_differs = bool(tail) and expected[-tail:] != got[-tail:]
    j.differing = int(len(idx))
    if not len(idx) and not tail_differs:
        j.outcome = EXACT if expected == got else CLOSE      # NaNs of other payloads only
        return j
    if len(idx):
        e, g = ev[idx], gv[idx]
        finite = np.isfinite(e) & np.isfinite(g)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            ad = np.where(finite, np.abs(g - e), np.inf)
            rel = np.where(np.abs(e) > 0, ad / np.abs(e), np.where(ad > 0, np.inf, 0.0))
        ulps = np.abs(go[idx] - eo[idx])
        j.max_abs, j.max_rel = float(ad.max()), float(rel.max())
        j.max_ulp = int(min(ulps.max(), 2 ** 62))
        ok_rt = _within(ad, e, ulps, finite, dtype, Tolerance("torch"))
        ok = _within(ad, e, ulps, finite, dtype, tol) if not tol.exact else np.zeros(len(idx), dtype=bool)
    else:
        ok_rt = ok = np.zeros(0, dtype=bool)
    if tol.exact:
        if ok_rt.all() and not tail_differs:
            j.would_pass = "torch.testing's default for the type"
        bad = idx
    else:
        bad = idx[~ok]
    if len(bad) == 0 and not tail_differs:
        j.outcome = CLOSE
        return j
    j.outcome = DIFFERENT
    if len(bad):
        i = int(bad[0])
        j.first, j.expected_val, j.got_val = i, float(ev[i]), float(gv[i])
    return j


def _within(ad, e, ulps, finite, dtype, tol: Tolerance):
    import numpy as np
    if tol.kind == "ulp":
        return finite & (ulps <= tol.ulp)
    r, a = tol.bounds(dtype)
    with np.errstate(invalid="ignore"):
        return finite & (ad <= a + r * np.abs(e))


def summarize(res_numerics: Dict[str, Any], j: Judgement, seq: int, call: str, writer) -> None:
    """Count one judged result into a replay's numerics record."""
    n = res_numerics
    key = j.outcome.lower()
    n[key] = n.get(key, 0) + 1
    if j.outcome == EXACT:
        return
    if j.dtype:
        n["max_rel"] = max(n.get("max_rel") or 0.0, j.max_rel) if j.max_rel == j.max_rel else n.get("max_rel")
        n["max_ulp"] = max(n.get("max_ulp") or 0, j.max_ulp)
    if j.outcome == CLOSE:
        rows = n.setdefault("close_results", [])
        if len(rows) < 50:
            rows.append(dict(j.to_dict(), seq=seq, call=call, writer=list(writer) if writer else None))
