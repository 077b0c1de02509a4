"""Per-process patch statuses and the on/off decision (gate, kill switch): the light part of the engine.

Discovery needs only this; reading source files and wrapping code (``engine``) loads when a target
module is imported or when doctor predicts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from verl_ascend_ext.patching.gates import DISABLE_ENV
from verl_ascend_ext.patching.record import PatchRecord, PatchStatus, Status

lock = threading.RLock()
_statuses: dict[str, PatchStatus] = {}
_on_change: Callable[[PatchStatus], None] | None = None  # the process record's writer, set at the end of boot


def on_change(listener: Callable[[PatchStatus], None] | None) -> None:
    """Call ``listener`` after every status change from now on (one listener; None stops)."""
    global _on_change
    _on_change = listener


def switched_off(record: PatchRecord, disabled: frozenset[str], environ: Mapping[str, str]) -> PatchStatus | None:
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


def forget(patch_id: str) -> None:
    with lock:
        _statuses.pop(patch_id, None)


def current(patch_id: str) -> PatchStatus | None:
    with lock:
        return _statuses.get(patch_id)


def statuses() -> dict[str, PatchStatus]:
    """In-process statuses, by patch id."""
    with lock:
        return dict(_statuses)
