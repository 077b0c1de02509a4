#!/usr/bin/env bash
# GLM-5.2 GRPO on DAPO-Math-17k with Megatron + vLLM-Ascend: 32 nodes x 16 NPU dies.
#
# FOR ASCEND NPUs ONLY. This script stops (exit 3) when no NPU is visible on this machine.
# Set VERL_ASCEND_RECIPE_DEVICE_CHECK=0 only to dry-run it elsewhere (tests, CPU login nodes).
#
# Before launching it runs `verl-ascend recipe check glm5_2_megatron`: the overrides below are
# composed against the installed verl's own config and the installed packages are compared with
# manifest.toml. DRY_RUN=1 prints the final command instead of running it.
#
# Launch on the Ray head node of a running 32-node cluster (see README.md):
#   MODEL_PATH=/models/GLM-5.2 TRAIN_FILE=/data/dapo-math-17k.parquet bash run.sh [extra Hydra overrides...]
set -euo pipefail
# Shared by the recipes: the launch steps (../_launch.sh) and GLM-5.2's overrides (../_glm5_2_megatron.sh).
HERE=$(dirname "${BASH_SOURCE[0]}")
[ -f "$HERE/../_launch.sh" ] || { echo "error: $0 sources ../_launch.sh and finds none in $HERE/..: keep an" \
    "edited run.sh in a folder beside the shipped recipes (verl-ascend recipe show prints them)." >&2; exit 2; }
# shellcheck source=SCRIPTDIR/../_launch.sh
source "$HERE/../_launch.sh"
# shellcheck source=SCRIPTDIR/../_glm5_2_megatron.sh
source "$HERE/../_glm5_2_megatron.sh"

RECIPE=glm5_2_megatron
SCRIPT_PATH="${BASH_SOURCE[0]}"

# The GLM-5.2 vLLM-Ascend patch set (verl's in-tree one on verl 0.9.1, verl-ascend-ext's elsewhere).
export VERL_VLLM_ASCEND_GLM52_PATCH=1

# ---- paths and sizes (environment variables, with defaults; PYTHON, VERL_ASCEND: ../_launch.sh) ----
MODEL_PATH=${MODEL_PATH:-$HOME/models/GLM-5.2}
SAVE_FREQ=${SAVE_FREQ:--1}
TRAIN_FILE=${TRAIN_FILE:-$HOME/data/dapo-math-17k/train.parquet}
VAL_FILE=${VAL_FILE:-$TRAIN_FILE}
CKPT_DIR=${CKPT_DIR:-$HOME/ckpt/glm5_2_grpo}
ROLLOUT_DATA_DIR=${ROLLOUT_DATA_DIR:-$CKPT_DIR/rollout_data}
PROJECT_NAME=${PROJECT_NAME:-verl_grpo_glm5_2}
EXP_NAME=${EXP_NAME:-glm5_2_megatron_32nodes}

NNODES=${NNODES:-32}
NPUS_PER_NODE=${NPUS_PER_NODE:-16}  # 8 cards x 2 dies
TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-64}
PPO_MINI_BATCH_SIZE=${PPO_MINI_BATCH_SIZE:-16}
N_RESPONSES=${N_RESPONSES:-8}
MAX_PROMPT_LENGTH=${MAX_PROMPT_LENGTH:-2048}
MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-6144}
MAX_MODEL_LEN=$((MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH))

# Training parallelism (Megatron) and inference parallelism (vLLM-Ascend; its EP must equal TP*DP).
PP=${PP:-8}
TP=${TP:-8}
EP=${EP:-64}
ETP=${ETP:-1}
CP=${CP:-1}
INFER_TP=${INFER_TP:-8}
INFER_DP=${INFER_DP:-8}
INFER_EP=${INFER_EP:-64}
# Pipeline layout for PP=8 over GLM-5.2's layers (E = embedding, t = transformer layer, L = loss);
# change it together with PP.
PP_LAYOUT=${PP_LAYOUT:-Et*10|t*12|t*8|t*8|t*12|t*12|t*12|t*4L}

# ---- Hydra overrides ----
# Read by `verl-ascend recipe check` too (VERL_ASCEND_RECIPE_EMIT=overrides): this is the one copy,
# with the GLM5_2_* arrays shared with the other GLM-5.2 recipe (../_glm5_2_megatron.sh).
glm5_2_megatron_overrides
RAY=(
    # Carries the gate to every Ray worker. Redundant when verl-ascend-ext's device feature carries
    # gates itself, and harmless then (same value).
    "++ray_kwargs.ray_init.runtime_env.env_vars.VERL_VLLM_ASCEND_GLM52_PATCH='1'"
)

DATA=(
    data.train_files="$TRAIN_FILE"
    data.val_files="$VAL_FILE"
    data.train_batch_size="$TRAIN_BATCH_SIZE"
    data.max_prompt_length="$MAX_PROMPT_LENGTH"
    data.max_response_length="$MAX_RESPONSE_LENGTH"
    data.filter_overlong_prompts=False
    data.truncation=left
    +data.apply_chat_template_kwargs.enable_thinking=False
)

MODEL=(
    actor_rollout_ref.nccl_timeout=7200
    actor_rollout_ref.model.path="$MODEL_PATH"
    actor_rollout_ref.model.use_remove_padding=False
    actor_rollout_ref.model.use_fused_kernels=False
)

ALGORITHM=(
    algorithm.adv_estimator=grpo
    algorithm.use_kl_in_reward=False
    algorithm.kl_ctrl.kl_coef=0.0
    algorithm.rollout_correction.rollout_is=token
    algorithm.rollout_correction.rollout_is_threshold=2.0
    algorithm.rollout_correction.rollout_is_batch_normalize=True
    algorithm.rollout_correction.rollout_rs=token_k1
    algorithm.rollout_correction.rollout_rs_threshold=0.6_1.6
)

ACTOR=(
    actor_rollout_ref.actor.strategy=megatron
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.actor.ppo_mini_batch_size="$PPO_MINI_BATCH_SIZE"
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu="$MAX_MODEL_LEN"
    actor_rollout_ref.actor.use_dynamic_bsz=False
    actor_rollout_ref.actor.use_torch_compile=False
    # KL loss against the reference policy (not KL in the reward).
    actor_rollout_ref.actor.use_kl_loss=True
    actor_rollout_ref.actor.kl_loss_coef=0.002
    actor_rollout_ref.actor.kl_loss_type=low_var_kl
    actor_rollout_ref.actor.clip_ratio_low=0.2
    actor_rollout_ref.actor.clip_ratio_high=0.28
    actor_rollout_ref.actor.clip_ratio_c=10.0
    "${GLM5_2_ACTOR[@]}"
)

ROLLOUT=(
    "${GLM5_2_ROLLOUT[@]}"
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6
)

TRAINER=(
    trainer.device=npu
    trainer.nnodes="$NNODES"
    trainer.n_gpus_per_node="$NPUS_PER_NODE"
    "trainer.logger=[\"console\"]"
    trainer.project_name="$PROJECT_NAME"
    trainer.experiment_name="$EXP_NAME"
    trainer.default_local_dir="$CKPT_DIR"
    trainer.rollout_data_dir="$ROLLOUT_DATA_DIR"
    trainer.resume_mode=auto
    # -1 (upstream's choice) never saves; with a positive SAVE_FREQ every save exports HF weights and
    # runs the export check that makes checkpoint.strict=False safe.
    trainer.save_freq="$SAVE_FREQ"
    trainer.test_freq=-1
    trainer.val_before_train=False
    trainer.balance_batch=False
    trainer.total_epochs=100
)

ENTRY=verl.trainer.main_ppo
CONFIG_NAME=ppo_megatron_trainer
OVERRIDES=("${RAY[@]}" "${DATA[@]}" "${MODEL[@]}" "${ALGORITHM[@]}" "${ACTOR[@]}" "${GLM5_2_TRANSFORMER[@]}"
           "${GLM5_2_REF[@]}" "${ROLLOUT[@]}" "${TRAINER[@]}")

recipe_emit_overrides

# ---- device check (Ascend NPUs only), preflight against the installed verl and manifest.toml, launch ----
CHECK_ARGS=(--script "$SCRIPT_PATH")
if recipe_device_check_on; then
    recipe_require_npu
else
    CHECK_ARGS+=(--no-device)
fi
LAUNCH_ENV=("VERL_VLLM_ASCEND_GLM52_PATCH=$VERL_VLLM_ASCEND_GLM52_PATCH")
recipe_launch "$@"
