"""The record vocabulary: what kind of call a call record is, in one place for formats/,
replay/, export/ and the command line.

Classes come from the API description (shim/api_description.json: each ABI name's family and
replay class); the name tests below are the ones the snapshot's own names need (a name the
description lacks is still a launch when it is spelled like one)."""
from __future__ import annotations

import re

from typing import Any, Dict, List, Mapping, Optional, Tuple

from .abi import base_name

# base name -> (address out param, size param) of a device allocation
ALLOC_PARAMS = {
    "cuMemAlloc": ("dptr", "bytesize"),
    "cuMemAllocAsync": ("dptr", "bytesize"),
    "cuMemAllocFromPoolAsync": ("dptr", "bytesize"),
    "cuMemAllocManaged": ("dptr", "bytesize"),
    "cuMemAddressReserve": ("ptr", "size"),
}

_class_of: Optional[Dict[str, str]] = None
_family_of: Optional[Dict[str, str]] = None
_releases: frozenset = frozenset()
_call_classes: Dict[str, frozenset] = {}


def _tables() -> Tuple[Dict[str, str], Dict[str, str], frozenset]:
    """ABI name (and base name) -> replay class, -> family; the names that release; built once."""
    global _class_of, _family_of, _releases
    if _class_of is None:
        # the description loader is standard library only: the one import formats/ makes outside itself
        from cudasnap.shim.description import load
        cls: Dict[str, str] = {}
        fam: Dict[str, str] = {}
        for f in load().functions:
            cls[f["name"]] = f["replay_class"]
            cls.setdefault(f["base"], f["replay_class"])
            fam[f["name"]] = f["family"]
            fam.setdefault(f["base"], f["family"])
        _releases = frozenset(n for f in load().functions if f.get("releases") for n in (f["name"], f["base"]))
        for f in load().functions:
            c = frozenset(f.get("classes") or ())
            _call_classes[f["name"]] = c
            _call_classes.setdefault(f["base"], c)
        _class_of, _family_of = cls, fam
    return _class_of, _family_of, _releases  # type: ignore[return-value]


def replay_class(name: str) -> Optional[str]:
    """query | execute | refuse | record for an ABI name (the description's replay_class; a
    name the description lacks takes the class of its base name), None when unknown."""
    m = _tables()[0]
    c = m.get(name)
    return c if c is not None else m.get(base_name(name))


def family(name: str) -> Optional[str]:
    """The description's family of an ABI name (memory, launch, graph, ...), None when unknown."""
    m = _tables()[1]
    c = m.get(name)
    return c if c is not None else m.get(base_name(name))


# the description's call classes (shim/overlay.py CALL_CLASS_RULES, and gen_api.derived_classes
# for what the parameter list says); read here only
CALL_CLASSES = ("sync", "wait", "order", "alloc", "free", "may_batch", "destroys", "creates", "plain_args",
                "loads_code", "asks_by_name", "names_function", "refers_code", "names_global", "starts_profiler",
                "stops_profiler", "host_alloc",
                "pins_host", "begins_capture", "ends_capture", "links_process", "imports_peer", "waits_event",
                "polls", "records_event", "moves_memory", "h2d_copy", "unified_copy", "device_alloc", "vmm_map",
                "physical_memory", "sets_kernel_node", "sets_node", "makes_context", "ends_context", "gets_ipc",
                "opens_ipc", "module_group", "graph_group", "sim_noop", "sim_setup", "sim_alloc", "sim_free",
                "memset_1d", "launches_kernel", "shim_placement", "shim_placement_after", "host_visible",
                "copy_group", "launch_group", "memset_group", "d2h_copy", "d2d_copy", "instantiates",
                "event_group", "stream_group", "selectable", "no_effect", "maps_range", "unmaps_range",
                "sets_access", "imports_shareable", "exports_shareable", "ipc_event", "enables_peer",
                "opens_ipc_memory", "closes_ipc_memory", "adds_node", "adds_child_graph", "updates_exec",
                "config_launch", "loads_library", "encodes_tensor_map", "sets_current", "pushes_context",
                "pops_context", "managed_alloc", "retains_primary", "stream_callback", "gets_ipc_memory",
                "frees_alloc", "stream_event_life", "makes_view_object", "cooperative_launch", "inits_driver")


def call_classes(name: str) -> frozenset:
    """The description's classes of an ABI name (its base name's when the name is unknown)."""
    _tables()
    c = _call_classes.get(name)
    return c if c is not None else _call_classes.get(base_name(name), frozenset())


_overrides: Dict[str, Mapping[str, Any]] = {}


def override(name: str) -> Mapping[str, Any]:
    """The hooks of a function with semantics of its own (the description's "overrides", from
    shim/overlay.py OVERRIDES): replay handler, export method, capture handler...; {} for one
    that replays and exports by its class."""
    if not _overrides:
        from cudasnap.shim.description import load
        for f in load().functions:
            o = f.get("overrides") or {}
            _overrides[f["name"]] = o
            _overrides.setdefault(f["base"], o)
    got = _overrides.get(name)
    return got if got is not None else _overrides.get(base_name(name), {})


def overridden() -> List[Tuple[str, str, Mapping[str, Any]]]:
    """(ABI name, base name, hooks) of every function the overrides table names."""
    override("")
    from cudasnap.shim.description import load
    return [(f["name"], f["base"], f["overrides"]) for f in load().functions if f.get("overrides")]


_in_class: Dict[Tuple[str, str], bool] = {}     # (name, class) -> answer: replay asks per call


def in_class(name: Any, cls: str) -> bool:
    if not isinstance(name, str):
        return False
    k = (name, cls)
    r = _in_class.get(k)
    if r is None:
        assert cls in CALL_CLASSES, cls
        r = _in_class[k] = cls in call_classes(name)
    return r


def is_sync(f: Any) -> bool:
    """The host waits for the device (cuCtx/Stream/EventSynchronize): a step boundary."""
    return in_class(f, "sync")


def may_batch(f: Any) -> bool:
    """May stand between the launches of a profiled sequence's recorded graph."""
    return in_class(f, "may_batch")


def makes_address_range(f: str) -> bool:
    """Device allocations and address reservations (cuMemAlloc*, cuMemAddressReserve): what
    replay places at its recorded address (a prefix test: every ABI version and variant)."""
    return f.startswith(("cuMemAlloc", "cuMemAddressReserve"))


def selectable(f: Any) -> bool:
    """Work a selection may leave out beside kernel launches: graph launches, copies that read
    device memory back, memsets."""
    return in_class(f, "selectable")


def no_effect(f: Any) -> bool:
    """A hint or a host-side lifetime: no effect on results (replay counts it, export drops it)."""
    return in_class(f, "no_effect")


def is_plain(f: Any) -> bool:
    """Every argument a value or a handle, every output a value or a new handle: replay and
    export need nothing beyond the description's entry for it."""
    return in_class(f, "plain_args")


def is_release(f: str) -> bool:
    """Does the call give back memory or a mapping a launch may reach (the description's
    `releases`, overlay.RELEASES_RX)?"""
    return f in _tables()[2]


def is_query(name: str) -> bool:
    """A pure query: no effect on device state, skipped on replay."""
    return replay_class(name) == "query"


def is_launch(f: str) -> bool:
    """A kernel launch (cuLaunchKernel, cuLaunchKernelEx, cooperative...; not cuLaunchHostFunc)."""
    return type(f) is str and f.startswith("cuLaunch") and not f.startswith("cuLaunchHostFunc")   # a damaged record's name may be anything


def is_graph_launch(f: Optional[str]) -> bool:
    return type(f) is str and base_name(f) == "cuGraphLaunch"


def is_workload(f: str) -> bool:
    """Work whose results a run reads back: launches (kernels and graphs), copies and memsets
    -- not context, memory or module set-up."""
    if type(f) is not str:             # a damaged record: its handler reports it
        return False
    return is_launch(f) or f.startswith(("cuGraphLaunch", "cuMemcpy", "cuMemset"))


_params_of: Dict[str, Tuple[Tuple[str, str, str], ...]] = {}


def typed_params(name: str) -> Tuple[Tuple[str, str, str], ...]:
    """(parameter, what it is, type) of an ABI name's parameters the description types: "handle"
    with the handle's kind (array, stream...) for a handle passed in, "makes" with its kind for a
    handle handed out, "struct" with the struct type for a struct passed in; () when unknown."""
    if not _params_of:
        from cudasnap.shim.description import load
        d = load()
        for f in d.functions:
            out = []
            for p in f.get("params") or ():
                kind = p.get("kind")
                tname = p.get("pointee") if kind in ("out", "in_struct") else (p.get("ctype") or "").strip()
                t = d.types.get(tname or "") or {}
                if t.get("kind") == "handle" and kind in ("val", "out"):
                    out.append((p["name"], "makes" if kind == "out" else "handle", t.get("handle") or ""))
                elif kind == "in_struct" and t.get("kind") == "struct":
                    out.append((p["name"], "struct", tname))
            _params_of[f["name"]] = tuple(out)
            _params_of.setdefault(f["base"], tuple(out))
    got = _params_of.get(name)
    return got if got is not None else _params_of.get(base_name(name), ())


def first_param(name: Any) -> Optional[str]:
    """The name of a function's first parameter in the description (a free's pointer, the handle
    a creation hands out or a destruction takes); None when unknown."""
    if not isinstance(name, str):
        return None
    from cudasnap.shim.description import load
    fn = load().by_name(name) or load().by_name(base_name(name)) or {}
    ps = fn.get("params") or ()
    return ps[0]["name"] if ps else None


def memset_width(name: Any) -> int:
    """Bytes per element a memset writes (its value parameter's size: cuMemsetD8/16/32), 1 for
    another call."""
    if not in_class(name, "memset_group"):
        return 1
    from cudasnap.shim.description import load
    fn = load().by_name(name) or load().by_name(base_name(name)) or {}
    return next((p["size"] for p in fn.get("params") or () if p["name"] in ("uc", "us", "ui")), 1)


def code_lookup(name: Any) -> Optional[Tuple[str, str, str]]:
    """A kernel lookup (class refers_code: cuModuleGetFunction, cuLibraryGetKernel...): (the
    parameter of the handle it makes, that of the handle it looks in, that handle's kind), from
    the description's parameter types; None for other calls."""
    if not in_class(name, "refers_code"):
        return None
    ps = typed_params(name)
    made = [p for p, what, _k in ps if what == "makes"]
    src = [(p, k) for p, what, k in ps if what == "handle"]
    return (made[0], src[0][0], src[0][1]) if made and src else None


def call_args(rec: Mapping[str, Any]) -> Mapping[str, Any]:
    """A call record's arguments; {} where they are missing or not a map (malformed_call)."""
    a = rec.get("a")
    return a if isinstance(a, dict) else {}


def malformed_call(rec: Mapping[str, Any]) -> bool:
    """A call record without a function name, whose arguments or extras are not maps, or whose
    thread is not a number (a damaged or foreign file): no layer can read it, so replay skips it
    and says so, export and extract refuse the snapshot naming it."""
    return (not isinstance(rec.get("f"), str) or not isinstance(rec.get("a", {}), dict)
            or not isinstance(rec.get("x", {}), dict) or not isinstance(rec.get("tid"), (int, type(None))))


def alloc_range(rec: Mapping[str, Any]) -> Optional[Tuple[int, int]]:
    """(recorded base, size) of a successful device allocation call, or None."""
    f = rec.get("f")
    a = rec.get("a")
    if not isinstance(f, str) or rec.get("r", 0) != 0 or rec.get("incomplete") or not isinstance(a, Mapping):
        return None
    b = base_name(f)
    if b == "cuMemAllocPitch":
        p, pitch, h = a.get("dptr"), a.get("pPitch"), a.get("Height")
        if isinstance(p, int) and isinstance(pitch, int) and isinstance(h, int):
            return p, pitch * h
        return None
    ent = ALLOC_PARAMS.get(b)
    if ent is None:
        return None
    p, n = a.get(ent[0]), a.get(ent[1])
    if isinstance(p, int) and isinstance(n, int) and p:
        return p, n
    return None


# Collective kernels (NCCL, RCCL), demangled or mangled: a rank's launch of one waits inside the
# kernel for its peers, so it cannot run alone (extract, isolated, graph mode) and its time is
# not the kernel's alone (compare).
# written for Python's re and POSIX extended regexes alike: the shim matches names with it too
# (handed over as CUDASNAP_COLLECTIVE_RX, case ignored)
COLLECTIVE_KERNEL = re.compile(r"(nccl|rccl)[A-Za-z0-9_]*Kernel|nccl_", re.I)


def is_collective_kernel(name: Any) -> bool:
    return isinstance(name, str) and bool(COLLECTIVE_KERNEL.search(name))


def handle_array(rec: Mapping[str, Any], key: str, count_key: str) -> Optional[List[int]]:
    """The recorded handles of an array argument (graph node dependencies, ...): a[count_key]
    64-bit values in a[key]; [] for none, None when the array was not captured."""
    a = call_args(rec)
    n = a.get(count_key) or 0
    if not isinstance(n, int):
        return None
    if n <= 0:
        return []
    raw = a.get(key)
    if not isinstance(raw, (bytes, bytearray)) or len(raw) < 8 * n:
        return None
    return [int.from_bytes(raw[8 * i:8 * i + 8], "little") for i in range(n)]


# Graph node-list queries a program may keep handles from: base name -> (array of nodes, its
# count, the object asked, that object's handle kind). Replay and export ask the same question
# of the graph they built and name the recorded nodes by position.
NODE_LISTS = {"cuGraphGetNodes": ("nodes", "numNodes", "hGraph", "graph"),
              "cuGraphGetRootNodes": ("rootNodes", "numRootNodes", "hGraph", "graph"),
              "cuGraphNodeGetDependencies": ("dependencies", "numDependencies", "hNode", "graph node"),
              "cuGraphNodeGetDependentNodes": ("dependentNodes", "numDependentNodes", "hNode", "graph node")}
