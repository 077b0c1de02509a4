"""Replacements for the SFA attention of vLLM-Ascend 0.23: keep ``kv_b_proj`` alive, scale the indexer weights once.

Imported only when one of these patches is applied (inside a vLLM-Ascend process).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

# Set while a scaling wrapper runs: a nested one (the CP path reaching DeviceOperator, or a second
# wrapper stacked on the same function) passes the weights through instead of scaling them again.
_scaling: ContextVar[bool] = ContextVar("verl_ascend_ext_glm52_indexer_scaling", default=False)

DEVICE_OPERATOR_WEIGHTS = 4  # indexer_select_post_process(sfa_impl, q_li, q_li_scale, q_li_shape_ori, weights, ...)
CP_WEIGHTS = 2  # AscendSFACPImpl._execute_indexer_select(self, q, key, weights, ...) without self


def keep_kv_b_proj(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """wrapt wrapper of ``AscendSFAImpl.process_weights_after_loading``: ``kv_b_proj`` comes out with its weights.

    The original rebuilds ``W_UV``/``W_UK_T`` from ``kv_b_proj`` and then disposes every tensor attribute
    of that layer to shape [0] (``dispose_layer``); an RL weight update reloads ``kv_b_proj`` and calls
    this method again, which then fails its shape check. The tensors of ``kv_b_proj`` are remembered
    before the call (aliases of the same storage, no copy) and put back into the very same tensor
    objects after it, so weight loaders keep working; the memory is the memory the layer had before.
    Other layers the original disposes (``fused_qkv_a_proj``, ``q_proj``) stay disposed.
    """
    layer = getattr(instance, "kv_b_proj", None)
    if layer is None:
        return wrapped(*args, **kwargs)
    import torch

    kept = {name: value.detach() for name, value in _tensor_attributes(layer, torch.Tensor)}
    result = wrapped(*args, **kwargs)
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


def _call_scaled(wrapped: Any, sfa_impl: Any, position: int, args: tuple, kwargs: dict) -> Any:
    if _scaling.get():
        return wrapped(*args, **kwargs)
    if "weights" in kwargs:
        kwargs = {**kwargs, "weights": scale_weights(kwargs["weights"], sfa_impl)}
    else:
        args = (*args[:position], scale_weights(args[position], sfa_impl), *args[position + 1:])
    token = _scaling.set(True)
    try:
        return wrapped(*args, **kwargs)
    finally:
        _scaling.reset(token)


def scale_device_operator_weights(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """wrapt wrapper of the staticmethod ``<Adaptor>.indexer_select_post_process``: scale ``weights`` once.

    wrapt passes a staticmethod's arguments unchanged (``instance`` is None), so ``sfa_impl`` is the
    first argument and ``weights`` the fifth (or a keyword).
    """
    sfa_impl = kwargs["sfa_impl"] if "sfa_impl" in kwargs else args[0]
    return _call_scaled(wrapped, sfa_impl, DEVICE_OPERATOR_WEIGHTS, args, kwargs)


def scale_cp_indexer_weights(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """wrapt wrapper of ``AscendSFACPImpl._execute_indexer_select(self, q, key, weights, ...)``: scale once.

    The CP path calls it on row slices of the weights (decode / prefill / head / tail); scaling is
    elementwise, so scaling each slice equals scaling the whole tensor first, as upstream's fix does.
    """
    return _call_scaled(wrapped, instance, CP_WEIGHTS, args, kwargs)
