"""TEST DOUBLE for the NPU-only calls the GLM-5.2 vLLM-Ascend code makes, with CPU reference maths.

Used by ``verl-ascend selftest`` where vLLM-Ascend and torch_npu cannot run (CPU, CUDA: every result line then
says "test double, not this stack") and by the tests. Plain torch, so it runs on any device torch has.

Simulated (no NPU here), each as a torch custom op with a fake (meta) implementation, so that
torch.compile traces around it as it traces around the real NPU kernels:
- ``torch_npu.npu_rms_norm`` (``npu::npu_rms_norm``): float32 RMSNorm, rounded to the input dtype;
- ``torch_npu.npu_add_rms_norm`` (``npu::npu_add_rms_norm``) and ``torch.ops._C_ascend.npu_add_rms_norm_bias``:
  the fused add-and-norm, which normalises the float32 sum before it is rounded (the behaviour the
  GLM-5.2 RMSNorm fix removes);
- ``torch_npu.npu_lightning_indexer`` (``npu::npu_lightning_indexer``): returns, in place of top-k
  indices, the weights it received as float32 (and records them in ``INDEXER_WEIGHTS`` when it runs),
  so a test sees whether the weights reached the kernel scaled;
- ``torch_npu.npu_rotary_mul`` (``npu::npu_rotary_mul``): rotate-half rotary embedding;
- ``torch.ops.vllm.maybe_chunk_residual``: returns the residual (vLLM-Ascend's behaviour outside a
  forward context), recorded in ``EVENTS`` when it runs;
- ``torch_npu.npu_format_cast``: identity; ``torch.npu``: ``synchronize``/``empty_cache`` recorded in ``EVENTS``.
- vLLM-Ascend module globals the released method bodies read (``VLLM_ASCEND_GLOBALS``): ``enable_custom_op`` (True:
  the ``_C_ascend`` branch vLLM-Ascend takes on A2/A3 nodes with its compiled ops), ``get_weight_prefetch_method``
  (no prefetch), ``maybe_trans_nz`` (identity: NZ is an NPU memory format), ``ACL_FORMAT_FRACTAL_ND`` (2).
``install()`` puts the double in ``sys.modules['torch_npu']`` (once per process; it refuses to shadow a real
torch_npu): call it only in a throw-away interpreter or a selftest process.
"""

from __future__ import annotations

import sys
import types

import torch

from verl_ascend_ext.tooling.selftest import DOUBLE_LABEL

EVENTS: list[str] = []
LABEL = DOUBLE_LABEL
INDEXER_WEIGHTS: list[torch.Tensor] = []
Tensor = torch.Tensor


def rms_norm_reference(x: Tensor, gamma: Tensor, eps: float) -> Tensor:
    """float32 RMSNorm of ``x`` (any dtype), returned in float32."""
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * gamma.float()


def _fused_add_rms_norm(x1: Tensor, x2: Tensor, gamma: Tensor, epsilon: float) -> tuple[Tensor, Tensor, Tensor]:
    total = x1.float() + x2.float()  # normalised before rounding: the fused behaviour
    rstd = torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + epsilon)
    return rms_norm_reference(total, gamma, epsilon).to(x1.dtype), rstd, total.to(x1.dtype)


def _register_ops() -> None:
    lib = torch.library

    @lib.custom_op("npu::npu_rms_norm", mutates_args=())
    def npu_rms_norm(x: Tensor, gamma: Tensor, epsilon: float = 1e-6) -> tuple[Tensor, Tensor]:
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + epsilon)
        return rms_norm_reference(x, gamma, epsilon).to(x.dtype), rstd

    @npu_rms_norm.register_fake
    def _(x, gamma, epsilon=1e-6):
        return torch.empty_like(x), x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)

    @lib.custom_op("npu::npu_add_rms_norm", mutates_args=())
    def npu_add_rms_norm(x1: Tensor, x2: Tensor, gamma: Tensor, epsilon: float = 1e-6) -> tuple[Tensor, Tensor,
                                                                                                  Tensor]:
        return _fused_add_rms_norm(x1, x2, gamma, epsilon)

    @npu_add_rms_norm.register_fake
    def _(x1, x2, gamma, epsilon=1e-6):
        return torch.empty_like(x1), x1.new_empty((*x1.shape[:-1], 1), dtype=torch.float32), torch.empty_like(x1)

    @lib.custom_op("_C_ascend::npu_add_rms_norm_bias", mutates_args=())
    def npu_add_rms_norm_bias(x: Tensor, residual: Tensor, gamma: Tensor, beta: Tensor | None,
                              epsilon: float) -> tuple[Tensor, Tensor, Tensor]:
        y, rstd, total = _fused_add_rms_norm(x, residual, gamma, epsilon)
        return (y + beta if beta is not None else y), rstd, total

    @npu_add_rms_norm_bias.register_fake
    def _(x, residual, gamma, beta, epsilon):
        return torch.empty_like(x), x.new_empty((*x.shape[:-1], 1), dtype=torch.float32), torch.empty_like(x)

    @lib.custom_op("vllm::maybe_chunk_residual", mutates_args=())
    def maybe_chunk_residual(x: Tensor, residual: Tensor) -> Tensor:
        EVENTS.append("maybe_chunk_residual")
        return residual.clone()

    @maybe_chunk_residual.register_fake
    def _(x, residual):
        return torch.empty_like(residual)

    @lib.custom_op("npu::npu_lightning_indexer", mutates_args=())
    def npu_lightning_indexer(query: Tensor, key: Tensor | None, weights: Tensor,
                              actual_seq_lengths_query: Tensor | None, actual_seq_lengths_key: Tensor | None,
                              block_table: Tensor | None,
                              layout_query: str, layout_key: str, sparse_count: int,
                              sparse_mode: int) -> tuple[Tensor, Tensor]:
        INDEXER_WEIGHTS.append(weights.detach().clone())
        return weights.float().clone(), weights.new_zeros((1,), dtype=torch.float32)

    @npu_lightning_indexer.register_fake
    def _(query, key, weights, actual_seq_lengths_query, actual_seq_lengths_key, block_table, layout_query,
          layout_key, sparse_count, sparse_mode):
        return weights.new_empty(weights.shape, dtype=torch.float32), weights.new_empty((1,), dtype=torch.float32)

    @lib.custom_op("npu::npu_rotary_mul", mutates_args=())
    def npu_rotary_mul(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        first, second = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-second, first), dim=-1) * sin

    @npu_rotary_mul.register_fake
    def _(x, cos, sin):
        return torch.empty_like(x)


def npu_lightning_indexer(*, query, key, weights, actual_seq_lengths_query=None, actual_seq_lengths_key=None,
                          block_table=None, layout_query="BSND", layout_key="BSND", sparse_count=2048, sparse_mode=3):
    """torch_npu's keyword-only Python entry point, forwarding to the custom op (as torch_npu's wrappers do)."""
    return torch.ops.npu.npu_lightning_indexer(query, key, weights, actual_seq_lengths_query, actual_seq_lengths_key,
                                               block_table, layout_query, layout_key, sparse_count, sparse_mode)


def npu_format_cast(tensor: Tensor, _format: int) -> Tensor:
    return tensor


def enable_custom_op() -> bool:
    return True


class _NoPrefetch:
    def maybe_prefetch_mlp_weight_postprocess(self, x: Tensor) -> None:
        return None


def get_weight_prefetch_method() -> _NoPrefetch:
    return _NoPrefetch()


def maybe_trans_nz(tensor: Tensor) -> Tensor:
    return tensor


ACL_FORMAT_FRACTAL_ND = 2
VLLM_ASCEND_GLOBALS = ("enable_custom_op", "get_weight_prefetch_method", "maybe_trans_nz", "ACL_FORMAT_FRACTAL_ND")

_installed: types.ModuleType | None = None


def install() -> types.ModuleType:
    """Install ``torch_npu`` (this double), the custom ops and ``torch.npu``; return the double (once per process)."""
    global _installed
    if _installed is not None:
        return _installed
    real = sys.modules.get("torch_npu")
    if real is not None or hasattr(torch, "npu"):
        raise RuntimeError("a torch_npu (or torch.npu) is already loaded in this process; the NPU test double "
                           "refuses to shadow it")
    _register_ops()
    module = types.ModuleType("torch_npu")
    module.__doc__ = f"TEST DOUBLE of torch_npu (verl_ascend_ext/tooling/selftest/npu_test_double.py; {LABEL})"
    module.npu_rms_norm = torch.ops.npu.npu_rms_norm
    module.npu_add_rms_norm = torch.ops.npu.npu_add_rms_norm
    module.npu_rotary_mul = torch.ops.npu.npu_rotary_mul
    module.npu_lightning_indexer = npu_lightning_indexer
    module.npu_format_cast = npu_format_cast
    sys.modules["torch_npu"] = module
    torch.npu = types.SimpleNamespace(synchronize=lambda: EVENTS.append("synchronize"),  # type: ignore[attr-defined]
                                      empty_cache=lambda: EVENTS.append("empty_cache"))
    _installed = module
    return module
