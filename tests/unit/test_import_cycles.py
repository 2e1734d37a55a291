"""No import cycle anywhere in the tree: among the modules of engine/, app/, ui/ and bench/,
counting every import, a function's lazy one included (a lazy import is how a cycle hides).
The finder is proven on a package made with a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "app", "ui", "bench")


def _name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.AST, package: list[str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = package[:len(package) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    return [target, *(f"{target}.{a.name}" for a in node.names)]


def import_graph(root: Path, packages) -> dict[str, set[str]]:
    """Module -> the modules of these packages it imports (a package's own __init__ left
    out: a submodule reaching its package is Python's order of loading, no cycle)."""
    files = {_name(p, root): p for package in packages for p in (root / package).rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _imported(node, package):
                parts = target.split(".")
                while parts and ".".join(parts) not in files:
                    parts.pop()
                found = ".".join(parts)
                if found and found != name and not name.startswith(found + "."):
                    graph[name].add(found)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_the_tree_has_no_import_cycle():
    graph = import_graph(ROOT, PACKAGES)
    assert len(graph) > 250  # the whole tree was read
    assert cycles(graph) == []


def test_a_cycle_through_a_lazy_import_is_found(tmp_path):
    package = tmp_path / "shop"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "shelf.py").write_text("from .till import price\n")
    (package / "till.py").write_text("def price():\n    from . import stock\n")
    (package / "stock.py").write_text("import shop.shelf\n")
    (package / "door.py").write_text("from shop import till\n")
    assert cycles(import_graph(tmp_path, ["shop"])) == [["shop.shelf", "shop.stock",
                                                         "shop.till"]]
