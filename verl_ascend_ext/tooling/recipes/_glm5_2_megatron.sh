# shellcheck shell=bash
# The Hydra overrides both GLM-5.2 recipes (glm5_2_megatron, glm5_2_megatron_fully_async) share: how
# GLM-5.2 trains on Megatron/MindSpeed and rolls out on vLLM-Ascend. Sourced (not run) by their run.sh,
# which calls glm5_2_megatron_overrides once its sizes are set (PP TP EP ETP CP PP_LAYOUT MAX_MODEL_LEN
# N_RESPONSES INFER_TP INFER_DP INFER_EP) and places the arrays it fills among its own overrides.
# shellcheck disable=SC2034  # the arrays are read by the run.sh that sources this file

glm5_2_megatron_overrides() {
    local tc=actor_rollout_ref.actor.megatron.override_transformer_config

    # The end of the ACTOR overrides.
    GLM5_2_ACTOR=(
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
        +actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config.cudagraph_mode=FULL_DECODE_ONLY
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config.cudagraph_capture_sizes=[2,4,8,16,24,32,64]"
    )
}
