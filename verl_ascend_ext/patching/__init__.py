"""The patch engine: records, recognisers, statuses, lazy import hooks. See ``engine`` for the contract.

Importing this package loads only the light declarations (records, gates, statuses); the engine
proper (source reading, wrapping) is loaded on first use of ``apply``/``predict``/``unpatch``.
"""

from __future__ import annotations

from typing import Any

from .errors import PatchRefusedError
from .gates import Gate, GateValueError, parse_bool, parse_bool_env
from .record import Action, Fingerprint, PatchRecord, PatchStatus, Status
from .status import statuses

_ENGINE = ("apply", "predict", "unpatch")


def __getattr__(name: str) -> Any:
    if name in _ENGINE:
        from . import engine

        return getattr(engine, name)
    if name == "predict_all":
        from .prediction import predict_all

        return predict_all
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Action",
    "Fingerprint",
    "Gate",
    "GateValueError",
    "PatchRecord",
    "PatchRefusedError",
    "PatchStatus",
    "Status",
    "apply",
    "parse_bool",
    "parse_bool_env",
    "predict",
    "predict_all",
    "statuses",
    "unpatch",
]
