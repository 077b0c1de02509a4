# shellcheck shell=bash
# What both GLM-5.2 recipes (glm5_2_megatron, glm5_2_megatron_fully_async) share: how GLM-5.2 trains on
# Megatron/MindSpeed and rolls out on vLLM-Ascend, its paths, and the launch for Ascend NPUs only.
# Sourced (not run) by their run.sh, after ../_launch.sh. When sourced it sets the defaults below (an
# environment variable of the same name wins); the run.sh then sets its own (nodes, batch size, TP EP CP,
# MAX_RESPONSE_LENGTH and MAX_MODEL_LEN, CKPT_DIR, EXP_NAME, ...), calls glm5_2_megatron_overrides and
# places the GLM5_2_* arrays it fills among its own overrides.
# shellcheck disable=SC2034  # the variables and arrays are read by the run.sh that sources this file

# Ascend NPUs only: recipe_main (../_launch.sh) stops (exit 3) when no NPU is visible, unless
# VERL_ASCEND_RECIPE_DEVICE_CHECK=0.
RECIPE_NPU_ONLY=1

# ---- paths and sizes both recipes default alike ----
MODEL_PATH=${MODEL_PATH:-$HOME/models/GLM-5.2}
TRAIN_FILE=${TRAIN_FILE:-$HOME/data/dapo-math-17k/train.parquet}
VAL_FILE=${VAL_FILE:-$TRAIN_FILE}
PROJECT_NAME=${PROJECT_NAME:-verl_grpo_glm5_2}
# -1 (upstream's choice) never saves; with a positive SAVE_FREQ every save exports HF weights and runs
# the export check that makes checkpoint.strict=False safe.
SAVE_FREQ=${SAVE_FREQ:--1}
PPO_MINI_BATCH_SIZE=${PPO_MINI_BATCH_SIZE:-16}
N_RESPONSES=${N_RESPONSES:-8}
MAX_PROMPT_LENGTH=${MAX_PROMPT_LENGTH:-2048}
# Megatron pipeline and expert-tensor parallel sizes; vLLM-Ascend's parallelism (its EP must equal TP*DP).
PP=${PP:-8}
# Pipeline layout for PP=8 over GLM-5.2's layers (E = embedding, t = transformer layer, L = loss);
# change it together with PP.
PP_LAYOUT=${PP_LAYOUT:-Et*10|t*12|t*8|t*8|t*12|t*12|t*12|t*4L}
ETP=${ETP:-1}
INFER_TP=${INFER_TP:-8}
INFER_DP=${INFER_DP:-8}
INFER_EP=${INFER_EP:-64}

# Fills the GLM5_2_* arrays once the run.sh has set its sizes and CKPT_DIR, EXP_NAME, MAX_MODEL_LEN.
glm5_2_megatron_overrides() {
    local tc=actor_rollout_ref.actor.megatron.override_transformer_config
    ROLLOUT_DATA_DIR=${ROLLOUT_DATA_DIR:-$CKPT_DIR/rollout_data}
    # The launch command carries the GLM-5.2 patch gate the run.sh exports.
    LAUNCH_ENV=("VERL_VLLM_ASCEND_GLM52_PATCH=$VERL_VLLM_ASCEND_GLM52_PATCH")

    # The head of DATA (the batch sizes are the run.sh's).
    GLM5_2_DATA=(
        data.train_files="$TRAIN_FILE"
        data.val_files="$VAL_FILE"
        data.max_prompt_length="$MAX_PROMPT_LENGTH"
        data.max_response_length="$MAX_RESPONSE_LENGTH"
        data.filter_overlong_prompts=False
        data.truncation=left
        +data.apply_chat_template_kwargs.enable_thinking=False
    )

    GLM5_2_MODEL=(
        actor_rollout_ref.nccl_timeout=7200
        actor_rollout_ref.model.path="$MODEL_PATH"
        actor_rollout_ref.model.use_remove_padding=False
        actor_rollout_ref.model.use_fused_kernels=False
    )

    # The ACTOR overrides but its loss (KL, clip ratios, loss mode) and learning-rate schedule.
    GLM5_2_ACTOR=(
        actor_rollout_ref.actor.strategy=megatron
        actor_rollout_ref.actor.optim.lr=1e-6
        actor_rollout_ref.actor.ppo_mini_batch_size="$PPO_MINI_BATCH_SIZE"
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1
        actor_rollout_ref.actor.ppo_max_token_len_per_gpu="$MAX_MODEL_LEN"
        actor_rollout_ref.actor.use_dynamic_bsz=False
        actor_rollout_ref.actor.use_torch_compile=False
        # GLM-5.2's MTP layers are not trained here and are omitted from the exported HF weights, so a
        # strict export check would fail on them. strict=False alone would hide any other missing
        # weight: verl-ascend-ext's export check (VERL_ASCEND_EXT_EXPORT_CHECK, checkpoint feature)
        # tolerates only the weights the model is known to omit.
        actor_rollout_ref.actor.checkpoint.strict=False
        actor_rollout_ref.actor.megatron.use_mbridge=True
        actor_rollout_ref.actor.megatron.vanilla_mbridge=False
        actor_rollout_ref.actor.megatron.use_remove_padding=False
        actor_rollout_ref.actor.megatron.pad_bshd_to_minibatch_max=False
        actor_rollout_ref.actor.megatron.use_dist_checkpointing=False
        actor_rollout_ref.actor.megatron.pipeline_model_parallel_size="$PP"
        actor_rollout_ref.actor.megatron.tensor_model_parallel_size="$TP"
        actor_rollout_ref.actor.megatron.expert_model_parallel_size="$EP"
        actor_rollout_ref.actor.megatron.expert_tensor_parallel_size="$ETP"
        actor_rollout_ref.actor.megatron.context_parallel_size="$CP"
        # Parameter and optimizer offload.
        actor_rollout_ref.actor.megatron.param_offload=True
        actor_rollout_ref.actor.megatron.optimizer_offload=True
        +actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_offload_fraction=1
        +actor_rollout_ref.actor.optim.override_optimizer_config.use_precision_aware_optimizer=True
        +actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_cpu_offload=True
        # Routing replay R3: the rollout records expert routes, training replays them.
        actor_rollout_ref.actor.megatron.router_replay.mode=R3
    )

    # Megatron / MindSpeed TransformerConfig fields (free-form in verl's config).
    GLM5_2_TRANSFORMER=(
        "$tc.attention_backend=fused"
        "+$tc.use_flash_attn=True"
        "+$tc.use_distributed_optimizer=True"
        "+$tc.sequence_parallel=True"
        "+$tc.gradient_accumulation_fusion=False"
        "+$tc.masked_softmax_fusion=False"
        "+$tc.bias_dropout_fusion=False"
        "+$tc.attention_softmax_in_fp32=True"
        "+$tc.recompute_method=uniform"
        "+$tc.recompute_granularity=full"
        "+$tc.recompute_num_layers=1"
        # Fused RMSNorm and SwiGLU.
        "+$tc.normalization=RMSNorm"
        "+$tc.use_fused_rmsnorm=True"
        "+$tc.swiglu=True"
        "+$tc.use_fused_swiglu=True"
        # DeepSeek sparse attention (dsa) variant with its fused lightning indexer.
        "+$tc.experimental_attention_variant=dsa"
        "+$tc.dsa_grouped_recompute=True"
        "+$tc.use_dsa_absorb=True"
        "+$tc.dsa_indexer_use_sparse_loss=True"
        "+$tc.dsa_indexer_loss_coeff=0"
        "+$tc.use_fused_lightning_indexer=True"
        "+$tc.use_fused_sparse_flash_attention=True"
        "+$tc.use_fused_lightning_indexer_kl_loss=True"
        "+$tc.moe_router_enable_expert_bias=True"
        "+$tc.moe_router_dtype=fp32"
        "+$tc.moe_shared_expert_overlap=False"
        # Context parallel (CP) with the KV all-gather algorithm.
        "+$tc.context_parallel_size=$CP"
        "+$tc.context_parallel_algo=kvallgather_cp_algo"
        "+$tc.reset_position_ids=False"
        "+$tc.use_ascend_mc2=False"
        "+$tc.pipeline_model_parallel_layout=\"$PP_LAYOUT\""
    )

    # The reference model's Megatron layout, offload, dynamic batch size and token limit follow the
    # actor's in verl's own ref config.
    GLM5_2_REF=(
        actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1
        actor_rollout_ref.ref.megatron.use_dist_checkpointing=False
    )

    # The ROLLOUT overrides but its memory share (gpu_memory_utilization) and mode. Its log-prob dynamic
    # batch size and token limit follow the actor's in verl's own rollout config.
    GLM5_2_ROLLOUT=(
        actor_rollout_ref.rollout.name=vllm
        actor_rollout_ref.rollout.n="$N_RESPONSES"
        actor_rollout_ref.rollout.temperature=1.0
        actor_rollout_ref.rollout.top_p=1.0
        actor_rollout_ref.rollout.top_k=-1
        actor_rollout_ref.rollout.tensor_model_parallel_size="$INFER_TP"
        actor_rollout_ref.rollout.data_parallel_size="$INFER_DP"
        actor_rollout_ref.rollout.expert_parallel_size="$INFER_EP"
        actor_rollout_ref.rollout.load_format=dummy
        actor_rollout_ref.rollout.max_num_seqs=64
        actor_rollout_ref.rollout.max_model_len="$MAX_MODEL_LEN"
        actor_rollout_ref.rollout.max_num_batched_tokens=4096
        actor_rollout_ref.rollout.enforce_eager=False
        actor_rollout_ref.rollout.calculate_log_probs=True
        actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1
        actor_rollout_ref.rollout.enable_rollout_routing_replay=True
        ++actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.enable_cpu_binding=True
        # vLLM-Ascend's extra clean-up after sleep (vllm-ascend #9585: less device memory kept after each sleep)
        ++actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.enable_sleep_mode_extra_cleanup=True
        +actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config.cudagraph_mode=FULL_DECODE_ONLY
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config.cudagraph_capture_sizes=[2,4,8,16,24,32,64]"
    )

    # The TRAINER overrides but its node layout and loggers.
    GLM5_2_TRAINER=(
        trainer.device=npu
        trainer.project_name="$PROJECT_NAME"
        trainer.experiment_name="$EXP_NAME"
        trainer.default_local_dir="$CKPT_DIR"
        trainer.rollout_data_dir="$ROLLOUT_DATA_DIR"
        trainer.resume_mode=auto
        trainer.save_freq="$SAVE_FREQ"
        trainer.test_freq=-1
        trainer.val_before_train=False
        trainer.balance_batch=False
        trainer.total_epochs=100
    )
}
