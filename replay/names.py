"""Kernel names as Nsight Compute shows and matches them.

Snapshots keep the name the driver reports (cuFuncGetName): the mangled C++ name, or the plain
name of an `extern "C"` kernel (Triton, hand-written PTX). Three bases, as ncu's
`--kernel-name-base`:

- mangled    the recorded name: `_ZN2at6native18elementwise_kernelILi128ELi2EZ...`
- demangled  the full C++ name (c++filt's output): `void at::native::elementwise_kernel<128, 2, ...>(int, ...)`
- function   the bare function name, without return type, scope, template arguments or
             parameters: `elementwise_kernel` (ncu's default, and what its progress lines print)

Demangling is libstdc++'s `__cxa_demangle` (the demangler c++filt shares) through ctypes; where
libstdc++ cannot be loaded, or a name does not demangle, the recorded name stands for all three."""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Optional

BASES = ("function", "demangled", "mangled")

_demangler = None          # (__cxa_demangle, free), False when unavailable


def _load():
    global _demangler
    if _demangler is None:
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
            fn = lib.__cxa_demangle
            fn.restype = ctypes.c_void_p
            fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
            libc = ctypes.CDLL(None)
            free = libc.free
            free.argtypes = [ctypes.c_void_p]
            free.restype = None
            _demangler = (fn, free)
        except (OSError, AttributeError):
            _demangler = False
    return _demangler


def available() -> bool:
    """Can names be demangled here (libstdc++ loads)?"""
    return bool(_load())


@functools.lru_cache(maxsize=65536)
def demangle(name: Optional[str]) -> Optional[str]:
    """The demangled C++ name (as c++filt prints it), or `name` itself when it is not an
    Itanium-mangled name or does not demangle."""
    if not isinstance(name, str) or not name.startswith("_Z"):
        return name
    d = _load()
    if not d:
        return name
    fn, free = d
    status = ctypes.c_int(-4)
    try:
        p = fn(name.encode("utf-8", "surrogateescape"), None, None, ctypes.byref(status))
    except Exception:
        return name
    if not p:
        return name
    try:
        out = ctypes.string_at(p).decode("utf-8", "replace")
    finally:
        free(p)
    return out if status.value == 0 and out else name


def _match_back(s: str, end: int, close: str, open_: str) -> int:
    """Index of the `open_` that matches the `close` at s[end] (-1 when there is none)."""
    depth = 0
    for i in range(end, -1, -1):
        c = s[i]
        if c == close:
            depth += 1
        elif c == open_:
            depth -= 1
            if depth == 0:
                return i
    return -1


def _last_top_level(s: str, token: str) -> int:
    """Index of the last `token` outside <...>, (...) and [...] (-1: none)."""
    depth = 0
    found = -1
    i = 0
    while i < len(s):
        c = s[i]
        if c in "<([":
            depth += 1
        elif c in ">)]":
            depth = max(0, depth - 1)
        elif depth == 0 and s.startswith(token, i):
            found = i
            i += len(token)
            continue
        i += 1
    return found


@functools.lru_cache(maxsize=65536)
def function_name(name: Optional[str]) -> Optional[str]:
    """ncu's `function` base: the bare name of the (demangled) function."""
    if not isinstance(name, str) or not name:
        return name
    s = demangle(name).strip()
    if s.endswith((" const", " volatile", " &", " &&")):       # qualifiers of a member function
        s = s[: s.rfind(")") + 1] if ")" in s else s
    if s.endswith(")"):
        i = _match_back(s, len(s) - 1, ")", "(")
        if i > 0:
            s = s[:i].rstrip()
    if s.endswith(">") and not s.endswith("operator>") and not s.endswith("->"):
        i = _match_back(s, len(s) - 1, ">", "<")
        if i > 0:
            s = s[:i].rstrip()
    j = _last_top_level(s, "::")
    if j >= 0:
        s = s[j + 2:]
    j = _last_top_level(s, " ")
    if j >= 0 and not s.startswith("operator"):
        s = s[j + 1:]
    return s or name


def _collapse_templates(s: str, keep: int) -> str:
    """Template arguments nested deeper than `keep` levels shown as <…>, and parameter lists
    inside template arguments (of lambdas and function types) as (…)."""
    out, depth, paren = [], 0, 0
    for c in s:
        if paren:                       # inside a (…) of a template argument
            paren += (c == "(") - (c == ")")
            if not paren:
                out.append(")")
            continue
        if c == "<":
            depth += 1
            if depth == keep + 1:
                out.append("<…")
                continue
        elif c == ">" and depth > 0:
            depth -= 1
            if depth == keep:
                out.append(">")
                continue
        elif c == "(" and 0 < depth <= keep:
            paren = 1
            out.append("(…")
            continue
        if depth <= keep:
            out.append(c)
    return "".join(out)


@functools.lru_cache(maxsize=65536)
def short_name(name: Optional[str], width: Optional[int] = None) -> str:
    """A kernel name for tables people read: demangled, without its return type and parameter
    list, template arguments nested more than one level deep shown as <…>, and, with `width`,
    cut in the middle to that many characters. JSON and CSV keep the recorded name."""
    if not isinstance(name, str) or not name:
        return name or "?"
    s = demangle(name).strip()
    if s != name and s.endswith((" const", " volatile", " &", " &&")) and ")" in s:   # member qualifiers
        s = s[: s.rfind(")") + 1]
    if s != name and s.endswith(")"):
        i = _match_back(s, len(s) - 1, ")", "(")
        if i > 0:
            s = s[:i].rstrip()
        j = _last_top_level(s, " ")
        if j >= 0 and not s[j + 1:].startswith("operator"):
            s = s[j + 1:]
    if "<" in s:
        s = _collapse_templates(s, 1)
    if width is not None and len(s) > width > 8:
        tail = width // 3
        s = s[:width - tail - 1] + "…" + s[-tail:]
    return s


def name_for(name: Optional[str], base: str = "function") -> Optional[str]:
    """The name of a kernel in one of BASES."""
    if base == "mangled":
        return name
    if base == "demangled":
        return demangle(name)
    if base == "function":
        return function_name(name)
    raise ValueError(f"kernel name base must be one of {', '.join(BASES)}")
