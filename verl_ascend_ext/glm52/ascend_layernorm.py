"""Replacement for ``AscendRMSNorm.forward_oot`` (vLLM-Ascend 0.23): add the residual, then RMS-normalise the sum.

Imported only when the patch is applied, i.e. inside a vLLM-Ascend process where ``torch_npu`` exists.
"""

from __future__ import annotations

from typing import Any


def add_then_rms_norm(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """wrapt wrapper: ``residual = x + residual; x = npu_rms_norm(residual) (+ bias)`` instead of the fused op.

    The fused ``npu_add_rms_norm`` normalises the sum before it is rounded to the activation dtype;
    training (Megatron) normalises the rounded sum. Without a residual the original runs unchanged.
    A bias (vLLM-Ascend's anti-outlier quantisation adds one to some norms) is added after the
    norm, as the original residual path does, so it is never dropped.
    """
    x, residual = _x_and_residual(*args, **kwargs)
    if residual is None:
        return wrapped(*args, **kwargs)
    import torch
    import torch_npu

    residual = torch.ops.vllm.maybe_chunk_residual(x, residual)
    residual = x + residual
    x = torch_npu.npu_rms_norm(residual, instance.weight, instance.variance_epsilon)[0]
    if instance.bias is not None:
        x.add_(instance.bias)
    return x, residual


def _x_and_residual(x: Any, residual: Any = None) -> tuple[Any, Any]:
    return x, residual
