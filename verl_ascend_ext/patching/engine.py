"""The patch engine: one decision for every patch, made statically or in-process, and applied at most once.

``predict`` reads the installed source file (doctor, login nodes); ``apply`` looks at the live object
after its module was imported. Both hand the definition they found to ``classify``, so a prediction
and what really happens cannot disagree. ``apply`` wraps with wrapt, marks the wrapper with the
patch id, refuses (raises) on code it does not recognise, and is a no-op when the target already
carries our wrapper or a foreign marker. ``unpatch`` restores only our own wrapper (tests).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import wrapt

from .gates import DISABLE_ENV, GateValueError, parse_bool_env
from .record import PatchRecord, PatchStatus, Status
from .source import Definition, definition_in_file, definition_of_object, find_module_file

MARKER = "_self_verl_ascend_ext_patch"  # wrapt stores `_self_*` attributes on the proxy, not the wrapped function


class PatchRefusedError(RuntimeError):
    """A gated patch met code it does not recognise; nothing was changed."""


@dataclass
class _Applied:
    owner: Any
    name: str
    original: Any
    had_own_attribute: bool
    wrapper: Any


_lock = threading.RLock()
_statuses: dict[str, PatchStatus] = {}
_applied: dict[str, _Applied] = {}  # patch id -> what we replaced


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def refusal_message(record: PatchRecord, definition: Definition | None, where: str, reason: str) -> str:
    version = installed_version(record.distribution) or "not installed"
    location = definition.where if definition else where
    return (
        f"verl-ascend-ext refused patch '{record.id}': {record.target} at {location} is not code this patch "
        f"recognises ({reason}). Installed: {record.distribution} {version}; this patch knows "
        f"{record.distribution} {record.versions}. Nothing was changed. Fix: use a {record.distribution} release "
        f"in {record.versions}, or run without this fix by setting {DISABLE_ENV}={record.id} "
        f"(or {record.gate}=0)."
    )


def classify(record: PatchRecord, definition: Definition | None, where: str) -> tuple[Status, str]:
    """The shared decision: fixed upstream, patchable, or refused (with the full message)."""
    if definition is None:
        return Status.REFUSED, refusal_message(record, None, where, f"'{record.qualname}' is not defined there")
    if record.fixed.matches(definition.text):
        return Status.FIXED_UPSTREAM, f"recognised the fix in place: {record.fixed.description}"
    if record.original.matches(definition.text):
        return Status.WILL_APPLY, f"recognised the code to fix: {record.original.description}"
    reason = f"original fingerprint: {record.original.explain(definition.text)}"
    return Status.REFUSED, refusal_message(record, definition, where, reason)


def switched_off(record: PatchRecord, disabled: frozenset[str], environ: Mapping[str, str]) -> PatchStatus | None:
    """DISABLED or GATE_OFF status when the kill switch or the gate turn the patch off, else None."""
    if record.id in disabled:
        return PatchStatus(record.id, record.target, Status.DISABLED, f"listed in {DISABLE_ENV}")
    if not parse_bool_env(record.gate, _gate_default(record.gate), environ):
        return PatchStatus(record.id, record.target, Status.GATE_OFF, f"{record.gate} is off")
    return None


_gate_defaults: dict[str, bool] = {}


def set_gate_defaults(defaults: Mapping[str, bool]) -> None:
    """Record the declared default of every gate (from the features' gate declarations)."""
    _gate_defaults.update(defaults)


def _gate_default(env: str) -> bool:
    return _gate_defaults.get(env, False)


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
    definition = definition_in_file(path, record.qualname)
    status, detail = classify(record, definition, str(path))
    return PatchStatus(record.id, record.target, status, detail, definition.where if definition else str(path))


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


def _foreign_marker(record: PatchRecord, owner: Any, current: Any) -> str | None:
    for marker in record.foreign_markers:
        for obj in (current, getattr(current, "__func__", None), owner):
            if obj is not None and getattr(obj, marker, False):
                return marker
    return None


def _set(record: PatchRecord, status: Status, detail: str, where: str = "") -> PatchStatus:
    result = PatchStatus(record.id, record.target, status, detail, where)
    _statuses[record.id] = result
    return result


def apply(record: PatchRecord) -> PatchStatus:
    """Apply ``record`` to its imported target module, at most once; raise PatchRefusedError on unknown code."""
    with _lock:
        try:
            owner, name, current = _resolve(record)
        except (KeyError, AttributeError):
            message = refusal_message(record, None, record.module, f"'{record.qualname}' does not exist")
            _set(record, Status.REFUSED, message)
            raise PatchRefusedError(message) from None
        mine = getattr(current, MARKER, None)
        if mine == record.id:
            return _statuses[record.id]
        if mine is not None:
            raise PatchRefusedError(
                f"verl-ascend-ext: {record.target} is already wrapped by patch '{mine}'; "
                f"patch '{record.id}' declares the same target. Declare one patch per target."
            )
        marker = _foreign_marker(record, owner, current)
        if marker is not None:
            return _set(record, Status.ALREADY_APPLIED, f"another copy of this fix is in place (marker {marker})")
        definition = definition_of_object(current)
        status, detail = classify(record, definition, f"{record.module} (no Python source for the live object)")
        if status is Status.REFUSED:
            _set(record, status, detail, definition.where if definition else "")
            raise PatchRefusedError(detail)
        if status is Status.FIXED_UPSTREAM:
            return _set(record, status, detail, definition.where if definition else "")
        module_name, _, func_name = record.wrapper.partition(":")
        wrapper_fn = getattr(importlib.import_module(module_name), func_name)
        wrapper = wrapt.FunctionWrapper(current, wrapper_fn)
        setattr(wrapper, MARKER, record.id)
        had_own = not isinstance(owner, type) or name in vars(owner)
        setattr(owner, name, wrapper)
        _applied[record.id] = _Applied(owner, name, current, had_own, wrapper)
        return _set(record, Status.APPLIED, detail, definition.where if definition else "")


def unpatch(patch_id: str) -> bool:
    """Restore the original of ``patch_id`` if our wrapper is still in place; forget its status."""
    with _lock:
        _statuses.pop(patch_id, None)
        done = _applied.pop(patch_id, None)
        if done is None:
            return False
        current = (vars(done.owner).get(done.name) if isinstance(done.owner, type)
                   else getattr(done.owner, done.name, None))
        if current is not done.wrapper:
            return False
        if done.had_own_attribute:
            setattr(done.owner, done.name, done.original)
        else:
            delattr(done.owner, done.name)
        return True


def record_status(status: PatchStatus) -> None:
    """Store a status decided outside ``apply`` (gate off, disabled, pending)."""
    with _lock:
        _statuses[status.id] = status


def statuses() -> dict[str, PatchStatus]:
    """In-process statuses, by patch id."""
    with _lock:
        return dict(_statuses)


__all__ = [
    "GateValueError",
    "PatchRefusedError",
    "apply",
    "classify",
    "predict",
    "record_status",
    "statuses",
    "unpatch",
]
