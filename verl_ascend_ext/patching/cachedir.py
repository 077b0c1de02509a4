"""Where this package keeps what it can rebuild: ``$VERL_ASCEND_EXT_CACHE``, else ``~/.cache/verl-ascend-ext``.

The source index lives there (``source``), and the test set-up's downloads and engine venvs. Deleting it is always
safe. Only the standard library is imported.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "VERL_ASCEND_EXT_CACHE"


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "verl-ascend-ext"))
