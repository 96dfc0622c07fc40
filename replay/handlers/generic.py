"""Calls the API description says everything about: every argument a plain value or a handle an
earlier call made (passed as its live counterpart), every output a new handle (remembered for
the calls after) or a value replay has no use for. One function replays them all, from the
description's parameter list and handle kinds; the family modules keep only the calls that
need more (structs, arrays, memory, placement, counting)."""
from __future__ import annotations

from typing import Dict, List, Tuple

from cudasnap.formats.abi import strip_per_thread
from cudasnap.shim.description import load as load_description

from . import handles

# creators: the output handle is remembered
CREATE = ("cuStreamCreate", "cuStreamCreateWithPriority", "cuEventCreate", "cuGraphCreate", "cuGraphClone",
          "cuGraphNodeFindInClone", "cuGraphChildGraphNodeGetGraph")
# destroyers: the handle is forgotten after the call
DESTROY = ("cuStreamDestroy", "cuEventDestroy", "cuGraphDestroy", "cuGraphDestroyNode", "cuGraphExecDestroy",
           "cuArrayDestroy", "cuTexObjectDestroy", "cuSurfObjectDestroy")
# ordering and synchronization: re-executed even when they failed when recorded
ORDER = ("cuStreamSynchronize", "cuStreamWaitEvent", "cuEventRecord", "cuEventRecordWithFlags",
         "cuEventSynchronize")

_plans: Dict[str, Tuple[str, List[Tuple[str, str, str]]]] = {}


def _plan(ctx, rec) -> Tuple[str, List[Tuple[str, str, str]]]:
    """(binding name, [(param name, role, handle kind)]) for the recorded ABI name; role is
    "in" (a value or, with a kind, a handle), "out" (a handle to remember) or "skip"."""
    abi = rec["f"]
    plan = _plans.get(abi)
    if plan is None:
        desc = load_description()
        fn = next(f for f in desc.functions if f["name"] == abi)
        steps = []
        for p in fn["params"]:
            t = desc.types.get(p.get("pointee" if p["kind"] == "out" else "ctype") or "", {})
            kind = t.get("handle", "") if t.get("kind") == "handle" else ""
            if p["kind"] == "val":
                steps.append((p["name"], "in", kind))
            elif p["kind"] == "out":
                steps.append((p["name"], "out" if kind else "skip", kind))
            else:
                raise ValueError(f"{abi}: parameter {p['name']} ({p['kind']}) needs a hand-written handler")
        stripped = strip_per_thread(abi)
        names = [n for n in (fn["base"], stripped, fn["base"] + "_v2") if hasattr(ctx.cu, n)]
        plan = _plans[abi] = (names[0] if names else fn["base"], steps)
    return plan


def _live(ctx, rec, kind: str, h):
    if kind == "stream":
        return ctx.stream(rec, h)
    if kind == "graph":
        from .graph import graph
        return graph(ctx, rec, h)
    return ctx.live(rec, h, kind.replace("_", " "))


def _replay(ctx, rec):
    name, steps = _plan(ctx, rec)
    a = rec["a"]
    args = [(_live(ctx, rec, kind, a.get(p)) if kind else a.get(p, 0)) for p, role, kind in steps if role == "in"]
    out = ctx.drv(rec, name, *args)
    outs = [p for p, role, _k in steps if role != "in"]
    if out is None or not outs:
        return
    vals = out if len(outs) > 1 else (out,)
    for (p, role, _k), v in zip([s for s in steps if s[1] != "in"], vals):
        if role == "out":
            ctx.set_handle(a.get(p), v, _k)


def create(ctx, rec):
    _replay(ctx, rec)


def destroy(ctx, rec):
    _replay(ctx, rec)
    for p, role, kind in _plan(ctx, rec)[1]:
        if kind and role == "in":
            ctx.handles.pop(rec["a"].get(p), None)


def order(ctx, rec):
    _replay(ctx, rec)


def _register() -> None:
    """Each name under its family in the description (replay counts calls per family)."""
    desc = load_description()
    for names, fn, errors in ((CREATE, create, False), (DESTROY, destroy, False), (ORDER, order, True)):
        for n in names:
            f = desc.by_name(n) or {}
            handles(n, errors=errors, family=f.get("family") or "stream")(fn)


_register()
