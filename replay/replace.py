"""Swap a kernel or a module for a rebuilt image on replay (`replay --replace TARGET=FILE`,
or the environment: CUDASNAP_REPLACE="TARGET=FILE[;TARGET=FILE...]").

TARGET is
- a kernel name as recorded (`cudasnap dump SNAPSHOT --calls module` shows them; C++ names
  are mangled): launches of that kernel use the kernel of the same name in FILE, every other
  kernel of its module stays the recorded one;
- `module:KERNEL`: the whole recorded module (or library) that holds KERNEL is loaded from FILE;
- a recorded module or library handle (`0x...`, as `dump` prints the load's output): that
  module is loaded from FILE.

FILE is a cubin, fatbin or PTX (anything cuModuleLoadData/cuLibraryLoadData accepts). The
rebuilt image must keep each replaced kernel's parameter layout, since replay passes the
recorded parameter bytes: the count, offsets and sizes reported by cuFuncGetParamInfo
(cuKernelGetParamInfo for library kernels) must equal the recorded fn records' `params`;
a module's image must hold every kernel the recorded module provided. Anything else stops
the replay (exit 2) naming the kernel and both layouts. Environment entries come first; a
--replace of the same TARGET wins."""
from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional, Tuple

from cudasnap.formats.vocab import code_lookup, in_class

from .errors import ReplayError

ENV = "CUDASNAP_REPLACE"
_HEX = re.compile(r"^0x[0-9a-fA-F]+$")


def parse_specs(specs: List[str], where: str = "--replace") -> List[Tuple[str, str]]:
    """[(target, file)]; raises ValueError naming a malformed spec (where: the option or the
    environment variable it came from)."""
    out: Dict[str, str] = {}
    for sp in specs:
        sp = sp.strip()
        if not sp:
            continue
        target, eq, path = sp.rpartition("=")
        if not eq or not target or not path:
            raise ValueError(f"{where} {sp!r}: expected KERNEL=FILE, module:KERNEL=FILE or 0xMODULE=FILE"
                             + (" (entries separated by ';')" if where == ENV else ""))
        out[target.strip()] = path.strip()
    return list(out.items())


def env_specs() -> List[str]:
    return [s for s in os.environ.get(ENV, "").split(";") if s.strip()]


def effective_specs(opts) -> List[str]:
    """The environment's specs, then the options' (a later one of the same target wins)."""
    return env_specs() + list(getattr(opts, "replace", None) or [])


def check_specs(opts) -> Optional[str]:
    """A one-line error for malformed specs or unreadable files, before replay starts, naming
    where the spec came from (--replace or CUDASNAP_REPLACE)."""
    for where, specs in ((ENV, env_specs()), ("--replace", list(getattr(opts, "replace", None) or []))):
        try:
            pairs = parse_specs(specs, where)
        except ValueError as e:
            return str(e)
        for target, path in pairs:
            if os.path.isdir(path):
                return f"{where} {target}={path}: a directory; give a cubin, fatbin or PTX file"
            if not os.path.isfile(path):
                return f"{where} {target}={path}: no such file"
    return None


def _read_image(path: str) -> bytes:
    with open(path, "rb") as f:
        img = f.read()
    # cubins (ELF) and fatbins are binary; PTX is text the driver wants NUL-terminated
    if img[:4] != b"\x7fELF" and img[:4] != b"\x50\xed\x55\xba" and not img.endswith(b"\0"):
        img += b"\0"
    return img


def _fmt(layout) -> str:
    return "[" + ", ".join(f"{o}:{s}" for o, s in layout) + "]" if layout is not None else "unknown"


class Replacements:
    """The replay's swaps, resolved against the snapshot's fn records on first use."""

    def __init__(self, ctx, pairs: List[Tuple[str, str]]):
        self.ctx = ctx
        self.kernels: Dict[str, str] = {}          # kernel name -> file
        self.modules: Dict[int, str] = {}          # recorded module/library handle -> file
        self.targets: Dict[int, str] = {}          # recorded module/library handle -> its --replace target
        self.images: Dict[str, bytes] = {}
        self._mod: Dict[str, Any] = {}             # file -> live module holding swapped kernels
        self._lib: Dict[str, Any] = {}             # file -> live library
        self._fn: Dict[str, Any] = {}              # kernel name -> live CUfunction (module path)
        self._kern: Dict[str, Any] = {}            # kernel name -> live CUkernel (library path)
        self.applied: List[str] = []
        self._lookups: Optional[Dict[int, List[str]]] = None
        names: Dict[str, List[int]] = {}
        for fr in self._fn_records():
            if fr.get("name"):
                names.setdefault(fr["name"], []).append(fr.get("module"))
        for target, path in pairs:
            try:
                self.images[path] = _read_image(path)
            except OSError as e:
                raise_error(ctx, f"--replace {target}={path}: cannot read: {e.strerror or e}")
            if _HEX.match(target):
                self.modules[int(target, 16)] = path
                self.targets[int(target, 16)] = target
            elif target.startswith("module:"):
                k = target[len("module:"):]
                mods = self._holders(k)
                if not mods:
                    raise_error(ctx, f"--replace {target}: no recorded cuModuleGetFunction or cuLibraryGetKernel "
                                    f"of a kernel {k!r}" + _known(names))
                for m in mods:
                    self.modules[m] = path
                    self.targets[m] = target
            else:
                if target not in names:
                    raise_error(ctx, f"--replace {target}: no recorded kernel of that name" + _known(names))
                self.kernels[target] = path

    def _holders(self, kernel: str) -> List[int]:
        """Recorded modules and libraries a kernel of this name was taken from."""
        out: List[int] = []
        for fr in self._fn_records():
            m = fr.get("module")
            if fr.get("name") == kernel and isinstance(m, int) and m and m not in out:
                out.append(m)
        for m, names in self._looked_up().items():
            if kernel in names and m not in out:
                out.append(m)
        return out

    def _looked_up(self) -> Dict[int, List[str]]:
        """Recorded module/library handle -> names of the kernels the program looked up in it
        (CUkernels carry no module in their fn records: the lookups say where they came from)."""
        if self._lookups is None:
            self._lookups = {}
            from .codecalls import code_calls
            for rec in code_calls(self.ctx.reader):
                f = rec.get("f") or ""
                if in_class(f, "asks_by_name"):
                    a = rec.get("a") or {}
                    m = a.get((code_lookup(f) or ("", ""))[1])
                    if isinstance(m, int) and m and isinstance(a.get("name"), str):
                        names = self._lookups.setdefault(m, [])
                        if a["name"] not in names:
                            names.append(a["name"])
        return self._lookups

    def _fn_records(self):
        ctx = self.ctx
        for fr in ctx.fns.values():
            yield fr
        for vers in ctx.fn_versions.values():
            for _seq, fr in vers[1:]:
                yield fr

    def recorded_layout(self, name: str, module=None):
        for fr in self._fn_records():
            if fr.get("name") == name and (module is None or fr.get("module") == module) \
                    and isinstance(fr.get("params"), list):
                return [tuple(p) for p in fr["params"]]
        return None

    # ------------------------------------------------------------------ layout checks
    def _layout(self, query, handle) -> List[Tuple[int, int]]:
        out = []
        for i in range(4096):
            r = query(handle, i)
            if int(r[0]) != 0:
                break
            out.append((int(r[1]), int(r[2])))
        return out

    def _check(self, rec, what: str, name: str, recorded, query, handle) -> None:
        ctx = self.ctx
        try:
            new = self._layout(query, handle)
        except Exception as e:  # bindings without cuFuncGetParamInfo (CUDA < 12.4)
            ctx.note(f"--replace {what}: parameter layout of {name} not checked ({type(e).__name__}: {e})")
            return
        if recorded is None:
            ctx.note(f"--replace {what}: the snapshot holds no parameter layout for {name}; "
                    f"not checked (new image: {_fmt(new)})")
            return
        if new != list(recorded):
            ctx.fail(rec, f"--replace {what}: parameter layout of kernel {name} differs: recorded "
                         f"{len(recorded)} parameter(s) {_fmt(recorded)}, the new image has {len(new)} {_fmt(new)} "
                         f"(offset:size); the recorded parameter bytes would not fit it")

    # ------------------------------------------------------------------ modules replaced whole
    def module_image(self, rec, rec_mod) -> Optional[Tuple[str, bytes]]:
        path = self.modules.get(rec_mod)
        return (path, self.images[path]) if path else None

    def _module_kernels(self, rec_mod):
        seen = {}
        for fr in self._fn_records():
            if fr.get("module") == rec_mod and fr.get("name") and fr["name"] not in seen:
                seen[fr["name"]] = fr.get("params")
        for name in self._looked_up().get(rec_mod, []):
            if name not in seen:
                seen[name] = self.recorded_layout(name)
        return seen

    def check_module(self, rec, rec_mod, live, library: bool) -> None:
        """Every kernel the recorded module provided is in the new one, with its layout."""
        ctx = self.ctx
        cu = ctx.cu
        path = self.modules[rec_mod]
        what = f"{self.targets.get(rec_mod, hex(rec_mod))}={path}"
        kernels = self._module_kernels(rec_mod)
        for name, params in kernels.items():
            if library:
                r = cu.cuLibraryGetKernel(live, name.encode())
                query = cu.cuKernelGetParamInfo
            else:
                r = cu.cuModuleGetFunction(live, name.encode())
                query = cu.cuFuncGetParamInfo
            if int(r[0]) != 0:
                ctx.fail(rec, f"--replace {what}: the new image has no kernel {name} (recorded module {rec_mod:#x} had it)")
            self._check(rec, what, name, [tuple(p) for p in params] if isinstance(params, list) else None,
                        query, r[1])
        if not kernels:
            ctx.note(f"--replace {what}: the recording names no kernel of module {rec_mod:#x} (no lookup, "
                    f"no fn record): parameter layouts not checked")
        self.applied.append(f"module {rec_mod:#x} loaded from {path} ({len(kernels)} kernel(s) checked)")
        ctx.note(f"--replace: module {rec_mod:#x} loaded from {path}; parameter layouts of "
                f"{len(kernels)} kernel(s) match the recording")

    # ------------------------------------------------------------------ single kernels
    def wants(self, name: Optional[str]) -> bool:
        return bool(name) and name in self.kernels

    def function(self, rec, name: str):
        """Live CUfunction of kernel `name` from its replacement image (module path)."""
        fn = self._fn.get(name)
        if fn is not None:
            return fn
        ctx = self.ctx
        cu = ctx.cu
        path = self.kernels[name]
        mod = self._mod.get(path)
        if mod is None:
            r = cu.cuModuleLoadData(self.images[path])
            if int(r[0]) != 0:
                ctx.fail(rec, f"--replace {name}={path}: cuModuleLoadData failed: {_err(cu, r[0])}")
            mod = self._mod[path] = r[1]
        r = cu.cuModuleGetFunction(mod, name.encode())
        if int(r[0]) != 0:
            ctx.fail(rec, f"--replace {name}={path}: the new image has no kernel {name} ({_err(cu, r[0])})")
        self._check(rec, f"{name}={path}", name, self.recorded_layout(name), cu.cuFuncGetParamInfo, r[1])
        self._fn[name] = r[1]
        self._applied_kernel(name, path)
        return r[1]

    def kernel(self, rec, name: str):
        """Live CUkernel of kernel `name` from its replacement image (library path)."""
        k = self._kern.get(name)
        if k is not None:
            return k
        ctx = self.ctx
        cu = ctx.cu
        path = self.kernels[name]
        lib = self._lib.get(path)
        if lib is None:
            r = cu.cuLibraryLoadData(self.images[path], None, None, 0, None, None, 0)
            if int(r[0]) != 0:
                ctx.fail(rec, f"--replace {name}={path}: cuLibraryLoadData failed: {_err(cu, r[0])}")
            lib = self._lib[path] = r[1]
        r = cu.cuLibraryGetKernel(lib, name.encode())
        if int(r[0]) != 0:
            ctx.fail(rec, f"--replace {name}={path}: the new image has no kernel {name} ({_err(cu, r[0])})")
        self._check(rec, f"{name}={path}", name, self.recorded_layout(name), cu.cuKernelGetParamInfo, r[1])
        self._kern[name] = r[1]
        self._applied_kernel(name, path)
        return r[1]

    def _applied_kernel(self, name, path) -> None:
        msg = f"kernel {name} from {path}"
        if msg not in self.applied:
            self.applied.append(msg)
            self.ctx.note(f"--replace: {msg}; its parameter layout matches the recording")


def _known(names: Dict[str, Any]) -> str:
    ks = sorted(names)
    return f" (recorded kernels: {', '.join(ks[:12])}{', ...' if len(ks) > 12 else ''})" if ks else " (no kernels recorded)"


def _err(cu, code) -> str:
    try:
        from cudasnap.formats.cuerrors import cu_result_name
        return cu_result_name(int(code))
    except Exception:
        return str(int(code))


def raise_error(ctx, msg: str) -> None:
    raise ReplayError(msg)


def replacements(ctx) -> Optional[Replacements]:
    """The replayer's Replacements (None when nothing is replaced); built on first use, after
    the first pass over the records has collected the fn records."""
    r = ctx.replacements
    if r is False:
        try:
            pairs = parse_specs(effective_specs(ctx.opt))
        except ValueError as e:
            raise_error(ctx, str(e))
        r = Replacements(ctx, pairs) if pairs else None
        ctx.replacements = r
    return r
