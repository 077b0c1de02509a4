"""Feature declaration: Ascend device hooks (loaded at discovery; no heavy imports).

- An import hook on ``verl.plugin.platform.platform_npu`` re-registers verl's platform name ``huawei``
  with a subclass of verl's ``PlatformNPU`` (``device.platform``). verl imports that module before it
  runs plugin discovery, so the hook runs at once, before anything calls ``get_platform()``; nothing
  here imports torch_npu or creates the platform.
- A patch record on ``verl.trainer.constants_ppo:get_ppo_ray_runtime_env`` adds this package's gates
  that are set in the driver to the job's Ray runtime environment (``device.ray_env``), so they reach
  every worker on every node. ``main_ppo`` imports that function by name; an import hook on it rebinds
  the name if it was bound before the patch (late activation only). The same wrapper arms the cluster check
  (``cluster_check``, settings ``VERL_ASCEND_EXT_CLUSTER_CHECK`` / ``_TIMEOUT``): right after verl's ``ray.init``
  every node that can take the job's workers is asked what it has, and one that differs stops the job before
  training.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING

from verl_ascend_ext.features.device.import_hooks import on_main_ppo, on_platform_module
from verl_ascend_ext.features.device.targets import (
    CLUSTER_CHECK,
    CLUSTER_CHECK_TIMEOUT,
    CONSTANTS,
    FORWARD_GATE,
    GATE,
    MAIN_PPO,
    PLATFORM_MODULE,
    RAY_RECORD_ID,
    RUNTIME_ENV_FUNCTION,
)
from verl_ascend_ext.patching import Fingerprint, Gate, PatchRecord
from verl_ascend_ext.patching.gates import GateValueError, Setting
from verl_ascend_ext.runtime.hookspecs import hookimpl

if TYPE_CHECKING:
    from verl_ascend_ext.runtime.findings import Finding

RAY_RUNTIME_ENV = PatchRecord(
    id=RAY_RECORD_ID,
    feature="device",
    why="verl leaves driver-set variables out of the Ray runtime env, assuming inheritance that only a local Ray "
    "gives: on other nodes this package's gates are missing and those workers silently run unpatched code.",
    target=f"{CONSTANTS}:{RUNTIME_ENV_FUNCTION}",
    gate=FORWARD_GATE,
    distribution="verl",
    versions=">=0.9.0,<0.10",
    original=Fingerprint(
        contains=(
            r"runtime_env = \{'env_vars': PPO_RAY_RUNTIME_ENV\['env_vars'\]\.copy\(\)",
            r"for key in list\(runtime_env\['env_vars'\]\.keys\(\)\):\n\s+if os\.environ\.get\(key\) is not None:"
            r"\n\s+runtime_env\['env_vars'\]\.pop\(key, None\)",
            r"^\s+return runtime_env$",
        ),
        absent=(r"VERL_ASCEND_EXT_|verl_ascend_ext",),
        description="runtime env built from PPO_RAY_RUNTIME_ENV minus variables set in the driver, returned as a dict",
    ),
    fixed=Fingerprint(
        contains=(r"VERL_ASCEND_EXT_|verl_ascend_ext",),
        description="verl forwards this package's variables itself (no verl release does so yet)",
        kept=((r"VERL_ASCEND_EXT_|verl_ascend_ext", "unexercised: no verl release forwards plugin variables yet; "
               "kept so that one that does is recognised and we stand down"),),
    ),
    wrapper="verl_ascend_ext.features.device.ray_env:forward_gates",
    upstream="none: plugin-specific (verl has no hook for plugin variables in the PPO runtime env)",
    remove_when="verl offers plugins a way to add runtime-env variables to run_ppo's ray.init",
    traced=False,
    acts_when="the driver has variables of this package set to carry to the Ray workers (the workers' setup hook, "
              "which boots the plugin in each, is set, and the cluster check armed, on every call)",
)


@hookimpl
def verl_ascend_ext_gates() -> list[Gate]:
    return [GATE, FORWARD_GATE]


@hookimpl
def verl_ascend_ext_settings() -> list[Setting]:
    return [CLUSTER_CHECK, CLUSTER_CHECK_TIMEOUT]


@hookimpl
def verl_ascend_ext_patch_records() -> list[PatchRecord]:
    return [RAY_RUNTIME_ENV]


@hookimpl
def verl_ascend_ext_import_hooks() -> list[tuple[str, Callable[[ModuleType], None]]]:
    return [(PLATFORM_MODULE, on_platform_module), (MAIN_PPO, on_main_ppo)]


@hookimpl
def verl_ascend_ext_doctor_findings(environ: Mapping[str, str]) -> list[Finding]:
    from verl_ascend_ext.features.device.checks import platform_finding

    try:
        on = GATE.read(environ)
    except GateValueError:
        return []  # doctor reports the invalid gate value itself
    return [platform_finding(on)]
