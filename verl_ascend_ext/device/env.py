"""Which of this package's environment variables are set in a process (what must travel to other processes).

Every gate any feature declares, plus the kill switch ``VERL_ASCEND_EXT_DISABLE``. A variable that
is not set is not carried: the receiving process then uses the gate's declared default, exactly as
the sending process did.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..features import registry
from ..patching.gates import DISABLE_ENV


def package_env_names() -> tuple[str, ...]:
    """Names of every gate of every registered feature, then the kill switch."""
    return (*(gate.env for gate in registry().gates), DISABLE_ENV)


def package_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """This package's variables that are set in ``environ`` (default: this process), with their raw values."""
    env = os.environ if environ is None else environ
    return {name: env[name] for name in package_env_names() if name in env}
