"""The liveness feature's doctor check: whether a job's lost process ends the job (the watch's gate)."""

from __future__ import annotations

from collections.abc import Mapping

from verl_ascend_ext.patching.gates import Gate
from verl_ascend_ext.runtime.findings import Finding, gate_check

NAME = "job watch"


def doctor_findings(environ: Mapping[str, str], gate: Gate) -> list[Finding]:
    """The watch's ``gate`` as ``environ`` sets it."""
    return [gate_check(NAME, environ, gate, "a process of a job lost mid-job (killed, crashed, ended by a signal or an "
                       "error) ends the job within seconds, named first by `verl-ascend status`",
                       "a job that loses a process may wait for ever (a dead EngineCore hangs a hybrid job)")]
