"""Build the cudasnap CUDA driver TEST DOUBLE and its test programs.

The double (libcuda.so.1, soname libcuda.so.1, plus a libcuda.so symlink) is a
test fixture for CI without a GPU; it is never shipped or installed.

    from tests.double.build import build
    paths = build(outdir)
    paths["libdir"]       # directory to put on LD_LIBRARY_PATH
    paths["lib"]          # .../libcuda.so.1
    paths["progs"]        # {"direct": ".../direct", ...}
    paths["module"]       # a module image file naming every built-in kernel
    paths["include"]      # directory holding cuda_double.h
    paths["cuda_include"] # directory holding a cuda.h that includes it (for -I)

Rebuilds only what is older than its sources (mtime).  Run as a script:
    python tests/double/build.py OUTDIR
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
LIB_SOURCES = ["libcuda_double.c", "double_launch.c", "double_proc.c", "double_texture.c"]
HEADERS = ["cuda_double.h", "double_internal.h"]

# program name -> how it reaches the driver: "link" (-lcuda against the double) or "dlopen"
PROGRAMS = {
    "simprog": "link",
    "direct": "link",
    "capwin": "link",
    "viadlsym": "dlopen",
    "viaproc": "dlopen",
    "threads": "link",
    "child": "link",
    "killme": "link",
    "nocuda": "none",
    "chase": "link",
    "carve": "link",
    "manymods": "link",
    "launch_forms": "link",
    "bigcopy": "link",
    "memops": "link",
    "texture": "link",
    "queries": "link",
    "reload": "link",
    "unified": "link",
    "sigwait": "link",
    "nvtx_client": "link",
    "share": "link",
    "pair": "link",
    "ipc": "link",
    "peer": "link",
    "windowed": "link",
    "graphnodes": "link",
    "capnodes": "link",
    "managed": "link",
    "hostfree": "link",
    "batch": "link",
    "tagged": "link",
    "capex": "link",
}

MODULE_TEXT = "CUDADOUBLE\nkernel add_one\nkernel fill\nkernel saxpy\nkernel chase\nkernel incr\nkernel spin\n"

CFLAGS = ["-O1", "-g", "-Wall", "-Wextra", "-Wno-unused-parameter", "-std=gnu11"]


def _stale(target: Path, sources: list[Path]) -> bool:
    if not target.exists():
        return True
    t = target.stat().st_mtime
    return any(s.stat().st_mtime > t for s in sources)


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"build failed: {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")


def build(outdir) -> dict:
    """Compile the double and the programs into outdir; returns a dict of paths (see module doc)."""
    out = Path(outdir).resolve()
    libdir = out / "lib"
    bindir = out / "bin"
    libdir.mkdir(parents=True, exist_ok=True)
    bindir.mkdir(parents=True, exist_ok=True)
    cc = os.environ.get("CC", "gcc")
    headers = [HERE / h for h in HEADERS]

    lib = libdir / "libcuda.so.1"
    lib_srcs = [HERE / s for s in LIB_SOURCES]
    if _stale(lib, lib_srcs + headers + [Path(__file__)]):
        tmp = libdir / f".libcuda.so.1.{os.getpid()}"
        _run([cc, *CFLAGS, "-shared", "-fPIC", "-fvisibility=hidden", "-Wl,-soname,libcuda.so.1",
              "-o", str(tmp), *map(str, lib_srcs), "-lpthread"])
        os.replace(tmp, lib)
    link = libdir / "libcuda.so"
    if not link.is_symlink():
        if link.exists():
            link.unlink()
        try:
            link.symlink_to("libcuda.so.1")
        except FileExistsError:
            pass

    progs = {}
    for name, mode in PROGRAMS.items():
        src = HERE / "progs" / f"{name}.c"
        exe = bindir / name
        progs[name] = str(exe)
        deps = [src, HERE / "cuda_double.h", HERE / "progs" / "common.h", HERE / "progs" / "fdpass.h"]
        if mode == "link":
            deps.append(lib)
        if not _stale(exe, deps):
            continue
        cmd = [cc, *CFLAGS, f"-I{HERE}", f"-I{HERE / 'progs'}", "-o", str(exe) + ".tmp", str(src)]
        if mode == "link":
            cmd += [f"-L{libdir}", "-lcuda"]
        cmd += ["-ldl", "-lpthread"]
        _run(cmd)
        os.replace(str(exe) + ".tmp", exe)

    module = out / "kernels.cudadouble"
    if not module.exists() or module.read_text() != MODULE_TEXT:
        module.write_text(MODULE_TEXT)

    return {
        "outdir": str(out),
        "libdir": str(libdir),
        "lib": str(lib),
        "bindir": str(bindir),
        "progs": progs,
        "module": str(module),
        "module_text": MODULE_TEXT,
        "include": str(HERE),
        "cuda_include": str(HERE / "include"),
    }


def env_for(paths: dict, base: dict | None = None) -> dict:
    """An environment whose dynamic loader finds the double first."""
    env = dict(os.environ if base is None else base)
    old = env.get("LD_LIBRARY_PATH", "")
    env["LD_LIBRARY_PATH"] = paths["libdir"] + (os.pathsep + old if old else "")
    return env


if __name__ == "__main__":
    import json

    print(json.dumps(build(sys.argv[1] if len(sys.argv) > 1 else "build/double"), indent=2))
