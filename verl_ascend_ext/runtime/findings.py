"""One checked fact and how bad it is: the result line of `verl-ascend doctor` and `verl-ascend recipe check`.

Standard library only (and the package's gate parser), so that feature modules can build findings without cost.
Only ``error`` blocks (doctor exits 1, recipe check says do not launch). Recipe check groups findings by ``section``
and reports all fields (``as_dict``); doctor lists its checks by name (``as_check``: the ``name``,
``status``, ``detail`` objects of ``doctor --json`` and of every node's report under ``doctor --ray``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from verl_ascend_ext.patching.gates import Gate, GateValueError, is_default


class Severity(str, Enum):
    """How bad a finding is; the value is what the reports show."""

    OK = "ok"
    INFO = "info"
    WARN = "warn"
    ERROR = "error"
    NOT_CHECKED = "not checked here"  # e.g. a device check on a login node (recipe check --no-device)

    def __str__(self) -> str:
        return self.value


OK, INFO, WARN, ERROR, NOT_CHECKED = Severity.OK, Severity.INFO, Severity.WARN, Severity.ERROR, Severity.NOT_CHECKED
CHECKS = "checks"  # the section of doctor's findings


@dataclass(frozen=True)
class Finding:
    """``section`` groups findings (recipe check: config, manifest, gates, plugin, device, router_replay;
    doctor: ``checks``); ``subject`` names what was checked (a config key, a package, a gate; doctor's check
    name); ``override`` is the Hydra override that caused it, when one did, and ``source`` whether that
    override came from the recipe or the user."""

    section: str
    subject: str
    status: Severity
    detail: str
    override: str | None = None
    source: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.status, Severity):
            try:
                object.__setattr__(self, "status", Severity(self.status))
            except ValueError:
                raise ValueError(f"finding {self.subject!r}: status {self.status!r} is not one of "
                                 f"{', '.join(repr(s.value) for s in Severity)}") from None

    @classmethod
    def check(cls, name: str, status: Severity, detail: str) -> Finding:
        """A doctor check named ``name``."""
        return cls(CHECKS, name, status, detail)

    @property
    def name(self) -> str:
        return self.subject

    @property
    def blocking(self) -> bool:
        return self.status is Severity.ERROR

    def as_dict(self) -> dict[str, Any]:
        """All fields (recipe check's JSON)."""
        return {"section": self.section, "subject": self.subject, "status": self.status.value,
                "detail": self.detail, "override": self.override, "source": self.source}

    def as_check(self) -> dict[str, str]:
        """``name``, ``status``, ``detail`` (doctor's JSON)."""
        return {"name": self.subject, "status": self.status.value, "detail": self.detail}


def gate_check(name: str, environ: Mapping[str, str], gate: Gate, on: str, off: str) -> Finding:
    """Doctor's check of a feature's ``gate`` as ``environ`` sets it: ok with ``on`` (what it does), info with ``off``
    (what is left undone), error naming a value the gate does not accept."""
    try:
        value = gate.read(environ)
    except GateValueError as err:
        return Finding.check(name, ERROR, str(err))
    raw = environ.get(gate.env)
    note = " (default)" if raw is None or is_default(raw) else ""
    return Finding.check(name, OK, f"{gate.env}=on{note}: {on}") if value else \
        Finding.check(name, INFO, f"{gate.env}=off: {off}")
