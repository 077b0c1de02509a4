"""Which of this package's environment variables are set in a process (what must travel to other processes).

Every gate any feature declares (``VERL_VLLM_ASCEND_GLM52_PATCH`` included), the kill switch, and
every other ``VERL_ASCEND_EXT_*`` setting (e.g. the export-check mode, read in the workers that
save checkpoints). A variable that is not set is not carried: the receiving process then uses the
declared default, exactly as the sending process did.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from verl_ascend_ext.patching.gates import DISABLE_ENV

PREFIX = "VERL_ASCEND_EXT_"
NODE_LOCAL = frozenset({"VERL_ASCEND_EXT_CACHE", "VERL_ASCEND_EXT_VENV",  # paths of this machine: never carried
                        "VERL_ASCEND_EXT_TEST_SYSROOT"})


def package_env_names() -> tuple[str, ...]:
    """Names of every gate of every registered feature, then the kill switch."""
    from verl_ascend_ext.runtime.registry import registry  # pluggy and the features: not at the boot's import

    return (*(gate.env for gate in registry().gates), DISABLE_ENV)


def package_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """This package's variables that are set in ``environ`` (default: this process), with their raw values."""
    env = os.environ if environ is None else environ
    settings = sorted(n for n in env if n.startswith(PREFIX) and n not in NODE_LOCAL)
    names = dict.fromkeys((*package_env_names(), *settings))
    return {name: env[name] for name in names if name in env}
