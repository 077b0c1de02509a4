"""The agreement of the replayed routes with the actor's own router: counted per layer, reported once per step.

In an R3 forward verl's ``RouterReplay.get_replay_topk`` has both, for every token its replay mask covers: the
rollout's routes (the replay targets) and the actor's own top-k (``default_compute_topk`` on the router's scores).
A token agrees when the two expert SETS are equal. Each layer's ``RouterReplay`` keeps two device counters (agreeing
tokens, replayed tokens: no host sync in the forward); the actor update takes them off the routers once per step,
sums them over every rank by layer and reports the mean over layers of each layer's share, and the lowest share.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

COUNTS = "_verl_ascend_ext_route_agreement"  # on a RouterReplay: int64 [agreeing tokens, replayed tokens]
METRIC = "rollout_actor_route_agreement"  # verl's trainer logs the actor update's metrics as actor/<key>
METRIC_MIN = f"{METRIC}_min"  # verl reduces a key holding "min" with np.min, the others with np.mean


def replaying_rollout_routes(replay: Any) -> bool:
    """Whether this router call replays the rollout's routes in a forward (R3: replay targets with a replay mask)."""
    action = getattr(replay, "router_replay_action", None)
    return (getattr(action, "value", action) == "replay_forward"
            and getattr(replay, "target_topk_idx", None) is not None
            and getattr(replay, "target_replay_mask", None) is not None)


def count(replay: Any, native: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> bool:
    """Add one router call's counts to ``replay``; True when they are its first since the last report."""
    with torch.no_grad():
        keep = mask.to(native.device).bool().reshape(-1)
        if target.shape != native.shape or keep.numel() != native.shape[0]:
            return False  # verl refuses such a replay itself ("Router replay tensors are not aligned")
        # the sets are equal when each of the router's k (distinct) experts is among the k replayed ones; no sort
        same = (native[:, :, None] == target.to(native.device)[:, None, :]).any(-1).all(-1) & keep
        counts = torch.stack((same.sum(), keep.sum()))
    previous = getattr(replay, COUNTS, None)
    setattr(replay, COUNTS, counts if previous is None else previous + counts)
    return previous is None


def take_counts(routers: Iterable[tuple[int, Any]], num_layers: int, device: torch.device | str) -> torch.Tensor:
    """``[num_layers, 2]`` counts by Megatron ``layer_number`` (row ``n - 1``), taken off the routers (reset)."""
    table = torch.zeros(num_layers, 2, dtype=torch.long, device=device)
    for layer_number, replay in routers:
        counts = getattr(replay, COUNTS, None)
        if counts is None:
            continue
        setattr(replay, COUNTS, None)
        if 1 <= layer_number <= num_layers:
            table[layer_number - 1] += counts.to(device)
    return table


def metrics_of(table: torch.Tensor) -> dict[str, list[float]]:
    """The step's metrics from the per-layer counts (verl's metric lists); empty when no token was replayed."""
    replayed = table[:, 1] > 0
    if not bool(replayed.any()):
        return {}
    share = table[replayed, 0].double() / table[replayed, 1].double()
    return {METRIC: [float(share.mean())], METRIC_MIN: [float(share.min())]}
