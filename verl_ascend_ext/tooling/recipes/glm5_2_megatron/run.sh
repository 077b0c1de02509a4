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
RECIPE=glm5_2_megatron
CONFIG_NAME=ppo_megatron_trainer
ENTRY=verl.trainer.main_ppo
# Shared by the recipes: the launch steps (../_launch.sh) and what the GLM-5.2 recipes share
# (../_glm5_2_megatron.sh: its defaults of MODEL_PATH TRAIN_FILE VAL_FILE PROJECT_NAME SAVE_FREQ
# PPO_MINI_BATCH_SIZE N_RESPONSES MAX_PROMPT_LENGTH PP ETP INFER_TP INFER_DP INFER_EP PP_LAYOUT, its overrides).
HERE=$(dirname "${BASH_SOURCE[0]}")
[ -f "$HERE/../_launch.sh" ] || { echo "error: $0 sources ../_launch.sh and finds none in $HERE/..: keep an" \
    "edited run.sh in a folder beside the shipped recipes (verl-ascend recipe show prints them)." >&2; exit 2; }
# shellcheck source=SCRIPTDIR/../_launch.sh
source "$HERE/../_launch.sh"
# shellcheck source=SCRIPTDIR/../_glm5_2_megatron.sh
source "$HERE/../_glm5_2_megatron.sh"

# The GLM-5.2 vLLM-Ascend patch set (verl's in-tree one on verl 0.9.1, verl-ascend-ext's elsewhere).
export VERL_VLLM_ASCEND_GLM52_PATCH=1

# ---- paths and sizes (environment variables, with defaults; PYTHON, VERL_ASCEND: ../_launch.sh) ----
CKPT_DIR=${CKPT_DIR:-$HOME/ckpt/glm5_2_grpo}
EXP_NAME=${EXP_NAME:-glm5_2_megatron_32nodes}
NNODES=${NNODES:-32}
NPUS_PER_NODE=${NPUS_PER_NODE:-16}  # 8 cards x 2 dies
TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-64}
MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-6144}
MAX_MODEL_LEN=$((MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH))
# Training parallelism (Megatron; PP and ETP: ../_glm5_2_megatron.sh).
TP=${TP:-8}
EP=${EP:-64}
CP=${CP:-1}

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
    "${GLM5_2_DATA[@]}"
    data.train_batch_size="$TRAIN_BATCH_SIZE"
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
    "${GLM5_2_ACTOR[@]}"
    # KL loss against the reference policy (not KL in the reward).
    actor_rollout_ref.actor.use_kl_loss=True
    actor_rollout_ref.actor.kl_loss_coef=0.002
    actor_rollout_ref.actor.kl_loss_type=low_var_kl
    actor_rollout_ref.actor.clip_ratio_low=0.2
    actor_rollout_ref.actor.clip_ratio_high=0.28
    actor_rollout_ref.actor.clip_ratio_c=10.0
)

ROLLOUT=(
    "${GLM5_2_ROLLOUT[@]}"
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6
)

TRAINER=(
    trainer.nnodes="$NNODES"
    trainer.n_gpus_per_node="$NPUS_PER_NODE"
    "trainer.logger=[\"console\"]"
    "${GLM5_2_TRAINER[@]}"
)

OVERRIDES=("${RAY[@]}" "${DATA[@]}" "${GLM5_2_MODEL[@]}" "${ALGORITHM[@]}" "${ACTOR[@]}" "${GLM5_2_TRANSFORMER[@]}"
           "${GLM5_2_REF[@]}" "${ROLLOUT[@]}" "${TRAINER[@]}")

# ---- device check (Ascend NPUs only), preflight against the installed verl and manifest.toml, launch ----
recipe_main "$@"
