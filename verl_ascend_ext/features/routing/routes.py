"""The checks on one micro-batch's R3 routes (plain functions on tensors; no verl import).

verl's Megatron actor replays the routes the rollout recorded (``routed_experts``: per sample, per token, per layer,
the ``topk`` expert ids) in every MoE layer. Before it does, a micro-batch's routes must be routes a router can have
chosen, for the tokens they are replayed on:

- **length**: a sample has a route row per token (or one fewer: the rollout never routes the last generated token;
  verl appends a placeholder), as verl's ``align_r3_router_replay_data`` accepts;
- **range**: every replayed expert id is in ``[0, num_experts)``;
- **a route on every token that feeds the response**: a row holding one expert ``topk`` times (``[0, 0]``: what is
  left where the rollout recorded nothing, since verl zero-fills the rows it did not get) is no router's choice when
  ``topk`` is 2 or more. Only tokens before the sample's last response token count: later ones (a tool response
  that ended a multi-turn sample, the placeholder) reach no scored token, and verl's agent loop leaves them zero;
- **not one expert set for a whole sample**: every token of every MoE layer holding the same experts (in the same
  order) is what a capture that wrote nothing looks like (vllm#49184: all-zero routes), also for ``topk`` 1.
  Checked only for samples with at least ``MIN_CONSTANT_TOKENS`` such tokens and a model with more experts than
  ``topk`` (then a real router keeping one set for every token of every layer has odds like
  ``p ** (tokens * layers)``: a false positive, which stops a job, is ruled out in practice; a short sample is left
  to the rest of the batch, which the same capture fault hits too).

The checks run on the device where the routes are, as whole-tensor operations (no sort) with three host syncs per
micro-batch (the lengths, the masks, the verdict); the message is built only for a micro-batch that fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from verl_ascend_ext.features.routing.declaration import GATE, ROUTE_CHECK
from verl_ascend_ext.patching.gates import DISABLE_ENV
from verl_ascend_ext.patching.status import DETAIL

MIN_CONSTANT_TOKENS = 32
CAPTURE = "vllm#49184"
TRUNCATION = "verl#6027"


class RouteCheckError(RuntimeError):
    """A micro-batch's R3 routes that must not be replayed: the message names the sample, the layer, what was found,
    the likely cause and the fix."""


@dataclass(frozen=True)
class RouterShape:
    """What the check needs of the actor's model: its MoE layout as Megatron's ``TransformerConfig`` gives it."""

    num_experts: int
    topk: int
    num_layers: int
    moe_layer_freq: Any = 1  # Megatron's: an int (every n-th layer is MoE) or a list of 0/1 per layer


@dataclass(frozen=True)
class Rows:
    """Per sample: ``feed`` = the tokens before its last response token (they reach a scored log-prob), ``replay`` =
    the tokens verl replays (every token but the last one when the sample has a response token)."""

    feed: torch.Tensor
    replay: torch.Tensor


def checked_layers(route_layers: int, shape: RouterShape) -> list[tuple[int, int]]:
    """``(index in the routes' layer axis, Megatron layer_number)`` of the MoE layers verl replays, picked as
    ``set_router_replay_data`` picks them: by layer when the routes hold every decoder layer, else by MoE ordinal."""
    moe = [i for i in range(shape.num_layers) if _is_moe(shape.moe_layer_freq, i)]
    if route_layers == shape.num_layers:
        return [(i, i + 1) for i in moe]
    return [(ordinal, layer + 1) for ordinal, layer in enumerate(moe[:route_layers])]


def _is_moe(freq: Any, layer: int) -> bool:
    if isinstance(freq, int):
        return layer % freq == 0
    if isinstance(freq, (list, tuple)):
        return layer < len(freq) and freq[layer] == 1
    return True


def rows_of(input_lengths: torch.Tensor, attention_mask: Any, response_mask: Any) -> Rows | str:
    """The rows to check per sample, from verl's masks: dense (``attention_mask`` over prompt + response, right-aligned
    ``response_mask`` over the response: the legacy trainer's padded batch) or packed (no ``attention_mask``, a
    nested ``response_mask`` over each sample's response, which ends the sample: verl's v1 trainer, whose agent loop
    stores ``prompts + responses``); a string saying why they cannot be told when the masks are neither."""
    if attention_mask is None and isinstance(response_mask, torch.Tensor) and response_mask.is_nested:
        return _packed_rows(input_lengths, response_mask)
    if not isinstance(attention_mask, torch.Tensor) or not isinstance(response_mask, torch.Tensor):
        return "the micro-batch has no attention_mask / response_mask: the tokens that feed the response are unknown"
    if attention_mask.is_nested or response_mask.is_nested or attention_mask.dim() != 2 or response_mask.dim() != 2:
        return "attention_mask / response_mask are not [batch, tokens]: the tokens that feed the response are unknown"
    batch, width = attention_mask.shape
    response_width = response_mask.shape[1]
    if response_mask.shape[0] != batch or response_width > width or input_lengths.numel() != batch:
        return (f"attention_mask / response_mask do not match the packed samples{DETAIL}attention_mask "
                f"{tuple(attention_mask.shape)}, response_mask {tuple(response_mask.shape)}, "
                f"{input_lengths.numel()} packed samples")
    attended = attention_mask.bool()
    if not torch.equal(attended.sum(-1).to(input_lengths.device), input_lengths):
        return "attention_mask does not count the packed samples' tokens: the tokens that feed the response are unknown"
    position = attended.long().cumsum(-1) - 1  # column -> row of the packed sample
    scored = response_mask.bool() & attended[:, width - response_width:]
    last = torch.where(scored, position[:, width - response_width:], torch.full_like(scored, -1, dtype=torch.long))
    feed = last.max(-1).values.clamp(min=0).to(input_lengths.device)
    has_response = response_mask.sum(-1).to(input_lengths.device) > 0
    replay = torch.where(has_response, input_lengths - 1, torch.zeros_like(input_lengths))
    return Rows(feed=feed, replay=replay)


def _packed_rows(input_lengths: torch.Tensor, response_mask: torch.Tensor) -> Rows | str:
    """``Rows`` of packed samples whose response (``response_mask``'s row, 1 on scored tokens, 0 on a tool's) is the
    last ``len(row)`` tokens of the sample."""
    offsets = response_mask.offsets().to(input_lengths.device)
    response_lengths = offsets.diff()
    if response_lengths.numel() != input_lengths.numel() or bool((response_lengths > input_lengths).any()):
        return (f"response_mask's rows do not end the packed samples: the tokens that feed the response are "
                f"unknown{DETAIL}{response_lengths.numel()} rows of {response_lengths.tolist()} tokens, "
                f"{input_lengths.numel()} samples of {input_lengths.tolist()} tokens")
    scored = response_mask.values().to(input_lengths.device).bool()
    samples = input_lengths.numel()
    sample = torch.repeat_interleave(torch.arange(samples, device=input_lengths.device), response_lengths)
    position = torch.arange(scored.numel(), device=input_lengths.device) - offsets[:-1][sample]
    last = torch.full((samples,), -1, dtype=torch.long, device=input_lengths.device)
    last = last.scatter_reduce(0, sample[scored], position[scored].long(), reduce="amax")
    has_response = last >= 0
    feed = torch.where(has_response, input_lengths - response_lengths + last, torch.zeros_like(input_lengths))
    replay = torch.where(has_response, input_lengths - 1, torch.zeros_like(input_lengths))
    return Rows(feed=feed, replay=replay)


def check_micro_batch(routes: torch.Tensor, input_ids: torch.Tensor, attention_mask: Any, response_mask: Any,
                      shape: RouterShape, uids: Sequence[Any] | None = None) -> str | None:
    """Check one micro-batch's routes (``[samples, tokens*, layers, topk]``, nested like ``input_ids``).

    Returns None when they were checked and may be replayed, or why they were not checked (one of a fixed set of
    texts, what varies by micro-batch after ``status.DETAIL``: a stand-down path); raises
    ``RouteCheckError`` naming the first failing sample and layer."""
    if not (routes.is_nested and input_ids.is_nested):
        return "routed_experts / input_ids are not packed (nested): verl's R3 replay refuses them itself"
    values = routes.values()
    if values.dim() != 3:
        raise RouteCheckError(_message(None, None, uids, f"routed_experts has shape {_shape(routes)}, not "
                                       "[samples, tokens, layers, topk]", "the rollout returned routes in another "
                                       "layout", _CAPTURE_FIX))
    if values.shape[-1] != shape.topk:
        raise RouteCheckError(_message(None, None, uids, f"the routes carry {values.shape[-1]} experts per token; the "
                                       f"actor's router picks moe_router_topk={shape.topk}", "the rollout served a "
                                       "model with another router configuration than the actor's", _MODEL_FIX))
    offsets = routes.offsets().to(values.device)
    input_lengths = input_ids.offsets().diff().to(values.device)
    route_lengths = offsets.diff()
    _check_lengths(route_lengths, input_lengths, uids)
    rows = rows_of(input_lengths, attention_mask, response_mask)
    if isinstance(rows, str):
        return rows
    layers = checked_layers(values.shape[1], shape)
    if not layers:
        return f"no MoE layer among the routes' layers{DETAIL}{values.shape[1]} layers, num_layers={shape.num_layers}"
    found = _flags(values, offsets, rows, [i for i, _ in layers], shape)
    if not bool(torch.stack([f.any() for f in found]).any()):  # the verdict
        return None
    raise RouteCheckError(_diagnose(values, offsets, rows, layers, shape, found, uids))


def _shape(tensor: torch.Tensor) -> tuple:
    return tuple(tensor.size(i) if not (tensor.is_nested and i == 1) else "j" for i in range(tensor.dim()))


def _check_lengths(route_lengths: torch.Tensor, input_lengths: torch.Tensor, uids: Sequence[Any] | None) -> None:
    if route_lengths.numel() != input_lengths.numel():
        raise RouteCheckError(_message(None, None, uids, f"{route_lengths.numel()} samples of routes for "
                                       f"{input_lengths.numel()} samples of tokens", "routes of another batch",
                                       _TRUNCATION_FIX))
    bad = ((route_lengths != input_lengths) & (route_lengths != input_lengths - 1)).nonzero().flatten().tolist()
    if bad:
        i = bad[0]
        n, m = int(route_lengths[i]), int(input_lengths[i])
        raise RouteCheckError(_message(i, len(input_lengths), uids, f"it has {n} route rows for its {m} tokens "
                                       f"(verl replays {m} or {m - 1}); {len(bad) - 1} other sample(s) of this "
                                       "micro-batch too", f"routes {'shorter' if n < m else 'longer'} than the "
                                       f"sample: a response truncated without its routes ({TRUNCATION})",
                                       _TRUNCATION_FIX))


def _flags(values: torch.Tensor, offsets: torch.Tensor, rows: Rows, layers: list[int],
           shape: RouterShape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out of range [tokens, layers], no route [tokens, layers], one set for the whole sample [samples]).

    Two reductions per row, no sort: its lowest and highest expert id give the range, and a row whose lowest and
    highest id are equal holds one expert ``topk`` times (``[0, 0]``: verl's zero-fill) where a router picks ``topk``
    distinct ones. "One set" compares each row with the sample's first as stored (a capture that wrote one value wrote
    it in one order). The ids are widened to int32 first: verl 0.9.0 packs routes as uint8, on which a comparison
    with ``num_experts`` wraps around."""
    samples = offsets.numel() - 1
    sample = torch.repeat_interleave(torch.arange(samples, device=values.device), offsets.diff())
    row = torch.arange(values.shape[0], device=values.device) - offsets[:-1][sample]
    feeds = row < rows.feed[sample]
    replayed = row < rows.replay[sample]
    ids = values[:, layers, :].int()
    low, high = ids.amin(-1), ids.amax(-1)
    out_of_range = ((low < 0) | (high >= shape.num_experts)) & replayed[:, None]
    no_route = (low == high) & feeds[:, None] if shape.topk > 1 else torch.zeros_like(out_of_range)
    first = ids[offsets[:-1].clamp(max=max(values.shape[0] - 1, 0)), 0]  # each sample's token 0, first layer
    same = (ids == first[sample][:, None, :]).flatten(1).all(-1) | ~feeds
    differing = torch.zeros(samples, dtype=torch.long, device=values.device).index_add_(0, sample, (~same).long())
    constant = (differing == 0) & (rows.feed >= MIN_CONSTANT_TOKENS)
    if shape.num_experts <= shape.topk:
        constant = torch.zeros_like(constant)  # every token uses every expert: one set is all there is
    return out_of_range, no_route, constant


def _diagnose(values: torch.Tensor, offsets: torch.Tensor, rows: Rows, layers: list[tuple[int, int]],
              shape: RouterShape, found: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
              uids: Sequence[Any] | None) -> str:
    out_of_range, no_route, constant = found
    samples = offsets.numel() - 1
    failing = [i for i in range(samples) if bool(out_of_range[offsets[i]:offsets[i + 1]].any())
               or bool(no_route[offsets[i]:offsets[i + 1]].any()) or bool(constant[i])]
    i = failing[0]
    start, feed = int(offsets[i]), int(rows.feed[i])
    others = f"; {len(failing) - 1} other sample(s) of this micro-batch fail too" if len(failing) > 1 else ""
    bad = out_of_range[start:int(offsets[i + 1])]
    if bool(bad.any()):
        row, column = (int(x) for x in bad.nonzero()[0])
        expert = [int(x) for x in values[start + row, layers[column][0]]]
        what = (f"decoder layer {layers[column][1]}: token {row} replays experts {expert}, outside the model's "
                f"{shape.num_experts} experts (0-{shape.num_experts - 1}); {int(bad.sum())} such route(s) in "
                f"{int(bad.any(0).sum())} layer(s){others}")
        return _message(i, samples, uids, what, "routes of a model with another expert count, or routes corrupted on "
                        "their way from the rollout", _MODEL_FIX)
    missing = no_route[start:start + feed]
    if bool(missing.any()):
        return _message(i, samples, uids, _missing(values, start, feed, layers, missing) + others,
                        *_missing_cause(missing, feed))
    sample_layers = len(layers)
    expert = sorted(int(x) for x in values[start, layers[0][0]])
    what = (f"all {feed} tokens that feed its response replay the same experts {expert} in every one of its "
            f"{sample_layers} MoE layer(s){others}")
    return _message(i, samples, uids, what, f"no router keeps one expert set for every token and layer: the rollout's "
                    f"capture wrote one value for all tokens ({CAPTURE}: monolithic MoE kernels return all-zero "
                    f"routed_experts; verl would replay experts {expert} for every token and train on them)",
                    _CAPTURE_FIX)


def _missing(values: torch.Tensor, start: int, feed: int, layers: list[tuple[int, int]],
             missing: torch.Tensor) -> str:
    per_layer = missing.sum(0)
    column = int((per_layer > 0).nonzero()[0])  # the first layer (in decoder order) without routes
    rows = missing[:, column].nonzero().flatten()
    first, count = int(rows[0]), int(rows.numel())
    example = [int(x) for x in values[start + first, layers[column][0]]]
    spread = f"{int((per_layer > 0).sum())} of its {len(layers)} MoE layers"
    if count == feed:
        where = f"none of its {feed} tokens that feed its response has a route"
    elif first + count == feed:
        where = f"its routes stop at token {first}: the last {count} of its {feed} tokens that feed its response " \
                "have none"
    else:
        where = f"{count} of its {feed} tokens that feed its response have none (the first: token {first})"
    return f"decoder layer {layers[column][1]}: {where} (its rows hold one expert {len(example)} times, e.g. " \
           f"{example}); {spread} affected"


def _missing_cause(missing: torch.Tensor, feed: int) -> tuple[str, str]:
    counts = missing.sum(0)
    if bool((counts == feed).all()):
        return (f"the rollout returned no routes for this sample (all-zero routed_experts): vLLM's routed-experts "
                f"capture did not run, e.g. a monolithic MoE kernel that routes inside the kernel ({CAPTURE}); verl "
                "would replay expert 0 for every token and train on it", _CAPTURE_FIX)
    rows = missing.any(1).nonzero().flatten()
    if int(rows[-1]) == feed - 1 and int(rows.numel()) == feed - int(rows[0]):
        return (f"the routes are shorter than the tokens: a truncated response whose routes were cut differently "
                f"({TRUNCATION}), or a capture that missed the last steps of the rollout", _TRUNCATION_FIX)
    return ("the rollout's capture lost these tokens' routes (verl zero-fills rows it did not receive)", _CAPTURE_FIX)


_CAPTURE_FIX = ("make the rollout capture every token's routes (vLLM: an MoE backend whose routing runs through its "
                "router, not a monolithic kernel, or a vLLM with the capture fixed), or turn R3 off "
                "(actor_rollout_ref.actor.megatron.router_replay.mode=disabled and "
                "actor_rollout_ref.rollout.enable_rollout_routing_replay=False)")
_TRUNCATION_FIX = (f"cut routed_experts with the response wherever the agent loop truncates it ({TRUNCATION}), or "
                   "turn R3 off (actor_rollout_ref.actor.megatron.router_replay.mode=disabled)")
_MODEL_FIX = "serve the rollout from the actor's model and config, or turn R3 off " \
             "(actor_rollout_ref.actor.megatron.router_replay.mode=disabled)"


def _message(sample: int | None, samples: int | None, uids: Sequence[Any] | None, what: str, cause: str,
             fix: str) -> str:
    if sample is None:
        whose = "this micro-batch's R3 routes"
    else:
        uid = f"uid {uids[sample]!r}" if uids is not None and sample < len(uids) else "no uid"
        whose = f"the R3 routes of sample {sample} of the {samples} in this micro-batch ({uid})"
    return (f"verl-ascend-ext route check ({ROUTE_CHECK.id}): {whose} must not be replayed: {what}. Likely cause: "
            f"{cause}. Fix: {fix}. To replay such routes anyway: {GATE.env}=0, or {DISABLE_ENV}={ROUTE_CHECK.id}.")
