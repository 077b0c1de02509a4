"""Replacements that torch.compile traces: plain functions carrying our marker, and the guard that enforces it.

A patch's code is a plain function ``impl(original, *args, **kwargs)`` (for a method, ``args[0]`` is
``self``). The engine installs in the target's place a plain Python function that calls
``impl(original, ...)``, made here, with our marker and the exposed foreign markers as function
attributes: dynamo inlines plain functions and their closures, so the fix is part of the compiled
graph. A proxy object (e.g. ``wrapt.FunctionWrapper``) reports the wrapped original's class and code
to dynamo, which then traces the original and silently drops the fix; the guard refuses any
replacement whose type is not exactly ``types.FunctionType``. For targets that run traced it also
refuses code that reads a ``ContextVar``, a thread-local or the call stack (dynamo cannot trace them
under ``fullgraph=True``).

A replacement of a record that runs eagerly (``traced=False``) also reports its first call
(``status.exercised``: one record write per process, then a list check per call); a traced one does not,
since nothing inside a compiled graph can report itself, and its code stays exactly the call above; nor does
one whose record says it acts only on some calls (``acts_when``): its patch code reports when it acts.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

from verl_ascend_ext.patching.errors import PatchRefusedError
from verl_ascend_ext.patching.status import exercised

MARKER = "_verl_ascend_ext_patch"  # function attribute of our replacements: the patch id
FRAME_READERS = frozenset({"_getframe", "currentframe", "getouterframes", "getframeinfo"})


class UntraceableReplacementError(PatchRefusedError):
    """A replacement torch.compile would not trace (a proxy type, or runtime context read on a traced path)."""


def build(impl: Callable[..., Any], live: Any, patch_id: str, markers: tuple[str, ...], traced: bool,
          reports_itself: bool = False) -> Any:
    """The raw attribute to install in place of ``live`` (a function, staticmethod or classmethod).

    ``traced``: the record's field; an eager replacement reports its first call (``status.exercised``) unless
    ``reports_itself`` (the record's ``acts_when``: the patch code reports when it does its work).
    """
    kind = type(live) if isinstance(live, (staticmethod, classmethod)) else None
    original = live.__func__ if kind is not None else live
    ran: list[bool] = []  # empty until the first call of an eager replacement
    silent = traced or reports_itself
    if silent and inspect.iscoroutinefunction(original):
        async def replacement(*args: Any, **kwargs: Any) -> Any:
            return await impl(original, *args, **kwargs)
    elif silent:
        def replacement(*args: Any, **kwargs: Any) -> Any:
            return impl(original, *args, **kwargs)
    elif inspect.iscoroutinefunction(original):
        async def replacement(*args: Any, **kwargs: Any) -> Any:
            if not ran:
                ran.append(True)
                exercised(patch_id)
            return await impl(original, *args, **kwargs)
    else:
        def replacement(*args: Any, **kwargs: Any) -> Any:
            if not ran:
                ran.append(True)
                exercised(patch_id)
            return impl(original, *args, **kwargs)
    functools.update_wrapper(replacement, original)  # name, qualname, doc, __dict__ (e.g. verl's dispatch attrs)
    mark(replacement, patch_id, markers)
    return kind(replacement) if kind is not None else replacement


def mark(function: Callable[..., Any], patch_id: str, markers: tuple[str, ...]) -> None:
    """Our marker (the patch id) and every exposed foreign marker, as plain function attributes."""
    setattr(function, MARKER, patch_id)
    for marker in markers:
        setattr(function, marker, True)


def untraceable(raw: Any, impl: Any, traced: bool) -> str | None:
    """Why dynamo would not run ``raw`` (an installed attribute calling ``impl``) as written, or None when it would."""
    function = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    for what, obj in (("replacement", function), ("patch code", impl)):
        if type(obj) is not types.FunctionType:  # not isinstance(): proxies report the wrapped object's class
            return (f"the {what} is a {type(obj).__module__}.{type(obj).__qualname__}, not a plain function: "
                    "torch.compile would trace the original behind it and drop the fix")
    if traced:  # our patch code and the helpers it calls; the original is upstream's business
        for code, namespace in _reachable(impl):
            reason = _context_read(code, namespace)
            if reason:
                return f"{code.co_name} {reason}: torch.compile(fullgraph=True) cannot trace it"
    return None


def _reachable(function: types.FunctionType) -> Iterator[tuple[types.CodeType, dict[str, Any]]]:
    """The code of ``function``, of its closure functions and of the same-module functions they call, by name.

    Calls through other modules' functions or attributes are not followed: a helper the patch code relies on
    belongs in the patch code's own module.
    """
    seen: set[types.CodeType] = set()
    todo: list[types.FunctionType] = [function]
    while todo:
        fn = todo.pop()
        if fn.__code__ in seen:
            continue
        seen.add(fn.__code__)
        for code in _codes(fn.__code__):
            yield code, fn.__globals__
            for name in code.co_names:
                value = fn.__globals__.get(name)
                if type(value) is types.FunctionType and value.__module__ == fn.__module__:
                    todo.append(value)
        todo += [cell.cell_contents for cell in fn.__closure__ or ()
                 if type(_cell_value(cell)) is types.FunctionType]


def _cell_value(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell (a name assigned later in the enclosing function)
        return None


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _context_read(code: types.CodeType, namespace: dict[str, Any]) -> str | None:
    frame_names = FRAME_READERS.intersection(code.co_names)
    if frame_names:
        return f"reads the call stack ({', '.join(sorted(frame_names))})"
    for name in code.co_names:
        value = namespace.get(name)
        if isinstance(value, contextvars.ContextVar):
            return f"reads the ContextVar {name}"
        if isinstance(value, threading.local):
            return f"reads the thread-local {name}"
    return None
