"""The package's structure:
- no import circle in the package (handlers, profilers included), nor between its top-level parts;
- layers: formats/shim, then capture/replay, then export/compare, then campaign/advise, then the
  command line; nothing imports upward, and formats/ imports no other part but the API
  description's loader; capture/ and replay/ never import each other; handlers see the context,
  never the engine;
- no private name imported across modules;
- one definition of each record predicate (formats/vocab.py);
- replay subscribers (profilers, hooks, extract's tap) see the replay's view (replay/view.py),
  never the Replayer;
- every file of bench/ named in bench/README.md.
The graph is built with ast from the source tree, counting every import statement wherever it
sits (a function-level import hides a circle from Python, not from this test)."""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

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


_TREES: Dict[Tuple[str, str], ast.Module] = {}


def _parse(path: Path, text: Optional[str] = None) -> ast.Module:
    """The file's syntax tree, parsed once per test process (the tests only read trees): a dozen
    tests walk the whole package."""
    text = path.read_text() if text is None else text
    key = (str(path), text)
    if key not in _TREES:
        _TREES[key] = ast.parse(text, str(path))
    return _TREES[key]


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
    """module -> the cudasnap modules it imports (any level of the file); a copy of one graph
    per test process."""
    global _GRAPH
    if _GRAPH is None:
        _GRAPH = _import_graph()
    return {m: set(d) for m, d in _GRAPH.items()}


_GRAPH: Optional[Dict[str, Set[str]]] = None


def _import_graph() -> Dict[str, Set[str]]:
    mods = _modules()
    g: Dict[str, Set[str]] = {}
    for mod, path in mods.items():
        if path is None:
            g[mod] = set()
            continue
        pkg = mod if _is_pkg(mods, mod) else mod.rpartition(".")[0]
        deps: Set[str] = set()
        for node in ast.walk(_parse(path)):
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
    """Only the API description's loader (standard library only), for the record vocabulary and
    the struct layouts."""
    g = import_graph()
    bad = [e for e in _edges(g, "cudasnap.formats", "cudasnap")
           if not e.split(" -> ")[1].startswith("cudasnap.formats")]
    assert sorted(bad) == ["cudasnap.formats.layout -> cudasnap.shim.description",
                           "cudasnap.formats.vocab -> cudasnap.shim.description"]
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
    # the group coordinator, the events and the profilers are above them: reached through the context
    for above in ("cudasnap.replay.group", "cudasnap.replay.events", "cudasnap.replay.profile"):
        assert _edges(g, "cudasnap.replay.handlers", above) == [], above


def test_cycle_finder_finds_a_circle():
    g = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}, "q": {"p.a"}}
    assert cycles_within(g, "p") == [["p.a", "p.b", "p.c"]]


# ------------------------------------------------------------------ layers
# lowest first; a module may import its own layer or a lower one (capture and replay, siblings,
# never each other: test above). The root package (cli/) is the command line, the top.
LAYERS = (("cudasnap.formats", "cudasnap.shim"), ("cudasnap.capture", "cudasnap.replay"),
          ("cudasnap.export", "cudasnap.compare"), ("cudasnap.campaign", "cudasnap.advise"), ("cudasnap",))


def layer_of(mod: str) -> int:
    for i, prefixes in reversed(list(enumerate(LAYERS))):
        if any(mod == p or mod.startswith(p + ".") for p in prefixes if p != "cudasnap"):
            return i
    return len(LAYERS) - 1          # cudasnap itself and the modules of cli/


def upward_imports(g: Dict[str, Set[str]]) -> List[str]:
    return sorted(f"{m} -> {d}" for m in g for d in g[m] if layer_of(d) > layer_of(m))


# Existing upward imports, each to be removed, never added to: this list only shrinks.
UPWARD_ALLOWED: Set[str] = set()


def test_no_import_from_a_lower_layer_to_a_higher_one():
    assert layer_of("cudasnap.replay.handlers.ipc") == 1 and layer_of("cudasnap.cli") == 4
    assert layer_of("cudasnap") == 4 and layer_of("cudasnap.shim.description") == 0
    assert layer_of("cudasnap.campaign.bisect") == 3 > layer_of("cudasnap.compare.core") == 2
    up = upward_imports(import_graph())
    assert sorted(set(up) - UPWARD_ALLOWED) == [], "an import from a lower layer to a higher one"
    assert sorted(UPWARD_ALLOWED - set(up)) == [], "gone: take it off UPWARD_ALLOWED"


def part_of(mod: str) -> str:
    """The top-level part a module belongs to: cudasnap.replay.engine -> replay; the modules of
    the package root (the command line) -> cli."""
    parts = mod.split(".")
    pkgs = {p.split(".")[1] for p in _package_dirs() if p.count(".") == 1}
    return parts[1] if len(parts) > 1 and parts[1] in pkgs else "cli"


def test_no_cycle_between_top_level_parts():
    """campaign sits on compare, compare and export on replay, replay on formats: the parts
    import one way (a function-level import counts too)."""
    g = import_graph()
    parts: Dict[str, Set[str]] = {}
    for m, deps in g.items():
        if not m.startswith("cudasnap"):
            continue
        a = part_of(m)
        for d in deps:
            if d.startswith("cudasnap") and part_of(d) != a:
                parts.setdefault(a, set()).add(part_of(d))
    assert cycles_within({f"p.{k}": {f"p.{x}" for x in v} for k, v in parts.items()}, "p") == []
    assert "campaign" not in parts.get("compare", set())


def test_version_and_console_come_from_below():
    """capture, replay, export and compare reach the version and the console through
    formats/console.py, never through the package root (the command line)."""
    g = import_graph()
    for layer in ("cudasnap.capture", "cudasnap.replay", "cudasnap.export", "cudasnap.compare"):
        assert [e for e in _edges(g, layer, "cudasnap") if layer_of(e.split(" -> ")[1]) == 3] == []


# ------------------------------------------------------------------ handlers are a leaf
# Imports of replay/handlers/ from outside it and the dispatcher: none (function resolution,
# launch parameters and notes live below the handlers). This list only shrinks.
HANDLER_IMPORTS_ALLOWED: Set[str] = set()


def handler_imports(g: Dict[str, Set[str]]) -> List[str]:
    inside = ("cudasnap.replay.handlers", "cudasnap.replay.dispatch")
    return sorted(e for e in _edges(g, "cudasnap", "cudasnap.replay.handlers")
                  if not e.split(" -> ")[0].startswith(inside))


def test_handlers_are_imported_only_by_the_dispatcher():
    found = handler_imports(import_graph())
    assert sorted(set(found) - HANDLER_IMPORTS_ALLOWED) == [], "a new import of replay/handlers/"
    assert sorted(HANDLER_IMPORTS_ALLOWED - set(found)) == [], "gone: take it off HANDLER_IMPORTS_ALLOWED"


# ------------------------------------------------------------------ private names stay home
def private_imports() -> List[str]:
    """'module -> other._name' for every private name (one leading underscore) a module takes
    from another cudasnap module: `from other import _name`, or `other._name` on a module it
    imported."""
    mods = _modules()
    out: Set[str] = set()
    for mod, path in mods.items():
        if path is None:
            continue
        pkg = mod if _is_pkg(mods, mod) else mod.rpartition(".")[0]
        tree = _parse(path)
        bound: Dict[str, str] = {}           # local name -> cudasnap module it is
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    frm = ".".join(base + ([node.module] if node.module else []))
                else:
                    frm = node.module or ""
                if not frm.startswith("cudasnap"):
                    continue
                for a in node.names:
                    full = f"{frm}.{a.name}"
                    if full in mods:
                        bound[a.asname or a.name] = full
                    elif a.name.startswith("_") and not a.name.startswith("__") and _resolve(mods, frm) != mod:
                        out.add(f"{mod} -> {_resolve(mods, frm)}.{a.name}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("cudasnap") and a.asname and a.name in mods:
                        bound[a.asname] = a.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in bound and node.attr.startswith("_") and not node.attr.startswith("__")
                    and bound[node.value.id] != mod and f"{bound[node.value.id]}.{node.attr}" not in mods):
                out.add(f"{mod} -> {bound[node.value.id]}.{node.attr}")
    return sorted(out)


# Existing ones, each to be made public or moved home: this list only shrinks.
PRIVATE_ALLOWED: Set[str] = set()


def test_no_private_name_imported_across_modules():
    found = private_imports()
    print(f"{len(found)} private names imported across modules (allowed: {len(PRIVATE_ALLOWED)})")
    assert sorted(set(found) - PRIVATE_ALLOWED) == [], "a private name imported across modules"
    assert sorted(PRIVATE_ALLOWED - set(found)) == [], "gone: take it off PRIVATE_ALLOWED"


# ------------------------------------------------------------------ one vocabulary
def test_one_definition_of_each_vocabulary_predicate():
    """What a call record is (formats/vocab.py) is defined there only: no module defines a
    function of the same name, private or not, nor the old aliases."""
    vocab = _parse(ROOT / "formats" / "vocab.py")
    names = {n.name for n in vocab.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}
    assert {"is_launch", "is_query", "is_graph_launch", "is_workload", "alloc_range", "replay_class",
            "family"} <= names
    banned = names | {f"_{n}" for n in names} | {"is_launch_call", "is_data_work"}
    found = []
    for mod, path in _modules().items():
        # gen_api computes each name's class when it writes the description vocab.py reads
        if path is None or mod in ("cudasnap.formats.vocab", "cudasnap.shim.gen_api"):
            continue
        for node in ast.walk(_parse(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in banned:
                found.append(f"{mod}.{node.name}")
    assert found == []


def test_bench_index_names_every_file():
    index = (ROOT / "bench" / "README.md").read_text()
    files = [p.relative_to(ROOT / "bench").as_posix() for p in (ROOT / "bench").rglob("*")
             if p.is_file() and "__pycache__" not in p.parts and p.name not in ("README.md", "RESULTS.md")]
    assert files and [f for f in sorted(files) if f"`{f}`" not in index] == []


# ------------------------------------------------------------------ export's emitter, in parts
EMITTER_PARTS = ("emit", "emit_context", "emit_memory", "emit_module", "emit_launch", "emit_stream", "program",
                 "ctext", "table", "result")


def test_emitter_is_put_together_from_parts():
    """Emitter (export/emit.py) inherits one part per job; no method is defined by two of them
    (one would hide the other), every TABLE entry names a method exactly one defines, and no
    part passes ~600 lines."""
    from cudasnap.export.emit import Emitter
    from cudasnap.export.table import TABLE
    owners: Dict[str, List[str]] = {}
    for cls in Emitter.__mro__[:-1]:
        assert cls.__module__.rpartition(".")[2] in EMITTER_PARTS, cls
        for name, v in vars(cls).items():
            if callable(v) or isinstance(v, staticmethod):
                owners.setdefault(name, []).append(cls.__name__)
    assert {n: o for n, o in owners.items() if len(o) > 1 and not n.startswith("__")} == {}
    assert sorted(m for m in set(TABLE.values()) if len(owners.get(m, [])) != 1) == []
    assert len(Emitter.__mro__) >= 7
    for part in EMITTER_PARTS:
        n = len((ROOT / "export" / f"{part}.py").read_text().splitlines())
        assert n <= 600, (part, n)


REPLAYER_PARTS = {"engine": "Replayer", "batchrun": "BatchRunner", "prescan": "Prescan", "profrange": "ProfilerRange",
                  "eventbus": "EventBus", "index": "ReplayIndex"}


def part_problems(folder: Path, parts: Dict[str, str]) -> List[str]:
    """What keeps these classes (module -> class) from being parts: a base class (a mixin's state
    is implicit), an attribute read on self that the class neither sets in its own methods nor
    defines (nor lists in __slots__), or more than ~450 lines without its docstring's first line
    saying why."""
    out = []
    for mod, name in parts.items():
        tree = _parse(folder / f"{mod}.py")
        cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
        if cls.bases:
            out.append(f"{name} inherits {', '.join(ast.unparse(b) for b in cls.bases)}")
        own = {f.name for f in cls.body if isinstance(f, ast.FunctionDef)}
        read, stored = set(), set()
        for f in cls.body:
            for n in ast.walk(f):
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
                    (stored if isinstance(n.ctx, ast.Store) else read).add(n.attr)
        slots = {e.value for n in cls.body if isinstance(n, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__slots__" for t in n.targets) for e in n.value.elts}
        out += [f"{name} reads self.{a}, set nowhere in it" for a in sorted(read - own - stored - slots)]
        n = cls.end_lineno - cls.lineno + 1
        if n > 450 and "lines" not in (ast.get_docstring(cls) or "").split("\n")[0]:
            out.append(f"{name}: {n} lines")
    return out


def test_the_replayer_is_composed_of_parts_that_name_what_they_use():
    """The Replayer and its parts inherit nothing (no mixin with implicit state); every
    attribute a part reads on self is one it sets in its own methods, or its own method; each
    class is under ~450 lines unless its docstring's first line says why."""
    assert part_problems(ROOT / "replay", REPLAYER_PARTS) == []


EXTRACTOR_PARTS = {"extract": "Extractor", "extract_select": "Selection", "extract_prefix": "Prefix",
                   "extract_links": "Links", "extract_memory": "Memory", "extract_prune": "Pruner",
                   "extract_write": "ExtractWriter"}


def test_the_extractor_is_composed_of_parts_that_name_what_they_use():
    """The Extractor (export/extract.py) and its parts, as the Replayer's: no base class, the
    state each reads on self set by itself (the others' results come in through its
    constructor), each under ~450 lines."""
    assert part_problems(ROOT / "export", EXTRACTOR_PARTS) == []
    # every class of the extract's modules is listed, so none slips past the check
    found = {f"{p.stem}.{n.name}" for p in (ROOT / "export").glob("extract*.py")
             for n in _parse(p).body if isinstance(n, ast.ClassDef)}
    plain = {"extract._Starter", "extract_common.ExtractError", "extract_common.Done", "extract_common.ExtractResult"}
    assert found - plain == {f"{m}.{c}" for m, c in EXTRACTOR_PARTS.items()}


def test_part_checker_finds_a_mixin_and_implicit_state(tmp_path):
    (tmp_path / "m.py").write_text("class A(B):\n    def f(self):\n        return self.x + self.g()\n"
                                   "    def g(self):\n        self.y = 1\n        return self.y\n")
    assert part_problems(tmp_path, {"m": "A"}) == ["A inherits B", "A reads self.x, set nowhere in it"]


# ------------------------------------------------------------------ call classes
def name_lists() -> List[str]:
    """Literal collections of two or more Driver API names (set, list, tuple, a startswith
    tuple) outside the description's generator, its overlay and the vocabulary module: each a
    call class written by hand. module:line, the first two names."""
    skip = {"cudasnap.formats.vocab", "cudasnap.shim.overlay", "cudasnap.shim.gen_api", "cudasnap.shim.description"}
    rx = re.compile(r"cu[A-Z]\w+$")
    out = []
    for mod, path in _modules().items():
        if path is None or mod in skip:
            continue
        for node in ast.walk(_parse(path)):
            if isinstance(node, (ast.Set, ast.List, ast.Tuple)):
                names = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
                         and rx.match(e.value)]
                if len(names) >= 2 and len(names) == len(node.elts):
                    out.append(f"{mod}:{node.lineno} {names[0]},{names[1]}")
    return sorted(out)


def test_call_classes_live_in_the_description():
    """The classes replay, export, profiling, the simulator and the shim's build share are the
    description's (shim/overlay.py CALL_CLASS_RULES, gen_api.derived_classes), read through
    formats/vocab.py: no module tests function names against a literal list of its own."""
    from cudasnap.formats import vocab
    from cudasnap.shim.description import load
    fns = load().functions
    assert all(isinstance(f.get("classes"), list) for f in fns)
    assert {c for f in fns for c in f["classes"]} == set(vocab.CALL_CLASSES)
    assert vocab.is_sync("cuStreamSynchronize_ptsz") and not vocab.is_sync("cuStreamWaitEvent")
    assert vocab.may_batch("cuLaunchKernel") and not vocab.may_batch("cuModuleLoadData")
    assert name_lists() == [], "a hand-written list of API names: make it a class of the description"
    # the classes and the parameter that replaced extract's and retarget's tables
    assert [vocab.first_param(n) for n in ("cuMemFree_v2", "cuMemFreeHost", "cuStreamCreateWithPriority",
                                           "cuEventDestroy_v2", "cuSurfObjectCreate")] == \
        ["dptr", "p", "phStream", "hEvent", "pSurfObject"]
    assert vocab.in_class("cuMemFreeAsync_ptsz", "frees_alloc") and not vocab.in_class("cuMemRelease", "frees_alloc")
    assert vocab.in_class("cuStreamDestroy_v2", "stream_event_life") and not vocab.in_class("cuGraphCreate",
                                                                                             "stream_event_life")


# ------------------------------------------------------------------ typed invocations
def cudasnap_argv() -> List[str]:
    """Modules that build a command line to run cudasnap itself ([python, "-m", "cudasnap", ...]):
    options turned into argv to be parsed again, where a typed document (replay/invocation.py)
    would carry them."""
    out = []
    for mod, path in _modules().items():
        if path is None:
            continue
        for node in ast.walk(_parse(path)):
            if isinstance(node, (ast.List, ast.Tuple)):
                vals = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
                if any(a == "-m" and b == "cudasnap" for a, b in zip(vals, vals[1:])):
                    out.append(f"{mod}:{node.lineno}")
    return sorted(out)


# --wrap's final exec runs the tool on a replay command line by design
ARGV_ALLOWED = {"cudasnap.wrap"}


def test_no_argv_built_to_call_cudasnap():
    found = {x.split(":")[0] for x in cudasnap_argv()}
    assert found - ARGV_ALLOWED == set(), "build a typed document (replay/invocation.py), not an argv"
    assert ARGV_ALLOWED - found == set(), "gone: take it off ARGV_ALLOWED"
    assert {"cudasnap.campaign.worker", "cudasnap.campaign.bisect", "cudasnap.export.commands"}.isdisjoint(found)


# ------------------------------------------------------------------ child processes
# Every place product code starts a process. A replay (or any cudasnap code) runs in the caller's
# process through invocation.run_request unless isolation is the point: those sites say why on a
# `# a process of its own:` line in the function, and are listed here with the reason. Tools
# (the captured program, a compiler, nvidia-smi) are listed apart.
CHILD_PROCESSES_ALLOWED: Dict[str, str] = {
    "cudasnap.advise.source:run_replay": "a what-if may fault (a sticky error ends its process's context) or hang",
    "cudasnap.export.commands:_check": "extract --check: a fault would end the context a widened extract needs",
    "cudasnap.pytest_plugin:SnapshotItem.runtest": "a fault or a hang fails one test item, not the session",
    "cudasnap.replay.profile.graphcheck:add_timeline_check": "this replay still holds the recorded addresses and CUPTI",
    "cudasnap.replay.profile.metrics_cupti:_trial": "a CUPTI trial",
    "cudasnap.replay.sim:_run": "the simulator's runtime, set before its process starts",
    "cudasnap.replay.group:run_group": "ranks",
    "cudasnap.replay.ranksession:RankSession.__enter__": "ranks",
    "cudasnap.campaign.bisect:Bisector.run_env": "environments",
    "cudasnap.campaign.replays:_run": "environments (on Ray)",
    "cudasnap.campaign.worker:_fresh": "environments (workers = fresh)",
    "cudasnap.campaign.cellserver:Client.__init__": "environments (a server per environment and GPU)",
    "cudasnap.campaign.cellserver:_Server.handle": "environments (workers = warm: forked per replay)",
    "cudasnap.campaign.cellserver:_Server._kept_child": "environments (workers = kept)",
    "cudasnap.campaign.keeper:ensure": "holds a GPU's context between replays, outliving them",
    "cudasnap.wrap:exec_wrapped": "--wrap: the tool runs the replay",
}
TOOL_PROCESSES: Dict[str, str] = {
    "cudasnap.capture.runner:_spawn_gated": "the program captured",
    "cudasnap.replay.sim:prepare_dir": "the C compiler (the simulator's adapter)",
    "cudasnap.campaign.engine:local_gpus": "nvidia-smi",
    "cudasnap.shim.gen_api:fetch_headers": "build time", "cudasnap.shim.gen_api:preprocess": "build time",
    "cudasnap.shim.gen_api:run_probe": "build time", "cudasnap.shim.gen_hash_ptx:": "build time",
}
_SPAWNS = {("subprocess", n) for n in ("run", "Popen", "call", "check_call", "check_output")} | {
    ("os", n) for n in ("fork", "forkpty", "system", "posix_spawn", "posix_spawnp", "execv", "execve", "execvp",
                        "execvpe", "execl", "execle", "execlp", "spawnv", "spawnve")}


def child_process_sites(paths=None) -> Dict[str, str]:
    """'module:Class.function' -> that function's source, for each function (or module level: '')
    that starts a process (subprocess, os.fork, os.exec*, os.posix_spawn...)."""
    out: Dict[str, str] = {}
    items = _modules().items() if paths is None else paths.items()
    for mod, path in items:
        if path is None:
            continue
        text = path.read_text()
        tree = _parse(path, text)

        def visit(node, where: List[str], scope) -> None:
            for ch in ast.iter_child_nodes(node):
                if isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    visit(ch, where + [ch.name], ch)
                    continue
                if (isinstance(ch, ast.Call) and isinstance(ch.func, ast.Attribute)
                        and isinstance(ch.func.value, ast.Name) and (ch.func.value.id, ch.func.attr) in _SPAWNS):
                    out[f"{mod}:{'.'.join(where)}"] = ast.get_source_segment(text, scope) if scope is not tree else text
                visit(ch, where, scope)

        visit(tree, [], tree)
    return out


def test_every_child_process_is_listed_with_its_reason():
    found = child_process_sites()
    listed = set(CHILD_PROCESSES_ALLOWED) | set(TOOL_PROCESSES)
    assert sorted(set(found) - listed) == [], "a new child process: run it in this process (run_request), or say why not"
    assert sorted(listed - set(found)) == [], "gone: take it off CHILD_PROCESSES_ALLOWED / TOOL_PROCESSES"
    unsaid = [s for s in CHILD_PROCESSES_ALLOWED if "# a process of its own: " not in found[s]]
    assert unsaid == [], "say on a `# a process of its own:` line why isolation is the point"
    print(f"{len(CHILD_PROCESSES_ALLOWED)} child-process sites running cudasnap, {len(TOOL_PROCESSES)} running tools")


def test_child_process_finder_finds_each_kind(tmp_path):
    p = tmp_path / "probe.py"
    p.write_text("import os, subprocess\nsubprocess.run(['x'])\nclass C:\n    def f(self):\n"
                 "        # a process of its own: why\n        return os.fork()\n"
                 "def g():\n    def h():\n        subprocess.Popen(['y'])\n    return h\n")
    got = child_process_sites({"m": p})
    assert sorted(got) == ["m:", "m:C.f", "m:g.h"] and "a process of its own: why" in got["m:C.f"]


def test_campaign_sql_lives_in_the_store():
    """Every query of a campaign store is a method of campaign/store.py: the report, the engine
    and the command line call it (stats' SQLite export writes its own file)."""
    found = []
    for mod, path in _modules().items():
        if path is None or mod in ("cudasnap.campaign.store", "cudasnap.stats"):
            continue
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                    "execute", "executemany", "executescript"):
                found.append(f"{mod}:{node.lineno}")
    assert found == []


# ------------------------------------------------------------------ subscribers see a view
# Modules whose code runs as a replay subscriber (profilers, hooks, --launch-override, a job
# rank's hook, extract's tap and its memory reads): they get the event's ReplayView
# (replay/view.py), never the Replayer nor its context. profile/__init__.py is left out: it
# builds the Replayer and hands it the subscribers.
SUBSCRIBER_MODULES = sorted({p for p in (ROOT / "replay" / "profile").glob("*.py") if p.name != "__init__.py"}
                            | {ROOT / "replay" / n for n in ("hooks.py", "override.py", "events.py", "group.py")}
                            | {ROOT / "export" / n for n in ("ranges.py", "extract_memory.py")})


def replayer_reaches(path: Path, only=None) -> List[str]:
    """'file:line attr' for each reach past the view: an attribute `replayer` or `subscribers`,
    or `.ctx` on anything but a launch event (ev.ctx, event.ctx: its LaunchContext) or, in
    events.py, the event itself. only: a function or class name whose body alone is read."""
    tree = _parse(path)
    if only is not None:
        tree = next(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == only)
    out = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.Attribute):
            continue
        base = n.value.id if isinstance(n.value, ast.Name) else None
        if n.attr in ("replayer", "subscribers") or (
                n.attr == "ctx" and base not in ("ev", "event") and not (path.name == "events.py" and base == "self")):
            out.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}:{n.lineno} .{n.attr}")
    return out


def test_subscribers_see_the_replay_view_never_the_replayer():
    found = [r for p in SUBSCRIBER_MODULES for r in replayer_reaches(p)]
    found += replayer_reaches(ROOT / "export" / "extract.py", "Tap")
    print(f"{len(found)} reaches past the replay view from subscriber code "
          f"({len(SUBSCRIBER_MODULES)} modules and extract's tap)")
    assert found == [], found


def test_reach_finder_finds_a_reach(tmp_path):
    p = tmp_path / "probe.py"
    p.write_text("def f(ev, rp):\n    ev.ctx.relaunch()\n    rp.ctx.raw('x')\n    ev.replayer.path\n")
    assert sorted(r.rsplit(" ", 1)[1] for r in replayer_reaches(p)) == [".ctx", ".replayer"]


# ------------------------------------------------------------------ names are the description's
def _name_counter():
    """bench/count_names.py, the one finder of name tests (also run by hand for the counts)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("_cudasnap_count_names", ROOT / "bench" / "count_names.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# Name tests still in product code, per module: a function's meaning spelled as its name rather
# than a class of the description or its overrides entry. Each number only goes down.
#   handlers: a handler telling apart the variants it is registered for (the overrides entry names it)
#   emitters: an export method telling apart the variants its overrides entry gives it
NAME_TESTS_ALLOWED: Dict[str, int] = {
    # handlers and emitters, the variants of their own functions
    "replay/handlers/graph.py": 3, "replay/handlers/ipc.py": 1,
    "replay/handlers/memory.py": 2, "replay/handlers/module.py": 1, "replay/handlers/texture.py": 5,
    "export/emit_module.py": 2, "export/emit_stream.py": 5,
    # the steps of the CUPTI probe (where a profiler's start died), not a record's meaning
    "replay/profile/metrics_cupti.py": 1,
}
# "cu" alone: a call record told from the simulator's own records, not a function's meaning
BARE_CU_ALLOWED = {"replay/sim/driver.py": 1}


def name_tests(scanned: Optional[dict] = None) -> Dict[str, int]:
    """module -> name tests (tables, registrations, ==, in, prefixes, if-chains) outside the
    overlay, the generator, the description's loader, the vocabulary and the overrides table
    (from count_names' scan of the tree, made here unless given)."""
    out = {}
    for mod, got in (_name_counter().scan(ROOT) if scanned is None else scanned).items():
        n = sum(len(got[k]) for k in ("tables", "calls_2", "eq", "prefix", "if_chains"))
        if n:
            out[mod] = n
    return out


def test_no_new_name_test_outside_the_description():
    scanned = _name_counter().scan(ROOT)
    found = name_tests(scanned)
    print(f"{sum(found.values())} name tests in {len(found)} modules (allowed: {sum(NAME_TESTS_ALLOWED.values())})")
    grown = {m: (n, NAME_TESTS_ALLOWED.get(m, 0)) for m, n in found.items() if n > NAME_TESTS_ALLOWED.get(m, 0)}
    assert grown == {}, f"a name test: make it a class (shim/overlay.py CALL_CLASS_RULES) or an overrides entry: {grown}"
    shrunk = {m: (found.get(m, 0), n) for m, n in NAME_TESTS_ALLOWED.items() if found.get(m, 0) < n}
    assert shrunk == {}, f"fewer name tests: lower NAME_TESTS_ALLOWED to {shrunk}"
    bare = {m: len(g["bare_cu"]) for m, g in scanned.items() if g["bare_cu"]}
    assert bare == BARE_CU_ALLOWED


def test_name_test_finder_finds_each_kind():
    c = _name_counter()
    got = c.scan_source(
        'T = {"cuMemAlloc", "cuMemFree"}\n'
        '@handles("cuA", "cuB")\n'
        'def h(f, b):\n'
        '    if f == "cuMemcpy":\n'
        '        pass\n'
        '    elif b.startswith("cuMemset"):\n'
        '        pass\n'
        '    ctx.drv(rec, "cuMemcpyDtoH", 1)\n'      # a call by name is no test
        '    return f.startswith("cu") or f in ("cuX", "cuY")\n', "probe.py")
    assert {k: len(v) for k, v in got.items()} == {"tables": 2, "calls_2": 1, "eq": 1, "in_table": 1, "prefix": 1,
                                                     "bare_cu": 1, "if_chains": 1}


def test_every_override_names_a_hook_that_exists():
    """Each entry of the overrides table (shim/overlay.py OVERRIDES, through the description)
    names a replay handler, an export method, a capture handler and classes that exist, and
    replay and export find them there."""
    import importlib
    from cudasnap.export.emit import Emitter
    from cudasnap.formats import vocab
    from cudasnap.replay import dispatch
    from cudasnap.shim.description import load
    rows = vocab.overridden()
    assert len(rows) > 200
    capture_kinds = {f["capture"] for f in load().functions if f.get("capture")}
    for name, base, o in rows:
        if o.get("replay"):
            mod, _, fn = o["replay"].partition(".")
            h = getattr(importlib.import_module(f"cudasnap.replay.handlers.{mod}"), fn)
            assert dispatch.lookup(name).fn is h, name
        if o.get("export"):
            assert callable(getattr(Emitter, o["export"], None)), (name, o["export"])
            assert Emitter.method_for(name) == o["export"], name
        if o.get("capture"):
            assert o["capture"] in capture_kinds, name
        assert set(o.get("classes", ())) <= set(vocab.CALL_CLASSES), name
    # the classes that replaced three name lists and four name tests
    assert vocab.no_effect("cuCtxSetCacheConfig") and dispatch.replayed_by("cuCtxSetCacheConfig") == "class"
    assert Emitter.method_for("cuLinkCreate_v2") == "e_none"
    assert vocab.selectable("cuMemcpyDtoH_v2") and not vocab.selectable("cuMemcpyHtoD_v2")
    assert vocab.selectable("cuGraphLaunch_ptsz") and vocab.selectable("cuMemsetD32Async")


def test_handler_modules_register_nothing_themselves():
    """Replay handlers are found through the overrides table only: no module keeps a registry."""
    found = []
    for p in sorted((ROOT / "replay" / "handlers").glob("*.py")):
        for node in ast.walk(_parse(p)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "handles":
                found.append(f"{p.name}:{node.lineno}")
    assert found == []


# ------------------------------------------------------------------ graph mode, in parts
GRAPH_PARTS = {"graphmode": "GraphProfiler", "graphseq": "SequenceRecording", "graphnodes": "NodeAttribution",
               "graphrecorded": "RecordedGraphUnits"}


def test_graph_profiler_holds_parts_that_name_what_they_use():
    """GraphProfiler and its parts inherit nothing (no mixin) and read on self only what they set
    or define (the profiler's state comes in through their constructor and calls); a class past
    ~450 lines says why in its docstring's first line."""
    assert part_problems(ROOT / "replay" / "profile", GRAPH_PARTS) == []
