"""An extract's selection (no GPU): the calls --launch, --kernel or --calls name, grown to the
graph launch that runs a captured kernel and to whole stream captures. A part of the Extractor
(export/extract.py): given the snapshot's reader, its names and the options, it keeps `sel`,
`first` and `last`."""
from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional

from cudasnap.formats.vocab import in_class, is_collective_kernel, is_graph_launch, is_launch

from .callrange import CaptureSpans, count_kept, range_work
from .emit import Emitter, base_name
from .extract_common import ExtractError, ExtractResult, is_work, skipped_query, stream_key


class Selection:
    def __init__(self, reader, em: Emitter, res: ExtractResult, path: str, launch: Optional[int] = None,
                 kernel: Optional[str] = None, calls: Optional[str] = None):
        self.reader, self.em, self.res, self.path = reader, em, res, path
        self.launch, self.kernel, self.calls = launch, kernel, calls
        self.sel: List[Dict[str, Any]] = []
        self.first = self.last = -1

    def choose(self) -> None:
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
        captures = CaptureSpans(stream_key)
        for rec in self.reader.records(("c",)):
            s, f = rec.get("s"), rec.get("f") or ""
            if rec.get("incomplete") or "r" not in rec:
                break
            if lo is not None:
                if lo <= s <= hi and rec.get("r", 0) == 0 and not skipped_query(f):
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
                    key = stream_key(f, rec.get("a") or {})
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
                    key = stream_key(f, rec.get("a") or {})
                    if key not in captures.open:
                        sel.append(rec)
                        break
                    # captured into a graph: it runs when a launch of that graph runs
                    graph_of = {"stream": key, "launch": s, "name": name}
        if lo is not None:
            # call order: threads' records lie in the file in the order their buffers were written
            sel.sort(key=lambda r: r["s"])
            sel = range_work(self.res, sel, lo, hi, last_seq, is_work, ExtractError)
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
        if in_class(b, "ends_capture") and "graph" not in g and stream_key(rec.get("f") or "", a) == g["stream"]:
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
                        and rec.get("r", 0) == 0 and not skipped_query(rec.get("f") or "")), key=lambda r: r["s"])
        count_kept(self.res, grown, is_work)
        if hi2 > last:
            self.res.range_left_out = max(0, self.res.range_left_out - sum(1 for r in grown if last < r["s"] <= hi))
        self.res.notes.append(f"the range cut a stream capture: kept #{lo2}-#{hi2} (memory cannot be read while a "
                              f"capture is open, and captured work runs only when its graph is launched)")
        return grown

