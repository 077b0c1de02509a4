"""Replacements for the SFA attention of vLLM-Ascend 0.23: keep ``kv_b_proj`` alive, scale the indexer weights once.

Imported only when one of these patches is applied (inside a vLLM-Ascend process).
"""

from __future__ import annotations

from typing import Any

from verl_ascend_ext.features.glm52.ascend.declaration import KV_B_PROJ
from verl_ascend_ext.patching.status import acted


def keep_kv_b_proj(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """``AscendSFAImpl.process_weights_after_loading`` whose ``kv_b_proj`` comes out with its weights.

    The original rebuilds ``W_UV``/``W_UK_T`` from ``kv_b_proj`` and then disposes every tensor attribute
    of that layer to shape [0] (``dispose_layer``); an RL weight update reloads ``kv_b_proj`` and calls
    this method again, which then fails its shape check. The tensors of ``kv_b_proj`` are remembered
    before the call (aliases of the same storage, no copy) and put back into the very same tensor
    objects after it, so weight loaders keep working; the memory is the memory the layer had before.
    Other layers the original disposes (``fused_qkv_a_proj``, ``q_proj``) stay disposed.
    """
    layer = getattr(self, "kv_b_proj", None)
    if layer is None:
        return original(self, *args, **kwargs)
    import torch

    acted(KV_B_PROJ.id)
    kept = {name: value.detach() for name, value in _tensor_attributes(layer, torch.Tensor)}
    result = original(self, *args, **kwargs)
    with torch.no_grad():
        for name, alias in kept.items():
            tensor = getattr(layer, name, None)
            if isinstance(tensor, torch.Tensor) and tensor.numel() == 0 and alias.numel() != 0:
                tensor.set_(alias)
    return result


def _tensor_attributes(layer: Any, tensor_type: type) -> list[tuple[str, Any]]:
    """The attributes ``dispose_layer`` disposes: every tensor found by ``dir(layer)``."""
    found = []
    for name in dir(layer):
        value = getattr(layer, name, None)
        if isinstance(value, tensor_type):
            found.append((name, value))
    return found


def scale_weights(weights: Any, sfa_impl: Any) -> Any:
    """``weights * n_head^-0.5 * head_dim^-0.5`` in the order vLLM-Ascend's own fix uses (bitwise the same)."""
    return weights * (sfa_impl.n_head**-0.5) * (sfa_impl.head_dim**-0.5)


def scale_device_operator_weights(original: Any, sfa_impl: Any, q_li: Any, q_li_scale: Any, q_li_shape_ori: Any,
                                  weights: Any, *args: Any, **kwargs: Any) -> Any:
    """The staticmethod ``<Adaptor>.indexer_select_post_process`` with ``weights`` scaled on entry.

    Runs traced (inside the attention of the compiled model), so "exactly once" is decided when the
    patch is applied, never at run time: the record recognises only adaptor code that hands the weights
    straight to the kernels (no scaling, no call into another adaptor's method), the engine puts one
    replacement on a target at most, and a foreign copy's marker makes it stand down.
    """
    return original(sfa_impl, q_li, q_li_scale, q_li_shape_ori, scale_weights(weights, sfa_impl), *args, **kwargs)


def scale_cp_indexer_weights(original: Any, self: Any, q: Any, key: Any, weights: Any, *args: Any,
                             **kwargs: Any) -> Any:
    """``AscendSFACPImpl._execute_indexer_select(self, q, key, weights, ...)`` with ``weights`` scaled on entry.

    The CP path calls it on row slices of the weights (decode / prefill / head / tail); scaling is
    elementwise, so scaling each slice equals scaling the whole tensor first, as upstream's fix does.
    The record refuses a CP path that reaches DeviceOperator (whose patch would scale a second time).
    """
    return original(self, q, key, scale_weights(weights, self), *args, **kwargs)
