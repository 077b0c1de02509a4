"""The fully-async generation feature's doctor check: whether a failed rollout generation fails the job."""

from __future__ import annotations

from collections.abc import Mapping

from verl_ascend_ext.patching.gates import Gate
from verl_ascend_ext.runtime.findings import Finding, gate_check

NAME = "fully-async generation"


def doctor_findings(environ: Mapping[str, str], gate: Gate) -> list[Finding]:
    """The feature's ``gate`` as ``environ`` sets it."""
    return [gate_check(NAME, environ, gate, "a failed fully-async rollout generation fails the job, named",
                       "a failed fully-async rollout generation ends the data: the trainer force-saves and exits 0 "
                       "over it (verl #6387)")]
