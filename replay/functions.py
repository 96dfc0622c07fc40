"""Function resolution: the live CUfunction of a recorded function or kernel handle. Below the
handlers (launch, graph and module handlers, the batch runner and --launch-override use it)."""
from __future__ import annotations

from cudasnap.formats.cuerrors import CURESULT_CODES
from cudasnap.formats.vocab import in_class

from .replace import replacements


def resolve_function(ctx, rec, h):
    """Live CUfunction for a recorded function/kernel handle: from the map, else by the fn
    record's name in the loaded modules and libraries."""
    fn = ctx.funcs.get(h)
    fr = ctx.fn_record(h, rec.get("s"))
    if fn is not None and (h not in ctx.fn_versions or ctx.func_from.get(h, fr) is fr):
        return fn
    name = (fr or {}).get("name") or ctx.func_names.get(h)
    if not name:
        ctx.fail(rec, f"function handle {h:#x} is unknown (no cuModuleGetFunction/cuLibraryGetKernel and no fn record)"
                if isinstance(h, int) else "launch without a function handle")
    cu = ctx.cu
    order = []
    mod = (fr or {}).get("module")
    rep = replacements(ctx)
    if rep and rep.wants(name):          # --replace: the kernel from its rebuilt image
        if (fr or {}).get("kind") == "kernel":
            fn = cu.CUfunction(int(rep.kernel(rec, name)))
        else:
            fn = rep.function(rec, name)
    else:
        if mod in ctx.modules:
            order.append(("m", ctx.modules[mod]))
        if mod in ctx.libraries:
            order.append(("l", ctx.libraries[mod]))
        order += [("l", v) for k, v in ctx.libraries.items() if k != mod]
        order += [("m", v) for k, v in ctx.modules.items() if k != mod]
    for kind, obj in order:
        if kind == "m":
            r = cu.cuModuleGetFunction(obj, name.encode())
            if int(r[0]) == 0:
                fn = r[1]
                break
        else:
            r = cu.cuLibraryGetKernel(obj, name.encode())
            if int(r[0]) == 0:
                fn = kernel_as_function(ctx, r[1])
                break
    if fn is None:
        ctx.fail(rec, f"kernel {name!r} not found in any loaded module or library")
    ctx.funcs[h] = fn
    ctx.func_from[h] = fr
    if h in ctx.fn_versions:
        ctx.func_names[h] = name
    else:
        ctx.func_names.setdefault(h, name)
    return fn



def preload_functions(ctx, rec_mod, live, library: bool) -> int:
    """Loads now the functions the snapshot names in a module or library just loaded; returns
    how many.  Under lazy loading (CUDA's default) a function loads at its first launch, and
    loading may wait for the device: in a job, a collective already running waits for a peer
    that waits for this rank, and the load never returns (the program escaped that by its own
    timing).  Loaded with its module, before any launch, a function waits on nothing."""
    load = getattr(ctx.cu, "cuFuncLoad", None)
    if load is None or not isinstance(rec_mod, int) or not rec_mod:
        return 0
    # the names the program asked of it (the runtime asks a library for each kernel just before
    # its first launch), and those of functions whose fn record names this module
    names = set(ctx.names_in.get(rec_mod, ()))
    names.update(fr.get("name") for fr in ctx.fns.values() if fr.get("module") == rec_mod)
    names.update(fr.get("name") for vers in ctx.fn_versions.values() for _, fr in vers if fr.get("module") == rec_mod)
    cu, n = ctx.cu, 0
    try:
        for name in sorted(x for x in names if isinstance(x, str) and x):
            if library:
                r = cu.cuLibraryGetKernel(live, name.encode())
                if int(r[0]) == 0:
                    r = cu.cuKernelGetFunction(r[1])
                    if int(r[0]) == CURESULT_CODES["CUDA_ERROR_INVALID_CONTEXT"]:
                        break                             # none current yet: see preload_in
            else:
                r = cu.cuModuleGetFunction(live, name.encode())
            if int(r[0]) == 0 and int(load(r[1])[0]) == 0:
                n += 1
    except (RuntimeError, TypeError):     # a driver or binding without the call: loaded at launch
        pass
    return n


def loadable_image(img: bytes) -> bytes:
    """A captured module image as cuModuleLoadData takes it: PTX text ends with a NUL."""
    return img if img.endswith(b"\0") or img[:4] == b"\x7fELF" else img + b"\0"


def _hoisting(ctx) -> bool:
    """Loads go ahead only in a job's replay, and not with --replace or --jit (whose images
    are made at the load)."""
    if replacements(ctx) or getattr(ctx.opt, "jit", None):
        return False
    try:
        return ctx.group_client() is not None
    except OSError:                      # no coordinator to reach: its own error comes at the link
        return False


def hoist_loads(ctx, in_context: bool) -> None:
    """In a job's replay, every library and module the program loads later loads now, when a
    context first becomes the program's, so that their kernels load before any launch: code
    the program loads mid-run (the runtime at a kernel's first use, XLA with each new
    executable) would load its kernels while a collective of this rank runs, waiting for a peer
    that waits for this rank to pass that load. The recorded load then takes what was loaded
    here (handlers/module). Libraries belong to no context; modules load into the current one
    (in_context), and only where the snapshot has one context, so it is the one they were
    loaded in."""
    if not ctx.code_loads:
        return
    if not _hoisting(ctx):
        ctx.code_loads = []              # loads run at their turn: the pre-scan's list is not needed
        return
    one_context = len(ctx.ctx_ids) <= 1
    keep = []
    for rec in ctx.code_loads:
        library = in_class(rec.get("f"), "loads_library")
        if not library and not (in_context and one_context):
            keep.append(rec)
            continue
        img = ctx.blob(rec, "image")
        if img is None:
            continue                     # read from its file at the load, as recorded
        if library:
            r = ctx.cu.cuLibraryLoadData(img, None, None, 0, None, None, 0)
        else:
            img = loadable_image(img)
            r = ctx.cu.cuModuleLoadData(img)
        if int(r[0]) == 0:               # else the load fails at its turn, as the handler reports
            ctx.keepalive_images.append(img)
            a = rec.get("a") or {}
            ctx.hoisted[rec["s"]] = (a.get("library" if library else "module") or 0, r[1], library)
    ctx.code_loads = keep


def preload_in(ctx, live_ctx) -> None:
    """The runtime loads libraries before any context exists, so their kernels could not load
    with them: they load in a context when the program retains or creates it (after any flags
    it set), made current for the loads only. In a job, so do the libraries and modules loaded
    later (hoist_loads)."""
    if live_ctx is None:
        return
    try:
        key = int(live_ctx)
    except (TypeError, ValueError):      # a stand-in driver's context object
        return
    hoist_loads(ctx, in_context=False)
    if int(ctx.cu.cuCtxPushCurrent(live_ctx)[0]) != 0:
        return
    try:
        hoist_loads(ctx, in_context=True)
        done = ctx.preloaded_in.setdefault(key, set())
        todo = [(h, h, lib, True) for h, lib in ctx.libraries.items() if h not in done]
        todo += [(("s", s), h, live, library) for s, (h, live, library) in ctx.hoisted.items()
                 if ("s", s) not in done]
        for token, h, live, library in todo:
            preload_functions(ctx, h, live, library=library)
            done.add(token)
    finally:
        ctx.cu.cuCtxPopCurrent()


_BOUND: dict = {}           # library kernel handle -> the CUfunction it got (until forget_live)
_LIBRARY_KERNELS: set = set()
UNBOUND: dict = {}          # library kernel handle -> the error cuKernelGetFunction last returned


def kernel_as_function(ctx, k):
    """A library kernel (CUkernel) cast to CUfunction, as the runtime launches it; remembered,
    so that bound_function knows it."""
    _LIBRARY_KERNELS.add(int(k))
    return ctx.cu.CUfunction(int(k))


def why_unbound(fn) -> str:
    """' (cuKernelGetFunction returned CODE)' for a library kernel that got no CUfunction, else ''."""
    code = UNBOUND.get(int(fn)) if fn is not None else None
    if code is None:
        return ""
    from cudasnap.formats import cu_result_name
    return f" (a library kernel: cuKernelGetFunction returned {cu_result_name(code)})"


def forget_live() -> None:
    """Forget the live functions of library kernels: the replay that made them has ended
    (Replayer.close) and another may run in this process."""
    _BOUND.clear()
    _LIBRARY_KERNELS.clear()
    UNBOUND.clear()


def bound_function(ctx, fn):
    """The current context's CUfunction of a library kernel (a CUkernel handed around as a
    CUfunction launches in whatever context is current, which a stream capture on the
    replayer's thread may not match); any other function as it is."""
    key = int(fn)
    if key not in _LIBRARY_KERNELS:
        return fn
    got = _BOUND.get(key)
    if got is None:
        cu = ctx.cu
        try:
            r = cu.cuKernelGetFunction(cu.CUkernel(key))
        except RuntimeError:            # a driver without library kernels
            r = (1, None)
        if int(r[0]) != 0:
            UNBOUND[key] = int(r[0])
            return fn                   # not remembered: a later call (another context current) may get it
        got = _BOUND[key] = r[1]
    return got
