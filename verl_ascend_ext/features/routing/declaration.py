"""Feature declaration: the R3 route records and their gate (loaded at discovery; no heavy imports).

verl's rollout routing replay (R3: ``actor.megatron.router_replay.mode=R3`` with
``rollout.enable_rollout_routing_replay=True``) makes the Megatron actor replay, in every MoE layer, the experts the
rollout chose. Three records: the routes of each micro-batch are checked before they are replayed
(``r3-route-check``); the replayed routes are compared with the actor's own router as they are replayed
(``r3-route-agreement``); the step's agreement is added to the actor update's metrics (``r3-route-agreement-metric``,
logged by verl's trainer as ``actor/rollout_actor_route_agreement``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from verl_ascend_ext.patching import Fingerprint, Gate, PatchRecord
from verl_ascend_ext.runtime.hookspecs import hookimpl

if TYPE_CHECKING:
    from verl_ascend_ext.runtime.findings import Finding

GATE = Gate(
    "VERL_ASCEND_EXT_ROUTE_CHECK",
    default=True,
    doc="R3 routes checked before the Megatron actor replays them (length, expert range, all-zero / one expert for a "
    "whole sample: stops naming the sample and layer); their agreement with the actor's router logged every step as "
    "actor/rollout_actor_route_agreement.",
)

ENGINE = "verl.workers.engine.megatron.transformer_impl"
REPLAY_UTILS = "verl.utils.megatron.router_replay_utils"
REPLAY_PATCH = "verl.utils.megatron.router_replay_patch"
WORKERS = "verl.workers.engine_workers"
NEVER = "never: no verl release checks the rollout's routes or reports their agreement with the actor's router"

ROUTE_CHECK = PatchRecord(
    id="r3-route-check",
    feature="routing",
    why="R3 replays whatever routes the rollout returned: all-zero routes (vllm#49184, monolithic MoE kernels capture "
    "nothing) make every token use expert 0 and the job trains on it without an error; routes shorter than the tokens "
    "(verl#6027) or outside the expert range replay wrong experts. Check each micro-batch before it is replayed and "
    "stop naming the sample, the layer, the likely cause and the fix.",
    target=f"{ENGINE}:MegatronEngineWithLMHead.prepare_model_inputs",
    gate=GATE,
    distribution="verl",
    versions=">=0.9.0,<0.10",
    original=Fingerprint(
        contains=(r"routed_experts = batch\.get\('routed_experts', None\)",
                  r"'routed_experts': routed_experts\}"),
        also=(
            Fingerprint(at=f"{ENGINE}:MegatronEngineWithLMHead.forward_step", contains=(
                r"model_inputs = self\.prepare_model_inputs\(batch\)",
                r"layers_topk_idx = model_inputs\['routed_experts'\]",
                r"if self\.engine_config\.router_replay\.mode == 'R3':\n\s+layers_topk_idx = "
                r"align_r3_router_replay_data\(layers_topk_idx, input_ids\)\n\s+replay_mask = "
                r"build_r3_replay_mask\(input_ids, batch\['response_mask'\]\)",
            )),
            Fingerprint(at=f"{REPLAY_UTILS}:align_r3_router_replay_data",
                        contains=(r"elif route_len == input_len - 1:",)),
            Fingerprint(at=f"{REPLAY_UTILS}:build_r3_replay_mask",
                        contains=(r"replay_lens = torch\.where\(response_lens > 0, total_lens - 1, "
                                  r"torch\.zeros_like\(total_lens\)\)",)),
        ),
        description="the micro-batch's routed_experts handed to forward_step, which aligns them to input_ids (one "
        "missing final route allowed) and replays every token but the last of a sample with a response (R3)",
    ),
    fixed=Fingerprint.never_matching(NEVER),
    wrapper="verl_ascend_ext.features.routing.patch_code:check_routes_before_replay",
    upstream="none (this package's addition; the faults: vllm#49184, verl#6027)",
    remove_when="verl checks the rollout's routes before replaying them",
    traced=False,
    acts_when="an R3 micro-batch carries the rollout's routes into the actor's forward (replay on: the actor's "
    "log-prob and update forwards, not the reference's)",
)

ROUTE_AGREEMENT = PatchRecord(
    id="r3-route-agreement",
    feature="routing",
    why="Routing drift between rollout and actor (a bad weight sync, a broken capture, numerics) is invisible: count, "
    "as verl replays the rollout's routes, how many tokens the actor's own router would have routed the same way.",
    target=f"{REPLAY_PATCH}:RouterReplay.get_replay_topk",
    gate=GATE,
    distribution="verl",
    versions=">=0.9.0,<0.10",
    original=Fingerprint(
        contains=(
            r"if action == RouterReplayAction\.REPLAY_FORWARD and self\.target_topk_idx is not None:\n\s+"
            r"indices = self\.target_topk_idx\n\s+replay_mask = self\.target_replay_mask",
            r"_, native_indices = default_compute_topk\(scores, topk, num_groups=num_groups, group_topk=group_topk\)",
            r"indices = torch\.where\(replay_mask\.to\(scores\.device\)\.bool\(\)\.unsqueeze\(-1\), indices, "
            r"native_indices\)",
        ),
        also=(Fingerprint(at=f"{REPLAY_PATCH}:_patched_topk_routing_with_score_function", contains=(
            r"return router_replay\.get_replay_topk\(scores, topk, num_groups=num_groups, group_topk=group_topk, "
            r"default_compute_topk=_compute_topk\)",)),),
        description="a forward replay of the targets under their replay mask, where the rest keep the router's own "
        "top-k from default_compute_topk (called once), the top-k verl's patched routing passes in",
    ),
    fixed=Fingerprint.never_matching(NEVER),
    wrapper="verl_ascend_ext.features.routing.patch_code:count_route_agreement",
    upstream="none (this package's addition)",
    remove_when="verl reports the agreement of replayed and actor routes",
    # Eager: verl's replay reads targets set per micro-batch as Python attributes (a compiled or captured router
    # would freeze them); Megatron does not compile the router. The count reads no ContextVar all the same and is
    # traced whole by torch.compile(fullgraph=True) (tests/test_routing.py).
    traced=False,
    acts_when="a router replays the rollout's routes in a forward (R3 replay targets with a replay mask); reported "
    "once per layer and step",
)

AGREEMENT_METRIC = PatchRecord(
    id="r3-route-agreement-metric",
    feature="routing",
    why="The agreement counted in the routers must reach the user's logger: add it to the metrics the actor update "
    "returns, which verl's trainer logs every step (as actor/rollout_actor_route_agreement, and _min over layers).",
    target=f"{WORKERS}:TrainingWorker.train_mini_batch",
    gate=GATE,
    distribution="verl",
    versions=">=0.9.0,<0.10",
    original=Fingerprint(
        contains=(
            r"if self\.engine\.is_mp_src_rank_with_outputs\(\):",
            r"output = tu\.get_tensordict\(tensor_dict=\{\}, non_tensor_dict=\{'metrics': metrics\}\)\.cpu\(\)\n\s+"
            r"else:\n\s+output = None\n\s*return output\Z",
        ),
        also=(
            Fingerprint(at=f"{WORKERS}:ActorRolloutRefWorker.update_actor",
                        contains=(r"output = self\.actor\.train_mini_batch\(data=data\)",)),
            Fingerprint(at="verl.trainer.ppo.ray_trainer:RayPPOTrainer._update_actor",
                        contains=(r"actor_output = tu\.get\(actor_output, 'metrics'\)\n\s+"
                                  r"actor_output = rename_dict\(actor_output, 'actor/'\)",)),
        ),
        description="the update returns {'metrics': ...} on the ranks with outputs (None elsewhere), called by the "
        "actor's update_actor; the trainer logs those metrics with the prefix actor/",
    ),
    fixed=Fingerprint.never_matching(NEVER),
    wrapper="verl_ascend_ext.features.routing.patch_code:report_route_agreement",
    upstream="none (this package's addition)",
    remove_when="verl reports the agreement of replayed and actor routes",
    traced=False,
    acts_when="an R3 actor update ends with replayed tokens counted (every rank reduces the counts; the ranks with "
    "outputs report them)",
    needs=(ROUTE_AGREEMENT,),  # it reports what that record's replacement counts
)


@hookimpl
def verl_ascend_ext_gates() -> list[Gate]:
    return [GATE]


@hookimpl
def verl_ascend_ext_patch_records() -> list[PatchRecord]:
    return [ROUTE_CHECK, ROUTE_AGREEMENT, AGREEMENT_METRIC]


@hookimpl
def verl_ascend_ext_doctor_findings(environ: Mapping[str, str]) -> list[Finding]:
    from verl_ascend_ext.features.routing.checks import doctor_findings

    return doctor_findings(environ, GATE)
