"""The dispatch table: ABI name -> replay handler, built once from the API description.

What replay does with a call is the description's "replay_class" (shim/overlay.py,
REPLAY_CLASS_RULES); every ABI name of the description falls in exactly one class here:
- REPLAY_EXECUTED: a handler replays it (for real, or as a counted no-op where the call has
  no effect on results: hints, profiler control, host-side lifetimes);
- REPLAY_SKIPPED: a pure query (class "query": no effect on device state): skipped and counted;
- REPLAY_REFUSED: class "refuse" (name -> reason): cannot be replayed;
- anything else has no handler: replay stops with "unsupported".
REPLAY_HANDLED = REPLAY_EXECUTED | REPLAY_SKIPPED: what `cudasnap api` reports as replayable.
`coverage()` counts the classes per family."""
from __future__ import annotations

from typing import Dict, Optional, Set

from cudasnap.formats.abi import base_name
from cudasnap.formats.vocab import is_query, overridden, replay_class  # noqa: F401  (the dispatcher's classes)
from cudasnap.shim.description import load as _desc

from .handlers import REGISTRY, Handler


def load_all() -> Dict[str, Handler]:
    """Every handler the overrides table names (shim/overlay.py OVERRIDES, through the
    description), then by class what it leaves; built once into REGISTRY."""
    from .handlers import context, generic, graph, ipc, launch, memory, module, profiler, stream, texture
    if REGISTRY:
        return REGISTRY
    mods = {m.__name__.rpartition(".")[2]: m for m in (context, graph, ipc, launch, memory, module, profiler,
                                                        stream, texture)}
    for name, base, o in overridden():
        ref = o.get("replay")
        if ref:
            mod, _, fn = ref.partition(".")
            h = Handler(getattr(mods[mod], fn), bool(o.get("errors")), o.get("family") or mod, o.get("via") or "")
            REGISTRY[name] = h
            REGISTRY.setdefault(base, h)
    generic.register_plain()          # by class: what the table leaves
    return REGISTRY


_table: Optional[Dict[str, Handler]] = None


def table() -> Dict[str, Handler]:
    """ABI name -> Handler, for every description entry with a handler (built once)."""
    global _table
    if _table is None:
        reg = load_all()
        t: Dict[str, Handler] = {}
        for f in _desc().functions:
            h = reg.get(f["name"]) or reg.get(f["base"])
            if h is not None:
                t[f["name"]] = h
        for n, h in reg.items():
            t.setdefault(n, h)
        _table = t
    return _table


def lookup(name: str) -> Optional[Handler]:
    t = table()
    h = t.get(name)
    return h if h is not None else t.get(base_name(name))


def unhandled(name: str) -> bool:
    """No handler replays the call and it is no query: replay refuses a snapshot holding a
    successful one (engine.py), and `info` names it."""
    return lookup(name) is None and not is_query(name)


def _classes():
    """(executed, skipped, refused) over the description's ABI names."""
    executed: Set[str] = set()
    skipped: Set[str] = set()
    refused: Dict[str, str] = {}
    for f in _desc().functions:
        n = f["name"]
        if lookup(n) is not None:
            executed.add(n)
        elif f["replay_class"] == "query":
            skipped.add(n)
        elif f["replay_class"] == "refuse":
            refused[n] = f["reason"] or "cannot be replayed"
    return frozenset(executed), frozenset(skipped), refused


REPLAY_EXECUTED, REPLAY_SKIPPED, REPLAY_REFUSED = _classes()
REPLAY_HANDLED: Set[str] = set(REPLAY_EXECUTED | REPLAY_SKIPPED)


def replayed_by(name: str) -> Optional[str]:
    """How replay takes ABI name `name`: "skipped" (a query), "class" (a plain call, from the
    description: handlers/generic.py), "handler" (code of its own); None: not replayed."""
    if name in REPLAY_SKIPPED:
        return "skipped"
    h = lookup(name) if name in REPLAY_EXECUTED else None
    if h is None:
        return None
    from .handlers.generic import replay_no_effect, replay_plain
    return "class" if h.fn is replay_plain or h.fn is replay_no_effect else "handler"


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
