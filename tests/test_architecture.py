"""The package's structure rules, read from its source (nothing is imported):
no import circle, no import of another module's private (`_name`) symbols, no module over 600
lines, no folder with more than 15 modules at one level, every environment read through the one
settings table (torch_xdna/runtime/settings.py)."""
from __future__ import annotations

import ast
import collections
import pathlib
import re

import pytest

PKG = pathlib.Path(__file__).resolve().parent.parent / "torch_xdna"
MAX_LINES = 600
MAX_MODULES_PER_FOLDER = 15
SETTINGS_MODULE = "torch_xdna.runtime.settings"


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG.parent).with_suffix("")
        name = ".".join(rel.parts)
        mods[name.removesuffix(".__init__")] = p
    return mods


MODULES = _modules()


def _imports(name: str, path: pathlib.Path) -> list[tuple[str, str | None]]:
    """(imported module, imported name or None) for every torch_xdna import of one module."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if not node.module.startswith("torch_xdna"):
                continue
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.append((sub, None) if sub in MODULES else (node.module, a.name))
        elif isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if a.name.startswith("torch_xdna")]
    return out


def _graph() -> dict[str, set[str]]:
    g = collections.defaultdict(set)
    for name, path in MODULES.items():
        for mod, _ in _imports(name, path):
            if mod in MODULES and mod != name:
                g[name].add(mod)
    return g


def _cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(root):
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = counter[0]; counter[0] += 1
        stack.append(root); on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1
                    stack.append(w); on.add(w)
                    work.append((w, iter(sorted(g[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop(); on.discard(w); comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))

    for v in sorted(MODULES):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    assert _cycles(_graph()) == []


def test_no_private_imports_across_modules():
    bad = [f"{name} imports {mod}.{sym}" for name, path in MODULES.items()
           for mod, sym in _imports(name, path)
           if sym and sym.startswith("_") and not sym.startswith("__") and mod != name]
    assert bad == []


def test_modules_are_small():
    big = {n: len(p.read_text().splitlines()) for n, p in MODULES.items()}
    assert {n: k for n, k in big.items() if k > MAX_LINES} == {}


def test_folders_are_small():
    counts = collections.Counter(p.parent for p in MODULES.values() if p.name != "__init__.py")
    assert {str(d.relative_to(PKG)): k for d, k in counts.items() if k > MAX_MODULES_PER_FOLDER} == {}


ENV_READ = re.compile(r"os\.environ(?!\s*\[[^\]]*\]\s*=)|os\.getenv|getenv\(")


@pytest.mark.parametrize("name", sorted(MODULES))
def test_environment_read_through_settings(name):
    if name == SETTINGS_MODULE:
        return
    text = MODULES[name].read_text()
    stray = [ln.strip() for ln in text.splitlines() if ENV_READ.search(ln) and "settings-ok" not in ln]
    assert stray == [], f"{name} reads the environment directly; declare it in {SETTINGS_MODULE}"
