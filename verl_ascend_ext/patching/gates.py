"""Environment gates: the one parser for every boolean switch of the package, its settings and the kill switch.

verl's config dataclasses reject unknown keys, so every setting of this package travels as an
environment variable. A value we do not understand is an error that names the variable and the
accepted spellings; it is never guessed. One rule for every variable of the package: unset, or set
but empty (only spaces), means the declared default, as ``${VAR:-default}`` does in a shell
(``export X=$UNSET`` must not switch a default-on feature off).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from verl_ascend_ext.patching.values import Value

TRUE_VALUES = ("1", "true", "yes", "on")
FALSE_VALUES = ("0", "false", "no", "off")

DISABLE_ENV = "VERL_ASCEND_EXT_DISABLE"


class GateValueError(ValueError):
    """An environment variable of this package holds a value it does not accept."""


class Gate(Value):
    """A boolean environment switch declared by a feature."""

    __slots__ = ("default", "doc", "env")
    env: str
    default: bool
    doc: str

    def __init__(self, env: str, default: bool, doc: str) -> None:
        self._set(env=env, default=default, doc=doc)

    def read(self, environ: Mapping[str, str] | None = None) -> bool:
        return parse_bool_env(self.env, self.default, environ)


class Setting(Value):
    """A non-boolean environment variable declared by a feature (e.g. a timeout), shown and checked like a gate.

    ``parse(env, raw)`` turns a set, non-empty value into the setting's value or raises GateValueError naming
    ``env``, the value and the fix; unset or empty means ``default``. ``unit`` is printed after the value.
    """

    __slots__ = ("default", "doc", "env", "parse", "unit")
    env: str
    default: Any
    doc: str
    parse: Callable[[str, str], Any]
    unit: str

    def __init__(self, env: str, default: Any, doc: str, parse: Callable[[str, str], Any], unit: str = "") -> None:
        self._set(env=env, default=default, doc=doc, parse=parse, unit=unit)

    def read(self, environ: Mapping[str, str] | None = None) -> Any:
        env = os.environ if environ is None else environ
        raw = env.get(self.env)
        return self.default if is_default(raw) else self.parse(self.env, raw)


def is_default(raw: str | None) -> bool:
    """True when a variable's raw value means "use the default": unset, or set but empty (spaces only)."""
    return raw is None or not raw.strip()


def parse_bool(name: str, raw: str) -> bool:
    """Parse ``raw`` (the non-empty value of env var ``name``); raise GateValueError naming both when unknown."""
    value = raw.strip().lower()
    if value in TRUE_VALUES:
        return True
    if value in FALSE_VALUES:
        return False
    raise GateValueError(
        f"{name}={raw!r} is not a boolean this package understands. "
        f"Use one of {', '.join(TRUE_VALUES)} to enable or {', '.join(FALSE_VALUES)} "
        f"to disable (any case, surrounding spaces ignored), or unset {name} (or set it empty) for its default."
    )


def parse_bool_env(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    """Read boolean env var ``name``; unset or empty means ``default``."""
    env = os.environ if environ is None else environ
    raw = env.get(name)
    if is_default(raw):
        return default
    return parse_bool(name, raw)


def positive_number(name: str, raw: str, unit: str, example: str) -> float:
    """A number > 0 of ``unit`` (``Setting.parse`` of a bound); raise GateValueError naming ``name`` otherwise."""
    try:
        value = float(raw.strip())
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise GateValueError(f"{name}={raw!r} is not a number of {unit} greater than 0. Set it to e.g. {example}, "
                             f"or unset {name} (or set it empty) for its default.")
    return value


def one_of(name: str, raw: str, modes: tuple[str, ...], what: str, meanings: str) -> str:
    """One of ``modes`` (a mode setting's ``Setting.parse``; the first mode is the default); raise GateValueError
    naming ``name``, ``what`` it is a mode of, each mode's ``meanings`` and the default otherwise."""
    value = raw.strip().lower()
    if value not in modes:
        raise GateValueError(f"{name}={raw!r} is not a mode of {what}. Use {meanings}, or unset it (or set it empty) "
                             f"for its default, {modes[0]}.")
    return value


def positive_seconds(name: str, raw: str) -> float:
    """A number of seconds > 0 (``Setting.parse`` of timeouts)."""
    return positive_number(name, raw, "seconds", "600")


def positive_mebibytes(name: str, raw: str) -> float:
    """A number of MiB > 0 (``Setting.parse`` of memory bounds)."""
    return positive_number(name, raw, "MiB", "50")


def disabled_patch_ids(known_ids: Iterable[str], environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """Patch ids switched off by ``VERL_ASCEND_EXT_DISABLE`` (``id,id`` or ``*``; unset or empty: none).

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
