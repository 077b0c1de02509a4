"""The patch engine: records, recognisers, statuses, lazy import hooks. See ``engine`` for the contract.

Each name below loads its module on first use (PEP 562): the boot, which runs in every process, imports only the
statuses, gates and hooks it needs; the record types load with the first feature declaration, the engine proper
(source reading, wrapping) with the first ``apply``/``predict``/``unpatch``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from verl_ascend_ext.patching.engine import apply, predict, unpatch
    from verl_ascend_ext.patching.errors import PatchRefusedError
    from verl_ascend_ext.patching.gates import Gate, GateValueError, parse_bool, parse_bool_env
    from verl_ascend_ext.patching.outcomes import PatchStatus, Status
    from verl_ascend_ext.patching.prediction import predict_all
    from verl_ascend_ext.patching.record import Action, Fingerprint, PatchRecord
    from verl_ascend_ext.patching.status import statuses

_HOME = {  # exported name -> the module of this package that defines it
    "Action": "record", "Fingerprint": "record", "PatchRecord": "record",
    "Gate": "gates", "GateValueError": "gates", "parse_bool": "gates", "parse_bool_env": "gates",
    "PatchRefusedError": "errors", "PatchStatus": "outcomes", "Status": "outcomes", "statuses": "status",
    "apply": "engine", "predict": "engine", "unpatch": "engine", "predict_all": "prediction",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


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
