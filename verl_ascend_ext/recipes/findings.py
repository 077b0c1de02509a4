"""One result line of `verl-ascend recipe check`; only ``error`` findings block a launch."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

OK = "ok"
INFO = "info"
WARN = "warn"
ERROR = "error"
NOT_CHECKED = "not checked here"


@dataclass(frozen=True)
class Finding:
    """``section`` groups findings (config, manifest, gates, plugin, device, router_replay); ``subject``
    names what was checked (a config key, a package, a gate); ``override`` is the Hydra override that
    caused it, when one did, and ``source`` whether that override came from the recipe or the user."""

    section: str
    subject: str
    status: str
    detail: str
    override: str | None = None
    source: str | None = None

    @property
    def blocking(self) -> bool:
        return self.status == ERROR

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
