"""TEST-ONLY: the CPU counterpart of ``flash_attn.bert_padding`` for verl 0.9.0's padding helpers (never shipped).

verl's ``verl.utils.attention_utils`` (un)pads batches with ``flash_attn.bert_padding`` on CUDA and with
``verl.utils.npu_flash_attn_utils`` on Ascend (``_get_attention_functions``, verl 0.9.0 :20-34). flash-attn ships
CUDA wheels only, so on the CPU verl 0.9.0 fails there: the fully-async trainer's ``_update_actor``
(``trainer/ppo/ray_trainer.py:1310`` -> ``workers/utils/padding.py:53 left_right_2_no_padding`` -> ``unpad_input``)
raises ``ModuleNotFoundError: No module named 'flash_attn'`` (measured). verl 0.9.1 added pure-torch fallbacks for
exactly this case (``_fallback_index_first_axis`` / ``_fallback_pad_input`` / ``_fallback_unpad_input`` /
``_fallback_rearrange``, used when the import fails); this module gives verl 0.9.0 the same four functions, copied
from verl 0.9.1 (Apache-2.0), and stands down where verl has its own fallbacks (0.9.1+), where flash-attn imports,
or on the NPU. Loaded in every process of the job through ``VERL_USE_EXTERNAL_MODULES``; acts when
``verl.utils.attention_utils`` is imported.

Refuses (ImportError) when 0.9.0's ``_get_attention_functions`` is not the code it was written for: the CUDA branch
importing the four names from ``flash_attn.bert_padding`` with no fallback.
"""

from __future__ import annotations

import inspect
import re
import types

import torch
import torch.nn.functional as F
import wrapt

_CUDA_BRANCH = r"else:\n\s+from flash_attn\.bert_padding import index_first_axis, pad_input, rearrange, unpad_input\n"


def index_first_axis(tensor: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    assert tensor.ndim >= 2
    return tensor[indices]


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    other_shape = hidden_states.shape[1:]
    output = hidden_states.new_zeros(batch * seqlen, *other_shape)
    output[indices] = hidden_states
    return output.view(batch, seqlen, *other_shape)


def unpad_input(hidden_states: torch.Tensor, attention_mask: torch.Tensor, unused_mask=None):
    all_masks = (attention_mask + unused_mask) if unused_mask is not None else attention_mask
    seqlens_in_batch = all_masks.sum(dim=-1, dtype=torch.int32)
    used_seqlens_in_batch = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(all_masks.flatten(), as_tuple=False).flatten()
    cu_seqlens = F.pad(torch.cumsum(seqlens_in_batch, dim=0, dtype=torch.int32), (1, 0))
    return (index_first_axis(hidden_states.reshape(-1, *hidden_states.shape[2:]), indices), indices, cu_seqlens,
            seqlens_in_batch.max().item(), used_seqlens_in_batch)


def rearrange(*args, **kwargs):
    from einops import rearrange as einops_rearrange

    return einops_rearrange(*args, **kwargs)


@wrapt.when_imported("verl.utils.attention_utils")
def _on_attention_utils(module: types.ModuleType) -> None:
    if hasattr(module, "_fallback_unpad_input") or getattr(module, "_cpu_bert_padding", False):
        return  # verl 0.9.1+: its own fallbacks
    try:
        import flash_attn  # noqa: F401

        return
    except ImportError:
        pass
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
