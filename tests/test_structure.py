"""The package's import structure (the boundaries ARCHITECTURE-style rules name):
- no import circle inside replay/ (handlers included) nor inside replay/profile/;
- formats/ imports no other part of cudasnap (but the API description's loader);
- capture/ and replay/ never import each other;
- shim/ imports nothing from replay/.
The graph is built with ast from the source tree, counting every import statement wherever it
sits (a function-level import hides a circle from Python, not from this test)."""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, List, Optional, Set

ROOT = Path(__file__).resolve().parents[1]


def _package_dirs() -> Dict[str, Path]:
    """cudasnap package -> source folder, from pyproject's [tool.setuptools.package-dir]."""
    text = (ROOT / "pyproject.toml").read_text()
    sec = text.split("[tool.setuptools.package-dir]", 1)[1].split("\n[", 1)[0]
    out = {}
    for m in re.finditer(r'^"([\w.]+)"\s*=\s*"([^"]+)"', sec, re.M):
        out[m.group(1)] = ROOT / m.group(2)
    assert "cudasnap" in out and "cudasnap.replay" in out, "pyproject package-dir not understood"
    return out


def _modules() -> Dict[str, Optional[Path]]:
    """Every module of the package: dotted name -> file (None for the cffi extension modules
    the build scripts name in set_source: they import nothing)."""
    mods: Dict[str, Optional[Path]] = {}
    for pkg, d in _package_dirs().items():
        for f in sorted(d.glob("*.py")):
            mods[pkg if f.stem == "__init__" else f"{pkg}.{f.stem}"] = f
    for f in [p for p in mods.values() if p is not None]:
        for m in re.finditer(r'set_source\(\s*"(cudasnap\.[\w.]+)"', f.read_text()):
            mods[m.group(1)] = None
    return mods


def _is_pkg(mods, name: str) -> bool:
    return mods.get(name) is not None and mods[name].name == "__init__.py"


def _resolve(mods, name: str) -> Optional[str]:
    """The module a dotted name means: itself, or the nearest enclosing module (a name
    imported from a module)."""
    while name:
        if name in mods:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> Dict[str, Set[str]]:
    """module -> the cudasnap modules it imports (any level of the file)."""
    mods = _modules()
    g: Dict[str, Set[str]] = {}
    for mod, path in mods.items():
        if path is None:
            g[mod] = set()
            continue
        pkg = mod if _is_pkg(mods, mod) else mod.rpartition(".")[0]
        deps: Set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: List[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    frm = ".".join(base + ([node.module] if node.module else []))
                else:
                    frm = node.module or ""
                # `from pkg import sub` imports the submodule sub; `from mod import name`, mod
                targets = [f"{frm}.{a.name}" if f"{frm}.{a.name}" in mods else frm for a in node.names]
            for t in targets:
                if t.startswith("cudasnap"):
                    r = _resolve(mods, t)
                    if r is not None and r != mod:
                        deps.add(r)
        g[mod] = deps
    return g


def cycles_within(g: Dict[str, Set[str]], prefix: str) -> List[List[str]]:
    """Strongly connected components (of more than one module) of the subgraph of modules
    under `prefix` (Tarjan)."""
    nodes = [m for m in g if m == prefix or m.startswith(prefix + ".")]
    sub = {m: {d for d in g[m] if d in nodes} for m in nodes}
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    out: List[List[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(sub[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def _edges(g, src_prefix: str, dst_prefix: str) -> List[str]:
    inside = lambda m, p: m == p or m.startswith(p + ".")  # noqa: E731
    return sorted(f"{m} -> {d}" for m in g if inside(m, src_prefix) for d in g[m] if inside(d, dst_prefix))


def test_graph_sees_the_package():
    g = import_graph()
    assert "cudasnap.replay.engine" in g and "cudasnap.formats.reader" in g
    assert "cudasnap.replay._executor" in g and "cudasnap.shim._shim" in g   # cffi modules
    # replay/__init__ imports the engine only inside functions: still an edge
    assert "cudasnap.replay.engine" in g["cudasnap.replay"]


def test_no_import_circle_in_replay():
    g = import_graph()
    assert cycles_within(g, "cudasnap.replay") == []


def test_no_import_circle_in_profile():
    g = import_graph()
    assert cycles_within(g, "cudasnap.replay.profile") == []


def test_no_import_circle_in_package():
    assert cycles_within(import_graph(), "cudasnap") == []


def test_formats_imports_no_other_part():
    """Only the API description's loader (standard library only), for the record vocabulary."""
    g = import_graph()
    bad = [e for e in _edges(g, "cudasnap.formats", "cudasnap")
           if not e.split(" -> ")[1].startswith("cudasnap.formats")]
    assert bad == ["cudasnap.formats.vocab -> cudasnap.shim.description"]
    assert g["cudasnap.shim.description"] == set()


def test_capture_and_replay_never_import_each_other():
    g = import_graph()
    assert _edges(g, "cudasnap.capture", "cudasnap.replay") == []
    assert _edges(g, "cudasnap.replay", "cudasnap.capture") == []


def test_shim_imports_nothing_from_replay():
    assert _edges(import_graph(), "cudasnap.shim", "cudasnap.replay") == []


def test_handlers_never_import_the_engine():
    """Handlers see a ReplayContext (replay/context.py), not the Replayer."""
    g = import_graph()
    assert _edges(g, "cudasnap.replay.handlers", "cudasnap.replay.engine") == []
    assert _edges(g, "cudasnap.replay.context", "cudasnap.replay.engine") == []


def test_cycle_finder_finds_a_circle():
    g = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}, "q": {"p.a"}}
    assert cycles_within(g, "p") == [["p.a", "p.b", "p.c"]]
