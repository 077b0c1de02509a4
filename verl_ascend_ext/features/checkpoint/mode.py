"""The export check's mode, ``VERL_ASCEND_EXT_EXPORT_CHECK`` (error|warn|off): no import beyond the gates.

Read at worker start-up and by the doctor, which must not load the check itself (safetensors).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from verl_ascend_ext.patching.gates import GateValueError, is_default

MODE_ENV = "VERL_ASCEND_EXT_EXPORT_CHECK"
MODES = ("error", "warn", "off")
DEFAULT_MODE = "error"


def export_check_mode(environ: Mapping[str, str] | None = None) -> str:
    """``VERL_ASCEND_EXT_EXPORT_CHECK`` (error|warn|off; unset or empty: error); raise naming the variable on a bad
    value."""
    env = os.environ if environ is None else environ
    raw = env.get(MODE_ENV)
    if is_default(raw):
        return DEFAULT_MODE
    value = raw.strip().lower()
    if value not in MODES:
        raise GateValueError(
            f"{MODE_ENV}={raw!r} is not a mode of the checkpoint export check. Use one of {', '.join(MODES)} "
            f"(error: an export failing the check fails the save; warn: log it; off: no check), "
            f"or unset it (or set it empty) for '{DEFAULT_MODE}'."
        )
    return value
