"""Group replay: every rank of a captured job at once, one replayer process per rank.

    cudasnap replay JOB.cusnap [--devices 0,1] [replay options...]

JOB.cusnap is the group manifest capture wrote (formats/group.py), or several snapshots
given together. The coordinator (this module, in the `cudasnap` process):
- checks the manifest: every rank's snapshot is there, there are as many GPUs as ranks
  (each rank gets its own GPU: --devices maps rank i to the i-th listed ordinal; by default
  each rank's recorded device);
- serves a UNIX socket (SOCK_SEQPACKET) over which rank replayers hand over the live file
  descriptors of their exports (SCM_RIGHTS) and ask for the ones their imports need, paired
  by the manifest's links (the recorded pid and call of each end);
- starts one `cudasnap replay SNAP --device D --json` per rank at once, with a hook
  (RankHook) that keeps the recorded cross-rank order of copies: before a copy at recorded
  time t a rank waits until every other rank has returned from each call that had returned
  before t in the recording (a shared progress table of recorded return times);
- watches them: a rank that dies, or fails, stops the others after a short grace (they may
  be waiting for it on the GPU), an import whose exporter ended or never came fails after a
  timeout, every rank gets a watchdog: a clear error and exit 2, never a hang;
- prints a summary per rank and for the job. Exit 0 all ranks verified, 1 a mismatch, 2 a
  rank could not proceed.

Environment: CUDASNAP_GROUP_TIMEOUT (seconds an import waits for its export, and a copy for the
other ranks; default 60); CUDASNAP_GROUP_TEST_KILL=RANK:SEQ[:stall] (tests: that rank's replayer
kills itself, or hangs, before call SEQ).
"""
from __future__ import annotations

import json
import mmap
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from cudasnap.formats.abi import base_name
from cudasnap.formats.vocab import in_class, is_graph_launch, is_launch

ENV_SOCKET, ENV_PID, ENV_RANK, ENV_PROGRESS, ENV_NRANKS, ENV_TIMEOUT = (
    "CUDASNAP_GROUP_SOCKET", "CUDASNAP_GROUP_PID", "CUDASNAP_GROUP_RANK", "CUDASNAP_GROUP_PROGRESS",
    "CUDASNAP_GROUP_NRANKS", "CUDASNAP_GROUP_TIMEOUT")
TEST_KILL_ENV = "CUDASNAP_GROUP_TEST_KILL"
DEFAULT_TIMEOUT = 60.0        # an import waits this long for its export
DEFAULT_WATCHDOG = 120.0      # each rank's --watchdog unless one is given
GRACE = 3.0                   # after a rank failed, the others get this long to end
DONE = (1 << 63) - 1          # a rank's progress slot once it has ended
MSG = 65536
PACE_LEAD_NS = 20_000_000     # --pace recorded: the group starts this long after the last rank is ready


class GroupProblem(Exception):
    """The group cannot be replayed (exit 2); the message names the problem."""


# ================================================================== rank side
class Client:
    """A rank replayer's connection to the coordinator (one request at a time)."""

    def __init__(self, path: str, pid: int, timeout: float):
        self.pid = pid
        self.timeout = timeout
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.connect(path)
        self.lock = threading.Lock()

    def _ask(self, msg: Dict[str, Any], fds: Sequence[int] = ()) -> Tuple[Dict[str, Any], List[int]]:
        with self.lock:
            socket.send_fds(self.sock, [json.dumps(msg).encode()], list(fds))
            data, got, _flags, _addr = socket.recv_fds(self.sock, MSG, 16)
        if not data:
            raise OSError("the coordinator closed the connection")
        return json.loads(data), list(got)

    def put(self, key, meta: Dict[str, Any], fds: Sequence[int]) -> None:
        reply, _ = self._ask({"op": "put", "key": key, "meta": meta}, fds)
        if not reply.get("ok"):
            raise OSError(reply.get("error") or "put refused")

    def get(self, key, ctx=None, rec=None) -> Tuple[Dict[str, Any], List[int]]:
        reply, fds = self._ask({"op": "get", "key": key, "timeout": self.timeout})
        if not reply.get("ok"):
            for fd in fds:
                os.close(fd)
            msg = reply.get("error") or "no answer"
            if ctx is not None:
                ctx.fail(rec, msg)
            raise OSError(msg)
        return reply.get("meta") or {}, fds


_client: Optional[Client] = None


def client() -> Optional[Client]:
    """This process's coordinator connection (None outside a group replay)."""
    global _client
    if _client is None and os.environ.get(ENV_SOCKET):
        _client = Client(os.environ[ENV_SOCKET], int(os.environ.get(ENV_PID, "0")),
                         float(os.environ.get(ENV_TIMEOUT, DEFAULT_TIMEOUT)))
    return _client


def reset_client() -> None:
    """Forget this process's coordinator connection (a RankSession's end)."""
    global _client
    if _client is not None:
        try:
            _client.sock.close()
        except OSError:
            pass
        _client = None


class Progress:
    """The shared table: one int64 per rank (recorded return time of the call it is in, or
    DONE), an abort word, then per rank its recorded first-call time and the CLOCK_MONOTONIC ns
    at which it was ready to start (--pace recorded: one time origin for the whole group), then
    per rank the recorded time its window's state was taken (0: its snapshot starts with the
    process), all set before the start rendezvous."""

    def __init__(self, path: str, n: int, create: bool = False):
        self.n = n
        size = 8 * (4 * n + 1)
        if create:
            with open(path, "wb") as f:
                f.write(b"\0" * size)
        self.f = open(path, "r+b")
        self.mm = mmap.mmap(self.f.fileno(), size)
        self.words = memoryview(self.mm).cast("q")

    def set_start(self, i: int, origin: int, ready_ns: int) -> None:
        self.words[self.n + 1 + i] = origin
        self.words[2 * self.n + 1 + i] = ready_ns

    def set_state_t(self, i: int, t: int) -> None:
        self.words[3 * self.n + 1 + i] = t

    def state_t(self, i: int) -> int:
        return self.words[3 * self.n + 1 + i]

    def group_start(self) -> Tuple[int, int]:
        """(the earliest recorded first call of any rank, the latest ready time): read once
        every rank has passed the start rendezvous."""
        w, n = self.words, self.n
        origins = [w[n + 1 + i] for i in range(n) if w[n + 1 + i] > 0]
        return (min(origins) if origins else 0), max(w[2 * n + 1 + i] for i in range(n))

    def set(self, i: int, v: int) -> None:
        self.words[i] = v

    def abort(self) -> None:
        self.words[self.n] = 1

    @property
    def aborted(self) -> bool:
        return self.words[self.n] != 0


class RankHook:
    """Loaded by each rank replayer (--hook cudasnap.replay.group:RankHook): publishes the
    recorded return time of each call as it starts it, and holds a copy back until every
    other rank has passed the copy's recorded start time."""

    wants_calls = True

    def __init__(self):
        global _rank_hook
        _rank_hook = self
        self.rank = int(os.environ.get(ENV_RANK, "0"))
        n = int(os.environ.get(ENV_NRANKS, "1"))
        path = os.environ.get(ENV_PROGRESS)
        self.prog = Progress(path, n) if path else None
        self.timeout = float(os.environ.get(ENV_TIMEOUT, DEFAULT_TIMEOUT))
        # tests: CUDASNAP_GROUP_TEST_KILL=RANK:SEQ kills this rank's replayer before call SEQ
        kill = os.environ.get(TEST_KILL_ENV, "").split(":")
        ok = len(kill) >= 2 and kill[0].isdigit() and int(kill[0]) == self.rank and kill[1].isdigit()
        self.kill_at = int(kill[1]) if ok else None
        self.stall = len(kill) > 2 and kill[2] == "stall"        # hang there instead of dying
        self.linked = False          # has imported another process's memory
        self.state_t = None          # a window's (or checkpoint's) state: when it was taken
        self.close_t = None          # a window's end state: when it was hashed
        self.last_seq = None         # the window's last call
        self.pause_end = None        # when the program went on after its state was taken
        self.imported_h: Dict[int, Optional[int]] = {}     # recorded handle imported -> the owner's rank
        self.imported: List[Tuple[int, int, Optional[int]]] = []   # recorded [lo, hi) another rank owns, owner
        self.owners = _owners()      # (this pid, import call) -> the exporter's rank
        self.skipped_state = 0       # state copies into that memory left to its owner

    def _window_times(self, path: str) -> None:
        """A window snapshot starts from a state the shim copied while the program paused at
        the window's open (the state records themselves carry the later time they were
        drained at), and ends with hashes taken at its close: those two times order the
        state's copies and the end-state check against the other ranks."""
        from cudasnap.formats import SnapshotError
        from cudasnap.formats.opened import opened
        try:
            with opened(path) as r:
                if not (r.header or {}).get("window"):
                    return
                hashed = False
                for rec in r.records(("win", "c", "endstate")):
                    k = rec.get("k")
                    if k == "win" and rec.get("op") in ("open", "checkpoint") and rec.get("t"):
                        self.state_t = int(rec["t"])
                    elif k == "win" and rec.get("op") == "state" and self.state_t:
                        self.pause_end = self.state_t + int(rec.get("pause_ns") or rec.get("dump_ns") or 0)
                    elif k == "win" and rec.get("op") == "close" and rec.get("t"):
                        self.close_t = int(rec["t"])
                    elif k == "endstate" and not rec.get("none"):
                        hashed = True
                    elif k == "c" and not rec.get("state") and isinstance(rec.get("s"), int):
                        self.last_seq = rec["s"] if self.last_seq is None else max(self.last_seq, rec["s"])
                if not hashed:
                    self.close_t = None
        except (SnapshotError, OSError):
            pass

    def start(self, ev) -> None:
        rv = ev.replay
        if self.prog is not None:
            # front: before a caller's own subscribers (extract reads memory)
            rv.subscribe(self, first=bool(getattr(self, "front", False)))
            self._window_times(rv.path)
            self.prog.set_state_t(self.rank, self.state_t or 0)
            # rendezvous: every rank has read its snapshot before any replays a call, so the
            # ranks start together (collectives wait on each other, as when recorded)
            origin = rv.pace_origin() or 0
            self.prog.set_start(self.rank, origin, time.clock_gettime_ns(time.CLOCK_MONOTONIC))
            self.prog.set(self.rank, 1)
            self._wait_for(1, "the start: rank {r} did not start replaying")
            if origin:
                # --pace recorded: the recorded clock is one for all ranks (one host), so every
                # rank keeps its offset from the group's first call, from one common start;
                # a collective then waits on its peers about as long as when recorded
                first, ready = self.prog.group_start()
                rv.pace_start_at((ready + PACE_LEAD_NS + (origin - first)) * 1e-9)

    def on_event(self, kind: str, ev) -> None:
        if kind == "before_call":
            self._before(ev.rec)
        elif kind == "after_call":
            if in_class(ev.rec.get("f"), "opens_ipc_memory"):
                self._opened(ev)
            if self.close_t and ev.rec.get("s") == self.last_seq and not ev.rec.get("state"):
                # the end state is checked next: first every other rank passes the close
                # (its calls recorded before it have run), and none runs a copy or launch
                # recorded after it until this rank has ended
                self.prog.set(self.rank, self.close_t)
                self._wait_for(self.close_t, "the window's end: rank {r} did not reach the calls recorded before "
                                             "this rank's window closed")
        elif kind == "end" and self.prog is not None:
            self.prog.set(self.rank, DONE)
            if self.skipped_state:
                ev.replay.warn(f"group replay: {self.skipped_state} state copies into memory imported from "
                                     f"another rank were left to that rank (it restores its own memory)")

    def _before(self, rec) -> None:
        from .events import classify
        # published: every call of this rank whose recorded return time is below the value
        # has returned here. Waiting before a call: all calls before it (they returned before
        # its start); running it: itself excepted, those up to its own return time.
        if self.kill_at is not None and rec.get("s") == self.kill_at:
            if self.stall:
                time.sleep(3600)
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = rec.get("t0") or 0
        f = rec.get("f") or ""
        b = base_name(f)
        if in_class(b, "imports_shareable") and isinstance((rec.get("a") or {}).get("handle"), int):
            self.imported_h[rec["a"]["handle"]] = self.owners.get(rec.get("s"))
        elif in_class(b, "maps_range") and (rec.get("a") or {}).get("handle") in self.imported_h:
            a = rec["a"]
            if isinstance(a.get("ptr"), int) and isinstance(a.get("size"), int):
                self.imported.append((a["ptr"], a["ptr"] + a["size"], self.imported_h[a["handle"]]))
        if rec.get("state") and self.imported:
            self._skip_imported(rec)
        if rec.get("state") and self.state_t:
            t0 = self.state_t              # the content is the memory as it was at the window's open
            self.prog.set(self.rank, t0)
            self._wait_for(t0, f"call #{rec.get('s')} (the window's state): rank {{r}} did not reach the calls "
                               "recorded before this rank's window opened")
            return
        if not self.linked and in_class(f, "imports_peer"):
            self.linked = True
        # a copy, and once this rank maps another's memory every launch, waits for the others to
        # pass its recorded start: what the program's own host rendezvous ensured (e.g. a peer
        # had set up the buffers a collective kernel reads) holds in the replay too
        if t0 and (classify(f) == "copy" or (self.linked and (is_launch(f) or is_graph_launch(f) or in_class(f, "waits_event")))):
            self.prog.set(self.rank, t0)
            self._wait_for(t0, f"call #{rec.get('s')} {rec.get('f')}: rank {{r}} did not reach the calls recorded "
                                "before it")
        self.prog.set(self.rank, rec.get("t1") or t0)

    def _opened(self, ev) -> None:
        """cuIpcOpenMemHandle returned: the exporter's allocation, as this replay placed it."""
        want = (ev.rec.get("a") or {}).get("pdptr")
        al = ev.replay.find(want) if isinstance(want, int) else None
        if al is not None:
            self.imported.append((int(al.rec_base), int(al.rec_base) + max(int(al.size), 1),
                                  self.owners.get(ev.rec.get("s"))))

    def _skip_imported(self, rec) -> None:
        """A window's state copy into memory another rank owns, when the owner's own state
        (or its snapshot's start) comes no later than this rank went on after taking it: the
        owner restores that memory itself, from a state taken while it was paused, and replays
        what it did to it from then on; this rank's copy was read while the owner kept running
        (a race with the owner's work that the recording cannot order). The copy is made empty
        (no bytes, its payload not read).
        Where the owner's state is later, this rank's copy is the only one and stays."""
        a = rec.get("a") or {}
        dst = a.get("dstDevice")
        if not isinstance(dst, int):
            return
        for lo, hi, owner in self.imported:
            if lo <= dst < hi:
                break
        else:
            return
        if owner is None or owner == self.rank or self.prog is None:
            return
        if self.prog.state_t(owner) > (self.pause_end or self.state_t or 0):
            return
        rec["a"] = {**a, "ByteCount": 0}
        rec["x"] = {k: v for k, v in (rec.get("x") or {}).items() if k != "srcHost"}     # not read at all
        self.skipped_state += 1

    def _wait_for(self, t: int, what: str) -> None:
        w, n, me = self.prog.words, self.prog.n, self.rank
        if all(w[i] >= t for i in range(n) if i != me):
            return
        # spin first (a peer usually arrives within microseconds: a sleep would wake late and
        # shift this rank's next collective), then nap briefly
        now = time.monotonic()
        spin_until, deadline, nap = now + 0.0005, now + self.timeout, 0.00002
        while True:
            behind = [i for i in range(n) if i != me and w[i] < t]
            if not behind:
                return
            if self.prog.aborted:
                _stop("the group replay was stopped (another rank failed)")
            now = time.monotonic()
            if now > deadline:
                _stop(f"{what.format(r=behind[0])} within {self.timeout:g} s (hung, or waiting for this rank?)")
            if now > spin_until:
                time.sleep(nap)
                nap = min(nap * 2, 0.0002)


_rank_hook: Optional[RankHook] = None


def peers_text() -> str:
    """Where this rank's peers are (for a hang's message): each ended, or still replaying."""
    h = _rank_hook
    if h is None or h.prog is None:
        return ""
    w = h.prog.words
    parts = [f"rank {i} {'ended' if w[i] == DONE else 'still replaying'}" for i in range(h.prog.n) if i != h.rank]
    return "; ".join(parts)


def rank_done() -> None:
    """This rank will replay no more work its peers wait on: its progress reads as ended.
    Graph mode in a job says so before it profiles at the replay's end, whichever subscriber
    hears the end first: a peer whose remaining calls were recorded after this rank's last one
    waits for that, and this rank's last collective, still running, waits for the peer."""
    h = _rank_hook
    if h is not None and h.prog is not None:
        h.prog.set(h.rank, DONE)


# waits that may be on another rank's event (an IPC event): they wait for the other ranks to
# pass their recorded start, so the exporter's record is replayed before them, as recorded
ENV_OWNERS = "CUDASNAP_GROUP_OWNERS"


def _owners() -> Dict[int, int]:
    """This rank's imports (recorded call number) -> the rank that exported the memory, from
    the file the coordinator wrote (ENV_OWNERS); empty outside a group replay."""
    path = os.environ.get(ENV_OWNERS)
    pid = os.environ.get(ENV_PID)
    if not path or not pid:
        return {}
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return {}
    return {int(seq): int(rank) for seq, rank in (doc.get(pid) or {}).items()}


def owners_doc(m: Dict[str, Any]) -> Dict[str, Dict[str, int]]:
    """{importing pid: {import call number: exporting rank}} from a manifest's links."""
    rank_of = {r["pid"]: r["rank"] for r in m.get("ranks", [])}
    out: Dict[str, Dict[str, int]] = {}
    for ln in m.get("links", []):
        fr, to = ln.get("from") or {}, ln.get("to") or {}
        if fr.get("pid") in rank_of and isinstance(to.get("seq"), int):
            out.setdefault(str(to.get("pid")), {})[str(to["seq"])] = rank_of[fr["pid"]]
    return out


def _stop(msg: str) -> None:
    """Stop this rank's replay with an error (exit 2; its result so far is still reported)."""
    from .errors import ReplayError
    raise ReplayError(msg)


# ================================================================== coordinator
class LinkStore:
    """Exported fds by key, paired to imports through the manifest."""

    def __init__(self, manifest: Dict[str, Any], timeout: float):
        self.cv = threading.Condition()
        self.items: Dict[str, Tuple[Dict[str, Any], List[int]]] = {}
        self.timeout = timeout
        self.ended: Dict[int, str] = {}            # recorded pid -> how its rank ended
        self.pairs: Dict[str, str] = {}            # import key -> export key
        for ln in manifest.get("links", []):
            fr, to = ln["from"], ln["to"]
            self.pairs[_k(["import", to["pid"], to["seq"]])] = _k(["export", fr["pid"], fr["seq"]])

    def put(self, key, meta, fds) -> None:
        with self.cv:
            old = self.items.pop(_k(key), None)
            if old:
                for fd in old[1]:
                    os.close(fd)
            self.items[_k(key)] = (meta, fds)
            self.cv.notify_all()

    def get(self, key, timeout: float):
        ik = _k(key)
        ek = self.pairs.get(ik)
        if ek is None:
            return None, "no recorded export is linked to this import (see the manifest's unmatched list)"
        src_pid = json.loads(ek)[1]
        deadline = time.monotonic() + min(timeout, self.timeout)
        with self.cv:
            while ek not in self.items:
                if src_pid in self.ended:
                    return None, f"the exporting process {src_pid} {self.ended[src_pid]} before exporting it"
                left = deadline - time.monotonic()
                if left <= 0:
                    return None, (f"the export of process {src_pid} (call #{json.loads(ek)[2]}) did not come "
                                  f"within {self.timeout:g} s")
                self.cv.wait(min(left, 0.2))
            meta, fds = self.items[ek]
            return meta, [os.dup(fd) for fd in fds]

    def rank_ended(self, pid: int, how: str) -> None:
        with self.cv:
            self.ended[pid] = how
            self.cv.notify_all()

    def close(self) -> None:
        for _m, fds in self.items.values():
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass


def _k(key) -> str:
    return json.dumps(list(key))


def serve_links(srv: socket.socket, store: LinkStore, stop: threading.Event) -> None:
    srv.settimeout(0.2)
    while not stop.is_set():
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            continue
        except OSError:
            return
        threading.Thread(target=_conn, args=(conn, store), daemon=True).start()


def _conn(conn: socket.socket, store: LinkStore) -> None:
    with conn:
        while True:
            try:
                data, fds, _f, _a = socket.recv_fds(conn, MSG, 16)
            except OSError:
                return
            if not data:
                return
            try:
                msg = json.loads(data)
                if msg.get("op") == "put":
                    store.put(msg["key"], msg.get("meta") or {}, list(fds))
                    socket.send_fds(conn, [b'{"ok": true}'], [])
                elif msg.get("op") == "get":
                    meta, out = store.get(msg["key"], float(msg.get("timeout") or store.timeout))
                    if meta is None:
                        socket.send_fds(conn, [json.dumps({"ok": False, "error": out}).encode()], [])
                    else:
                        try:
                            socket.send_fds(conn, [json.dumps({"ok": True, "meta": meta}).encode()], out)
                        finally:
                            for fd in out:
                                os.close(fd)
                else:
                    socket.send_fds(conn, [b'{"ok": false, "error": "unknown request"}'], [])
            except (OSError, ValueError, KeyError) as e:
                try:
                    socket.send_fds(conn, [json.dumps({"ok": False, "error": str(e)}).encode()], [])
                except OSError:
                    return


def load_group(paths: Sequence) -> Dict[str, Any]:
    """The manifest of one manifest path, or one built from several snapshots."""
    from cudasnap.formats import SnapshotError
    from cudasnap.formats.group import GroupError, build, is_manifest, load
    paths = [os.fspath(p) for p in paths]
    if len(paths) == 1:
        if not os.path.exists(paths[0]):
            raise GroupProblem(f"{paths[0]}: no such file")
        if not is_manifest(paths[0]):
            raise GroupProblem(f"{paths[0]} is one snapshot: --devices is for a job (its group manifest or all its "
                               f"snapshots); use --device N")
        try:
            m = load(paths[0])
        except GroupError as e:
            raise GroupProblem(str(e))
        missing = [r for r in m["ranks"] if not os.path.isfile(r["snapshot"])]
        if missing:
            r = missing[0]
            raise GroupProblem(f"rank {r['rank']} (pid {r['pid']}): snapshot {r['snapshot']} is missing; the job "
                               f"needs all {len(m['ranks'])} ranks")
        return m
    for p in paths:
        if not os.path.isfile(p):
            raise GroupProblem(f"{p}: no such file")
        if is_manifest(p):
            raise GroupProblem(f"{p} is a group manifest: give it alone")
    try:
        return build(paths)
    except SnapshotError as e:
        raise GroupProblem(str(e))


def _gpu_key(r) -> Any:
    """The physical GPU a rank used: its UUID where recorded, else its ordinal."""
    d = (r.get("devices") or [0])[0]
    g = r.get("gpus") or []
    return g[d] if 0 <= d < len(g) and g[d] else d


def device_map(m: Dict[str, Any], devices: Optional[str], count: Optional[int]) -> List[int]:
    """One GPU ordinal per rank: --devices in rank order, else each rank's recorded device.
    Ranks recorded on different GPUs must replay on different GPUs (NCCL refuses two ranks
    on one GPU); ranks that shared one when recorded may share one again."""
    ranks = m["ranks"]
    keys = [_gpu_key(r) for r in ranks]
    ngpu = len(set(keys))
    if devices:
        try:
            ds = [int(x) for x in devices.split(",") if x.strip() != ""]
        except ValueError:
            raise GroupProblem(f"--devices {devices}: give GPU ordinals separated by commas (e.g. 0,1)")
        if len(ds) == 0 or len(set(ds)) < ngpu:
            raise GroupProblem(f"--devices {devices}: {len(set(ds))} GPU(s) for {len(ranks)} ranks; the job was "
                               f"recorded on {ngpu} GPUs and ranks on different GPUs need different GPUs")
        if len(ds) < len(ranks):
            raise GroupProblem(f"--devices {devices}: {len(ds)} ordinal(s) for {len(ranks)} ranks (one per rank)")
        ds = ds[:len(ranks)]
    else:
        ds = [(r.get("devices") or [0])[0] for r in ranks]
        if len(set(zip(keys, ds))) != len(set(keys)) or len(set(ds)) != ngpu:
            order = list(dict.fromkeys(keys))     # one process per GPU, each seeing its own as 0
            ds = [order.index(k) for k in keys]
    for i in range(len(ranks)):
        for j in range(i):
            if ds[i] == ds[j] and keys[i] != keys[j]:
                raise GroupProblem(f"ranks {j} and {i} were recorded on different GPUs but would share GPU {ds[i]} "
                                   f"(use --devices)")
    if count is not None:
        need = len(set(ds))
        if count < need or any(d >= count for d in ds):
            raise GroupProblem(f"the job needs {need} GPUs (ordinals {','.join(map(str, ds))}); this machine has "
                               f"{count}")
    many = [r for r in ranks if len(r.get("devices") or []) > 1]
    if many:
        r = many[0]
        sys.stderr.write(f"cudasnap: note: rank {r['rank']} used {len(r['devices'])} GPUs; it replays on GPU "
                         f"{ds[r['rank']]} alone (its devices fold onto one)\n")
    return ds


def gpu_count() -> Optional[int]:
    if os.environ.get("CUDASNAP_GROUP_NO_COUNT"):
        return None
    try:
        from cuda.bindings import driver as cu  # type: ignore
        if int(cu.cuInit(0)[0]) != 0:
            return 0
        err, n = cu.cuDeviceGetCount()
        return int(n) if int(err) == 0 else 0
    except Exception:
        return None      # the ranks say it themselves


def run_group(paths: Sequence, devices: Optional[str], options, as_json: bool = False,
              watchdog: Optional[float] = None, out=None, trace: Optional[str] = None) -> int:
    """`cudasnap replay JOB.cusnap [...]`: replay every rank at once; returns the exit code.
    options: (ReplayOptions, ProfileConfig) of every rank, handed to each rank's replayer as
    one document (replay/rankopts.py; "{rank}" in the output paths becomes the rank);
    trace: one trace file for all ranks (--profile timeline)."""
    import copy
    from . import rankopts
    out = out or sys.stdout
    opts, cfg = copy.deepcopy(options)
    try:
        m = load_group(paths)
        ds = device_map(m, devices, gpu_count())
    except GroupProblem as e:
        sys.stderr.write(f"cudasnap: error: {e}\n")
        return 2
    ranks = m["ranks"]
    from .preflight import snapshot_problem
    for r in ranks:                    # every rank's frames verified before any rank starts
        problem = snapshot_problem(r["snapshot"])
        if problem:
            sys.stderr.write(f"cudasnap: error: rank {r['rank']}: {problem}\n")
            return 2
    _flight_starts(ranks)
    timeout = float(os.environ.get(ENV_TIMEOUT, DEFAULT_TIMEOUT))
    tmp = tempfile.mkdtemp(prefix="cudasnap-group-")
    outs = [cfg.out] if cfg.out else []
    if cfg.mode == "timeline" and not outs:
        outs = [os.path.join(tmp, "prof{rank}.json")]      # for the collectives' waits across ranks
        cfg.out = outs[0]
    if trace:
        cfg.trace = os.path.join(tmp, "trace{rank}.json")
        cfg.mode = cfg.mode or "timeline"                  # a trace is a timeline's
    doc = os.path.join(tmp, "options.json")
    rankopts.dump(doc, opts, cfg)
    sock_path = os.path.join(tmp, "sock")
    store = LinkStore(m, timeout)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    srv.bind(sock_path)
    srv.listen(len(ranks) * 2)
    stop = threading.Event()
    threading.Thread(target=serve_links, args=(srv, store, stop), daemon=True).start()
    prog = Progress(os.path.join(tmp, "progress"), len(ranks), create=True)
    owners = os.path.join(tmp, "owners.json")
    with open(owners, "w") as f:
        json.dump(owners_doc(m), f)
    procs: List[subprocess.Popen] = []
    codes = None
    t0 = time.monotonic()
    try:
        for r, d in zip(ranks, ds):
            env = dict(os.environ)
            env.update({ENV_SOCKET: sock_path, ENV_PID: str(r["pid"]), ENV_RANK: str(r["rank"]),
                        ENV_PROGRESS: os.path.join(tmp, "progress"), ENV_NRANKS: str(len(ranks)),
                        ENV_TIMEOUT: str(timeout), ENV_OWNERS: owners})
            cmd = rankopts.rank_command(sys.executable, doc, r["snapshot"], d, watchdog or DEFAULT_WATCHDOG)
            # a process of its own: one per rank, as the job ran (its GPU, pid and descriptors)
            procs.append(subprocess.Popen(cmd, env=env, stdout=open(os.path.join(tmp, f"out{r['rank']}"), "wb"),
                                          stderr=open(os.path.join(tmp, f"err{r['rank']}"), "wb")))
        codes, why = _watch(procs, ranks, store, prog)
    except KeyboardInterrupt:
        from cudasnap.formats.outputs import Interrupted
        raise Interrupted("every rank was stopped; no output was written") from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        stop.set()
        srv.close()
        store.close()
        if codes is None:              # interrupted, or could not start a rank
            shutil.rmtree(tmp, ignore_errors=True)
    results = []
    for r, d, p, c in zip(ranks, ds, procs, codes):
        res = _rank_result(tmp, r, d, c, why.get(r["rank"]))
        results.append(res)
    if trace:
        n = merge_traces([(r["rank"], os.path.join(tmp, f"trace{r['rank']}.json")) for r in ranks], trace)
        if n:
            sys.stderr.write(f"cudasnap: trace of {len(ranks)} ranks ({n} events) written to {trace}\n")
    coll = _collectives(outs[0] if outs else None, ranks)
    shutil.rmtree(tmp, ignore_errors=True)
    code = 2 if any(x["exit_code"] not in (0, 1) for x in results) else (1 if any(x["exit_code"] for x in results) else 0)
    _summary(results, code, time.monotonic() - t0, as_json, out, coll)
    return code


def _flight_starts(ranks) -> None:
    """Flight-recorder snapshots of a job start where each process's kept checkpoint was: a
    rank whose snapshot starts from the process's start next to one that starts at a later
    checkpoint reads memory the other did not record before it (said, not refused)."""
    from cudasnap.formats import SnapshotError, SnapshotReader
    starts = []
    for r in ranks:
        try:
            with SnapshotReader(r["snapshot"]) as rd:
                w = (rd.header or {}).get("window") or {}
        except (SnapshotError, OSError):
            return
        if w.get("mode") != "flight":
            return
        starts.append((r["rank"], w.get("why") or "", w.get("n")))
    if len({why == "start" for _r, why, _n in starts}) > 1:
        early = [r for r, why, _n in starts if why == "start"]
        late = [r for r, why, _n in starts if why != "start"]
        sys.stderr.write(f"cudasnap: note: flight snapshots of this job start at different points: rank(s) "
                         f"{','.join(map(str, early))} from the process start, rank(s) {','.join(map(str, late))} "
                         f"at a later checkpoint; what the former read of the latter's memory before that checkpoint "
                         f"was not recorded, so a mismatch there is expected (a longer --flight-recorder period "
                         f"keeps every rank from its start)\n")


def _collectives(out_pattern: Optional[str], ranks) -> Optional[Dict[str, Any]]:
    """--profile timeline: collective kernels matched across the ranks' profiles (their waits)."""
    if not out_pattern:
        return None
    from .collectives import from_launch_rows, load_rows
    rows = {}
    for r in ranks:
        try:
            rows[r["rank"]] = load_rows(out_pattern.replace("{rank}", str(r["rank"])))
        except (OSError, ValueError):
            continue
    c = from_launch_rows(rows) if len(rows) > 1 else None
    return c if c and c["matched"] else None


def _watch(procs, ranks, store: LinkStore, prog: Progress) -> Tuple[List[Optional[int]], Dict[int, str]]:
    """Wait for every rank; after one fails (or dies), give the rest GRACE seconds, then stop
    them. Returns the exit codes (negative: signal) and why ranks were stopped."""
    codes: List[Optional[int]] = [None] * len(procs)
    why: Dict[int, str] = {}
    failed_at = None
    while any(c is None for c in codes):
        for i, p in enumerate(procs):
            if codes[i] is None and p.poll() is not None:
                codes[i] = p.returncode
                how = "ended" if p.returncode == 0 else (f"was killed by signal {-p.returncode}" if p.returncode < 0
                                                         else f"failed (exit {p.returncode})")
                store.rank_ended(ranks[i]["pid"], how)
                if p.returncode not in (0, 1) and failed_at is None:
                    failed_at = time.monotonic()
                    prog.abort()
                    for j in range(len(procs)):
                        if j != i:
                            why.setdefault(ranks[j]["rank"], f"rank {ranks[i]['rank']} (pid {ranks[i]['pid']}) {how}")
        if failed_at is not None and time.monotonic() - failed_at > GRACE:
            for i, p in enumerate(procs):
                if codes[i] is None:
                    p.send_signal(signal.SIGKILL)
                    p.wait()
                    codes[i] = -signal.SIGKILL
                    why[ranks[i]["rank"]] = why.get(ranks[i]["rank"], "") + "; stopped by the coordinator"
        time.sleep(0.05)
    return codes, why


def _rank_result(tmp: str, r, d: int, code: Optional[int], why: Optional[str]) -> Dict[str, Any]:
    res: Dict[str, Any] = {"rank": r["rank"], "pid": r["pid"], "snapshot": r["snapshot"], "device": d}
    try:
        body = json.loads(open(os.path.join(tmp, f"out{r['rank']}"), "rb").read() or b"{}")
    except ValueError:
        body = {}
    err = open(os.path.join(tmp, f"err{r['rank']}"), "rb").read().decode("utf-8", "replace").strip()
    res["replay"] = body
    res["exit_code"] = code if code is not None and code >= 0 else 2
    errors = list(body.get("errors") or [])
    if code is not None and code < 0:
        errors.append(f"the rank's replayer was killed by signal {-code}")
    if why and res["exit_code"] != 0:
        errors.append(f"stopped: {why}")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if res["exit_code"] and not body and lines:
        errors.append(lines[-1])
    res["errors"] = errors
    return res


def _summary(results, code: int, elapsed: float, as_json: bool, out, coll=None) -> None:
    if as_json:
        d = {"exit_code": code, "elapsed_s": elapsed, "ranks": results}
        if coll:
            d["collectives"] = coll
        out.write(json.dumps(d, indent=2, default=str) + "\n")
        return
    line = next((x["replay"].get("numerics", {}).get("line") for x in results if (x["replay"].get("numerics") or {}).get("line")), None)
    if line:
        out.write(line + "\n")
    for x in results:
        b = x["replay"]
        state = {0: "PASS", 1: "MISMATCH"}.get(x["exit_code"], "ERROR")
        num = b.get("numerics") or {}
        judged = (f" ({num.get('exact', 0)} EXACT, {num.get('close', 0)} CLOSE"
                  + (f" max rel {num['max_rel']:.2g}" if num.get("close") and isinstance(num.get("max_rel"), float) else "")
                  + f", {num.get('different', 0)} DIFFERENT)") if num.get("line") else ""
        out.write(f"rank {x['rank']} (pid {x['pid']}, GPU {x['device']}): {state}  "
                  f"{b.get('calls', 0)} calls, {b.get('launches', 0)} launches, {b.get('placed', 0)} placed, "
                  f"{b.get('fell_back', 0)} fell back, {b.get('d2h_verified', 0)} D2H verified{judged}\n")
        for e in x["errors"][:3]:
            out.write(f"  error: {e}\n")
    if coll:
        from .collectives import describe
        out.write("\n".join(describe(coll)) + "\n")
    n = len(results)
    ok = sum(1 for x in results if x["exit_code"] == 0)
    out.write(f"job: {n} ranks, {ok} verified, {elapsed:.2f} s: "
              f"{'PASS' if code == 0 else ('MISMATCH' if code == 1 else 'ERROR')}\n")


def merge_traces(paths: List[Tuple[int, str]], out_path: str) -> int:
    """One trace of every rank: each rank's processes (its GPU, its host calls) get a pid and
    name of their own ("rank R: GPU N"), and times move onto one clock (each rank's trace
    starts at its own clock_origin_ns; the clocks are the host's, shared by the ranks).
    Returns the number of events written."""
    import gzip
    loaded = []
    for r, p in paths:
        try:
            with (gzip.open if p.lower().endswith(".gz") else open)(p, "rt") as f:
                loaded.append((r, json.load(f)))
        except (OSError, ValueError):
            continue
    if not loaded:
        return 0
    origins = [(d.get("otherData") or {}).get("clock_origin_ns") or 0 for _r, d in loaded]
    base = min(origins)
    evs: List[Dict[str, Any]] = []
    props = []
    for (r, d), origin in zip(loaded, origins):
        shift = (origin - base) / 1000.0
        pids: Dict[Any, int] = {}

        def pid_of(p):
            if p not in pids:
                pids[p] = (r + 1) * 1_000_000 + len(pids)
            return pids[p]
        for e in d.get("traceEvents") or []:
            e = dict(e)
            if "pid" in e:
                e["pid"] = pid_of(e["pid"])
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] = e["ts"] + shift
            if "id" in e and e.get("ph") in ("s", "f", "t", "b", "e"):
                e["id"] = f"r{r}:{e['id']}"
            if e.get("ph") == "M" and e.get("name") == "process_name":
                e["args"] = {"name": f"rank {r}: {(e.get('args') or {}).get('name', '')}"}
            if e.get("ph") == "M" and e.get("name") == "process_sort_index":
                e["args"] = {"sort_index": (r + 1) * 1_000_000 + int((e.get("args") or {}).get("sort_index", 0)) % 1_000_000}
            evs.append(e)
        for dp in d.get("deviceProperties") or []:
            props.append({**dp, "id": pid_of(dp.get("id")), "rank": r})
    out = {"schemaVersion": 1, "traceName": "cudasnap group replay", "displayTimeUnit": "ms", "traceEvents": evs,
           "otherData": {"tool": "cudasnap", "ranks": [r for r, _d in loaded], "clock_origin_ns": base}}
    if props:
        out["deviceProperties"] = props
    from cudasnap.formats.outputs import atomic_path
    with atomic_path(out_path) as tmp, (gzip.open if out_path.lower().endswith(".gz") else open)(tmp, "wt") as f:
        json.dump(out, f)
    return len(evs)
