"""Modules, libraries and functions in the exported program: images loaded from data files,
function and kernel lookups, globals, attributes, and the function a launch names (found by
name when its lookup was not recorded).  ModuleCalls is a part of Emitter (export/emit.py): it
reads the prescan's fn records (fn_versions) and writes the emitter's slots, slot names and
data files."""
from __future__ import annotations

import os
from typing import Any, Dict, Optional, Tuple

from .ctext import c_string, lit, ref


class ModuleCalls:
    """Emitter's translation of the module, library and function calls."""

    def fn_record(self, h, seq) -> Optional[Dict[str, Any]]:
        vers = self.fn_versions.get(h)
        if not vers:
            return None
        best = vers[0][1]
        for after, fr in vers:
            if isinstance(seq, int) and after < seq:
                best = fr
        return best

    def function(self, rec, h) -> Tuple[str, str]:
        """(C expression of the function, kernel name) for a recorded CUfunction/CUkernel."""
        seq = rec.get("s")
        fr = self.fn_record(h, seq) or {}
        i = self.slots.get("function", h)
        if i is not None:
            return ref("function", i), self.slot_name.get(("function", i)) or fr.get("name") or f"{h:#x}"
        k = self.slots.get("kernel", h)
        if k is not None:
            return f"(CUfunction){ref('kernel', k)}", self.slot_name.get(("kernel", k)) or fr.get("name") or f"{h:#x}"
        name = fr.get("name")
        if not name:
            self.fail(rec, f"function handle {h:#x} is unknown (no recorded lookup and no fn record)"
                      if isinstance(h, int) else "launch without a function handle")
        self.sections.add("find_function")
        mod = fr.get("module")
        mi, li = self.slots.get("module", mod), self.slots.get("library", mod)
        i = self.slots.new("function", h)
        self.slot_name[("function", i)] = name
        self.fn_slot_src[i] = ("module" if mi is not None else "library", mod)
        nm, nl = self.slots.n.get("module", 0), self.slots.n.get("library", 0)
        self.lines.append(f"    {ref('function', i)} = find_function({c_string(name)}, mod, {nm}, lib, {nl}, "
                          f"{-1 if mi is None else mi}, {-1 if li is None else li});")
        return ref("function", i), name

    def on_fn(self, rec) -> None:
        """A newer fn record for a handle that now names another kernel: its slot is stale."""
        h = rec.get("h")
        i = self.slots.get("function", h)
        if i is not None and self.slot_name.get(("function", i)) not in (None, rec.get("name")):
            self.slots.drop("function", h)

    def image(self, rec) -> Tuple[str, int]:
        got = self.data_file("module", rec, "image", required=False)
        if got is not None:
            return got
        fname = rec["a"].get("fname") or rec["a"].get("fileName")
        if isinstance(fname, str) and os.path.isfile(fname):
            name = f"module-file-{rec.get('s')}.bin"
            self.data[name] = ("file", fname)
            self.res.notes.append(f"call #{rec.get('s')} {rec['f']}: image not in the snapshot; exported {fname} from disk")
            return name, os.path.getsize(fname)
        self.fail(rec, "the module image was not captured (no x.image blob)")

    def e_module_load(self, rec) -> None:
        name, n = self.image(rec)
        self.sections.add("modules")
        i = self.slots.new("module", rec["a"].get("module"))
        self.res.modules += 1
        self.emit(rec, f"CK(cuModuleLoadData(&{ref('module', i)}, load_image(\"{name}\", {lit(n)})));")

    def e_library_load(self, rec) -> None:
        name, n = self.image(rec)
        self.sections.add("modules")
        i = self.slots.new("library", rec["a"].get("library"))
        self.res.modules += 1
        self.emit(rec, f"CK(cuLibraryLoadData(&{ref('library', i)}, load_image(\"{name}\", {lit(n)}), "
                       f"NULL, NULL, 0, NULL, NULL, 0));")

    def _forget_functions(self, kind: str, h) -> None:
        for (k, rec_h), i in list(self.slots.map.items()):
            if k == "function" and self.fn_slot_src.get(i) == (kind, h):
                self.slots.drop("function", rec_h)
            if k == "kernel" and self.krn_slot_src.get(i) == h and kind == "library":
                self.slots.drop("kernel", rec_h)

    def e_module_unload(self, rec) -> None:
        h = rec["a"].get("hmod")
        m = self.handle(rec, "module", h)
        self.emit(rec, f"CK(cuModuleUnload({m}));", f"{m} = NULL;")
        self.slots.drop("module", h)
        self._forget_functions("module", h)

    def e_library_unload(self, rec) -> None:
        h = rec["a"].get("library")
        lb = self.handle(rec, "library", h)
        self.emit(rec, f"CK(cuLibraryUnload({lb}));", f"{lb} = NULL;")
        self.slots.drop("library", h)
        self._forget_functions("library", h)

    def _name(self, rec) -> str:
        n = rec["a"].get("name")
        if not isinstance(n, str):
            self.fail(rec, "the name string was not captured")
        return n

    def e_get_function(self, rec) -> None:
        a = rec["a"]
        name = self._name(rec)
        m = self.handle(rec, "module", a.get("hmod"))
        i = self.slots.new("function", a.get("hfunc"))
        self.slot_name[("function", i)] = name
        self.fn_slot_src[i] = ("module", a.get("hmod"))
        self.emit(rec, f"CK(cuModuleGetFunction(&{ref('function', i)}, {m}, {c_string(name)}));")

    def e_get_kernel(self, rec) -> None:
        a = rec["a"]
        name = self._name(rec)
        lb = self.handle(rec, "library", a.get("library"))
        i = self.slots.new("kernel", a.get("pKernel"))
        self.slot_name[("kernel", i)] = name
        self.krn_slot_src[i] = a.get("library")
        self.emit(rec, f"CK(cuLibraryGetKernel(&{ref('kernel', i)}, {lb}, {c_string(name)}));")

    def e_kernel_function(self, rec) -> None:
        a = rec["a"]
        k = self.slots.get("kernel", a.get("kernel"))
        if k is None:
            self.fail(rec, f"kernel {a.get('kernel')!r} was not made by a recorded call")
        i = self.slots.new("function", a.get("pFunc"))
        self.slot_name[("function", i)] = self.slot_name.get(("kernel", k), "")
        self.fn_slot_src[i] = ("library", self.krn_slot_src.get(k))
        self.emit(rec, f"CK(cuKernelGetFunction(&{ref('function', i)}, {ref('kernel', k)}));")

    def e_library_module(self, rec) -> None:
        a = rec["a"]
        lb = self.handle(rec, "library", a.get("library"))
        i = self.slots.new("module", a.get("pMod"))
        self.emit(rec, f"CK(cuLibraryGetModule(&{ref('module', i)}, {lb}));")

    def e_global(self, rec) -> None:
        a = rec["a"]
        name = self._name(rec)
        self.sections.add("globals")
        if rec["f"].startswith("cuModule"):
            call = f"cuModuleGetGlobal(&p_, &n_, {self.handle(rec, 'module', a.get('hmod'))}, {c_string(name)})"
        else:
            call = f"cuLibraryGetGlobal(&p_, &n_, {self.handle(rec, 'library', a.get('library'))}, {c_string(name)})"
        rp = a.get("dptr") or 0
        self.emit(rec, f"{{ CUdeviceptr p_; size_t n_; CK({call}); global_at({lit(rp)}, p_, n_); }}")
        if rp:
            self.space.add_global(rp, int(a.get("bytes") or 0), rp, rec.get("s"), name)

    def e_func_attr(self, rec) -> None:
        a = rec["a"]
        fexpr, _name = self.function(rec, a.get("hfunc"))
        if rec["f"].startswith("cuFuncSetCacheConfig"):
            self.emit(rec, f"CK(cuFuncSetCacheConfig({fexpr}, (CUfunc_cache){int(a.get('config', 0))}));")
        else:
            self.emit(rec, f"CK(cuFuncSetAttribute({fexpr}, (CUfunction_attribute){int(a.get('attrib', 0))}, "
                           f"{lit(int(a.get('value', 0)))}));")

    def e_kernel_attr(self, rec) -> None:
        a = rec["a"]
        k = self.handle(rec, "kernel", a.get("kernel"))
        self.emit(rec, f"CK(cuKernelSetAttribute((CUfunction_attribute){int(a.get('attrib', 0))}, "
                       f"{lit(int(a.get('val', 0)))}, {k}, g_dev));")
