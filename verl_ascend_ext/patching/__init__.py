"""The patch engine: records, recognisers, statuses, lazy import hooks. See ``engine`` for the contract."""

from .engine import PatchRefusedError, apply, predict, statuses, unpatch
from .gates import Gate, GateValueError, parse_bool, parse_bool_env
from .record import Fingerprint, PatchRecord, PatchStatus, Status

__all__ = [
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
    "statuses",
    "unpatch",
]
