"""Snapshot -> standalone C program (`cudasnap export`).

The program is one C file, a Makefile and the payloads in data/ (H2D sources, module images,
expected D2H results).  It replays the recorded calls through the plain Driver API, with no
Python: the placement zone is reserved at its recorded address, every allocation is mapped at
its recorded address exactly as the replayer maps it (the replayer's address-space manager
plans the mappings here, at export time, against a driver that writes C), modules load from
their images, kernels launch with their recorded packed parameter bytes.

Translation is table-driven: TABLE maps each API (base name) to the emitter of its family;
calls made only of values and handles (streams, events, graphs, limits, attributes) share one
emitter that reads their parameter list and handle kinds from the API description.  A call
with no entry stops the export with its name; pure queries are left out.

Emitter is this module's reading of the snapshot (prescan, the main pass, selection, dropped
host-only calls) put together with its parts, one job each:
  export/table.py         TABLE: which method translates each API
  export/ctext.py         C literals and the program's handle arrays (Slots)
  export/emit_context.py  contexts and the current context per recorded thread
  export/emit_memory.py   placement, virtual memory, copies, memsets
  export/emit_module.py   modules, libraries, functions, globals
  export/emit_launch.py   kernel launches
  export/emit_stream.py   streams, events, graphs, the generic value-and-handle calls
  export/program.py       replay.c, the Makefile and the data files
  export/result.py        ExportError, ExportResult
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from cudasnap.formats import SnapshotError, parse_callset
from cudasnap.formats.opened import opened
from cudasnap.formats.abi import base_name
from cudasnap.formats.outputs import write_atomic
from cudasnap.formats.vocab import (alloc_range, in_class, is_launch, is_plain, is_query, malformed_call, no_effect,
                                     replay_class, selectable)
from cudasnap.replay.hostplace import recorded_range as host_range

from .ctext import Slots, c_string, ref
from .emit_context import ContextCalls
from .emit_launch import LaunchCalls
from .emit_memory import MemoryCalls
from .emit_module import ModuleCalls
from .emit_stream import StreamCalls
from .program import ProgramWriter
from .result import ExportError, ExportResult
from .table import TABLE

__all__ = ["Emitter", "ExportError", "ExportResult", "TABLE", "base_name", "export_snapshot"]


class Emitter(ContextCalls, MemoryCalls, ModuleCalls, LaunchCalls, StreamCalls, ProgramWriter):
    """Translates one snapshot into the C program: each recorded call through its TABLE method."""

    def __init__(self, snapshot, calls: Optional[str] = None):
        self.path = os.fspath(snapshot)
        self.calls_spec = calls
        self.slots = Slots()
        self.lines: List[str] = []          # the call sequence, statements
        self.sections = {"core"}
        self.data: Dict[str, Tuple[str, Any]] = {}   # data file name -> (kind, source)
        self.params: Dict[bytes, int] = {}
        self.attrs: Dict[bytes, int] = {}
        self.offsets: Dict[Tuple[int, ...], int] = {}
        self.descs: Dict[bytes, int] = {}
        self.kernels: Dict[str, int] = {}
        self.fn_slot_src: Dict[int, Tuple[str, Any]] = {}   # fn slot -> ("module"|"library", rec handle)
        self.krn_slot_src: Dict[int, Any] = {}
        self.slot_name: Dict[Tuple[str, int], str] = {}
        self.capturing: Dict[Any, Any] = {}   # recorded stream -> stream whose capture it joined
        self.captured_events: Dict[Any, Any] = {}
        self.virtual: set = set()
        self.tid_ctx: Dict[Any, List[Optional[int]]] = {}   # recorded tid -> context stack (slots)
        self.live_ctx: Optional[int] = None                 # slot current in the program
        self.last_tid = None
        self.primary_slot: Optional[int] = None
        self.res: Optional[ExportResult] = None
        self._desc = None
        self._noted: set = set()
        self._dropped: Optional[list] = None   # [line index, first seq, {name: count}] of the last drop comment
        self.prototypes: Dict[str, str] = {}   # entry points cuda.h lacks (the overlay declared them)

    # -------------------------------------------------------------------------- helpers
    def fail(self, rec, msg: str):
        raise ExportError(f"call #{rec.get('s')} {rec.get('f')}: {msg}")

    def note_once(self, key: str, msg: str) -> None:
        if key not in self._noted:
            self._noted.add(key)
            self.res.notes.append(msg)

    def emit(self, rec, *stmts: str) -> None:
        at = f'AT({rec.get("s", -1)}, {c_string(rec.get("f", ""))});'
        self.lines.append("    " + " ".join((at,) + stmts))

    def comment(self, rec, text: str) -> None:
        self.emit(rec, f"/* {text} */")

    def desc(self):
        if self._desc is None:
            from cudasnap.shim.description import load
            self._desc = load()
        return self._desc

    def data_file(self, role: str, rec, key: str, required: bool = True) -> Optional[Tuple[str, int]]:
        """(file name, size) of the blob the record holds under x[key]; the file is written later."""
        return self.data_file_of(role, rec, (rec.get("x") or {}).get(key), key, required)

    def data_file_of(self, role: str, rec, ref_, key: str, required: bool = True) -> Optional[Tuple[str, int]]:
        """data_file for a blob reference ({"blob": id, ...}) of rec."""
        if not isinstance(ref_, dict) or not isinstance(ref_.get("blob"), str):
            if required:
                self.fail(rec, f"the {key} payload was not captured")
            return None
        bid = ref_["blob"]
        if not self.reader.has_blob(bid):
            self.fail(rec, f"the {key} payload (blob {bid[:12]}) is not in the snapshot")
        name = f"{role}-{bid}.bin"
        self.data.setdefault(name, ("blob", bid))
        return name, self.reader.blob_size(bid)

    def handle(self, rec, kind: str, h, what: str = "") -> str:
        if kind == "stream":
            return self.stream(rec, h)
        if kind == "context":
            return self.context(rec, h)
        i = self.slots.get(kind, h)
        if i is None:
            self.fail(rec, f"{what or kind.replace('_', ' ')} {h:#x} was not made by a recorded call"
                      if isinstance(h, int) else f"no {what or kind}")
        return ref(kind, i)

    # -------------------------------------------------------------------------- prescan
    def prescan(self) -> None:
        self.fn_versions: Dict[Any, List[Tuple[int, Dict[str, Any]]]] = {}
        self.func_names: Dict[Any, str] = {}
        self.ctx_ids: Dict[Any, Dict[str, Any]] = {}
        self.regions: List[Tuple[int, int]] = []
        self.ranges: List[Tuple[int, int]] = []
        self.host_ranges: List[Tuple[int, int]] = []     # pinned host memory, held before the driver loads
        self.host_pinned: Dict[int, int] = {}
        self.header = self.reader.header
        max_seq = -1
        self.malformed: Optional[Dict[str, Any]] = None      # the first call record no layer can read
        for rec in self.reader.records():
            k = rec.get("k")
            if k == "c":
                if type(rec.get("s")) is int:
                    max_seq = max(max_seq, rec["s"])
                if rec.get("incomplete") or "r" not in rec:
                    continue
                if malformed_call(rec):
                    self.malformed = self.malformed or rec
                    continue
                rng = alloc_range(rec)
                if rng:
                    self.ranges.append(rng)
                if rec.get("r") == 0 and in_class(rec.get("f") or "", "pins_host"):
                    h = host_range(rec)
                    if h[0] and h[1] > 0:
                        self.host_ranges.append(h)
                a = rec.get("a") or {}
                if rec.get("r") == 0 and isinstance(a.get("name"), str):
                    out = a.get("hfunc") or a.get("pKernel")
                    if isinstance(out, int) and out:
                        self.func_names.setdefault(out, a["name"])
                if in_class(rec.get("f"), "retains_primary") and rec.get("r") == 0:
                    h = a.get("pctx")
                    if isinstance(h, int) and h:
                        self.ctx_ids.setdefault(h, {"h": h})["primary"] = True
            elif k == "fn" and isinstance(rec.get("h"), int):
                vers = self.fn_versions.setdefault(rec["h"], [])
                if not vers or (rec.get("name"), rec.get("module")) != (vers[-1][1].get("name"), vers[-1][1].get("module")):
                    vers.append((max_seq, rec))
                self.func_names.setdefault(rec["h"], rec.get("name") or "")
            elif k == "ctx" and isinstance(rec.get("h"), int):
                self.ctx_ids.setdefault(rec["h"], dict(rec))
            elif k == "region" and isinstance(rec.get("base"), int) and isinstance(rec.get("size"), int):
                self.regions.append((rec["base"], rec["size"]))

    # -------------------------------------------------------------------------- main pass
    @staticmethod
    def _filterable(rec) -> bool:
        """Calls --calls can leave out: launches, graph launches, D2H/D2D copies, memsets."""
        f = rec.get("f")
        if not isinstance(f, str):
            return False
        return is_launch(f) or selectable(f)

    def selected(self, rec) -> bool:
        if self.sel is None:
            return True
        return (not self._filterable(rec)) or bool(self.sel(rec, self.func_names))

    def run(self, outdir) -> ExportResult:
        t0 = time.monotonic()
        out = Path(outdir)
        try:
            self.reader = opened(self.path)       # the process's reader: checked once (the command's preflight)
        except SnapshotError as e:
            raise ExportError(str(e))
        from cudasnap.formats.integrity import check_integrity
        bad = check_integrity(self.reader)     # before the output is touched
        if bad:
            self.reader.close()
            raise ExportError(bad)
        from cudasnap.replay.index import read_once
        from cudasnap.replay.plan import PLAN_MAX_RECORDS
        self.reader = read_once(self.reader, blobs=True, limit=PLAN_MAX_RECORDS)   # its passes: one over the file
        try:
            self.sel = parse_callset(self.calls_spec) if self.calls_spec else None
        except ValueError as e:
            raise ExportError(f"--calls: {e}")
        self.res = ExportResult(str(out), str(out / "replay.c"), str(out / "replay"))
        with self.reader:
            self.prescan()
            self.refuse_malformed()
            if self.sel is not None and not any(self._filterable(r) and self.sel(r, self.func_names)
                                                for r in self.reader.records("c")):
                raise ExportError(f"--calls {self.calls_spec}: no launch, copy or memset of the snapshot is "
                                  f"among those calls")
            self.plan_placement()
            for rec in self.reader.records():
                k = rec.get("k")
                if k == "fn":
                    self.on_fn(rec)
                    continue
                if k != "c":
                    continue
                if rec.get("incomplete") or "r" not in rec:
                    self.res.stopped_at = rec.get("s")
                    self.res.notes.append(f"call #{rec.get('s')} {rec.get('f')} never returned in the recording "
                                          f"(the program died in it); the export ends there")
                    break
                self.one(rec)
            if self.dropped_note():
                self.res.notes.append(self.dropped_note())
            if self.reader.truncated:
                self.res.notes.append(f"the snapshot is truncated ({self.reader.lost_bytes} bytes lost): exported "
                                      f"up to its last complete call")
            if not self.res.calls:
                raise ExportError(f"{self.path}: no call to export (the snapshot holds no call with an effect "
                                  f"on the device)")
            # the parent must exist (checked before the work); files export does not write are kept
            out.mkdir(exist_ok=True)
            (out / "data").mkdir(exist_ok=True)
            self.write_data(out / "data")
            write_atomic(out / "replay.c", self.render())
            write_atomic(out / "Makefile", self.makefile())
        self.res.kernels = len(self.kernels)
        self.res.elapsed_s = time.monotonic() - t0
        return self.res

    def refuse_malformed(self) -> None:
        """After prescan: a snapshot holding a call record no layer can read is refused, naming it."""
        if self.malformed is not None:
            self.fail(self.malformed, "the call record is malformed (a function name, arguments, extras or thread of "
                                      "the wrong type): the snapshot is damaged or was not written by cudasnap")

    def one(self, rec) -> None:
        f = rec.get("f") or ""
        b = base_name(f)
        method = self.method_for(f)
        if rec.get("r", 0) != 0:
            self.res.failed_skipped += 1
            return
        if method is None:
            if self.host_only(f):
                self.drop(rec)
                return
            self.fail(rec, "export cannot translate this call (no C translation for it, and the API description "
                           "gives it an effect on the device); export a call set without it (--calls) or replay "
                           "the snapshot with `cudasnap replay`")
        if not self.selected(rec):
            self.res.filtered += 1
            return
        self.switch_thread(rec)
        before = len(self.lines)
        try:
            getattr(self, method)(rec)
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as e:
            # an argument of another type than the recorder writes (an edited or foreign file);
            # the message keeps the error, so a defect of export's own is still told apart
            self.fail(rec, f"export could not translate it ({type(e).__name__}: {e}); an argument of a type "
                           "cudasnap does not record (an edited or damaged snapshot) does this")
        if len(self.lines) > before:
            self.res.calls += 1

    @staticmethod
    def method_for(f: str) -> Optional[str]:
        """The method translating ABI name f: its TABLE entry, else by class (a plain execute
        call: every argument from the description), else None."""
        m = TABLE.get(base_name(f)) or TABLE.get(f)
        if m is None and no_effect(f):
            m = "e_none"
        elif m is None and is_plain(f) and replay_class(f) == "execute":
            m = "e_generic"
        return m

    def host_only(self, f: str) -> bool:
        """The API description says the call has no effect on the device (a query, a host
        pointer lookup): the program does not need it."""
        fn = self.desc().by_name(f) or self.desc().by_name(base_name(f))
        if fn is None:
            return is_query(f)
        return bool(fn.get("host_only"))

    def drop(self, rec) -> None:
        """Leave out a host-only call, saying so in the program (consecutive ones share a comment)."""
        f = rec.get("f") or "?"
        self.res.host_only[f] = self.res.host_only.get(f, 0) + 1
        run = self._dropped if self._dropped is not None and self._dropped[0] == len(self.lines) - 1 else None
        if run is None:
            self.lines.append("")
            run = self._dropped = [len(self.lines) - 1, rec.get("s"), {}]
        run[2][f] = run[2].get(f, 0) + 1
        names = ", ".join(n + (f" x{k}" if k > 1 else "") for n, k in run[2].items())
        where = f"#{run[1]}" if run[1] == rec.get("s") else f"#{run[1]}-#{rec.get('s')}"
        self.lines[run[0]] = f"    /* {where}: dropped host-only (no device effect): {names} */"

    def dropped_note(self) -> Optional[str]:
        d = self.res.host_only
        if not d:
            return None
        names = ", ".join(f"{n} x{k}" for n, k in sorted(d.items(), key=lambda kv: (-kv[1], kv[0])))
        return f"dropped {sum(d.values())} host-only call(s) without device effect: {names}"

    # -------------------------------------------------------------------------- calls without effect
    def e_none(self, rec) -> None:
        self.res.no_effect += 1

    def e_init(self, rec) -> None:
        self.res.no_effect += 1       # the program's start() runs cuInit

    def e_host_func(self, rec) -> None:
        s = self.stream(rec, rec["a"].get("hStream"))
        if in_class(rec["f"], "stream_callback"):
            self.emit(rec, f"CK(cuStreamAddCallback({s}, callback_noop, NULL, 0));")
        else:
            self.emit(rec, f"CK(cuLaunchHostFunc({s}, host_noop, NULL));")
        self.note_once("hostfn", f"host callbacks of the recorded process are not run: a no-op stands in for each "
                                 f"(first: call #{rec.get('s')} {rec.get('f')})")


def export_snapshot(snapshot, outdir, calls: Optional[str] = None) -> ExportResult:
    """Write the standalone C program for `snapshot` (or the call set `calls`) into outdir."""
    return Emitter(snapshot, calls).run(outdir)
