"""Module family: modules and libraries from captured images, functions, kernels, globals."""
from __future__ import annotations

from . import handles
from ..archcheck import runnable
from ..errors import ReplayError
from ..replace import replacements
from ..retarget import jit_done, jit_image


def _image(rp, rec):
    img = rp.blob(rec, "image")
    if img is None:
        fname = rec["a"].get("fname") or rec["a"].get("fileName")
        if isinstance(fname, str):
            try:
                with open(fname, "rb") as fh:
                    img = fh.read()
                rp.note(f"call #{rec.get('s')} {rec['f']}: image not in the snapshot; read {fname} from disk")
            except OSError:
                img = None
    if img is None:
        rp.fail(rec, "the module image was not captured (no x.image blob)")
    return img


def _arch(rp, rec, img, rec_mod):
    if rp.device_cc is None:
        return
    why = runnable(img, rp.device_cc)
    if why:
        kern = sorted({fr.get("name") for fr in rp.fns.values() if fr.get("module") == rec_mod and fr.get("name")})
        rp.res.arch.append(f"call #{rec.get('s')} {rec['f']} (module {rec_mod:#x}): {why}"
                           + (f"; kernels: {', '.join(kern)}" if kern else ""))


def _load_module(rp, rec, img, out_key):
    rec_mod = rec["a"].get(out_key) or 0
    rep = replacements(rp)
    swap = rep.module_image(rec, rec_mod) if rep else None
    if swap:
        img = swap[1]              # --replace: a rebuilt image in place of the recorded one
    else:
        img = jit_image(rp, rec, img)             # --jit ptx: the image's PTX instead
    _arch(rp, rec, img, rec_mod)
    if not img.endswith(b"\0") and rp.blob(rec, "image") is not None and img[:4] != b"\x7fELF":
        img = img + b"\0"
    mod = rp.drv(rec, "cuModuleLoadData", img)
    jit_done(rp, rec)
    if mod is not None:
        rp.keepalive_images.append(img)
        rp.set_handle(rec_mod, mod, "module")
        rp.modules[rec_mod] = mod
        if swap:
            rep.check_module(rec, rec_mod, mod, library=False)
    elif rp.res.arch and rec["r"] == 0:
        pass


@handles("cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoadFatBinary", "cuModuleLoad", errors=True)
def module_load(rp, rec):
    _load_module(rp, rec, _image(rp, rec), "module")


@handles("cuLibraryLoadData", "cuLibraryLoadFromFile", errors=True)
def library_load(rp, rec):
    img = jit_image(rp, rec, _image(rp, rec))     # --jit ptx: the image's PTX instead
    rec_lib = rec["a"].get("library") or 0
    rep = replacements(rp)
    swap = rep.module_image(rec, rec_lib) if rep else None
    if swap:
        img = swap[1]
    _arch(rp, rec, img, rec_lib)
    lib = rp.drv(rec, "cuLibraryLoadData", img, None, None, 0, None, None, 0)
    jit_done(rp, rec)
    if lib is not None:
        rp.keepalive_images.append(img)
        rp.set_handle(rec_lib, lib, "library")
        rp.libraries[rec_lib] = lib
        if swap:
            rep.check_module(rec, rec_lib, lib, library=True)


def _forget_functions(rp, h) -> None:
    """Functions looked up in an unloaded module or library are gone with it."""
    for f, m in list(rp.module_of.items()):
        if m == h:
            rp.funcs.pop(f, None)


@handles("cuModuleUnload")
def module_unload(rp, rec):
    h = rec["a"].get("hmod")
    rp.drv(rec, "cuModuleUnload", rp.live(rec, h, "module"))
    rp.modules.pop(h, None)
    _forget_functions(rp, h)


@handles("cuLibraryUnload")
def library_unload(rp, rec):
    h = rec["a"].get("library")
    rp.drv(rec, "cuLibraryUnload", rp.live(rec, h, "library"))
    rp.libraries.pop(h, None)
    _forget_functions(rp, h)


def _name(rec, key="name"):
    n = rec["a"].get(key)
    if not isinstance(n, str):
        rp_fail = f"call #{rec.get('s')} {rec['f']}: the {key} string was not captured"
        raise ReplayError(rp_fail)
    return n


@handles("cuModuleGetFunction", errors=True)
def module_get_function(rp, rec):
    a = rec["a"]
    name = _name(rec)
    fn = rp.drv(rec, "cuModuleGetFunction", rp.live(rec, a.get("hmod"), "module"), name.encode())
    rep = replacements(rp)
    if fn is not None and rep and rep.wants(name):
        fn = rep.function(rec, name)
    if fn is not None:
        rp.funcs[a.get("hfunc")] = fn
        rp.func_from.pop(a.get("hfunc"), None)
        rp.set_handle(a.get("hfunc"), fn, "function")
        rp.func_names[a.get("hfunc")] = name
        rp.module_of[a.get("hfunc")] = a.get("hmod")


@handles("cuLibraryGetKernel", errors=True)
def library_get_kernel(rp, rec):
    a = rec["a"]
    name = _name(rec)
    k = rp.drv(rec, "cuLibraryGetKernel", rp.live(rec, a.get("library"), "library"), name.encode())
    rep = replacements(rp)
    if k is not None and rep and rep.wants(name):
        k = rep.kernel(rec, name)
    if k is not None:
        rp.set_handle(a.get("pKernel"), k, "kernel")
        rp.funcs[a.get("pKernel")] = rp.cu.CUfunction(int(k))   # the runtime launches CUkernel cast to CUfunction
        rp.func_names[a.get("pKernel")] = name
        rp.module_of[a.get("pKernel")] = a.get("library")


@handles("cuKernelGetFunction")
def kernel_get_function(rp, rec):
    a = rec["a"]
    fn = rp.drv(rec, "cuKernelGetFunction", rp.live(rec, a.get("kernel"), "kernel"))
    if fn is not None:
        rp.funcs[a.get("pFunc")] = fn
        rp.set_handle(a.get("pFunc"), fn, "function")
        if a.get("kernel") in rp.func_names:
            rp.func_names[a.get("pFunc")] = rp.func_names[a.get("kernel")]


@handles("cuLibraryGetModule")
def library_get_module(rp, rec):
    a = rec["a"]
    m = rp.drv(rec, "cuLibraryGetModule", rp.live(rec, a.get("library"), "library"))
    if m is not None:
        rp.set_handle(a.get("pMod"), m, "module")
        rp.modules[a.get("pMod")] = m


@handles("cuModuleGetGlobal", "cuLibraryGetGlobal", "cuLibraryGetManaged")
def get_global(rp, rec):
    a = rec["a"]
    name = _name(rec)
    if rec["f"].startswith("cuModule"):
        out = rp.drv(rec, "cuModuleGetGlobal", rp.live(rec, a.get("hmod"), "module"), name.encode())
    else:
        fn = "cuLibraryGetGlobal" if "Global" in rec["f"] else "cuLibraryGetManaged"
        out = rp.drv(rec, fn, rp.live(rec, a.get("library"), "library"), name.encode())
    if out is None:
        return
    live, size = int(out[0]), int(out[1])
    rec_ptr = a.get("dptr")
    if isinstance(rec_ptr, int) and rec_ptr:
        rp.space.add_global(rec_ptr, size, live, rec.get("s"), name)


def resolve_function(rp, rec, h):
    """Live CUfunction for a recorded function/kernel handle: from the map, else by the fn
    record's name in the loaded modules and libraries."""
    fn = rp.funcs.get(h)
    fr = rp.fn_record(h, rec.get("s"))
    if fn is not None and (h not in rp.fn_versions or rp.func_from.get(h, fr) is fr):
        return fn
    name = (fr or {}).get("name") or rp.func_names.get(h)
    if not name:
        rp.fail(rec, f"function handle {h:#x} is unknown (no cuModuleGetFunction/cuLibraryGetKernel and no fn record)"
                if isinstance(h, int) else "launch without a function handle")
    cu = rp.cu
    order = []
    mod = (fr or {}).get("module")
    rep = replacements(rp)
    if rep and rep.wants(name):          # --replace: the kernel from its rebuilt image
        if (fr or {}).get("kind") == "kernel":
            fn = cu.CUfunction(int(rep.kernel(rec, name)))
        else:
            fn = rep.function(rec, name)
    else:
        if mod in rp.modules:
            order.append(("m", rp.modules[mod]))
        if mod in rp.libraries:
            order.append(("l", rp.libraries[mod]))
        order += [("l", v) for k, v in rp.libraries.items() if k != mod]
        order += [("m", v) for k, v in rp.modules.items() if k != mod]
    for kind, obj in order:
        if kind == "m":
            r = cu.cuModuleGetFunction(obj, name.encode())
            if int(r[0]) == 0:
                fn = r[1]
                break
        else:
            r = cu.cuLibraryGetKernel(obj, name.encode())
            if int(r[0]) == 0:
                fn = cu.CUfunction(int(r[1]))
                break
    if fn is None:
        rp.fail(rec, f"kernel {name!r} not found in any loaded module or library")
    rp.funcs[h] = fn
    rp.func_from[h] = fr
    if h in rp.fn_versions:
        rp.func_names[h] = name
    else:
        rp.func_names.setdefault(h, name)
    return fn


@handles("cuFuncSetAttribute")
def func_set_attribute(rp, rec):
    a = rec["a"]
    f = resolve_function(rp, rec, a.get("hfunc"))
    rp.drv(rec, "cuFuncSetAttribute", f, rp.cu.CUfunction_attribute(a.get("attrib", 0)), a.get("value", 0))


@handles("cuKernelSetAttribute")
def kernel_set_attribute(rp, rec):
    a = rec["a"]
    k = rp.live(rec, a.get("kernel"), "kernel")
    rp.drv(rec, "cuKernelSetAttribute", rp.cu.CUfunction_attribute(a.get("attrib", 0)), a.get("val", 0), k, rp.dev)


@handles("cuFuncSetCacheConfig")
def func_set_cache_config(rp, rec):
    a = rec["a"]
    f = resolve_function(rp, rec, a.get("hfunc"))
    rp.drv(rec, "cuFuncSetCacheConfig", f, rp.cu.CUfunc_cache(a.get("config", 0)))


@handles("cuFuncSetSharedMemConfig", "cuKernelSetCacheConfig", "cuFuncSetBlockShape", "cuFuncSetSharedSize")
def func_hints(rp, rec):
    pass


@handles("cuLinkCreate", "cuLinkAddData", "cuLinkAddFile", "cuLinkComplete", "cuLinkDestroy", "cuFuncLoad")
def link_noop(rp, rec):
    # JIT linking builds an image in host memory; the module load that follows records that
    # image, so the link steps need no replay.  cuFuncLoad only loads a function early.
    pass
