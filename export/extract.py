"""`cudasnap extract`: a small self-contained snapshot of selected work.

The snapshot is replayed (by the replayer) up to the first selected call; there the memory
the selection can read is read back; the selected calls are replayed and the memory they
could write is read back.  The new snapshot holds:

  - the state-building calls before the selection (contexts, the placement zone, allocations,
    the module loads and lookups the selected kernels need, streams, events, graph captures),
    with every module load nobody selected left out, and the function lookups (with their `fn`
    records), device and page-locked host allocations (with their frees), streams and events
    the selection does not use; a kept fatbin holds SASS for the recorded GPUs' architecture
    and its PTX only (thinimage.py; `--sass all` keeps every architecture's);
  - one H2D copy per allocation restoring its contents as they were when the selection started;
  - the selected calls;
  - one D2H copy per allocation the selection could write, whose expected result is what the
    replay read back, so `cudasnap replay SMALL.cusnap` verifies the selection reproduces it.

One rank of a job: where the calls before the selection link another process (a shareable
handle's export or import, a legacy IPC handle), the replay up to the selection is the job's:
the group manifest beside the snapshot names the other ranks, which replay in the background
(replay/group.py, RankSession) so that imported memory holds what the other processes wrote
and collectives find their peers. The extract itself stands alone: memory imported from
another process becomes a plain allocation at the same address (a shareable import a
cuMemCreate of the size mapped, an IPC handle's opening a cuMemAlloc_v2 of the exporter's
size, its closing a cuMemFree_v2), restored like any other with its content at the
selection's start; exports are left out.

Memory: `reachable` (default) restores what the selected launches' parameters point into,
plus what pointer scanning finds there (transitively), plus module globals; `all` restores
every live allocation.  Kernels that reach memory by other means (addresses computed from
nothing in their parameters, host memory) need `all`.  Ranges: `exact` (default) restores,
within an allocation, from each pointer up to the next tensor start the snapshot names (see
ranges.py), plus what the selection writes beyond that; `segment` restores whole allocations.
"""
from __future__ import annotations

import bisect
import os
import re
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

from cudasnap.formats import SnapshotError, SnapshotWriter
from cudasnap.formats.opened import opened
from cudasnap.replay.index import read_once
from cudasnap.replay.plan import PLAN_MAX_RECORDS
from cudasnap.formats.vocab import (alloc_range, family, in_class, is_collective_kernel, is_graph_launch, is_launch,
                                    is_query, is_sync, code_lookup)
from cudasnap.formats.layout import recorded_stream
from cudasnap.formats.outputs import temporary
from cudasnap.replay.view import WRITABLE_KINDS

from . import arrays as A
from . import ranges as R
from .callrange import CaptureSpans, count_kept, kept_text, range_work
from .emit import Emitter, ExportError, base_name

READ_CHUNK = 64 << 20


_HANDLE_KEYS = ("module", "library", "hmod", "hfunc", "kernel", "pKernel", "pFunc", "pMod", "f")
_PROP_DEVICE = struct.Struct("<IIIi16x")      # CUmemAllocationProp: pinned, no handle types, on a device


# allocations, and their frees, that an extract may leave out when nothing reaches them (never
# managed memory, VMM mappings or imported memory)
# (class device_alloc)
# (page-locked host memory, class host_alloc, is kept when a pointer the selection or its memory
# holds points into it)
_DEVICE_FREES = {"cuMemFree": "dptr", "cuMemFreeAsync": "dptr", "cuMemFreeHost": "p"}
# VMM calls (class vmm_map): mappings nothing reaches are left out with their physical memory
# streams and events: the key of the handle a creation makes, and a destruction takes
_OBJECT_MAKERS = {"cuStreamCreate": "phStream", "cuStreamCreateWithPriority": "phStream", "cuEventCreate": "phEvent"}
_OBJECT_ENDS = {"cuStreamDestroy": "hStream", "cuEventDestroy": "hEvent"}


def _kernel_node_function(rec: Dict[str, Any]) -> int:
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


def reached(points: List[int], spans: List[Tuple[int, int]], lo: int, hi: int) -> bool:
    """Does a point (sorted) lie in [lo, hi), or a span (sorted) overlap it?"""
    i = bisect.bisect_left(points, lo)
    if i < len(points) and points[i] < hi:
        return True
    j = bisect.bisect_left(spans, (hi, 0))
    return any(s_lo < hi and s_hi > lo for s_lo, s_hi in spans[:j])


class ExtractError(ExportError):
    pass


class _Done(BaseException):
    """Ends the replay once the selection ran (a BaseException: replay's subscriber guard
    reports and swallows Exceptions)."""


@dataclass
class ExtractResult:
    output: str
    selected: List[int] = field(default_factory=list)        # original call numbers
    kernels: List[str] = field(default_factory=list)
    memory: str = "reachable"
    ranges: str = "exact"
    segments: int = 0                 # allocations the restored ranges lie in
    segments_bytes: int = 0
    written_beyond: int = 0           # bytes written outside the ranges (added to them)
    module_bytes: int = 0             # images of the module loads kept (as written)
    sass_dropped: List[int] = field(default_factory=list)    # architectures whose SASS was left out
    sass_dropped_bytes: int = 0
    allocs_dropped: int = 0           # allocations (and their frees) the selection cannot reach
    lookups_dropped: int = 0          # function lookups (and calls naming them) no kept launch uses
    objects_dropped: int = 0          # streams and events (with their destructions) no kept call names
    restored: List[Tuple[int, int]] = field(default_factory=list)     # (base, size)
    restored_bytes: int = 0
    expected: int = 0
    expected_bytes: int = 0
    prefix_calls: int = 0
    modules_kept: int = 0
    modules_dropped: int = 0
    size: int = 0
    original_size: int = 0
    elapsed_s: float = 0.0
    notes: List[str] = field(default_factory=list)
    launches: int = 0                 # --calls: launches (and graph launches) kept
    range_state: int = 0              # --calls: state-building calls kept from inside the range
    range_left_out: int = 0           # --calls: calls after the range's last work, left out


def _stream_key(f: str, a) -> int:
    """The stream a call was issued on, as the capture bookkeeping keys it: the handle, or 0 for
    the legacy default stream and 2 for the per-thread one; cuLaunchKernelEx carries its stream
    in the launch configuration."""
    return recorded_stream(f, a) or (2 if ("_ptsz" in f or "_ptds" in f) else 0)


def _is_work(f: str) -> bool:
    """Calls whose effect the restored memory stands for (or that only order work)."""
    b = base_name(f)
    return (in_class(b, "launch_group") or is_graph_launch(b) or in_class(b, "moves_memory")
            or is_sync(b) or in_class(b, "order"))


def _skipped_query(f: str) -> bool:
    """A query replay skips: the description's class, and no handler of its own."""
    from cudasnap.replay import dispatch
    return dispatch.lookup(f) is None and is_query(f)


class Extractor:
    """One extract: select, keep the state-building prefix, replay to the selection, choose and
    read the ranges, write the small snapshot. About 1000 lines because these passes share the
    selection's facts (handles, links, modules, ranges); range arithmetic is in ranges.py, the
    rank's job replay in replay/ranksession.py, and the C translation in the emit modules."""

    def __init__(self, snapshot, out, launch: Optional[int] = None, kernel: Optional[str] = None,
                 calls: Optional[str] = None, memory: str = "reachable", ranges: Optional[str] = None, device: int = 0,
                 driver=None, sass: str = "device", watchdog: Optional[float] = None):
        self.path = os.fspath(snapshot)
        self.out = os.fspath(out)
        self.image_ids: Dict[str, str] = {}       # module image blob id -> its id in the extract
        self.launch, self.kernel, self.calls = launch, kernel, calls
        if memory not in ("reachable", "all"):
            raise ExtractError("--memory must be reachable or all")
        self.ranges_auto = ranges is None          # exact, or segment for a graph launch (set at selection)
        ranges = ranges or "exact"
        if ranges not in ("exact", "segment"):
            raise ExtractError("--ranges must be exact or segment")
        if sum(x is not None for x in (launch, kernel, calls)) != 1:
            raise ExtractError("give exactly one of --launch, --kernel, --calls")
        if sass not in ("device", "all"):
            raise ExtractError("--sass must be device or all")
        self.sass = sass
        self.memory = memory
        self.exact = ranges == "exact" and memory == "reachable"
        self.device = device
        self.driver = driver
        self.watchdog = watchdog                     # seconds a driver call of its replay may take
        self.res = ExtractResult(self.out, memory=memory, ranges=ranges if memory == "reachable" else "segment")
        self.links: List[Dict[str, Any]] = []        # calls before or in the selection that link a process
        self.import_size: Dict[int, int] = {}        # imported allocation handle -> bytes mapped of it
        self.ipc_opened: Set[int] = set()            # recorded addresses of IPC handles opened
        self.ipc_size: Dict[int, int] = {}           # ... -> the exporter's allocation size (from the replay)
        self.group = None                            # (manifest, rank) when the replay is the job's

    # ------------------------------------------------------------------ selection (no GPU)
    def _names(self) -> Emitter:
        em = Emitter(self.path)
        em.reader = self.reader
        em.prescan()
        try:
            em.refuse_malformed()
        except ExportError as e:
            raise ExtractError(str(e))
        return em

    def select(self) -> None:
        em = self.em
        lo = hi = None
        if self.calls is not None:
            m = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", self.calls)
            if not m:
                raise ExtractError("--calls takes a range A-B of call numbers (as dump shows)")
            lo, hi = int(m.group(1)), int(m.group(2))
            if hi < lo:
                raise ExtractError(f"--calls: empty range {self.calls}")
        want_k = 1
        rx = None
        if self.kernel is not None:
            pat, _, k = self.kernel.rpartition("#") if re.search(r"#\s*[+-]?\d+$", self.kernel) else (self.kernel, "", "")
            want_k = int(k) if k else 1
            if want_k < 1:
                raise ExtractError("--kernel REGEX#K counts matching launches from 1")
            try:
                rx = re.compile(pat)
            except re.error as e:
                raise ExtractError(f"--kernel: bad regex: {e}")
        seen = 0
        last_seq = None
        at_launch = None                  # --launch N: the call #N is
        graph_of: Optional[Dict[str, Any]] = None    # --kernel: the matched launch was captured
        sel: List[Dict[str, Any]] = []
        captures = CaptureSpans(_stream_key)
        for rec in self.reader.records(("c",)):
            s, f = rec.get("s"), rec.get("f") or ""
            if rec.get("incomplete") or "r" not in rec:
                break
            if lo is not None:
                if lo <= s <= hi and rec.get("r", 0) == 0 and not _skipped_query(f):
                    sel.append(rec)
                captures.feed(rec)
                last_seq = s if last_seq is None else max(last_seq, s)
                continue
            if lo is None:
                captures.feed(rec)
                if graph_of is not None and self._graph_step(rec, graph_of):
                    sel.append(rec)      # the graph launch that runs the matched kernel
                    break
            if self.launch is not None and s == self.launch:
                at_launch = f if rec.get("r", 0) == 0 else f"{f} (it failed)"
            if self.launch is not None and s == self.launch and is_graph_launch(f) and rec.get("r", 0) == 0:
                sel.append(rec)          # a graph launch: the graph's kernels (XLA, CUDA graphs)
                break
            if not is_launch(f) or rec.get("r", 0) != 0:
                continue
            if self.launch is not None:
                if s == self.launch and graph_of is None:
                    key = _stream_key(f, rec.get("a") or {})
                    if key not in captures.open:
                        sel.append(rec)
                        break
                    h = (rec.get("a") or {}).get("f")
                    name = (em.fn_record(h, s) or {}).get("name") or em.func_names.get(h) or str(h)
                    graph_of = {"stream": key, "launch": s, "name": name}
                continue
            h = (rec.get("a") or {}).get("f")
            fr = em.fn_record(h, s) or {}
            name = fr.get("name") or em.func_names.get(h) or ""
            if rx.search(name) and graph_of is None:
                seen += 1
                if seen == want_k:
                    key = _stream_key(f, rec.get("a") or {})
                    if key not in captures.open:
                        sel.append(rec)
                        break
                    # captured into a graph: it runs when a launch of that graph runs
                    graph_of = {"stream": key, "launch": s, "name": name}
        if lo is not None:
            # call order: threads' records lie in the file in the order their buffers were written
            sel.sort(key=lambda r: r["s"])
            sel = range_work(self.res, sel, lo, hi, last_seq, _is_work, ExtractError)
            sel = self._whole_captures(sel, captures, hi, last_seq)
        if graph_of is not None and not sel:
            raise ExtractError(f"launch #{graph_of['launch']} of {graph_of['name'][:80]} is captured into a graph that "
                               f"no recorded launch runs; select calls with --calls instead")
        if not sel:
            what = (f"launch #{self.launch}" if self.launch is not None else
                    f"launch {want_k} of kernels matching {self.kernel!r} ({seen} found)" if self.kernel is not None
                    else f"calls {self.calls}")
            if at_launch is not None:
                raise ExtractError(f"call #{self.launch} is {at_launch}, not a kernel or graph launch "
                                   f"(`cudasnap dump {os.path.basename(self.path)} --calls launches` lists them)")
            raise ExtractError(f"no {what} in {self.path}")
        self.sel = sel
        self.first, self.last = sel[0]["s"], sel[-1]["s"]
        self.res.selected = [r["s"] for r in sel]
        if self.ranges_auto and self.exact and any(is_graph_launch(r.get("f") or "") for r in sel):
            # a graph's kernels (libraries' GEMMs among them) read beyond the tensor starts the
            # snapshot names more often than not: whole allocations are restored for them
            self.exact = False
            self.res.ranges = "segment"
            self.res.notes.append("a graph launch is selected: whole allocations restored (--ranges segment; "
                                  "--ranges exact restores from each pointer to the next tensor start)")
        for r in sel:
            if is_launch(r.get("f") or ""):
                h = (r.get("a") or {}).get("f")
                self.res.kernels.append((em.fn_record(h, r["s"]) or {}).get("name") or em.func_names.get(h) or f"{h:#x}")
        coll = [k for k in self.res.kernels if is_collective_kernel(k)]
        if coll:
            # its kernel waits inside for the other ranks' launches: alone it never ends
            raise ExtractError(f"the selection holds the collective kernel {coll[0][:80]}: it waits for the other "
                               f"ranks inside the kernel and cannot run alone; select work between collectives, "
                               f"or replay the job (its group manifest)")

    def _graph_step(self, rec: Dict[str, Any], g: Dict[str, Any]) -> bool:
        """Follow a captured launch to the graph launch that runs it: the capture's end gives
        the graph, its instantiation the executable graph, whose first launch runs the kernel.
        True at that launch (with a note)."""
        b, a = base_name(rec.get("f") or ""), rec.get("a") or {}
        if rec.get("r", 0) != 0:
            return False
        if in_class(b, "ends_capture") and "graph" not in g and _stream_key(rec.get("f") or "", a) == g["stream"]:
            g["graph"] = a.get("phGraph")
        elif in_class(b, "instantiates") and g.get("graph") and a.get("hGraph") == g["graph"]:
            g.setdefault("execs", set()).add(a.get("phGraphExec"))
        elif is_graph_launch(b) and (a.get("hGraphExec") or a.get("hGraph")) in g.get("execs", ()):
            self.res.notes.append(f"launch #{g['launch']} of {g['name'][:80]} was captured into a graph: extracting "
                                  f"graph launch #{rec['s']}, which runs it with the graph's other nodes")
            return True
        return False

    def _whole_captures(self, sel: List[Dict[str, Any]], captures: CaptureSpans, hi: int,
                        last_seq: int) -> List[Dict[str, Any]]:
        """The selection grown to whole stream captures (device memory cannot be read while a
        capture is open, and captured work runs only when its graph is launched)."""
        first, last = sel[0]["s"], sel[-1]["s"]
        lo2, hi2 = captures.whole(first, last, last_seq)
        if (lo2, hi2) == (first, last):
            return sel
        grown = sorted((rec for rec in self.reader.records(("c",))
                        if lo2 <= (rec.get("s") or 0) <= hi2 and not rec.get("incomplete") and "r" in rec
                        and rec.get("r", 0) == 0 and not _skipped_query(rec.get("f") or "")), key=lambda r: r["s"])
        count_kept(self.res, grown, _is_work)
        if hi2 > last:
            self.res.range_left_out = max(0, self.res.range_left_out - sum(1 for r in grown if last < r["s"] <= hi))
        self.res.notes.append(f"the range cut a stream capture: kept #{lo2}-#{hi2} (memory cannot be read while a "
                              f"capture is open, and captured work runs only when its graph is launched)")
        return grown

    # ------------------------------------------------------------------ the prefix (no GPU)
    def prefix(self) -> None:
        """State-building calls before the selection, and the module loads they need."""
        recs: List[Dict[str, Any]] = []
        capturing: Dict[Any, Any] = {}
        cap_events: Dict[Any, Any] = {}
        self.mapped: Dict[int, int] = {}            # program VMM mappings live at the selection
        self.captured_work: List[Dict[str, Any]] = []   # what graph launches in the selection run
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
            key = _stream_key(f, a)
            in_cap = key in capturing
            if in_class(b, "maps_range"):
                self.mapped[a.get("ptr")] = int(a.get("size", 0))
            elif in_class(b, "unmaps_range"):
                self.mapped.pop(a.get("ptr"), None)
            self._note_link(rec, b, a)
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
                if _is_work(f):
                    self.captured_work.append(rec)
                continue
            if _is_work(f) or _skipped_query(f):
                continue
            if family(f) == "graph":
                # a graph built node by node (XLA): its nodes' arguments name what its launches
                # reach (the other graph calls carry no device pointer)
                self.captured_work.append(rec)
            recs.append(rec)
        for rec in self.sel:
            self._note_link(rec, base_name(rec.get("f") or ""), rec.get("a") or {})
        if self.calls is None:
            rec = self.sel[0]
            if _stream_key(rec.get("f") or "", rec.get("a") or {}) in capturing:
                raise ExtractError(f"launch #{rec['s']} is captured into a graph (it runs when the graph is launched); "
                                   f"select the graph launches with --calls instead")
        self._drop_unneeded_modules(recs)

    def _note_link(self, rec, b: str, a) -> None:
        """What the extract needs to stand alone where the program linked another process."""
        if in_class(b, "links_process"):       # the extract keeps none as they are (_unlink)
            self.links.append(rec)
            if in_class(b, "opens_ipc_memory") and isinstance(a.get("pdptr"), int):
                self.ipc_opened.add(a["pdptr"])
        elif in_class(b, "maps_range") and isinstance(a.get("handle"), int) and any(
                in_class(r.get("f"), "imports_shareable")
                and (r.get("a") or {}).get("handle") == a["handle"] for r in self.links):
            end = int(a.get("offset") or 0) + int(a.get("size") or 0)
            self.import_size[a["handle"]] = max(self.import_size.get(a["handle"], 0), end)

    def _unlink(self, rec) -> Optional[Dict[str, Any]]:
        """A call that linked another process, as the extract keeps it (None: left out)."""
        b = base_name(rec.get("f") or "")
        a = rec.get("a") or {}
        base = {k: v for k, v in rec.items() if k not in ("f", "a", "x")}
        if in_class(b, "imports_shareable"):
            n = self.import_size.get(a.get("handle"))
            if not n:
                return None                       # never mapped: nothing reads it
            return {**base, "f": "cuMemCreate", "a": {"handle": a.get("handle"), "size": n,
                                                      "prop": _PROP_DEVICE.pack(1, 0, 1, self._rank_device()),
                                                      "flags": 0}}
        if in_class(b, "opens_ipc_memory"):
            n = self.ipc_size.get(a.get("pdptr"))
            if not n:
                raise ExtractError(f"call #{rec.get('s')} {rec['f']}: the size of the memory it opened is not "
                                   f"known (it was not live when the selection started)")
            return {**base, "f": "cuMemAlloc_v2", "a": {"dptr": a.get("pdptr"), "bytesize": n}}
        if in_class(b, "closes_ipc_memory"):
            return {**base, "f": "cuMemFree_v2", "a": {"dptr": a.get("dptr")}}
        return None                               # exports, event handles

    def _rank_device(self) -> int:
        if self.group is not None:
            m, rank = self.group
            d = (m["ranks"][rank].get("devices") or [0])[0]
            return d if isinstance(d, int) else 0
        return 0

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
                h = _kernel_node_function(rec)
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
        named = {v for rec in self.sel for k in _HANDLE_KEYS
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
            if any(is_gone(a.get(k), rec.get("s")) for k in _HANDLE_KEYS if isinstance(a.get(k), int)):
                continue
            out.append(rec)
        # module globals whose lookup stays: only those exist (at an address of their own) on replay
        self.kept_globals = {(r.get("a") or {}).get("dptr") for r in out
                             if in_class(r.get("f") or "", "names_global")}
        self.res.modules_kept = len(loads) - len(dropped)
        self.res.modules_dropped = len(dropped)
        self.prefix_recs = out
        self.res.prefix_calls = len(out)

    # ------------------------------------------------------------------ memory (GPU, in the replay)
    def _ranges(self, rv) -> List[Tuple[int, int, str]]:
        """Live device ranges at this point: (recorded base, size, kind)."""
        out: List[Tuple[int, int, str]] = []
        vmm_pieces = sorted(self.mapped.items())
        for a in rv.recorded_allocations():
            if a.kind in WRITABLE_KINDS:
                out.append((a.rec_base, max(int(a.size), 0), a.kind))
            elif a.kind == "vmm" and a.rec_base in self.ipc_opened:
                out.append((a.rec_base, max(int(a.size), 0), "vmm"))     # another process's, opened whole
            elif a.kind == "vmm":
                run = None
                for p, n in vmm_pieces:
                    if not (a.rec_base <= p < a.rec_base + a.size):
                        continue
                    if run is not None and run[0] + run[1] == p:
                        run = (run[0], run[1] + n)
                    else:
                        if run is not None:
                            out.append((run[0], run[1], "vmm"))
                        run = (p, n)
                if run is not None:
                    out.append((run[0], run[1], "vmm"))
        out = [r for r in out if r[1] > 0 and (r[2] != "global" or r[0] in self.kept_globals)]
        out.sort()
        return out

    def _read(self, rv, base: int, n: int) -> bytes:
        import ctypes
        buf = bytearray(n)
        if not n:
            return b""
        addr = ctypes.addressof((ctypes.c_char * n).from_buffer(buf))
        live = rv.translate(base)
        for off in range(0, n, READ_CHUNK):
            m = min(READ_CHUNK, n - off)
            rv.call("cuMemcpyDtoH", addr + off, live + off, m)
        return bytes(buf)

    def _words(self, data: bytes) -> List[int]:
        """8-byte aligned words of data that may be device addresses (>= 64 KiB)."""
        n = len(data) // 8 * 8
        try:
            import numpy as np
            w = np.frombuffer(data[:n], dtype="<u8")
            w = w[(w >= self._lo) & (w < self._hi)]
            return [int(x) for x in np.unique(w)]
        except ImportError:
            vals = set()
            for o in range(0, n, 8):
                v = int.from_bytes(data[o:o + 8], "little")
                if self._lo <= v < self._hi:
                    vals.add(v)
            return sorted(vals)

    def _find(self, v: int) -> Optional[int]:
        i = bisect.bisect_right(self._starts, v) - 1
        if i >= 0:
            b, n, _k = self._live[i]
            if b <= v < b + n:
                return i
        return None

    def at_start(self, rv) -> None:
        if rv.errors:
            raise ExtractError(f"replay failed before the selection: {rv.errors[0]}")
        rv.call("cuCtxSynchronize")
        arrays, notes = A.live_arrays(self.prefix_recs)
        self.array_restore = [(h, row, rows, depth, self.w.add_blob(A.read_array(rv, h, row, rows, depth)))
                              for h, row, rows, depth in arrays]
        self.res.notes += notes
        if arrays:
            self.res.notes.append(f"{len(arrays)} CUDA array(s) restored whole "
                                  f"({sum(r * n * d for _h, r, n, d in arrays)} B): textures and surfaces read them")
        for p in self.ipc_opened:
            al = rv.find(p)
            if al is not None:
                self.ipc_size[p] = int(al.size)
        self._live = self._ranges(rv)
        self._starts = [r[0] for r in self._live]
        if not self._live:
            self.chosen: List[int] = []
            self.restore = []
            self.per, self.before = {}, {}
            return
        self._lo = self._live[0][0]
        self._hi = max(b + n for b, n, _k in self._live)
        if self.exact:
            return R.start_exact(self, rv)
        if self.memory == "all":
            todo = list(range(len(self._live)))
        else:
            words: List[int] = []
            for rec in self._root_recs():
                p = (rec.get("x") or {}).get("params")
                if isinstance(p, (bytes, bytearray)):
                    words += self._words(bytes(p) + b"\0" * (-len(p) % 8))
                a = rec.get("a") or {}
                for k in R.PTR_KEYS:
                    if isinstance(a.get(k), int):
                        words.append(a[k])
            for data in self._copied_in():
                words += self._words(data)
            words += [w for w, _n in R.object_roots(self.prefix_recs, self._root_recs())]
            todo = sorted({i for i in (self._find(w) for w in words) if i is not None})
            todo += [i for i, r in enumerate(self._live) if r[2] == "global" and i not in todo]
        chosen: Dict[int, str] = {}
        scanned = 0
        while todo:
            i = todo.pop()
            if i in chosen:
                continue
            base, n, _k = self._live[i]
            data = self._read(rv, base, n)
            chosen[i] = self.w.add_blob(data)
            if self.memory == "reachable" and scanned < R.SCAN_LIMIT:
                self.note_host_refs(data)
                scanned += n
                for v in self._words(data):
                    j = self._find(v)
                    if j is not None and j not in chosen:
                        todo.append(j)
        self.chosen = sorted(chosen)
        self.restore = [(self._live[i][0], self._live[i][1], chosen[i]) for i in self.chosen]
        self.res.restored = [(b, n) for b, n, _ in self.restore]
        self.res.restored_bytes = sum(n for _b, n, _ in self.restore)
        self.res.segments = len(self.restore)
        self.res.segments_bytes = self.res.restored_bytes

    def _root_recs(self) -> List[Dict[str, Any]]:
        """The selected calls, and the captured work its graph launches run."""
        recs = list(self.sel)
        if any(is_graph_launch(r.get("f") or "") for r in self.sel):
            recs += self.captured_work
        return recs

    def _copied_in(self):
        """The host data the selected H2D copies upload (their pointer words reach memory too)."""
        for rec in self.sel:
            if not in_class(rec.get("f") or "", "h2d_copy"):
                continue
            for v in (rec.get("x") or {}).values():
                if isinstance(v, dict) and isinstance(v.get("blob"), str) and self.reader.has_blob(v["blob"]):
                    yield self.reader.blob(v["blob"])

    def at_end(self, rv) -> None:
        rv.call("cuCtxSynchronize")
        if self.exact:
            return R.end_exact(self, rv)
        self.expected = []
        for i in self.chosen:
            base, n, _k = self._live[i]
            if rv.find(base) is None:
                continue                      # freed by the selection itself
            self.expected.append((base, n, self.w.add_blob(self._read(rv, base, n))))
        self.res.expected = len(self.expected)
        self.res.expected_bytes = sum(n for _b, n, _ in self.expected)

    # ------------------------------------------------------------------ writing
    def _copy_blobs(self, rec) -> Dict[str, Any]:
        rec = dict(rec)
        x = rec.get("x")
        if isinstance(x, dict):
            x = dict(x)
            for k, v in list(x.items()):
                if isinstance(v, dict) and isinstance(v.get("blob"), str) and self.reader.has_blob(v["blob"]):
                    data = self.reader.blob(v["blob"])
                    is_image = in_class(rec.get("f") or "", "loads_code")
                    if is_image:
                        data = self._thin(data)
                    x[k] = {**v, "blob": self.w.add_blob(data)}
                    if is_image:
                        self.image_ids[v["blob"]] = x[k]["blob"]
                        if isinstance(v.get("size"), int):
                            x[k]["size"] = len(data)
                        self.res.module_bytes += len(data)
                elif isinstance(v, list):       # several references (a launch's managed memory)
                    x[k] = [{**e, "blob": self.w.add_blob(self.reader.blob(e["blob"]))}
                            if isinstance(e, dict) and isinstance(e.get("blob"), str) and self.reader.has_blob(e["blob"])
                            else e for e in v]
            rec["x"] = x
        return rec

    def _gpu_ccs(self) -> List[Tuple[int, int]]:
        """Compute capabilities of the GPUs the program ran on (its proc record)."""
        out = []
        for rec in self.reader.records(("proc",)):
            for g in rec.get("gpus") or []:
                cc = g.get("cc") if isinstance(g, dict) else None
                if isinstance(cc, (list, tuple)) and len(cc) == 2 and all(isinstance(c, int) for c in cc):
                    out.append((cc[0], cc[1]))
        return out

    def _thin(self, img: bytes) -> bytes:
        if self.sass != "device":
            return img
        if not hasattr(self, "_ccs"):
            self._ccs = self._gpu_ccs()
        from .thinimage import thin
        got = thin(img, self._ccs)
        if got is None:
            return img
        self.res.sass_dropped = sorted(set(self.res.sass_dropped) | set(got[1]))
        self.res.sass_dropped_bytes += len(img) - len(got[0])
        return got[0]

    def write(self) -> None:
        w = self.w
        seq = 0
        sel_seqs = set(self.res.selected)
        first_rec = self.sel[0]
        tid, t = first_rec.get("tid"), first_rec.get("t0", 0)

        def put(rec):
            nonlocal seq
            if in_class(rec.get("f") or "", "links_process"):
                rec = self._unlink(rec)
                if rec is None:
                    return
            rec = self._copy_blobs(rec)
            rec["os"] = rec.get("s")              # the call's number in the original snapshot
            rec["s"] = seq
            seq += 1
            w.write(rec)

        def synth(f, a, x=None):
            nonlocal seq
            rec = {"k": "c", "s": seq, "tid": tid, "t0": t, "t1": t, "f": f, "a": a, "r": 0}
            if x:
                rec["x"] = x
            seq += 1
            w.write(rec)

        prefix_seqs = {r["s"] for r in self.prefix_recs} - self._unreached_allocations()
        prefix_seqs -= self._unused_objects(prefix_seqs)
        self.res.prefix_calls = len(prefix_seqs)
        gone, used = getattr(self, "gone_handles", set()), getattr(self, "used_handles", set())
        # The extract is written in call order. A multithreaded program's records lie in the file
        # in the order its threads' buffers were written: a later call of one thread can come
        # before an earlier call of another. Other records keep their place after the call they
        # followed (a function record belongs to the lookups before it).
        items: List[Tuple[int, int, Dict[str, Any]]] = []
        after = -1
        for rec in self.reader.records(("c", "fn", "ctx", "region", "proc", "ptx")):
            k = rec.get("k")
            if k == "c":
                s = rec.get("s")
                if not isinstance(s, int):
                    continue
                after = max(after, s)
                if (s < self.first and s in prefix_seqs) or s in sel_seqs:
                    items.append((s, 0, rec))
            elif k != "fn" or rec.get("h") in used or (rec.get("h") not in gone and rec.get("module") not in gone):
                # the names of functions whose lookups and modules were left out go with them
                items.append((after, 1, rec))
        items.sort(key=lambda it: (it[0], it[1]))          # stable: the file's order within a place
        restored = False
        for s, kind, rec in items:
            if kind == 1 and rec.get("k") == "ptx":
                if rec.get("image") in self.image_ids:    # PTX kept for a module the extract loads
                    w.write({**self._copy_blobs(rec), "image": self.image_ids[rec["image"]]})
                continue
            if kind == 1:
                w.write(rec)
                continue
            if not restored and s >= self.first:
                for base, n, bid in self.restore:
                    synth("cuMemcpyHtoD_v2", {"dstDevice": base, "srcHost": 0, "ByteCount": n},
                          {"srcHost": {"blob": bid}})
                for h, row, rows, depth, bid in getattr(self, "array_restore", []):
                    synth("cuMemcpy3D_v2", {"pCopy": A.copy3d(row, rows, depth, array=h, host=0, to_host=False)},
                          {"hostsrc": {"blob": bid}})
                synth("cuCtxSynchronize", {})
                restored = True
            if s < self.first:
                # a managed allocation's final bytes, freed before the selection: not its result
                x = rec.get("x") or {}
                if "hostcheck" in x:
                    rec = {**rec, "x": {key: v for key, v in x.items() if key != "hostcheck"}}
            put(rec)
        synth("cuCtxSynchronize", {})
        for base, n, bid in self.expected:
            synth("cuMemcpyDtoH_v2", {"dstHost": 0, "srcDevice": base, "ByteCount": n}, {"dstHost": {"blob": bid}})
        if self.links:
            w.write({"k": "note", "level": "info", "msg": self._links_note()})
        if self.res.sass_dropped:
            w.write({"k": "note", "level": "info",
                     "msg": f"module images hold SASS for the recorded GPU's architecture and their PTX only (SASS for "
                            f"{', '.join(f'sm_{a}' for a in self.res.sass_dropped)} left out): to replay on a GPU of "
                            f"another architecture, extract again with --sass all"})
        w.write({"k": "note", "level": "info",
                 "msg": f"extracted from {os.path.basename(self.path)}: calls {self.res.selected[:8]}"
                        f"{'...' if len(self.res.selected) > 8 else ''}; memory restored: "
                        + ("every live allocation" if self.memory == "all" else
                           "from each pointer the selection reaches to the next tensor start the original "
                           "snapshot names, plus what it wrote beyond (if this replay does not verify, the "
                           "kernel reads beyond them: extract again with --ranges segment)" if self.exact else
                           "allocations the selection's parameters point into, what pointer scanning found in "
                           "them, and module globals")})
        w.write({"k": "end", "exit": 0, "signal": None, "partial": False})

    def _host_allocs(self) -> List[Tuple[int, int]]:
        """(base, end) of the page-locked host allocations made before the selection."""
        if not hasattr(self, "_host_ranges"):
            self._host_ranges = sorted(
                (a["pp"], a["pp"] + max(a["bytesize"], 1)) for a in ((r.get("a") or {}) for r in self.prefix_recs
                                                                     if in_class(r.get("f") or "", "host_alloc"))
                if isinstance(a.get("pp"), int) and isinstance(a.get("bytesize"), int))
            self._host_reached: Set[int] = set()
        return self._host_ranges

    def note_host_refs(self, data: bytes) -> None:
        """Notes the host allocations a word of scanned device memory points into (a kernel may
        follow it): those stay in the extract."""
        hosts = self._host_allocs()
        if not hosts or len(self._host_reached) == len(hosts):
            return
        w = R.words(data)
        for lo, hi in hosts:
            if lo not in self._host_reached and bool(((w >= lo) & (w < hi)).any()):
                self._host_reached.add(lo)

    def _unreached_allocations(self) -> Set[int]:
        """Call numbers of the prefix's device allocations (cuMemAlloc and its kin) and page-locked
        host allocations the selection cannot reach, and of their frees: no range restored or
        expected lies in one, and no pointer in the selection's arguments, a kept state-building
        call's (a texture's or a tensor map's memory, say) or scanned memory points into it.
        With --memory all every one is kept."""
        if self.memory == "all":
            return set()
        spans = [(b, b + n) for b, n, _bid in list(self.restore) + list(self.expected)]
        points: List[int] = []
        allocs, frees, vmm = [], [], []
        ints: Set[int] = set()
        roots = {id(r) for r in self._root_recs()}
        for rec in list(self._root_recs()) + list(self.prefix_recs):
            b = base_name(rec.get("f") or "")
            if (in_class(b, "device_alloc") or in_class(b, "host_alloc")) and id(rec) not in roots:
                allocs.append(rec)
                continue
            if b in _DEVICE_FREES and id(rec) not in roots:
                frees.append(rec)
                continue
            if in_class(b, "vmm_map") and id(rec) not in roots:
                vmm.append(rec)
                continue
            vals = list((rec.get("a") or {}).values()) + [(rec.get("x") or {}).get("params")]
            for v in vals:
                if isinstance(v, int):
                    ints.add(v)
                    if v >= R.MIN_ADDR:
                        points.append(v)
                elif isinstance(v, (bytes, bytearray)) and len(v) >= 8:
                    points += [int(w) for w in R.words(v)]
        points.sort()
        spans.sort()
        drop: Set[int] = set()
        dropped_at: Dict[int, int] = {}
        self._host_allocs()
        for rec in sorted(allocs + frees, key=lambda r: r.get("s", 0)):
            a = rec.get("a") or {}
            b = base_name(rec.get("f") or "")
            if b in _DEVICE_FREES:
                if dropped_at.pop(a.get(_DEVICE_FREES[b]), None) is not None:
                    drop.add(rec["s"])
                continue
            rng = (a.get("pp"), a.get("bytesize")) if in_class(b, "host_alloc") else alloc_range(rec)
            if rng is None or not all(isinstance(v, int) for v in rng) or rng[0] in self._host_reached:
                continue
            lo, hi = rng[0], rng[0] + max(rng[1], 1)
            if reached(points, spans, lo, hi):
                continue
            drop.add(rec["s"])
            dropped_at[lo] = rec["s"]
        self.res.allocs_dropped = sum(1 for r in allocs if r["s"] in drop)
        drop |= self._unreached_mappings(vmm, lambda lo, hi: reached(points, spans, lo, hi), ints)
        return drop

    def _unreached_mappings(self, vmm, is_reached, ints: Set[int]) -> Set[int]:
        """Call numbers of the prefix's VMM mappings nothing reaches (cuMemMap, its
        cuMemSetAccess and cuMemUnmap), with the cuMemCreate and cuMemRelease of a physical
        allocation all of whose mappings go and that no other kept call names (an export, a
        property query). Address reservations stay (they hold no memory). An access setting that
        spans a kept mapping keeps every mapping it covers."""
        maps = [r for r in vmm if in_class(r["f"], "maps_range")]
        span = {r["s"]: (r["a"].get("ptr"), r["a"].get("size")) for r in maps}
        if not all(isinstance(p, int) and isinstance(n, int) for p, n in span.values()):
            return set()
        cand = {r["s"] for r in maps if not is_reached(span[r["s"]][0], span[r["s"]][0] + max(span[r["s"]][1], 1))
                and r["a"].get("handle") not in ints}
        access = [(r["a"].get("ptr"), r["a"].get("size")) for r in vmm if in_class(r["f"], "sets_access")]
        changed = True
        while changed:
            changed = False
            for p, n in access:
                if not isinstance(p, int) or not isinstance(n, int):
                    return set()
                over = [s for s, (mp, mn) in span.items() if mp < p + n and p < mp + mn]
                if any(s not in cand for s in over) and any(s in cand for s in over):
                    cand -= set(over)
                    changed = True
        handles: Dict[Any, bool] = {}
        for r in maps:
            h = r["a"].get("handle")
            handles[h] = handles.get(h, True) and r["s"] in cand
        drop: Set[int] = set(cand)
        dropped_at = {span[s][0] for s in cand}
        for r in sorted(vmm, key=lambda r: r["s"]):
            a, b = r["a"], base_name(r["f"])
            if in_class(b, "sets_access"):
                over = [s for s, (mp, mn) in span.items() if mp < a["ptr"] + a["size"] and a["ptr"] < mp + mn]
                if over and all(s in cand for s in over):
                    drop.add(r["s"])
            elif in_class(b, "unmaps_range") and a.get("ptr") in dropped_at:
                drop.add(r["s"])
            elif in_class(b, "physical_memory") and handles.get(a.get("handle")):
                drop.add(r["s"])
        self.res.allocs_dropped += len(cand)
        return drop

    def _unused_objects(self, kept: Set[int]) -> Set[int]:
        """Call numbers of the prefix's stream and event creations whose handle no other kept
        call names (in an argument, a struct argument or a launch's parameters), with their
        destructions."""
        made: Dict[int, List[int]] = {}
        named: Set[int] = set()
        recs = [r for r in self.prefix_recs if r["s"] in kept] + list(self._root_recs())
        for rec in recs:
            b = base_name(rec.get("f") or "")
            a = rec.get("a") or {}
            if b in _OBJECT_MAKERS and isinstance(a.get(_OBJECT_MAKERS[b]), int):
                made.setdefault(a[_OBJECT_MAKERS[b]], []).append(rec["s"])
                continue
            if b in _OBJECT_ENDS and isinstance(a.get(_OBJECT_ENDS[b]), int):
                made.setdefault(a[_OBJECT_ENDS[b]], []).append(rec["s"])
                continue
            for v in list(a.values()) + [(rec.get("x") or {}).get("params")]:
                if isinstance(v, int):
                    named.add(v)
                elif isinstance(v, (bytes, bytearray)) and len(v) >= 8:
                    named.update(int(w) for w in R.words(v))
        root_seqs = {r.get("s") for r in self._root_recs()}
        # a handle the selection creates or destroys itself is named by it
        drop = {s for h, seqs in made.items() if h not in named and not root_seqs.intersection(seqs) for s in seqs}
        self.res.objects_dropped = sum(1 for r in recs if r["s"] in drop
                                       and base_name(r.get("f") or "") in _OBJECT_MAKERS)
        return drop

    def _links_note(self) -> str:
        kinds = sorted({base_name(r.get("f") or "") for r in self.links})
        how = (f"replayed up to the selection with the job's other ranks ({os.path.basename(self.group[0]['path'])})"
               if self.group is not None else "")
        return (f"rank of a job: {len(self.links)} calls linking another process ({', '.join(kinds)}) are not kept; "
                f"memory imported from another process is a plain allocation at its address, restored with its "
                f"content at the selection's start" + (f"; {how}" if how else ""))

    def _find_group(self) -> None:
        """Links before the selection: the replay up to it is the job's (its manifest)."""
        if not self.links:
            return
        from cudasnap.formats.group import find_manifest
        found = find_manifest(self.path)
        if found is None:
            r = self.links[0]
            raise ExtractError(f"call #{r.get('s')} {r.get('f')} links another process: extracting from one rank of "
                               f"a job replays the job up to the selection, and no group manifest beside "
                               f"{os.path.basename(self.path)} names it (keep the manifest capture wrote, "
                               f"STEM.group.json, in the same directory as the ranks' snapshots)")
        self.group = found
        self.res.notes.append(self._links_note())

    # ------------------------------------------------------------------ run
    def run(self) -> ExtractResult:
        t0 = time.monotonic()
        try:
            self.reader = opened(self.path)       # the process's reader: checked once, shared with the replay
        except SnapshotError as e:
            raise ExtractError(str(e))
        self.res.original_size = os.path.getsize(self.path)
        with self.reader:
            from cudasnap.formats.integrity import check_integrity
            bad = check_integrity(self.reader)
            if bad:
                raise ExtractError(bad)
            self.reader = read_once(self.reader, blobs=True, limit=PLAN_MAX_RECORDS)   # its looks at the records: one pass
            self.em = self._names()
            self.select()
            for r in self.sel:
                if is_launch(r.get("f") or "") and (r.get("x") or {}).get("params") is None:
                    raise ExtractError(f"call #{r['s']} {r['f']}: kernel parameters were not captured")
            self.prefix()
            self._find_group()
            hdr = dict(self.reader.raw_header)
            hdr["extracted_from"] = {"snapshot": os.path.basename(self.path), "calls": self.res.selected[:64],
                                     "memory": self.memory, "ranges": self.res.ranges}
            if self.exact:
                self.bounds = R.Boundaries(self.reader)
            with temporary(self.out + ".tmp") as tmp:     # removed too when a watchdog ends the process
                self.w = SnapshotWriter(tmp, hdr, level=3, threads=4)
                ok = False
                try:
                    self._replay()
                    self.write()
                    if self.calls is not None:          # counted once the unused calls are left out
                        self.res.notes.insert(0, f"kept {kept_text(self.res)}")
                    self.w.close()
                    os.replace(tmp, self.out)
                    ok = True
                finally:
                    if not ok:
                        try:
                            self.w.abort()
                        except Exception:
                            pass
                        try:
                            os.unlink(tmp)
                        except OSError:
                            pass
        self.res.size = os.path.getsize(self.out)
        self.res.elapsed_s = time.monotonic() - t0
        return self.res

    def _replay(self) -> None:
        from cudasnap.replay.engine import Replayer
        from cudasnap.replay.options import ReplayOptions
        ex = self

        class Tap:
            wants_calls = True
            label = "extract"

            def __init__(self):
                self.started = False
                self.err: Optional[BaseException] = None

            def on_event(self, kind, ev):
                if kind == "before_call" and ev.seq == ex.first and not self.started:
                    self.started = True
                    try:
                        ex.at_start(ev.replay)
                    except BaseException as e:
                        self.err = e
                        raise _Done()
                if kind == "after_call" and ev.seq == ex.last and self.started:
                    try:
                        ex.at_end(ev.replay)
                    except BaseException as e:
                        self.err = e
                    raise _Done()

        tap = Tap()
        session = None
        if self.group is not None:
            from cudasnap.replay.group import GroupProblem
            from cudasnap.replay.ranksession import RankSession
            session = RankSession(self.group[0], self.group[1])
            try:
                session.__enter__()
            except GroupProblem as e:
                raise ExtractError(f"the job's other ranks: {e}")
        try:
            with open(os.devnull, "w") as devnull:
                device = session.device if session is not None else self.device
                rp = Replayer(self.path, ReplayOptions(device=device, continue_on_error=True, quiet=True,
                                                       watchdog=self.watchdog, call_order=True),
                              driver=self.driver, out=devnull)
                if session is not None:
                    rp.subscribers.append(_Starter(session.hook()))
                rp.subscribers.append(tap)
                done = False
                try:
                    rp.run()
                except _Done:
                    done = True
                finally:
                    # the driver state goes back: a widened extract replays again in this process
                    # (an H200 then spun in cuKernelGetFunction at the second replay's first load)
                    rp.close()
        finally:
            if session is not None:
                failed = session.failed
                session.__exit__(None, None, None)
                if failed and not done:
                    raise ExtractError(f"replay of the job up to the selection failed: {failed}")
        if tap.err is not None:
            if isinstance(tap.err, ExportError):
                raise tap.err
            raise ExtractError(f"reading device memory failed: {type(tap.err).__name__}: {tap.err}")
        if not done:
            why = rp.view.errors[0] if rp.view.errors else "the selected calls did not run"
            raise ExtractError(f"replay did not reach the end of the selection: {why}")


class _Starter:
    """Runs a group rank hook's start (it then subscribes itself, first)."""

    def __init__(self, hook):
        self.hook = hook

    def on_event(self, kind, ev):
        if kind == "start":
            self.hook.start(ev)


def extract(snapshot, out, **kw) -> ExtractResult:
    return Extractor(snapshot, out, **kw).run()
