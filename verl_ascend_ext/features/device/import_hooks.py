"""The device feature's post-import hooks (declared in ``declaration``; the boot manifest names them by import path).

Light on purpose: every process registers them at boot, and the one on verl's platform module runs at once (verl
imports that module before its plugin discovery). Each reads its gate, then loads the code it needs.
"""

from __future__ import annotations

from types import ModuleType

from verl_ascend_ext.features.device.targets import FORWARD_GATE, GATE


def on_platform_module(module: ModuleType) -> None:
    """verl's NPU platform module was imported: register the subclass under verl's platform name."""
    if not GATE.read():
        return
    from verl_ascend_ext.features.device.platform import register

    register(module)


def on_main_ppo(module: ModuleType) -> None:
    """``verl.trainer.main_ppo`` was imported: rebind its copy of the runtime-env function if bound unpatched."""
    if not FORWARD_GATE.read():
        return
    from verl_ascend_ext.features.device.ray_env import rebind_main_ppo

    rebind_main_ppo(module)
