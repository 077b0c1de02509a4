"""Per-process patch statuses, which replacements have run, and the on/off decision: the light part of the engine.

Discovery needs only this; reading source files and wrapping code (``engine``) loads when a target
module is imported or when doctor predicts. A replacement that runs eagerly reports its first call here
(``exercised``), once per process: the process record is rewritten then and never again for that patch.
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
_exercised: set[str] = set()  # patch ids whose replacement has run at least once in this process
_on_change: Callable[[PatchStatus | None], None] | None = None  # the process record's writer, set at the end of boot


def on_change(listener: Callable[[PatchStatus | None], None] | None) -> None:
    """Call ``listener`` after every status change and first run of a replacement from now on (one listener)."""
    global _on_change
    _on_change = listener


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
        if _on_change is not None:
            _on_change(_statuses.get(patch_id))


def was_exercised(patch_id: str) -> bool:
    with lock:
        return patch_id in _exercised


def forget(patch_id: str) -> None:
    with lock:
        _statuses.pop(patch_id, None)
        _exercised.discard(patch_id)


def current(patch_id: str) -> PatchStatus | None:
    with lock:
        return _statuses.get(patch_id)


def statuses() -> dict[str, PatchStatus]:
    """In-process statuses, by patch id."""
    with lock:
        return dict(_statuses)
