"""Build the interception shim: a cffi extension module that is also the LD_PRELOAD library.

The C wrappers are generated here from the one API description (api_description.json):
a parameter table per entry point plus one tiny wrapper per entry point that hands its
arguments to the generic engine in shim_core.c. No CUDA toolkit or cuda.h is needed:
every wrapper has the same register-level signature (6 integer registers, 8 vector
registers, 14 stack slots), which forwards any driver call on x86-64 SysV unchanged.
"""
from __future__ import annotations

import json
import re
import os
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
MAX_INT_ARGS = 20  # 6 in registers + 14 on the stack
MAX_FLOAT_ARGS = 8

KINDS = {
    "val": 1, "opaque": 1, "out": 2, "in_struct": 3, "inout_struct": 4, "out_struct": 5,
    "str": 6, "blob_in": 7, "blob_out": 8, "array_in": 9, "array_out": 10,
}
HOOKS = {
    None: 0, "launch": 1, "module_image": 2, "module_file": 3, "getproc": 4, "export_table": 5,
    "memcpy_struct": 6, "host_alloc": 14, "async_d2h": 7, "init": 8, "launch_config": 0,
    "unload": 11, "memcpy_unified": 12, "share": 13, "memcpy_batch": 15, "host_free": 16,
}
# Real driver entries the hooks call themselves (never through a wrapper): every CS_ID_<name>
# the shim's C sources use gets the entry's id.
def helpers() -> list:
    names = set()
    for src in (*HERE.glob("*.c"), *HERE.glob("*.h")):
        names |= set(re.findall(r"CS_ID_(cu\w+)", src.read_text()))
    return sorted(names)


def load_description(path: Path = HERE / "api_description.json") -> dict:
    with open(path) as f:
        return json.load(f)


def _param_index(params, names):
    for i, p in enumerate(params):
        if p["name"] in names:
            return i
    return -1


def _hook_of(fn) -> tuple[int, int, int, int]:
    """(hook id, h0, h1, h2): hook and the parameter indices it needs."""
    cap = fn.get("capture")
    params = fn["params"]
    name = fn["name"]
    if cap == "init":
        return HOOKS["init"], -1, -1, -1
    if "shim_placement" in fn["classes"]:      # shim_placement.c answers it
        return 9, -1, -1, -1
    kn = _param_index(params, ("nodeParams", "pNodeParams"))
    generic_node = re.fullmatch(r"cuGraph(AddNode|NodeSetParams|ExecNodeSetParams)(_v\d)?", name)
    if kn >= 0 and "Get" not in name and ("KernelNode" in name or generic_node):
        # kernel graph nodes carry their arguments as host pointers: pack them like a launch
        generic = "KernelNode" not in name
        return 10, kn, 16 if generic else 0, 1 if (generic or (params[kn].get("pointee_size") or 0) >= 72) else 0
    if cap == "module_image" and any(p["kind"] == "blob_in" for p in params):
        cap = None  # cuLinkAddData & co carry their size: the generic blob path has it
    hook = HOOKS.get(cap, 0)
    h0 = h1 = h2 = -1
    if cap == "launch":
        h0 = _param_index(params, ("f", "hfunc", "hf"))
        h1 = _param_index(params, ("kernelParams",))
        h2 = _param_index(params, ("extra",))
        if h0 < 0:
            hook = 0
    elif cap == "module_image":
        h0 = _param_index(params, ("image", "fatCubin", "code", "data"))
        if h0 < 0:
            hook = 0
    elif cap == "module_file":
        h0 = _param_index(params, ("fname", "fileName", "path"))
        if h0 < 0:
            hook = 0
    elif cap == "memcpy_struct":
        # the layout its host side is read with (shim_hooks.c cs_memcpy_struct_host): 2 for
        # CUDA_MEMCPY2D, 3 for CUDA_MEMCPY3D; 0 for the 32-bit v1 structs and the peer copies
        h0 = {"CUDA_MEMCPY2D": 2, "CUDA_MEMCPY3D": 3}.get(params[0].get("pointee") if params else None, 0)
    elif cap == "async_d2h":
        h0 = _param_index(params, ("hStream",))
    elif cap == "memcpy_unified":
        h0 = _param_index(params, ("hStream",))
        h1, h2 = _param_index(params, ("dst",)), _param_index(params, ("src",))
        if h1 < 0 or h2 < 0 or _param_index(params, ("ByteCount",)) != 2:
            hook = 0
    elif cap == "share":
        # shim_share.c: h0 the handle type, h1 the fd (export: an output, import: a value), h2 export
        h0 = _param_index(params, ("handleType", "shHandleType"))
        h1 = _param_index(params, ("shareableHandle", "osHandle"))
        h2 = 1 if h1 >= 0 and params[h1]["name"] == "shareableHandle" else 0
        if h0 < 0 or h1 < 0:
            hook = 0
    elif cap == "host_alloc":
        # shim_hostmem.c tracks managed allocations and pinned host memory mapped for the device
        # (h2: the flags, whose DEVICEMAP bit says so; -1 for managed memory)
        h0, h1 = _param_index(params, ("dptr", "pp", "p")), _param_index(params, ("bytesize",))
        h2 = _param_index(params, ("Flags",))
        if "host_visible" not in fn["classes"] or h0 < 0 or h1 < 0 \
                or ("managed_alloc" not in fn["classes"] and h2 < 0):
            hook = 0
        elif "managed_alloc" in fn["classes"]:
            h2 = -1
    elif cap == "host_free":
        h0 = _param_index(params, ("p",))
        if h0 < 0:
            hook = 0
    elif cap == "memcpy_batch":
        # shim_hooks.c reads (dsts, srcs, sizes, count) as the first four parameters
        h0 = _param_index(params, ("hStream",))
        if h0 < 0 or [p["name"] for p in params[:4]] != ["dsts", "srcs", "sizes", "count"]:
            hook = 0
    elif cap == "getproc" and len(params) < 4:
        hook = 0
    return hook, h0, h1, h2


def _first_sight(params, ctypes) -> int:
    """Index of the first handle of these C types passed by value, or -1: the shim identifies
    such a handle (a function's name, module and parameter layout; a context's device) before
    the call, whatever produced it."""
    for i, p in enumerate(params):
        if p["kind"] == "val" and p.get("ctype") in ctypes:
            return i
    return -1


def _struct_field(types, tname, field, default):
    t = types.get(tname) or {}
    for f in t.get("fields", []):
        if f[0] == field:
            return f[2]
    return default


QKEY_WORDS = 16      # CS_QKEY: words a pure query's identity may take


def _query_key_fn(i: int, params: list) -> str | None:
    """C for the identity of a call of pure query i, as words: result, every argument (an
    output pointer only as set or not: call sites differ), then the outputs when it succeeded.
    None when the key could exceed QKEY_WORDS (the query is then never collapsed)."""
    outs = [(j, p) for j, p in enumerate(params) if p[0] in (2, 4, 5)]
    if 1 + len(params) + sum((p[5] + 7) // 8 for _j, p in outs) > QKEY_WORDS:
        return None
    body = ["U *k = key;", "*k++ = (uint32_t)res;"]
    for kind, size, _flags, ai, _len, _aux in params:
        if kind in (2, 4, 5):
            body.append(f"*k++ = a[{ai}] != 0;")
        elif size < 8:
            body.append(f"*k++ = a[{ai}] & 0x{(1 << (8 * size)) - 1:x}ull;")
        else:
            body.append(f"*k++ = a[{ai}];")
    if outs:
        body.append("if (res == 0) {")
        for _j, (_kind, _size, _flags, ai, _len, aux) in outs:
            words = (aux + 7) // 8
            if aux == 4:
                body.append(f"  if (a[{ai}]) {{ uint32_t v; memcpy(&v, (const void *)a[{ai}], 4); *k++ = v; }}")
            elif aux == 8:
                body.append(f"  if (a[{ai}]) memcpy(k++, (const void *)a[{ai}], 8);")
            else:
                body.append(f"  if (a[{ai}]) {{ k[{words - 1}] = 0; memcpy(k, (const void *)a[{ai}], {aux}); k += {words}; }}")
        body.append("}")
    body.append("return (uint32_t)(k - key);")
    return f"static uint32_t cs_qk{i}(const U *a, CUresult res, U *key) {{ " + " ".join(body) + " }"


def generate_c(desc: dict) -> str:
    fns = sorted(desc["functions"], key=lambda f: f["name"])
    types = desc.get("types", {})
    out = []
    w = out.append
    maxp = max(len(f["params"]) for f in fns)
    w(f"#define CS_NFN {len(fns)}")
    w(f"#define CS_MAXP {max(maxp, 1)}")
    w(f"#define CS_QKEY {QKEY_WORDS}")
    w(f'#define CS_API_DIGEST "{desc.get("digest", "")[:64]}"')
    w("enum { CS_K_VAL = 1, CS_K_OUT, CS_K_IN_STRUCT, CS_K_INOUT_STRUCT, CS_K_OUT_STRUCT, CS_K_STR,"
      " CS_K_BLOB_IN, CS_K_BLOB_OUT, CS_K_ARRAY_IN, CS_K_ARRAY_OUT };")
    w("enum { CS_P_FLOAT = 1, CS_P_COUNT_PTR = 2, CS_P_BYVAL = 4 };   /* BYVAL: a struct passed by value (its bytes at &a[ai]) */")
    w("enum { CS_H_NONE, CS_H_LAUNCH, CS_H_MODULE_IMAGE, CS_H_MODULE_FILE, CS_H_GETPROC,"
      " CS_H_EXPORT_TABLE, CS_H_MEMCPY_STRUCT, CS_H_ASYNC_D2H, CS_H_INIT, CS_H_PLACE, CS_H_KNODE, CS_H_UNLOAD, CS_H_MEMCPY_UNIFIED, CS_H_SHARE,"
      " CS_H_HOST_ALLOC, CS_H_MEMCPY_BATCH, CS_H_HOST_FREE };")
    w("typedef struct { unsigned char kind, size, flags, ai; unsigned short len_idx; unsigned aux; } cs_param;")
    w("typedef struct { const char *name, *base; unsigned char nparams, hook; signed char h0, h1, h2; unsigned char query, host_sync;"
      " unsigned short kinds; unsigned char simple, floats; signed char fh, ch; const cs_param *params; } cs_fn;"
      "   /* kinds: bit 1<<CS_K_* per kind present; simple: at most 6 integer arguments, no float;"
      " floats: float arguments; fh, ch: a CUfunction/CUkernel, a CUcontext argument to identify at first sight;"
      " host_sync: the host has seen the device's work when it returns */")
    ids = {f["name"]: i for i, f in enumerate(fns)}
    for h in helpers():
        w(f"#define CS_ID_{h} {ids.get(h, -1)}")
    cfg = "CUlaunchConfig_st" if "CUlaunchConfig_st" in types else "CUlaunchConfig"
    w(f"#define CS_LAUNCHCFG_ATTRS_OFF {_struct_field(types, cfg, 'attrs', 40)}")
    w(f"#define CS_LAUNCHCFG_NUMATTRS_OFF {_struct_field(types, cfg, 'numAttrs', 48)}")
    attr = types.get("CUlaunchAttribute") or types.get("CUlaunchAttribute_st") or {}
    w(f"#define CS_SIZEOF_LAUNCHATTR {attr.get('size', 72)}")
    rows = []
    simples = []
    qkeys: list = []
    for i, f in enumerate(fns):
        params = f["params"]
        ints = floats = 0
        prow = []
        kinds = 0
        ok = f.get("ret", "CUresult") == "CUresult"
        regs = stack = 0
        for p in params:
            byval = bool(p.get("byval_struct"))
            if byval and not (p.get("abi_class") == "memory" and 0 < int(p.get("size", 0)) <= 64):
                ok = False
            isfloat = bool(p.get("float")) or p.get("abi_class") == "float"
            if isfloat:
                ai = floats
                floats += 1
            elif byval:
                # a struct passed by value in memory: its bytes are stack slots (shim_core.c reads &a[ai])
                ai = 6 + stack
                stack += -(-int(p.get("size", 8)) // 8)
            elif regs < 6:
                ai = regs
                regs += 1
            else:
                ai = 6 + stack
                stack += 1
            ints = 6 + stack if stack else regs
            kind = KINDS.get(p["kind"], 1)
            flags = (1 if isfloat else 0) | (2 if p.get("count_is_ptr") else 0) | (4 if byval else 0)
            if byval:
                kind = KINDS["in_struct"]
            ref = p.get("len_param") or p.get("count_param")
            len_idx = _param_index(params, (ref,)) if ref else 0
            if kind in (7, 8, 9, 10) and len_idx < 0:
                kind = 1
                len_idx = 0
            if kind in (9, 10):
                aux = p.get("elem_size", 1)   # (a count passed by pointer: see the loop below)
            elif byval:
                aux = int(p.get("size", 8))
            elif kind in (2, 3, 4, 5):
                aux = p.get("pointee_size") or 8
            else:
                aux = 0
            size = min(int(p.get("size", 8)), 8)
            if byval:
                size = 8
            kinds |= 1 << kind
            prow.append([kind, size, flags, ai, max(len_idx, 0), aux])
        if ints > MAX_INT_ARGS or floats > MAX_FLOAT_ARGS:
            ok = False
        # a count passed by pointer is read through it: record the pointee size in its aux
        for j, p in enumerate(params):
            if p.get("count_is_ptr"):
                ref = p.get("count_param") or p.get("len_param")
                k = _param_index(params, (ref,))
                if k >= 0:
                    prow[k][5] = params[k].get("pointee_size") or 8
        hook, h0, h1, h2 = _hook_of(f)
        fh = _first_sight(params, ("CUfunction", "CUkernel")) if ok and hook not in (HOOKS["launch"], 10) else -1
        ch = _first_sight(params, ("CUcontext",)) if ok else -1
        simple = 1 if ok and ints <= 6 and floats == 0 and not stack else 0
        simples.append(simple)
        cells = ",".join("{" + ",".join(map(str, r)) + "}" for r in prow)
        w(f"static const cs_param cs_p{i}[] = {{{cells or '{0,0,0,0,0,0}'}}};")
        query = 1 if (ok and (hook == 0 or "shim_placement_after" in f["classes"]) and f["capture_query"]
                      and all(p["kind"] in ("val", "opaque", "out", "out_struct") for p in params)) else 0
        rows.append(f'  {{"{f["name"]}", "{f["base"]}", {len(params) if ok else 0}, {hook if ok else 0}, {h0}, {h1}, {h2}, {query}, {int(bool(f.get("host_sync")))}, {kinds}, {simple}, {floats}, {fh}, {ch}, cs_p{i}}},')
        qkeys.append(_query_key_fn(i, prow) if query and simple else None)
    w("static const cs_fn cs_fns[CS_NFN] = {")
    out.extend(rows)
    w("};")
    # a pure query's identity, unrolled per function (shim_core.c, cs_call_query)
    w("typedef uint32_t (*cs_qkey_fn)(const U *a, CUresult res, U *key);")
    out.extend(q for q in qkeys if q)
    w("static const cs_qkey_fn cs_qkeys[CS_NFN] = {" + ",".join(f"cs_qk{i}" if q else "0" for i, q in enumerate(qkeys)) + "};")
    w('#include "shim_core_decl.h"')
    ia = ", ".join(f"U a{k}" for k in range(6))
    fa = ", ".join(f"double d{k}" for k in range(8))
    sa = ", ".join(f"U s{k}" for k in range(14))
    sig = f"({ia}, {fa}, {sa})"
    w(f"#define CS_W(N) static CUresult cs_w_##N{sig} {{ "
      "U a[20] = {a0,a1,a2,a3,a4,a5,s0,s1,s2,s3,s4,s5,s6,s7,s8,s9,s10,s11,s12,s13}; "
      "double d[8] = {d0,d1,d2,d3,d4,d5,d6,d7}; return cs_call(N, a, d); }")
    # most entry points take at most 6 integer arguments: their wrappers copy only those
    w(f"#define CS_W6(N) static CUresult cs_w_##N({ia}) {{ "
      "U a[20]; a[0] = a0; a[1] = a1; a[2] = a2; a[3] = a3; a[4] = a4; a[5] = a5; return cs_call(N, a, 0); }")
    for i in range(len(fns)):
        w(f"CS_W6({i})" if simples[i] else f"CS_W({i})")
    w("static void *const cs_wrappers[CS_NFN] = {" + ",".join(f"(void*)cs_w_{i}" for i in range(len(fns))) + "};")
    # Exported ABI symbols for programs linked with -lcuda.
    for i, f in enumerate(fns):
        w(f'__attribute__((visibility("default"))) CUresult {f["name"]}{sig} __attribute__((alias("cs_w_{i}")));')
    return "\n".join(out) + "\n"


def make_ffi() -> FFI:
    desc = load_description()
    gen = generate_c(desc)
    ffi = FFI()
    ffi.cdef("int cs_shim_fn_count(void); const char *cs_shim_digest(void);"
             " uint64_t cs_shim_clock_pair(void); uint64_t cs_shim_clock_ns(void);")
    core = (HERE / "shim_core.c").read_text()
    # Order: table, forward declarations the wrappers need, engine (which includes hooks).
    src = core
    decl = "static CUresult cs_call(int id, U *a, double *d);\nstatic void *const cs_wrappers[CS_NFN];\n"
    table, wrappers = gen.split('#include "shim_core_decl.h"\n')
    marker = "/* @GENERATED_TABLE@ (build_shim.py puts the API table here) */"
    assert marker in src
    src = src.replace(marker, table + decl, 1)
    src = src + "\n/* ---- generated wrappers ---- */\n" + wrappers
    ffi.set_source(
        "cudasnap.shim._shim",
        src,
        include_dirs=[str(HERE)],
        # the generated source #includes these: a change to one alone must rebuild the shim
        depends=sorted(str(f) for f in (*HERE.glob("*.c"), *HERE.glob("*.h"))),
        extra_compile_args=["-O2", "-fvisibility=default", "-Wno-unused-function", "-Wno-unused-parameter",
                            "-Wno-attribute-alias", "-std=gnu11"],
        libraries=["dl", "pthread"],
    )
    return ffi


ffibuilder = make_ffi()

if __name__ == "__main__":
    ffibuilder.compile(tmpdir=os.environ.get("CUDASNAP_BUILD_DIR", str(HERE.parent / "build" / "shim")), verbose=True)
