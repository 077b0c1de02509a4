"""The checkpoint feature's doctor checks: verl's own ``checkpoint.strict`` option and the export-check mode,
read statically (no imports of verl or torch)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from verl_ascend_ext.features.checkpoint.mode import MODE_ENV, export_check_mode
from verl_ascend_ext.patching.gates import GateValueError, is_default
from verl_ascend_ext.patching.source import definition_in_file, find_module_file
from verl_ascend_ext.runtime.findings import ERROR, INFO, OK, WARN, Finding


def doctor_findings(environ: Mapping[str, str]) -> list[Finding]:
    """``checkpoint.strict`` as the installed verl declares it, and the export-check mode ``environ`` selects."""
    return [strict_finding(), mode_finding(environ)]


def strict_finding() -> Finding:
    path = find_module_file("verl.trainer.config.config")
    definition = definition_in_file(path, "CheckpointConfig") if path else None
    if definition is None:
        return Finding.check("checkpoint.strict", WARN, "verl.trainer.config.config:CheckpointConfig not found; "
                             "cannot tell whether verl has it")
    found = re.search(r"^\s*strict: bool = (\w+)", definition.text, re.M)
    if not found:
        return Finding.check("checkpoint.strict", WARN, f"CheckpointConfig at {definition.where} has no 'strict' field")
    return Finding.check("checkpoint.strict", OK, f"verl's own option (CheckpointConfig.strict, default "
                         f"{found.group(1)}, {definition.where}); passed to bridge.save_hf_weights unchanged")


def mode_finding(environ: Mapping[str, str]) -> Finding:
    try:
        mode = export_check_mode(environ)
    except GateValueError as err:
        return Finding.check("export check", ERROR, str(err))
    return Finding.check("export check", OK if mode != "off" else INFO,
                         f"{MODE_ENV}={mode}" + _default_note(environ.get(MODE_ENV)))


def _default_note(raw: str | None) -> str:
    if raw is None:
        return " (default)"
    return f" (default: {MODE_ENV} is set but empty, {raw!r})" if is_default(raw) else ""
