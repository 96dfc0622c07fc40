"""The summary of a snapshot's records: what `cudasnap info` shows, computed once.

The writer feeds every record to a Summary and stores Summary.to_map() in the index
(`summary`, SCHEMA.md), so info reads no record at all; a file without it (a crash, a repair,
an older cudasnap) is summarized by feeding the records to the same class. Cheap per record:
a call's family is worked out once per function name.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Dict, List, Mapping, Optional

from . import callset as cs
from .abi import base_name
from .vocab import in_class

SUMMARY_VERSION = 1
_SIZE_KEYS = ("ByteCount", "byteCount", "bytes", "bytesize", "byteSize", "size", "Size", "N", "count", "Count")
_MEMTYPE = {1: "H", 2: "D", 3: "A", 4: "U"}
_OTHER, _LAUNCH, _MEMCPY, _MEMSET, _ALLOC, _MODLOAD, _MODREF = range(7)


def as_int(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def copy_bytes(a: Mapping[str, Any]) -> int:
    for k in _SIZE_KEYS:
        n = as_int(a.get(k))
        if n is not None:
            return n
    for key in ("pCopy", "copy", "p"):
        c = a.get(key)
        if isinstance(c, dict):
            w = as_int(c.get("WidthInBytes")) or 0
            h = as_int(c.get("Height")) or 1
            d = as_int(c.get("Depth")) or 1
            return w * max(h, 1) * max(d, 1)
    return 0


def memset_bytes(f: str, a: Mapping[str, Any]) -> int:
    elem = 4 if "D32" in f else 2 if "D16" in f else 1
    if "D2D" in f:
        w = as_int(a.get("Width")) or 0
        h = as_int(a.get("Height")) or 0
        return w * h * elem
    n = as_int(a.get("N"))
    if n is None:
        n = copy_bytes(a) // elem if elem > 1 else copy_bytes(a)
    return n * elem


def copy_direction(f: str, a: Mapping[str, Any]) -> str:
    b = base_name(f)
    for tag, kind in (("HtoD", "H2D"), ("DtoH", "D2H"), ("DtoD", "D2D"), ("HtoA", "H2D"),
                      ("AtoH", "D2H"), ("DtoA", "D2D"), ("AtoD", "D2D"), ("AtoA", "D2D"), ("Peer", "P2P")):
        if tag in b:
            return kind
    c = a.get("pCopy") if isinstance(a.get("pCopy"), dict) else None
    if c is not None:
        s = _MEMTYPE.get(c.get("srcMemoryType"), "?")
        d = _MEMTYPE.get(c.get("dstMemoryType"), "?")
        if s == "H" and d in "DA":
            return "H2D"
        if s in "DA" and d == "H":
            return "D2H"
        if s in "DA" and d in "DA":
            return "D2D"
    return "unified"


def _direction_by_name(f: str) -> Optional[str]:
    d = copy_direction(f, {})
    return None if d == "unified" else d


def alloc_bytes(f: str, a: Mapping[str, Any]) -> int:
    if "Pitch" in f:
        w = as_int(a.get("WidthInBytes")) or 0
        h = as_int(a.get("Height")) or 0
        p = as_int(a.get("pPitch")) or w
        return max(p, w) * h
    return copy_bytes(a)


def _category(f: str) -> int:
    if cs.is_launch(f):
        return _LAUNCH
    if cs.is_memcpy(f):
        return _MEMCPY
    if cs.is_memset(f):
        return _MEMSET
    if cs.is_alloc(f):
        return _ALLOC
    if cs.is_module_load(f):
        return _MODLOAD
    if in_class(f, "refers_code"):
        return _MODREF
    return _OTHER


_COPY_KINDS = ("H2D", "D2H", "D2D", "P2P")


def name_class(f: str) -> int:
    """How the C walk (formats/records.c summ_call) counts calls of f: 0 nothing more, 1 a
    launch, 10 + i a copy of kind _COPY_KINDS[i], 20 + element size a memset, 30 an
    allocation; 99: Summary.add does (directions from the arguments, 2D sizes, modules)."""
    cat = _category(f)
    if cat == _OTHER or cat == _LAUNCH:
        return cat
    if cat == _MEMCPY:
        d = _direction_by_name(f)
        return 10 + _COPY_KINDS.index(d) if d in _COPY_KINDS else 99
    if cat == _MEMSET and "D2D" not in f:
        return 20 + (4 if "D32" in f else 2 if "D16" in f else 1)
    if cat == _ALLOC and "Pitch" not in f:
        return 30
    return 99


class NvtxRanges:
    """NVTX ranges and marks of `nvtx` records (SCHEMA.md), per (domain, name): how many, and
    the time inside the closed ones (a push to its pop on the same thread and domain, a start to
    the end of the same id)."""

    def __init__(self):
        self.rows: Dict[tuple, Dict[str, Any]] = {}
        self.open_push: Dict[tuple, list] = defaultdict(list)
        self.open_start: Dict[Any, tuple] = {}
        self.events = 0

    def _row(self, domain, name, kind: str) -> Dict[str, Any]:
        key = (domain if isinstance(domain, str) else None, name if isinstance(name, str) else None, kind)
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = {"name": key[1], "domain": key[0], "kind": kind, "count": 0, "closed": 0,
                                    "total_ns": 0}
        return row

    def add(self, rec: Mapping[str, Any]) -> None:
        self.events += 1
        op, t = rec.get("op"), as_int(rec.get("t"))
        dom, name = rec.get("domain"), rec.get("name")
        if op in ("push", "start"):
            row = self._row(dom, name, "range")
            row["count"] += 1
            if op == "push":
                try:
                    self.open_push[(rec.get("tid"), dom)].append((row, t))
                except TypeError:
                    pass
            else:
                try:
                    self.open_start[rec.get("id")] = (row, t)
                except TypeError:
                    pass
        elif op in ("pop", "end"):
            try:
                opened = (self.open_push[(rec.get("tid"), dom)].pop() if op == "pop"
                          else self.open_start.pop(rec.get("id")))
            except (IndexError, KeyError, TypeError):
                return
            row, t0 = opened
            if t is not None and t0 is not None and t >= t0:
                row["closed"] += 1
                row["total_ns"] += t - t0
        elif op == "mark":
            self._row(dom, name, "mark")["count"] += 1

    def summary(self) -> Optional[Dict[str, Any]]:
        if not self.events:
            return None
        rows = sorted(self.rows.values(), key=lambda r: (-r["total_ns"], -r["count"], str(r["name"])))
        return {"events": self.events, "ranges": sum(r["count"] for r in rows if r["kind"] == "range"),
                "marks": sum(r["count"] for r in rows if r["kind"] == "mark"), "by_name": rows}


_REPAIR_COUNTS = ("lost_bytes", "lost_records", "unknown_gaps", "lost_blobs", "gap_count")


def _add_repair(acc: Dict[str, Any], rec: Mapping[str, Any]) -> None:
    """Fold one `repair` record (SCHEMA.md) into the totals: losses add up."""
    acc["times"] = acc.get("times", 0) + 1
    for key in _REPAIR_COUNTS:
        acc[key] = acc.get(key, 0) + (as_int(rec.get(key)) or 0)
    gaps = acc.setdefault("gaps", [])
    for g in rec.get("gaps") if isinstance(rec.get("gaps"), list) else []:
        if isinstance(g, list) and len(g) >= 4 and len(gaps) < 10:
            gaps.append({"offset": g[0], "length": g[1], "kind": g[2], "reason": g[3]})


class Summary:
    """Fed every record in file order (add), gives the summary map (to_map). blob_size(id)
    is the size of a known blob, else None."""

    def __init__(self, blob_size: Callable[[str], Optional[int]]):
        self._blob_size = blob_size
        self._cat: Dict[str, int] = {}
        self._dir: Dict[str, Optional[str]] = {}  # copy direction by name (None: from its arguments)
        self.n = 0
        self.kinds: Dict[str, int] = {}
        self.calls: Dict[str, int] = {}
        self.collapsed = self.errors = self.unreturned = 0
        self.nc = 0                               # call records (kinds["c"])
        self._c_at = 0
        self._t0 = 1 << 64                        # first enter, last exit (None when no call has one)
        self._t1 = -1
        self.launches: Dict[Any, int] = {}       # function handle -> launches
        self.mem: Dict[str, List[int]] = {}
        self.loads = self.image_bytes = 0
        self.notes: Dict[str, int] = {}
        self.note_msgs: List[str] = []
        self.end: Optional[Dict[str, Any]] = None
        self.loss: Optional[Dict[str, Any]] = None
        self.repaired: Dict[str, Any] = {}
        self.nvtx = NvtxRanges()
        self.fn_names: Dict[Any, str] = {}
        self.fns: List[list] = []                 # [h, name, module] of every fn record
        self.modrecs: List[Dict[str, Any]] = []   # module loads and lookups (module images)
        self.win_state: Optional[Dict[str, int]] = None   # a window's state dump: bytes, ranges
        self.state_calls = 0
        self.trigger: Optional[Dict[str, Any]] = None     # the end record's trigger (flight recorder)

    def add(self, rec: Mapping[str, Any]) -> None:
        # the writer calls this for every record it writes: the call path is kept short
        self.n += 1
        get = rec.get
        k = get("k")
        if k != "c":
            self._other(rec, k)
            return
        if not self.nc:
            self._c_at = len(self.kinds)          # where "c" goes in kinds' first-seen order
        self.nc += 1
        f = get("f")
        if type(f) is not str:
            f = "?"
        calls = self.calls
        try:
            calls[f] += 1
        except KeyError:
            calls[f] = 1
        v = get("t0")
        if type(v) is int and 0 <= v < self._t0:
            self._t0 = v
        v = get("t1")
        if type(v) is int and v > self._t1:
            self._t1 = v
        if get("state"):                          # a window's state record (capture/window.py)
            self.state_calls += 1
        r = get("r")
        if r != 0:
            if r is None:
                self.unreturned += 1
            else:
                self.errors += 1
        cat = self._cat.get(f)
        if cat is None:
            cat = self._cat[f] = _category(f)
        if cat:
            self._call(rec, f, cat)

    def _call(self, rec: Mapping[str, Any], f: str, cat: int) -> None:
        a = rec.get("a")
        if not isinstance(a, dict):
            a = {}
        if cat == _LAUNCH:
            h = a.get("f")
            if h is None or isinstance(h, (dict, list)):
                h = cs.launch_function_handle(rec)
            try:
                self.launches[h] = self.launches.get(h, 0) + 1
            except TypeError:
                self.launches[None] = self.launches.get(None, 0) + 1
        elif cat == _MEMCPY:
            d = self._dir.get(f, "")
            if d == "":
                d = self._dir[f] = _direction_by_name(f)
            n = a.get("ByteCount")
            self._mem(d or copy_direction(f, a), n if type(n) is int and n >= 0 else copy_bytes(a))
        elif cat == _MEMSET:
            self._mem("memset", memset_bytes(f, a))
        elif cat == _ALLOC:
            self._mem("alloc", alloc_bytes(f, a))
        else:
            if cat == _MODLOAD:
                self.loads += 1
                x = rec.get("x") if isinstance(rec.get("x"), dict) else {}
                for v in list(x.values()) + [x]:
                    if isinstance(v, dict) and isinstance(v.get("blob"), str):
                        size = self._blob_size(v["blob"])
                        if size is not None:
                            self.image_bytes += size
                            break
            self.modrecs.append({kk: rec.get(kk) for kk in ("k", "s", "f", "a", "r", "x") if kk in rec})

    def _other(self, rec: Mapping[str, Any], k: Any) -> None:
        ks = k if type(k) is str else str(k)
        self.kinds[ks] = self.kinds.get(ks, 0) + 1
        if k == "fn":
            name, h = rec.get("name"), rec.get("h")
            try:
                if isinstance(name, str):
                    self.fn_names[h] = name
            except TypeError:
                return
            self.fns.append([h, name, rec.get("module")])
        elif k == "rep":
            for e in rec.get("calls") if isinstance(rec.get("calls"), list) else []:
                if isinstance(e, dict) and isinstance(e.get("f"), str) and as_int(e.get("n")):
                    self.calls[e["f"]] = self.calls.get(e["f"], 0) + e["n"]
                    self.collapsed += e["n"]
        elif k == "note":
            lvl = rec.get("level") if isinstance(rec.get("level"), str) else "info"
            self.notes[lvl] = self.notes.get(lvl, 0) + 1
            if lvl != "info" and len(self.note_msgs) < 10:
                self.note_msgs.append(str(rec.get("msg"))[:200])
        elif k == "end":
            if isinstance(rec.get("trigger"), dict):
                self.trigger = rec["trigger"]
            self.end = {"exit": rec.get("exit"), "signal": rec.get("signal"), "partial": rec.get("partial")}
            lost = rec.get("lost") if isinstance(rec.get("lost"), dict) else {}
            self.loss = {"partial": bool(rec.get("partial")), "calls_missing": as_int(rec.get("calls_missing")),
                         "seq_issued": as_int(rec.get("seq_issued")),
                         "lost": {str(a): b for a, b in lost.items() if as_int(b)}}
        elif k == "repair":
            _add_repair(self.repaired, rec)
        elif k == "nvtx":
            self.nvtx.add(rec)
        elif k == "win" and rec.get("op") == "state":
            self.win_state = {"bytes": as_int(rec.get("bytes")) or 0, "ranges": as_int(rec.get("ranges")) or 0}

    def _mem(self, kind: str, n: int) -> None:
        m = self.mem.get(kind)
        if m is None:
            m = self.mem[kind] = [0, 0]
        m[0] += 1
        m[1] += n

    def to_map(self) -> Dict[str, Any]:
        kernels: Dict[str, int] = {}
        for h, n in self.launches.items():
            name = None
            try:
                name = self.fn_names.get(h)
            except TypeError:
                pass
            if name is None:
                name = f"<function {h:#x}>" if isinstance(h, int) else "<unknown function>"
            kernels[name] = kernels.get(name, 0) + n
        kinds = list(self.kinds.items())
        if self.nc:
            kinds.insert(self._c_at, ("c", self.nc))
        kinds = dict(kinds)
        return {
            "v": SUMMARY_VERSION, "records": self.n, "kinds": kinds, "calls": self.calls,
            "collapsed": self.collapsed, "errors": self.errors, "unreturned": self.unreturned,
            "t0": self._t0 if self._t0 < 1 << 64 else None, "t1": self._t1 if self._t1 >= 0 else None,
            "kernels": kernels,
            "memory": {k: list(v) for k, v in self.mem.items()},
            "modules": {"loads": self.loads, "image_bytes": self.image_bytes},
            "notes": self.notes, "warnings": self.note_msgs, "end": self.end, "loss": self.loss,
            "repaired": self.repaired or None, "nvtx": self.nvtx.summary(),
            "fns": self.fns, "modrecs": self.modrecs,
            "launched": [h for h in self.launches if isinstance(h, int)],
            "window_state": self.win_state, "state_calls": self.state_calls, "trigger": self.trigger,
        }


_SHAPE = {"records": int, "kinds": dict, "calls": dict, "collapsed": int, "errors": int, "unreturned": int,
          "kernels": dict, "memory": dict, "modules": dict, "notes": dict, "warnings": list, "fns": list,
          "modrecs": list, "launched": list}


def check_map(sm: Any) -> Optional[str]:
    """What is wrong with a stored summary map (None when it has the shape to_map gives)."""
    if not isinstance(sm, dict):
        return "not a map"
    if sm.get("v") != SUMMARY_VERSION:
        return f"unknown summary version {sm.get('v')!r}"
    for key, typ in _SHAPE.items():
        if not isinstance(sm.get(key), typ) or isinstance(sm.get(key), bool):
            return f"{key} is not a{'n' if typ is int else ''} {typ.__name__}"
    for key in ("t0", "t1"):
        if sm.get(key) is not None and as_int(sm[key]) is None:
            return f"{key} is not a time"
    for key in ("calls", "kinds", "kernels", "notes"):
        if not all(isinstance(k, str) and as_int(v) is not None for k, v in sm[key].items()):
            return f"{key} holds a bad count"
    if not all(isinstance(k, str) and isinstance(v, list) and len(v) == 2 and all(as_int(x) is not None for x in v)
               for k, v in sm["memory"].items()):
        return "memory holds a bad entry"
    if as_int(sm["modules"].get("loads")) is None or as_int(sm["modules"].get("image_bytes")) is None:
        return "modules holds a bad count"
    if not all(isinstance(e, list) and len(e) == 3 for e in sm["fns"]) or \
            not all(isinstance(e, dict) for e in sm["modrecs"]):
        return "fns or modrecs hold a bad entry"
    if sm.get("state_calls") is not None and as_int(sm["state_calls"]) is None:
        return "state_calls is not a count"
    for key in ("end", "loss", "repaired", "nvtx", "window_state", "trigger"):
        if sm.get(key) is not None and not isinstance(sm[key], dict):
            return f"{key} is not a map"
    return None
