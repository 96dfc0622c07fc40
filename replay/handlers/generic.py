"""Calls the API description says everything about (class plain_args): every argument a plain
value or a handle an earlier call made (passed as its live counterpart), every output a new
handle (remembered for the calls after) or a value replay has no use for. One function replays
every such call of class execute that has no handler of its own, from the description's
parameter list and handle kinds; a call of class destroys forgets its handle, and one that
orders or waits (sync, wait, order) runs even when it failed when recorded. The family modules
keep only the calls that need more (structs, arrays, memory, placement, counting). A function
the driver bindings do not wrap (newer than them, or declared by the overlay) is called through
its description (replay/rawcall.py)."""
from __future__ import annotations

from typing import Dict, List, Tuple

from cudasnap.formats.abi import strip_per_thread
from cudasnap.shim.description import load as load_description

from cudasnap.formats.vocab import in_class, is_plain, no_effect

from . import REGISTRY, Handler

_plans: Dict[str, Tuple[str, List[Tuple[str, str, str]]]] = {}


def _plan(ctx, rec) -> Tuple[str, List[Tuple[str, str, str]]]:
    """(binding name, [(param name, role, handle kind)]) for the recorded ABI name; role is
    "in" (a value or, with a kind, a handle), "out" (a handle to remember) or "skip"."""
    abi = rec["f"]
    plan = _plans.get(abi)
    if plan is None:
        desc = load_description()
        fn = desc.by_name(abi)
        steps = []
        for p in fn["params"]:
            t = desc.types.get(p.get("pointee" if p["kind"] == "out" else "ctype") or "", {})
            kind = t.get("handle", "") if t.get("kind") == "handle" else ""
            if p["kind"] == "val":
                # a device address: where this replay placed it (the same unless relocated)
                steps.append((p["name"], "in", kind or ("address" if t.get("semantic") == "deviceptr" else "")))
            elif p["kind"] == "out":
                steps.append((p["name"], "out" if kind else "skip", kind))
            else:
                raise ValueError(f"{abi}: parameter {p['name']} ({p['kind']}) needs a hand-written handler")
        stripped = strip_per_thread(abi)
        names = [n for n in (fn["base"], stripped, fn["base"] + "_v2") if hasattr(ctx.cu, n)]
        # None: the bindings lack it; ctx.drv calls the recorded ABI symbol through the description
        plan = _plans[abi] = (names[0] if names else None, steps)
    return plan


def _live(ctx, rec, kind: str, h):
    if kind == "address":
        return ctx.tr(h)
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
    out = ctx.drv(rec, name or rec["f"], *args)
    outs = [p for p, role, _k in steps if role != "in"]
    if out is None or not outs:
        return
    vals = out if len(outs) > 1 else (out,)
    for (p, role, _k), v in zip([s for s in steps if s[1] != "in"], vals):
        if role == "out":
            ctx.set_handle(a.get(p), v, _k)


def replay_plain(ctx, rec):
    _replay(ctx, rec)
    if in_class(rec["f"], "destroys"):
        for p, role, kind in _plan(ctx, rec)[1]:
            if kind and kind != "address" and role == "in":
                ctx.handles.pop(rec["a"].get(p), None)
                break


def replay_no_effect(ctx, rec):
    pass        # a hint or a host-side lifetime (class no_effect): counted, no effect on results


def register_plain() -> None:
    """Every plain execute-class ABI name no family module handles, under its family (replay
    counts calls per family); dispatch.py calls it once the family modules registered theirs."""
    desc = load_description()
    taken = set(REGISTRY)
    for f in desc.functions:
        if f["replay_class"] != "execute" or f["name"] in taken or f["base"] in taken:
            continue
        if no_effect(f["name"]):
            REGISTRY[f["name"]] = Handler(replay_no_effect, False, f.get("family") or "stream")
            continue
        if not is_plain(f["name"]):
            continue
        errors = any(in_class(f["name"], c) for c in ("sync", "wait", "order"))
        REGISTRY[f["name"]] = Handler(replay_plain, errors, f.get("family") or "stream")
