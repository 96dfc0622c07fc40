"""The replay index: a snapshot's records as the replay's one pass over them left them.

The engine's prescan (engine.py) reads every records frame once: the calls go into the plan
(plan.py; in C where cudasnap.replay._plan is built, decoded lazily from the frames it keeps),
every other record (functions, contexts, NVTX, the end state, the process) through Python. The
index remembers where each of those other records fell among the calls, so that the records
can be read again in file order from memory: the preflight, the end-state check, the selection,
the notes and the profilers ask the IndexedReader, which answers `records()` from the index and
everything else (blobs, header, stats) from the snapshot reader, and no one reads the file's
records a second time. In call order no plan is compiled: the prescan keeps the calls as it
read them. A snapshot too big to keep leaves no index: the reader then reads the file, as
before."""
from __future__ import annotations

from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple


class ReplayIndex:
    """What the prescan saw besides the plan: each record not in the plan, with the number of
    planned calls before it; the plan (or the calls kept in call order) once finished."""

    __slots__ = ("kept", "planned", "plan", "proc", "complete", "code", "blobs", "graph_calls")

    def __init__(self):
        self.kept: List[Tuple[int, Dict[str, Any]]] = []   # (planned calls before it, record)
        self.planned = 0                                   # planned calls so far
        self.plan: Optional[List[Any]] = None
        self.proc: Optional[Dict[str, Any]] = None         # the first "proc" record
        self.complete = False
        self.code: List[Dict[str, Any]] = []               # calls that load code or name a kernel
        self.blobs = False                                 # blob records kept too (read_once)
        self.graph_calls: Optional[bool] = None            # any call of class graph_group (None: not known)

    def keep(self, rec: Dict[str, Any]) -> None:
        """A record the plan does not hold (another kind, an incomplete or malformed call)."""
        self.kept.append((self.planned, rec))
        if self.proc is None and rec.get("k") == "proc":
            self.proc = rec

    def attach_plan(self, plan: Optional[List[Any]]) -> None:
        self.plan = plan
        self.complete = plan is not None and _planned(plan) == self.planned

    def records(self, kinds: Optional[Iterable[str]] = None) -> Iterator[Dict[str, Any]]:
        """Every record in file order (optionally only those whose 'k' is in kinds)."""
        if isinstance(kinds, str):
            kinds = (kinds,)
        want = set(kinds) if kinds is not None else None
        calls = want is None or "c" in want
        if not calls:                     # the plan's calls are not read at all
            for _, rec in self.kept:
                if want is None or rec.get("k") in want:
                    yield rec
            return
        kept, nk, i = self.kept, len(self.kept), 0
        done = 0
        for rec in _plan_calls(self.plan):
            while i < nk and kept[i][0] <= done:
                if want is None or kept[i][1].get("k") in want:
                    yield kept[i][1]
                i += 1
            yield rec
            done += 1
        while i < nk:
            if want is None or kept[i][1].get("k") in want:
                yield kept[i][1]
            i += 1


    def code_records(self) -> List[Dict[str, Any]]:
        """What retarget.module_loads reads, without decoding every call: the calls that load
        code or look a kernel up, the "fn" records, and one launch per launched function (a
        batch's launches succeeded and name theirs in b.funcs; a failed launch is a plan item).
        Its answer depends on the order within each of those, kept here, not between them."""
        from cudasnap.formats.vocab import is_launch
        from .plan import OpBatch
        launched: Dict[Any, None] = {}
        for it in self.plan or ():
            if type(it) is OpBatch:
                launched.update(dict.fromkeys(it.funcs))
            elif is_launch(it.get("f") or ""):
                launched[(it.get("a") or {}).get("f")] = None
        fns = [rec for _, rec in self.kept if rec.get("k") == "fn"]
        marks = [{"k": "c", "f": "cuLaunchKernel", "a": {"f": h}} for h in launched]
        return self.code_calls() + fns + marks

    def code_calls(self) -> List[Dict[str, Any]]:
        """The calls that load code or look a kernel up, then the incomplete and malformed
        calls (no plan holds them; their handlers report them)."""
        return self.code + [rec for _, rec in self.kept if rec.get("k") == "c"]


def _planned(plan: List[Any]) -> int:
    from .plan import OpBatch
    return sum(it.n if type(it) is OpBatch else 1 for it in plan)


def _plan_calls(plan: List[Any]) -> Iterator[Dict[str, Any]]:
    from .plan import OpBatch
    for it in plan:
        if type(it) is OpBatch:
            recs = it.recs
            each = getattr(recs, "each", None)        # lazily decoded: read without keeping
            yield from (each() if each is not None else recs)
        else:
            yield it


def read_once(reader, blobs: bool = False, limit: Optional[int] = None):
    """reader, its records() answered from one pass over the file (every record decoded and
    kept; blob records only with blobs): for a command that reads a snapshot several ways (the
    simulator's preparation, extract, export). Over limit records: reader itself, which reads
    the file each time (the records would not all fit in memory)."""
    if limit is not None and reader.stats["records"] > limit:
        return reader
    idx = ReplayIndex()
    idx.blobs = blobs
    for rec in reader.records():
        if blobs or rec.get("k") != "b":
            idx.keep(rec)
    idx.attach_plan([])
    return IndexedReader(reader, idx)


class IndexedReader:
    """The snapshot reader of a replay after its prescan: records() from the index (when it
    holds every record), blob() from the D2H expectations read ahead, the rest from the reader."""

    def __init__(self, reader, index: Optional[ReplayIndex] = None, blobs: Optional[Dict[str, bytes]] = None):
        self._reader = reader
        self._index = index if index is not None and index.complete else None
        self._blobs = blobs if blobs is not None else {}

    @property
    def indexed(self) -> bool:
        return self._index is not None

    def records(self, kinds: Optional[Iterable[str]] = None) -> Iterator[Dict[str, Any]]:
        if isinstance(kinds, str):
            kinds = (kinds,)
        if self._index is None or ((kinds is None or "b" in kinds) and not self._index.blobs):
            return self._reader.records(kinds)             # blob records: not in a replay's index
        return self._index.records(kinds)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        return self.records()

    @property
    def graph_calls(self) -> Optional[bool]:
        """Does the snapshot build, capture or launch a CUDA graph (None: not known)?"""
        return self._index.graph_calls if self._index is not None else None

    def code_calls(self) -> Optional[List[Dict[str, Any]]]:
        """The calls that load code or look a kernel up, incomplete ones too (nothing decoded),
        or None (no index: read the records)."""
        return self._index.code_calls() if self._index is not None else None

    def code_records(self) -> Optional[List[Dict[str, Any]]]:
        """ReplayIndex.code_records, or None (no index: read the records)."""
        return self._index.code_records() if self._index is not None else None

    @property
    def header(self) -> Dict[str, Any]:
        if self._index is not None:
            from cudasnap.formats.readahead import seed_header
            seed_header(self._reader, self._index.proc)
        return self._reader.header

    def __enter__(self) -> "IndexedReader":
        return self

    def __exit__(self, *exc) -> None:
        self._reader.close()

    def blob(self, bid: str) -> bytes:
        d = self._blobs.get(bid)
        return d if d is not None else self._reader.blob(bid)

    def __getattr__(self, name):
        return getattr(self._reader, name)
