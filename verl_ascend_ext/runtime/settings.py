"""Declared environment settings that are not boolean gates (a mode, a path, a number): what the README's table of
switches is generated from, together with the gates (``tooling.switches``).

A feature declares its own with the ``verl_ascend_ext_settings`` hook; the package's core ones are below. Only the
declaration lives here: each setting is parsed where it is used.
"""

from __future__ import annotations

from typing import NamedTuple

from verl_ascend_ext.patching.gates import DISABLE_ENV
from verl_ascend_ext.runtime.process_record import DEFAULT_KEEP, DIR_ENV, KEEP_ENV


class Setting(NamedTuple):
    """An environment variable of this package or a feature that is not an on/off gate."""

    env: str
    default: str  # as shown to a user, e.g. "`error`" or "empty"
    doc: str


CORE = (
    Setting(DISABLE_ENV, "empty", "kill switch: `id,id` or `*` (ids from `verl-ascend doctor`); an unknown id is an "
            "error, not a silent no-op"),
    Setting(DIR_ENV, "`<temp dir>/verl-ascend-ext-status-<uid>`",
            "where each process records what ran in it (`verl-ascend status`)"),
    Setting(KEEP_ENV, f"`{int(DEFAULT_KEEP)}`", "seconds a dead process's record is kept"),
)
