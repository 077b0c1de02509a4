"""Where the repository is and which verl release this environment holds (for tests and their helpers)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def verl_version() -> str:
    """The installed verl release, e.g. ``0.9.0`` (scripts/test.sh swaps 0.9.0 and 0.9.1 in place)."""
    return importlib.metadata.version("verl")
