"""Environment gates: the one parser for every boolean switch of the package, and the kill switch.

verl's config dataclasses reject unknown keys, so every setting of this package travels as an
environment variable. A value we do not understand is an error that names the variable and the
accepted spellings; it is never guessed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import NamedTuple

TRUE_VALUES = ("1", "true", "yes", "on")
FALSE_VALUES = ("0", "false", "no", "off", "")

DISABLE_ENV = "VERL_ASCEND_EXT_DISABLE"


class GateValueError(ValueError):
    """An environment variable of this package holds a value it does not accept."""


class Gate(NamedTuple):
    """A boolean environment switch declared by a feature."""

    env: str
    default: bool
    doc: str

    def read(self, environ: Mapping[str, str] | None = None) -> bool:
        return parse_bool_env(self.env, self.default, environ)


def parse_bool(name: str, raw: str) -> bool:
    """Parse ``raw`` (the value of env var ``name``); raise GateValueError naming both when unknown."""
    value = raw.strip().lower()
    if value in TRUE_VALUES:
        return True
    if value in FALSE_VALUES:
        return False
    raise GateValueError(
        f"{name}={raw!r} is not a boolean this package understands. "
        f"Use one of {', '.join(TRUE_VALUES)} to enable or {', '.join(v or repr(v) for v in FALSE_VALUES)} "
        f"to disable (any case, surrounding spaces ignored), or unset {name} for its default."
    )


def parse_bool_env(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    """Read boolean env var ``name``; unset means ``default``."""
    env = os.environ if environ is None else environ
    raw = env.get(name)
    if raw is None:
        return default
    return parse_bool(name, raw)


def disabled_patch_ids(known_ids: Iterable[str], environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """Patch ids switched off by ``VERL_ASCEND_EXT_DISABLE`` (``id,id`` or ``*``).

    An id that no registered patch has is an error: a typo must not leave a patch on silently.
    """
    env = os.environ if environ is None else environ
    known = frozenset(known_ids)
    raw = env.get(DISABLE_ENV, "")
    names = {part.strip() for part in raw.split(",") if part.strip()}
    if "*" in names:
        return known
    unknown = sorted(names - known)
    if unknown:
        raise GateValueError(
            f"{DISABLE_ENV}={raw!r} names unknown patch id(s) {', '.join(unknown)}. "
            f"Known ids: {', '.join(sorted(known)) or '(none registered)'}; use '*' to disable all."
        )
    return frozenset(names)
