"""verl's real R3 replay on one gloo rank with a tiny Megatron MoE router stack, on CPU tensors; prints JSON.

The chain is verl's own, in the order its Megatron actor runs it: a rollout batch as verl's trainer hands it over
(``DataProto`` -> ``left_right_2_no_padding`` -> ``prepare_micro_batches``), then per micro-batch what
``MegatronEngineWithLMHead.forward_step`` does under R3 (``prepare_model_inputs``, ``align_r3_router_replay_data``,
``build_r3_replay_mask``, ``set_router_replay_data`` on the model's own routers), then each MoE layer's real Megatron
``TopKRouter.routing`` (verl's ``patched_routing`` -> ``RouterReplay.get_replay_topk``), once as the old-log-prob
forward and once inside verl's real ``TrainingWorker.train_mini_batch`` (whose metrics verl's trainer renames with
``actor/`` and reduces, as ``RayPPOTrainer._update_actor`` and its step loop do). Only the worker around the engine is a
stand-in (the attributes ``train_mini_batch`` reads), and the model forward is the routers alone.

The rollout's routes: per token and layer, the top-2 of the logits the actor's routers then see, except on planted
tokens (a different expert set: disagreement); zero where verl's agent loop leaves zeros (the last token, the dense
layer, the tool tokens ending sample 1); sample 3 is verl's padding kind (no response token). ``--case`` corrupts
them: ``zeros`` (every route 0: vllm#49184), ``truncated`` (sample 2's routes stop inside its response),
``range`` (an expert id past the model's experts). ``--experts 256 --route-dtype uint8``: a model of GLM-5.2's
256 experts with its routes packed as verl 0.9.0 packs them (on which a comparison with 256 wraps). The expected
agreement is computed here from the routes and the logits, independently of the plugin. Runs in a fresh interpreter
so verl's plugin discovery really runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

GRPO = Path(__file__).resolve().parents[1] / "engine" / "grpo"  # the CPU platform and 0.9.0's CPU padding stand-ins
sys.path.insert(0, str(GRPO))
os.environ["VERL_PLATFORM"] = "cpu-test"
os.environ["VERL_USE_EXTERNAL_MODULES"] = "verl_cpu_test_platform,cpu_bert_padding"
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import verl  # noqa: E402  (plugin discovery happens here)

IDS = ("r3-route-check", "r3-route-agreement", "r3-route-agreement-metric")
EXPERTS, TOPK, LAYERS, MOE_FREQ = 8, 2, 3, [0, 1, 1]  # decoder layer 1 dense, layers 2 and 3 MoE
PROMPT, RESPONSE = 6, 10
PROMPT_LENS, RESPONSE_LENS = (4, 6, 3, 5), (10, 7, 9, 4)
TOOL_TAIL = 3  # the last 3 response tokens of sample 1 are a tool's (response mask 0, no route: the loop ended there)
PADDING_SAMPLE = 3  # response mask all zero (verl's padding kind): zero routes, not replayed
# (sample, token, layer index): a route the actor's router disagrees with
PLANTED = {(0, 5, 1), (0, 9, 2), (2, 4, 1), (1, 2, 2), (2, 7, 2)}
UIDS = ["uid-a", "uid-a", "uid-b", "uid-b"]


def set_experts(experts: int) -> None:
    global EXPERTS
    EXPERTS = experts


def rollout(case: str, route_dtype: torch.dtype = torch.int64) -> dict:
    """The rollout's batch (verl's padded layout) and the logits each token meets in each layer."""
    gen = torch.Generator().manual_seed(0)
    batch, width = len(PROMPT_LENS), PROMPT + RESPONSE
    attention = torch.zeros(batch, width, dtype=torch.long)
    response_mask = torch.zeros(batch, RESPONSE, dtype=torch.long)
    for i, (p, r) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS, strict=True)):
        attention[i, PROMPT - p:PROMPT + r] = 1
        response_mask[i, :r] = 0 if i == PADDING_SAMPLE else 1
    response_mask[1, RESPONSE_LENS[1] - TOOL_TAIL:RESPONSE_LENS[1]] = 0
    logits = torch.randn(batch, width, LAYERS, EXPERTS, generator=gen)
    routes = logits.topk(TOPK, dim=-1).indices  # [batch, tokens, layers, topk]: the rollout routed as the actor will
    for sample, token, layer in PLANTED:
        column = PROMPT - PROMPT_LENS[sample] + token
        chosen = set(routes[sample, column, layer].tolist())
        routes[sample, column, layer, 1] = next(e for e in range(EXPERTS) if e not in chosen)
    routes[:, :, 0] = 0  # the dense layer: no router, no route
    for i, r in enumerate(RESPONSE_LENS):
        routes[i, PROMPT + r - 1:] = 0  # the last generated token was never routed (verl zero-fills: agent_loop.py)
    routes[1, PROMPT + RESPONSE_LENS[1] - TOOL_TAIL - 1:] = 0  # the tool tokens ending sample 1 were never routed
    routes[PADDING_SAMPLE] = 0  # verl's padding template: zero routes
    routes = routes * attention[:, :, None, None]
    if case == "zeros":
        routes.zero_()
    elif case == "truncated":
        routes[2, PROMPT + 5:] = 0  # sample 2's routes stop at its 6th response token
    elif case == "range":
        routes[0, PROMPT - PROMPT_LENS[0] + 3, 2, 0] = EXPERTS
    return {"attention": attention, "response_mask": response_mask, "routes": routes.to(route_dtype),
            "logits": logits}


def expected_agreement(data: dict) -> list[float]:
    """Per MoE layer: the share of replayed tokens (verl replays all but the last token of a sample with a response)
    whose route is the actor's top-2 set, from the rollout's tensors directly."""
    agree = np.zeros(LAYERS)
    total = np.zeros(LAYERS)
    for i in range(len(PROMPT_LENS)):
        if data["response_mask"][i].sum() == 0:
            continue
        columns = data["attention"][i].nonzero().flatten().tolist()[:-1]
        for column in columns:
            for layer in (1, 2):
                native = set(data["logits"][i, column, layer].topk(TOPK).indices.tolist())
                agree[layer] += native == set(data["routes"][i, column, layer].tolist())
                total[layer] += 1
    return [float(agree[layer] / total[layer]) for layer in (1, 2)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", default="good", choices=["good", "zeros", "truncated", "range"])
    parser.add_argument("--experts", type=int, default=EXPERTS, help="the model's experts (GLM-5.2: 256)")
    parser.add_argument("--route-dtype", default="int64", choices=["int64", "uint8"],
                        help="the dtype of the rollout's routes (verl 0.9.0's agent loop packs them as uint8)")
    args = parser.parse_args()
    case = args.case
    set_experts(args.experts)

    dist.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import parallel_state as mpu
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.moe.router import TopKRouter
    from megatron.core.transformer.transformer_config import TransformerConfig
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer  # noqa: F401  (its _update_actor: the metric's path)
    from verl.utils import tensordict_utils as tu
    from verl.utils.megatron import router_replay_patch as patch
    from verl.utils.megatron import router_replay_utils as utils
    from verl.utils.metric import reduce_metrics
    from verl.utils.py_functional import rename_dict
    from verl.workers.engine.megatron.transformer_impl import MegatronEngineWithLMHead
    from verl.workers.engine.utils import prepare_micro_batches
    from verl.workers.engine_workers import TrainingWorker
    from verl.workers.utils.padding import left_right_2_no_padding

    from verl_ascend_ext.patching.status import acts_of, current, stood_down_on

    mpu.initialize_model_parallel()
    patch.apply_router_replay_patch()
    config = TransformerConfig(num_layers=LAYERS, hidden_size=16, num_attention_heads=2, num_moe_experts=EXPERTS,
                               moe_router_topk=TOPK, moe_layer_freq=MOE_FREQ, enable_routing_replay=True,
                               add_bias_linear=False)
    groups = ProcessGroupCollection.use_mpu_process_groups()
    model = torch.nn.Module()
    model.decoder = torch.nn.ModuleList()
    for layer_number in (2, 3):
        router = TopKRouter(config=config, pg_collection=groups)
        router.set_layer_number(layer_number)
        model.decoder.append(router)

    data = rollout(case, getattr(torch, args.route_dtype))
    proto = DataProto.from_dict(
        tensors={"input_ids": torch.randint(3, 50, data["attention"].shape), "attention_mask": data["attention"],
                 "response_mask": data["response_mask"],
                 "position_ids": (data["attention"].cumsum(-1) - 1).clamp(min=0),
                 "prompts": torch.zeros(len(PROMPT_LENS), PROMPT, dtype=torch.long),
                 "responses": torch.zeros(len(PROMPT_LENS), RESPONSE, dtype=torch.long),
                 "routed_experts": data["routes"], "sample_index": torch.arange(len(PROMPT_LENS))},
        non_tensors={"uid": np.array(UIDS, dtype=object)})
    packed = left_right_2_no_padding(proto.to_tensordict())
    tu.assign_non_tensor(packed, use_dynamic_bsz=False, micro_batch_size_per_gpu=2, enable_routing_replay=True)
    engine = SimpleNamespace(engine_config=SimpleNamespace(router_replay=SimpleNamespace(mode="R3")), tf_config=config,
                             enable_routing_replay=True, module=[model])

    def forward(batch: object) -> None:
        """One pass over a (mini-)batch as verl's Megatron actor makes it under R3, the model being the routers."""
        micro_batches, _ = prepare_micro_batches(batch)
        patch.RouterReplay.set_global_router_replay_action(patch.RouterReplayAction.REPLAY_FORWARD)
        for micro in micro_batches:
            inputs = MegatronEngineWithLMHead.prepare_model_inputs(engine, micro)
            routes = utils.align_r3_router_replay_data(inputs["routed_experts"], inputs["input_ids"])
            mask = utils.build_r3_replay_mask(inputs["input_ids"], micro["response_mask"])
            utils.set_router_replay_data(routes, None, config, 0, replay_mask=mask, model=model)
            samples = micro["sample_index"].tolist()
            for router in model.decoder:  # packed as verl packs: each sample's attended tokens, in order
                logits = data["logits"][samples, :, router.layer_number - 1][micro["attention_mask"].bool()]
                _, routing_map = router.routing(logits[:, None, :])
                routed.append(routing_map)
        patch.RouterReplay.clear_global_indices()
        patch.RouterReplay.clear_global_router_replay_action()

    out: dict = {"case": case, "verl": verl.__version__, "route_dtype": str(data["routes"].dtype)}
    routed: list[torch.Tensor] = []  # every routing map the routers returned: what the MoE layers computed with
    try:
        forward(packed)  # the old-log-prob forward (compute_log_prob)
        worker = TrainingWorker.__new__(TrainingWorker)
        worker.engine = SimpleNamespace(**vars(engine), get_data_parallel_size=lambda: 1,
                                        get_data_parallel_rank=lambda: 0, get_data_parallel_group=lambda: None,
                                        train_mode=lambda **kwargs: nullcontext(),
                                        is_mp_src_rank_with_outputs=lambda: True)
        worker.profiler = SimpleNamespace(step=lambda: None)

        def train_batch(mini_batch: object) -> object:
            forward(mini_batch)
            return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": {"loss": [[0.5]]}})

        worker.train_batch = train_batch
        tu.assign_non_tensor(packed, mini_batch_size=len(UIDS), epochs=1, seed=0,
                             dataloader_kwargs={"shuffle": False})
        output = TrainingWorker.train_mini_batch(worker, packed)
        logged = reduce_metrics(rename_dict(tu.get(output, "metrics"), "actor/"))
        out["metrics"] = {k: float(v) for k, v in logged.items()}
    except Exception as err:  # the route check's error, or verl's own: reported, not raised
        out["error"] = f"{type(err).__name__}: {err}"
    out["expected"] = expected_agreement(data)
    if routed:
        maps = torch.cat(routed)
        out["expert_0_only"] = float((maps[:, 0] & (maps.sum(-1) == 1)).float().mean())
    out["statuses"] = {i: (current(i).status.value if current(i) else None) for i in IDS}
    out["acts"] = {i: acts_of(i) for i in IDS}
    out["stood_down"] = {i: stood_down_on(i) for i in IDS}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
