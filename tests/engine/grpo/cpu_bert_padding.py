"""TEST-ONLY: the CPU counterpart of ``flash_attn.bert_padding`` for verl 0.9.0's padding helpers (never shipped).

verl's ``verl.utils.attention_utils`` (un)pads batches with ``flash_attn.bert_padding`` on CUDA and with
``verl.utils.npu_flash_attn_utils`` on Ascend (``_get_attention_functions``, verl 0.9.0 :20-34). flash-attn ships
CUDA wheels only, so on the CPU verl 0.9.0 fails there: the fully-async trainer's ``_update_actor``
(``trainer/ppo/ray_trainer.py:1310`` -> ``workers/utils/padding.py:53 left_right_2_no_padding`` -> ``unpad_input``)
raises ``ModuleNotFoundError: No module named 'flash_attn'`` (measured). verl 0.9.1 added pure-torch fallbacks for
exactly this case (``_fallback_index_first_axis`` / ``_fallback_pad_input`` / ``_fallback_unpad_input`` /
``_fallback_rearrange``, used when the import fails); this module gives verl 0.9.0 the four functions, written
here to flash-attn's contract (``rearrange`` is einops', which verl depends on; the test checks them against verl
0.9.1's fallbacks), and stands down where verl has its own fallbacks (0.9.1+), where flash-attn imports, or on the
NPU. Loaded in every process of the job through ``VERL_USE_EXTERNAL_MODULES``; acts when
``verl.utils.attention_utils`` is imported.

Refuses (ImportError) when 0.9.0's ``_get_attention_functions`` is not the code it was written for: the CUDA branch
importing the four names from ``flash_attn.bert_padding`` with no fallback.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import types

import torch
import wrapt
from einops import rearrange

_CUDA_BRANCH = r"else:\n\s+from flash_attn\.bert_padding import index_first_axis, pad_input, rearrange, unpad_input\n"


def index_first_axis(tensor: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """The rows ``indices`` of ``tensor`` (a [tokens, ...] tensor of at least 2 dims)."""
    if tensor.dim() < 2:
        raise ValueError(f"index_first_axis: a tensor of 2 dims or more expected, got {tuple(tensor.shape)}")
    return tensor.index_select(0, indices)


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """The inverse of ``unpad_input``: [tokens, ...] scattered back to [batch, seqlen, ...], zeros elsewhere."""
    flat = torch.zeros((batch * seqlen, *hidden_states.shape[1:]), dtype=hidden_states.dtype,
                       device=hidden_states.device)
    flat.index_copy_(0, indices, hidden_states)
    return flat.reshape(batch, seqlen, *hidden_states.shape[1:])


def unpad_input(hidden_states: torch.Tensor, attention_mask: torch.Tensor,
                unused_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int,
                                                                   torch.Tensor]:
    """flash-attn's contract: the kept tokens of [batch, seqlen, ...] in row order, their flat indices, the
    cumulative sequence lengths (int32, leading 0), the longest row, and each row's count of ``attention_mask``
    tokens (``unused_mask`` marks tokens kept but not attended)."""
    keep = attention_mask.bool() if unused_mask is None else (attention_mask + unused_mask).bool()
    lengths = keep.sum(dim=-1, dtype=torch.int32)
    indices = keep.reshape(-1).nonzero().reshape(-1)
    cu_seqlens = torch.zeros(lengths.numel() + 1, dtype=torch.int32, device=lengths.device)
    cu_seqlens[1:] = lengths.cumsum(0)
    tokens = index_first_axis(hidden_states.reshape(-1, *hidden_states.shape[2:]), indices)
    return tokens, indices, cu_seqlens, int(lengths.max()), attention_mask.sum(dim=-1, dtype=torch.int32)


@wrapt.when_imported("verl.utils.attention_utils")
def _on_attention_utils(module: types.ModuleType) -> None:
    if hasattr(module, "_fallback_unpad_input") or getattr(module, "_cpu_bert_padding", False):
        return  # verl 0.9.1+: its own fallbacks
    if importlib.util.find_spec("flash_attn") is not None:
        return
    from verl.utils.device import is_torch_npu_available

    if is_torch_npu_available(check_device=False):
        return
    source = inspect.getsource(module._get_attention_functions)
    if not re.search(_CUDA_BRANCH, source):
        raise ImportError(f"cpu_bert_padding: {module.__file__}'s _get_attention_functions is not the code this "
                          "stand-in was written for (verl 0.9.0: flash_attn.bert_padding, no fallback)")

    def _get_attention_functions():
        module._index_first_axis, module._pad_input, module._rearrange, module._unpad_input = (
            index_first_axis, pad_input, rearrange, unpad_input)
        return index_first_axis, pad_input, rearrange, unpad_input

    module._get_attention_functions = _get_attention_functions
    module._cpu_bert_padding = True
