"""What the device feature's declaration and its hook code share: its gates, the verl modules it hooks, the Ray
record id.

Imports only the gate type, so that the declaration, the import hooks (``import_hooks``, which the boot may run
without loading the declaration) and the code they load lazily (``platform``, ``ray_env``) do not import each
other.
"""

from __future__ import annotations

from verl_ascend_ext.patching.gates import Gate

PLATFORM_MODULE = "verl.plugin.platform.platform_npu"
MAIN_PPO = "verl.trainer.main_ppo"
CONSTANTS = "verl.trainer.constants_ppo"
RUNTIME_ENV_FUNCTION = "get_ppo_ray_runtime_env"
RAY_RECORD_ID = "ray-runtime-env-gates"

GATE = Gate(
    "VERL_ASCEND_EXT_DEVICE_HOOKS",
    default=True,
    doc="Ascend device hooks: verl's NPU platform subclassed (a failing allocator setting warns once per process "
    "with the torch_npu version and the fix; this package's variables in the rollout env).",
)
# Separate from the device hooks: switching those off must not stop the other gates (GLM-5.2's among them)
# from reaching the workers on other nodes.
FORWARD_GATE = Gate(
    "VERL_ASCEND_EXT_FORWARD_ENV",
    default=True,
    doc="Carry this package's variables set in the driver into every Ray worker of a PPO job (runtime env).",
)
