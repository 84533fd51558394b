"""The code's shape: no import circle among sloserve's modules, no class with more than 25 methods,
and no source file over 600 lines.

The import graph is read from the source with ``ast``, as import-linter's grimp reads it: an
import names the module it imports (``from a import b`` names ``a.b`` when that is a module, else
``a``), an import inside a function counts like one at the top of the module, and the imports under
``if TYPE_CHECKING:`` do not count.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sloserve"
MAX_METHODS = 25
MAX_LINES = 600
SKIP_TOP = {"tests", "model_repository", "sloserve.egg-info"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported(module: str, path: Path) -> set[str]:
    """The names ``module`` imports, absolute, outside ``if TYPE_CHECKING:`` blocks."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, *([node.module] if node.module else [])])
            names.update(f"{base}.{a.name}" if f"{base}.{a.name}" in _MODULES else base for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return names


_MODULES = _modules()


def _graph() -> dict[str, set[str]]:
    """Module -> the sloserve modules it imports."""
    graph: dict[str, set[str]] = {}
    for module, path in _MODULES.items():
        targets = set()
        for name in _imported(module, path):
            while name and name not in _MODULES:  # ``import a.b.c`` with ``c`` a name: the module ``a.b``
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def _path(module: str) -> str:
    return str(_MODULES[module].relative_to(ROOT))


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _cycle_in(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One circle through the component's first module, as a path of modules back to it."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    return component


def test_no_import_circles():
    graph = _graph()
    circles = [" -> ".join(_path(m) for m in _cycle_in(c, graph)) for c in _circles(graph)]
    assert not circles, "import circles (move what both sides need into a module both import):\n" + "\n".join(circles)


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_class_has_more_than_25_methods():
    big = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                n = sum(isinstance(b, ast.FunctionDef | ast.AsyncFunctionDef) for b in node.body)
                if n > MAX_METHODS:
                    big.append(f"{path.relative_to(ROOT)}: {node.name} has {n} methods")
    assert not big, f"classes over {MAX_METHODS} methods (split them by what a reader looks for):\n" + "\n".join(big)


def _non_test_sources() -> list[Path]:
    """Every .py file of the project but the tests (the virtualenv, caches and hidden folders aside)."""
    out = []
    for folder, dirs, files in os.walk(ROOT):
        top = Path(folder) == ROOT
        dirs[:] = [d for d in dirs if not d.startswith((".", "__")) and not (top and d in SKIP_TOP)]
        out += [Path(folder) / f for f in files if f.endswith(".py")]
    return sorted(out)


def test_no_source_file_is_over_600_lines():
    long = []
    for path in _non_test_sources():
        n = len(path.read_text().splitlines())
        if n > MAX_LINES:
            long.append(f"{path.relative_to(ROOT)}: {n} lines")
    assert not long, f"source files over {MAX_LINES} lines:\n" + "\n".join(long)
