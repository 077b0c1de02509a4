"""Where the repository and the fixture cache are, and which verl release this environment holds (for tests and their
helpers)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from verl_ascend_ext.patching.cachedir import cache_dir

REPO = Path(__file__).resolve().parents[1]
CACHE = cache_dir()  # the set-up scripts' downloads, fixtures and engine venvs (VERL_ASCEND_EXT_CACHE)


def verl_version() -> str:
    """The installed verl release, e.g. ``0.9.0`` (scripts/test.sh swaps 0.9.0 and 0.9.1 in place)."""
    return importlib.metadata.version("verl")


def script_module(name: str) -> ModuleType:
    """``scripts/<name>.py`` as a module (the folder is no package), loaded once."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
        module = sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]
