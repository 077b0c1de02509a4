"""Carry this package's gates into the Ray runtime environment of a PPO job (replacement code, loaded lazily).

verl's ``run_ppo`` builds the job's runtime environment as
``OmegaConf.merge(get_ppo_ray_runtime_env(config), ray_kwargs.ray_init.runtime_env)`` and passes it to
``ray.init``; Ray applies it to every worker process on every node. ``get_ppo_ray_runtime_env`` leaves
out variables already set in the driver, assuming workers inherit them, which holds only for a Ray
started by the driver itself: raylets of other nodes were started by someone else. The wrapper adds
each of this package's variables that is set in the driver (``env.package_env``) as a default, so the
user's own ``runtime_env.env_vars`` entry, merged on top by verl, still wins; nothing is added for a
variable that is not set. It also arms the cluster check (``cluster_check``), which runs right after that
``ray.init``.
"""

from __future__ import annotations

import logging
import sys
from types import ModuleType
from typing import Any

from verl_ascend_ext.features.device.env import package_env
from verl_ascend_ext.features.device.targets import CONSTANTS, RAY_RECORD_ID, RUNTIME_ENV_FUNCTION
from verl_ascend_ext.patching.status import acted

logger = logging.getLogger("verl_ascend_ext.features.device")


def forward_gates(original: Any, *args: Any, **kwargs: Any) -> Any:
    """``get_ppo_ray_runtime_env`` plus every package variable set in this process (verl's values kept), and the
    plugin's boot as every worker's setup hook (a hook of the user's own stays: then a worker boots the plugin when
    it imports verl)."""
    from verl_ascend_ext.features.device import cluster_check
    from verl_ascend_ext.runtime.boot import RAY_SETUP_HOOK

    runtime_env = original(*args, **kwargs)
    runtime_env.setdefault("worker_process_setup_hook", RAY_SETUP_HOOK)
    cluster_check.arm()  # run_ppo's ray.init with this runtime env comes next: the nodes are asked right after it
    ours = package_env()
    if ours:
        acted(RAY_RECORD_ID)
        env_vars = runtime_env.setdefault("env_vars", {})
        for name, value in ours.items():
            env_vars.setdefault(name, value)
        logger.info("verl-ascend-ext: Ray runtime env carries %s", ", ".join(sorted(ours)))
    return runtime_env


def rebind_main_ppo(main_ppo: ModuleType) -> None:
    """Point ``main_ppo``'s by-name import at the patched function when it was bound before the patch.

    Normally nothing to do: verl's plugin discovery runs in ``verl/__init__`` before any ``verl.trainer``
    module, so ``constants_ppo`` is patched by the time ``main_ppo`` runs its ``from ... import``. This
    covers a late ``verl_ascend_ext.activate()``. Only our own wrapper of the exact function ``main_ppo``
    holds is bound; anything else is left alone.
    """
    constants = sys.modules.get(CONSTANTS)
    patched = getattr(constants, RUNTIME_ENV_FUNCTION, None)
    bound = getattr(main_ppo, RUNTIME_ENV_FUNCTION, None)
    from verl_ascend_ext.patching.replacement import MARKER

    ours = getattr(patched, MARKER, None) == RAY_RECORD_ID
    if ours and bound is not None and bound is not patched and getattr(patched, "__wrapped__", None) is bound:
        setattr(main_ppo, RUNTIME_ENV_FUNCTION, patched)
        logger.info("verl-ascend-ext: rebound %s.%s to the gate-forwarding wrapper", main_ppo.__name__,
                    RUNTIME_ENV_FUNCTION)
