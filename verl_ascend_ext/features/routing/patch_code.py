"""Replacement code of the R3 route records (imported only when a record is applied; verl imported lazily)."""

from __future__ import annotations

import sys
from typing import Any

from verl_ascend_ext.features.routing.agreement import count, metrics_of, replaying_rollout_routes, take_counts
from verl_ascend_ext.features.routing.declaration import AGREEMENT_METRIC, ROUTE_AGREEMENT, ROUTE_CHECK
from verl_ascend_ext.features.routing.routes import RouterShape, check_micro_batch
from verl_ascend_ext.patching.status import acted, stood_down

REPLAY_MODULE = "verl.utils.megatron.router_replay_patch"  # imported by every rank of a Megatron R3 actor


def check_routes_before_replay(original: Any, engine: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    """``MegatronEngineWithLMHead.prepare_model_inputs``: verl's model inputs, after checking the R3 routes they
    carry (the ones ``forward_step`` replays next) against the micro-batch's tokens and the actor's model."""
    inputs = original(engine, batch, *args, **kwargs)
    routes = inputs.get("routed_experts") if isinstance(inputs, dict) else None
    if routes is None or not _replays_rollout_routes(engine, batch):
        return inputs
    config = engine.tf_config
    shape = RouterShape(num_experts=config.num_moe_experts, topk=config.moe_router_topk,
                        num_layers=config.num_layers, moe_layer_freq=getattr(config, "moe_layer_freq", 1))
    skipped = check_micro_batch(routes, inputs["input_ids"], batch.get("attention_mask", None),
                                batch.get("response_mask", None), shape, _uids(batch))
    if skipped is None:
        acted(ROUTE_CHECK.id)
    else:
        stood_down(ROUTE_CHECK.id, f"routes not checked: {skipped}")
    return inputs


def _replays_rollout_routes(engine: Any, batch: Any) -> bool:
    """R3 in this engine, and replay switched on for this call (verl's actor sets the flag; its reference does not)."""
    from verl.utils import tensordict_utils as tu

    replay = getattr(getattr(engine, "engine_config", None), "router_replay", None)
    return getattr(replay, "mode", None) == "R3" and bool(tu.get_non_tensor_data(batch, "enable_routing_replay", False))


def _uids(batch: Any) -> list[Any] | None:
    from verl.utils import tensordict_utils as tu

    uids = tu.get(batch, "uid")
    return list(uids) if isinstance(uids, (list, tuple)) else None


def count_route_agreement(original: Any, replay: Any, scores: Any, topk: int, num_groups: Any = None,
                          group_topk: Any = None, default_compute_topk: Any = None) -> Any:
    """``RouterReplay.get_replay_topk``: verl's replay, counting (on the device) how many replayed tokens the actor's
    own top-k agrees with; verl's own top-k call is reused, not repeated."""
    if default_compute_topk is None or not replaying_rollout_routes(replay):
        return original(replay, scores, topk, num_groups=num_groups, group_topk=group_topk,
                        default_compute_topk=default_compute_topk)
    target, mask = replay.target_topk_idx, replay.target_replay_mask
    native: list[Any] = []

    def compute_and_keep(*args: Any, **kwargs: Any) -> Any:
        probs, indices = default_compute_topk(*args, **kwargs)
        native.append(indices)
        return probs, indices

    result = original(replay, scores, topk, num_groups=num_groups, group_topk=group_topk,
                      default_compute_topk=compute_and_keep)
    if native and count(replay, native[0], target, mask):
        acted(ROUTE_AGREEMENT.id)
    return result


def report_route_agreement(original: Any, worker: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
    """``TrainingWorker.train_mini_batch``: verl's actor update, then the step's route agreement added to the metrics
    it returns. Every rank of the actor takes part (one all-reduce of the per-layer counts); the ranks that return
    verl's metrics get the same values."""
    output = original(worker, data, *args, **kwargs)
    engine = getattr(worker, "engine", None)
    replay = getattr(getattr(engine, "engine_config", None), "router_replay", None)
    if (not getattr(engine, "enable_routing_replay", False) or getattr(replay, "mode", None) != "R3"
            or REPLAY_MODULE not in sys.modules):  # R3 on another engine (VeOmni's): no Megatron router counted
        return output
    metrics = _step_agreement(engine)
    if not metrics:
        stood_down(AGREEMENT_METRIC.id, "no replayed token was counted in this update (the routers did not replay "
                   "through verl's RouterReplay.get_replay_topk)")
        return output
    acted(AGREEMENT_METRIC.id)
    if output is not None:
        from verl.utils import tensordict_utils as tu

        tu.assign_non_tensor(output, metrics={**(tu.get(output, "metrics") or {}), **metrics})
    return output


def _step_agreement(engine: Any) -> dict[str, list[float]]:
    import torch.distributed as dist
    from verl.utils.megatron.router_replay_utils import iter_model_routers
    from verl.utils.megatron_utils import unwrap_model

    distributed = dist.is_available() and dist.is_initialized()
    table = take_counts(iter_model_routers(unwrap_model(engine.module)), engine.tf_config.num_layers,
                        _collective_device() if distributed else "cpu")
    if distributed and dist.get_world_size() > 1:
        dist.all_reduce(table)
    return metrics_of(table)


def _collective_device() -> str:
    """Where the default process group reduces a tensor: the host under gloo (verl's ``cpu:gloo,...`` too), else the
    current accelerator (NCCL, HCCL)."""
    import torch.distributed as dist
    from verl.utils.device import get_device_id, get_device_name

    if "gloo" in str(dist.get_backend()):
        return "cpu"
    return f"{get_device_name()}:{get_device_id()}"
