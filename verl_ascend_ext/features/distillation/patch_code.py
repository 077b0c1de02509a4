"""Replacement code of the distillation patches (imported only when a patch is applied)."""

from __future__ import annotations

from typing import Any


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
        config = _StrategyView(config, "fsdp")
    return original(config, *args, **kwargs)


def rebuild_teacher_fields(original: Any, *args: Any, **kwargs: Any) -> Any:
    """Rebuild teacher fields of the padding template at its sequence length (EOS ids, zero log-probs)."""
    template_sample, template_tag = original(*args, **kwargs)
    eos_token_id = kwargs["eos_token_id"] if "eos_token_id" in kwargs else args[2]
    seq_len = template_sample["input_ids"].size(0)
    teacher_ids = template_sample.get("teacher_ids")
    if teacher_ids is not None:
        template_sample["teacher_ids"] = teacher_ids.new_full((seq_len, *teacher_ids.shape[1:]), eos_token_id)
    teacher_logprobs = template_sample.get("teacher_logprobs")
    if teacher_logprobs is not None:
        template_sample["teacher_logprobs"] = teacher_logprobs.new_zeros((seq_len, *teacher_logprobs.shape[1:]))
    return template_sample, template_tag
