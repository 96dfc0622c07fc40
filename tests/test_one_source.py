"""One source of truth: call classification comes from the API description, the ABI-suffix
rule lives in one module, handler struct sizes come from the description, and the ring's wire
constants are generated from shim/ring.h."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from cudasnap.formats.abi import base_name
from cudasnap.replay import dispatch
from cudasnap.shim.description import load

ROOT = Path(__file__).resolve().parents[1]
CLASSES = {"query", "execute", "refuse", "record"}


def test_every_function_has_a_replay_class():
    for f in load().functions:
        assert f["replay_class"] in CLASSES, f["name"]
        if f["status"] == "refused" and f["replay_class"] != "query":
            assert f["replay_class"] == "refuse", f["name"]


def test_dispatch_reads_the_description():
    for f in load().functions:
        n = f["name"]
        assert dispatch.is_query(n) == (f["replay_class"] == "query"), n
        if dispatch.lookup(n) is not None:
            # a handler for a query or a recorded-only call is a description bug
            assert f["replay_class"] == "execute", n
        elif f["replay_class"] == "query":
            assert n in dispatch.REPLAY_SKIPPED
        elif f["replay_class"] == "refuse":
            assert dispatch.REPLAY_REFUSED[n] == f["reason"]
    # a name the description lacks takes its base's class; an unknown base has none
    assert dispatch.is_query("cuCtxGetDevice_v9")
    assert dispatch.replay_class("cuNoSuchCall") is None and not dispatch.is_query("cuNoSuchCall")
    # XLA asks the multicast granularity at start-up on machines with several GPUs: a query
    assert dispatch.is_query("cuMulticastGetGranularity") and not dispatch.is_query("cuMulticastCreate")


def test_capture_queries_are_replay_queries():
    qs = [f["name"] for f in load().functions if f["capture_query"]]
    assert "cuCtxGetDevice" in qs and "cuStreamIsCapturing" in qs and "cuMemAlloc_v2" not in qs
    for f in load().functions:
        if f["capture_query"]:
            assert f["replay_class"] == "query", f["name"]


def test_description_bases_agree_with_the_one_rule():
    for f in load().functions:
        assert base_name(f["name"]) == f["base"], f["name"]


def test_abi_suffix_rule_is_written_once():
    """No copy of the suffix regex outside formats/abi.py."""
    hits = []
    for p in ROOT.rglob("*.py"):
        rel = p.relative_to(ROOT).as_posix()
        if rel.startswith(("build/", "tests/", ".")) or "/." in rel:
            continue
        if re.search(r"_pt\(sz\|ds\)", p.read_text(errors="replace")):
            hits.append(rel)
    assert hits == ["formats/abi.py"]


def test_handler_struct_sizes_come_from_the_description():
    from cudasnap.replay.handlers import graph, launch
    from cudasnap.formats.layout import offsetof, packer, sizeof
    types = load().types
    assert graph.KERNEL_PARAMS_SIZE == types["CUDA_KERNEL_NODE_PARAMS"]["size"] == 72
    assert graph.NODE_PARAMS_SIZE == sizeof("CUgraphNodeParams") == 256
    assert graph.NP_UNION == offsetof("CUgraphNodeParams", "kernel") == 16
    assert launch.LAUNCH_CONFIG.format == packer("CUlaunchConfig").format
    # the layout the launch handlers relied on before it came from the description
    assert launch.LAUNCH_CONFIG.size == 56 and launch.LAUNCH_CONFIG.unpack(bytes(range(56)))[7] == \
        int.from_bytes(bytes(range(32, 40)), "little")


def test_memcpy_struct_field_groups_have_one_shape():
    """The 2D and 3D copy handler addresses src* and dst* fields relative to their group's start."""
    from cudasnap.replay.handlers import memory as M
    from cudasnap.formats.layout import offsetof
    for L in (M._L2D, M._L3D):
        fields = [("MemoryType", L.mtype), ("Host", L.host), ("Device", L.device), ("Array", L.array), ("Pitch", L.pitch)]
        if L.z is not None:
            fields += [("Z", L.z), ("Height", L.rows)]
        for f, rel in fields:
            assert offsetof(L.kind, "dst" + f) - L.dst == rel == offsetof(L.kind, "src" + f) - L.src, (L.kind, f)
    assert (M._L2D.width, M._L2D.height, M._L2D.size) == (112, 120, 128)
    assert (M._L3D.width, M._L3D.height, M._L3D.depth, M._L3D.size) == (176, 184, 192, 200)


def test_ring_constants_match_ring_h():
    r = subprocess.run([sys.executable, str(ROOT / "shim" / "gen_ring.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    from cudasnap.capture import ring as R
    assert R.REC_HDR.size == 48 and R.FIELD_HDR.size == 8 and R.MAGIC == b"CSRING1\0"
    assert (R.PRE, R.POST, R.CALL, R.NVTX) == (2, 3, 11, 14)


def test_ring_generator_sees_an_edit(tmp_path):
    """Editing ring.h without regenerating fails the check above."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("gen_ring", ROOT / "shim" / "gen_ring.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    text = (ROOT / "shim" / "ring.h").read_text()
    assert gen.render(text) == (ROOT / "capture" / "ring_constants.py").read_text()
    edited = text.replace("CS_REC_NVTX = 14,", "CS_REC_NVTX = 14,\n    CS_REC_NEW = 15,")
    assert edited != text and "REC_NEW = 15" in gen.render(edited)
    moved = text.replace("uint32_t hdr_size;", "uint64_t hdr_size;")
    assert "OFF_CAPACITY = 16" in gen.render(text) and "OFF_CAPACITY = 24" in gen.render(moved)


def test_window_class_comes_from_the_description():
    """Capture windows classify calls by the description's window_class (overlay rules), not
    by patterns of their own."""
    from cudasnap.shim.description import load
    d = load()
    want = {"cuMemAlloc_v2": "state", "cuModuleLoadData": "state", "cuLaunchKernel": "work",
            "cuMemcpyHtoD_v2": "work", "cuCtxGetDevice": "work", "cuMemFree_v2": "destroy",
            "cuMemUnmap": "unmap", "cuStreamBeginCapture_v2": "capture_begin",
            "cuStreamEndCapture": "capture_end", "cuDevicePrimaryCtxRelease_v2": "state"}
    assert {n: (d.by_name(n) or {}).get("window_class") for n in want} == want
    assert all(f.get("window_class") for f in d.functions)
    src = (ROOT / "capture" / "window.py").read_text()
    assert "Destroy|Free" not in src and "cuLaunch" not in src


# ------------------------------------------------------------------ the replay plan's op kinds
KIND_C_FILES = ("replay/executor.c", "replay/plan_walk.c")


def test_op_kinds_have_one_list():
    """formats/opkinds.py is the list: the generated header numbers it in order, and the plan's
    constants are its own."""
    from cudasnap.formats import opkinds
    from cudasnap.replay import plan
    enum = {n: int(v) for n, v in re.findall(r"^\s+OP_(\w+)\s*= (\d+),?$", opkinds.c_header(), re.M)}
    assert enum == {**{n: i for i, n in enumerate(opkinds.NAMES)}, "NKINDS": opkinds.NKINDS}
    assert opkinds.NKINDS == 23 and (opkinds.SKIP, opkinds.LAUNCH, opkinds.CTX_POP) == (0, 1, 22)
    for i, n in enumerate(opkinds.NAMES):
        assert getattr(plan, n) == i, n
    assert (plan.BATCH_MAX, plan.D2H_MAX) == (opkinds.BATCH_MAX, opkinds.D2H_MAX)
    points = re.findall(r'\{(NULL|"(\w+)"), (\d+)\},\s+/\* OP_(\w+) \*/', opkinds.c_header())
    assert [(e or None, int(v), n) for _q, e, v, n in points] == [(k[1], k[2], k[0]) for k in opkinds.KINDS]


def test_no_other_module_numbers_the_op_kinds():
    """No Python module but formats/opkinds.py assigns a kind constant."""
    from cudasnap.formats import opkinds
    import ast
    names = set(opkinds.NAMES)
    hits = []
    for p in ROOT.rglob("*.py"):
        rel = p.relative_to(ROOT).as_posix()
        if rel.startswith(("build/", "tests/", ".")) or "/." in rel or rel == "formats/opkinds.py":
            continue
        for node in ast.parse(p.read_text(errors="replace")).body:
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name) and n.id in names:
                            hits.append(f"{rel}: {n.id}")
    assert hits == []


def test_c_files_take_the_op_kinds_from_the_generated_header():
    """executor.c and plan_walk.c include opkinds.h and write no kind, kind count, entry point
    table or batch limit of their own."""
    from cudasnap.formats import opkinds
    known = set(opkinds.NAMES) | {"NKINDS", "BATCH_MAX", "D2H_MAX", "ENTRY_POINTS"}
    kind = "|".join(opkinds.NAMES)
    for rel in KIND_C_FILES:
        src = (ROOT / rel).read_text()
        assert '#include "opkinds.h"' in src, rel
        used = set(re.findall(r"\bOP_(\w+)", src))
        assert used and used <= known, (rel, used - known)
        # a kind under the executor's or the plan compiler's former prefix: a hand-written copy
        assert re.findall(rf"\b(?:EX|K|PL)_(?:{kind}|N|NKINDS)\b", src) == [], rel
        assert not re.search(r"\benum\s*\{[^}]*\bLAUNCH\b", src), rel
        assert not re.search(r'\{\s*"cu\w+"\s*,\s*\d+\s*\}', src), rel      # an entry point table
        assert not re.search(r"#define \w+ \(?(16384|1 << 20|1048576)\)?\s", src), rel
    for script in ("replay/build_executor.py", "replay/build_plan.py"):
        text = (ROOT / script).read_text()
        assert "opkinds.py" in text and "header_dir()" in text, script


def test_op_kinds_name_their_handlers():
    """Each kind's handler (the one-by-one path) is the one the dispatcher gives its entry point."""
    from cudasnap.formats import opkinds
    from cudasnap.replay import dispatch
    for name, entry, _ver, handler in opkinds.KINDS[1:]:
        h = dispatch.lookup(entry)
        assert h is not None and h.fn.__name__ == handler, name
    assert opkinds.KINDS[0][1:] == (None, 0, None)


def test_built_executor_agrees_with_the_op_kinds(double):
    """The compiled executor resolves, on the test-double driver, the entry point of each kind
    of the list that the double exports, in the list's order, and no kind past it."""
    code = (
        "from cudasnap.formats import opkinds\n"
        "from cudasnap.replay import _executor as X\n"
        "err = X.ffi.new('char[]', 256)\n"
        "assert X.lib.ex_init(0, err, 256) == 0, X.ffi.string(err)\n"
        "print([X.lib.ex_has(k) for k in range(opkinds.NKINDS + 2)])\n")
    r = subprocess.run([sys.executable, "-c", code], env=double["env"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    from cudasnap.formats import opkinds
    from double.build import proc_table        # the double's generated cuGetProcAddress rows
    exported = set(re.findall(r'^\s+[ES]\("(\w+)"', proc_table(), re.M))
    want = [1] + [int(k[1] in exported) for k in opkinds.KINDS[1:]] + [0, 0]
    assert sum(want) > 20 and r.stdout.split("\n")[0] == str(want)
