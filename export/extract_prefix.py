"""An extract's prefix (no GPU): the state-building calls before the selection, with the module
loads its kernels need and without the loads, lookups and calls naming them that nothing kept
uses. A part of the Extractor (export/extract.py): given the reader, the names, the selection
and the job's links, it keeps `recs` and the facts the memory and the writing read (VMM
mappings, captured work, handles used and left out, module globals kept)."""
from __future__ import annotations

import struct
from typing import Any, Dict, List, Set, Tuple

from cudasnap.formats.vocab import code_lookup, family, in_class, is_launch, is_sync

from .emit import Emitter, base_name
from .extract_common import HANDLE_KEYS, ExtractError, ExtractResult, is_work, skipped_query, stream_key
from .extract_links import Links


def kernel_node_function(rec: Dict[str, Any]) -> int:
    """The function (or library kernel) handle a kernel-node call's recorded struct names; 0
    for other calls. CUDA_KERNEL_NODE_PARAMS: func @0, kern @56; CUgraphNodeParams: type @0
    (0: kernel), the kernel params at its union."""
    b = base_name(rec.get("f") or "")
    if not in_class(b, "sets_kernel_node") and not in_class(b, "sets_node"):
        return 0
    raw = (rec.get("a") or {}).get("nodeParams")
    if not isinstance(raw, (bytes, bytearray)):
        return 0
    off = 0
    if in_class(b, "sets_node"):
        from cudasnap.shim.description import load
        if len(raw) < 4 or struct.unpack_from("<I", raw, 0)[0] != 0:
            return 0
        off = next((int(f[2]) for f in load().types["CUgraphNodeParams"]["fields"] if f[0] == "kernel"), 16)
    if len(raw) < off + 64:
        return 0
    return struct.unpack_from("<Q", raw, off)[0] or struct.unpack_from("<Q", raw, off + 56)[0]


class Prefix:
    def __init__(self, reader, em: Emitter, res: ExtractResult, links: Links, sel: List[Dict[str, Any]]):
        self.reader, self.em, self.res, self.links, self.sel = reader, em, res, links, sel
        self.first = sel[0]["s"]
        self.recs: List[Dict[str, Any]] = []           # the calls kept before the selection
        self.mapped: Dict[int, int] = {}               # program VMM mappings live at the selection
        self.captured_work: List[Dict[str, Any]] = []  # what graph launches in the selection run
        self.used_handles: Set[Any] = set()            # handles the kept launches use, up to their module
        self.gone_handles: Set[Any] = set()            # modules, lookups and functions left out
        self.kept_globals: Set[Any] = set()            # module globals whose lookup stays

    def build(self, whole_range: bool) -> None:
        """State-building calls before the selection, and the module loads they need.
        whole_range: --calls (a range may begin inside a capture)."""
        recs: List[Dict[str, Any]] = []
        capturing: Dict[Any, Any] = {}
        cap_events: Dict[Any, Any] = {}
        for rec in self.reader.records(("c",)):
            s, f = rec.get("s"), rec.get("f") or ""
            if rec.get("incomplete") or "r" not in rec:
                break
            if s >= self.first:
                continue
            if rec.get("r", 0) != 0:
                continue
            a = rec.get("a") or {}
            b = base_name(f)
            key = stream_key(f, a)
            in_cap = key in capturing
            if in_class(b, "maps_range"):
                self.mapped[a.get("ptr")] = int(a.get("size", 0))
            elif in_class(b, "unmaps_range"):
                self.mapped.pop(a.get("ptr"), None)
            self.links.note(rec, b, a)
            if in_class(b, "begins_capture"):
                capturing[key] = key
                recs.append(rec)
                continue
            if in_class(b, "ends_capture"):
                origin = capturing.get(key)
                for k in [k for k, o in capturing.items() if o == origin]:
                    del capturing[k]
                recs.append(rec)
                continue
            if in_class(b, "records_event") and in_cap:
                cap_events[a.get("hEvent")] = capturing[key]
            if in_class(b, "waits_event") and not is_sync(b) and a.get("hEvent") in cap_events and cap_events[a["hEvent"]] in capturing.values():
                capturing[key] = cap_events[a["hEvent"]]
                in_cap = True
            if in_cap:
                recs.append(rec)             # graph building: captured work does not run
                if is_work(f):
                    self.captured_work.append(rec)
                continue
            if is_work(f) or skipped_query(f):
                continue
            if family(f) == "graph":
                # a graph built node by node (XLA): its nodes' arguments name what its launches
                # reach (the other graph calls carry no device pointer)
                self.captured_work.append(rec)
            recs.append(rec)
        for rec in self.sel:
            self.links.note(rec, base_name(rec.get("f") or ""), rec.get("a") or {})
        if not whole_range:
            rec = self.sel[0]
            if stream_key(rec.get("f") or "", rec.get("a") or {}) in capturing:
                raise ExtractError(f"launch #{rec['s']} is captured into a graph (it runs when the graph is launched); "
                                   f"select the graph launches with --calls instead")
        self._drop_unneeded_modules(recs)

    def _drop_unneeded_modules(self, recs: List[Dict[str, Any]]) -> None:
        """Keep the module/library loads that the selected and captured launches' kernels come
        from; leave out the others with every call that names them or their functions."""
        em = self.em
        made_by: Dict[Any, Tuple[str, Any]] = {}     # function/kernel/module handle -> (kind, parent handle)
        loads: Dict[Any, Dict[str, Any]] = {}
        for rec in list(recs) + list(self.sel):
            a = rec.get("a") or {}
            b = base_name(rec.get("f") or "")
            if in_class(b, "loads_code"):
                loads[a.get("module") or a.get("library")] = rec
            elif code_lookup(b):
                out, src, kind = code_lookup(b)
                made_by[a.get(out)] = (kind, a.get(src))
        needed_fns = []
        for rec in list(self.sel) + list(recs):
            if is_launch(rec.get("f") or ""):
                needed_fns.append(((rec.get("a") or {}).get("f"), rec.get("s")))
            else:       # kernel nodes of graphs built node by node (XLA) name their functions too
                h = kernel_node_function(rec)
                if h:
                    needed_fns.append((h, rec.get("s")))
        def origin(h, hops):
            """The handle h was made from, up its chain of lookups (a load's module or library)."""
            for _ in range(hops):
                if h not in made_by:
                    break
                h = made_by[h][1]
            return h

        keep: Set[Any] = set()
        unresolved = False
        for h, s in needed_fns:
            cur = origin(h, 4)
            if cur in loads:
                keep.add(cur)
                continue
            mod, guard = (em.fn_record(h, s) or {}).get("module"), 0
            while mod in made_by and mod not in loads and guard < 8:
                mod = made_by[mod][1]
                guard += 1
            if mod in loads:
                keep.add(mod)
            else:
                unresolved = True
        # handles the selected calls name themselves (a selected cuKernelGetFunction or attribute
        # query of a kernel launched only after the selection): their lookups and module stay
        named = {v for rec in self.sel for k in HANDLE_KEYS
                 if isinstance(v := (rec.get("a") or {}).get(k), int) and v}
        keep.update(o for o in (origin(h, 8) for h in named) if o in loads)
        if unresolved:
            keep = set(loads)
            self.res.notes.append("the module of a selected kernel was not identified: every module load is kept")
        dropped = {h for h in loads if h not in keep}
        # everything made from a dropped module goes too
        gone = set(dropped)
        changed = True
        while changed:
            changed = False
            for child, (_k, parent) in made_by.items():
                if parent in gone and child not in gone:
                    gone.add(child)
                    changed = True
        # the handles the kept launches use, up to their module; function lookups of the kept
        # modules that none of them uses go (with the calls naming them), when every launched
        # handle is traced to its lookup
        used: Set[Any] = set()
        for h in [h for h, _s in needed_fns] + sorted(named):
            cur, guard = h, 0
            while cur is not None and guard < 8:
                used.add(cur)
                cur = made_by[cur][1] if cur in made_by else None
                guard += 1
        self.used_handles = used
        lookups = 0
        if not unresolved and all(h in made_by for h, _s in needed_fns):
            for rec in recs:
                a = rec.get("a") or {}
                b = base_name(rec.get("f") or "")
                out_key = code_lookup(b)[0] if in_class(b, "names_function") else None
                h = a.get(out_key) if out_key else None
                if isinstance(h, int) and h not in used and h not in gone:
                    gone.add(h)
                    lookups += 1
        self.res.lookups_dropped = lookups
        self.gone_handles = gone
        def is_gone(h, s) -> bool:
            if h in gone:
                return True
            # a function the program got outside the driver API (no lookup call): the capture's
            # fn record names its module
            mod = (em.fn_record(h, s) or {}).get("module") if h not in made_by else None
            return mod is not None and mod in gone

        out = []
        for rec in recs:
            a = rec.get("a") or {}
            if any(is_gone(a.get(k), rec.get("s")) for k in HANDLE_KEYS if isinstance(a.get(k), int)):
                continue
            out.append(rec)
        # module globals whose lookup stays: only those exist (at an address of their own) on replay
        self.kept_globals = {(r.get("a") or {}).get("dptr") for r in out
                             if in_class(r.get("f") or "", "names_global")}
        self.res.modules_kept = len(loads) - len(dropped)
        self.res.modules_dropped = len(dropped)
        self.recs = out
        self.res.prefix_calls = len(out)

