"""This package's own feature declarations as the boot needs them (``runtime.boot_plan``).

Generated from the registry by `verl-ascend boot-manifest --write`; do not edit by hand
(``tests/test_boot_manifest.py`` fails when it is stale, and a process that booted with a stale one stops at the
first import of a target).
"""

DISTRIBUTION = 'verl-ascend-ext'

# (entry-point name, module) of the verl_ascend_ext.features group, sorted
FEATURES = (
    ('checkpoint', 'verl_ascend_ext.features.checkpoint.declaration'),
    ('device', 'verl_ascend_ext.features.device.declaration'),
    ('distillation', 'verl_ascend_ext.features.distillation.declaration'),
    ('fully_async_generation', 'verl_ascend_ext.features.fully_async_generation.declaration'),
    ('glm52_ascend', 'verl_ascend_ext.features.glm52.ascend.declaration'),
    ('glm52_vllm', 'verl_ascend_ext.features.glm52.vllm.declaration'),
    ('job_watch', 'verl_ascend_ext.features.job_watch.declaration'),
    ('routing', 'verl_ascend_ext.features.routing.declaration'),
    ('sleep_memory', 'verl_ascend_ext.features.sleep_memory.declaration'),
    ('weight_sync', 'verl_ascend_ext.features.weight_sync.declaration'),
)

# (variable, default)
GATES = (
    ('VERL_ASCEND_EXT_WEIGHT_SYNC_FIXES', True),
    ('VERL_ASCEND_EXT_SLEEP_MEMORY', True),
    ('VERL_ASCEND_EXT_ROUTE_CHECK', True),
    ('VERL_ASCEND_EXT_JOB_WATCH', True),
    ('VERL_VLLM_ASCEND_GLM52_PATCH', False),
    ('VERL_ASCEND_EXT_FULLY_ASYNC_FAIL_CLOSED', True),
    ('VERL_ASCEND_EXT_DISTILLATION_FIXES', True),
    ('VERL_ASCEND_EXT_DEVICE_HOOKS', True),
    ('VERL_ASCEND_EXT_FORWARD_ENV', True),
    ('VERL_ASCEND_EXT_CHECKPOINT_FIXES', True),
)

# (variable, default, parser module:name, unit)
SETTINGS = (
    ('VERL_ASCEND_EXT_WEIGHT_SYNC_BARRIER_TIMEOUT', 600.0, 'verl_ascend_ext.patching.gates:positive_seconds', 's'),
    ('VERL_ASCEND_EXT_SLEEP_MEMORY_WARMUP', 2, 'verl_ascend_ext.features.sleep_memory.settings:warmup_sleeps', 'sleeps'),
    ('VERL_ASCEND_EXT_SLEEP_MEMORY_WINDOW', 12, 'verl_ascend_ext.features.sleep_memory.settings:window_sleeps', 'sleeps'),
    ('VERL_ASCEND_EXT_SLEEP_MEMORY_GROWTH_MIB', 256.0, 'verl_ascend_ext.patching.gates:positive_mebibytes', 'MiB'),
    ('VERL_ASCEND_EXT_JOB_WATCH_STOPPED_TIMEOUT', 600.0, 'verl_ascend_ext.patching.gates:positive_seconds', 's'),
    ('VERL_ASCEND_EXT_JOB_WATCH_NODE_TIMEOUT', 30.0, 'verl_ascend_ext.patching.gates:positive_seconds', 's'),
    ('VERL_ASCEND_EXT_JOB_STUCK', 'error', 'verl_ascend_ext.features.job_watch.targets:stuck_mode', ''),
    ('VERL_ASCEND_EXT_JOB_STUCK_TIMEOUT', 900.0, 'verl_ascend_ext.patching.gates:positive_seconds', 's'),
    ('VERL_ASCEND_EXT_CLUSTER_CHECK', 'error', 'verl_ascend_ext.features.device.targets:cluster_check_mode', ''),
    ('VERL_ASCEND_EXT_CLUSTER_CHECK_TIMEOUT', 60.0, 'verl_ascend_ext.patching.gates:positive_seconds', 's'),
)

# (patch id, target, gate variable, observed)
RECORDS = (
    ('weight-sync-kv-barrier', 'verl.workers.engine_workers:ActorRolloutRefWorker.update_weights', 'VERL_ASCEND_EXT_WEIGHT_SYNC_FIXES', 'acts'),
    ('weight-sync-light-empty-cache', 'verl.utils.memory_utils:aggressive_empty_cache', 'VERL_ASCEND_EXT_WEIGHT_SYNC_FIXES', 'acts'),
    ('weight-sync-sender-no-full-gc', 'verl.workers.rollout.vllm_rollout.bucketed_weight_transfer:BucketedWeightSender._cleanup', 'VERL_ASCEND_EXT_WEIGHT_SYNC_FIXES', 'eager'),
    ('weight-sync-receiver-no-full-gc', 'verl.workers.rollout.vllm_rollout.bucketed_weight_transfer:BucketedWeightReceiver._cleanup', 'VERL_ASCEND_EXT_WEIGHT_SYNC_FIXES', 'eager'),
    ('sleep-memory-ascend', 'vllm_ascend.worker.worker:NPUWorker.sleep', 'VERL_ASCEND_EXT_SLEEP_MEMORY', 'acts'),
    ('sleep-memory-cuda', 'vllm.v1.worker.gpu_worker:Worker.sleep', 'VERL_ASCEND_EXT_SLEEP_MEMORY', 'acts'),
    ('sleep-memory-cpu', 'vllm.v1.worker.cpu_worker:CPUWorker.sleep', 'VERL_ASCEND_EXT_SLEEP_MEMORY', 'acts'),
    ('wake-up-time-ascend', 'vllm_ascend.worker.worker:NPUWorker.wake_up', 'VERL_ASCEND_EXT_SLEEP_MEMORY', 'acts'),
    ('wake-up-time-cuda', 'vllm.v1.worker.gpu_worker:Worker.wake_up', 'VERL_ASCEND_EXT_SLEEP_MEMORY', 'acts'),
    ('wake-up-time-cpu', 'vllm.v1.worker.cpu_worker:CPUWorker.wake_up', 'VERL_ASCEND_EXT_SLEEP_MEMORY', 'acts'),
    ('sleep-memory-metric', 'verl.utils.tracking:Tracking.log', 'VERL_ASCEND_EXT_SLEEP_MEMORY', 'acts'),
    ('r3-route-check', 'verl.workers.engine.megatron.transformer_impl:MegatronEngineWithLMHead.prepare_model_inputs', 'VERL_ASCEND_EXT_ROUTE_CHECK', 'acts'),
    ('r3-route-agreement', 'verl.utils.megatron.router_replay_patch:RouterReplay.get_replay_topk', 'VERL_ASCEND_EXT_ROUTE_CHECK', 'acts'),
    ('r3-route-agreement-metric', 'verl.workers.engine_workers:TrainingWorker.train_mini_batch', 'VERL_ASCEND_EXT_ROUTE_CHECK', 'acts'),
    ('job-watch', 'verl.trainer.ppo.v1.trainer_base:PPOTrainer.fit', 'VERL_ASCEND_EXT_JOB_WATCH', 'acts'),
    ('job-watch-fully-async', 'verl.experimental.fully_async_policy.fully_async_trainer:FullyAsyncTrainer.fit', 'VERL_ASCEND_EXT_JOB_WATCH', 'acts'),
    ('glm52-vllm-wake-up-resume-when-awake', 'vllm.v1.engine.core:EngineCore.wake_up', 'VERL_VLLM_ASCEND_GLM52_PATCH', 'acts'),
    ('glm52-vllm-dp-no-dummy-forward-asleep', 'vllm.v1.engine.core:DPEngineCoreProc.execute_dummy_batch', 'VERL_VLLM_ASCEND_GLM52_PATCH', 'acts'),
    ('glm52-vllm-engine-core-entry', 'vllm.v1.engine.core:EngineCoreProc.run_engine_core', 'VERL_VLLM_ASCEND_GLM52_PATCH', 'eager'),
    ('glm52-ascend-rmsnorm-add-then-norm', 'vllm_ascend.ops.layernorm:AscendRMSNorm.forward_oot', 'VERL_VLLM_ASCEND_GLM52_PATCH', 'traced'),
    ('glm52-ascend-sfa-keep-kv-b-proj', 'vllm_ascend.attention.sfa_v1:AscendSFAImpl.process_weights_after_loading', 'VERL_VLLM_ASCEND_GLM52_PATCH', 'acts'),
    ('glm52-ascend-indexer-scale-base', 'vllm_ascend.device.device_op:BaseDeviceAdaptor.indexer_select_post_process', 'VERL_VLLM_ASCEND_GLM52_PATCH', 'traced'),
    ('glm52-ascend-indexer-scale-a5', 'vllm_ascend.device.device_op:A5DeviceAdaptor.indexer_select_post_process', 'VERL_VLLM_ASCEND_GLM52_PATCH', 'traced'),
    ('glm52-ascend-indexer-scale-cp', 'vllm_ascend.attention.context_parallel.sfa_cp:AscendSFACPImpl._execute_indexer_select', 'VERL_VLLM_ASCEND_GLM52_PATCH', 'traced'),
    ('glm52-ascend-camem-sync-before-sleep', 'vllm_ascend.device_allocator.camem:CaMemAllocator.sleep', 'VERL_VLLM_ASCEND_GLM52_PATCH', 'eager'),
    ('glm52-ascend-routed-experts-capture', 'vllm_ascend.patch.worker:<module>', 'VERL_VLLM_ASCEND_GLM52_PATCH', 'import'),
    ('fully-async-generation-fails-closed', 'verl.experimental.fully_async_policy.fully_async_rollouter:FullyAsyncRollouter.fit', 'VERL_ASCEND_EXT_FULLY_ASYNC_FAIL_CLOSED', 'acts'),
    ('distill-fsdp2-topk', 'verl.trainer.distillation.losses:compute_topk_loss', 'VERL_ASCEND_EXT_DISTILLATION_FIXES', 'acts'),
    ('padding-teacher-fields', 'verl.trainer.ppo.padding_utils:construct_minimal_padding_template', 'VERL_ASCEND_EXT_DISTILLATION_FIXES', 'acts'),
    ('distill-empty-micro-batch', 'verl.trainer.distillation.losses:distillation_loss', 'VERL_ASCEND_EXT_DISTILLATION_FIXES', 'acts'),
    ('ray-runtime-env-gates', 'verl.trainer.constants_ppo:get_ppo_ray_runtime_env', 'VERL_ASCEND_EXT_FORWARD_ENV', 'acts'),
    ('checkpoint-export-check', 'verl.utils.checkpoint.megatron_checkpoint_manager:MegatronCheckpointManager._save_model_as_hf_via_bridge', 'VERL_ASCEND_EXT_CHECKPOINT_FIXES', 'acts'),
    ('checkpoint-export-check-fsdp', 'verl.utils.checkpoint.fsdp_checkpoint_manager:FSDPCheckpointManager.save_checkpoint', 'VERL_ASCEND_EXT_CHECKPOINT_FIXES', 'acts'),
    ('checkpoint-config-whole', 'verl.utils.checkpoint.megatron_checkpoint_manager:_to_json_safe_config_dict', 'VERL_ASCEND_EXT_CHECKPOINT_FIXES', 'eager'),
)

# (module, hook module:name)
IMPORT_HOOKS = (
    ('verl.plugin.platform.platform_npu', 'verl_ascend_ext.features.device.import_hooks:on_platform_module'),
    ('verl.trainer.main_ppo', 'verl_ascend_ext.features.device.import_hooks:on_main_ppo'),
    ('verl.utils.checkpoint.megatron_checkpoint_manager', 'verl_ascend_ext.features.checkpoint.declaration:_validate_mode'),
    ('verl.utils.checkpoint.fsdp_checkpoint_manager', 'verl_ascend_ext.features.checkpoint.declaration:_validate_mode'),
)
