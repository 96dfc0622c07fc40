"""An extract written: the prefix's kept calls in call order with their function records and
PTX, the restoring copies at the selection's start, the selected calls, the copies whose
results are expected, and notes. A part of the Extractor (export/extract.py): given the reader,
the snapshot writer and the other parts' results, it writes every record."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

from cudasnap.formats.vocab import in_class

from . import arrays as A
from .extract_common import ExtractResult
from .extract_links import Links
from .extract_memory import Memory
from .extract_prefix import Prefix
from .extract_prune import Pruner


class ExtractWriter:
    def __init__(self, reader, w, res: ExtractResult, path: str, sass: str, prefix: Prefix, mem: Memory,
                 links: Links):
        self.reader, self.w, self.res, self.path, self.sass = reader, w, res, path, sass
        self.prefix, self.mem, self.links = prefix, mem, links
        self.image_ids: Dict[str, str] = {}       # module image blob id -> its id in the extract
        self.ccs: Optional[List[Tuple[int, int]]] = None

    def copy_blobs(self, rec) -> Dict[str, Any]:
        rec = dict(rec)
        x = rec.get("x")
        if isinstance(x, dict):
            x = dict(x)
            for k, v in list(x.items()):
                if isinstance(v, dict) and isinstance(v.get("blob"), str) and self.reader.has_blob(v["blob"]):
                    data = self.reader.blob(v["blob"])
                    is_image = in_class(rec.get("f") or "", "loads_code")
                    if is_image:
                        data = self.thin(data)
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

    def gpu_ccs(self) -> List[Tuple[int, int]]:
        """Compute capabilities of the GPUs the program ran on (its proc record)."""
        out = []
        for rec in self.reader.records(("proc",)):
            for g in rec.get("gpus") or []:
                cc = g.get("cc") if isinstance(g, dict) else None
                if isinstance(cc, (list, tuple)) and len(cc) == 2 and all(isinstance(c, int) for c in cc):
                    out.append((cc[0], cc[1]))
        return out

    def thin(self, img: bytes) -> bytes:
        if self.sass != "device":
            return img
        if self.ccs is None:
            self.ccs = self.gpu_ccs()
        from .thinimage import thin
        got = thin(img, self.ccs)
        if got is None:
            return img
        self.res.sass_dropped = sorted(set(self.res.sass_dropped) | set(got[1]))
        self.res.sass_dropped_bytes += len(img) - len(got[0])
        return got[0]

    def write(self) -> None:
        w = self.w
        seq = 0
        sel_seqs = set(self.res.selected)
        first_rec, first = self.mem.sel[0], self.mem.first
        tid, t = first_rec.get("tid"), first_rec.get("t0", 0)

        def put(rec):
            nonlocal seq
            if in_class(rec.get("f") or "", "links_process"):
                rec = self.links.unlink(rec)
                if rec is None:
                    return
            rec = self.copy_blobs(rec)
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

        prune = Pruner(self.res, self.mem)
        prefix_seqs = {r["s"] for r in self.prefix.recs} - prune.unreached_allocations()
        prefix_seqs -= prune.unused_objects(prefix_seqs)
        self.res.prefix_calls = len(prefix_seqs)
        gone, used = self.prefix.gone_handles, self.prefix.used_handles
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
                if (s < first and s in prefix_seqs) or s in sel_seqs:
                    items.append((s, 0, rec))
            elif k != "fn" or rec.get("h") in used or (rec.get("h") not in gone and rec.get("module") not in gone):
                # the names of functions whose lookups and modules were left out go with them
                items.append((after, 1, rec))
        items.sort(key=lambda it: (it[0], it[1]))          # stable: the file's order within a place
        restored = False
        for s, kind, rec in items:
            if kind == 1 and rec.get("k") == "ptx":
                if rec.get("image") in self.image_ids:    # PTX kept for a module the extract loads
                    w.write({**self.copy_blobs(rec), "image": self.image_ids[rec["image"]]})
                continue
            if kind == 1:
                w.write(rec)
                continue
            if not restored and s >= first:
                for base, n, bid in self.mem.restore:
                    synth("cuMemcpyHtoD_v2", {"dstDevice": base, "srcHost": 0, "ByteCount": n},
                          {"srcHost": {"blob": bid}})
                for h, row, rows, depth, bid in self.mem.array_restore:
                    synth("cuMemcpy3D_v2", {"pCopy": A.copy3d(row, rows, depth, array=h, host=0, to_host=False)},
                          {"hostsrc": {"blob": bid}})
                synth("cuCtxSynchronize", {})
                restored = True
            if s < first:
                # a managed allocation's final bytes, freed before the selection: not its result
                x = rec.get("x") or {}
                if "hostcheck" in x:
                    rec = {**rec, "x": {key: v for key, v in x.items() if key != "hostcheck"}}
            put(rec)
        synth("cuCtxSynchronize", {})
        for base, n, bid in self.mem.expected:
            synth("cuMemcpyDtoH_v2", {"dstHost": 0, "srcDevice": base, "ByteCount": n}, {"dstHost": {"blob": bid}})
        if self.links.links:
            w.write({"k": "note", "level": "info", "msg": self.links.text()})
        if self.res.sass_dropped:
            w.write({"k": "note", "level": "info",
                     "msg": f"module images hold SASS for the recorded GPU's architecture and their PTX only (SASS for "
                            f"{', '.join(f'sm_{a}' for a in self.res.sass_dropped)} left out): to replay on a GPU of "
                            f"another architecture, extract again with --sass all"})
        w.write({"k": "note", "level": "info",
                 "msg": f"extracted from {os.path.basename(self.path)}: calls {self.res.selected[:8]}"
                        f"{'...' if len(self.res.selected) > 8 else ''}; memory restored: "
                        + ("every live allocation" if self.mem.memory == "all" else
                           "from each pointer the selection reaches to the next tensor start the original "
                           "snapshot names, plus what it wrote beyond (if this replay does not verify, the "
                           "kernel reads beyond them: extract again with --ranges segment)" if self.mem.exact else
                           "allocations the selection's parameters point into, what pointer scanning found in "
                           "them, and module globals")})
        w.write({"k": "end", "exit": 0, "signal": None, "partial": False})
