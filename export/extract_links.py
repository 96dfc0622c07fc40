"""One rank of a job: the calls that link another process (a shareable handle's export or
import, a legacy IPC handle), the job's manifest the replay up to the selection needs, and how
the extract keeps those calls to stand alone (an import becomes a plain allocation at its
address). A part of the Extractor (export/extract.py)."""
from __future__ import annotations

import os
import struct
from typing import Any, Dict, List, Optional, Set

from cudasnap.formats.vocab import in_class

from .emit import base_name
from .extract_common import ExtractError, ExtractResult

_PROP_DEVICE = struct.Struct("<IIIi16x")      # CUmemAllocationProp: pinned, no handle types, on a device


class Links:
    def __init__(self, path: str, res: ExtractResult):
        self.path, self.res = path, res
        self.links: List[Dict[str, Any]] = []        # calls before or in the selection that link a process
        self.import_size: Dict[int, int] = {}        # imported allocation handle -> bytes mapped of it
        self.ipc_opened: Set[int] = set()            # recorded addresses of IPC handles opened
        self.ipc_size: Dict[int, int] = {}           # ... -> the exporter's allocation size (from the replay)
        self.group = None                            # (manifest, rank) when the replay is the job's

    def note(self, rec, b: str, a) -> None:
        """What the extract needs to stand alone where the program linked another process."""
        if in_class(b, "links_process"):       # the extract keeps none as they are (unlink)
            self.links.append(rec)
            if in_class(b, "opens_ipc_memory") and isinstance(a.get("pdptr"), int):
                self.ipc_opened.add(a["pdptr"])
        elif in_class(b, "maps_range") and isinstance(a.get("handle"), int) and any(
                in_class(r.get("f"), "imports_shareable")
                and (r.get("a") or {}).get("handle") == a["handle"] for r in self.links):
            end = int(a.get("offset") or 0) + int(a.get("size") or 0)
            self.import_size[a["handle"]] = max(self.import_size.get(a["handle"], 0), end)

    def opened_sizes(self, rv) -> None:
        """The sizes of the IPC memory opened, live at the selection's start (the replay's view)."""
        for p in self.ipc_opened:
            al = rv.find(p)
            if al is not None:
                self.ipc_size[p] = int(al.size)

    def unlink(self, rec) -> Optional[Dict[str, Any]]:
        """A call that linked another process, as the extract keeps it (None: left out)."""
        b = base_name(rec.get("f") or "")
        a = rec.get("a") or {}
        base = {k: v for k, v in rec.items() if k not in ("f", "a", "x")}
        if in_class(b, "imports_shareable"):
            n = self.import_size.get(a.get("handle"))
            if not n:
                return None                       # never mapped: nothing reads it
            return {**base, "f": "cuMemCreate", "a": {"handle": a.get("handle"), "size": n,
                                                      "prop": _PROP_DEVICE.pack(1, 0, 1, self.rank_device()),
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

    def rank_device(self) -> int:
        if self.group is not None:
            m, rank = self.group
            d = (m["ranks"][rank].get("devices") or [0])[0]
            return d if isinstance(d, int) else 0
        return 0

    def text(self) -> str:
        kinds = sorted({base_name(r.get("f") or "") for r in self.links})
        how = (f"replayed up to the selection with the job's other ranks ({os.path.basename(self.group[0]['path'])})"
               if self.group is not None else "")
        return (f"rank of a job: {len(self.links)} calls linking another process ({', '.join(kinds)}) are not kept; "
                f"memory imported from another process is a plain allocation at its address, restored with its "
                f"content at the selection's start" + (f"; {how}" if how else ""))

    def find_group(self) -> None:
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
        self.res.notes.append(self.text())
