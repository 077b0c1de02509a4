"""TEST-ONLY: how the engine tier's stand-ins know their targets are still the code they were written for.

A stand-in keeps ``"module:qualname" -> fingerprint`` for each function it reaches past, and refuses (naming itself)
when one differs: a new release cannot silently bypass or double it. The fingerprint is sha256 (16 hex digits) of
the object's source, each line stripped (indentation-independent).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from collections.abc import Mapping
from typing import Any


def fingerprint(obj: Any) -> str:
    source = "\n".join(line.strip() for line in inspect.getsource(obj).splitlines())
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def target(name: str) -> Any:
    """The object ``"module:qualname"`` names (a property's getter for a property)."""
    module_name, _, qualname = name.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj.fget if isinstance(obj, property) else obj


def changed(fingerprints: Mapping[str, str], prefix: str = "") -> dict[str, str]:
    """The targets under ``prefix`` whose source differs from the fingerprinted one: name -> its fingerprint now."""
    out = {}
    for name, expected in fingerprints.items():
        if not name.startswith(prefix):
            continue
        try:
            now = fingerprint(target(name))
        except (AttributeError, ImportError, OSError, TypeError) as err:
            now = f"missing ({type(err).__name__})"
        if now != expected:
            out[name] = now
    return out
