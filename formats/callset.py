"""Call sets: the `--calls` selection syntax shared by `dump` and `replay`, plus API-name
classification helpers.

Syntax: comma-separated terms, a record matches when any term matches.
  N, N-M, N-, -M       sequence numbers (record key 's'), inclusive
  launches memcpy memset alloc free sync module graph event stream errors
                       groups of driver entry points ('errors': r != 0 or no return)
  anything else        case-insensitive regex (or plain substring when not a valid regex)
                       on the API name (f), and for launches on the kernel name
Only call records (k == "c") match.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from .abi import base_name
from .vocab import call_args, code_lookup, in_class, is_launch

Predicate = Callable[[Dict[str, Any], Optional[Mapping[Any, str]]], bool]

_base = base_name


def is_memcpy(f: str) -> bool:
    return in_class(f, "copy_group")


def is_memset(f: str) -> bool:
    return in_class(f, "memset_group")


def is_alloc(f: str) -> bool:
    return in_class(f, "alloc")


def is_free(f: str) -> bool:
    return in_class(f, "free")


def in_sync_group(f: str) -> bool:
    """The --calls group `sync`: host waits and the stream orderings and polls beside them."""
    return in_class(f, "sync") or in_class(f, "wait")


def is_module(f: str) -> bool:
    return in_class(f, "module_group")


def is_module_load(f: str) -> bool:
    return in_class(f, "loads_code")


def is_graph(f: str) -> bool:
    return in_class(f, "graph_group")


def is_error(rec: Mapping[str, Any]) -> bool:
    r = rec.get("r")
    return r is None or r != 0


GROUPS: Dict[str, Callable[[str], bool]] = {
    "launches": is_launch, "launch": is_launch,
    "memcpy": is_memcpy, "memset": is_memset,
    "alloc": is_alloc, "free": is_free,
    "sync": in_sync_group, "module": is_module, "modules": is_module,
    "graph": is_graph, "graphs": is_graph,
    "event": lambda f: in_class(f, "event_group"),
    "stream": lambda f: in_class(f, "stream_group"),
}


def launch_function_handle(rec: Mapping[str, Any]) -> Any:
    """The CUfunction/CUkernel handle a launch call refers to (tolerant of arg naming)."""
    a = rec.get("a")
    if not isinstance(a, dict):
        return None
    for key in ("f", "hfunc", "kernel", "func", "function", "hFunc"):
        v = a.get(key)
        if v is not None and not isinstance(v, (dict, list)):
            return v
    cfg = a.get("config")
    if isinstance(cfg, dict):
        v = cfg.get("f")
        if v is not None:
            return v
    return None


def names_function(f: str) -> bool:
    """Hands out a function or kernel handle, by name or from another handle."""
    return in_class(f, "names_function")


def asked_by_name(rec: Mapping[str, Any]) -> Optional[Tuple[Any, str]]:
    """(module or library, kernel name) of a successful call that asked one for a kernel by
    name; None for any other record."""
    if rec.get("r") != 0:
        return None
    f, a = rec.get("f") or "", call_args(rec)
    look = code_lookup(f) if in_class(f, "asks_by_name") else None
    if look and isinstance(a.get("name"), str):
        return a.get(look[1]), a["name"]
    return None


def learn_kernel_name(names: Dict[Any, str], rec: Mapping[str, Any]) -> None:
    """names (handle -> kernel name), as the recording goes: from an fn record's name, and from
    the calls that hand out a named handle (a function whose fn record has no name: the driver
    names a lazily loaded function only once it is loaded)."""
    if rec.get("k") == "fn":
        if rec.get("name"):
            names[rec.get("h")] = rec["name"]
        return
    if rec.get("r") != 0:
        return
    f, a = rec.get("f") or "", call_args(rec)
    look = code_lookup(f) if in_class(f, "names_function") else None
    if look is None or not isinstance(a.get(look[0]), int):
        return
    if in_class(f, "asks_by_name"):          # by name, in a module or library
        if isinstance(a.get("name"), str):
            names[a[look[0]]] = a["name"]
    elif isinstance(a.get(look[1]), int) and a[look[1]] in names:     # from a handle already named
        names[a[look[0]]] = names[a[look[1]]]


def kernel_name(rec: Mapping[str, Any], fn_names: Optional[Mapping[Any, str]]) -> Optional[str]:
    """Kernel name of a launch record via the fn records (map handle -> name), if known."""
    if not fn_names:
        return None
    h = launch_function_handle(rec)
    if h is None:
        return None
    try:
        return fn_names.get(h)
    except TypeError:
        return None


def parse_terms(spec: str) -> list:
    """The terms of a call-set spec: ("seq", lo, hi, exact) (hi None: open), ("group", test),
    ("errors",) or ("name", match). Raises ValueError on a malformed spec."""
    terms: list = []
    for raw in str(spec).split(","):
        term = raw.strip()
        if not term:
            continue
        m = re.fullmatch(r"(\d*)\s*-\s*(\d*)", term)
        if term.isdigit():
            terms.append(("seq", int(term), int(term), True))
        elif m and (m.group(1) or m.group(2)):
            lo = int(m.group(1)) if m.group(1) else 0
            hi = int(m.group(2)) if m.group(2) else None
            if hi is not None and hi < lo:
                raise ValueError(f"call set: empty range {term!r}")
            terms.append(("seq", lo, hi, False))
        elif term.lower() in GROUPS:
            terms.append(("group", GROUPS[term.lower()]))
        elif term.lower() in ("errors", "error", "failed"):
            terms.append(("errors",))
        else:
            try:
                rx = re.compile(term, re.IGNORECASE)
                match = rx.search
            except re.error:
                low = term.lower()
                match = lambda s, low=low: low in s.lower()  # noqa: E731
            terms.append(("name", match))
    if not terms:
        raise ValueError(f"call set: no terms in {spec!r}")
    return terms


def parse_callset(spec: Optional[str]) -> Predicate:
    """Compile a call-set spec into predicate(record, fn_names) -> bool.
    fn_names maps function handle -> kernel name (from 'fn' records); may be None.
    Raises ValueError on a malformed spec. None or '' selects every call."""
    if spec is None or not str(spec).strip():
        return lambda rec, fn_names=None: rec.get("k") == "c"
    tests = []
    for t in parse_terms(spec):
        if t[0] == "seq":
            if t[3]:
                tests.append(lambda rec, fn, n=t[1]: rec.get("s") == n)
            else:
                tests.append(lambda rec, fn, lo=t[1], hi=t[2]: _in_range(rec.get("s"), lo, hi))
        elif t[0] == "group":
            tests.append(lambda rec, fn, g=t[1]: g(_fname(rec)))
        elif t[0] == "errors":
            tests.append(lambda rec, fn: is_error(rec))
        else:
            tests.append(lambda rec, fn, match=t[1]: _name_match(rec, fn, match))

    def predicate(rec: Mapping[str, Any], fn_names: Optional[Mapping[Any, str]] = None) -> bool:
        if rec.get("k") != "c":
            return False
        return any(t(rec, fn_names) for t in tests)

    return predicate


def _fname(rec: Mapping[str, Any]) -> str:
    f = rec.get("f")
    return f if isinstance(f, str) else ""


def _in_range(s: Any, lo: int, hi: Optional[int]) -> bool:
    return isinstance(s, int) and s >= lo and (hi is None or s <= hi)


def _name_match(rec: Mapping[str, Any], fn_names, match) -> bool:
    f = _fname(rec)
    if match(f):
        return True
    if is_launch(f):
        k = kernel_name(rec, fn_names)
        return bool(k) and bool(match(k))
    return False
