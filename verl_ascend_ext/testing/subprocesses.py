"""Run Python, scripts and CLIs in fresh subprocesses for tests, all from ONE scrubbed environment.

Every test subprocess starts from :func:`scrubbed_env`: this process's environment without anything that
changes what this package, verl's plugin discovery, vLLM's plugin loading, the recipe scripts or the Ascend
environment probes do. A test then states exactly what it sets (``env=``/``extra=``), so a variable left in
the developer's shell can neither make a test pass nor fail. This project's tests import it as
``subprocesses`` (tests/subprocesses.py re-exports it); a feature package's tests use it through
``verl_ascend_ext.testing``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

# Locations of this machine's caches and venvs: the fixtures the fetch/setup scripts made live there, and
# they change where things are found, not what the package does. Kept.
KEPT = frozenset({
    "VERL_ASCEND_EXT_CACHE",  # fixture cache (scripts/fetch_*.sh, setup_vllm_engine.sh; the source index)
    "VERL_ASCEND_EXT_VENV",  # the project venv (scripts/env.sh)
    "VERL_ASCEND_EXT_VLLM_VENV",  # the engine venv (scripts/setup_vllm_engine.sh)
    "VERL_ASCEND_EXT_VLLM_LATER_PY",  # the later engine's python (scripts/test.sh -> tests/engine)
})

# Removed: every variable starting with one of these (unless in KEPT) ...
SCRUBBED_PREFIXES = (
    "VERL_ASCEND_",  # this package (VERL_ASCEND_EXT_*: gates, kill switch, status dir, test sysroot, ...)
    #                  and its recipe scripts (VERL_ASCEND_RECIPE_*)
    "VERL_VLLM_ASCEND_",  # the GLM-5.2 patch gates
    "VLLM_",  # vLLM's settings, VLLM_PLUGINS (which plugins vLLM loads) among them
    "ASCEND_", "ATB_", "HCCL_", "PYTORCH_NPU_",  # Ascend toolkit / NNAL / HCCL / torch_npu (set_env.sh)
    "NNODES_",  # recipe scripts: multi-node layout
)
# ... and these exact names.
SCRUBBED_NAMES = frozenset({
    "VERL_USE_EXTERNAL_PLUGINS",  # verl's plugin policy
    "VERL_PLATFORM",  # verl's device platform choice
    "DEVICE", "DRY_RUN",  # recipe script inputs
    "RAY_ADDRESS",  # a driver must not join a cluster from the shell
    "PYTHONPATH",  # set only through ``pythonpath=``
})


def scrubbed(name: str) -> bool:
    """Whether :func:`scrubbed_env` removes ``name``."""
    return name not in KEPT and (name in SCRUBBED_NAMES or name.startswith(SCRUBBED_PREFIXES))


def declared_gates() -> frozenset[str]:
    """The gates of every registered feature (none when the features do not load: then nothing reads a gate)."""
    from verl_ascend_ext.runtime.registry import FeatureDeclarationError, registry

    try:
        return frozenset(gate.env for gate in registry().gates)
    except FeatureDeclarationError:  # a bad feature declaration stops every boot before a gate is read
        return frozenset()


def scrubbed_env(extra: Mapping[str, str | None] | None = None, *, pythonpath: str | None = None) -> dict[str, str]:
    """``os.environ`` without the variables below, then ``extra`` over it (a ``None`` value removes the name),
    then ``PYTHONPATH=pythonpath`` when given.

    Removed (:func:`scrubbed`): names starting with ``VERL_ASCEND_`` (this package and its recipes),
    ``VERL_VLLM_ASCEND_``, ``VLLM_`` (``VLLM_PLUGINS`` too), ``ASCEND_``, ``ATB_``, ``HCCL_``,
    ``PYTORCH_NPU_``, ``NNODES_``; the names ``VERL_USE_EXTERNAL_PLUGINS``, ``VERL_PLATFORM``, ``DEVICE``,
    ``DRY_RUN``, ``RAY_ADDRESS``, ``PYTHONPATH``. Kept although matching: the cache/venv locations
    ``VERL_ASCEND_EXT_CACHE``, ``VERL_ASCEND_EXT_VENV``, ``VERL_ASCEND_EXT_VLLM_VENV``,
    ``VERL_ASCEND_EXT_VLLM_LATER_PY``. Also removed: every gate a registered feature declares, whatever its
    name (a feature package's own gate, e.g. ``MYFIX_ON``).
    """
    gates = declared_gates()
    env = {k: v for k, v in os.environ.items() if not scrubbed(k) and k not in gates}
    for key, value in (extra or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def _checked(proc: subprocess.CompletedProcess[str], check: bool) -> subprocess.CompletedProcess[str]:
    if check and proc.returncode != 0:
        raise AssertionError(f"subprocess {proc.args!r} failed ({proc.returncode}):\nSTDOUT:\n{proc.stdout}\n"
                             f"STDERR:\n{proc.stderr}")
    return proc


def run_command(argv: Sequence[str | Path], env: Mapping[str, str | None] | None = None, *, check: bool = True,
                timeout: float = 300, pythonpath: str | None = None, cwd: str | Path | None = None,
                input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (a script, a CLI) with ``env`` over :func:`scrubbed_env`, capturing text output.

    ``check`` turns a non-zero exit into an AssertionError showing both streams.
    """
    proc = subprocess.run([str(a) for a in argv], env=scrubbed_env(env, pythonpath=pythonpath), capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, input=input)
    return _checked(proc, check)


def run_python(code: str, env: Mapping[str, str | None] | None = None, *, check: bool = True, timeout: float = 300,
               pythonpath: str | None = None, python: str = sys.executable,
               cwd: str | Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (dedented) in a fresh ``python`` interpreter with ``env`` over :func:`scrubbed_env`."""
    return run_command([python, "-c", textwrap.dedent(code)], env, check=check, timeout=timeout,
                       pythonpath=pythonpath, cwd=cwd)


def last_json(stdout: str) -> object:
    """The JSON document printed on the last non-empty line of ``stdout``."""
    return json.loads([line for line in stdout.splitlines() if line.strip()][-1])
