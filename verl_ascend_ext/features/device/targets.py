"""What the device feature's declaration and its hook code share: its gates and settings, the verl modules it hooks,
the Ray record id.

Imports only the gate type, so that the declaration, the import hooks (``import_hooks``, which the boot may run
without loading the declaration) and the code they load lazily (``platform``, ``ray_env``) do not import each
other.
"""

from __future__ import annotations

from verl_ascend_ext.patching.gates import Gate, Setting, one_of, positive_seconds

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
CLUSTER_CHECK_MODES = ("error", "warn", "off")


def cluster_check_mode(name: str, raw: str) -> str:
    """One of ``CLUSTER_CHECK_MODES`` (``Setting.parse``); GateValueError naming ``name`` otherwise."""
    return one_of(name, raw, CLUSTER_CHECK_MODES, "the cluster check",
                  "error (stop the job before training), warn (say it and train) or off (no check)")


CLUSTER_CHECK = Setting(
    "VERL_ASCEND_EXT_CLUSTER_CHECK",
    default="error",
    doc="At a PPO job's start, right after verl's ray.init in the driver, every alive node that can take the job's "
    "workers is asked, in the job's runtime env, what it has (this plugin: installed, loaded, version, features, "
    "gates as the job's workers will read them; verl, vLLM, vLLM-Ascend, torch, torch_npu, megatron-core, "
    "transformers, Ray, CANN). A difference or a node where the plugin does not load: error stops the job before "
    "training naming each node, warn says it and trains, off asks nothing. Needs VERL_ASCEND_EXT_FORWARD_ENV on.",
    parse=cluster_check_mode,
)
CLUSTER_CHECK_TIMEOUT = Setting(
    "VERL_ASCEND_EXT_CLUSTER_CHECK_TIMEOUT",
    default=60.0,
    doc="Seconds the cluster check waits for every node's answer (default 60: a node starting its first worker of "
    "the job imports Python and this plugin); a node that has not answered by then is named as not answering.",
    parse=positive_seconds,
    unit="s",
)
