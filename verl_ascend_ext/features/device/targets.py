"""Names the device feature's declaration and its hook code share: the verl modules it hooks, the Ray record id.

A leaf module (imports nothing), so that the declaration (``feature``) and the code it loads lazily
(``ray_env``, ``static``) do not import each other.
"""

from __future__ import annotations

PLATFORM_MODULE = "verl.plugin.platform.platform_npu"
MAIN_PPO = "verl.trainer.main_ppo"
CONSTANTS = "verl.trainer.constants_ppo"
RUNTIME_ENV_FUNCTION = "get_ppo_ray_runtime_env"
RAY_RECORD_ID = "ray-runtime-env-gates"
