"""Serialise a (Megatron) transformer config to JSON-safe data, whole and recursively.

Objects with ``to_dict`` (transformers configs), dataclasses, enums, dtypes, numpy scalars, sets and
paths are converted; functions and classes become their import path, ``functools.partial`` a small
dict. Anything else is named, with its key path, in one WARNING and left out: never silently lost.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
import math
import os
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger("verl_ascend_ext")

_SKIP = object()


def _type_name(value: Any) -> str:
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


def _qualified(value: Any) -> str:
    return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', getattr(value, '__name__', '?'))}"


class _Serialiser:
    def __init__(self) -> None:
        self.unserialisable: list[str] = []
        self._active: set[int] = set()

    def value(self, value: Any, path: str) -> Any:
        if value is None or isinstance(value, (str, bool, int)):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else str(value)  # strict JSON has no NaN/Infinity
        if isinstance(value, enum.Enum):
            return str(value)  # what verl writes for enums
        if type(value).__module__ == "torch" and type(value).__name__ == "dtype":
            return str(value)
        if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "shape", None) == ():
            return self.value(value.item(), path)
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        if isinstance(value, functools.partial):
            return {"partial": _qualified(value.func), "args": self.value(list(value.args), f"{path}.args"),
                    "keywords": self.value(dict(value.keywords), f"{path}.keywords")}
        if isinstance(value, type) or (callable(value) and hasattr(value, "__qualname__")
                                       and not hasattr(value, "to_dict")):
            return _qualified(value)
        if id(value) in self._active:
            self.unserialisable.append(f"{path} (reference cycle)")
            return _SKIP
        self._active.add(id(value))
        try:
            return self._container(value, path)
        finally:
            self._active.discard(id(value))

    def _container(self, value: Any, path: str) -> Any:
        if isinstance(value, Mapping):
            return self.mapping(value, path)
        if isinstance(value, (list, tuple)):
            return self.sequence(value, path)
        if isinstance(value, (set, frozenset)):
            return self.sequence(sorted(value, key=repr), path)
        to_dict = getattr(value, "to_dict", None)
        if callable(to_dict):
            return self.value(to_dict(), path)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if hasattr(value, f.name)}
            return self.mapping(fields, path)
        self.unserialisable.append(f"{path} ({_type_name(value)})")
        return _SKIP

    def mapping(self, value: Mapping[Any, Any], path: str) -> dict[str, Any]:
        out = {}
        for key, item in value.items():
            if isinstance(key, str):
                name = key
            else:
                key_value = self.value(key, f"{path}.<key {type(key).__name__}>")
                if key_value is _SKIP:
                    continue  # named in the warning by self.value; never written under a made-up name
                name = str(key_value)
            converted = self.value(item, f"{path}.{name}" if path else name)
            if converted is not _SKIP:
                out[name] = converted
        return out

    def sequence(self, value: Any, path: str) -> list[Any]:
        out = []
        for i, item in enumerate(value):
            converted = self.value(item, f"{path}[{i}]")
            if converted is not _SKIP:
                out.append(converted)
        return out


def config_to_json_safe(config_dict: Mapping[str, Any], what: str = "transformer config") -> dict[str, Any]:
    """JSON-safe copy of ``config_dict``; one WARNING names every value left out, by key path and type."""
    serialiser = _Serialiser()
    out = serialiser.mapping(config_dict, "")
    if serialiser.unserialisable:
        logger.warning("verl-ascend-ext: %d value(s) of the %s cannot be written to JSON and were left out: %s",
                       len(serialiser.unserialisable), what, ", ".join(serialiser.unserialisable))
    return out
