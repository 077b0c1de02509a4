#!/usr/bin/env bash
# GLM-5.2 fully-async GRPO (GSPO loss) on DAPO-Math-17k with Megatron + vLLM-Ascend:
# 16 training nodes + 16 disjoint rollout nodes, 16 NPU dies each.
#
# FOR ASCEND NPUs ONLY. This script stops (exit 3) when no NPU is visible on this machine.
# Set VERL_ASCEND_RECIPE_DEVICE_CHECK=0 only to dry-run it elsewhere (tests, CPU login nodes).
#
# Before launching it runs `verl-ascend recipe check glm5_2_megatron_fully_async`: the overrides
# below are composed against the installed verl's fully-async config, the training and rollout node
# layouts are checked against the parallel sizes, and the installed packages are compared with
# manifest.toml. DRY_RUN=1 prints the final command instead of running it.
#
# Launch on the Ray head node of a running 32-node cluster (see README.md):
#   MODEL_PATH=/models/GLM-5.2 TRAIN_FILE=/data/dapo-math-17k.parquet bash run.sh [extra Hydra overrides...]
set -euo pipefail
RECIPE=glm5_2_megatron_fully_async
CONFIG_NAME=fully_async_ppo_megatron_trainer
ENTRY=verl.experimental.fully_async_policy.fully_async_main
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

# The fully-async config finds verl's trainer config through a search path relative to the working
# directory (verl's repository root); this makes it the installed verl's, wherever this runs.
# (find_spec locates verl without importing it.)
if ! VERL_TRAINER_CONFIG=$("$PYTHON" -c 'import importlib.util, os, sys
spec = importlib.util.find_spec("verl")
if spec is None:
    sys.exit("verl is not installed for " + sys.executable)
print(os.path.join(list(spec.submodule_search_locations)[0], "trainer", "config"))'); then
    echo "error: $RECIPE needs verl installed for PYTHON='$PYTHON'." >&2
    exit 2
fi

# The GLM-5.2 vLLM-Ascend patch set (verl's in-tree one on verl 0.9.1, verl-ascend-ext's elsewhere);
# it includes the guard against scheduling after a weights-only wake-up that async training needs.
export VERL_VLLM_ASCEND_GLM52_PATCH=1

# ---- paths and sizes (environment variables, with defaults; PYTHON, VERL_ASCEND: ../_launch.sh) ----
CKPT_DIR=${CKPT_DIR:-$HOME/ckpt/glm5_2_fully_async}
EXP_NAME=${EXP_NAME:-glm5_2_megatron_16train_16rollout_fully_async}

# Two disjoint resource pools: training (trainer.*) and rollout (rollout.*), whole nodes each.
NNODES_TRAIN=${NNODES_TRAIN:-16}
NNODES_ROLLOUT=${NNODES_ROLLOUT:-16}
NPUS_PER_NODE_TRAIN=${NPUS_PER_NODE_TRAIN:-16}  # 8 cards x 2 dies
NPUS_PER_NODE_ROLLOUT=${NPUS_PER_NODE_ROLLOUT:-16}
# Ray cluster to join ("auto": the running one); empty leaves ray_init.address unset. Not RAY_ADDRESS,
# which Ray reads itself and clusters often set to the dashboard's job-submission address.
RAY_ADDRESS_OVERRIDE=${RAY_ADDRESS_OVERRIDE-auto}

# Batches: the trainer consumes mini-batches from the rollout queue, so data.train_batch_size is 0
# and the rollouter generates GEN_BATCH_SIZE prompts at a time.
GEN_BATCH_SIZE=${GEN_BATCH_SIZE:-1}
REQUIRE_BATCHES=${REQUIRE_BATCHES:-1}
TRIGGER_PARAMETER_SYNC_STEP=${TRIGGER_PARAMETER_SYNC_STEP:-4}
STALENESS_THRESHOLD=${STALENESS_THRESHOLD:-0.3}
PARTIAL_ROLLOUT=${PARTIAL_ROLLOUT:-True}
TOTAL_ROLLOUT_STEPS=${TOTAL_ROLLOUT_STEPS:-$((TRIGGER_PARAMETER_SYNC_STEP * REQUIRE_BATCHES * PPO_MINI_BATCH_SIZE * 100))}

# Training parallelism (Megatron; PP=8 and ETP: ../_glm5_2_megatron.sh): 256 dies / (TP*PP*CP = 128) =
# data parallel 2. Inference (vLLM-Ascend, TP8 x DP8 there): 256 dies / 64 = 4 replicas.
TP=${TP:-4}
EP=${EP:-32}
CP=${CP:-4}

MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-32768}
MAX_MODEL_LEN=$((MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH))

# Loss: GSPO (sequence-level ratios, hence the tiny clip range) with seq-mean-token-mean aggregation.
LOSS_MODE=${LOSS_MODE:-gspo}
LOSS_AGG_MODE=${LOSS_AGG_MODE:-seq-mean-token-mean}
CLIP_RATIO_LOW=${CLIP_RATIO_LOW:-0.0003}
CLIP_RATIO_HIGH=${CLIP_RATIO_HIGH:-0.0004}
# Rollout correction: token-level importance sampling, sequence-level rejection sampling.
ROLLOUT_IS=${ROLLOUT_IS:-token}
ROLLOUT_IS_THRESHOLD=${ROLLOUT_IS_THRESHOLD:-2.0}
ROLLOUT_IS_BATCH_NORMALIZE=${ROLLOUT_IS_BATCH_NORMALIZE:-False}
ROLLOUT_RS=${ROLLOUT_RS:-seq_mean_k1}
ROLLOUT_RS_THRESHOLD=${ROLLOUT_RS_THRESHOLD:-0.98_1.02}


# ---- Hydra overrides ----
# Read by `verl-ascend recipe check` too (VERL_ASCEND_RECIPE_EMIT=overrides): this is the one copy,
# with the GLM5_2_* arrays shared with the other GLM-5.2 recipe (../_glm5_2_megatron.sh).
glm5_2_megatron_overrides
HYDRA=(
    "hydra.searchpath=[file://$VERL_TRAINER_CONFIG]"
)

RAY=(
    # Carries the gate to every Ray worker. Redundant when verl-ascend-ext's device feature carries
    # gates itself, and harmless then (same value).
    "++ray_kwargs.ray_init.runtime_env.env_vars.VERL_VLLM_ASCEND_GLM52_PATCH='1'"
)
if [ -n "$RAY_ADDRESS_OVERRIDE" ]; then
    RAY+=(+ray_kwargs.ray_init.address="$RAY_ADDRESS_OVERRIDE")
fi

DATA=(
    "${GLM5_2_DATA[@]}"
    data.train_batch_size=0
    data.gen_batch_size="$GEN_BATCH_SIZE"
)

MODEL=(
    "${GLM5_2_MODEL[@]}"
    # Training and rollout on separate nodes: no hybrid (colocated) engine.
    actor_rollout_ref.hybrid_engine=False
)

ALGORITHM=(
    algorithm.adv_estimator=grpo
    algorithm.use_kl_in_reward=False
    algorithm.kl_ctrl.kl_coef=0.0
    algorithm.rollout_correction.rollout_is="$ROLLOUT_IS"
    algorithm.rollout_correction.rollout_is_threshold="$ROLLOUT_IS_THRESHOLD"
    algorithm.rollout_correction.rollout_is_batch_normalize="$ROLLOUT_IS_BATCH_NORMALIZE"
    algorithm.rollout_correction.rollout_rs="$ROLLOUT_RS"
    algorithm.rollout_correction.rollout_rs_threshold="$ROLLOUT_RS_THRESHOLD"
)

ACTOR=(
    "${GLM5_2_ACTOR[@]}"
    actor_rollout_ref.actor.optim.lr_decay_steps="$TOTAL_ROLLOUT_STEPS"
    # The trainer uses the rollout's log-probs as the old policy (the rollout may be stale).
    actor_rollout_ref.actor.use_rollout_log_probs=True
    actor_rollout_ref.actor.policy_loss.loss_mode="$LOSS_MODE"
    actor_rollout_ref.actor.loss_agg_mode="$LOSS_AGG_MODE"
    actor_rollout_ref.actor.use_kl_loss=False
    actor_rollout_ref.actor.kl_loss_coef=0.0
    actor_rollout_ref.actor.clip_ratio_low="$CLIP_RATIO_LOW"
    actor_rollout_ref.actor.clip_ratio_high="$CLIP_RATIO_HIGH"
    actor_rollout_ref.actor.clip_ratio_c=10.0
)

ROLLOUT=(
    "${GLM5_2_ROLLOUT[@]}"
    actor_rollout_ref.rollout.mode=async
    actor_rollout_ref.rollout.gpu_memory_utilization=0.7
    # Weights go from the training pool to the rollout pool through the checkpoint engine.
    actor_rollout_ref.rollout.checkpoint_engine.backend=nccl
    actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1824
    # One MTP layer in the vLLM model (dummy-loaded, then synced), weights loaded lazily.
    ++actor_rollout_ref.rollout.engine_kwargs.vllm.hf_overrides.num_nextn_predict_layers=1
    +actor_rollout_ref.rollout.engine_kwargs.vllm.safetensors_load_strategy=lazy
)

TRAINER=(
    trainer.nnodes="$NNODES_TRAIN"
    trainer.n_gpus_per_node="$NPUS_PER_NODE_TRAIN"
    "trainer.logger=[\"console\",\"tensorboard\"]"
    "${GLM5_2_TRAINER[@]}"
)

ASYNC=(
    rollout.nnodes="$NNODES_ROLLOUT"
    rollout.n_gpus_per_node="$NPUS_PER_NODE_ROLLOUT"
    rollout.total_rollout_steps="$TOTAL_ROLLOUT_STEPS"
    async_training.staleness_threshold="$STALENESS_THRESHOLD"
    async_training.trigger_parameter_sync_step="$TRIGGER_PARAMETER_SYNC_STEP"
    async_training.require_batches="$REQUIRE_BATCHES"
    async_training.partial_rollout="$PARTIAL_ROLLOUT"
)

OVERRIDES=("${HYDRA[@]}" "${RAY[@]}" "${DATA[@]}" "${MODEL[@]}" "${ALGORITHM[@]}" "${ACTOR[@]}"
           "${GLM5_2_TRANSFORMER[@]}" "${GLM5_2_REF[@]}" "${ROLLOUT[@]}" "${ASYNC[@]}" "${TRAINER[@]}")

# ---- device check (Ascend NPUs only), preflight against the installed verl and manifest.toml, launch ----
recipe_main "$@"
