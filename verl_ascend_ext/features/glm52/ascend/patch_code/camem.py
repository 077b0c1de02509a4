"""Replacement for ``CaMemAllocator.sleep`` (vLLM-Ascend 0.23): synchronise the device before memory is unmapped.

Imported only when the patch is applied, i.e. inside a vLLM-Ascend process where ``torch.npu`` exists.
"""

from __future__ import annotations

from typing import Any


def synchronize_before_sleep(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.npu.synchronize()``, then the original ``sleep`` (which unmaps and releases memory).

    Kernels still queued on the device (e.g. the last forward, or a weight copy) may use memory that
    ``sleep`` offloads and unmaps; waiting for them first is what makes the unmap safe.
    """
    import torch

    torch.npu.synchronize()
    return original(self, *args, **kwargs)
