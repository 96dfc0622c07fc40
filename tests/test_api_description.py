"""The committed CUDA Driver API description (shim/api_description.json). No GPU, no network
(the determinism test uses the cached header or downloads it, and skips if neither works)."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIM = ROOT / "shim"
JSON_PATH = SHIM / "api_description.json"

KINDS = {"val", "out", "in_struct", "inout_struct", "out_struct", "str", "blob_in", "blob_out",
         "array_in", "array_out", "opaque"}
STATUSES = {"replay", "record", "refused"}
# Structs passed by value in CUDA 13.0 cuda.h (x86-64: CUmemLocation fits one integer
# register; the 64-byte IPC handles go on the stack). The C wrappers must declare them by type.
BYVAL_EXPECTED = {
    ("cuIpcOpenEventHandle", "handle", "CUipcEventHandle", 64),
    ("cuIpcOpenMemHandle", "handle", "CUipcMemHandle", 64),
    ("cuIpcOpenMemHandle_v2", "handle", "CUipcMemHandle", 64),
    ("cuMemAdvise_v2", "location", "CUmemLocation", 8),
    ("cuMemPrefetchAsync_v2", "location", "CUmemLocation", 8),
    ("cuMemPrefetchAsync_v2_ptsz", "location", "CUmemLocation", 8),
    # cudaEGL.h: the 64-byte frame descriptor goes on the stack
    ("cuEGLStreamProducerPresentFrame", "eglframe", "CUeglFrame", 64),
}
FLOAT_EXPECTED = {
    ("cuParamSetf", "value"), ("cuTexRefSetMipmapLevelBias", "bias"),
    ("cuTexRefSetMipmapLevelClamp", "minMipmapLevelClamp"), ("cuTexRefSetMipmapLevelClamp", "maxMipmapLevelClamp"),
}


def _description_module():
    try:
        from cudasnap.shim import description  # installed package

        return description
    except ImportError:  # source tree without the package installed
        spec = importlib.util.spec_from_file_location("_cudasnap_description", SHIM / "description.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod


@pytest.fixture(scope="module")
def desc():
    return _description_module().load_path(JSON_PATH)


@pytest.fixture(scope="module")
def doc():
    return json.loads(JSON_PATH.read_text())


def fn(desc, name):
    f = desc.by_name(name)
    assert f is not None, name
    return f


def param(f, name):
    return next(p for p in f["params"] if p["name"] == name)


# --------------------------------------------------------------------------- structure


def test_header(doc):
    assert doc["schema"] == 1
    assert doc["cuda_version"] == 13000
    assert "13.0.96" in doc["source"]
    content = {"functions": doc["functions"], "types": doc["types"]}
    digest = hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert doc["digest"] == digest


# Entry points declared outside cuda.h (cudaGL.h, cudaEGL.h, cudaVDPAU.h, cudaProfiler.h) that
# real programs ask cuGetProcAddress for, with the ABI variants those headers declare.
INTEROP_NAMES = [
    "cuGLCtxCreate", "cuGLCtxCreate_v2", "cuGLInit", "cuGLGetDevices", "cuGLGetDevices_v2",
    "cuGLRegisterBufferObject", "cuGLMapBufferObject", "cuGLMapBufferObject_v2", "cuGLMapBufferObject_v2_ptds",
    "cuGLMapBufferObjectAsync", "cuGLMapBufferObjectAsync_v2", "cuGLMapBufferObjectAsync_v2_ptsz",
    "cuGLUnmapBufferObject", "cuGLUnmapBufferObjectAsync", "cuGLUnregisterBufferObject",
    "cuGLSetBufferObjectMapFlags", "cuGraphicsGLRegisterImage", "cuGraphicsGLRegisterBuffer",
    "cuGraphicsEGLRegisterImage", "cuEGLStreamConsumerConnect", "cuEGLStreamConsumerDisconnect",
    "cuEGLStreamConsumerAcquireFrame", "cuEGLStreamConsumerReleaseFrame", "cuEGLStreamProducerConnect",
    "cuEGLStreamProducerDisconnect", "cuEGLStreamProducerPresentFrame", "cuEGLStreamProducerReturnFrame",
    "cuGraphicsResourceGetMappedEglFrame", "cuEGLStreamConsumerConnectWithFlags", "cuEventCreateFromEGLSync",
    "cuVDPAUGetDevice", "cuVDPAUCtxCreate", "cuVDPAUCtxCreate_v2", "cuGraphicsVDPAURegisterVideoSurface",
    "cuGraphicsVDPAURegisterOutputSurface",
]
PROFILER_NAMES = ["cuProfilerInitialize", "cuProfilerStart", "cuProfilerStop"]
# 634 from cuda.h; 35 + 3 from the interop and profiler headers
FUNCTION_COUNT = 672


def test_coverage_and_ids(desc):
    names = [f["name"] for f in desc.functions]
    assert len(names) == FUNCTION_COUNT
    assert names == sorted(names)
    assert len(set(names)) == len(names)
    for i, f in enumerate(desc.functions):
        assert f["id"] == i
        assert desc.by_id(i) is f


def test_every_function_well_formed(desc):
    for f in desc.functions:
        assert f["status"] in STATUSES, f["name"]
        if f["status"] == "refused":
            assert f["reason"], f["name"]
        if f["ret"] != "CUresult":
            assert f["status"] == "refused"
        assert f["replay"] == (f["family"] if f["status"] == "replay" else None)
        assert f["ptds"] == f["name"].endswith(("_ptds", "_ptsz"))
        names = {p["name"] for p in f["params"]}
        for p in f["params"]:
            assert p["kind"] in KINDS, (f["name"], p)
            assert isinstance(p["size"], int) and p["size"] > 0
            if p.get("byval_struct"):
                continue
            assert p["size"] <= 8, (f["name"], p)
            if p["kind"] in ("blob_in", "blob_out"):
                assert p["len_param"] in names
            if p["kind"] in ("array_in", "array_out"):
                assert p["count_param"] is None or p["count_param"] in names
                assert p["elem_size"] >= 1
            if p["kind"] in ("out", "in_struct", "out_struct", "inout_struct"):
                assert p["pointee_size"] >= 1, (f["name"], p)


def test_param_pointee_types_are_described(desc):
    missing = set()
    for f in desc.functions:
        for p in f["params"]:
            if p["kind"] in ("in_struct", "out_struct", "inout_struct", "out") and "[" not in p["pointee"] \
                    and not p["pointee"].endswith("*") and p["pointee"] not in desc.types:
                missing.add(p["pointee"])
    assert not missing


def test_byval_and_float_params(desc):
    byval = {(f["name"], p["name"], p["ctype"], p["size"]) for f in desc.functions for p in f["params"]
             if p.get("byval_struct")}
    assert byval == BYVAL_EXPECTED
    floats = {(f["name"], p["name"]) for f in desc.functions for p in f["params"] if p.get("float")}
    assert floats == FLOAT_EXPECTED


# --------------------------------------------------------------------------- known functions


def test_mem_alloc(desc):
    f = fn(desc, "cuMemAlloc_v2")
    assert f["base"] == "cuMemAlloc" and f["family"] == "memory" and f["status"] == "replay"
    d = param(f, "dptr")
    assert (d["kind"], d["size"], d["pointee"], d["pointee_size"]) == ("out", 8, "CUdeviceptr", 8)
    assert param(f, "bytesize")["kind"] == "val"
    legacy = fn(desc, "cuMemAlloc")
    assert param(legacy, "dptr")["pointee_size"] == 4


def test_launch_kernel(desc):
    for name in ("cuLaunchKernel", "cuLaunchKernel_ptsz"):
        f = fn(desc, name)
        assert f["capture"] == "launch" and f["family"] == "launch" and f["status"] == "replay"
        assert [p["name"] for p in f["params"]] == [
            "f", "gridDimX", "gridDimY", "gridDimZ", "blockDimX", "blockDimY", "blockDimZ",
            "sharedMemBytes", "hStream", "kernelParams", "extra"]
        assert all(p["kind"] == "val" for p in f["params"][:9])
        assert [p["size"] for p in f["params"][:9]] == [8, 4, 4, 4, 4, 4, 4, 4, 8]
    assert fn(desc, "cuLaunchKernelEx")["capture"] == "launch"
    assert fn(desc, "cuLaunchCooperativeKernel")["capture"] == "launch"


def test_memcpy_blobs(desc):
    for name in ("cuMemcpyHtoD_v2", "cuMemcpyHtoD_v2_ptds", "cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync_v2_ptsz",
                 "cuMemcpyHtoA_v2"):
        p = param(fn(desc, name), "srcHost")
        assert (p["kind"], p["len_param"]) == ("blob_in", "ByteCount"), name
    for name in ("cuMemcpyDtoH_v2", "cuMemcpyDtoH_v2_ptds", "cuMemcpyDtoHAsync_v2", "cuMemcpyAtoH_v2"):
        p = param(fn(desc, name), "dstHost")
        assert (p["kind"], p["len_param"]) == ("blob_out", "ByteCount"), name
    assert fn(desc, "cuMemcpyDtoHAsync_v2")["capture"] == "async_d2h"
    assert fn(desc, "cuMemcpy2D_v2")["capture"] == "memcpy_struct"
    p = param(fn(desc, "cuMemcpy2D_v2"), "pCopy")
    assert (p["kind"], p["pointee_size"]) == ("in_struct", 128)


def test_special_captures(desc):
    caps = {
        "cuModuleLoadData": "module_image", "cuModuleLoadDataEx": "module_image",
        "cuModuleLoadFatBinary": "module_image", "cuLibraryLoadData": "module_image",
        "cuLinkAddData_v2": "module_image", "cuModuleLoad": "module_file",
        "cuLibraryLoadFromFile": "module_file", "cuLinkAddFile_v2": "module_file",
        "cuGetProcAddress_v2": "getproc", "cuGetExportTable": "export_table",
        "cuMemHostAlloc": "host_alloc", "cuMemAllocHost_v2": "host_alloc",
        "cuMemHostRegister_v2": "host_alloc", "cuMemAllocManaged": "host_alloc",
        "cuMemExportToShareableHandle": "share", "cuMemImportFromShareableHandle": "share",
    }
    for name, cap in caps.items():
        assert fn(desc, name)["capture"] == cap, name
    f = fn(desc, "cuGetExportTable")
    assert f["status"] == "refused" and "not recordable" in f["reason"]
    # cross-process handles, IPC events included, replay within a group replay (replay/group.py)
    assert fn(desc, "cuIpcOpenMemHandle_v2")["status"] == "replay"
    assert fn(desc, "cuIpcOpenEventHandle")["status"] == "replay"


def test_arrays_and_strings(desc):
    p = param(fn(desc, "cuDeviceGetName"), "name")
    assert (p["kind"], p["count_param"], p["elem_size"]) == ("array_out", "len", 1)
    p = param(fn(desc, "cuGraphAddKernelNode_v2"), "dependencies")
    assert (p["kind"], p["count_param"], p["elem_size"]) == ("array_in", "numDependencies", 8)
    p = param(fn(desc, "cuGraphGetNodes"), "nodes")
    assert (p["kind"], p["count_param"], p["count_is_ptr"]) == ("array_out", "numNodes", True)
    assert param(fn(desc, "cuModuleGetFunction"), "name")["kind"] == "str"
    p = param(fn(desc, "cuDeviceGetUuid_v2"), "uuid")
    assert (p["kind"], p["pointee_size"]) == ("out_struct", 16)


def test_ptds_variants_present(desc):
    for name in ("cuMemcpyHtoDAsync_v2_ptsz", "cuLaunchKernel_ptsz", "cuMemcpy_ptds", "cuMemcpyHtoD_v2_ptds",
                 "cuStreamSynchronize_ptsz", "cuGraphLaunch_ptsz", "cuMemsetD8_v2_ptds"):
        f = fn(desc, name)
        assert f["ptds"] is True
    assert sum(f["ptds"] for f in desc.functions) >= 90


def test_interop_and_profiler_headers(desc):
    for name in INTEROP_NAMES:
        f = fn(desc, name)
        assert (f["family"], f["status"], f["replay"]) == ("interop", "record", None), name
        assert f["reason"], name
    for name in PROFILER_NAMES:
        f = fn(desc, name)
        assert (f["family"], f["status"], f["replay"]) == ("profiler", "replay", "profiler"), name
    assert fn(desc, "cuGLMapBufferObject_v2_ptds")["ptds"] is True
    assert fn(desc, "cuGLMapBufferObjectAsync_v2_ptsz")["base"] == "cuGLMapBufferObjectAsync"
    # legacy 32-bit forms vs the _v2 ones
    p = param(fn(desc, "cuGLMapBufferObject"), "dptr")
    assert (p["kind"], p["pointee"], p["pointee_size"]) == ("out", "CUdeviceptr_v1", 4)
    p = param(fn(desc, "cuGLMapBufferObject_v2"), "dptr")
    assert (p["kind"], p["pointee"], p["pointee_size"]) == ("out", "CUdeviceptr", 8)
    assert param(fn(desc, "cuGLMapBufferObject_v2"), "size")["pointee_size"] == 8
    assert param(fn(desc, "cuGLMapBufferObject"), "size")["pointee_size"] == 4
    p = param(fn(desc, "cuGLGetDevices_v2"), "pCudaDevices")
    assert (p["kind"], p["count_param"], p["elem_size"]) == ("array_out", "cudaDeviceCount", 4)
    # stub GL / EGL / VDPAU types carry the real x86-64 sizes
    p = param(fn(desc, "cuGraphicsGLRegisterImage"), "target")
    assert (p["ctype"], p["kind"], p["size"]) == ("GLenum", "val", 4)
    assert param(fn(desc, "cuGraphicsGLRegisterBuffer"), "buffer")["size"] == 4
    assert param(fn(desc, "cuGraphicsEGLRegisterImage"), "image")["size"] == 8
    assert param(fn(desc, "cuEGLStreamProducerConnect"), "width")["size"] == 4
    assert param(fn(desc, "cuGraphicsVDPAURegisterVideoSurface"), "vdpSurface")["size"] == 4
    p = param(fn(desc, "cuVDPAUCtxCreate_v2"), "vdpGetProcAddress")
    assert (p["kind"], p["size"]) == ("val", 8)  # a function pointer passed in, not an output
    assert param(fn(desc, "cuProfilerInitialize"), "configFile")["kind"] == "str"
    t = desc.types
    assert t["GLuint"] == {"kind": "int", "signed": False, "size": 4}
    assert t["EGLImageKHR"]["size"] == 8 and t["VdpDevice"]["size"] == 4
    assert t["CUeglStreamConnection"]["kind"] == "handle"
    e = t["CUeglFrame_v1"]
    assert (e["kind"], e["size"], e["align"]) == ("struct", 64, 8)
    assert e["fields"][0] == ["frame", "CUeglFrame_v1.frame", 0, 24]
    assert e["fields"][-1][2:] == [56, 4]
    assert t["CUoutput_mode"]["values"] == {"CU_OUT_KEY_VALUE_PAIR": 0, "CU_OUT_CSV": 1}
    p = param(fn(desc, "cuGraphicsResourceGetMappedEglFrame"), "eglFrame")
    assert (p["kind"], p["pointee_size"]) == ("out_struct", 64)


def test_types(desc):
    t = desc.types
    assert t["CUcontext"] == {"kind": "handle", "size": 8, "handle": "context"}
    assert t["CUdeviceptr_v2"]["kind"] == "int" and t["CUdeviceptr_v2"]["size"] == 8
    assert t["CUdeviceptr_v2"]["signed"] is False
    assert t["CUresult"]["kind"] == "enum" and t["CUresult"]["size"] == 4
    assert t["CUresult"]["values"]["CUDA_SUCCESS"] == 0
    m = t["CUDA_MEMCPY2D_v2"]
    assert m["kind"] == "struct" and m["size"] == 128 and m["align"] == 8
    assert m["fields"][0] == ["srcXInBytes", "size_t", 0, 8]
    assert t["CUuuid"]["size"] == 16


def test_result_name(desc):
    assert desc.result_name(0) == "CUDA_SUCCESS"
    assert desc.result_name(2) == "CUDA_ERROR_OUT_OF_MEMORY"
    assert desc.result_name(999) == "CUDA_ERROR_UNKNOWN"
    assert desc.result_name(123456).startswith("CUDA_ERROR_")


# --------------------------------------------------------------------------- versions


def test_resolve(desc):
    r = desc.resolve
    assert r("cuMemAlloc", 3020, 0) == "cuMemAlloc_v2"
    assert r("cuMemAlloc", 13000, 0) == "cuMemAlloc_v2"
    assert r("cuMemAlloc", 2000, 0) == "cuMemAlloc"
    assert r("cuMemAlloc", 1000, 0) == "cuMemAlloc"  # lower than all: the lowest
    assert r("cuLaunchKernel", 13000, 2) == "cuLaunchKernel_ptsz"
    assert r("cuLaunchKernel", 13000, 0) == "cuLaunchKernel"
    assert r("cuLaunchKernel", 13000, 1) == "cuLaunchKernel"
    assert r("cuMemcpy", 12000, 2) == "cuMemcpy_ptds"
    assert r("cuMemcpyHtoDAsync", 12000, 2) == "cuMemcpyHtoDAsync_v2_ptsz"
    assert r("cuMemAlloc", 12000, 2) == "cuMemAlloc_v2"  # no per-thread variant
    assert r("cuCtxCreate", 12050, 0) == "cuCtxCreate_v4"
    assert r("cuCtxCreate", 13000, 0) == "cuCtxCreate_v4"
    assert r("cuCtxCreate", 12000, 0) == "cuCtxCreate_v3"
    assert r("cuCtxCreate", 3020, 0) == "cuCtxCreate_v2"
    assert r("cuStreamGetCaptureInfo", 12030, 2) == "cuStreamGetCaptureInfo_v3_ptsz"
    assert r("cuStreamGetCaptureInfo", 11030, 0) == "cuStreamGetCaptureInfo_v2"
    assert r("cuGetProcAddress", 12000, 0) == "cuGetProcAddress_v2"
    assert r("cuGetProcAddress", 11030, 0) == "cuGetProcAddress"
    assert r("cuGraphInstantiate", 12000, 0) == "cuGraphInstantiateWithFlags"
    assert r("cuGraphInstantiate", 11000, 0) == "cuGraphInstantiate_v2"
    assert r("cuNoSuchFunction", 13000, 0) is None
    # interop / profiler headers
    assert r("cuGLCtxCreate", 13000, 0) == "cuGLCtxCreate_v2"
    assert r("cuGLCtxCreate", 3020, 0) == "cuGLCtxCreate_v2"
    assert r("cuGLCtxCreate", 3010, 0) == "cuGLCtxCreate"
    assert r("cuGLGetDevices", 13000, 0) == "cuGLGetDevices_v2"
    assert r("cuGLGetDevices", 6000, 0) == "cuGLGetDevices"
    assert r("cuGLMapBufferObject", 13000, 0) == "cuGLMapBufferObject_v2"
    assert r("cuGLMapBufferObject", 13000, 2) == "cuGLMapBufferObject_v2_ptds"
    assert r("cuGLMapBufferObject", 2000, 0) == "cuGLMapBufferObject"
    assert r("cuGLMapBufferObjectAsync", 13000, 2) == "cuGLMapBufferObjectAsync_v2_ptsz"
    assert r("cuGLInit", 13000, 0) == "cuGLInit"
    assert r("cuVDPAUCtxCreate", 13000, 0) == "cuVDPAUCtxCreate_v2"
    assert r("cuGraphicsEGLRegisterImage", 13000, 0) == "cuGraphicsEGLRegisterImage"
    assert r("cuEGLStreamConsumerConnectWithFlags", 13000, 0) == "cuEGLStreamConsumerConnectWithFlags"
    assert r("cuProfilerStart", 13000, 0) == "cuProfilerStart"


def test_versions_table(desc):
    v = desc.versions
    assert v["cuMemAlloc"]["abi"] == [[2000, "cuMemAlloc"], [3020, "cuMemAlloc_v2"]]
    assert v["cuMemcpy"]["abi"] == [[4000, "cuMemcpy"]] and v["cuMemcpy"]["ptds"] == "cuMemcpy_ptds"
    assert v["cuMemcpy"]["ptsz"] is None
    assert v["cuGLCtxCreate"]["abi"] == [[2000, "cuGLCtxCreate"], [3020, "cuGLCtxCreate_v2"]]
    assert v["cuGLGetDevices"]["abi"] == [[4010, "cuGLGetDevices"], [6050, "cuGLGetDevices_v2"]]
    assert v["cuGLMapBufferObject"]["abi"] == [[2000, "cuGLMapBufferObject"], [3020, "cuGLMapBufferObject_v2"]]
    assert v["cuGLMapBufferObject"]["per_thread"] == [[7000, "cuGLMapBufferObject_v2_ptds"]]
    assert v["cuVDPAUCtxCreate"]["abi"] == [[3010, "cuVDPAUCtxCreate"], [3020, "cuVDPAUCtxCreate_v2"]]
    assert v["cuProfilerInitialize"]["abi"] == [[4000, "cuProfilerInitialize"]]
    assert v["cuEventCreateFromEGLSync"]["abi"] == [[9000, "cuEventCreateFromEGLSync"]]
    for base, e in v.items():
        vers = [x[0] for x in e["abi"]]
        assert vers == sorted(vers), base
        for _, sym in e["abi"] + (e.get("per_thread") or []):
            assert desc.by_name(sym) is not None, sym
    # every exported function is reachable through the table
    listed = {sym for e in v.values() for _, sym in e["abi"] + (e.get("per_thread") or [])}
    assert {f["name"] for f in desc.functions} <= listed


def test_load_packaged_or_local():
    mod = _description_module()
    d = mod.load()
    assert d is mod.load()  # cached
    assert d.by_name("cuInit") is not None


# --------------------------------------------------------------------------- generator


def _gen_module():
    spec = importlib.util.spec_from_file_location("_cudasnap_gen_api", SHIM / "gen_api.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generator_deterministic_and_committed_json_fresh(tmp_path):
    pytest.importorskip("pycparser")
    if shutil.which("gcc") is None:
        pytest.skip("gcc not available")
    gen = _gen_module()
    include = gen.cached_include()
    if include is None:
        try:
            include = gen.fetch_headers()
        except Exception as e:  # no network and no cached header
            pytest.skip(f"cuda.h not cached and not downloadable: {e}")
    outs = []
    for i in range(2):
        out = tmp_path / f"api{i}.json"
        r = subprocess.run([sys.executable, str(SHIM / "gen_api.py"), "--include", str(include), "--out", str(out),
                            "--report", str(tmp_path / f"rep{i}.txt")], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        outs.append(out.read_text())
    assert outs[0] == outs[1]
    assert outs[0] == JSON_PATH.read_text(), "shim/api_description.json is stale: rerun shim/gen_api.py"


# --------------------------------------------------------------------------- cudasnap api


def test_api_command_json():
    pytest.importorskip("typer")
    try:
        from typer.testing import CliRunner

        from cudasnap.cli import app
        import cudasnap.api_cmd  # noqa: F401
    except ImportError as e:
        pytest.skip(f"cudasnap package not importable: {e}")
    res = CliRunner().invoke(app, ["api", "--json", "--status", "refused"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["functions"] and all(r["status"] == "refused" for r in data["functions"])
    assert "cuGetExportTable" in {r["name"] for r in data["functions"]}
    res = CliRunner().invoke(app, ["api", "--json", "--status", "replay"])
    by = {r["name"]: r for r in json.loads(res.output)["functions"]}
    assert by["cuStreamCreate"]["replayed_by"] == "class" and "creates" in by["cuStreamCreate"]["classes"]
    assert by["cuLaunchKernel"]["replayed_by"] == "handler" and by["cuStreamQuery"]["replayed_by"] == "skipped"
    assert all(r["replayed_by"] in ("class", "handler", "skipped") for r in by.values())
    res = CliRunner().invoke(app, ["api"])
    assert res.exit_code == 0, res.output
    assert "recorded and replayable" in res.output and "refused" in res.output
    res = CliRunner().invoke(app, ["api", "--status", "bogus"])
    assert res.exit_code == 2


def test_schema_states_the_description_coverage():
    """formats/SCHEMA.md's coverage table is what the description and the handlers say."""
    from collections import Counter
    from cudasnap.replay import dispatch
    from cudasnap.shim.description import load
    d = load()
    c = Counter()
    for f in d.functions:
        h = dispatch.lookup(f["name"]) if f["replay_class"] != "refuse" else None
        if f["replay_class"] == "query":
            c["query"] += 1
        elif h is not None and dispatch.replayed_by(f["name"]) == "class":
            c["class"] += 1
        elif h is not None:
            c["handler"] += 1
        else:
            c["refused"] += 1
    text = (Path(__file__).resolve().parents[1] / "formats" / "SCHEMA.md").read_text()
    assert f"What replay does with each of the {len(d.functions)} functions" in text
    assert f"| skipped by class | {c['query']} |" in text
    assert f"| replayed by class | {c['class']} |" in text
    assert f"| replayed by their own handler | {c['handler']} |" in text
    assert f"| refused by name, before any driver work | {c['refused']} |" in text
