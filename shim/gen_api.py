#!/usr/bin/env python3
"""Generate shim/api_description.json from CUDA 13.0 driver headers + shim/overlay.py.

Headers: cuda.h, cudaGL.h, cudaEGL.h, cudaVDPAU.h (nvidia-cuda-runtime 13.0.96) and
cudaProfiler.h (nvidia-cuda-profiler-api 13.0.85: the runtime wheel lacks it, though it
ships cudaProfilerTypedefs.h), with their PFN typedef headers cudaTypedefs.h,
cudaGLTypedefs.h, cudaEGLTypedefs.h, cudaVDPAUTypedefs.h, cudaProfilerTypedefs.h. The GL,
EGL and VDPAU types those headers use come from tiny stub headers (STUB_HEADERS) with the
x86-64 sizes of the real ones; no system GL/EGL/VDPAU header is read.

Usage:
    python shim/gen_api.py [--include DIR] [--out shim/api_description.json] [--report FILE] [--check]

Without --include, the header wheels (nvidia-cuda-runtime==13.0.96,
nvidia-cuda-profiler-api==13.0.85) are fetched with `pip download` into a temporary
directory; the headers are then kept in a cache directory ($CUDASNAP_HEADER_CACHE or
~/.cache/cudasnap/cuda-headers-13.0.96) so that later runs (and the determinism test)
need no network.

Needs gcc and pycparser; building or using cudasnap does not: the output is committed.

Steps:
  1. preprocess the headers (HEADER_INCLUDES) three times with gcc -E (legacy/internal view with
     __CUDA_API_VERSION_INTERNAL, the default view, and the per-thread-default-stream view)
     against tiny fake libc and GL/EGL/VDPAU stub headers, and parse each with pycparser;
  2. collect every exported function declaration (static inline helpers are skipped);
  3. compile and run a C program against the real headers (gcc, x86-64 Linux) to get exact
     sizeof/alignof/offsetof of every type reachable from a parameter, and every enumerator;
  4. classify parameters (C-type defaults, then shim/overlay.py corrections);
  5. pair the PFN_cuX_vNNNN[_ptds|_ptsz] typedefs with ABI symbols by signature
     (ordinal fallback) to build the cuGetProcAddress version table.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
WHEEL_SPEC = "nvidia-cuda-runtime==13.0.96"
PROFILER_WHEEL_SPEC = "nvidia-cuda-profiler-api==13.0.85"
SOURCE = ("cuda.h, cudaGL.h, cudaEGL.h, cudaVDPAU.h from nvidia-cuda-runtime 13.0.96; "
          "cudaProfiler.h from nvidia-cuda-profiler-api 13.0.85")
# header -> wheel that ships it (under nvidia/cu13/include/)
HEADERS = {
    "cuda.h": WHEEL_SPEC, "cudaTypedefs.h": WHEEL_SPEC,
    "cudaGL.h": WHEEL_SPEC, "cudaGLTypedefs.h": WHEEL_SPEC,
    "cudaEGL.h": WHEEL_SPEC, "cudaEGLTypedefs.h": WHEEL_SPEC,
    "cudaVDPAU.h": WHEEL_SPEC, "cudaVDPAUTypedefs.h": WHEEL_SPEC,
    "cudaProfilerTypedefs.h": WHEEL_SPEC,
    "cudaProfiler.h": PROFILER_WHEEL_SPEC,
}
CUDA_VERSION = 13000
SCHEMA = 1

# --------------------------------------------------------------------------------------
# headers


def default_cache_dir() -> Path:
    env = os.environ.get("CUDASNAP_HEADER_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cudasnap" / "cuda-headers-13.0.96"


def cached_include() -> Path | None:
    d = default_cache_dir()
    if all((d / h).is_file() for h in HEADERS):
        return d
    return None


def fetch_headers() -> Path:
    """pip download the header wheels into a temp dir, unzip the headers, cache them."""
    c = cached_include()
    if c:
        return c
    tmp = Path(tempfile.mkdtemp(prefix="cudasnap-hdr-"))
    inc = tmp / "include"
    inc.mkdir()
    for k, spec in enumerate(sorted(set(HEADERS.values()))):
        dl = tmp / f"wheel{k}"
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", spec, "-d", str(dl)],
            check=True,
        )
        whl = sorted(dl.glob("*.whl"))[0]
        with zipfile.ZipFile(whl) as z:
            for n in z.namelist():
                if n.startswith("nvidia/cu13/include/") and n.endswith(".h") \
                        and "/" not in n[len("nvidia/cu13/include/"):]:
                    (inc / os.path.basename(n)).write_bytes(z.read(n))
    missing = [h for h in HEADERS if not (inc / h).is_file()]
    if missing:
        raise SystemExit(f"header wheels lack {missing}")
    cache = default_cache_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
        for h in sorted(HEADERS):
            shutil.copy(inc / h, cache / h)
        return cache
    except OSError:
        return inc


# --------------------------------------------------------------------------------------
# preprocessing and parsing

FAKE_STDINT = """
typedef signed char int8_t; typedef short int16_t; typedef int int32_t; typedef long int64_t;
typedef unsigned char uint8_t; typedef unsigned short uint16_t; typedef unsigned int uint32_t;
typedef unsigned long uint64_t; typedef unsigned long uintptr_t; typedef long intptr_t;
"""
FAKE_STDLIB = "typedef unsigned long size_t;\n#define NULL ((void*)0)\n"
FAKE_DEFS = [
    "-D__attribute__(x)=",
    "-D__declspec(x)=",
    "-D__inline=inline",
    "-D__extension__=",
    "-D__restrict=",
    "-U__GNUC__",
    "-U__cplusplus",
]

# Stand-ins for the GL / EGL / VDPAU headers the interop headers include (or, for
# cudaVDPAU.h, expect to be included first). Only the types the CUDA declarations use, with
# the x86-64 Linux sizes of the real ones: GLuint/GLenum are unsigned int (GL/gl.h),
# EGLint is khronos_int32_t, the EGL*KHR handles are void * (EGL/eglext.h), and VDPAU
# handles are uint32_t (vdpau/vdpau.h). Used for both the parse and the layout probe, ahead
# of any system include directory.
STUB_HEADERS = {
    "GL/gl.h": "#ifndef CUDASNAP_STUB_GL_H\n#define CUDASNAP_STUB_GL_H\n"
               "typedef unsigned int GLuint;\ntypedef unsigned int GLenum;\n#endif\n",
    "EGL/egl.h": "#ifndef CUDASNAP_STUB_EGL_H\n#define CUDASNAP_STUB_EGL_H\n"
                 "#include <stdint.h>\ntypedef int32_t EGLint;\n#endif\n",
    "EGL/eglext.h": "#ifndef CUDASNAP_STUB_EGLEXT_H\n#define CUDASNAP_STUB_EGLEXT_H\n"
                    "typedef void *EGLImageKHR;\ntypedef void *EGLStreamKHR;\ntypedef void *EGLSyncKHR;\n#endif\n",
    "vdpau/vdpau.h": "#ifndef CUDASNAP_STUB_VDPAU_H\n#define CUDASNAP_STUB_VDPAU_H\n#include <stdint.h>\n"
                     "typedef uint32_t VdpDevice;\ntypedef uint32_t VdpVideoSurface;\n"
                     "typedef uint32_t VdpOutputSurface;\ntypedef uint32_t VdpFuncId;\n"
                     "typedef enum { VDP_STATUS_OK = 0 } VdpStatus;\n"
                     "typedef VdpStatus VdpGetProcAddress(VdpDevice device, VdpFuncId function_id,"
                     " void **function_pointer);\n#endif\n",
}

# What the parse reads: each API header, then its PFN typedef header. cudaVDPAU.h includes
# nothing itself: the VDPAU types must come first.
HEADER_INCLUDES = [
    "cuda.h", "cudaTypedefs.h",
    "GL/gl.h", "cudaGL.h", "cudaGLTypedefs.h",
    "EGL/egl.h", "EGL/eglext.h", "cudaEGL.h", "cudaEGLTypedefs.h",
    "vdpau/vdpau.h", "cudaVDPAU.h", "cudaVDPAUTypedefs.h",
    "cudaProfiler.h", "cudaProfilerTypedefs.h",
]
# The layout probe needs the declarations only (and real libc headers).
PROBE_INCLUDES = [h for h in HEADER_INCLUDES if "Typedefs" not in h]


def write_stubs(d: Path) -> Path:
    """Write STUB_HEADERS under d; return d."""
    for rel, text in STUB_HEADERS.items():
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return d


VIEWS = {
    # legacy/internal view: unversioned old ABI declarations, _ptds/_ptsz of the main
    # declarations, and the PFN typedefs of the old versions
    "internal": ["-D__CUDA_API_VERSION_INTERNAL"],
    "default": [],
    "ptds": ["-DCUDA_API_PER_THREAD_DEFAULT_STREAM"],
}


def preprocess(include: Path, defines, fake_dir: Path, stub_dir: Path) -> str:
    src = "".join(f"#include <{h}>\n" for h in HEADER_INCLUDES)
    r = subprocess.run(
        ["gcc", "-E", "-P", "-nostdinc", "-I", str(fake_dir), "-I", str(stub_dir), "-I", str(include), *FAKE_DEFS,
         *defines, "-x", "c", "-"],
        input=src, capture_output=True, text=True,
    )
    if r.returncode != 0:
        raise SystemExit("gcc -E failed:\n" + r.stderr[-4000:])
    return r.stdout


def parse(text: str):
    import pycparser

    return pycparser.CParser().parse(text, filename="<cuda.h>")


# --------------------------------------------------------------------------------------
# type model

BUILTIN = {
    # name: (kind, size, signed)
    "char": ("int", 1, True), "signed char": ("int", 1, True), "unsigned char": ("int", 1, False),
    "short": ("int", 2, True), "unsigned short": ("int", 2, False),
    "int": ("int", 4, True), "unsigned int": ("int", 4, False), "unsigned": ("int", 4, False),
    "long": ("int", 8, True), "unsigned long": ("int", 8, False),
    "long long": ("int", 8, True), "unsigned long long": ("int", 8, False),
    "float": ("float", 4, True), "double": ("float", 8, True),
    "void": ("void", 0, False), "_Bool": ("int", 1, False),
}


def norm_builtin(names):
    n = [x for x in names if x not in ("signed",)] if names != ["signed", "char"] else names
    n = [x for x in n if x != "int"] + (["int"] if "int" in n and len(n) == 1 else [])
    s = " ".join(n)
    s = {"short int": "short", "unsigned short int": "unsigned short", "long int": "long",
         "unsigned long int": "unsigned long", "long long int": "long long",
         "unsigned long long int": "unsigned long long", "unsigned": "unsigned int", "": "int",
         "signed char": "signed char"}.get(s, s)
    if s == "unsigned long long" or s in BUILTIN:
        return s
    if s in ("unsigned short", "unsigned long", "long long", "short", "long"):
        return s
    return s


class Model:
    """Typedefs, struct/union/enum tags and functions from the parsed views."""

    def __init__(self):
        self.typedefs = {}  # name -> type node
        self.tags = {}  # ("struct"|"union"|"enum", tag) -> node with body
        self.funcs = {}  # name -> (FuncDecl node, view)
        self.func_conflicts = []
        self.skipped_static = set()
        self.pfns = {}  # PFN typedef name -> FuncDecl node

    def add_ast(self, ast, view):
        from pycparser import c_ast

        class V(c_ast.NodeVisitor):
            def __init__(s):
                pass

            def visit_Struct(s, n):
                if n.decls is not None and n.name:
                    self.tags.setdefault(("struct", n.name), n)
                s.generic_visit(n)

            def visit_Union(s, n):
                if n.decls is not None and n.name:
                    self.tags.setdefault(("union", n.name), n)
                s.generic_visit(n)

            def visit_Enum(s, n):
                if n.values is not None and n.name:
                    self.tags.setdefault(("enum", n.name), n)
                s.generic_visit(n)

        V().visit(ast)
        for ext in ast.ext:
            if isinstance(ext, c_ast.Typedef):
                if ext.name.startswith("PFN_"):
                    t = ext.type
                    if isinstance(t, c_ast.PtrDecl) and isinstance(t.type, c_ast.FuncDecl):
                        self.pfns.setdefault(ext.name, t.type)
                    continue
                self.typedefs.setdefault(ext.name, ext.type)
            elif isinstance(ext, c_ast.FuncDef):
                self.skipped_static.add(ext.decl.name)
            elif isinstance(ext, c_ast.Decl) and isinstance(ext.type, c_ast.FuncDecl):
                if "static" in (ext.storage or []):
                    self.skipped_static.add(ext.name)
                    continue
                if not ext.name.startswith("cu"):
                    continue
                old = self.funcs.get(ext.name)
                if old is None:
                    self.funcs[ext.name] = (ext.type, view)
                elif sig_key(self, old[0]) != sig_key(self, ext.type):
                    self.func_conflicts.append((ext.name, old[1], view))


def ctype_str(typenode) -> str:
    """C spelling of a type node without a declarator name."""
    from pycparser import c_generator, c_ast
    import copy

    t = copy.deepcopy(typenode)
    # strip declarator names
    n = t
    while n is not None:
        if isinstance(n, c_ast.TypeDecl):
            n.declname = None
            break
        n = getattr(n, "type", None)
    s = c_generator.CGenerator()._generate_type(t)
    s = re.sub(r"\s+", " ", s).strip()
    s = s.replace("* ", "*").replace(" *", " *")
    s = re.sub(r"\*\s*const", "*const", s)
    return s


def resolve(model, typenode):
    """Follow typedefs; return the final non-typedef node (TypeDecl with Struct/Union/Enum/
    IdentifierType-builtin, PtrDecl, ArrayDecl, FuncDecl)."""
    from pycparser import c_ast

    n = typenode
    for _ in range(50):
        if isinstance(n, c_ast.TypeDecl) and isinstance(n.type, c_ast.IdentifierType):
            name = " ".join(n.type.names)
            if name in model.typedefs:
                n = model.typedefs[name]
                continue
        return n
    raise RuntimeError("typedef loop")


def sig_key(model, funcdecl):
    """Canonical parameter type list (typedefs resolved) used to pair PFNs with symbols."""
    from pycparser import c_ast

    out = []
    params = funcdecl.args.params if funcdecl.args else []
    for p in params:
        if isinstance(p, c_ast.EllipsisParam):
            out.append("...")
            continue
        out.append(canon(model, p.type))
    if out == ["void"]:
        out = []
    return tuple(out)


def canon(model, t):
    from pycparser import c_ast

    quals = []
    if isinstance(t, c_ast.TypeDecl):
        quals = [q for q in t.quals if q == "const"]
        r = resolve(model, t)
        if r is not t:
            return ("const " if quals else "") + canon(model, r)
        inner = t.type
        if isinstance(inner, c_ast.IdentifierType):
            return ("const " if quals else "") + norm_builtin(inner.names)
        if isinstance(inner, (c_ast.Struct, c_ast.Union, c_ast.Enum)):
            kw = {c_ast.Struct: "struct", c_ast.Union: "union", c_ast.Enum: "enum"}[type(inner)]
            return ("const " if quals else "") + f"{kw} {inner.name or '?'}"
    if isinstance(t, c_ast.PtrDecl):
        return canon(model, t.type) + " *"
    if isinstance(t, c_ast.ArrayDecl):
        return canon(model, t.type) + " []"
    if isinstance(t, c_ast.FuncDecl):
        return "fn(" + ",".join(sig_key(model, t)) + ")"
    return "?"


# --------------------------------------------------------------------------------------
# layout probe (gcc, x86-64 Linux, real header)


class Layout:
    def __init__(self):
        self.size = {}  # type expr key -> (size, align)
        self.fields = {}  # type key -> [(name, off, size)]
        self.enums = {}  # enumerator -> value


def type_info_walk(model, roots):
    """Decide which named types go in the description: everything reachable from parameters."""
    from pycparser import c_ast

    names = set()
    tags = set()
    work = list(roots)
    seen = set()
    while work:
        t = work.pop()
        key = id(t)
        if key in seen:
            continue
        seen.add(key)
        if isinstance(t, c_ast.TypeDecl):
            inner = t.type
            if isinstance(inner, c_ast.IdentifierType):
                name = " ".join(inner.names)
                if name in model.typedefs:
                    names.add(name)
                    work.append(model.typedefs[name])
            elif isinstance(inner, (c_ast.Struct, c_ast.Union)):
                body = inner if inner.decls is not None else model.tags.get(
                    ("struct" if isinstance(inner, c_ast.Struct) else "union", inner.name))
                if inner.name:
                    tags.add(("struct" if isinstance(inner, c_ast.Struct) else "union", inner.name))
                if body is not None and body.decls:
                    for d in body.decls:
                        work.append(d.type)
            elif isinstance(inner, c_ast.Enum):
                if inner.name:
                    tags.add(("enum", inner.name))
        elif isinstance(t, (c_ast.PtrDecl, c_ast.ArrayDecl)):
            work.append(t.type)
        elif isinstance(t, c_ast.FuncDecl):
            pass  # function pointer: opaque
    return names, tags


def struct_body(model, node):
    from pycparser import c_ast

    if node.decls is not None:
        return node
    return model.tags.get(("struct" if isinstance(node, c_ast.Struct) else "union", node.name))


def build_probe(model, names, include: Path):
    """C program printing sizes/aligns/offsets/enumerators as JSON lines."""
    from pycparser import c_ast

    lines = [
        "#include <stdio.h>", "#include <stddef.h>", *(f"#include <{h}>" for h in PROBE_INCLUDES),
        "#define S(k,T) printf(\"S\\t%s\\t%zu\\t%zu\\n\", k, sizeof(T), _Alignof(T));",
        "#define F(k,f,off,sz) printf(\"F\\t%s\\t%s\\t%zu\\t%zu\\n\", k, f, (size_t)(off), (size_t)(sz));",
        "#define E(n) printf(\"E\\t%s\\t%lld\\n\", #n, (long long)(n));",
        "int main(void) {",
    ]
    composite = {}  # key -> (root typedef/tag spelling, path, body)

    def add_fields(key, root, path, body):
        composite[key] = (root, path, body)
        for d in body.decls:
            fname = d.name
            if fname is None:
                # anonymous struct/union member: its fields belong to this type
                inner = d.type.type if hasattr(d.type, "type") and not hasattr(d.type, "decls") else d.type
                ib = struct_body(model, inner)
                for d2 in ib.decls:
                    emit_field(key, root, path, d2)
                continue
            emit_field(key, root, path, d)

    def emit_field(key, root, path, d):
        from pycparser import c_ast as A

        fname = d.name
        full = (path + "." if path else "") + fname
        base = f"offsetof({root}, {path})" if path else "0"
        lines.append(f'F("{key}", "{fname}", offsetof({root}, {full}) - {base}, sizeof((({root}*)0)->{full}))')
        t = d.type
        while isinstance(t, A.ArrayDecl):
            t = t.type
        if isinstance(t, A.TypeDecl) and isinstance(t.type, (A.Struct, A.Union)) and t.type.decls is not None \
                and not t.type.name:
            sub = f"{key}.{fname}"
            lines.append(f"S(\"{sub}\", __typeof__((({root}*)0)->{full}))")
            add_fields(sub, root, full, t.type)

    for name in sorted(names):
        r = resolve(model, model.typedefs[name])
        if isinstance(r, c_ast.FuncDecl):
            continue  # function type typedef
        lines.append(f'S("{name}", {name})')
        if isinstance(r, c_ast.TypeDecl) and isinstance(r.type, (c_ast.Struct, c_ast.Union)):
            body = struct_body(model, r.type)
            if body is not None and body.decls is not None:
                add_fields(name, name, "", body)
    for (kind, tag), node in sorted(model.tags.items()):
        if kind == "enum":
            for v in node.values.enumerators:
                lines.append(f"E({v.name})")
    for b in sorted(BUILTIN):
        if b != "void":
            lines.append(f'S("{b}", {b})')
    lines.append('S("void *", void *)')
    lines.append("return 0; }")
    return "\n".join(lines) + "\n", composite


def run_probe(src: str, include: Path) -> Layout:
    with tempfile.TemporaryDirectory(prefix="cudasnap-probe-") as td:
        c = Path(td) / "probe.c"
        c.write_text(src)
        exe = Path(td) / "probe"
        stubs = write_stubs(Path(td) / "stubs")
        r = subprocess.run(["gcc", "-std=gnu11", "-O0", "-w", "-D__CUDA_API_VERSION_INTERNAL", "-I", str(stubs),
                            "-I", str(include), str(c), "-o", str(exe)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit("probe compile failed:\n" + r.stderr[-6000:])
        out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    lay = Layout()
    for line in out.splitlines():
        p = line.split("\t")
        if p[0] == "S":
            lay.size[p[1]] = (int(p[2]), int(p[3]))
        elif p[0] == "F":
            lay.fields.setdefault(p[1], []).append((p[2], int(p[3]), int(p[4])))
        elif p[0] == "E":
            lay.enums[p[1]] = int(p[2])
    return lay


# --------------------------------------------------------------------------------------
# description building


def load_overlay():
    spec = importlib.util.spec_from_file_location("cudasnap_overlay", HERE / "overlay.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def type_entry(model, lay, name, ov, composite):
    """Description entry of typedef `name` (resolved through aliases)."""
    from pycparser import c_ast

    t = model.typedefs[name]
    ent = {}
    # immediate alias target
    if isinstance(t, c_ast.TypeDecl) and isinstance(t.type, c_ast.IdentifierType):
        tn = " ".join(t.type.names)
        if tn in model.typedefs:
            ent["alias"] = tn
    r = resolve(model, t)
    size, align = lay.size.get(name, (8, 8))
    if isinstance(r, c_ast.PtrDecl):
        pt = r.type
        if isinstance(pt, c_ast.FuncDecl):
            ent.update(kind="funcptr", size=8)
        elif isinstance(pt, c_ast.TypeDecl) and isinstance(pt.type, (c_ast.Struct, c_ast.Union)):
            ent.update(kind="handle", size=8, handle=ov.HANDLE_NAMES.get(name) or handle_default(name, ent, ov))
        else:
            ent.update(kind="pointer", size=8, pointee=ctype_str(pt))
    elif isinstance(r, c_ast.FuncDecl):
        ent.update(kind="function", size=0)
    elif isinstance(r, c_ast.ArrayDecl):
        ent.update(kind="array", size=size, align=align, elem=ctype_str(r.type))
    elif isinstance(r, c_ast.TypeDecl):
        inner = r.type
        if isinstance(inner, c_ast.IdentifierType):
            b = norm_builtin(inner.names)
            k, _, sg = BUILTIN.get(b, ("int", size, False))
            ent.update(kind=k, size=size)
            if k == "int":
                ent["signed"] = sg
            if name in ov.INT_SEMANTICS:
                ent["semantic"] = ov.INT_SEMANTICS[name]
        elif isinstance(inner, c_ast.Enum):
            node = inner if inner.values is not None else model.tags.get(("enum", inner.name))
            vals = {}
            if node is not None:
                for v in node.values.enumerators:
                    if v.name in lay.enums:
                        vals[v.name] = lay.enums[v.name]
            ent.update(kind="enum", size=size, values=vals)
        elif isinstance(inner, (c_ast.Struct, c_ast.Union)):
            kind = "struct" if isinstance(inner, c_ast.Struct) else "union"
            ent.update(kind=kind, size=size, align=align, fields=fields_of(model, lay, name, composite))
            if inner.name:
                ent["tag"] = inner.name
    return ent


def handle_default(name, ent, ov):
    base = ent.get("alias", name)
    if base in ov.HANDLE_NAMES:
        return ov.HANDLE_NAMES[base]
    n = re.sub(r"_v\d+$", "", name)
    n = n[2:] if n.startswith("CU") else n
    return re.sub(r"(?<!^)(?=[A-Z])", "_", n).lower()


def field_ctype(d):
    from pycparser import c_ast

    t = d.type
    dims = ""
    while isinstance(t, c_ast.ArrayDecl):
        dims += "[" + (t.dim.value if t.dim is not None and hasattr(t.dim, "value") else "") + "]"
        t = t.type
    if isinstance(t, c_ast.TypeDecl) and isinstance(t.type, (c_ast.Struct, c_ast.Union)) \
            and t.type.decls is not None and not t.type.name:
        return None, dims  # anonymous nested type: caller names it
    return ctype_str(t), dims


def fields_of(model, lay, key, composite):
    """[[name, ctype, offset, size], ...] for composite `key` (typedef name or nested path)."""
    from pycparser import c_ast

    if key not in composite:
        return []
    _, _, body = composite[key]
    decls = []
    for d in body.decls:
        if d.name is None:
            inner = d.type.type if hasattr(d.type, "type") and not hasattr(d.type, "decls") else d.type
            decls.extend(struct_body(model, inner).decls)
        else:
            decls.append(d)
    probe = {f: (o, s) for f, o, s in lay.fields.get(key, [])}
    out = []
    for d in decls:
        ct, dims = field_ctype(d)
        if ct is None:
            ct = f"{key}.{d.name}"
        off, sz = probe[d.name]
        out.append([d.name, ct + dims, off, sz])
    return out



def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--include", type=Path, help="directory holding the headers listed in HEADERS")
    ap.add_argument("--out", type=Path, default=HERE / "api_description.json")
    ap.add_argument("--report", type=Path, help="write the generator report here (default: stderr)")
    ap.add_argument("--check", action="store_true", help="exit 1 if --out differs from the generated JSON")
    a = ap.parse_args(argv)
    include = a.include or fetch_headers()
    text, report = generate(include)
    if a.report:
        a.report.write_text(report)
    else:
        sys.stderr.write(report)
    if a.check:
        old = a.out.read_text() if a.out.exists() else ""
        if old != text:
            sys.stderr.write(f"{a.out} is out of date\n")
            return 1
        return 0
    a.out.write_text(text)
    return 0


def generate(include: Path):
    """Return (json text, report text)."""
    from pycparser import c_ast

    ov = load_overlay()
    rep = []
    model = Model()
    with tempfile.TemporaryDirectory(prefix="cudasnap-fake-") as fake:
        fd = Path(fake)
        (fd / "stdint.h").write_text(FAKE_STDINT)
        (fd / "stdlib.h").write_text(FAKE_STDLIB)
        stubs = write_stubs(fd / "stubs")
        texts = {}
        for view, defs in VIEWS.items():
            texts[view] = preprocess(include, defs, fd, stubs)
            model.add_ast(parse(texts[view]), view)
        # entry points the headers lack (overlay.EXTRA_FUNCTIONS), parsed with the headers' types
        declared = set(model.funcs)
        if ov.EXTRA_FUNCTIONS:
            protos = "\n".join(proto for _ver, proto in ov.EXTRA_FUNCTIONS.values())
            try:
                ast = parse(texts["default"] + "\n" + protos + "\n")
            except Exception as e:       # pycparser's ParseError names the line of the appended text
                raise SystemExit(f"overlay EXTRA_FUNCTIONS: a prototype does not parse with the headers' types: {e}")
            model.add_ast(ast, "default")
        from_overlay = set(model.funcs) - declared
        missing = set(ov.EXTRA_FUNCTIONS) - from_overlay
        if missing:
            raise SystemExit(f"overlay EXTRA_FUNCTIONS: {sorted(missing)} not declared by their prototype "
                             f"(or already declared by the headers)")

    fnames = sorted(model.funcs)
    # ---- layout probe
    roots = []
    for n in fnames:
        fd_ = model.funcs[n][0]
        roots.append(fd_.type)
        for p in (fd_.args.params if fd_.args else []):
            if not isinstance(p, c_ast.EllipsisParam):
                roots.append(p.type)
    roots += [model.typedefs[t] for t in ov.EXTRA_TYPES if t in model.typedefs]
    roots.append(model.typedefs["CUresult"])
    tnames, _ = type_info_walk(model, roots)
    tnames |= {t for t in ov.EXTRA_TYPES if t in model.typedefs}
    tnames.add("CUresult")
    src, composite = build_probe(model, tnames, include)
    lay = run_probe(src, include)

    types = {}
    for name in sorted(tnames):
        e = type_entry(model, lay, name, ov, composite)
        if e.get("kind") == "function":
            continue
        types[name] = e
    for key in sorted(composite):
        if "." in key:
            root, path, body = composite[key]
            sz, al = lay.size[key]
            types[key] = {"kind": "struct" if isinstance(body, c_ast.Struct) else "union", "size": sz,
                          "align": al, "fields": fields_of(model, lay, key, composite)}
    for b in sorted(BUILTIN):
        if b == "void":
            continue
        k, _, sg = BUILTIN[b]
        sz, al = lay.size[b]
        types.setdefault(b, {"kind": k, "size": sz, **({"signed": sg} if k == "int" else {})})

    # ---- functions
    functions = []
    unused_rules = set(ov.PARAMS)
    defaults_used = []
    for name in fnames:
        fdecl, _ = model.funcs[name]
        f = describe_function(model, lay, types, ov, name, fdecl, unused_rules, defaults_used)
        f["origin"] = "overlay" if name in from_overlay else "header"
        functions.append(f)
    for i, f in enumerate(functions):
        f["id"] = i
    functions = [{"id": f.pop("id"), **f} for f in functions]

    # ---- versions
    versions, vrep = build_versions(model, ov, fnames)
    base_of = {}
    for base, v in versions.items():
        for _, sym in v["abi"]:
            if [_, sym] in [list(x) for x in ov.VERSION_EXTRA.get(base, [])]:
                continue
            base_of.setdefault(sym, base)
        for _, sym in v.get("per_thread") or []:
            base_of.setdefault(sym, base)
    for f in functions:
        if f["name"] in base_of and base_of[f["name"]] != f["base"]:
            vrep.append(f"base differs: {f['name']} name-derived {f['base']} vs PFN {base_of[f['name']]}")

    content = {"functions": functions, "types": types}
    digest = hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    doc = {"schema": SCHEMA, "source": SOURCE, "cuda_version": CUDA_VERSION, "digest": digest,
           "types": types, "functions": functions, "versions": versions}
    text = dump_json(doc)

    # ---- report
    rep.append(f"functions: {len(functions)}  types: {len(types)}")
    if model.skipped_static:
        rep.append("skipped static inline (not exported): " + ", ".join(sorted(model.skipped_static)))
    for c in model.func_conflicts:
        rep.append(f"declaration differs between views: {c}")
    if unused_rules:
        rep.append("overlay PARAMS entries matching no function: " + ", ".join(sorted(unused_rules)))
    known = {n for f in functions for n in (f["name"], f["base"])}
    stray = sorted(set(ov.OVERRIDES) - known)
    if stray:
        raise ValueError("overlay OVERRIDES entries naming no function: " + ", ".join(stray))
    rep.extend(vrep)
    for d in defaults_used:
        rep.append("opaque param: " + d)
    return text, "\n".join(rep) + "\n"


def dump_json(doc) -> str:
    """Stable, diff-friendly JSON: one type / function / version entry per line."""
    out = ["{"]
    for k in ("schema", "source", "cuda_version", "digest"):
        out.append(f" {json.dumps(k)}: {json.dumps(doc[k])},")
    out.append(' "types": {')
    items = list(doc["types"].items())
    for i, (k, v) in enumerate(items):
        out.append(f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}" + ("," if i < len(items) - 1 else ""))
    out.append(" },")
    out.append(' "functions": [')
    fs = doc["functions"]
    for i, f in enumerate(fs):
        out.append("  " + json.dumps(f) + ("," if i < len(fs) - 1 else ""))
    out.append(" ],")
    out.append(' "versions": {')
    vs = list(doc["versions"].items())
    for i, (k, v) in enumerate(vs):
        out.append(f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}" + ("," if i < len(vs) - 1 else ""))
    out.append(" }")
    out.append("}")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------
# parameters

def param_type_info(model, types, lay, t):
    """(category, type name, size) of a type node. category: scalar|struct|void|ptr."""
    from pycparser import c_ast

    if isinstance(t, c_ast.TypeDecl):
        inner = t.type
        if isinstance(inner, c_ast.IdentifierType):
            name = " ".join(inner.names)
            if name in model.typedefs:
                e = types.get(name)
                if e is None:
                    return "scalar", name, 8
                if e["kind"] in ("struct", "union", "array"):
                    return "struct", name, e["size"]
                return e["kind"], name, e["size"]
            b = norm_builtin(inner.names)
            if b == "void":
                return "void", "void", 0
            k, _, _ = BUILTIN.get(b, ("int", 4, True))
            return k, b, lay.size[b][0]
        if isinstance(inner, (c_ast.Struct, c_ast.Union)):
            return "struct", ctype_str(t), 0
        if isinstance(inner, c_ast.Enum):
            return "enum", ctype_str(t), 4
    if isinstance(t, c_ast.PtrDecl):
        return "pointer", ctype_str(t), 8
    return "scalar", ctype_str(t), 8


def describe_function(model, lay, types, ov, name, fdecl, unused_rules, defaults_used):
    from pycparser import c_ast

    ret = ctype_str(fdecl.type)
    base = re.sub(r"_(ptds|ptsz)$", "", name)
    base = re.sub(r"_v\d+$", "", base)
    base = ov.BASE_OVERRIDES.get(name, base)
    raw = [p for p in (fdecl.args.params if fdecl.args else []) if not isinstance(p, c_ast.EllipsisParam)]
    if len(raw) == 1 and ctype_str(raw[0].type) == "void" and raw[0].name is None:
        raw = []
    pnames = [p.name or f"arg{i}" for i, p in enumerate(raw)]
    params = []
    for i, p in enumerate(raw):
        params.append(default_param(model, lay, types, name, p, pnames[i], pnames, raw, i, defaults_used))
    ovr = overrides_of(ov, name, base)
    # overlay corrections, then the overrides entry's own (what capture records of each parameter)
    for pat, rules in [*ov.PARAMS.items(), *([(re.escape(name), ovr.pop("params"))] if "params" in ovr else [])]:
        if not re.fullmatch(pat, base) and not re.fullmatch(pat, name):
            continue
        hit = False
        for pr in params:
            if pr["name"] in rules:
                r = dict(rules[pr["name"]])
                hit = True
                apply_param_rule(pr, r, types, lay)
        if hit:
            unused_rules.discard(pat)
    fam, status, reason, capture, replay = classify_function(ov, name, base)
    if ret != "CUresult":
        status, reason = "refused", f"returns {ret}, not CUresult: not interceptable"
    for pr in params:
        if pr["kind"] == "opaque" and status != "refused":
            defaults_used.append(f"{name}.{pr['name']} ({pr['ctype']})")
        assert pr["size"] <= 8 or pr.get("byval_struct"), (name, pr)
    for pr in params:
        finish_param(pr, types, pnames, name)
    ptds = name.endswith(("_ptds", "_ptsz"))
    rclass = replay_class(ov, name, base, status)
    capture = ovr.pop("capture", capture)
    extra_classes = set(ovr.pop("classes", ()))
    return {"name": name, "base": base, "family": fam, "ptds": ptds, "ret": ret, "params": params,
            "capture": capture, "replay": replay, "status": status, "reason": reason,
            "replay_class": rclass, "window_class": window_class(ov, name, base),
            "capture_query": rclass == "query" and re.fullmatch(ov.CAPTURE_QUERY_RX, name) is not None,
            "host_only": rclass == "query" or any(re.fullmatch(ov.HOST_ONLY_RX, n) for n in (base, name)),
            "releases": any(re.fullmatch(ov.RELEASES_RX, n) for n in (base, name)),
            "host_sync": re.fullmatch(ov.HOST_SYNC_RX, name) is not None,
            "classes": sorted(set(call_classes(ov, name, base)) | derived_classes(params, types) | extra_classes),
            "overrides": ovr}


OVERRIDE_KEYS = {"replay": str, "errors": bool, "via": str, "family": str, "export": str, "capture": str,
                 "classes": list, "params": dict}


def overrides_of(ov, name, base) -> dict:
    """The overlay's OVERRIDES entry of a function: its ABI name's merged over its base name's."""
    got = {**ov.OVERRIDES.get(base, {}), **ov.OVERRIDES.get(name, {})}
    for k, v in got.items():
        if not isinstance(v, OVERRIDE_KEYS.get(k, ())):
            raise ValueError(f"overlay OVERRIDES[{name!r}]: {k!r} is not one of {sorted(OVERRIDE_KEYS)} "
                             f"or not a {OVERRIDE_KEYS.get(k, type(None)).__name__}")
    return dict(sorted(got.items()))


def derived_classes(params, types) -> set:
    """The classes cuda.h itself says (from the parameter list), beside the overlay's rules:
    plain_args  every argument a value (no pointer) or an output of a value or handle: replay
                and export pass it from the description alone (replay/handlers/generic.py)
    creates     an output is a handle: the call makes an object later calls name"""
    out = set()

    def handle(tname):
        t = types.get(tname or "", {})
        return t.get("kind") == "handle"
    plain = True
    for p in params:
        if p["kind"] == "val":
            plain = plain and "*" not in p["ctype"]
        elif p["kind"] == "out":
            t = types.get(p.get("pointee") or "", {})
            plain = plain and t.get("kind") in ("handle", "int", "enum", "float")
            if handle(p.get("pointee")):
                out.add("creates")
        else:
            plain = False
    if plain:
        out.add("plain_args")
    return out


def apply_param_rule(pr, r, types, lay):
    kind = r.pop("kind", None)
    if kind:
        # drop keys that belong to the old kind
        for k in ("pointee", "pointee_size", "len_param", "count_param", "elem_size", "count_is_ptr"):
            if k in pr and k not in r:
                if kind in ("out", "out_struct", "in_struct", "inout_struct") and k in ("pointee", "pointee_size"):
                    continue
                if kind in ("array_in", "array_out") and k in ("pointee",):
                    continue
                pr.pop(k)
        pr["kind"] = kind
    if "pointee" in r and "pointee_size" not in r:
        e = types.get(r["pointee"])
        r["pointee_size"] = e["size"] if e else 8
    if kind in ("array_in", "array_out") and "elem_size" not in r and "pointee" in pr:
        e = types.get(pr["pointee"])
        r["elem_size"] = (e["size"] if e else 8)
    pr.update(r)
    # key order: stable
    order = ["name", "ctype", "kind", "size", "pointee", "pointee_size", "len_param", "count_param",
             "elem_size", "count_is_ptr", "float", "byval_struct", "abi_class"]
    items = sorted(pr.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 99)
    pr.clear()
    pr.update(items)


PARAM_ORDER = ["name", "ctype", "kind", "size", "pointee", "pointee_size", "len_param", "count_param",
               "elem_size", "count_is_ptr", "float", "byval_struct", "abi_class"]


def finish_param(pr, types, pnames, fname):
    """Fill the keys each kind promises, check references, fix key order."""
    k = pr["kind"]
    if k in ("out", "in_struct", "out_struct", "inout_struct"):
        if "pointee" not in pr:
            pr["pointee"] = re.sub(r"^const ", "", pr["ctype"][:-1].strip())
        if "pointee_size" not in pr:
            e = types.get(pr["pointee"])
            pr["pointee_size"] = e["size"] if e else 8
        for x in ("count_param", "elem_size", "count_is_ptr", "len_param"):
            pr.pop(x, None)
    elif k in ("array_in", "array_out"):
        pr.setdefault("count_param", None)
        if "elem_size" not in pr:
            e = types.get(pr.get("pointee", ""))
            pr["elem_size"] = e["size"] if e else 8
        pr.pop("pointee_size", None)
        pr.pop("len_param", None)
    elif k in ("blob_in", "blob_out"):
        for x in ("pointee", "pointee_size", "count_param", "elem_size", "count_is_ptr"):
            pr.pop(x, None)
    elif k in ("val", "str", "opaque"):
        for x in ("pointee", "pointee_size", "count_param", "elem_size", "count_is_ptr", "len_param"):
            pr.pop(x, None)
    for ref in ("count_param", "len_param"):
        if pr.get(ref) is not None:
            assert pr[ref] in pnames, (fname, pr)
    items = sorted(pr.items(), key=lambda kv: PARAM_ORDER.index(kv[0]) if kv[0] in PARAM_ORDER else 99)
    pr.clear()
    pr.update(items)


def default_param(model, lay, types, fname, p, pname, pnames, raw, i, defaults_used):
    from pycparser import c_ast

    t = p.type
    ct = ctype_str(t)
    d = {"name": pname, "ctype": ct}
    if not isinstance(t, c_ast.PtrDecl):
        cat, tn, size = param_type_info(model, types, lay, t)
        if cat == "struct":
            d.update(kind="val", size=size, byval_struct=True, abi_class="memory" if size > 16 else "int")
        elif cat == "float":
            d.update(kind="val", size=size, float=True, abi_class="sse")
        else:
            d.update(kind="val", size=size, abi_class="int")
        return d
    d["size"] = 8
    pt = t.type
    pconst = isinstance(pt, c_ast.TypeDecl) and "const" in pt.quals
    cat, tn, psize = param_type_info(model, types, lay, pt)
    # pointee spelling without const
    if isinstance(pt, c_ast.TypeDecl):
        pointee = re.sub(r"^const ", "", ctype_str(pt))
    else:
        pointee = ctype_str(pt)
    if cat == "void":
        d.update(kind="val")
    elif cat in ("int",) and tn in ("char", "signed char", "unsigned char") and tn == "char" and pconst:
        d.update(kind="str")
    elif tn == "char" and not pconst:
        nxt = pnames[i + 1] if i + 1 < len(pnames) else ""
        if re.search(r"len|size|count", nxt, re.I) and not isinstance(raw[i + 1].type, c_ast.PtrDecl):
            d.update(kind="array_out", pointee="char", count_param=nxt, elem_size=1)
        else:
            d.update(kind="opaque")
    elif cat == "struct":
        d.update(kind="in_struct" if pconst else "out_struct", pointee=pointee, pointee_size=psize)
    elif cat == "pointer" and isinstance(pt, c_ast.PtrDecl) and ctype_str(pt.type).replace("const ", "") == "void":
        d.update(kind="opaque")  # void **: overlay decides
    else:
        cnt = find_count(pname, pnames)
        if cnt is not None:
            j = pnames.index(cnt)
            d.update(kind="array_in" if pconst else "array_out", pointee=pointee, count_param=cnt,
                     elem_size=psize)
            if isinstance(raw[j].type, c_ast.PtrDecl):
                d["count_is_ptr"] = True
        elif pconst:
            # const T * of a scalar with no count: a single input value or an array of unknown length
            d.update(kind="opaque", pointee=pointee, pointee_size=psize)
        else:
            d.update(kind="out", pointee=pointee, pointee_size=psize)
    d["abi_class"] = "int"
    return d


def find_count(pname, pnames):
    cap = pname[0].upper() + pname[1:]
    for c in ("num" + cap, "num" + cap + "s", "n" + cap, "count" + cap):
        if c in pnames and c != pname:
            return c
    return None


def classify_function(ov, name, base):
    fam, status, reason, capture, replay = "misc", "record", None, None, None
    for pat, fm in ov.FAMILY_RULES:
        if re.fullmatch(pat, base):
            fam = fm
            break
    status = ov.FAMILY_STATUS.get(fam, "record")
    for pat, st, why in ov.STATUS_RULES:
        if re.fullmatch(pat, base) or re.fullmatch(pat, name):
            status, reason = st, why
            break
    if status == "record" and reason is None:
        reason = ov.FAMILY_RECORD_REASON.get(fam, "recorded for inspection; not replayed")
    for pat, cap in ov.CAPTURE_RULES:
        if re.fullmatch(pat, base) or re.fullmatch(pat, name):
            capture = cap
            break
    replay = fam if status == "replay" else None
    return fam, status, reason, capture, replay


def replay_class(ov, name, base, status) -> str:
    """query | execute | refuse | record: what replay does with the call (overlay.REPLAY_CLASS_RULES)."""
    for pat, cls in ov.REPLAY_CLASS_RULES:
        if re.fullmatch(pat, base) or re.fullmatch(pat, name):
            return cls
    return {"replay": "execute", "refused": "refuse"}.get(status, "record")


def call_classes(ov, name, base) -> List[str]:
    """Every class of overlay.CALL_CLASS_RULES the base or ABI name matches, sorted."""
    return sorted({cls for cls, pat in ov.CALL_CLASS_RULES if re.fullmatch(pat, base) or re.fullmatch(pat, name)})


def window_class(ov, name, base) -> str:
    """work | destroy | unmap | capture_begin | capture_end | state (overlay.WINDOW_CLASS_RULES)."""
    for pat, cls in ov.WINDOW_CLASS_RULES:
        if re.fullmatch(pat, base) or re.fullmatch(pat, name):
            return cls
    return "state"


# --------------------------------------------------------------------------------------
# versions


def build_versions(model, ov, fnames):
    rep = []
    fset = set(fnames)
    # PFN typedefs: base -> {"": [(ver, sig)], "_ptds": [...], "_ptsz": [...]}
    pfn = {}
    for n, fdecl in model.pfns.items():
        m = re.fullmatch(r"PFN_(cu\w+?)_v(\d+)(_ptds|_ptsz)?", n)
        if not m:
            rep.append(f"unparsed PFN typedef {n}")
            continue
        pfn.setdefault(m.group(1), {}).setdefault(m.group(3) or "", []).append((int(m.group(2)), sig_key(model, fdecl)))
    # ABI candidates per base
    def base_of(nm):
        b = re.sub(r"_(ptds|ptsz)$", "", nm)
        return ov.BASE_OVERRIDES.get(nm, re.sub(r"_v\d+$", "", b))

    cands = {}
    for nm in fnames:
        if nm.endswith(("_ptds", "_ptsz")):
            continue
        cands.setdefault(base_of(nm), []).append(nm)

    def suffix_num(nm):
        m = re.search(r"_v(\d+)$", re.sub(r"_(ptds|ptsz)$", "", nm))
        return int(m.group(1)) if m else 1

    def pair(base, pfns, symbols, label):
        pfns = sorted(pfns)
        symbols = sorted(symbols, key=suffix_num)
        out = []
        last = -1
        for ver, sig in pfns:
            matches = [s for s in symbols if suffix_num(s) > last and sig_key(model, model.funcs[s][0]) == sig]
            if matches:
                if len(matches) > 1:
                    rep.append(f"same-signature PFN pairing (ordinal tie-break) {base}{label} v{ver}: {matches} -> {matches[0]}")
                s = matches[0]
            else:
                rest = [s for s in symbols if suffix_num(s) > last]
                if not rest:
                    rep.append(f"PFN {base}{label} v{ver}: no symbol left to pair (symbols {symbols})")
                    continue
                s = rest[0]
                rep.append(f"PFN {base}{label} v{ver}: signature matches no symbol; ordinal fallback -> {s}")
            last = suffix_num(s)
            out.append([ver, s])
        for s in symbols:
            if s not in [x[1] for x in out]:
                rep.append(f"symbol {s} has no PFN_{base}{label} typedef")
        return out

    versions = {}
    for base in sorted(set(cands) | set(pfn)):
        syms = cands.get(base, [])
        pf = pfn.get(base, {})
        if not syms:
            rep.append(f"PFN_{base} typedefs but no declared function")
            continue
        if pf.get(""):
            abi = pair(base, pf[""], syms, "")
        else:
            if base in ov.EXTRA_FUNCTIONS:      # the overlay says when the function came
                abi = [[ov.EXTRA_FUNCTIONS[base][0], s] for s in sorted(syms, key=suffix_num)]
                versions[base] = {"abi": abi, "ptds": None, "ptsz": None, "per_thread": None}
                continue
            rep.append(f"no PFN typedef for {base}: version 0 assumed for {sorted(syms, key=suffix_num)}")
            # unknown introduction version: ordinal 0, 1, 2... keeps "highest <= requested" picking
            # the newest symbol for any real CUDA version
            abi = [[k, s] for k, s in enumerate(sorted(syms, key=suffix_num))]
        for extra in ov.VERSION_EXTRA.get(base, []):
            if extra[1] in fset:
                abi.append(list(extra))
        abi.sort()
        entry = {"abi": abi, "ptds": None, "ptsz": None, "per_thread": None}
        per = []
        for suf in ("_ptds", "_ptsz"):
            psyms = [s + suf for s in syms if s + suf in fset]
            if not psyms:
                continue
            if pf.get(suf):
                got = pair(base, pf[suf], psyms, suf)
            else:
                # no PFN typedef for the per-thread variant: same version as its default twin
                got = []
                for s in psyms:
                    twin = s[: -len(suf)]
                    vv = [v for v, x in abi if x == twin]
                    got.append([vv[0] if vv else 0, s])
                    rep.append(f"no PFN_{base}_*{suf}: {s} takes the version of {twin}")
            per.extend(got)
            entry[suf[1:]] = sorted(got)[-1][1]
        if per:
            entry["per_thread"] = sorted(per)
        versions[base] = entry
    return versions, rep


if __name__ == "__main__":
    sys.exit(main())
