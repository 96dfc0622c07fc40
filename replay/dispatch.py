"""The dispatch table: ABI name -> replay handler, built once from the API description.

REPLAY_HANDLED lists the ABI names the replayer executes or deliberately skips (queries);
`cudasnap api` reads it."""
from __future__ import annotations

import re
from typing import Dict, Optional, Set

from .handlers import Handler, load_all

# Queries: no effect on device state. Skipped (and counted).
_QUERY_RX = re.compile(
    r"^cu(DeviceGet(?!DefaultMemPool|MemPool)\w*|DeviceTotalMem\w*|DeviceComputeCapability|DeviceCanAccessPeer"
    r"|DriverGetVersion|CtxGet\w*|FuncGet\w*|KernelGet(?!Function)\w*|PointerGetAttributes?|GetErrorName"
    r"|GetErrorString|GetProcAddress\w*|GetExportTable|ModuleGetLoadingMode|MemGetInfo\w*|MemGetAddressRange\w*"
    r"|StreamGet\w*|StreamIsCapturing\w*|StreamQuery\w*|EventQuery|DevicePrimaryCtxGetState|MemGetAllocation\w*"
    r"|Occupancy\w*|MemPoolGetAttribute|ModuleGetFunctionCount|ModuleEnumerateFunctions|LibraryGetKernelCount"
    r"|LibraryEnumerateKernels|DeviceGetP2PAttribute"
    r"|CtxGetDevice\w*|FuncIsLoaded|MemGetAccess|MemRetainAllocationHandle|MemGetAllocationPropertiesFromHandle"
    r"|ProfilerStart|ProfilerStop|GraphGetNodes|GraphGetEdges\w*|GraphNodeGet\w*|GraphDebugDotPrint"
    r"|DeviceGetGraphMemAttribute|UserObject\w*|GetFlags)(_v\d+)?(_pt(sz|ds))?$")


def is_query(name: str) -> bool:
    return bool(_QUERY_RX.match(name))


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


def family_of(name: str) -> str:
    h = lookup(name)
    if h is not None:
        return h.family
    try:
        f = _desc().by_name(name)
        if f:
            return f.get("family") or "other"
    except Exception:
        pass
    return "other"


def _handled() -> Set[str]:
    out = set(table())
    try:
        for f in _desc().functions:
            if is_query(f["name"]):
                out.add(f["name"])
    except Exception:
        pass
    return out


REPLAY_HANDLED: Set[str] = _handled()
