"""The package's import graph, read with ``ast`` (every import statement, also inside functions): no cycles,
nothing under ``patching/`` imports anything of the package outside ``patching/``, the layers point down, and no
private name leaves its package."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "verl_ascend_ext"
ROOT = PACKAGE.name


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Package modules ``name`` imports; ``from pkg import x`` counts as importing ``pkg.x`` when that is a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            targets = [f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in known else stem for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def graph() -> dict[str, set[str]]:
    known = module_names()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_relative_and_function_level_imports() -> None:
    edges = graph()
    assert f"{ROOT}.patching.engine" in edges[f"{ROOT}.patching.lazy"]  # imported inside a function
    assert f"{ROOT}.patching.record" in edges[f"{ROOT}.patching.status"]  # relative
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


def test_patching_imports_nothing_of_the_package_outside_it() -> None:
    inside = f"{ROOT}.patching"
    upward = {name: sorted(t for t in targets if t != inside and not t.startswith(inside + "."))
              for name, targets in graph().items() if name == inside or name.startswith(inside + ".")}
    assert {name: targets for name, targets in upward.items() if targets} == {}


# Each layer may import only itself and the layers before it. The package's ``__init__`` (the public
# ``activate`` / ``patch_statuses``) and ``_version`` stand outside the layers; ``testing`` is the contract kit.
LAYERS = ("patching", "runtime", "features", "tooling", "testing")  # testing: the contract kit, for tests only


def layer(name: str) -> int | None:
    parts = name.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_every_module_is_in_a_layer() -> None:
    outside = sorted(name for name in graph() if layer(name) is None)
    assert outside == [ROOT, f"{ROOT}._version"], "a new module belongs in patching/, runtime/, features/ or tooling/"


def test_imports_point_down_the_layers() -> None:
    upward = {name: sorted(t for t in targets if (layer(t) or 0) > layer(name))
              for name, targets in graph().items() if layer(name) is not None}
    assert {name: targets for name, targets in upward.items() if targets} == {}


def test_a_feature_imports_no_other_feature() -> None:
    def feature(name: str) -> str | None:
        parts = name.split(".")
        return parts[2] if layer(name) == LAYERS.index("features") and len(parts) > 2 else None

    crossing = {name: sorted(t for t in targets if feature(t) and feature(t) != feature(name))
                for name, targets in graph().items() if feature(name)}
    assert {name: targets for name, targets in crossing.items() if targets} == {}


def private_imports() -> list[str]:
    """``from verl_ascend_ext.<package>.<module> import _name`` outside that package (the package's own business):
    in the package, the tests, the benchmarks and the scripts."""
    repo = PACKAGE.parent
    found = []
    for path in sorted(p for folder in (PACKAGE, repo / "tests", repo / "benchmarks", repo / "scripts")
                       for p in folder.rglob("*.py")):
        importer = ".".join(path.relative_to(repo).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if not isinstance(node, ast.ImportFrom) or node.level or not (node.module or "").startswith(ROOT + "."):
                continue
            owner = node.module.rpartition(".")[0]  # the package the module belongs to
            if importer.startswith(owner + "."):
                continue
            found += [f"{path.relative_to(repo)}:{node.lineno} imports {node.module}.{alias.name}"
                      for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__")]
    return found


def test_no_private_name_is_imported_from_outside_its_package() -> None:
    assert private_imports() == []
