"""Replacement code of the distillation patches (imported only when a patch is applied)."""

from __future__ import annotations

import math
from typing import Any

from verl_ascend_ext.features.distillation.declaration import EMPTY_MICRO_BATCH, FSDP2_TOPK, TEACHER_PADDING
from verl_ascend_ext.patching.status import acted


class _StrategyView:
    """Read-only view of a (frozen) actor config that reports a different ``strategy``."""

    __slots__ = ("_config", "strategy")

    def __init__(self, config: Any, strategy: str) -> None:
        object.__setattr__(self, "_config", config)
        object.__setattr__(self, "strategy", strategy)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._config, name)


def topk_loss_fsdp2_as_fsdp(original: Any, config: Any, *args: Any, **kwargs: Any) -> Any:
    """``compute_topk_loss`` for ``strategy='fsdp2'``: run verl's own code as for ``'fsdp'`` (FSDP2 is FSDP)."""
    if getattr(config, "strategy", None) == "fsdp2":
        acted(FSDP2_TOPK.id)
        config = _StrategyView(config, "fsdp")
    return original(config, *args, **kwargs)


def rebuild_teacher_fields(original: Any, *args: Any, **kwargs: Any) -> Any:
    """Rebuild teacher fields of the padding template at its sequence length (EOS ids, zero log-probs)."""
    template_sample, template_tag = original(*args, **kwargs)
    eos_token_id = kwargs["eos_token_id"] if "eos_token_id" in kwargs else args[2]
    seq_len = template_sample["input_ids"].size(0)
    teacher_ids = template_sample.get("teacher_ids")
    if teacher_ids is not None or template_sample.get("teacher_logprobs") is not None:
        acted(TEACHER_PADDING.id)
    if teacher_ids is not None:
        template_sample["teacher_ids"] = teacher_ids.new_full((seq_len, *teacher_ids.shape[1:]), eos_token_id)
    teacher_logprobs = template_sample.get("teacher_logprobs")
    if teacher_logprobs is not None:
        template_sample["teacher_logprobs"] = teacher_logprobs.new_zeros((seq_len, *teacher_logprobs.shape[1:]))
    return template_sample, template_tag


def empty_micro_batch_adds_zero(original: Any, config: Any, distillation_config: Any, model_output: dict,
                                data: Any) -> tuple[Any, dict[str, Any]]:
    """``distillation_loss`` for a micro-batch with no response token (padding samples only): zero, neutral metrics.

    verl's loss aggregation masks such a micro-batch out in every mode, but its metrics take ``min()`` / ``max()``
    over the valid tokens (the loss range, the top-k mass), which raise on none. Here verl's own loss runs on the
    same tensors with every position counted, so the graph and the metric names are verl's; its loss times zero is
    returned (every gradient it adds is zero) with the metrics made neutral (``neutral_metrics``).
    Other micro-batches go to verl's code untouched.
    """
    import torch  # verl's modules are imported lazily here: the contract kit applies the patches of a release whose
    # class bodies it does not execute (``testing.standin``), and every patch of this module is imported then

    mask = data["response_mask"]
    if bool((mask.values() if mask.is_nested else mask).any()):
        return original(config, distillation_config, model_output, data)
    acted(EMPTY_MICRO_BATCH.id)
    counted = data.copy()  # shallow: the same tensors, the mask replaced in the copy only
    counted["response_mask"] = torch.ones_like(mask)
    loss, metrics = original(config, distillation_config, model_output, counted)
    return torch.nan_to_num(loss) * 0.0, neutral_metrics(metrics)


def neutral_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """The metrics of a micro-batch without a valid token, as values that leave the step's aggregate as it is.

    verl keeps a ``Metric`` per key and requires the same number of values on every data-parallel rank, so each
    ``Metric`` key stays: min -> +inf and max -> -inf (the step's min / max are the real micro-batches'); sum and
    mean -> 0 (what verl's policy loss itself reports for a padding micro-batch: a mean moves). Plain values,
    whose step value verl takes as the mean of a free-length list, are left out: that mean is the real ones'.
    """
    from verl.utils.metric import AggregationType, Metric

    fill = {AggregationType.MIN: math.inf, AggregationType.MAX: -math.inf}
    out = {}
    for key, value in metrics.items():
        if isinstance(value, Metric):
            neutral = Metric(value.aggregation)
            neutral.extend([fill.get(value.aggregation, 0.0)] * len(value.values))
            out[key] = neutral
    return out
