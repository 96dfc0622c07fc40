"""Big H2D copies: the read-ahead pipeline (replay/staging.py) and SnapshotReader.chunk_into
give the blob's exact bytes, verified, and a staged replay on the test double goes through
the page-locked slots and the dedicated stream."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

from cudasnap.formats import CHUNK_SIZE, SnapshotError, SnapshotReader, SnapshotWriter
from cudasnap.replay.staging import BlobPipeline

sys.path.insert(0, os.path.dirname(__file__))
from test_replay_fast import incr_session  # noqa: E402


def _payloads():
    rng = np.random.default_rng(7)
    rand = rng.integers(0, 256, 2 * CHUNK_SIZE + 12345, dtype=np.uint8).tobytes()        # stored raw
    fp16 = (rng.standard_normal(CHUNK_SIZE + 777) * 0.01).astype(np.float16).tobytes()  # zstd
    return {"rand": rand, "fp16": fp16, "zeros": bytes(3 * CHUNK_SIZE)}


@pytest.fixture
def snap(tmp_path):
    path = tmp_path / "blobs.cusnap"
    ids = {}
    with SnapshotWriter(path, level=3) as w:
        for name, data in _payloads().items():
            ids[name] = w.add_blob(data)
    return path, ids


def test_chunk_into_matches_chunk(snap):
    path, ids = snap
    with SnapshotReader(path) as r:
        out = bytearray(CHUNK_SIZE)
        scratch = None
        for bid in ids.values():
            _size, cids = r.blob_chunk_ids(bid)
            for cid in cids:
                n, scratch = r.chunk_into(cid, out, scratch)
                assert bytes(out[:n]) == r.chunk(cid)


def test_pipeline_gives_each_blob_in_order_and_skips(snap):
    path, ids = snap
    data = _payloads()
    order = [ids["rand"], ids["fp16"], ids["zeros"], ids["rand"]]
    pipe = BlobPipeline(str(path), order, nbytes=3 * CHUNK_SIZE, threads=2)
    try:
        assert b"".join(pipe.take(ids["rand"])) == data["rand"]
        # fp16 is skipped: its slots come back, zeros and rand still arrive whole
        assert b"".join(pipe.take(ids["zeros"])) == data["zeros"]
        assert pipe.take(ids["fp16"]) is None            # behind the consumer now
        assert b"".join(pipe.take(ids["rand"])) == data["rand"]
        # a skipped chunk's slot comes back when its reader finishes, which on a loaded
        # machine can be after the consumer is done: every slot is back within seconds
        deadline = time.monotonic() + 10
        while pipe._free.qsize() < len(pipe.slots) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pipe._free.qsize() == len(pipe.slots)
    finally:
        pipe.stop()


def test_pipeline_reports_a_corrupt_chunk(snap, tmp_path):
    path, ids = snap
    with SnapshotReader(path) as r:
        _size, cids = r.blob_chunk_ids(ids["rand"])
        off = r._chunks[cids[1]]
    raw = bytearray(path.read_bytes())
    raw[off + 32 + 1000] ^= 0xFF                      # inside the second chunk's data
    bad = tmp_path / "bad.cusnap"
    bad.write_bytes(raw)
    pipe = BlobPipeline(str(bad), [ids["rand"], ids["zeros"]], nbytes=2 * CHUNK_SIZE, threads=2)
    try:
        with pytest.raises(SnapshotError, match="checksum mismatch"):
            b"".join(pipe.take(ids["rand"]))
        assert b"".join(pipe.take(ids["zeros"])) == bytes(3 * CHUNK_SIZE)
    finally:
        pipe.stop()


_COUNTING = """
import sys
from cudasnap.replay import staging
n = [0]
orig = staging.Stager.copy_sync
def counted(self, *a, **k):
    n[0] += 1
    return orig(self, *a, **k)
staging.Stager.copy_sync = counted
from cudasnap.cli import main
try:
    main()
finally:
    sys.stderr.write("STAGED %d\\n" % n[0])
"""


def test_staged_replay_uses_the_slots(double, tmp_path):
    snap = tmp_path / "big.cusnap"
    incr_session(snap, launches=3, h2d_bytes=(40 << 20) + 4096)
    env = dict(double["env"], CUDASNAP_PREFETCH="1")
    env.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    cp = subprocess.run([sys.executable, "-c", _COUNTING, "replay", str(snap), "--json"], env=env,
                        capture_output=True, text=True, timeout=120)
    assert cp.stdout.startswith("{"), cp.stderr[-2000:]
    r = json.loads(cp.stdout)
    assert r["exit_code"] == 0 and r["d2h_verified"] == 2 and not r["mismatches"], (r["errors"], cp.stderr)
    assert "STAGED 1" in cp.stderr, cp.stderr
    assert not [w for w in r["warnings"] if "page-lock" in w], r["warnings"]


def _copies_session(path, sizes, async_on):
    """Several big H2D copies (sync, or async on a stream the program made), each read back
    with a D2H that replay verifies; one incr launch between them."""
    from synth import Synth
    s = Synth(path)
    ctx, mod, f_incr, stream = 0x55550000, 0x55560000, 0x55570005, 0x55580000
    s.double_prologue("incr", f_incr, [[0, 8], [8, 4]], ctx, mod)
    s.call("cuStreamCreate", {"phStream": stream, "Flags": 1})
    rng = np.random.default_rng(3)
    base = 0x200000000000
    for i, n in enumerate(sizes):
        d = base + i * (128 << 20)
        data = (rng.integers(0, 256, n, dtype=np.uint8) if i % 2 == 0
                else (rng.standard_normal(n // 2) * 0.01).astype(np.float16).view(np.uint8)).tobytes()
        s.call("cuMemAlloc_v2", {"dptr": d, "bytesize": n})
        if async_on:
            s.call("cuMemcpyHtoDAsync_v2", {"dstDevice": d, "srcHost": 0x7F0000100000, "ByteCount": n, "hStream": stream},
                   x={"srcHost": s.blob(data)})
        else:
            s.call("cuMemcpyHtoD_v2", {"dstDevice": d, "srcHost": 0x7F0000100000, "ByteCount": n},
                   x={"srcHost": s.blob(data)})
        s.launch(f_incr, struct.pack("<Qi", d, 4), block=4, stream=stream if async_on else 0)
        s.call("cuStreamSynchronize", {"hStream": stream})
        want = np.frombuffer(data[:16], dtype=np.int32) + 1
        s.call("cuMemcpyDtoH_v2", {"dstHost": 0x7F0000200000, "srcDevice": d, "ByteCount": 16},
               x={"dstHost": s.blob(want.astype(np.int32).tobytes())})
        s.call("cuMemcpyDtoH_v2", {"dstHost": 0x7F0000300000, "srcDevice": d + 16, "ByteCount": n - 16},
               x={"dstHost": s.blob(data[16:])})
    s.w.write({"k": "end", "exit": 0, "signal": None, "partial": False})
    s.close()


@pytest.mark.parametrize("async_on", [False, True])
def test_many_staged_copies_fill_and_reuse_the_slots(double, tmp_path, async_on):
    """More data than the slot pool holds, sync or async, some chunks compressed: every byte
    lands (the D2H of each buffer verifies) and no payload is read whole."""
    snap = tmp_path / "copies.cusnap"
    sizes = [(20 << 20) + 4096, 9 << 20, (33 << 20) + 12, 17 << 20]
    _copies_session(snap, sizes, async_on)
    env = dict(double["env"], CUDASNAP_PREFETCH="1", CUDASNAP_STAGE_THREADS="3")
    env.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    code = _COUNTING.replace("staging.Stager.copy_sync", "staging.Stager.copy_async" if async_on else
                             "staging.Stager.copy_sync")
    cp = subprocess.run([sys.executable, "-c", code, "replay", str(snap), "--json"], env=env,
                        capture_output=True, text=True, timeout=180)
    assert cp.stdout.startswith("{"), cp.stderr[-2000:]
    r = json.loads(cp.stdout)
    assert r["exit_code"] == 0 and r["d2h_verified"] == 2 * len(sizes) and not r["mismatches"], (r["errors"], cp.stderr)
    assert f"STAGED {len(sizes)}" in cp.stderr, cp.stderr


def test_a_corrupt_chunk_fails_the_staged_copy_clearly(double, tmp_path):
    snap = tmp_path / "big.cusnap"
    incr_session(snap, launches=3, h2d_bytes=(24 << 20) + 4096)
    with SnapshotReader(snap) as r:
        bid = max(r.blob_ids(), key=r.blob_size)
        _size, cids = r.blob_chunk_ids(bid)
        off = r._chunks[cids[2]]
    raw = bytearray(snap.read_bytes())
    raw[off + 32 + 5000] ^= 0x55
    snap.write_bytes(raw)
    env = dict(double["env"], CUDASNAP_PREFETCH="1")
    env.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snap), "--json"], env=env,
                        capture_output=True, text=True, timeout=120)
    # the command checks every frame first: refused before any work, naming the frame
    assert cp.returncode == 2 and f"offset {off}" in cp.stderr and not cp.stdout.strip(), cp.stderr[-2000:]
    # the replayer itself (damage it meets while staging) still names the copy
    code = ("import json, sys\nfrom cudasnap.replay.engine import Replayer\nfrom cudasnap.replay.options import "
            "ReplayOptions\nprint(json.dumps(Replayer(sys.argv[1], ReplayOptions(quiet=True)).run().to_dict(), "
            "default=str))")
    cp = subprocess.run([sys.executable, "-c", code, str(snap)], env=env, capture_output=True, text=True, timeout=120)
    r = json.loads(cp.stdout.strip().splitlines()[-1])
    assert r["exit_code"] == 2, cp.stderr[-2000:]
    assert any("cuMemcpyHtoD" in e and "unreadable" in e and "checksum" in e for e in r["errors"]), r["errors"]


class _FakeCU:
    def __init__(self):
        self.query = 0
        self.registered = []

    def cuStreamQuery(self, s):
        return (self.query,)

    def cuMemHostRegister(self, addr, n, flags):
        self.registered.append(addr)
        return (0,)

    def __getattr__(self, name):          # destroy calls and the like
        return lambda *a: (0,)


class _FakeRP:
    def __init__(self):
        self.cu = _FakeCU()
        self.made = 0
        self.notes = []

    def raw(self, name, *args):
        if name == "cuCtxGetCurrent":
            return 0x1234                   # the same handle value before and after
        self.made += 1
        return self.made

    def note(self, msg):
        self.notes.append(msg)


def test_a_destroyed_context_gets_a_new_stager_and_slots_pinned_again(snap):
    from cudasnap.replay.staging import _stager
    path, ids = snap
    pipe = BlobPipeline(str(path), [ids["rand"]], nbytes=2 * CHUNK_SIZE, threads=1)
    try:
        rp = _FakeRP()
        st = _stager(rp, pipe)
        assert _stager(rp, pipe) is st                       # stream still valid: the same one
        slot = pipe.slots[0]         # the reader may hold every free slot already: take one directly
        pipe.pin(slot, rp)
        st.pending.append(slot)
        rp.cu.query = 201                                    # CUDA_ERROR_INVALID_CONTEXT: it was destroyed
        st2 = _stager(rp, pipe)
        assert st2 is not st and not st.pending and not any(pipe._pinned)
        rp.cu.query = 0
        pipe.pin(slot, rp)
        assert rp.cu.registered == [slot.addr, slot.addr] and not rp.notes
    finally:
        pipe.stop()
