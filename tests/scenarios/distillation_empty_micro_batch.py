"""An all-padding micro-batch through verl's real distillation loss, on CPU tensors; prints what happened as JSON.

A tiny student (one weight matrix: token -> logits) and a teacher's top-k, laid out as verl's FSDP engine hands them
to its loss (THD: jagged prompts / responses / response mask, flat per-token model outputs from verl's own top-k
loss code). Three micro-batches of one global batch: two real samples and one padding sample (response mask all
zero, teacher fields as verl's padding template builds them). For each loss mode and aggregation mode, verl's
``distillation_ppo_loss`` runs per micro-batch as the engine runs it (loss backward per micro-batch, metrics
collected with verl's ``append_to_dict`` / ``Metric`` and reduced with ``reduce_metrics``), once with and once
without the padding micro-batch; the report says what the padding micro-batch added to the loss and to the
gradient (exactly zero is the reference) and which step metrics differ. Run in a fresh interpreter so verl's
plugin discovery really runs (or is switched off with VERL_USE_EXTERNAL_PLUGINS=none: verl's own behaviour).
"""

from __future__ import annotations

import json
import math
import sys

import torch
import verl  # noqa: F401  (plugin discovery happens here)
from tensordict import TensorDict
from verl.trainer.distillation import losses
from verl.utils import tensordict_utils as tu
from verl.utils.metric import Metric, reduce_metrics
from verl.utils.py_functional import append_to_dict
from verl.workers.config import DistillationConfig, DistillationLossConfig, FSDPActorConfig

import verl_ascend_ext
from verl_ascend_ext.patching.status import was_exercised

VOCAB, TOPK, EOS = 13, 4, 2
TOPK_MODES = ("forward_kl_topk",)
ESTIMATOR_MODES = ("abs", "mse", "k2", "low_var_kl", "k3")  # verl refuses k1 / kl without the policy gradient
AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def jagged(rows: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.nested_tensor(rows, layout=torch.jagged)


def samples(k: int) -> list[dict[str, torch.Tensor]]:
    """Two real samples (prompt, response, mask) and a padding one (mask all zero, EOS teacher ids, zero log-probs);
    ``k`` teacher values per token (the top-k, or 1: the sampled token's log-prob for the estimator losses)."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for prompt_len, response_len, real in ((3, 4, True), (2, 5, True), (1, 1, False)):
        seq = prompt_len + response_len
        sample = {
            "prompts": torch.randint(3, VOCAB, (prompt_len,), generator=gen),
            "responses": torch.randint(3, VOCAB, (response_len,), generator=gen),
            "response_mask": torch.ones(response_len, dtype=torch.int64) * int(real),
            "old_log_probs": -torch.rand(response_len, generator=gen),
            "advantages": torch.zeros(response_len),  # verl's policy loss reads it (task rewards off: unused)
            "teacher_ids": torch.randint(0, VOCAB, (seq, k), generator=gen) if real else torch.full((seq, k), EOS),
            "teacher_logprobs": torch.log_softmax(torch.randn(seq, TOPK, generator=gen), -1)[:, :k] if real else
            torch.zeros(seq, k),
        }
        sample["input_ids"] = torch.cat([sample["prompts"], sample["responses"]])
        out.append(sample)
    return out


def micro_batch(sample: dict[str, torch.Tensor], real: list[dict[str, torch.Tensor]]) -> TensorDict:
    data = TensorDict({k: jagged([v]) for k, v in sample.items()}, batch_size=[1])
    tu.assign_non_tensor(data, dp_size=1, global_batch_size=len(real),
                         batch_num_tokens=int(sum(s["response_mask"].sum() for s in real)))
    return data


def forward(weight: torch.Tensor, data: TensorDict, config: FSDPActorConfig,
            distillation: DistillationConfig) -> dict[str, torch.Tensor]:
    """The student's per-token outputs as verl's engine produces them: flat over the micro-batch's tokens."""
    tokens = data["input_ids"].values()
    logits = weight[tokens]
    model_output = {}
    if distillation.distillation_loss.loss_mode in TOPK_MODES:  # verl's logits processor: its top-k loss code
        out = losses.distillation_ppo_loss(config, distillation, data=data, student_logits=logits.unsqueeze(0),
                                           data_format="thd")
        model_output = {k: v.squeeze(0) for k, v in out.items()}
    next_tokens = torch.roll(tokens, -1)
    model_output["log_probs"] = torch.log_softmax(logits, -1).gather(-1, next_tokens[:, None]).squeeze(-1)
    return model_output


def step(batches: list[TensorDict], mode: str, agg: str, policy_gradient: bool) -> dict:
    """One mini-batch as verl's engine runs it: per micro-batch forward, loss, backward; metrics aggregated.

    Strategy ``fsdp``: verl's own top-k dispatch on every release, so only the empty micro-batch is under test.
    """
    weight = torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(1), requires_grad=True)
    config = FSDPActorConfig(strategy="fsdp", ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=1, rollout_n=1,
                             loss_agg_mode=agg)
    distillation = DistillationConfig(distillation_loss=DistillationLossConfig(
        loss_mode=mode, topk=TOPK, use_task_rewards=False, use_policy_gradient=policy_gradient))
    total, collected, per_batch = 0.0, {}, []
    for data in batches:
        loss, metrics = losses.distillation_ppo_loss(config, distillation, forward(weight, data, config, distillation),
                                                     data)
        before = weight.grad.clone() if weight.grad is not None else torch.zeros_like(weight)
        loss.backward()
        per_batch.append({"loss": loss.item(), "requires_grad": loss.requires_grad,
                          "grad_added_is_zero": bool(torch.equal(weight.grad - before, torch.zeros_like(weight))),
                          "grad_finite": bool(torch.isfinite(weight.grad).all())})
        total += loss.item()
        append_to_dict(collected, metrics)
    reduced = reduce_metrics({k: (v if isinstance(v, Metric) else list(v)) for k, v in collected.items()})
    return {"loss": total, "grad": weight.grad, "metrics": {k: float(v) for k, v in reduced.items()},
            "per_batch": per_batch}


def compare(mode: str, agg: str, policy_gradient: bool) -> dict:
    made = samples(TOPK if mode in TOPK_MODES else 1)
    real, pad = made[:2], made[2]
    batches = [micro_batch(s, real) for s in real]
    try:
        with_pad = step([*batches, micro_batch(pad, real)], mode, agg, policy_gradient)
    except Exception as err:  # verl's own failure, reported as such (the unpatched reproduction)
        return {"error": f"{type(err).__name__}: {err}"[:300]}
    without = step(batches, mode, agg, policy_gradient)
    differ = sorted(k for k in {*with_pad["metrics"], *without["metrics"]}
                    if with_pad["metrics"].get(k) != without["metrics"].get(k))
    return {
        "pad": with_pad["per_batch"][-1],
        "loss_equal": with_pad["loss"] == without["loss"],
        "grad_equal": bool(torch.equal(with_pad["grad"], without["grad"])),
        "metrics_finite": all(math.isfinite(v) for v in with_pad["metrics"].values()),
        "metrics_differ": differ,
        "metric_keys_equal": sorted(with_pad["metrics"]) == sorted(without["metrics"]),
    }


def main() -> None:
    real = samples(TOPK)[:2]
    step([micro_batch(s, real) for s in real], "forward_kl_topk", "token-mean", policy_gradient=False)
    acted_on_real_only = was_exercised("distill-empty-micro-batch")
    cases = {}
    for mode in (*TOPK_MODES, *ESTIMATOR_MODES):
        for agg in AGG_MODES:
            cases[f"{mode}/{agg}"] = compare(mode, agg, policy_gradient=False)
    for mode in ("forward_kl_topk", "k1", "k3"):
        cases[f"{mode}/token-mean/policy-gradient"] = compare(mode, "token-mean", policy_gradient=True)
    status = verl_ascend_ext.patch_statuses().get("distill-empty-micro-batch")
    print(json.dumps({
        "plugin_loaded": "verl_ascend_ext.runtime.boot" in sys.modules,
        "status": status.status.value if status else None,
        "exercised_on_real_micro_batches": acted_on_real_only,
        "exercised": was_exercised("distill-empty-micro-batch"),
        "cases": cases,
    }))


if __name__ == "__main__":
    main()
