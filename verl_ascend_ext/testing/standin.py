"""Released modules that cannot be imported here (vLLM-Ascend needs torch_npu), loaded as their own definitions.

A ``StandIn`` finder serves every module of a release tree's top-level packages: the module's top-level
classes and functions are compiled from the released file itself, at their own lines, so a live function
object's code names that file and line exactly as in a real process, and the engine reads the same
definition there as doctor reads statically. Every other name those definitions reference (imports, module
constants) is bound to ``Inert``: callable, subscriptable, an identity decorator, dropped as a base class.
Module-level statements other than definitions do not run, decorators other than staticmethod / classmethod /
property are left out (the definitions keep their lines), and a class whose body fails stays inert. Nothing
of the release is executed except class bodies; the engine's patches install on, and its recognisers read,
the released definitions.

This generalises the loader of ``tests/scenarios/glm52_shield.py`` (the engine classes of later vLLM releases'
``core.py``) to any release tree; it is what the contract suite's in-process half uses for such releases.
"""

from __future__ import annotations

import ast
import builtins
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class Inert:
    """Stands for a name a released definition references but nothing here provides; never meant to run."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return f"<inert {self._name}>"

    def __getattr__(self, attr: str) -> Inert:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)  # no protocol of its own beyond the ones below
        return Inert(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and isinstance(args[0], (types.FunctionType, type, staticmethod,
                                                                    classmethod, property)):
            return args[0]  # used as a decorator: the definition stays the released one
        return Inert(f"{self._name}(...)")

    def __getitem__(self, _item: object) -> Inert:
        return self

    def __or__(self, _other: object) -> Inert:
        return self

    __ror__ = __or__

    def __mro_entries__(self, _bases: tuple[object, ...]) -> tuple[()]:
        return ()  # as a base class: dropped (the released class keeps its own definitions)


BUILTIN_DECORATORS = frozenset({"staticmethod", "classmethod", "property"})


def _plain(node: ast.AST) -> ast.AST:
    """``node`` with every decorator but staticmethod / classmethod / property removed, at any depth.

    A decorator would run module code that is not there (e.g. a registry call, a dataclass); the definition keeps
    its own lines, so the engine still finds it where the released file has it.
    """
    for inner in ast.walk(node):
        if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            inner.decorator_list = [d for d in inner.decorator_list
                                    if isinstance(d, ast.Name) and d.id in BUILTIN_DECORATORS]
    return node


def _definitions_only(tree: ast.Module) -> list[ast.stmt]:
    return [_plain(node) for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                     ast.ClassDef))]


class StandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the modules of ``packages`` from ``root`` as their released definitions (see the module docstring)."""

    def __init__(self, root: str | Path, packages: Sequence[str]) -> None:
        self.root = Path(root)
        self.packages = tuple(packages)

    def _file(self, fullname: str) -> tuple[Path | None, bool]:
        """(file, is_package) of ``fullname`` under ``root``; a folder without ``__init__.py`` is a package."""
        base = self.root.joinpath(*fullname.split("."))
        if (base / "__init__.py").is_file():
            return base / "__init__.py", True
        if base.with_suffix(".py").is_file():
            return base.with_suffix(".py"), False
        if base.is_dir():
            return None, True
        return None, False

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] not in self.packages:
            return None
        file, package = self._file(fullname)
        if file is None and not package:
            return None
        spec = importlib.util.spec_from_file_location(fullname, str(file), loader=self) if file else \
            importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        if package:
            spec.submodule_search_locations = [str(self.root.joinpath(*fullname.split(".")))]
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        origin = getattr(module.__spec__, "origin", None)
        if not origin or not origin.endswith(".py"):
            return  # a namespace folder: nothing to define
        tree = ast.parse(Path(origin).read_text(encoding="utf-8"), filename=origin)
        nodes = _definitions_only(tree)
        defined = {n.name for n in nodes}
        referenced = {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name)}
        for name in sorted(referenced - defined - set(dir(builtins))):
            module.__dict__[name] = Inert(name)
        for node in nodes:
            try:
                exec(compile(ast.Module(body=[node], type_ignores=[]), origin, "exec"), module.__dict__)
            except Exception:  # a class body calling what is not there: the name stays inert, the rest loads
                module.__dict__[node.name] = Inert(node.name)


def install(root: str | Path, packages: Sequence[str] | None = None) -> StandIn:
    """Put a ``StandIn`` for ``root``'s top-level packages (default: every folder in it) first on ``sys.meta_path``.

    Install it before the plugin boots: wrapt's post-import finder, registered at boot, then goes before it and
    fires the engine's hooks on these modules as on any other.
    """
    found = packages if packages is not None else [p.name for p in Path(root).iterdir()
                                                   if p.is_dir() and p.name.isidentifier()]
    finder = StandIn(root, found)
    sys.meta_path.insert(0, finder)
    return finder
