"""Nothing lost without saying so.

Captures run in a loop on two CPUs kept busy by the test itself must each be complete; a
snapshot that misses anything the program did must be marked partial, with the end record
counting what is missing and `info` saying it. Ring-level checks (stale bytes from an
earlier lap, pads) and the recorder's accounting on a hand-made ring of a dead process run
without load and are deterministic."""
from __future__ import annotations

import mmap
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cudasnap.capture import ring as R
from cudasnap.capture.decode import SeqSet
from cudasnap.formats import SnapshotReader

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20
ITERS = int(os.environ.get("CUDASNAP_LOSS_ITERS", "50"))
H2D_CALLS = ["cuInit", "cuDeviceGet", "cuCtxCreate_v2", "cuMemAlloc_v2"] + ["cuMemcpyHtoD_v2"] * 3 + ["cuMemFree_v2"]


# ---------------------------------------------------------------------------- under load

def _two_cpus() -> set:
    cpus = sorted(os.sched_getaffinity(0))
    return set(cpus[:2])


class _Load:
    """Busy loops on the given CPUs, one per CPU, for the test's length."""

    def __init__(self, cpus: set):
        self.cpus = cpus
        self.procs = []

    def __enter__(self):
        for _ in self.cpus:
            self.procs.append(subprocess.Popen([sys.executable, "-c", "while 1: pass"],
                                               preexec_fn=lambda: os.sched_setaffinity(0, self.cpus)))
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()


def _capture(env: dict, cpus: set, out: Path, args: list, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cudasnap", "capture", "-q", "-f", "-o", str(out), *args],
                          env=env, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=lambda: os.sched_setaffinity(0, cpus))


def _end(r: SnapshotReader) -> dict:
    ends = list(r.records(kinds=["end"]))
    return ends[-1] if ends else {}


def _complete(end: dict) -> bool:
    return (end.get("partial") is False and end.get("calls_missing") == 0 and end.get("lost") == {}
            and end.get("seq_written") == end.get("seq_issued"))


def test_h2d_captures_under_load_are_complete(double, tmp_path):
    """bench/h2d_double.c (three 12 MiB uploads through a 16 MiB ring) captured ITERS times
    in a row on two busy CPUs: every snapshot has every call, returned, and says complete.
    The recorder once read the ring's head before asking whether the program was still
    alive, and lost the calls a program made between the two reads (its last upload's
    result and cuMemFree) in about 1 of 60 such captures, with a clean end record."""
    exe = tmp_path / "h2d_double"
    subprocess.run(["cc", "-O2", "-o", str(exe), str(ROOT / "bench" / "h2d_double.c"), "-ldl"], check=True)
    cpus = _two_cpus()
    bad = []
    t0 = time.monotonic()
    with _Load(cpus):
        for i in range(ITERS):
            out = tmp_path / f"h{i % 2}.cusnap"
            cp = _capture(double["env"], cpus, out, ["--ring-mb", "16", "--threads", "3", "--", str(exe), "3", "12"])
            if cp.returncode != 0 or not out.exists():
                bad.append(f"run {i}: exit {cp.returncode}: {cp.stderr[-400:]}")
                continue
            with SnapshotReader(out) as r:
                calls = list(r.records("c"))
                end = _end(r)
                names = [c["f"] for c in calls]
                if (names != H2D_CALLS or any(c.get("r") != 0 for c in calls) or r.truncated
                        or not _complete(end)):
                    bad.append(f"run {i}: calls {names} results {[c.get('r') for c in calls]} "
                               f"truncated {r.truncated} end {end}")
    took = time.monotonic() - t0
    assert not bad, f"{len(bad)} of {ITERS} captures incomplete ({took:.0f} s):\n" + "\n".join(bad)


def test_thread_launch_loop_through_a_small_ring_is_complete(double, tmp_path):
    """Four threads launching through a 1 MiB ring, drained eagerly, on two busy CPUs: the
    ring wraps many times and the recorder reads right behind the producers. A pad only
    writes its length and state, and was once decoded with the header an earlier lap left
    behind it (an old cuCtxSetCurrent read again, left open as never returned)."""
    cpus = _two_cpus()
    iters = 10000                                     # 40,000 launches: about six laps
    runs = max(3, ITERS // 16)
    bad = []
    with _Load(cpus):
        for i in range(runs):
            out = tmp_path / f"t{i % 2}.cusnap"
            cp = _capture(double["env"], cpus, out, ["--ring-mb", "1", "--drain", "eager", "--",
                                                     double["progs"]["threads"], str(iters)])
            if cp.returncode != 0 or not out.exists():
                bad.append(f"run {i}: exit {cp.returncode}: {cp.stderr[-400:]}")
                continue
            with SnapshotReader(out) as r:
                calls = list(r.records("c"))
                end = _end(r)
            seqs = [c["s"] for c in calls]
            launches = sum(1 for c in calls if c["f"] == "cuLaunchKernel")
            if (launches != 4 * iters or len(set(seqs)) != len(seqs) or any(c.get("incomplete") for c in calls)
                    or not _complete(end)):
                bad.append(f"run {i}: {launches} launches, {len(seqs) - len(set(seqs))} repeated seqs, "
                           f"{sum(1 for c in calls if c.get('incomplete'))} never returned, end {end}")
    assert not bad, f"{len(bad)} of {runs} captures incomplete:\n" + "\n".join(bad)


# ---------------------------------------------------------------------------- ring level

def _make_ring(path: Path, capacity: int = 1 * MiB, pid: int | None = None, seq: int = 0) -> mmap.mmap:
    from cudasnap.shim import description

    desc = description.load()
    with open(path, "wb") as f:
        f.truncate(R.HDR_SIZE + capacity)
    fd = os.open(path, os.O_RDWR)
    mm = mmap.mmap(fd, R.HDR_SIZE + capacity)
    os.close(fd)
    mm[:8] = R.MAGIC
    struct.pack_into("<I", mm, R.OFF_VERSION, R.VERSION)
    struct.pack_into("<Q", mm, R.OFF_CAPACITY, capacity)
    struct.pack_into("<Q", mm, R.OFF_PID, os.getpid() if pid is None else pid)
    struct.pack_into("<I", mm, R.OFF_FNCOUNT, len(desc.functions))
    struct.pack_into("<Q", mm, R.OFF_SEQ, seq)
    return mm


def _rec(mm, pos: int, typ: int, seq: int = 0, fn: int = 0, fields: tuple = (), kind: int | None = R.PUBLISHED) -> int:
    """Write one record at ring position pos with fields (idx, tag, bytes) (kind None:
    reserved, never published); moves head past it and returns the position after it."""
    cap = struct.unpack_from("<Q", mm, R.OFF_CAPACITY)[0]
    body = b"".join(R.FIELD_HDR.pack(idx, tag, len(data)) + data + bytes(-len(data) % 8) for idx, tag, data in fields)
    ln = R.REC_HDR.size + len(body)
    off = R.HDR_SIZE + (pos & (cap - 1))
    R.REC_HDR.pack_into(mm, off, ln, 0, typ, len(fields), fn, seq, 7, 1000 + seq, 0, 1)
    mm[off + R.REC_HDR.size:off + ln] = body
    if kind is not None:
        struct.pack_into("<I", mm, off + 4, R.state_word(pos, kind))
    struct.pack_into("<Q", mm, R.OFF_HEAD, max(pos + ln, struct.unpack_from("<Q", mm, R.OFF_HEAD)[0]))
    return pos + ln


def test_state_word_names_position_and_kind():
    """One slot of a ring holds a different state word on every lap (a 1 MiB ring: over
    the first 2^20 laps sampled, and past 8 and 32 GiB), and for every kind."""
    cap, slot = 1 * MiB, 4096
    laps = list(range(0, 1 << 20, 997)) + [1 << 13, (1 << 13) + 1, 1 << 15, (1 << 15) + 1]
    for kind in (R.PUBLISHED, R.INFLIGHT, R.PADDING):
        words = [R.state_word(slot + k * cap, kind) for k in laps]
        assert len(set(words)) == len(words)
        assert all(w & 3 == kind for w in words)
    assert R.state_word(0) == 1                      # a fresh ring's first record


def test_stale_bytes_are_not_records(tmp_path):
    """A slot holding an old header whose state word reads 1 (or the tag of another
    position) is not a record until the producer publishes it at this position."""
    mm = _make_ring(tmp_path / "r.shm")
    ring = R.Ring(str(tmp_path / "r.shm"))
    end = _rec(mm, 0, R.NOTE, fields=[(R.F_VALS, R.T_STR, b"first")])
    assert [r.type for r in ring.poll()] == [R.NOTE]
    # reserved at `end`, not yet published: the slot holds a published-looking old header
    off = R.HDR_SIZE + end
    R.REC_HDR.pack_into(mm, off, 64, 1, R.PRE, 0, 3, 99, 7, 0, 0, 1)
    struct.pack_into("<Q", mm, R.OFF_HEAD, end + 64)
    assert ring.poll() == []
    struct.pack_into("<I", mm, off + 4, R.state_word(end + (1 << 20)))   # the word of the next lap
    assert ring.poll() == []
    struct.pack_into("<I", mm, off + 4, R.state_word(end))
    assert [(r.type, r.seq) for r in ring.poll()] == [(R.PRE, 99)]
    ring.close()
    mm.close()


def test_pad_is_not_decoded_from_what_an_earlier_lap_left(tmp_path):
    """A pad writes only its length and state: a 112-byte pad over an old PRE is a pad."""
    cap = 1 * MiB
    mm = _make_ring(tmp_path / "r.shm", cap)
    pos = cap - 112
    struct.pack_into("<Q", mm, R.OFF_TAIL, pos)
    # the old lap's PRE, consumed (header word zeroed), its header otherwise intact
    R.REC_HDR.pack_into(mm, R.HDR_SIZE + pos, 0, 0, R.PRE, 0, 52, 5680, 7, 0, 0, 0)
    # this lap: a pad of 112 bytes at pos (only len and state), then a record at the start
    struct.pack_into("<II", mm, R.HDR_SIZE + pos, 112, R.state_word(pos, R.PADDING))
    end = _rec(mm, cap, R.NOTE, fields=[(R.F_VALS, R.T_STR, b"after the pad")])
    ring = R.Ring(str(tmp_path / "r.shm"))
    recs = ring.poll()
    assert [(r.type, r.seq) for r in recs] == [(R.NOTE, 0)]
    assert ring.tail == end
    ring.close()
    mm.close()


def test_seqset():
    s = SeqSet()
    for x in [0, 2, 1, 5, 4, 9, 4, 0]:
        s.add(x)
    assert s.count == 6 and s.repeats == 2
    assert s.starts == [0, 4, 9] and s.ends == [3, 6, 10]
    assert s.missing_below(10) == 4                   # 3, 6, 7, 8
    assert s.missing_below(3) == 0 and s.missing_below(12) == 6


# ---------------------------------------------------------------------------- accounting

def _fn_id(name: str) -> int:
    from cudasnap.shim import description

    names = sorted(f["name"] for f in description.load().functions)
    return names.index(name)


def test_loss_is_counted_and_shown(tmp_path):
    """A ring left by a dead process: a complete call, a record it died writing, a launch in
    flight, a sequence number never written, dropped records and a missing payload. The
    snapshot says partial, the end record counts each, `info` prints them."""
    from typer.testing import CliRunner

    from cudasnap.capture.recorder import Recorder
    from cudasnap.cli import app

    dead = subprocess.Popen(["true"])
    dead.wait()
    session = tmp_path / "session"
    session.mkdir()
    mm = _make_ring(session / f"ring-{dead.pid}.shm", pid=dead.pid, seq=6)
    struct.pack_into("<QQ", mm, R.OFF_DROPPED, 2, 0)
    struct.pack_into("<Q", mm, R.OFF_DROPPED_BYTES, 4 * MiB + 160)
    init, sync, launch, htod = (_fn_id(n) for n in ("cuInit", "cuCtxSynchronize", "cuLaunchKernel", "cuMemcpyHtoD_v2"))
    pos = _rec(mm, 0, R.PRE, seq=0, fn=init)
    pos = _rec(mm, pos, R.POST, seq=0, fn=init)
    # an upload whose source payload never arrived (blob serial 0: its chunks did not fit)
    pos = _rec(mm, pos, R.PRE, seq=1, fn=htod, fields=[(1, R.T_BLOB, struct.pack("<QQ", 0, 12 * MiB))])
    pos = _rec(mm, pos, R.POST, seq=1, fn=htod)
    pos = _rec(mm, pos, R.PRE, seq=2, fn=sync, kind=None)            # died writing it
    pos = _rec(mm, pos, R.CALL, seq=3, fn=launch, kind=R.INFLIGHT)   # died inside the launch
    # seq 4 was handed out and never written (its record dropped); seq 5 a complete query
    pos = _rec(mm, pos, R.CALL, seq=5, fn=init)
    mm.flush()

    out = tmp_path / "dead.cusnap"
    rec = Recorder(session, out, lambda: dead.pid, {}, threads=0)
    rec.start()
    rec.set_root_exit(0, None)
    procs = rec.finish(timeout=60)
    mm.close()
    assert len(procs) == 1 and procs[0].partial
    with SnapshotReader(out) as r:
        calls = {c["s"]: c for c in r.records("c")}
        end = _end(r)
        notes = [n["msg"] for n in r.records(kinds=["note"])]
    assert sorted(calls) == [0, 1, 3, 5]
    assert calls[3]["f"] == "cuLaunchKernel" and calls[3].get("incomplete")
    assert calls[1]["x"]["srcHost"] == {"blob": None, "size": 12 * MiB, "lost": True}
    assert end["partial"] is True
    assert end["seq_issued"] == 6 and end["seq_written"] == 4 and end["calls_missing"] == 2
    assert end["lost"] == {"dropped_records": 2, "dropped_bytes": 4 * MiB + 160, "unpublished_records": 1,
                           "unpublished_bytes": R.REC_HDR.size, "payloads": 1, "payload_bytes": 12 * MiB}
    assert any("2 of 6 calls missing" in n for n in notes)

    res = CliRunner().invoke(app, ["info", str(out)])
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.output.splitlines() if ln.startswith("partial"))
    assert "2 calls missing of 6" in line and "12.0 MiB of payloads missing" in line
    assert "2 records dropped (4.0 MiB)" in line and "1 record left half-written" in line
    res = CliRunner().invoke(app, ["info", "--json", str(out)])
    import json

    assert json.loads(res.output)["loss"]["calls_missing"] == 2


def test_recorder_asks_whether_the_program_lives_before_it_looks_at_the_ring(tmp_path, monkeypatch):
    """The race behind captures that lost their last calls, made deterministic: the program
    writes its last records and exits while the recorder, having found the ring drained,
    is asking whether it is still alive. The recorder must read those records."""
    from cudasnap.capture.recorder import Recorder

    gone = subprocess.Popen(["true"])
    gone.wait()
    session = tmp_path / "session"
    session.mkdir()
    mm = _make_ring(session / f"ring-{gone.pid}.shm", pid=gone.pid, seq=2)
    init, free = _fn_id("cuInit"), _fn_id("cuMemFree_v2")
    end = _rec(mm, 0, R.PRE, seq=0, fn=init)          # the program is inside cuInit
    state = {"exited": False}

    def process_alive(ring):
        if state["exited"]:
            return False
        if ring.tail < ring.head():
            return True
        # everything so far was read: now the call returns, one more is made, the program exits
        pos = _rec(mm, end, R.POST, seq=0, fn=init)
        _rec(mm, pos, R.CALL, seq=1, fn=free)
        struct.pack_into("<I", mm, R.OFF_STATE, 2)
        state["exited"] = True
        return False

    monkeypatch.setattr(R.Ring, "process_alive", process_alive)
    out = tmp_path / "race.cusnap"
    rec = Recorder(session, out, lambda: gone.pid, {}, threads=0, drain="eager")
    rec.start()
    rec.set_root_exit(0, None)
    rec.finish(timeout=60)
    mm.close()
    with SnapshotReader(out) as r:
        calls = [(c["s"], c["f"], c.get("r")) for c in r.records("c")]
        end_rec = _end(r)
    assert calls == [(0, "cuInit", 0), (1, "cuMemFree_v2", 0)], calls
    assert _complete(end_rec), end_rec


def test_complete_capture_says_so(double, capture):
    cp, snap = capture(double["progs"]["direct"], "3")
    assert cp.returncode == 0, cp.stderr
    with SnapshotReader(snap) as r:
        end = _end(r)
        n = sum(1 for _ in r.records("c"))
    assert _complete(end) and end["seq_issued"] == n
    from typer.testing import CliRunner

    from cudasnap.cli import app

    res = CliRunner().invoke(app, ["info", str(snap)])
    assert "partial  : no" in res.output
