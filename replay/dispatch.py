"""The dispatch table: ABI name -> replay handler, built once from the API description.

Every ABI name of the description falls in exactly one class:
- REPLAY_EXECUTED: a handler replays it (for real, or as a counted no-op where the call has
  no effect on results: hints, profiler control, host-side lifetimes);
- REPLAY_SKIPPED: a pure query (no effect on device state): skipped and counted;
- REPLAY_REFUSED: a handler that stops the replay with a one-line reason (name -> reason):
  what capture records is not enough to rebuild the call;
- anything else has no handler: replay stops with "unsupported".
REPLAY_HANDLED = REPLAY_EXECUTED | REPLAY_SKIPPED: what `cudasnap api` reports as replayable.
`coverage()` counts the classes per family."""
from __future__ import annotations

import re
from typing import Dict, Optional, Set

from .handlers import REGISTRY, Handler


def load_all() -> Dict[str, Handler]:
    """Every handler module, imported once: each registers its names in REGISTRY."""
    from .handlers import context, generic, graph, launch, memory, module, profiler, stream  # noqa: F401
    return REGISTRY

# Queries: no effect on device state. Skipped (and counted).  A name with a handler is never
# a query (the handler wins): e.g. cuDeviceGetDefaultMemPool maps the pool it returns.
_QUERY_RX = re.compile(
    r"^cu(DeviceGet(?!DefaultMemPool|MemPool)\w*|DeviceTotalMem\w*|DeviceComputeCapability|DeviceCanAccessPeer"
    r"|DriverGetVersion|CtxGet\w*|FuncGet\w*|KernelGet(?!Function)\w*|PointerGetAttributes?|GetErrorName"
    r"|GetErrorString|GetProcAddress\w*|GetExportTable|ModuleGetLoadingMode|MemGetInfo\w*|MemGetAddressRange\w*"
    r"|StreamGet\w*|StreamIsCapturing\w*|StreamQuery\w*|EventQuery|DevicePrimaryCtxGetState|MemGetAllocation\w*"
    r"|Occupancy\w*|MemPoolGetAttribute|ModuleGetFunctionCount|ModuleEnumerateFunctions|LibraryGetKernelCount"
    r"|LibraryEnumerateKernels|DeviceGetP2PAttribute"
    r"|CtxGetDevice\w*|FuncIsLoaded|MemGetAccess|MemGetAllocationPropertiesFromHandle"
    r"|GraphGetNodes|GraphGetRootNodes|GraphGetEdges\w*|GraphNodeGet\w*|Graph\w+NodeGet\w*|GraphExecGetFlags"
    r"|GraphDebugDotPrint|DeviceGetGraphMemAttribute|GetFlags"
    # TMA descriptors: the encoded 128-byte map reaches kernels inside the recorded parameter
    # bytes, and it stays valid because every allocation is placed at its recorded address
    r"|TensorMapEncode\w*)(_v\d+)?(_pt(sz|ds))?$")

# Pure queries the pattern above does not name (explicit, by base name).
QUERY_NAMES = frozenset({
    "cuMemHostGetFlags", "cuMemRangeGetAttributes", "cuMemPoolGetAccess", "cuArrayGetDescriptor",
    "cuArray3DGetDescriptor", "cuArrayGetMemoryRequirements", "cuArrayGetSparseProperties",
    "cuMipmappedArrayGetMemoryRequirements", "cuMipmappedArrayGetSparseProperties",
})


def _base(name: str) -> str:
    return re.sub(r"(_v\d+)?(_pt(sz|ds))?(_v\d+)?$", "", name)


def is_query(name: str) -> bool:
    return bool(_QUERY_RX.match(name)) or name in QUERY_NAMES or _base(name) in QUERY_NAMES


_table: Optional[Dict[str, Handler]] = None


def _desc():
    from cudasnap.shim.description import load
    return load()


def table() -> Dict[str, Handler]:
    """ABI name -> Handler, for every description entry with a handler (built once)."""
    global _table
    if _table is None:
        reg = load_all()
        t: Dict[str, Handler] = {}
        try:
            fns = _desc().functions
        except Exception:  # description missing: fall back to the registry's own names
            fns = [{"name": n, "base": n} for n in reg]
        for f in fns:
            h = reg.get(f["name"]) or reg.get(f.get("base") or "")
            if h is None:
                base = re.sub(r"(_v\d+)?(_pt(sz|ds))?(_v\d+)?$", "", f["name"])
                h = reg.get(base)
            if h is not None:
                t[f["name"]] = h
        for n, h in reg.items():
            t.setdefault(n, h)
        _table = t
    return _table


def lookup(name: str) -> Optional[Handler]:
    t = table()
    h = t.get(name)
    if h is None:
        base = re.sub(r"(_v\d+)?(_pt(sz|ds))?(_v\d+)?$", "", name)
        h = t.get(base)
    return h


def _classes():
    """(executed, skipped, refused) over the description's ABI names (plus registry names
    when the description is missing)."""
    t = table()
    try:
        names = [f["name"] for f in _desc().functions]
    except Exception:
        names = list(t)
    executed: Set[str] = set()
    skipped: Set[str] = set()
    refused: Dict[str, str] = {}
    for n in names:
        h = lookup(n)
        if h is not None:
            executed.add(n)
        elif is_query(n):
            skipped.add(n)
    return frozenset(executed), frozenset(skipped), refused


REPLAY_EXECUTED, REPLAY_SKIPPED, REPLAY_REFUSED = _classes()
REPLAY_HANDLED: Set[str] = set(REPLAY_EXECUTED | REPLAY_SKIPPED)


def coverage(statuses=("replay",)) -> Dict[str, Dict[str, int]]:
    """family -> {"handled", "skipped", "refused", "unhandled"} counts over the description's
    functions whose status is in `statuses` (None: all)."""
    out: Dict[str, Dict[str, int]] = {}
    for f in _desc().functions:
        if statuses is not None and f.get("status") not in statuses:
            continue
        n = f["name"]
        c = out.setdefault(f.get("family") or "other", {"handled": 0, "skipped": 0, "refused": 0, "unhandled": 0})
        if n in REPLAY_EXECUTED:
            c["handled"] += 1
        elif n in REPLAY_SKIPPED:
            c["skipped"] += 1
        elif n in REPLAY_REFUSED:
            c["refused"] += 1
        else:
            c["unhandled"] += 1
    return out
