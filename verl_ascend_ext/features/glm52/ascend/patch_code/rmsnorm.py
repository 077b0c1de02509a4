"""Replacements for ``AscendRMSNorm.forward_oot``: add the residual, then RMS-normalise the sum.

``add_then_rms_norm`` for vLLM-Ascend 0.23 (its residual path first calls ``torch.ops.vllm.maybe_chunk_residual``);
``add_then_rms_norm_unchunked`` for the shape without that op (FlashComm v1 removed, vLLM-Ascend #13946, main).

Imported only when the patch is applied, i.e. inside a vLLM-Ascend process where ``torch_npu`` exists.
Runs inside the compiled model (vLLM-Ascend's graph mode): a plain function with no runtime context,
tested eagerly and under ``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch_npu


def add_then_rms_norm(original: Any, self: Any, x: torch.Tensor, residual: torch.Tensor | None = None) -> Any:
    """``residual = x + residual; x = npu_rms_norm(residual) (+ bias)`` instead of the fused op.

    The fused ``npu_add_rms_norm`` normalises the sum before it is rounded to the activation dtype;
    training (Megatron) normalises the rounded sum. Without a residual the original runs unchanged.
    A bias (vLLM-Ascend's anti-outlier quantisation adds one to some norms) is added after the
    norm, as the original residual path does, so it is never dropped.
    """
    if residual is None:
        return original(self, x)
    return _add_then_norm(self, x, torch.ops.vllm.maybe_chunk_residual(x, residual))


def add_then_rms_norm_unchunked(original: Any, self: Any, x: torch.Tensor,
                                residual: torch.Tensor | None = None) -> Any:
    """``add_then_rms_norm`` for code whose residual path has no ``maybe_chunk_residual`` (the op is gone there)."""
    if residual is None:
        return original(self, x)
    return _add_then_norm(self, x, residual)


def _add_then_norm(self: Any, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    residual = x + residual
    x = torch_npu.npu_rms_norm(residual, self.weight, self.variance_epsilon)[0]
    if self.bias is not None:
        x.add_(self.bias)
    return x, residual
