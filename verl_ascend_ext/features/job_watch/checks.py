"""The job watch feature's doctor check: whether a job's lost process ends the job (the watch's gate), and whether
the setting it relies on (every process recording its end) holds."""

from __future__ import annotations

from collections.abc import Mapping

from verl_ascend_ext.patching.gates import Gate, GateValueError
from verl_ascend_ext.runtime.findings import WARN, Finding, gate_check
from verl_ascend_ext.runtime.records import process_end

NAME = "job watch"


def doctor_findings(environ: Mapping[str, str], gate: Gate) -> list[Finding]:
    """The watch's ``gate`` as ``environ`` sets it; a warning when it is on while process ends are not recorded."""
    found = gate_check(NAME, environ, gate, "a process of a job lost mid-job (killed, crashed, ended by a signal or an "
                       "error) ends the job within seconds, named first by `verl-ascend status`",
                       "a job that loses a process may wait for ever (a dead EngineCore hangs a hybrid job)")
    try:
        broken = gate.read(environ) and not process_end.GATE.read(environ)
    except GateValueError:  # the gate's own finding names the bad value
        return [found]
    if broken:
        return [Finding.check(NAME, WARN, f"{gate.env} is on but {process_end.GATE.env}=0: no process records how "
                              "it ended, so the watch cannot tell a clean exit from a loss and does not start: a "
                              f"lost process is not noticed. Fix: unset {process_end.GATE.env}, or set "
                              f"{gate.env}=0 to switch the watch off on purpose.")]
    return [found]
