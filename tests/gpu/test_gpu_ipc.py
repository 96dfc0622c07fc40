"""GPU suite, processes sharing CUDA memory: torch.multiprocessing sends CUDA tensors with
legacy IPC memory and event handles (workloads/torch_ipc.py). Under capture (default placement,
so the shim answers IPC of the memory it placed) the output is the program's own; the group
manifest pairs the handles; the job replays with every D2H result verified."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cudasnap.formats.group import load
from gpuutil import HERE, record_result

pytestmark = pytest.mark.gpu
PY = sys.executable


def test_torch_multiprocessing_cuda_tensors_capture_and_replay(runner, tmp_path):
    prog = [PY, str(HERE / "workloads" / "torch_ipc.py")]
    native = subprocess.run(prog, capture_output=True, text=True, timeout=600)
    assert native.returncode == 0, native.stderr[-2000:]
    snap = tmp_path / "ipc.cusnap"
    cap, _ = runner.capture(prog, snap)
    row = {"test": "torch_ipc", "capture_rc": cap.returncode, "native": native.stdout, "captured": cap.stdout,
           "stderr": cap.stderr[-1500:]}
    try:
        assert cap.returncode == 0, cap.stderr[-3000:]
        assert sorted(cap.stdout.splitlines()) == sorted(native.stdout.splitlines())
        m = load(tmp_path / "ipc.group.json")
        kinds = sorted(ln["kind"] for ln in m["links"])
        row.update(links=kinds, unmatched=m["unmatched"], ranks=len(m["ranks"]))
        assert "ipc" in kinds and len(m["ranks"]) == 2, m
        rp = subprocess.run([PY, "-m", "cudasnap", "replay", str(tmp_path / "ipc.group.json"), "--json",
                             "--watchdog", "120"], capture_output=True, text=True, timeout=900)
        res = json.loads(rp.stdout) if rp.stdout.strip().startswith("{") else {}
        row.update(replay_rc=rp.returncode, ranks_replay=[{k: (r.get("replay") or {}).get(k) for k in
                                                          ("placed", "fell_back", "d2h_verified", "mismatches")}
                                                         for r in res.get("ranks", [])],
                   errors=[r.get("errors") for r in res.get("ranks", [])], replay_stderr=rp.stderr[-1500:])
        assert rp.returncode == 0, (rp.stdout + rp.stderr)[-3000:]
        assert all((r.get("replay") or {}).get("fell_back") == 0 for r in res["ranks"]), res
    finally:
        record_result(row)
