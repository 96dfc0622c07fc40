"""Count the Driver API name tests in product code: where meaning is spelled as function names
instead of the API description's classes (read through formats/vocab.py).

  python3 bench/count_names.py [--by-module] [--json]

Kinds (read from the source with ast; the package's modules, not tests/ nor bench/):
  tables      literal collections (set, list, tuple, dict keys) of two or more `cu*` names
  calls_2     a call given two or more `cu*` names (registrations: @handles, export's _t)
  eq          `x == "cu..."` / `!=`
  in_table    `x in ("cuA", "cuB")` (also counted under tables)
  prefix      `.startswith("cuX...")` / `.endswith` with an API name or a name fragment
  bare_cu     `.startswith("cu")`: a call record told from other records (legitimate)
  if_chains   if/elif chains of two or more name tests
With the package installed: replay handlers by class (the description) vs their own.
tests/test_structure.py reads scan() to hold the counts down."""
from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Dict, Iterable, Optional

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"cu[A-Z]\w*$")
# where names are the point: the description's sources, its reader, the overrides table
EXEMPT = ("shim/overlay.py", "shim/gen_api.py", "shim/description.py", "formats/vocab.py",
          "formats/overrides.py")
KINDS = ("tables", "calls_2", "eq", "in_table", "prefix", "bare_cu", "if_chains")


def product_files(root: Path = ROOT) -> Iterable[Path]:
    """The package's Python files, from pyproject's package-dir (what gets installed)."""
    text = (root / "pyproject.toml").read_text()
    sec = text.split("[tool.setuptools.package-dir]", 1)[1].split("\n[", 1)[0]
    seen = set()
    for m in re.finditer(r'^"[\w.]+"\s*=\s*"([^"]+)"', sec, re.M):
        for f in sorted((root / m.group(1)).glob("*.py")):
            if f not in seen:
                seen.add(f)
                yield f


def _is_name(node) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and bool(NAME.match(node.value))


def _names_in(node) -> int:
    if isinstance(node, (ast.Set, ast.List, ast.Tuple)):
        return sum(_is_name(e) for e in node.elts)
    return 0


def _name_test(node) -> bool:
    """Does this expression test a value against an API name?"""
    for n in ast.walk(node):
        if isinstance(n, ast.Compare):
            if any(isinstance(o, (ast.Eq, ast.NotEq)) for o in n.ops) and any(
                    _is_name(c) for c in [n.left, *n.comparators]):
                return True
            if any(isinstance(o, (ast.In, ast.NotIn)) for o in n.ops) and any(
                    _names_in(c) for c in n.comparators):
                return True
        if _prefix_arg(n) not in (None, "cu"):
            return True
    return False


def _prefix_arg(n) -> Optional[str]:
    """The `cu...` literal a .startswith/.endswith call tests for (the first of a tuple)."""
    if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr in ("startswith", "endswith") and n.args):
        return None
    a = n.args[0]
    vals = [a] if isinstance(a, ast.Constant) else list(a.elts) if isinstance(a, ast.Tuple) else []
    for v in vals:
        if isinstance(v, ast.Constant) and isinstance(v.value, str) and v.value.startswith("cu") \
                and (v.value == "cu" or v.value[2:3].isupper()):
            return v.value
    return None


def scan_source(src: str, where: str = "?") -> Dict[str, list]:
    """kind -> ['where:line detail', ...] for one module's source."""
    out: Dict[str, list] = {k: [] for k in KINDS}
    tree = ast.parse(src, where)
    chained = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Set, ast.List, ast.Tuple)) and _names_in(node) >= 2:
            out["tables"].append(f"{where}:{node.lineno} {_names_in(node)} names")
        elif isinstance(node, ast.Dict) and sum(_is_name(k) for k in node.keys if k is not None) >= 2:
            out["tables"].append(f"{where}:{node.lineno} {sum(_is_name(k) for k in node.keys if k)} names")
        elif isinstance(node, ast.Call) and sum(_is_name(a) for a in node.args) >= 2:
            out["calls_2"].append(f"{where}:{node.lineno} {sum(_is_name(a) for a in node.args)} names")
        if isinstance(node, ast.Compare):
            for c in [node.left, *node.comparators]:
                if _is_name(c) and any(isinstance(o, (ast.Eq, ast.NotEq)) for o in node.ops):
                    out["eq"].append(f"{where}:{node.lineno} {c.value}")
            if any(isinstance(o, (ast.In, ast.NotIn)) for o in node.ops) and any(
                    _names_in(c) for c in node.comparators):
                out["in_table"].append(f"{where}:{node.lineno}")
        p = _prefix_arg(node)
        if p == "cu":
            out["bare_cu"].append(f"{where}:{node.lineno}")
        elif p is not None:
            out["prefix"].append(f"{where}:{node.lineno} {p}")
        if isinstance(node, ast.If) and node not in chained and _name_test(node.test):
            n, length = node, 1
            while len(n.orelse) == 1 and isinstance(n.orelse[0], ast.If) and _name_test(n.orelse[0].test):
                n = n.orelse[0]
                chained.add(n)
                length += 1
            if length >= 2:
                out["if_chains"].append(f"{where}:{node.lineno} {length} arms")
    return out


def scan(root: Path = ROOT, exempt: Iterable[str] = EXEMPT) -> Dict[str, Dict[str, list]]:
    """module path (relative to root) -> kind -> findings, for every product file not exempt."""
    res = {}
    for f in product_files(root):
        rel = f.relative_to(root).as_posix()
        if rel in exempt:
            continue
        got = scan_source(f.read_text(), rel)
        if any(got.values()):
            res[rel] = got
    return res


def totals(res: Dict[str, Dict[str, list]]) -> Dict[str, int]:
    c: Counter = Counter()
    for got in res.values():
        for k, v in got.items():
            c[k] += len(v)
    c["table_names"] = sum(int(x.split()[1]) for got in res.values() for x in got["tables"])
    return {k: c[k] for k in (*KINDS, "table_names")}


def handlers() -> Optional[Dict[str, int]]:
    """Replayed ABI names by how replay takes them (the installed package), or None."""
    try:
        from cudasnap.replay import dispatch
        from cudasnap.shim.description import load
    except Exception:
        return None
    c: Counter = Counter(dispatch.replayed_by(f["name"]) or "not replayed" for f in load().functions)
    return dict(c)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=str(ROOT))
    ap.add_argument("--by-module", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    root = Path(a.root)
    if not (root / "pyproject.toml").is_file():
        print(f"count_names: no pyproject.toml under {root}", file=sys.stderr)
        return 2
    res = scan(root)
    doc = {"totals": totals(res), "handlers": handlers(),
           "by_module": {m: {k: len(v) for k, v in g.items() if v} for m, g in sorted(res.items())}}
    if a.json:
        print(json.dumps(doc, indent=1))
        return 0
    t = doc["totals"]
    print(f"name tests in product code ({len(res)} modules):")
    print(f"  literal name tables      {t['tables']:4d} ({t['table_names']} names)")
    print(f"  calls given >=2 names    {t['calls_2']:4d} (registrations)")
    print(f"  == / != \"cu...\"          {t['eq']:4d}")
    print(f"  in (\"cuA\", ...)          {t['in_table']:4d}")
    print(f"  startswith(\"cuX...\")     {t['prefix']:4d}")
    print(f"  startswith(\"cu\")         {t['bare_cu']:4d} (call records told from others)")
    print(f"  if-chains on names       {t['if_chains']:4d}")
    if doc["handlers"]:
        h = doc["handlers"]
        print(f"replay: {h.get('handler', 0)} names by their own handler, {h.get('class', 0)} by class, "
              f"{h.get('skipped', 0)} skipped queries, {h.get('not replayed', 0)} not replayed")
    if a.by_module:
        for m, g in doc["by_module"].items():
            print(f"  {m:36s} " + " ".join(f"{k}={v}" for k, v in g.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
