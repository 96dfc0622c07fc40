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

import os
import time
from typing import Optional

from cudasnap.formats import SnapshotError, SnapshotWriter
from cudasnap.formats.opened import opened
from cudasnap.formats.outputs import temporary
from cudasnap.formats.vocab import is_graph_launch, is_launch
from cudasnap.replay.index import read_once
from cudasnap.replay.plan import PLAN_MAX_RECORDS

from . import ranges as R
from .callrange import kept_text
from .emit import Emitter, ExportError
from .extract_common import Done, ExtractError, ExtractResult
from .extract_links import Links
from .extract_memory import Memory
from .extract_prefix import Prefix
from .extract_select import Selection
from .extract_write import ExtractWriter

__all__ = ["ExtractError", "ExtractResult", "Extractor", "extract"]


class Extractor:
    """One extract, put together from parts that hand each other their results: the selection
    (extract_select.py), the prefix (extract_prefix.py), the job's links (extract_links.py), the
    memory read in the replay (extract_memory.py, ranges.py), what can be left out
    (extract_prune.py) and the writing (extract_write.py)."""

    def __init__(self, snapshot, out, launch: Optional[int] = None, kernel: Optional[str] = None,
                 calls: Optional[str] = None, memory: str = "reachable", ranges: Optional[str] = None, device: int = 0,
                 driver=None, sass: str = "device", watchdog: Optional[float] = None):
        self.path = os.fspath(snapshot)
        self.out = os.fspath(out)
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
        self.links = Links(self.path, self.res)

    def _names(self, reader) -> Emitter:
        em = Emitter(self.path)
        em.reader = reader
        em.prescan()
        try:
            em.refuse_malformed()
        except ExportError as e:
            raise ExtractError(str(e))
        return em

    def _select(self, reader, em: Emitter) -> Selection:
        sel = Selection(reader, em, self.res, self.path, self.launch, self.kernel, self.calls)
        sel.choose()
        if self.ranges_auto and self.exact and any(is_graph_launch(r.get("f") or "") for r in sel.sel):
            # a graph's kernels (libraries' GEMMs among them) read beyond the tensor starts the
            # snapshot names more often than not: whole allocations are restored for them
            self.exact = False
            self.res.ranges = "segment"
            self.res.notes.append("a graph launch is selected: whole allocations restored (--ranges segment; "
                                  "--ranges exact restores from each pointer to the next tensor start)")
        for r in sel.sel:
            if is_launch(r.get("f") or "") and (r.get("x") or {}).get("params") is None:
                raise ExtractError(f"call #{r['s']} {r['f']}: kernel parameters were not captured")
        return sel

    def run(self) -> ExtractResult:
        t0 = time.monotonic()
        try:
            reader = opened(self.path)       # the process's reader: checked once, shared with the replay
        except SnapshotError as e:
            raise ExtractError(str(e))
        self.res.original_size = os.path.getsize(self.path)
        with reader:
            from cudasnap.formats.integrity import check_integrity
            bad = check_integrity(reader)
            if bad:
                raise ExtractError(bad)
            reader = read_once(reader, blobs=True, limit=PLAN_MAX_RECORDS)   # its looks at the records: one pass
            em = self._names(reader)
            sel = self._select(reader, em).sel
            prefix = Prefix(reader, em, self.res, self.links, sel)
            prefix.build(whole_range=self.calls is not None)
            self.links.find_group()
            hdr = dict(reader.raw_header)
            hdr["extracted_from"] = {"snapshot": os.path.basename(self.path), "calls": self.res.selected[:64],
                                     "memory": self.memory, "ranges": self.res.ranges}
            bounds = R.Boundaries(reader) if self.exact else None
            with temporary(self.out + ".tmp") as tmp:     # removed too when a watchdog ends the process
                w = SnapshotWriter(tmp, hdr, level=3, threads=4)
                ok = False
                try:
                    mem = Memory(reader, self.res, w, sel, prefix, self.links, self.memory, self.exact, bounds)
                    self._replay(mem)
                    ExtractWriter(reader, w, self.res, self.path, self.sass, prefix, mem, self.links).write()
                    if self.calls is not None:          # counted once the unused calls are left out
                        self.res.notes.insert(0, f"kept {kept_text(self.res)}")
                    w.close()
                    os.replace(tmp, self.out)
                    ok = True
                finally:
                    if not ok:
                        try:
                            w.abort()
                        except Exception:
                            pass
                        try:
                            os.unlink(tmp)
                        except OSError:
                            pass
        self.res.size = os.path.getsize(self.out)
        self.res.elapsed_s = time.monotonic() - t0
        return self.res

    def _replay(self, mem: Memory) -> None:
        from cudasnap.replay.engine import Replayer
        from cudasnap.replay.options import ReplayOptions
        class Tap:
            wants_calls = True
            label = "extract"

            def __init__(self):
                self.started = False
                self.err: Optional[BaseException] = None

            def on_event(self, kind, ev):
                if kind == "before_call" and ev.seq == mem.first and not self.started:
                    self.started = True
                    try:
                        mem.at_start(ev.replay)
                    except BaseException as e:
                        self.err = e
                        raise Done()
                if kind == "after_call" and ev.seq == mem.last and self.started:
                    try:
                        mem.at_end(ev.replay)
                    except BaseException as e:
                        self.err = e
                    raise Done()

        tap = Tap()
        session = None
        if self.links.group is not None:
            from cudasnap.replay.group import GroupProblem
            from cudasnap.replay.ranksession import RankSession
            session = RankSession(self.links.group[0], self.links.group[1])
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
                except Done:
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
