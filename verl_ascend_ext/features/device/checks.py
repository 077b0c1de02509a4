"""The device feature's doctor checks: what its hooks will do on this install, read from verl's installed source
(no imports of verl or torch)."""

from __future__ import annotations

from verl_ascend_ext.features.device.targets import PLATFORM_MODULE
from verl_ascend_ext.patching.source import definition_in_file, find_module_file
from verl_ascend_ext.runtime.findings import INFO, OK, WARN, Finding

NEEDED_METHODS = ("set_allocator_settings", "rollout_env_vars")
REGISTRATION = "@PlatformRegistry.register(platform='huawei')"


def platform_finding(gate_on: bool) -> Finding:
    """Doctor finding ``npu-platform``: will ``huawei`` resolve to our subclass of verl's PlatformNPU?"""
    name = "npu-platform"
    if not gate_on:
        return Finding.check(name, INFO, "VERL_ASCEND_EXT_DEVICE_HOOKS is off: verl's own PlatformNPU is used "
                             "unchanged")
    path = find_module_file(PLATFORM_MODULE)
    if path is None:
        return Finding.check(name, WARN, f"{PLATFORM_MODULE} is not in the installed verl: no NPU platform to extend "
                             "(verl >= 0.9.0 has it); the device hooks will not be installed")
    cls = definition_in_file(path, "PlatformNPU")
    missing = [m for m in NEEDED_METHODS if definition_in_file(path, f"PlatformNPU.{m}") is None]
    if cls is None or missing or REGISTRATION not in cls.text:
        what = "class PlatformNPU" if cls is None else (
            f"PlatformNPU.{', PlatformNPU.'.join(missing)}" if missing else f"the {REGISTRATION} decorator")
        return Finding.check(name, WARN, f"{path}: {what} not found; the device hooks may not fit this verl")
    return Finding.check(name, OK, f"platform 'huawei' ({cls.where}) will be "
                         "verl_ascend_ext.features.device.platform.AscendExtPlatformNPU, a subclass "
                         "(allocator settings warn once, gates in the rollout env)")
