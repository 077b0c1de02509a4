"""The patch engine: records, recognisers, statuses, lazy import hooks. See ``engine`` for the contract.

Importing this package loads only the light declarations (records, gates, statuses); the engine
proper (source reading, wrapping) is loaded on first use of ``apply``/``predict``/``unpatch``.
"""

from __future__ import annotations

from typing import Any

from verl_ascend_ext.patching.errors import PatchRefusedError
from verl_ascend_ext.patching.gates import Gate, GateValueError, parse_bool, parse_bool_env
from verl_ascend_ext.patching.record import Action, Fingerprint, PatchRecord, PatchStatus, Status
from verl_ascend_ext.patching.status import statuses

_ENGINE = ("apply", "predict", "unpatch")


def __getattr__(name: str) -> Any:
    if name in _ENGINE:
        from verl_ascend_ext.patching import engine

        return getattr(engine, name)
    if name == "predict_all":
        from verl_ascend_ext.patching.prediction import predict_all

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
