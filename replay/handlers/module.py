"""Module family: modules and libraries from captured images, functions, kernels, globals."""
from __future__ import annotations

from cudasnap.formats.callset import learn_kernel_name

from ..archcheck import jit_needed, runnable
from ..errors import ReplayError
from ..functions import kernel_as_function, loadable_image, preload_functions, resolve_function
from ..replace import replacements
from ..retarget import jit_done, jit_image


def _image(ctx, rec):
    img = ctx.blob(rec, "image")
    if img is None:
        fname = rec["a"].get("fname") or rec["a"].get("fileName")
        if isinstance(fname, str):
            try:
                with open(fname, "rb") as fh:
                    img = fh.read()
                ctx.note(f"call #{rec.get('s')} {rec['f']}: image not in the snapshot; read {fname} from disk")
            except OSError:
                img = None
    if img is None:
        ctx.fail(rec, "the module image was not captured (no x.image blob)")
    return img


def _arch(ctx, rec, img, rec_mod):
    if ctx.device_cc is None:
        return
    why = runnable(img, ctx.device_cc)
    if why is None and jit_needed(img, ctx.device_cc):
        ctx.tol.add_reason(f"PTX JIT-compiled for sm_{ctx.device_cc[0]}{ctx.device_cc[1]} (the image has SASS for other GPUs only)")
    if why:
        kern = sorted({fr.get("name") for fr in ctx.fns.values() if fr.get("module") == rec_mod and fr.get("name")})
        ctx.res.arch.append(f"call #{rec.get('s')} {rec['f']} (module {rec_mod:#x}): {why}"
                           + (f"; kernels: {', '.join(kern)}" if kern else ""))


def _count_load(ctx, img) -> None:
    """A module or library loaded: counted with its image's bytes (run.timings_s)."""
    ph = ctx.res.phases
    ph["count.modules_loaded"] = ph.get("count.modules_loaded", 0) + 1
    ph["count.module_bytes"] = ph.get("count.module_bytes", 0) + len(img or b"")


def _loaded_ahead(ctx, rec, rec_h, kind: str, table) -> bool:
    """A load the job's replay made when its context came (functions.hoist_loads): taken."""
    ahead = ctx.hoisted.pop(rec.get("s"), None)
    if ahead is None:
        return False
    ctx.set_handle(rec_h, ahead[1], kind)
    table[rec_h] = ahead[1]
    return True


def _load_module(ctx, rec, img, out_key):
    rec_mod = rec["a"].get(out_key) or 0
    if _loaded_ahead(ctx, rec, rec_mod, "module", ctx.modules):
        return
    rep = replacements(ctx)
    swap = rep.module_image(rec, rec_mod) if rep else None
    if swap:
        img = swap[1]              # --replace: a rebuilt image in place of the recorded one
    else:
        img = jit_image(ctx, rec, img)             # --jit ptx: the image's PTX instead
    _arch(ctx, rec, img, rec_mod)
    fixed = loadable_image(img)
    if fixed is not img and ctx.blob(rec, "image") is not None:    # captured PTX (not one read from a file)
        img = fixed
    mod = ctx.drv(rec, "cuModuleLoadData", img)
    jit_done(ctx, rec)
    if mod is not None:
        _count_load(ctx, img)
        ctx.keepalive_images.append(img)
        ctx.set_handle(rec_mod, mod, "module")
        ctx.modules[rec_mod] = mod
        preload_functions(ctx, rec_mod, mod, library=False)
        if swap:
            rep.check_module(rec, rec_mod, mod, library=False)
    elif ctx.res.arch and rec["r"] == 0:
        pass


def module_load(ctx, rec):
    _load_module(ctx, rec, None if rec.get("s") in ctx.hoisted else _image(ctx, rec), "module")


def library_load(ctx, rec):
    rec_lib = rec["a"].get("library") or 0
    if _loaded_ahead(ctx, rec, rec_lib, "library", ctx.libraries):
        return
    img = jit_image(ctx, rec, _image(ctx, rec))     # --jit ptx: the image's PTX instead
    rep = replacements(ctx)
    swap = rep.module_image(rec, rec_lib) if rep else None
    if swap:
        img = swap[1]
    _arch(ctx, rec, img, rec_lib)
    lib = ctx.drv(rec, "cuLibraryLoadData", img, None, None, 0, None, None, 0)
    jit_done(ctx, rec)
    if lib is not None:
        _count_load(ctx, img)
        ctx.keepalive_images.append(img)
        ctx.set_handle(rec_lib, lib, "library")
        ctx.libraries[rec_lib] = lib
        preload_functions(ctx, rec_lib, lib, library=True)
        if swap:
            rep.check_module(rec, rec_lib, lib, library=True)


def _forget_functions(ctx, h) -> None:
    """Functions looked up in an unloaded module or library are gone with it."""
    for f, m in list(ctx.module_of.items()):
        if m == h:
            ctx.funcs.pop(f, None)


def module_unload(ctx, rec):
    h = rec["a"].get("hmod")
    ctx.unload(rec, "cuModuleUnload", ctx.live(rec, h, "module"))
    ctx.modules.pop(h, None)
    _forget_functions(ctx, h)


def library_unload(ctx, rec):
    h = rec["a"].get("library")
    ctx.unload(rec, "cuLibraryUnload", ctx.live(rec, h, "library"))
    ctx.libraries.pop(h, None)
    _forget_functions(ctx, h)


def _name(rec, key="name"):
    n = rec["a"].get(key)
    if not isinstance(n, str):
        rp_fail = f"call #{rec.get('s')} {rec['f']}: the {key} string was not captured"
        raise ReplayError(rp_fail)
    return n


def module_get_function(ctx, rec):
    a = rec["a"]
    name = _name(rec)
    fn = ctx.drv(rec, "cuModuleGetFunction", ctx.live(rec, a.get("hmod"), "module"), name.encode())
    rep = replacements(ctx)
    if fn is not None and rep and rep.wants(name):
        fn = rep.function(rec, name)
    if fn is not None:
        ctx.funcs[a.get("hfunc")] = fn
        ctx.func_from.pop(a.get("hfunc"), None)
        ctx.set_handle(a.get("hfunc"), fn, "function")
        learn_kernel_name(ctx.func_names, rec)
        ctx.module_of[a.get("hfunc")] = a.get("hmod")


def library_get_kernel(ctx, rec):
    a = rec["a"]
    name = _name(rec)
    k = ctx.drv(rec, "cuLibraryGetKernel", ctx.live(rec, a.get("library"), "library"), name.encode())
    rep = replacements(ctx)
    if k is not None and rep and rep.wants(name):
        k = rep.kernel(rec, name)
    if k is not None:
        ctx.set_handle(a.get("pKernel"), k, "kernel")
        ctx.funcs[a.get("pKernel")] = kernel_as_function(ctx, k)   # the runtime launches CUkernel cast to CUfunction
        learn_kernel_name(ctx.func_names, rec)
        ctx.module_of[a.get("pKernel")] = a.get("library")


def kernel_get_function(ctx, rec):
    a = rec["a"]
    fn = ctx.drv(rec, "cuKernelGetFunction", ctx.live(rec, a.get("kernel"), "kernel"))
    if fn is not None:
        ctx.funcs[a.get("pFunc")] = fn
        ctx.set_handle(a.get("pFunc"), fn, "function")
        learn_kernel_name(ctx.func_names, rec)


def library_get_module(ctx, rec):
    a = rec["a"]
    m = ctx.drv(rec, "cuLibraryGetModule", ctx.live(rec, a.get("library"), "library"))
    if m is not None:
        ctx.set_handle(a.get("pMod"), m, "module")
        ctx.modules[a.get("pMod")] = m


def get_global(ctx, rec):
    a = rec["a"]
    name = _name(rec)
    if rec["f"].startswith("cuModule"):
        out = ctx.drv(rec, "cuModuleGetGlobal", ctx.live(rec, a.get("hmod"), "module"), name.encode())
    else:
        fn = "cuLibraryGetGlobal" if "Global" in rec["f"] else "cuLibraryGetManaged"
        out = ctx.drv(rec, fn, ctx.live(rec, a.get("library"), "library"), name.encode())
    if out is None:
        return
    live, size = int(out[0]), int(out[1])
    rec_ptr = a.get("dptr")
    if isinstance(rec_ptr, int) and rec_ptr:
        ctx.space.add_global(rec_ptr, size, live, rec.get("s"), name)


def func_set_attribute(ctx, rec):
    a = rec["a"]
    f = resolve_function(ctx, rec, a.get("hfunc"))
    ctx.drv(rec, "cuFuncSetAttribute", f, ctx.cu.CUfunction_attribute(a.get("attrib", 0)), a.get("value", 0))


def kernel_set_attribute(ctx, rec):
    a = rec["a"]
    k = ctx.live(rec, a.get("kernel"), "kernel")
    ctx.drv(rec, "cuKernelSetAttribute", ctx.cu.CUfunction_attribute(a.get("attrib", 0)), a.get("val", 0), k, ctx.dev)


def func_set_cache_config(ctx, rec):
    a = rec["a"]
    f = resolve_function(ctx, rec, a.get("hfunc"))
    ctx.drv(rec, "cuFuncSetCacheConfig", f, ctx.cu.CUfunc_cache(a.get("config", 0)))
