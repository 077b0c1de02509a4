"""The acts contract: a replacement that can stand down says when it acts, and reports acting only where it does.

"Exercised" means the fix did its work (issue: a replacement that calls the original as it is, on a path it does not
cover, has not acted). Three checks:

- **declared** (every record, read from its patch code): a patch function with an early ``return original(...)``
  (or ``return await original(...)``) under a condition can call the original without doing its work, so its record
  must declare ``acts_when``; and the patch code of a record without ``acts_when`` must not report ``acted`` itself
  (the engine reports its first run);
- **cases** (given by the feature's tests, ``ActsCase``): calls of the replacement the engine builds, each with small
  stand-ins for the target's arguments, each saying whether the fix acts on it; the replacement must report
  ``acted`` on exactly those;
- **mutants**: the patch function with ``acted(<id>)`` on every call, and with ``acted(<id>)`` before every early
  return of the original (acting reported on a stand-down path); the same cases must catch each (killed).

``check_acts`` returns the failures and the mutants' outcomes.
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import inspect
import textwrap
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from verl_ascend_ext.patching import status
from verl_ascend_ext.patching.record import PatchRecord
from verl_ascend_ext.patching.replacement import build

MUTANTS = ("acted on every call", "acted before an early return of the original")


@dataclass(frozen=True)
class ActsCase:
    """One call of a record's replacement: ``original`` stands in for the target, ``call`` calls the replacement
    (given) as the target is called (a coroutine it returns is run), ``acts`` whether the fix does its work there."""

    record: str
    name: str
    original: Callable[..., Any]
    call: Callable[[Callable[..., Any]], Any]
    acts: bool
    wrapper: str = ""  # the patch code function ("module:name"); default: the record's own wrapper


@dataclass(frozen=True)
class ActsFinding:
    record: str
    check: str  # "declared", "case", "mutant"
    detail: str
    ok: bool

    def __str__(self) -> str:
        return f"{self.record}: {self.check}: {self.detail}"


def resolve_wrapper(wrapper: str) -> Callable[..., Any]:
    """The patch code function a record's ``wrapper`` ("module:name") names."""
    module, _, name = wrapper.partition(":")
    return getattr(importlib.import_module(module), name)


def early_returns_of_original(function: Callable[..., Any]) -> list[int]:
    """Line numbers (in the function's source) of ``return original(...)`` / ``return await original(...)`` inside
    an ``if``: paths on which the function can call the original without doing anything else."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Return) and _calls_original(inner.value):
                    lines.append(inner.lineno)
    return sorted(set(lines))


def _calls_original(node: ast.AST | None) -> bool:
    if isinstance(node, ast.Await):
        node = node.value
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "original"


def reports_acted(function: Callable[..., Any]) -> bool:
    """Whether the function's own code calls ``acted`` (directly)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "acted"
               for n in ast.walk(tree))


def mutant(function: Callable[..., Any], patch_id: str, kind: str) -> Callable[..., Any]:
    """``function`` recompiled with ``acted(patch_id)`` inserted (``MUTANTS``), in a copy of its module's globals."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    definition = tree.body[0]
    assert isinstance(definition, (ast.FunctionDef, ast.AsyncFunctionDef))
    definition.decorator_list = []
    report = ast.parse(f"__acted__({patch_id!r})").body[0]
    if kind == MUTANTS[0]:
        definition.body.insert(1 if ast.get_docstring(definition) else 0, report)
    else:
        for node in ast.walk(definition):
            for field in ("body", "orelse"):
                block = getattr(node, field, None)
                if not isinstance(block, list):
                    continue
                for i in range(len(block) - 1, -1, -1):
                    if isinstance(block[i], ast.Return) and _calls_original(block[i].value):
                        block.insert(i, ast.parse(f"__acted__({patch_id!r})").body[0])
    ast.fix_missing_locations(tree)
    namespace = dict(function.__globals__, __acted__=status.acted)
    exec(compile(tree, inspect.getsourcefile(function) or "<mutant>", "exec"), namespace)
    made = namespace[definition.name]
    assert isinstance(made, types.FunctionType)
    return made


def _run(case: ActsCase, impl: Callable[..., Any], record: PatchRecord) -> int:
    """Acts reported for ``record`` while ``case`` calls the replacement built around ``impl``."""
    replacement = build(impl, case.original, record.id, (), traced=False, reports_itself=True)
    before = status.acts_of(record.id)
    result = case.call(replacement)
    if inspect.iscoroutine(result):
        asyncio.run(result)
    return status.acts_of(record.id) - before


def check_acts(records: Iterable[PatchRecord], cases: Iterable[ActsCase]) -> list[ActsFinding]:
    """The acts contract on ``records`` with ``cases`` (see the module docstring); every finding, ``ok`` or not."""
    by_record: dict[str, list[ActsCase]] = {}
    for case in cases:
        by_record.setdefault(case.record, []).append(case)
    findings = []
    for record in records:
        if record.traced or record.action != "wrap":
            continue
        wrappers = [record.wrapper, *(v.wrapper for v in record.variants)]
        for wrapper in wrappers:
            impl = resolve_wrapper(wrapper)
            early = early_returns_of_original(impl)
            if early and not record.acts_when:
                findings.append(ActsFinding(record.id, "declared", f"{wrapper} can return the original as it is "
                                            f"(lines {early} of the function) but the record declares no acts_when",
                                            False))
            if reports_acted(impl) and not record.acts_when:
                findings.append(ActsFinding(record.id, "declared", f"{wrapper} reports acted but the record "
                                            "declares no acts_when: the engine already reports its first run", False))
        if not record.acts_when:
            continue
        mine = by_record.get(record.id, [])
        if not mine:
            findings.append(ActsFinding(record.id, "case", "no case given: the acts contract is unchecked", False))
            continue
        for wrapper in {case.wrapper or record.wrapper for case in mine}:
            impl = resolve_wrapper(wrapper)
            chosen = [c for c in mine if (c.wrapper or record.wrapper) == wrapper]
            for case in chosen:
                acts = _run(case, impl, record)
                ok = (acts > 0) == case.acts
                findings.append(ActsFinding(record.id, "case", f"{wrapper} {case.name}: reported {acts} act(s), "
                                            f"{'acts' if case.acts else 'stands down'}", ok))
            for kind in MUTANTS:
                if kind == MUTANTS[1] and not early_returns_of_original(impl):
                    continue
                bad = mutant(impl, record.id, kind)
                caught = [c.name for c in chosen if (_run(c, bad, record) > 0) != c.acts]
                findings.append(ActsFinding(record.id, "mutant", f"{wrapper} with {kind}: "
                                            + (f"killed by {', '.join(caught)}" if caught else "survived: no case "
                                               "stands down where it reports acting"), bool(caught)))
    return findings
