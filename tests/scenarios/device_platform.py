"""Drive verl's real NPU platform code paths on the NPU test double and print what happened, as JSON.

Run in a fresh interpreter with ``tests/npu_double`` on PYTHONPATH and ``NPU_DOUBLE`` set (the double is
installed by its sitecustomize before this script runs). Calls go through verl's own helpers
(``verl.utils.device.set_expandable_segments`` -> ``get_platform().set_allocator_settings``), exactly the
functions verl's engine workers and vLLM server call.
"""

from __future__ import annotations

import json
import logging
import sys

import torch
import verl  # noqa: F401  (plugin discovery happens here)
from verl.plugin.platform import platform_manager
from verl.plugin.platform.platform_npu import PlatformNPU

created_before = platform_manager._current_platform  # the plugin must not have created the platform

records: list[logging.LogRecord] = []


class Collect(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        records.append(record)


logging.getLogger().addHandler(Collect(level=logging.WARNING))

from verl.plugin.platform import get_platform  # noqa: E402
from verl.utils import device  # noqa: E402

platform = get_platform()
errors = []
allocator_calls = []
if hasattr(torch, "npu"):  # without the double verl picks its CUDA platform: no allocator calls to make
    calls_before = len(torch.npu.CALLS)
    for enable in (False, True, False, True):
        try:
            device.set_expandable_segments(enable)
        except Exception as err:
            errors.append(f"{type(err).__name__}: {err}")
    allocator_calls = [args[0] for name, args in torch.npu.CALLS[calls_before:]
                       if name == "memory._set_allocator_settings"]
warnings = [r.getMessage() for r in records if r.levelno >= logging.WARNING]
allocator_warnings = [w for w in warnings if "allocator setting" in w]

print(json.dumps({
    "platform_created_at_discovery": created_before is not None,
    "registered_huawei": f"{platform_manager.PlatformRegistry.get('huawei').__module__}."
                         f"{platform_manager.PlatformRegistry.get('huawei').__qualname__}",
    "platform": f"{type(platform).__module__}.{type(platform).__qualname__}",
    "is_verl_npu_subclass": isinstance(platform, PlatformNPU),
    "is_npu_available": device.is_npu_available,
    "torch_npu_imported": "torch_npu" in sys.modules,
    "allocator_calls": allocator_calls,
    "errors": errors,
    "allocator_warnings": allocator_warnings,
    "rollout_env_vars": platform.rollout_env_vars(),
}))
