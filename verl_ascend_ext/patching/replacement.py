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
(``status.exercised``: one record write per process, then a list check per call), unless its record says it acts
only on some calls (``acts_when``): its patch code reports when it acts (``status.acted``) and when it stands down
(``status.stood_down``). An eager replacement also reports an exception of the plugin's own that escapes it
(``status.escaped``, under the record's id, at the line that raised): one raised in this package's code, not in
the original it wraps (``ours``); so patch code raises as any code does and never records by hand. A traced
replacement does none of this, since nothing inside a compiled graph can report itself: its code stays exactly
the call above.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import os
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

from verl_ascend_ext.patching.errors import PatchRefusedError
from verl_ascend_ext.patching.status import escaped, exercised

MARKER = "_verl_ascend_ext_patch"  # function attribute of our replacements: the patch id
FRAME_READERS = frozenset({"_getframe", "currentframe", "getouterframes", "getframeinfo"})
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # verl_ascend_ext/


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
    if traced and inspect.iscoroutinefunction(original):
        async def replacement(*args: Any, **kwargs: Any) -> Any:
            return await impl(original, *args, **kwargs)
    elif traced:
        def replacement(*args: Any, **kwargs: Any) -> Any:
            return impl(original, *args, **kwargs)
    elif inspect.iscoroutinefunction(original):
        async def replacement(*args: Any, **kwargs: Any) -> Any:
            if not ran and not reports_itself:
                ran.append(True)
                exercised(patch_id)
            try:
                return await impl(original, *args, **kwargs)
            except Exception as err:  # cancellation, interrupts and exits are no error of ours
                report_if_ours(patch_id, err, original)
                raise
    else:
        def replacement(*args: Any, **kwargs: Any) -> Any:
            if not ran and not reports_itself:
                ran.append(True)
                exercised(patch_id)
            try:
                return impl(original, *args, **kwargs)
            except Exception as err:  # cancellation, interrupts and exits are no error of ours
                report_if_ours(patch_id, err, original)
                raise
    functools.update_wrapper(replacement, original)  # name, qualname, doc, __dict__ (e.g. verl's dispatch attrs)
    mark(replacement, patch_id, markers)
    return kind(replacement) if kind is not None else replacement


def ours(err: BaseException, original: Any) -> str | None:
    """Where ``err`` was raised (file:line) when this package's code raised it, not the original a replacement
    wraps; None when it came from the original (or what the original called).

    Read from the traceback: the deepest frame that is either this package's code (patch code and the helpers it
    calls; the replacement wrappers of this module aside) or the original's decides; its line is where ours
    raised (or called what raised). An original without Python code (a builtin) leaves no frame: then only an
    exception whose innermost frame is ours counts.
    """
    code = getattr(original, "__code__", None)
    where, last_is_ours, innermost_is_ours = None, False, False
    tb = err.__traceback__
    while tb is not None:
        frame = tb.tb_frame.f_code
        innermost_is_ours = frame.co_filename.startswith(PACKAGE_DIR) and frame.co_filename != __file__
        if frame is code:
            last_is_ours = False
        elif innermost_is_ours:
            where, last_is_ours = f"{frame.co_filename}:{tb.tb_lineno}", True
        tb = tb.tb_next
    if code is None and not innermost_is_ours:
        return None
    return where if last_is_ours else None


def report_if_ours(patch_id: str, err: BaseException, original: Any) -> None:
    """``status.escaped`` for an exception of ours escaping the replacement of ``patch_id`` (see ``ours``)."""
    where = ours(err, original)
    if where is not None:
        escaped(patch_id, err, where)


REPORTED_BY = "_verl_ascend_ext_reported_by"  # set by ``reported`` on the function it makes: the patch id


def reported(patch_id: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator for patch code the engine installs as it is, not behind a replacement it builds: a staticmethod
    record's module-level function (spawn pickles it by module and name, so it cannot sit behind a closure). An
    exception of ours escaping it is reported as the engine reports one escaping a replacement; the engine
    refuses a staticmethod record whose function lacks it."""
    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        def reporting(*args: Any, **kwargs: Any) -> Any:
            try:
                return function(*args, **kwargs)
            except Exception as err:  # cancellation, interrupts and exits are no error of ours
                report_if_ours(patch_id, err, None)
                raise

        # its name, not a ``__wrapped__`` link: the original of a staticmethod record is the engine's to keep
        functools.update_wrapper(reporting, function, updated=())
        del reporting.__wrapped__
        setattr(reporting, REPORTED_BY, patch_id)
        return reporting

    return decorate


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
