"""Drive verl's real distillation code on CPU tensors and print what happened, as JSON.

Run in a fresh interpreter so verl's plugin discovery really runs (or is switched off with
VERL_USE_EXTERNAL_PLUGINS=none, to reproduce the unpatched behaviour).
"""

from __future__ import annotations

import json
import sys

import torch
import verl  # noqa: F401  (plugin discovery happens here)
from tensordict import TensorDict
from verl.trainer.distillation import losses
from verl.trainer.ppo import padding_utils
from verl.workers.config import DistillationConfig, FSDPActorConfig

import verl_ascend_ext


def topk(strategy: str) -> dict[str, torch.Tensor] | str:
    torch.manual_seed(0)
    vocab, topk_k, lens = 11, 3, [3, 4]
    logits = torch.randn(1, sum(lens), vocab)
    ids = torch.nested.nested_tensor([torch.randint(0, vocab, (n, topk_k)) for n in lens], layout=torch.jagged)
    logprobs = torch.nested.nested_tensor([torch.log_softmax(torch.randn(n, topk_k), -1) for n in lens],
                                          layout=torch.jagged)
    data = TensorDict({"teacher_ids": ids, "teacher_logprobs": logprobs}, batch_size=[2])
    config = FSDPActorConfig(strategy=strategy, ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=1, rollout_n=1)
    try:
        return losses.compute_topk_loss(config, DistillationConfig(), data, logits, "thd")
    except NotImplementedError as err:
        return f"NotImplementedError: {err}"


def padding() -> dict:
    source_len, topk_k, eos = 9, 4, 7
    source = {
        "input_ids": torch.arange(source_len),
        "attention_mask": torch.ones(source_len, dtype=torch.int64),
        "position_ids": torch.arange(source_len),
        "prompts": torch.arange(5),
        "responses": torch.arange(4),
        "teacher_ids": torch.randint(0, 50, (source_len, topk_k), dtype=torch.int32),
        "teacher_logprobs": torch.randn(source_len, topk_k, dtype=torch.bfloat16),
    }
    sample, tag = padding_utils.construct_minimal_padding_template(source, {"uid": "x"}, eos)
    seq = sample["input_ids"].size(0)
    batch = [source, sample]
    # verl batches samples as jagged tensors; the top-k loss reads teacher values against the token offsets.
    tokens = torch.nested.nested_tensor([s["input_ids"] for s in batch], layout=torch.jagged)
    teacher = torch.nested.nested_tensor([s["teacher_ids"] for s in batch], layout=torch.jagged)
    return {
        "seq_len": seq,
        "tag_seq_len": tag["seq_len"],
        "teacher_ids_shape": list(sample["teacher_ids"].shape),
        "teacher_logprobs_shape": list(sample["teacher_logprobs"].shape),
        "teacher_ids_dtype": str(sample["teacher_ids"].dtype),
        "teacher_logprobs_dtype": str(sample["teacher_logprobs"].dtype),
        "teacher_ids_all_eos": bool((sample["teacher_ids"] == eos).all()),
        "teacher_logprobs_all_zero": bool((sample["teacher_logprobs"] == 0).all()),
        "teacher_offsets_match_tokens": torch.equal(teacher.offsets(), tokens.offsets()),
    }


def main() -> None:
    fsdp, fsdp2 = topk("fsdp"), topk("fsdp2")
    if isinstance(fsdp2, str):
        same = fsdp2
    else:
        same = sorted(fsdp) == sorted(fsdp2) and all(torch.equal(fsdp[k], fsdp2[k]) for k in fsdp)
    out = {
        "plugin_loaded": "verl_ascend_ext.runtime.boot" in sys.modules,
        "statuses": {k: v.status.value for k, v in verl_ascend_ext.patch_statuses().items()},
        "topk_wrapped": hasattr(losses.compute_topk_loss, "__wrapped__"),
        "padding_wrapped": hasattr(padding_utils.construct_minimal_padding_template, "__wrapped__"),
        "fsdp2_equals_fsdp": same,
        "padding": padding(),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
