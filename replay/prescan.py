"""The replay's one pass over a snapshot's records, before any driver work (Prescan): the
plan of batches the loop replays (plan.py, plannative.py), the replay index of every other
record (index.py), and what placement, staging, the preflight and the handlers need to know
first: allocation ranges, capture's placement zones, pinned host memory, contexts, functions,
code loads, calls no handler replays, the D2H expectations read ahead."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

from cudasnap.formats.container import record_list
from cudasnap.formats.callset import asked_by_name, is_module_load, names_function
from cudasnap.formats.vocab import alloc_range, in_class, is_workload, makes_address_range, malformed_call

from . import dispatch, hostplace
from .batchrun import D2H_AHEAD_EACH, D2H_AHEAD_TOTAL
from .index import IndexedReader, ReplayIndex
from .plan import PLAN_MAX_RECORDS, Planner, Ranges, SlotMap, Slots


# what the pass finds (kept and taken whole by a kept worker's next replay of the snapshot)
_FOUND = ("fast", "pr", "pace", "total", "incomplete", "malformed", "ranges", "regions", "host_ranges", "ipc_shared",
          "unhandled", "workload_last", "plan", "t_origin", "alloc_bytes", "h2d_bytes", "slots", "expected",
          "expected_bytes", "ranges_set", "fk", "index", "h2d_order", "planner")


class Prescan:
    """The pass and what it found; the Replayer reads the fields. fast: compile a plan of
    batches (engine.Replayer.fast_eligible); pr: --profiler-range workload (the last workload
    call is found here)."""

    def __init__(self, ctx, fast: bool, pr: bool):
        self.ctx = ctx
        self.fast, self.pr = fast, pr
        self.pace = getattr(ctx.opt, "pace", "fast") == "recorded"
        self.total = 0
        self.incomplete: List[Dict[str, Any]] = []
        self.malformed: List[Dict[str, Any]] = []          # call records skipped (vocab.malformed_call)
        self.ranges: List[Tuple[int, int]] = []
        self.regions: List[Tuple[int, int]] = []           # capture placement zones ("region" records)
        self.host_ranges: List[Tuple[int, int]] = []       # recorded pinned host memory (hostplace)
        self.ipc_shared: List[int] = []                    # addresses shared through legacy IPC
        self.unhandled: Dict[str, List[int]] = {}          # ABI name -> [calls, first seq]: no replay handler
        self.workload_last: Optional[int] = None           # seq of the last workload call (profiler range)
        self.plan: Optional[List[Any]] = None
        self.t_origin: Optional[int] = None
        self.alloc_bytes = 0                               # recorded allocations' bytes (run.timings_s)
        self.h2d_bytes = 0                                 # H2D copies' recorded bytes

    def run(self) -> None:
        """The pass; in a kept worker, a pass made for an earlier replay of this snapshot with
        the same options is taken instead (keep.py): nothing is decoded or planned again."""
        from . import keep
        key = self._keep_key()
        got = keep.take(key)
        if got is not None:
            self._adopt(got)
            return
        n_notes = len(self.ctx.res.warnings)
        self._scan()
        if key is not None:
            keep.put(key, self._kept(n_notes))
            self.ctx.res.phases["count.plan_reused"] = 0

    def _keep_key(self):
        """What a kept pass must match: the snapshot's reader, and every option the pass reads;
        None where records may be changed by the replay (--launch-override, a job's rank)."""
        from . import keep
        from .group import ENV_RANK
        o = self.ctx.opt
        if not keep.enabled() or getattr(o, "launch_override", None) or os.environ.get(ENV_RANK):
            return None
        return (keep.reader_key(self.ctx.reader), self.fast, self.pr, self.pace, bool(o.call_order))

    def _kept(self, n_notes: int) -> Dict[str, Any]:
        """This pass, and copies of what it found that the replay's handlers go on to change."""
        c = self.ctx
        # the D2H results read ahead as the pass left them (a plan compiled as the loop reads,
        # in call order or past PLAN_MAX_RECORDS, adds to the replay's own dict, never the kept one)
        scan = {k: getattr(self, k) for k in _FOUND}
        scan["expected"] = dict(self.expected)
        return {"scan": scan, "bytes": self.expected_bytes,
                "notes": c.res.warnings[n_notes:],
                "names_in": {k: set(v) for k, v in c.names_in.items()}, "code_loads": list(c.code_loads),
                "ctx_ids": {k: dict(v) for k, v in c.ctx_ids.items()}, "fns": dict(c.fns),
                "fn_versions": {k: list(v) for k, v in c.fn_versions.items()}, "func_names": dict(c.func_names)}

    def _adopt(self, kept: Dict[str, Any]) -> None:
        """A kept pass made this replay's: its findings copied into this replay's context, the
        handles' slots emptied (the executor reads this replay's live handles there)."""
        c = self.ctx
        for k, v in kept["scan"].items():
            setattr(self, k, v)
        # what this replay may add to or change: its own (the plan, index, slots, ranges and
        # planner are only read, or added to as the snapshot's fixed numbering)
        self.expected = dict(self.expected)
        self.incomplete, self.malformed = list(self.incomplete), list(self.malformed)
        self.unhandled = {k: list(v) for k, v in self.unhandled.items()}
        self.h2d_order, self.host_ranges = list(self.h2d_order), list(self.host_ranges)
        self.ipc_shared = list(self.ipc_shared)
        c.res.warnings.extend(kept["notes"])
        c.names_in = {k: set(v) for k, v in kept["names_in"].items()}
        c.code_loads = list(kept["code_loads"])
        c.ctx_ids = {k: dict(v) for k, v in kept["ctx_ids"].items()}
        c.fns, c.func_names = dict(kept["fns"]), dict(kept["func_names"])
        c.fn_versions = {k: list(v) for k, v in kept["fn_versions"].items()}
        sl = self.slots
        sl.values = sl.ffi.new("uint64_t[]", len(sl.values)) if sl.ffi is not None else [0] * len(sl.values)
        c.handles._all = SlotMap(sl, "h", c.handles._all)
        c.funcs = SlotMap(sl, "f", c.funcs)
        c.reader = IndexedReader(c.reader, self.index, self.expected)
        c.res.phases["count.plan_reused"] = 1

    def _scan(self) -> None:
        from .executor import module
        mod = module()
        self.slots = Slots(mod.ffi if mod is not None else None)
        self.expected: Dict[str, bytes] = {}
        self.expected_bytes = 0
        self.ranges_set = Ranges()
        hs = self.ctx.handles          # handlers store live handles there: the slots follow
        hs._all = SlotMap(self.slots, "h", hs._all)
        self.ctx.funcs = SlotMap(self.slots, "f", self.ctx.funcs)
        self.fk: Dict[str, int] = {}
        # in call order the loop sorts the records itself: nothing is compiled in file order
        planner = self.new_planner(keep=False) if self.ctx.opt.call_order else self.new_planner(native=True)
        index = self.index = ReplayIndex()       # every other reader of the records reads this pass
        index.graph_calls = False
        # in call order nothing is compiled: the calls are kept as read, the index's (the loop sorts them)
        kept_calls: Optional[List[Dict[str, Any]]] = [] if not planner.keeping else None
        self.h2d_order: List[str] = []
        self.planner = planner
        max_seq = -1          # the highest call sequence number read so far, in file order
        fkind = self.fkind
        take = getattr(planner, "take", None)     # the C walk's call count and highest seq

        def one(rec) -> None:
            nonlocal max_seq, kept_calls
            if take is not None:
                n, mx, wl = take()
                self.total += n
                index.planned += n
                if mx is not None and mx > max_seq:
                    max_seq = mx
                if wl is not None:
                    self.workload_last = wl
            k = rec.get("k")
            if k == "c":
                if rec.get("incomplete") or "r" not in rec:
                    self.incomplete.append(rec)
                    index.keep(rec)
                    return
                if malformed_call(rec):
                    self.malformed.append(rec)
                    index.keep(rec)
                    return
                self.total += 1
                sq = rec.get("s")
                if type(sq) is int and sq > max_seq:
                    max_seq = sq
                if self.pr and rec.get("r") == 0 and is_workload(rec.get("f") or "") and type(sq) is int:
                    self.workload_last = sq
                fk = fkind(rec.get("f", ""))
                rng = alloc_range(rec) if fk & 1 else None
                if rng:
                    self.alloc_bytes += rng[1]
                    self.ranges.append(rng)
                    self.ranges_set.add(*rng)
                if planner.keeping:
                    planner.add(rec)
                    index.planned += 1
                elif kept_calls is not None:
                    kept_calls.append(rec)
                    index.planned += 1
                    if len(kept_calls) > PLAN_MAX_RECORDS:       # too big to keep: the loop reads the file
                        kept_calls = None
                if not fk:
                    return
                if fk & 64:
                    asked = asked_by_name(rec)
                    if asked is not None and isinstance(asked[0], int):
                        self.ctx.names_in.setdefault(asked[0], set()).add(asked[1])
                if fk & 128 and rec.get("r") == 0 and type(sq) is int:
                    self.ctx.code_loads.append(rec)              # functions.hoist_loads
                if fk & 448:
                    index.code.append(rec)                       # retarget.module_loads
                if fk & 512:
                    index.graph_calls = True                     # profile/graphunits.RecordedGraphs
                if fk & 32 and rec.get("r") == 0:
                    u = self.unhandled.get(rec["f"])
                    if u is None:
                        self.unhandled[rec["f"]] = [1, sq]
                    else:
                        u[0] += 1
                if fk & 2 and rec.get("r") == 0:
                    # a context made current before its retain is the primary one
                    h = (rec.get("a") or {}).get("pctx")
                    if isinstance(h, int) and h:
                        self.ctx.ctx_ids.setdefault(h, {"h": h, "device": (rec.get("a") or {}).get("dev")})["primary"] = True
                if fk & 8 and rec.get("r") == 0:
                    self.host_ranges.append(hostplace.recorded_range(rec))    # reserved before the driver loads
                if fk & 16 and isinstance((rec.get("a") or {}).get("dptr"), int):
                    self.ipc_shared.append(rec["a"]["dptr"])       # shared through legacy IPC
                if fk & 4:
                    ref = (rec.get("x") or {}).get("srcHost")
                    if isinstance(ref, dict) and isinstance(ref.get("blob"), str) and rec.get("r", 0) == 0:
                        self.h2d_bytes += self._blob_size(ref["blob"])
                        if len(self.h2d_order) < 4096:
                            self.h2d_order.append(ref["blob"])
                return
            if k != "b":               # blob records: the reader's own (the C walk passes over them)
                index.keep(rec)
            if k == "fn" and isinstance(rec.get("h"), int):
                self.ctx.add_fn(rec, max_seq)
            elif k == "repair" and (rec.get("lost_bytes") or rec.get("lost_records") or rec.get("unknown_gaps")):
                self.ctx.note(f"snapshot was repaired: {rec.get('lost_bytes', 0)} damaged bytes dropped "
                          f"({rec.get('lost_records', 0)} records known lost); calls may be missing from it")
            elif k == "ctx" and isinstance(rec.get("h"), int):
                self.ctx.ctx_ids.setdefault(rec["h"], dict(rec))
            elif k == "note" and str(rec.get("msg") or "").startswith("limitation:"):
                # what capture could not see (kernels reading host-visible memory directly):
                # the replay's verdict holds only for what was recorded
                self.ctx.note(f"capture: {rec['msg']}")

            elif k == "region" and isinstance(rec.get("base"), int) and isinstance(rec.get("size"), int):
                # capture's placement zone: reserved whole, first, so allocations land inside
                self.regions.append((rec["base"], rec["size"]))

        walk = getattr(planner, "walk", None)
        path = self.ctx.reader.path
        for off, count, payload, recs, checked in self.ctx.reader.record_payloads():
            if recs is None and walk is not None and planner.keeping and walk(payload, count, off, checked, one):
                continue
            for rec in (record_list(payload, count, path, off) if recs is None else recs):
                one(rec)
        if take is not None:
            n, _, wl = take()
            self.total += n
            index.planned += n
            if wl is not None:
                self.workload_last = wl
        # the records, decoded once: the main loop replays from this plan (None when the
        # snapshot is too big to keep: the loop reads the file again)
        self.plan = planner.finish() if planner.keeping else None
        self.t_origin = planner.t_origin
        index.attach_plan(self.plan if self.plan is not None else kept_calls)
        self.ctx.reader = IndexedReader(self.ctx.reader, index, self.expected)

    def _blob_size(self, bid: str) -> int:
        try:
            return self.ctx.reader.blob_size(bid) if self.ctx.reader.has_blob(bid) else 0
        except Exception:
            return 0

    def unhandled_text(self) -> str:
        """The calls no handler replays, all named before any driver work (a replay would stop
        at the first; --continue-on-error replays the rest and reports each)."""
        parts = [f"{f} ({n} call{'s' if n > 1 else ''}, first #{first})"
                 for f, (n, first) in sorted(self.unhandled.items(), key=lambda kv: kv[1][1] if isinstance(kv[1][1], int) else 0)]
        return ("unsupported: the snapshot holds calls replay does not handle: " + ", ".join(parts[:6])
                + (f" and {len(parts) - 6} more" if len(parts) > 6 else "")
                + "; nothing was replayed (--continue-on-error replays the rest and reports each)")

    def fkind(self, f) -> int:
        """Per name: 1 allocation, 2 primary context retain, 4 H2D prefetched, 8 pinned host
        memory, 16 shared through legacy IPC, 32 no replay handler, 64 names a kernel of a module
        or library (functions.preload_functions), 128 loads a module or library
        (functions.hoist_loads), 256 refers to code (the index's code_records), 512 builds,
        captures or launches a graph (the index's graph_calls). Non-zero: the
        pre-scan reads the call itself, so the C plan walk hands it over."""
        if type(f) is not str:
            return 0                   # a damaged record: its handler reports it
        fk = self.fk.get(f)
        if fk is None:
            fk = ((1 if makes_address_range(f) else 0)
                  | (2 if in_class(f, "retains_primary") else 0)
                  | (4 if in_class(f, "h2d_copy") else 0)    # its blob read ahead (staging.py)
                  | (8 if in_class(f, "pins_host") else 0)
                  | (16 if in_class(f, "gets_ipc_memory") else 0)
                  | (32 if dispatch.unhandled(f) else 0)
                  | (64 if names_function(f) else 0)
                  | (128 if is_module_load(f) else 0)
                  | (256 if in_class(f, "refers_code") else 0)
                  | (512 if in_class(f, "graph_group") else 0))
            self.fk[f] = fk
        return fk

    def expected_blob(self, bid: str) -> Optional[bytes]:
        """The plan's blob prefetch for verification points: the expected bytes of a small D2H
        copy, read while compiling (None: too big, over the budget, or unreadable -- its call
        then takes the handler, which reads and reports as before)."""
        got = self.expected.get(bid)
        if got is not None:
            return got
        r = self.ctx.reader
        try:
            n = r.blob_size(bid)
            if n > D2H_AHEAD_EACH or self.expected_bytes + n > D2H_AHEAD_TOTAL:
                return None
            got = r.blob(bid)
        except Exception:
            return None
        self.expected[bid] = got
        self.expected_bytes += n
        return got

    def new_planner(self, keep: bool = True, native: bool = False) -> Planner:
        """native: compile in C where cudasnap.replay._plan is built (replay/plannative.py)."""
        from .executor import module
        mod = module()
        args = (self.fast, self.slots, self.ranges_set)
        kw = dict(keep=keep, ffi=mod.ffi if mod is not None else None, pace=self.pace, expected=self.expected_blob)
        if native and self.fast:
            from .plannative import NativePlanner, module as plan_module
            rmod = plan_module()
            if rmod is not None:
                return NativePlanner(rmod, self.ctx.reader.path, self.fkind, is_workload if self.pr else None,
                                     *args, **kw)
        return Planner(*args, **kw)
