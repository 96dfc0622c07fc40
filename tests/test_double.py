"""Tests of the CUDA driver TEST DOUBLE itself (tests/double): the C programs run
directly against it, its cuGetProcAddress tables, and cuda-python's
cuda.bindings.driver driving it (what cudasnap's replayer uses)."""
from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "cudasnap_tests_double_fixtures", Path(__file__).resolve().parent / "double" / "fixtures.py"
)
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)

double = pytest.fixture(scope="session")(_fixtures.built_double)

try:
    import cuda.bindings.driver  # noqa: F401  (only checks importability; the double is loaded in subprocesses)

    _HAVE_BINDINGS = True
except Exception:  # pragma: no cover - depends on the environment
    _HAVE_BINDINGS = False

needs_bindings = pytest.mark.skipif(not _HAVE_BINDINGS, reason="cuda-bindings (cuda-python) is not importable")


def run(double, name, *args, env=None, timeout=60):
    e = dict(double["env"])
    if env:
        e.update(env)
    return subprocess.run([double["progs"][name], *map(str, args)], env=e, capture_output=True, text=True, timeout=timeout)


def launches(out: str) -> int:
    return int(re.findall(r"^LAUNCHES (\d+)$", out, re.M)[-1])


def checksum(iters, n=1024):
    return n * (n - 1) / 2 + n * iters


# ------------------------------------------------------------------ programs


def test_build_outputs(double):
    lib = Path(double["lib"])
    assert lib.name == "libcuda.so.1" and lib.is_file()
    link = Path(double["libdir"]) / "libcuda.so"
    assert link.is_symlink() and os.readlink(link) == "libcuda.so.1"
    for exe in double["progs"].values():
        assert os.access(exe, os.X_OK)
    assert Path(double["module"]).read_text().startswith("CUDADOUBLE\n")


def test_build_is_cached(double, tmp_path_factory):
    before = {n: os.stat(p).st_mtime_ns for n, p in double["progs"].items()}
    before["lib"] = os.stat(double["lib"]).st_mtime_ns
    again = _fixtures._load_build_module().build(double["outdir"])
    assert again["progs"] == double["progs"]
    after = {n: os.stat(p).st_mtime_ns for n, p in double["progs"].items()}
    after["lib"] = os.stat(double["lib"]).st_mtime_ns
    assert before == after


@pytest.mark.parametrize("iters", [10, 3])
def test_direct(double, iters):
    r = run(double, "direct", iters)
    assert r.returncode == 0, r.stderr
    assert "DEVICE cudasnap test double" in r.stdout
    assert f"CHECKSUM {checksum(iters):.1f}" in r.stdout
    assert launches(r.stdout) == iters


def test_viadlsym(double):
    r = run(double, "viadlsym", 7)
    assert r.returncode == 0, r.stderr
    assert f"CHECKSUM {checksum(7):.1f}" in r.stdout
    assert launches(r.stdout) == 7


def test_viaproc(double):
    r = run(double, "viaproc", 6)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "PTSZ_OK 1" in out  # flags=2 gives the _ptsz/_ptds ABI
    assert "V2_OK 1" in out  # versioned base names give the right _vN ABI
    assert "UNKNOWN 500 1 1" in out  # CUDA_ERROR_NOT_FOUND, SYMBOL_NOT_FOUND, *pfn = NULL
    assert "TOO_OLD 500 2" in out  # VERSION_NOT_SUFFICIENT
    assert "DRIVER 13000" in out
    assert f"CHECKSUM {checksum(6):.1f}" in out
    assert launches(out) == 6


def test_threads(double):
    r = run(double, "threads", 40)
    assert r.returncode == 0, r.stderr
    for t in range(4):
        assert f"THREAD {t} COUNT 40 OK" in r.stdout
    assert launches(r.stdout) == 160


def test_child(double):
    r = run(double, "child")
    assert r.returncode == 0, r.stderr
    assert "PARENT CHECKSUM 192.0" in r.stdout
    assert "CHILD CHECKSUM 128.0" in r.stdout and "CHILD LAUNCHES 2" in r.stdout
    assert "PLAIN pid" in r.stdout
    assert "CHILD_STATUS 0 0" in r.stdout
    assert launches(r.stdout) == 3


def test_nocuda_exit_code(double):
    r = run(double, "nocuda")
    assert r.returncode == 3
    assert "hello from nocuda" in r.stdout


def test_killme_external_sigkill(double):
    p = subprocess.Popen([double["progs"]["killme"]], env=double["env"], stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert re.match(r"READY \d+$", line.strip()), line
        assert int(line.split()[1]) > 5
        p.send_signal(signal.SIGKILL)
        assert p.wait(timeout=30) == -signal.SIGKILL
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_killme_self_sigkill(double):
    r = run(double, "killme", 50)
    assert r.returncode == -signal.SIGKILL
    assert "READY" in r.stdout and launches(r.stdout) == 5


def _chase(double, env=None):
    r = run(double, "chase", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "CHASE OK" in r.stdout and launches(r.stdout) == 1
    rows = re.findall(r"^BUF (\d+) size (\d+) ptr (0x[0-9a-f]+) val (0x[0-9a-f]+)$", r.stdout, re.M)
    assert len(rows) == 8
    return [(int(s), int(p, 16), int(v, 16)) for _, s, p, v in rows]


def test_chase_default_arena(double):
    rows = _chase(double)
    ptrs = [p for _, p, _ in rows]
    assert len(set(ptrs)) == len(ptrs)
    assert all(0x200000000000 <= p < 0x210000000000 for p in ptrs)
    for size, p, _ in rows:
        if size >= 2 << 20:
            assert p % (2 << 20) == 0
    assert _chase(double) == rows  # deterministic layout


def test_chase_alloc_base_env(double):
    a = _chase(double)
    b = _chase(double, env={"CUDA_DOUBLE_ALLOC_BASE": "0x310000000000"})
    assert all(0x310000000000 <= p < 0x320000000000 for _, p, _ in b)
    assert [v for *_, v in a] == [v for *_, v in b]  # same data, different addresses
    assert [p - 0x200000000000 for _, p, _ in a] == [p - 0x310000000000 for _, p, _ in b]


def test_launch_forms(double):
    r = run(double, "launch_forms")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FORMS OK" in r.stdout
    assert "P 13.0 Y 27.0" in r.stdout
    assert re.findall(r"^PARAM (\d+) (\d+) (\d+)$", r.stdout, re.M) == [
        ("0", "0", "4"), ("1", "8", "8"), ("2", "16", "8"), ("3", "24", "4")]
    assert "GRAPH_LAUNCHES 2" in r.stdout
    assert launches(r.stdout) == 8


# ------------------------------------------------- ctypes, in a subprocess
# (never load the double into the pytest process: libcuda.so.1 would then be "already
# loaded" for anything else in this session that looks for the real driver)

_PROBE = """
import ctypes, json, sys
l = ctypes.CDLL(sys.argv[1])
def addr(sym):
    return ctypes.cast(getattr(l, sym), ctypes.c_void_p).value
def gpa(name, version, flags=0):
    fn = ctypes.c_void_p()
    st = ctypes.c_int(-1)
    r = l.cuGetProcAddress_v2(name.encode(), ctypes.byref(fn), ctypes.c_int(version), ctypes.c_uint64(flags),
                              ctypes.byref(st))
    return [r, fn.value, st.value]
out = {}
cases = json.loads(sys.argv[2])
out["gpa"] = [[gpa(n, v, f), addr(abi) if abi else None] for n, v, f, abi in cases]
fn = ctypes.c_void_p()
out["old_gpa"] = [l.cuGetProcAddress(b"cuInit", ctypes.byref(fn), 2000, ctypes.c_uint64(0)), fn.value == addr("cuInit")]
t = ctypes.c_void_p()
out["export_table"] = l.cuGetExportTable(ctypes.byref(t), ctypes.create_string_buffer(16))
s = ctypes.c_char_p()
out["err700"] = [l.cuGetErrorName(700, ctypes.byref(s)), s.value.decode()]
out["err0"] = [l.cuGetErrorString(0, ctypes.byref(s)), s.value.decode()]
out["err_bad"] = l.cuGetErrorName(123456, ctypes.byref(s))
print(json.dumps(out))
"""

_GPA_CASES = [
    ("cuMemAlloc", 3020, 0, "cuMemAlloc_v2"),
    ("cuMemAlloc", 13000, 0, "cuMemAlloc_v2"),
    ("cuLaunchKernel", 4000, 0, "cuLaunchKernel"),
    ("cuLaunchKernel", 7000, 2, "cuLaunchKernel_ptsz"),
    ("cuLaunchKernel", 7000, 1, "cuLaunchKernel"),
    ("cuMemcpyHtoD", 3020, 2, "cuMemcpyHtoD_v2_ptds"),
    ("cuMemcpyHtoDAsync", 3020, 2, "cuMemcpyHtoDAsync_v2_ptsz"),
    ("cuGetProcAddress", 11030, 0, "cuGetProcAddress"),
    ("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"),
    ("cuCtxCreate", 3020, 0, "cuCtxCreate_v2"),
    ("cuCtxCreate", 12050, 0, "cuCtxCreate_v4"),
    ("cuEventElapsedTime", 2000, 0, "cuEventElapsedTime"),
    ("cuEventElapsedTime", 12080, 0, "cuEventElapsedTime_v2"),
    ("cuStreamBeginCapture", 10010, 2, "cuStreamBeginCapture_v2_ptsz"),
    ("cuDeviceGetUuid", 11040, 0, "cuDeviceGetUuid_v2"),
    ("cuCtxSynchronize", 13000, 0, "cuCtxSynchronize_v2"),
    ("cuStreamCreate", 2000, 2, "cuStreamCreate"),  # no _ptsz variant: the default entry
]
_GPA_ERRORS = [
    ("cuNoSuchThing", 13000, 0, None, 1),
    ("cuMemAlloc_v2", 13000, 0, None, 1),  # ABI names are not base names
    ("cuLibraryLoadData", 11080, 0, None, 2),  # VERSION_NOT_SUFFICIENT
]


@pytest.fixture(scope="module")
def probe(double):
    import json

    cases = [list(c) for c in _GPA_CASES] + [list(c[:4]) for c in _GPA_ERRORS]
    r = subprocess.run([sys.executable, "-c", _PROBE, double["lib"], json.dumps(cases)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("i", range(len(_GPA_CASES)), ids=[f"{c[0]}@{c[1]}/f{c[2]}" for c in _GPA_CASES])
def test_get_proc_address_versions(probe, i):
    (r, fn, status), want = probe["gpa"][i]
    assert (r, status) == (0, 0)
    assert fn == want, _GPA_CASES[i]


def test_get_proc_address_errors(probe):
    for k, case in enumerate(_GPA_ERRORS):
        (r, fn, status), _ = probe["gpa"][len(_GPA_CASES) + k]
        assert (r, fn, status) == (500, None, case[4]), case
    assert probe["old_gpa"] == [0, True]
    assert probe["export_table"] == 801


def test_error_names(probe):
    assert probe["err700"] == [0, "CUDA_ERROR_ILLEGAL_ADDRESS"]
    assert probe["err0"] == [0, "no error"]
    assert probe["err_bad"] == 1


def test_not_initialized_then_init(double):
    # fresh process: calls before cuInit fail like the real driver
    code = textwrap.dedent(f"""
        import ctypes
        l = ctypes.CDLL({double['lib']!r})
        n = ctypes.c_int()
        v = ctypes.c_int()
        print(l.cuDeviceGetCount(ctypes.byref(n)), l.cuDriverGetVersion(ctypes.byref(v)), v.value)
        print(l.cuInit(0), l.cuDeviceGetCount(ctypes.byref(n)), n.value)
        p = ctypes.c_uint64()
        print(l.cuMemAlloc_v2(ctypes.byref(p), 64))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:3] == ["3 0 13000", "0 0 1", "201"]


# ------------------------------------------------------- cuda.bindings.driver

_BINDINGS_PRELUDE = """
import ctypes, sys
from cuda.bindings import driver as d
def ck(r):
    assert r[0] == d.CUresult.CUDA_SUCCESS, r
    return r[1] if len(r) == 2 else (r[1:] if len(r) > 2 else None)
ck(d.cuInit(0))
dev = ck(d.cuDeviceGet(0))
"""


def run_bindings(double, body, env=None):
    e = dict(double["env"])
    e.update(env or {})
    code = _BINDINGS_PRELUDE + textwrap.dedent(body)
    r = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@needs_bindings
def test_bindings_add_one(double):
    out = run_bindings(double, """
        name = ck(d.cuDeviceGetName(64, dev))
        print("NAME", name.split(b"\\0")[0].decode())
        major = ck(d.cuDeviceGetAttribute(d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
        print("CC", major)
        ctx = ck(d.cuCtxCreate(None, 0, dev))
        n = 1000
        host = (ctypes.c_float * n)(*range(n))
        p = ck(d.cuMemAlloc(n * 4))
        ck(d.cuMemcpyHtoD(p, host, n * 4))
        mod = ck(d.cuModuleLoadData(b"CUDADOUBLE\\nkernel add_one\\n\\0"))
        f = ck(d.cuModuleGetFunction(mod, b"add_one"))
        print("PARAMS", ck(d.cuFuncGetParamInfo(f, 0)), ck(d.cuFuncGetParamInfo(f, 1)),
              d.cuFuncGetParamInfo(f, 2)[0] == d.CUresult.CUDA_ERROR_INVALID_VALUE)
        for _ in range(3):
            ck(d.cuLaunchKernel(f, 4, 1, 1, 256, 1, 1, 0, 0, ((p, n), (None, ctypes.c_int)), 0))
        ck(d.cuCtxSynchronize())
        out = (ctypes.c_float * n)()
        ck(d.cuMemcpyDtoH(out, p, n * 4))
        print("OK", all(out[i] == i + 3 for i in range(n)))
        ck(d.cuMemFree(p))
        ck(d.cuModuleUnload(mod))
        ck(d.cuCtxDestroy(ctx))
    """)
    assert "NAME cudasnap test double" in out
    assert "CC 9" in out
    assert "PARAMS (0, 8) (8, 4) True" in out
    assert "OK True" in out


@needs_bindings
def test_bindings_per_thread_default_stream(double):
    out = run_bindings(double, """
        ctx = ck(d.cuDevicePrimaryCtxRetain(dev))
        ck(d.cuCtxSetCurrent(ctx))
        p = ck(d.cuMemAlloc(64))
        ck(d.cuMemsetD32(p, 41, 16))
        lib = ck(d.cuLibraryLoadData(b"CUDADOUBLE\\nkernel incr\\n\\0", None, None, 0, None, None, 0))
        k = ck(d.cuLibraryGetKernel(lib, b"incr"))
        f = ck(d.cuKernelGetFunction(k))
        ck(d.cuLaunchKernel(f, 1, 1, 1, 16, 1, 1, 0, d.CU_STREAM_PER_THREAD, ((p, 16), (None, ctypes.c_int)), 0))
        ck(d.cuStreamSynchronize(d.CU_STREAM_PER_THREAD))
        out = (ctypes.c_int * 16)()
        ck(d.cuMemcpyDtoH(out, p, 64))
        print("VALS", set(out))
    """, env={"CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM": "1"})
    assert "VALS {42}" in out


@needs_bindings
def test_bindings_vmm_at_requested_address(double):
    out = run_bindings(double, """
        ctx = ck(d.cuCtxCreate(None, 0, dev))
        prop = d.CUmemAllocationProp()
        prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = 0
        gran = ck(d.cuMemGetAllocationGranularity(prop, d.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM))
        print("GRAN", gran)
        want = 0x3a0000000000
        size = 2 * gran
        va = ck(d.cuMemAddressReserve(size, 0, want, 0))
        print("EXACT", int(va) == want)
        other = ck(d.cuMemAddressReserve(size, 0, want, 0))   # taken: placed elsewhere
        print("ELSEWHERE", int(other) != want)
        h = ck(d.cuMemCreate(size, prop, 0))
        ck(d.cuMemMap(va, size, 0, h, 0))
        acc = d.CUmemAccessDesc()
        acc.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        acc.location.id = 0
        acc.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        ck(d.cuMemSetAccess(va, size, [acc], 1))
        mod = ck(d.cuModuleLoadData(b"CUDADOUBLE\\nkernel fill\\n\\0"))
        f = ck(d.cuModuleGetFunction(mod, b"fill"))
        n = size // 4
        ck(d.cuLaunchKernel(f, n // 256, 1, 1, 256, 1, 1, 0, 0,
                            ((va, 0xABCD1234, n), (None, ctypes.c_uint, ctypes.c_int)), 0))
        out = (ctypes.c_uint * n)()
        ck(d.cuMemcpyDtoH(out, va, size))
        print("FILLED", out[0] == 0xABCD1234 and out[n - 1] == 0xABCD1234)
        print("DIRECT", ctypes.c_uint.from_address(want + 4 * 7).value == 0xABCD1234)
        ck(d.cuMemUnmap(va, size))
        ck(d.cuMemRelease(h))
        ck(d.cuMemAddressFree(va, size))
        ck(d.cuMemAddressFree(other, size))
        va2 = ck(d.cuMemAddressReserve(size, 0, want, 0))     # free again: exact again
        print("AGAIN", int(va2) == want)
    """)
    assert "GRAN 2097152" in out
    for key in ("EXACT", "ELSEWHERE", "FILLED", "DIRECT", "AGAIN"):
        assert f"{key} True" in out, out


@needs_bindings
def test_bindings_alloc_base_env(double):
    body = """
        ctx = ck(d.cuCtxCreate(None, 0, dev))
        print("PTR", hex(int(ck(d.cuMemAlloc(1 << 20)))))
    """
    a = run_bindings(double, body)
    b = run_bindings(double, body, env={"CUDA_DOUBLE_ALLOC_BASE": "0x350000000000"})
    assert "PTR 0x200000000000" in a
    assert "PTR 0x350000000000" in b


def test_the_procaddress_table_is_generated_from_the_description():
    """The double's cuGetProcAddress rows come from the API description (build.py writes
    double_proc_table.h): every function the double defines is found under its base name at the
    version the description gives, and double_proc.c holds no hand-written row."""
    import json as _json
    import re as _re
    from double import build as B
    text = B.proc_table()
    desc = _json.loads(B.DESCRIPTION.read_text())
    defined = set()
    for s in B.LIB_SOURCES:
        defined |= set(_re.findall(r"^API\s+CUresult\s+(cu\w+)\s*\(", (B.HERE / s).read_text(), _re.M))
    rows = _re.findall(r'[ES]\("(\w+)", (\d+), (\w+)', text)
    assert {abi for _b, _v, abi in rows} == {abi for v in desc["versions"].values() for _ver, abi in v["abi"]
                                           if abi in defined}
    for base, ver, abi in rows:
        assert [int(ver), abi] in desc["versions"][base]["abi"]
    proc = (B.HERE / "double_proc.c").read_text()
    assert '#include "double_proc_table.h"' in proc and not _re.search(r'^\s*[ES]\("cu', proc, _re.M)
