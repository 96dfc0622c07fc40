"""The replay engine's launch fast path (native batches of plain launches) and the streamed
H2D copy path give the same results as the per-call path, on the test-double driver."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import pytest

from cudasnap.replay.synth import Synth

MODES = ["0", "python", "1"]


def _replay(double, snap, mode, *args, extra_env=None):
    env = dict(double["env"])
    env.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    env["CUDASNAP_FASTPATH"] = mode
    env.update(extra_env or {})
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(snap), "--json", *args], env=env,
                        capture_output=True, text=True, timeout=120)
    return cp, json.loads(cp.stdout)


def incr_session(path, n=16, launches=200, bad_at=None, h2d_bytes=None, queries=True, tids=(100,)):
    """D = zeros(n) (or h2d_bytes of data); incr(D, n) `launches` times, with queries between
    launches; D2H of D expects `launches` in every element.  bad_at: that launch gets an
    illegal pointer (the double fails it at launch time)."""
    s = Synth(path)
    ctx, mod, f_incr = 0x55550000, 0x55560000, 0x55570005
    D = 0x200000000000
    s.double_prologue("incr", f_incr, [[0, 8], [8, 4]], ctx, mod)
    size = max(n * 4, h2d_bytes or 0)
    s.call("cuMemAlloc_v2", {"dptr": D, "bytesize": size})
    init = bytes(n * 4)
    if h2d_bytes:
        init = bytes(n * 4) + os.urandom(h2d_bytes - n * 4)
    s.call("cuMemcpyHtoD_v2", {"dstDevice": D, "srcHost": 0x7F0000100000, "ByteCount": len(init)},
           x={"srcHost": s.blob(init)})
    seqs = []
    for i in range(launches):
        p = struct.pack("<Qi", 0x10 if i == bad_at else D, n)
        seqs.append(s.launch(f_incr, p, block=n, r=0)["s"])
        if queries and i % 3 == 0:
            s.call("cuCtxGetCurrent", {"pctx": ctx})
    s.call("cuCtxSynchronize", {})
    s.call("cuMemcpyDtoH_v2", {"dstHost": 0x7F0000200000, "srcDevice": D, "ByteCount": n * 4},
           x={"dstHost": s.blob(struct.pack(f"<{n}i", *([launches] * n)))})
    if h2d_bytes:
        s.call("cuMemcpyDtoH_v2", {"dstHost": 0x7F0000300000, "srcDevice": D + n * 4, "ByteCount": len(init) - n * 4},
               x={"dstHost": s.blob(init[n * 4:])})
    s.call("cuMemFree_v2", {"dptr": D})
    s.w.write({"k": "end", "exit": 0, "signal": None, "partial": False})
    s.close()
    return seqs


KEYS = ("exit_code", "launches", "calls", "skipped", "d2h_verified", "d2h_bytes", "last_seq", "errors", "by_family")


@pytest.mark.parametrize("mode", MODES)
def test_fast_path_matches_the_per_call_path(double, tmp_path, mode):
    snap = tmp_path / "incr.cusnap"
    incr_session(snap, launches=1000)
    cp0, base = _replay(double, snap, "0")
    cp, got = _replay(double, snap, mode)
    assert base["exit_code"] == 0 and base["launches"] == 1000 and base["d2h_verified"] == 1, cp0.stdout
    assert {k: got.get(k) for k in KEYS} == {k: base.get(k) for k in KEYS}
    assert got["first_launch_mono"] <= got["last_launch_mono"]


@pytest.mark.parametrize("mode", MODES)
def test_failing_launch_in_a_batch_is_reported_on_its_call(double, tmp_path, mode):
    snap = tmp_path / "bad.cusnap"
    seqs = incr_session(snap, launches=50, bad_at=20)
    cp, r = _replay(double, snap, mode)
    assert r["exit_code"] == 2 and r["launches"] == 20
    assert len(r["errors"]) == 1 and r["errors"][0].startswith(f"call #{seqs[20]} cuLaunchKernel: replay returned")
    cp, r = _replay(double, snap, mode, "--continue-on-error")
    assert r["launches"] == 49 and len(r["errors"]) == 1 and r["d2h_verified"] == 1 and r["mismatches"]


def test_hooks_keep_the_per_launch_path(double, tmp_path):
    snap = tmp_path / "incr.cusnap"
    incr_session(snap, launches=30)
    hook = tmp_path / "count.py"
    out = tmp_path / "n.txt"
    hook.write_text("class H:\n    n = 0\n    def after_launch(self, ev):\n        H.n += 1\n"
                    f"    def end(self, ev):\n        open({str(out)!r}, 'w').write(str(H.n))\n")
    cp, r = _replay(double, snap, "1", "--hook", f"{hook}:H")
    assert r["exit_code"] == 0 and out.read_text() == "30"


@pytest.mark.parametrize("prefetch", ["0", "1"])
def test_big_h2d_streams_through_pinned_staging(double, tmp_path, prefetch):
    snap = tmp_path / "big.cusnap"
    incr_session(snap, launches=5, h2d_bytes=(24 << 20) + 4096)
    cp, r = _replay(double, snap, "1", extra_env={"CUDASNAP_PREFETCH": prefetch})
    assert r["exit_code"] == 0 and r["d2h_verified"] == 2 and not r["mismatches"], (r["errors"], cp.stderr)
