"""What adding a Driver API function costs: one overlay entry, nothing else.

A copy of the source tree gets two functions no driver has, declared in shim/overlay.py's
EXTRA_FUNCTIONS as a driver newer than the headers would need: a stream-ordered call made of
values and handles (class plain_args) and a device query (replay class query, by the rules
already there). The description is regenerated, the copy installed, and the test double built
from it (its body for each comes from the generated table). A program calls both, directly and
through cuGetProcAddress; capture, dump, replay and export then handle them, and the copy
differs from the tree only in the overlay and the generated description."""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("make") is None,
                                reason="needs gcc and make")

OVERLAY_ADDITION = '''
EXTRA_FUNCTIONS["cuStreamSetSchedulingHint"] = (
    13010, "CUresult cuStreamSetSchedulingHint(CUstream hStream, unsigned int hint);")
EXTRA_FUNCTIONS["cuDeviceGetSchedulingHintCount"] = (
    13010, "CUresult cuDeviceGetSchedulingHintCount(int *count, CUdevice dev);")
'''

PROGRAM = r'''
#include "common.h"
CUresult cuStreamSetSchedulingHint(CUstream hStream, unsigned int hint);
CUresult cuDeviceGetSchedulingHintCount(int *count, CUdevice dev);
typedef CUresult (*hint_fn)(CUstream, unsigned int);

int main(void) {
    enum { N = 256 };
    static unsigned h[N];
    CUdevice dev; CUcontext ctx; CUstream s; CUdeviceptr d; int count = -1;
    void *pfn = NULL;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuCtxCreate(&ctx, NULL, 0, dev));
    CK(cuStreamCreate(&s, 0));
    CK(cuDeviceGetSchedulingHintCount(&count, dev));
    CK(cuStreamSetSchedulingHint(s, 7));
    CK(cuGetProcAddress("cuStreamSetSchedulingHint", &pfn, 13010, 0, NULL));
    CK(((hint_fn)pfn)(s, 9));
    CK(cuMemAlloc(&d, sizeof h));
    CK(cuMemsetD32Async(d, 0x2a, N, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(h, d, sizeof h));
    CK(cuMemFree(d));
    CK(cuStreamDestroy(s));
    CK(cuCtxDestroy(ctx));
    printf("COUNT %d FIRST %u\n", count, h[0]);
    return 0;
}
'''


def _tree_files(root: Path):
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-co", "--exclude-standard"],
                         capture_output=True, text=True, check=True).stdout.split()
    return [f for f in out if (root / f).is_file()]


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _headers():
    spec = importlib.util.spec_from_file_location("_cudasnap_gen_api_cc", ROOT / "shim" / "gen_api.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    include = gen.cached_include()
    if include is None:
        include = gen.fetch_headers()       # pip downloads the header wheels (CI has the network)
    return include


def test_a_new_function_of_a_common_class_needs_only_its_overlay_entry(tmp_path):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the source tree's git checkout")
    pytest.importorskip("pycparser")
    src = tmp_path / "src"
    files = _tree_files(ROOT)
    for f in files:
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f)
    before = {f: _digest(src / f) for f in files}

    # 1. the one hand-written change: the overlay entry
    with open(src / "shim" / "overlay.py", "a") as fh:
        fh.write(OVERLAY_ADDITION)
    # 2. generated: the description, the installed package, the double
    r = subprocess.run([sys.executable, str(src / "shim" / "gen_api.py"), "--include", str(_headers()),
                        "--report", str(tmp_path / "report.txt")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--target", str(site), str(src)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([sys.executable, str(src / "tests" / "double" / "build.py"), str(tmp_path / "double")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    libdir = tmp_path / "double" / "lib"

    changed = sorted(f for f in files if _digest(src / f) != before[f])
    assert changed == ["shim/api_description.json", "shim/overlay.py"], changed

    prog_c = tmp_path / "hint.c"
    prog_c.write_text(PROGRAM)
    prog = tmp_path / "hint"
    r = subprocess.run(["gcc", "-O1", "-std=gnu11", f"-I{src / 'tests' / 'double'}",
                        f"-I{src / 'tests' / 'double' / 'progs'}", "-o", str(prog), str(prog_c),
                        f"-L{libdir}", "-lcuda", "-ldl", "-lpthread"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr

    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = f"{libdir}{os.pathsep}{env.get('LD_LIBRARY_PATH', '')}"
    env["PYTHONPATH"] = str(site)
    log = tmp_path / "calls.log"
    env["CUDA_DOUBLE_CALL_LOG"] = str(log)

    def cudasnap(*args, **kw):
        return subprocess.run([sys.executable, "-m", "cudasnap", *args], env=env, capture_output=True,
                              text=True, timeout=180, cwd=tmp_path, **kw)

    native = subprocess.run([str(prog)], env=env, capture_output=True, text=True, timeout=60)
    assert native.returncode == 0 and "COUNT 0 FIRST 42" in native.stdout, native.stdout + native.stderr
    log.unlink()

    # capture: the program's output and exit code unchanged, both calls recorded
    snap = tmp_path / "hint.cusnap"
    cap = cudasnap("capture", "-o", str(snap), "--", str(prog))
    assert cap.returncode == 0, cap.stderr
    assert native.stdout in cap.stdout
    log.unlink()

    # dump: read from the description alone
    dump = cudasnap("dump", str(snap))
    assert dump.returncode == 0, dump.stderr
    hints = [ln for ln in dump.stdout.splitlines() if "cuStreamSetSchedulingHint(" in ln]
    assert len(hints) == 2 and "hint=7" in hints[0] and "hint=9" in hints[1], hints
    assert "cuDeviceGetSchedulingHintCount(" in dump.stdout
    assert "cuGetProcAddress" in dump.stdout and "cuStreamSetSchedulingHint}" in dump.stdout

    # replay: the stream-ordered call replayed by class on the live stream, the query skipped
    rep = cudasnap("replay", str(snap), "--json")
    assert rep.returncode == 0, rep.stdout + rep.stderr
    lines = log.read_text().splitlines()
    replayed = [ln for ln in lines if ln.startswith("cuStreamSetSchedulingHint")]
    assert [ln.split()[-1] for ln in replayed] == ["0x7", "0x9"], lines
    assert replayed[0].split()[1] not in ("0x0",), replayed        # a live stream, not NULL
    assert not [ln for ln in lines if ln.startswith("cuDeviceGetSchedulingHintCount")], lines
    log.unlink()

    # export: a standalone program that makes the same calls, declaring what cuda.h lacks
    out = tmp_path / "exported"
    ex = cudasnap("export", str(snap), "-o", str(out))
    assert ex.returncode == 0, ex.stdout + ex.stderr
    text = (out / "replay.c").read_text()
    assert "CUresult cuStreamSetSchedulingHint(CUstream hStream, unsigned int hint);" in text
    mk = subprocess.run(["make", "-s", "-C", str(out), "CC=gcc",
                         f"CFLAGS=-O1 -I{src / 'tests' / 'double' / 'include'}", f"LDFLAGS=-L{libdir}",
                         "CUDA_HOME=/nonexistent"], capture_output=True, text=True, timeout=300)
    assert mk.returncode == 0, mk.stdout + mk.stderr
    run = subprocess.run([str(out / "replay")], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert [ln.split()[-1] for ln in log.read_text().splitlines()
            if ln.startswith("cuStreamSetSchedulingHint")] == ["0x7", "0x9"]

    # the api listing knows both, from the description
    api = cudasnap("api", "--json")
    assert api.returncode == 0, api.stderr
    assert "cuStreamSetSchedulingHint" in api.stdout and "cuDeviceGetSchedulingHintCount" in api.stdout
