"""What adding a Driver API function costs: one overlay entry, nothing else.

A copy of the source tree gets two functions no driver has, declared in shim/overlay.py's
EXTRA_FUNCTIONS as a driver newer than the headers would need: a stream-ordered call made of
values and handles (class plain_args) and a device query (replay class query, by the rules
already there). The description is regenerated, the copy installed, and the test double built
from it (its body for each comes from the generated table). A program calls both, directly and
through cuGetProcAddress; capture, dump, replay and export then handle them, and the copy
differs from the tree only in the overlay and the generated description.

A function with semantics of its own (test_a_function_of_its_own...) is one overrides entry in
the overlay naming its hooks, its replay handler and its export method: three hand-edited files;
capture, dump, replay, export and the simulator then handle it."""
from __future__ import annotations

import hashlib
import importlib.util
import json
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


def _copy_of_the_tree(tmp_path):
    """The source tree's tracked files copied under tmp_path/src, with each file's digest, so a
    test can count which files a change edited by hand."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the source tree's git checkout")
    pytest.importorskip("pycparser")
    src = tmp_path / "src"
    files = _tree_files(ROOT)
    for f in files:
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f)
    return src, files, {f: _digest(src / f) for f in files}


def _generate_install_build(src, tmp_path):
    """What follows a hand-written change, none of it by hand: the description regenerated, the
    package installed into tmp_path/site, the test double built. Returns (site, the double's lib)."""
    r = subprocess.run([sys.executable, str(src / "shim" / "gen_api.py"), "--include", str(_headers()),
                        "--report", str(tmp_path / "report.txt")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--target", str(site), str(src)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([sys.executable, str(src / "tests" / "double" / "build.py"), str(tmp_path / "double"),
                        "--lib-only"], capture_output=True, text=True, timeout=600)      # no test programs: unused here
    assert r.returncode == 0, r.stderr
    return site, tmp_path / "double" / "lib"


def test_a_new_function_of_a_common_class_needs_only_its_overlay_entry(tmp_path):
    src, files, before = _copy_of_the_tree(tmp_path)

    # 1. the one hand-written change: the overlay entry
    with open(src / "shim" / "overlay.py", "a") as fh:
        fh.write(OVERLAY_ADDITION)
    # 2. generated: the description, the installed package, the double
    site, libdir = _generate_install_build(src, tmp_path)

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


# ------------------------------------------------------------------ a function of its own
# A fictitious call with semantics of its own: a scheduling hint over a window of device memory,
# with an array of hints. Its one overrides entry says what capture records of it (the array),
# names its replay handler (the window's address as this replay placed it) and its export method
# (the hints written into the program), and puts it in the simulator's class of calls that change
# nothing its model computes. Three hand-edited files: the overlay, the handler, the method.
SPECIAL_OVERLAY = '''
EXTRA_FUNCTIONS["cuStreamSetHintWindow"] = (13010, "CUresult cuStreamSetHintWindow(CUstream hStream, "
                                            "CUdeviceptr base, size_t bytes, const unsigned int *hint, "
                                            "unsigned int hintCount);")
OVERRIDES["cuStreamSetHintWindow"] = {
    "params": {"hint": {"kind": "array_in", "count_param": "hintCount"}},     # capture keeps the hints
    "replay": "stream.hint_window", "export": "e_hint_window", "classes": ["sim_noop"]}
'''

SPECIAL_HANDLER = '''

def hint_window(ctx, rec):
    """The window at the address this replay placed it, the hints as recorded."""
    a = rec["a"]
    ctx.drv(rec, rec["f"], ctx.stream(rec, a.get("hStream")), ctx.tr(a["base"]), a["bytes"], a.get("hint"),
            a["hintCount"])
'''

SPECIAL_EMITTER = '''
    def e_hint_window(self, rec) -> None:
        """The hints as a static array of the program, the window through its placement."""
        a = rec.get("a") or {}
        name = self.desc().by_name(rec["f"])["name"]
        self.prototypes[name] = ("CUresult %s(CUstream hStream, CUdeviceptr base, size_t bytes, "
                                 "const unsigned int *hint, unsigned int hintCount);" % name)
        data = ", ".join(str(b) for b in a.get("hint") or b"")
        self.emit(rec, "{ static const unsigned char hint[] __attribute__((aligned(4))) = {%s}; "
                       "CK(%s(%s, TR(%s), %s, (const unsigned int *)hint, %s)); }"
                  % (data, name, self.handle(rec, "stream", a.get("hStream")), lit(a["base"]), lit(a["bytes"]),
                     lit(a["hintCount"])))

'''

SPECIAL_PROGRAM = r'''
#include "common.h"
CUresult cuStreamSetHintWindow(CUstream hStream, CUdeviceptr base, size_t bytes, const unsigned int *hint,
                               unsigned int hintCount);

int main(void) {
    enum { N = 256 };
    static unsigned h[N];
    static const unsigned hint[3] = {0x11, 0x22, 0x33};
    CUdevice dev; CUcontext ctx; CUstream s; CUdeviceptr d;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuCtxCreate(&ctx, NULL, 0, dev));
    CK(cuStreamCreate(&s, 0));
    CK(cuMemAlloc(&d, sizeof h));
    CK(cuStreamSetHintWindow(s, d + 64, 128, hint, 3));
    CK(cuMemsetD32Async(d, 0x2a, N, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(h, d, sizeof h));
    CK(cuMemFree(d));
    CK(cuStreamDestroy(s));
    CK(cuCtxDestroy(ctx));
    printf("WINDOW %llx FIRST %u\n", (unsigned long long)(d + 64), h[0]);
    return 0;
}
'''


def test_a_function_of_its_own_is_one_overrides_entry_and_its_hooks(tmp_path):
    src, files, before = _copy_of_the_tree(tmp_path)

    # the hand-written changes: the overrides entry, the replay handler, the export method
    with open(src / "shim" / "overlay.py", "a") as fh:
        fh.write(SPECIAL_OVERLAY)
    with open(src / "replay" / "handlers" / "stream.py", "a") as fh:
        fh.write(SPECIAL_HANDLER)
    emit = src / "export" / "emit_stream.py"
    text = emit.read_text()
    anchor = "    def e_generic(self, rec) -> None:\n"
    assert text.count(anchor) == 1
    emit.write_text(text.replace(anchor, SPECIAL_EMITTER.lstrip("\n") + anchor))
    # generated: the description, the installed package, the double
    site, libdir = _generate_install_build(src, tmp_path)
    changed = sorted(f for f in files if _digest(src / f) != before[f])
    assert changed == ["export/emit_stream.py", "replay/handlers/stream.py", "shim/api_description.json",
                       "shim/overlay.py"], changed

    prog_c = tmp_path / "window.c"
    prog_c.write_text(SPECIAL_PROGRAM)
    prog = tmp_path / "window"
    r = subprocess.run(["gcc", "-O1", "-std=gnu11", f"-I{src / 'tests' / 'double'}",
                        f"-I{src / 'tests' / 'double' / 'progs'}", "-o", str(prog), str(prog_c),
                        f"-L{libdir}", "-lcuda", "-ldl", "-lpthread"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = f"{libdir}{os.pathsep}{env.get('LD_LIBRARY_PATH', '')}"
    env["PYTHONPATH"] = str(site)
    log = tmp_path / "calls.log"
    env["CUDA_DOUBLE_CALL_LOG"] = str(log)

    def cudasnap(*args):
        return subprocess.run([sys.executable, "-m", "cudasnap", *args], env=env, capture_output=True,
                              text=True, timeout=300, cwd=tmp_path)

    def calls():
        out = [ln.split() for ln in log.read_text().splitlines() if ln.startswith("cuStreamSetHintWindow ")]
        log.unlink()
        return out

    hints = "110000002200000033000000"          # the three hints, as the driver received their bytes
    native = subprocess.run([str(prog)], env=env, capture_output=True, text=True, timeout=60)
    assert native.returncode == 0 and "FIRST 42" in native.stdout, native.stdout + native.stderr
    window = "0x" + native.stdout.split("WINDOW ")[1].split()[0]
    assert [c[2:] for c in calls()] == [[window, "0x80", hints, "0x3"]]

    # capture: the program unchanged, the hints recorded with the call
    snap = tmp_path / "window.cusnap"
    cap = cudasnap("capture", "-o", str(snap), "--", str(prog))
    assert cap.returncode == 0, cap.stderr
    assert "FIRST 42" in cap.stdout
    window = "0x" + cap.stdout.split("WINDOW ")[1].split()[0]      # where capture placed it
    assert [c[2:] for c in calls()] == [[window, "0x80", hints, "0x3"]]
    dump = cudasnap("dump", str(snap), "--format", "jsonl")
    assert dump.returncode == 0, dump.stderr
    rec = next(json.loads(ln) for ln in dump.stdout.splitlines() if '"cuStreamSetHintWindow"' in ln)
    assert rec["a"]["hintCount"] == 3 and rec["a"]["bytes"] == 128, rec
    text = cudasnap("dump", str(snap))
    assert text.returncode == 0 and "cuStreamSetHintWindow(" in text.stdout, text.stderr

    # replay: its own handler, on the live stream, the window where this replay placed it
    rep = cudasnap("replay", str(snap), "--json")
    assert rep.returncode == 0, rep.stdout + rep.stderr
    got = calls()
    assert [c[3:] for c in got] == [["0x80", hints, "0x3"]] and got[0][2] == window and got[0][1] != "0x0", got

    # export: its own method writes the call into the standalone program
    out = tmp_path / "exported"
    ex = cudasnap("export", str(snap), "-o", str(out))
    assert ex.returncode == 0, ex.stdout + ex.stderr
    assert "CUresult cuStreamSetHintWindow(CUstream hStream" in (out / "replay.c").read_text()
    mk = subprocess.run(["make", "-s", "-C", str(out), "CC=gcc",
                         f"CFLAGS=-O1 -I{src / 'tests' / 'double' / 'include'}", f"LDFLAGS=-L{libdir}",
                         "CUDA_HOME=/nonexistent"], capture_output=True, text=True, timeout=300)
    assert mk.returncode == 0, mk.stdout + mk.stderr
    run = subprocess.run([str(out / "replay")], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert [c[3:] for c in calls()] == [["0x80", hints, "0x3"]]

    # the simulator: its class says the model can pass over it (no gap named before a run)
    probe = ("import sys; from cudasnap.formats import SnapshotReader; from cudasnap.replay.sim import call_gaps; "
             "print(call_gaps(SnapshotReader(sys.argv[1])))")
    gaps = subprocess.run([sys.executable, "-c", probe, str(snap)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert gaps.returncode == 0 and gaps.stdout.strip() == "[]", gaps.stdout + gaps.stderr
    if os.environ.get("CUDASNAP_GPGPUSIM"):
        sim = cudasnap("replay", str(snap), "--sim", "gpgpu-sim", "--json")
        assert sim.returncode == 0, sim.stdout[-2000:] + sim.stderr[-2000:]
        doc = json.loads(sim.stdout)
        assert doc["d2h_verified"] == 1 and doc["mismatches"] == [] and doc["calls"] == 11, doc
