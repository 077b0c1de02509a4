"""The one static prediction of every patch: what doctor, recipe check, vet and the Ray probe all report.

``predict_all`` reads the kill switch and the gate values of an environment once and predicts each
record with ``engine.predict``. Bad input does not stop it: a kill switch that names unknown ids is
reported and ignored (no patch is listed as disabled), and a record whose gate variable holds a
value the gate parser rejects is ``Status.UNDECIDED`` (shown as ``unknown``), since whether it would
run cannot be told. The messages name the variable and the fix; the callers decide the exit code.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from contextlib import nullcontext
from typing import NamedTuple

from verl_ascend_ext.patching.engine import predict
from verl_ascend_ext.patching.gates import Gate, GateValueError, Setting, disabled_patch_ids, is_default
from verl_ascend_ext.patching.record import PatchRecord, PatchStatus, Status
from verl_ascend_ext.patching.source import Lookup, looking_in


class Predictions(NamedTuple):
    """Each record's predicted status (in record order) and the environment's input errors."""

    statuses: tuple[PatchStatus, ...]
    disable_error: str | None  # VERL_ASCEND_EXT_DISABLE names unknown ids (then it was ignored)
    gate_errors: Mapping[str, str]  # gate or setting variable -> why its value is rejected, in order

    @property
    def errors(self) -> list[str]:
        """Every input error, the kill switch's first (what doctor prints and exits 2 on)."""
        return ([self.disable_error] if self.disable_error else []) + list(self.gate_errors.values())

    def of(self, patch_id: str) -> PatchStatus:
        for status in self.statuses:
            if status.id == patch_id:
                return status
        raise KeyError(patch_id)


def _gate_errors(gates: Iterable[Gate | Setting], environ: Mapping[str, str]) -> dict[str, str]:
    errors = {}
    for gate in gates:
        if is_default(environ.get(gate.env)) or gate.env in errors:
            continue
        try:
            gate.read(environ)
        except GateValueError as err:
            errors[gate.env] = str(err)
    return errors


def predict_all(records: Sequence[PatchRecord], environ: Mapping[str, str] | None = None, *,
                gates: Iterable[Gate | Setting] | None = None, lookup: Lookup | None = None) -> Predictions:
    """Predict every one of ``records`` for a process started with ``environ`` (default: this one's).

    ``gates``: further gates and settings whose values are checked besides the records' own gates (doctor passes
    every declared gate, then every declared setting). ``lookup``: read module files and versions from there instead
    of the installed environment (vet).
    """
    env = os.environ if environ is None else environ
    gate_errors = _gate_errors([*(gates or ()), *(r.gate for r in records)], env)
    try:
        disabled = disabled_patch_ids((r.id for r in records), env)
        disable_error = None
    except GateValueError as err:
        disabled, disable_error = frozenset(), str(err)
    out = []
    with looking_in(lookup) if lookup is not None else nullcontext():
        for record in records:
            if record.gate.env in gate_errors:
                out.append(PatchStatus(record.id, record.target, Status.UNDECIDED,
                                       f"{record.gate.env} has an invalid value"))
                continue
            try:
                out.append(predict(record, disabled, env))
            except GateValueError as err:  # the gate of a patch it serves or needs
                out.append(PatchStatus(record.id, record.target, Status.UNDECIDED, str(err)))
    return Predictions(tuple(out), disable_error, gate_errors)
