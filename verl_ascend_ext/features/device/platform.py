"""verl's own NPU platform, subclassed: allocator settings that warn once instead of failing quietly, and a
rollout environment that carries this package's gates.

Imported only from the post-import hook on ``verl.plugin.platform.platform_npu`` (see ``feature``), i.e.
after verl imported torch and tried torch_npu itself; this module imports neither torch_npu nor calls
``get_platform()``. ``register`` re-registers the platform name ``huawei`` in verl's ``PlatformRegistry``
with :class:`AscendExtPlatformNPU`, so verl's auto-detection (or ``VERL_PLATFORM=huawei``) creates ours;
every other method stays verl's.
"""

from __future__ import annotations

import logging
import threading
from types import ModuleType

import torch
from verl.plugin.platform import platform_manager
from verl.plugin.platform.platform_npu import PlatformNPU

from verl_ascend_ext.features.device.env import package_env

logger = logging.getLogger("verl_ascend_ext.features.device")

PLATFORM_NAME = "huawei"
TORCH_NPU_MIN_FOR_ALLOCATOR = "2.9.0"

_warn_lock = threading.Lock()
_warned = False


def torch_npu_version() -> str:
    from verl_ascend_ext.patching.engine import installed_version

    return installed_version("torch_npu") or "not installed"


def warn_allocator_once(settings: str, err: BaseException) -> bool:
    """Log the allocator warning the first time in this process; later failures go to DEBUG. True if it warned."""
    global _warned
    with _warn_lock:
        first, _warned = not _warned, True
    if not first:
        logger.debug("NPU allocator setting %r not applied again: %s: %s", settings, type(err).__name__, err)
        return False
    logger.warning(
        "verl-ascend-ext: NPU allocator setting %r could not be applied through "
        "torch.npu.memory._set_allocator_settings (%s: %s); torch_npu %s. Training continues with the allocator's "
        "current settings, so expandable segments stay as they were. Fix: upgrade torch_npu to %s or later "
        "(with its matching CANN), or set PYTORCH_NPU_ALLOC_CONF=expandable_segments:True in the environment of "
        "every process before it starts (static: verl cannot then switch it off around weight sync). "
        "This warning is shown once per process.",
        settings, type(err).__name__, err, torch_npu_version(), TORCH_NPU_MIN_FOR_ALLOCATOR,
    )
    return True


class AscendExtPlatformNPU(PlatformNPU):
    """verl's ``PlatformNPU`` with a loud allocator setter and this package's gates in the rollout env."""

    def set_allocator_settings(self, settings: str) -> None:
        try:
            torch.npu.memory._set_allocator_settings(settings)
        except Exception as err:  # the contract: any failure of the device call is reported, never raised
            warn_allocator_once(settings, err)

    def rollout_env_vars(self) -> dict[str, str]:
        env_vars = super().rollout_env_vars()
        for name, value in package_env().items():
            env_vars.setdefault(name, value)
        return env_vars


def register(platform_npu: ModuleType) -> bool:
    """Make ``huawei`` resolve to our subclass (idempotent). False, with a warning, when it cannot."""
    registry = platform_manager.PlatformRegistry
    current = registry._platforms.get(PLATFORM_NAME)
    if current is AscendExtPlatformNPU:
        return True
    if current is not platform_npu.PlatformNPU:
        logger.warning(
            "verl-ascend-ext: verl's platform %r is %s, not verl's own PlatformNPU; another plugin replaced it, "
            "so the Ascend device hooks (allocator warning, gates in the rollout env) are not installed. "
            "Set VERL_ASCEND_EXT_DEVICE_HOOKS=0 to silence this, or remove the other plugin.",
            PLATFORM_NAME, getattr(current, "__qualname__", current),
        )
        return False
    registry.register(platform=PLATFORM_NAME)(AscendExtPlatformNPU)
    created = getattr(platform_manager, "_current_platform", None)
    if type(created) is platform_npu.PlatformNPU:
        logger.warning(
            "verl-ascend-ext: verl's NPU platform object was created before the plugin booted, so this process "
            "keeps verl's own PlatformNPU; the Ascend device hooks apply where verl's plugin discovery runs first "
            "(the normal case: the plugin boots inside `import verl`)."
        )
    return True
