"""TEST DOUBLE for the NPU-only calls the GLM-5.2 vLLM-Ascend replacements make, with CPU reference maths.

Simulated (no NPU here): ``torch_npu.npu_rms_norm``, ``torch_npu.npu_add_rms_norm``,
``torch.ops._C_ascend.npu_add_rms_norm_bias`` (the fused ops normalise the float32 sum before it is
rounded to the input dtype, as the issue describes the NPU kernels), ``torch_npu.npu_lightning_indexer``
(records the weights it receives), ``torch_npu.npu_format_cast`` (identity), ``torch.npu``
(``synchronize``/``empty_cache`` recorded in an event list) and ``torch.ops.vllm.maybe_chunk_residual``
(returns the residual, which is what vLLM-Ascend's implementation does outside a forward context).
``install()`` puts the double in ``sys.modules['torch_npu']``: call it only in a throw-away interpreter.
"""

from __future__ import annotations

import sys
import types

import torch

EVENTS: list[str] = []
INDEXER_WEIGHTS: list[torch.Tensor] = []


def rms_norm_reference(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
    """float32 RMSNorm of ``x`` (any dtype), returned in float32."""
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * gamma.float()


def npu_rms_norm(x: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + epsilon)
    return rms_norm_reference(x, gamma, epsilon).to(x.dtype), rstd


def npu_add_rms_norm(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor,
                     epsilon: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    total = x1.float() + x2.float()  # normalised before rounding: the fused behaviour
    rstd = torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + epsilon)
    return rms_norm_reference(total, gamma, epsilon).to(x1.dtype), rstd, total.to(x1.dtype)


def npu_lightning_indexer(*, query, key, weights, **kwargs):
    INDEXER_WEIGHTS.append(weights.clone())
    return torch.zeros(query.shape[0], 1, dtype=torch.int32), None


def npu_format_cast(tensor: torch.Tensor, _format: int) -> torch.Tensor:
    return tensor


def _register_ops() -> None:
    @torch.library.custom_op("vllm::maybe_chunk_residual", mutates_args=())
    def maybe_chunk_residual(x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return residual.clone()

    @torch.library.custom_op("_C_ascend::npu_add_rms_norm_bias", mutates_args=())
    def npu_add_rms_norm_bias(x: torch.Tensor, residual: torch.Tensor, gamma: torch.Tensor,
                              beta: torch.Tensor | None, epsilon: float) -> tuple[torch.Tensor, torch.Tensor,
                                                                                   torch.Tensor]:
        y, rstd, total = npu_add_rms_norm(x, residual, gamma, epsilon)
        return (y + beta if beta is not None else y), rstd, total


def install() -> types.ModuleType:
    """Install ``torch_npu`` (this double), the custom ops and ``torch.npu``; return the double."""
    module = types.ModuleType("torch_npu")
    module.__doc__ = "TEST DOUBLE of torch_npu (tests/scenarios/npu_test_double.py)"
    for name in ("npu_rms_norm", "npu_add_rms_norm", "npu_lightning_indexer", "npu_format_cast"):
        setattr(module, name, globals()[name])
    sys.modules["torch_npu"] = module
    _register_ops()
    torch.npu = types.SimpleNamespace(synchronize=lambda: EVENTS.append("synchronize"),  # type: ignore[attr-defined]
                                      empty_cache=lambda: EVENTS.append("empty_cache"))
    return module
