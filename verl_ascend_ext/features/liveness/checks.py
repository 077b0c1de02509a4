"""The liveness feature's doctor check: whether a job's lost process ends the job (the watch's gate)."""

from __future__ import annotations

from collections.abc import Mapping

from verl_ascend_ext.patching.gates import Gate, GateValueError, is_default
from verl_ascend_ext.runtime.findings import ERROR, INFO, OK, Finding

NAME = "job watch"


def doctor_findings(environ: Mapping[str, str], gate: Gate) -> list[Finding]:
    """The watch's ``gate`` as ``environ`` sets it."""
    try:
        on = gate.read(environ)
    except GateValueError as err:
        return [Finding.check(NAME, ERROR, str(err))]
    note = " (default)" if environ.get(gate.env) is None or is_default(environ[gate.env]) else ""
    if on:
        return [Finding.check(NAME, OK, f"{gate.env}=on{note}: a process of a job lost mid-job (killed, crashed, "
                              "ended by a signal or an error) ends the job within seconds, named first by "
                              "`verl-ascend status`")]
    return [Finding.check(NAME, INFO, f"{gate.env}=off: a job that loses a process may wait for ever (a dead "
                          "EngineCore hangs a hybrid job)")]
