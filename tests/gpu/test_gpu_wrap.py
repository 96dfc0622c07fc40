"""The failure job on a GPU: an illegal address captured by the flight recorder and replayed
under compute-sanitizer memcheck through `replay --wrap`: the report names the kernel, the
thread and block, the address and the source line (-lineinfo), and the replay exits non-zero;
the healthy run replays under memcheck with 0 errors (bench/failure_job_gpu.sh does the same
with ncu and --preload as well)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cudasnap.formats import SnapshotReader

HERE = Path(__file__).resolve().parent
# the suite runs from a copy of tests/ (bench/gpu_suite.sh exports CUDASNAP_ROOT=<repo root>)
ROOT = Path(os.environ["CUDASNAP_ROOT"]) if os.environ.get("CUDASNAP_ROOT") else HERE.parents[1]
TOOLS = ("/usr/local/cuda/bin", "/usr/local/cuda/compute-sanitizer")


def _tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path=os.pathsep.join(TOOLS))
    if path is None:
        pytest.skip(f"{name} is not installed on this GPU machine")
    return path


def _cudasnap(*args, timeout=300):
    env = dict(os.environ)
    env["PATH"] = env.get("PATH", os.defpath) + os.pathsep + os.pathsep.join(TOOLS)
    return subprocess.run([sys.executable, "-m", "cudasnap", *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def failjob(tmp_path_factory):
    src = ROOT / "bench" / "failjob.cu"
    assert src.exists(), f"{src}: set CUDASNAP_ROOT to the repo root"
    out = tmp_path_factory.mktemp("failjob") / "failjob"
    subprocess.run([_tool("nvcc"), "-O2", "-lineinfo", "-o", str(out), str(src)], check=True, capture_output=True)
    line = next(i for i, ln in enumerate(src.read_text().splitlines(), 1) if "POKE_LINE" in ln)
    return out, line


@pytest.mark.gpu
def test_illegal_address_replayed_under_memcheck(failjob, tmp_path):
    _tool("compute-sanitizer")
    prog, line = failjob
    snap = tmp_path / "fail.cusnap"
    cp = _cudasnap("capture", "-o", snap, "--flight-recorder", "--", prog, "20", "1")
    assert cp.returncode == 1 and snap.exists(), cp.stdout + cp.stderr
    cp = _cudasnap("replay", snap, "--wrap", "compute-sanitizer --tool memcheck")
    out = cp.stdout + cp.stderr
    assert cp.returncode != 0, out
    assert "Invalid __global__ write of size 4 bytes" in out, out[-3000:]
    assert re.search(rf"at poke\(.*\)\+0x[0-9a-f]+ in {prog.name}\.cu:{line}\b", out), out[-3000:]
    assert "by thread (17,0,0) in block (3,0,0)" in out, out[-3000:]
    acc = re.search(r"(?:Access to|Address) (0x[0-9a-f]+) is out of bounds", out)
    near = re.search(r"nearest allocation at (0x[0-9a-f]+)", out)
    assert acc and near, out[-3000:]
    # placed at its recorded address, the buffer faults where the program's did: 256 GiB past it
    recorded = [r["a"]["dptr"] for r in SnapshotReader(snap).records() if r["k"] == "c" and r["f"].startswith("cuMemAlloc")]
    assert int(near[1], 16) in recorded and int(acc[1], 16) - int(near[1], 16) == 4 << 36


@pytest.mark.gpu
def test_healthy_replay_is_clean_under_memcheck(failjob, tmp_path):
    _tool("compute-sanitizer")
    prog, _line = failjob
    snap = tmp_path / "ok.cusnap"
    cp = _cudasnap("capture", "-o", snap, "--", prog, "10", "0")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    cp = _cudasnap("replay", snap, "--wrap", "compute-sanitizer --tool memcheck")
    assert cp.returncode == 0 and "ERROR SUMMARY: 0 errors" in cp.stdout + cp.stderr, cp.stdout + cp.stderr
    assert "every recorded D2H result reproduced" in cp.stdout, cp.stdout
