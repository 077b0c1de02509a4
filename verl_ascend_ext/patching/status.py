"""Per-process patch statuses, what each replacement reported, and the on/off decision: the light part of the engine.

Discovery needs only this; reading source files and wrapping code (``engine``) loads when a target
module is imported or when doctor predicts. What a replacement reports, one API for all of it:

- ``exercised``: it ran for the first time (an eager replacement, reported by the engine), or it did its work for
  the first time (``acted``: a record whose ``acts_when`` says it acts only on some calls, reported by its patch
  code where it acts);
- ``stood_down``: it ran without doing its work, on a path it names (e.g. "fully-async sync, no colocated
  rollout"): reported by the patch code of an ``acts_when`` record, kept the first time per path; a path is a fixed
  text, and what varies from call to call (a shape) follows ``DETAIL``: kept from the first call only;
- ``escaped``: an exception of the plugin's own escaped it (the engine tells which exceptions are ours,
  ``replacement``); recorded once per exception, at the line that raised.

A status change (``record_status``) rewrites the process record at once (``on_change``, set by the boot); an error
too (``on_error``). Runs, acts and stand-downs are counted here in memory: the hot path writes nothing, it tells
``on_count`` (the recorder, which writes them within a few seconds, off the caller's thread).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from verl_ascend_ext.patching.gates import DISABLE_ENV
from verl_ascend_ext.patching.outcomes import PatchStatus, Status

if TYPE_CHECKING:
    from verl_ascend_ext.patching.record import Patch

lock = threading.RLock()
_statuses: dict[str, PatchStatus] = {}
_exercised: set[str] = set()  # patch ids whose replacement has run (acted) at least once in this process
_acts: dict[str, int] = {}  # patch id -> calls in which its replacement acted (records with ``acts_when``)
_stood_down: dict[str, dict[str, str]] = {}  # patch id -> path -> the path with its first detail, first seen first
_on_change: Callable[[PatchStatus | None], None] | None = None  # the process record's writer, set at the end of boot
_on_error: Callable[[str, BaseException, str | None], None] | None = None  # the process record's error entry
_on_count: Callable[[], None] | None = None  # told (under ``lock``) when a run, act or stand-down was counted
REPORTED = "_verl_ascend_ext_reported"  # set on an exception once reported (it may escape nested replacements)
DETAIL = "; first seen: "  # in a stand-down path, what follows is its detail (kept from the first call), not the path


def on_change(listener: Callable[[PatchStatus | None], None] | None) -> None:
    """Call ``listener`` after every status change from now on (one listener): written at once."""
    global _on_change
    _on_change = listener


def on_count(listener: Callable[[], None] | None) -> None:
    """Call ``listener()`` (under ``lock``: it must be quick and write nothing) when a replacement ran for the first
    time, acted, or stood down on a new path: counts the record catches up with later (one listener)."""
    global _on_count
    _on_count = listener


def on_error(listener: Callable[[str, BaseException, str | None], None] | None) -> None:
    """Call ``listener(patch id or "boot", exception, file:line)`` for each exception of ours that escaped."""
    global _on_error
    _on_error = listener


def switched_off(record: Patch, disabled: frozenset[str], environ: Mapping[str, str]) -> PatchStatus | None:
    """DISABLED or GATE_OFF status when the kill switch or the gate turn the patch off, else None."""
    if record.id in disabled:
        return PatchStatus(record.id, record.target, Status.DISABLED, f"listed in {DISABLE_ENV}")
    if not record.gate.read(environ):
        return PatchStatus(record.id, record.target, Status.GATE_OFF, f"{record.gate.env} is off")
    return None


def record_status(status: PatchStatus) -> PatchStatus:
    """Store the in-process status of one patch (and tell the process record when it changed)."""
    with lock:
        changed = _statuses.get(status.id) != status
        _statuses[status.id] = status
        if changed and _on_change is not None:
            _on_change(status)
    return status


def exercised(patch_id: str) -> None:
    """The replacement of ``patch_id`` has just run for the first time in this process (later calls: no-op)."""
    with lock:
        if patch_id in _exercised:
            return
        _exercised.add(patch_id)
        if _on_count is not None:
            _on_count()


def acted(patch_id: str) -> None:
    """The replacement of ``patch_id`` (a record with ``acts_when``) has just done its work: reported by its patch
    code where the fix acts, each time (a sync, a save, a micro-batch: never per token), so "exercised" means the fix
    acted and the record counts how often."""
    with lock:
        _exercised.add(patch_id)
        _acts[patch_id] = _acts.get(patch_id, 0) + 1
        if _on_count is not None:
            _on_count()


def stood_down(patch_id: str, path: str) -> None:
    """The replacement of ``patch_id`` ran without doing its work (it called the original as it is) on ``path``,
    a few words a user reads in ``verl-ascend status`` ("fully-async sync, no colocated rollout"): one of a fixed
    set of texts, so that the record stays bounded; what varies by call (a shape) goes after ``DETAIL``, and only
    the first call's is kept."""
    key = path.partition(DETAIL)[0]
    with lock:
        paths = _stood_down.setdefault(patch_id, {})
        if key in paths:
            return
        paths[key] = path
        if _on_count is not None:
            _on_count()


def escaped(patch_id: str, err: BaseException, where: str | None) -> None:
    """An exception of the plugin's own escaped the replacement of ``patch_id`` (or the boot: "boot"), raised at
    ``where``: reported once per exception."""
    with lock:
        listener = _on_error
        reported = vars(err)  # every exception has one (BaseException's __dict__), whatever its __setattr__
        if listener is None or reported.get(REPORTED):  # nothing records yet (early in the boot), or done
            return
        reported[REPORTED] = True
    listener(patch_id, err, where)


def raised_at(err: BaseException) -> str | None:
    """file:line of the innermost frame ``err`` went through (where it was raised), or None."""
    tb = err.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"


def was_exercised(patch_id: str) -> bool:
    with lock:
        return patch_id in _exercised


def acts_of(patch_id: str) -> int:
    with lock:
        return _acts.get(patch_id, 0)


def stood_down_on(patch_id: str) -> list[str]:
    """The paths ``patch_id`` stood down on, first seen first, each with its first call's detail."""
    with lock:
        return list(_stood_down.get(patch_id, {}).values())


def forget(patch_id: str) -> None:
    with lock:
        _statuses.pop(patch_id, None)
        _exercised.discard(patch_id)
        _acts.pop(patch_id, None)
        _stood_down.pop(patch_id, None)


def current(patch_id: str) -> PatchStatus | None:
    with lock:
        return _statuses.get(patch_id)


def statuses() -> dict[str, PatchStatus]:
    """In-process statuses, by patch id."""
    with lock:
        return dict(_statuses)
