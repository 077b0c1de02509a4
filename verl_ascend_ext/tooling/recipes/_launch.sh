# shellcheck shell=bash
# The launch steps every recipe's run.sh shares; sourced (not run) by them, from beside their folder:
#   source "$(dirname "${BASH_SOURCE[0]}")/../_launch.sh"
# so it is found the same from the wheel, a non-editable install and a checkout.
#
# A run.sh sets RECIPE, ENTRY (the module it launches), CONFIG_NAME, OVERRIDES (its Hydra overrides) and,
# where it needs them, LAUNCH_ENV (VAR=value the command carries), CHECK_ARGS (more arguments of the
# preflight) and RECIPE_NPU_ONLY=1, then calls `recipe_main "$@"`, which runs, in order (the preflight runs
# `verl-ascend selftest` on an NPU node; VERL_ASCEND_RECIPE_SELFTEST=0 skips it, and its report says so):
#   recipe_emit_overrides                 VERL_ASCEND_RECIPE_EMIT=overrides: print them and exit 0
#   recipe_device_check_on / recipe_require_npu        VERL_ASCEND_RECIPE_DEVICE_CHECK, the NPU probe
#   recipe_launch "$@"                    preflight with CHECK_ARGS (--script "$SCRIPT_PATH" first), then
#                                         run (or print: DRY_RUN=1) the command with LAUNCH_ENV

PYTHON=${PYTHON:-python3}
VERL_ASCEND=${VERL_ASCEND:-verl-ascend}
MAIN_PPO=verl.trainer.main_ppo
# The run.sh being run: the outermost file bash reads (also when a shared file sources this one).
SCRIPT_PATH=${BASH_SOURCE[-1]}
LAUNCH_ENV=()
CHECK_ARGS=()
RECIPE_NPU_ONLY=0

# Read by `verl-ascend recipe check` (verl_ascend_ext/tooling/recipes/compose.py: script_overrides): the config
# name, qualified "<entry module>:<config name>" when the entry is not verl's main_ppo (the checker
# composes against the entry's config directory), then the overrides, NUL-separated.
recipe_emit_overrides() {
    if [ "${VERL_ASCEND_RECIPE_EMIT:-}" = overrides ]; then
        if [ "$ENTRY" = "$MAIN_PPO" ]; then
            printf '%s\0' "$CONFIG_NAME" "${OVERRIDES[@]}"
        else
            printf '%s\0' "$ENTRY:$CONFIG_NAME" "${OVERRIDES[@]}"
        fi
        exit 0
    fi
}

# Succeeds when VERL_ASCEND_RECIPE_DEVICE_CHECK is on (the default), fails when off, stops (exit 2) otherwise.
recipe_device_check_on() {
    case "${VERL_ASCEND_RECIPE_DEVICE_CHECK:-1}" in
        1 | true | yes | on) return 0 ;;
        0 | false | no | off) return 1 ;;
        *)
            echo "error: VERL_ASCEND_RECIPE_DEVICE_CHECK='${VERL_ASCEND_RECIPE_DEVICE_CHECK}' is not 1 or 0." >&2
            exit 2
            ;;
    esac
}

# Stops (exit 3) unless torch_npu, imported with $PYTHON, sees at least one NPU.
recipe_require_npu() {
    if ! "$PYTHON" -c 'import sys, torch, torch_npu; sys.exit(0 if torch.npu.device_count() > 0 else 1)' \
        >/dev/null 2>&1; then
        echo "error: $RECIPE is for Ascend NPUs only, and no NPU is available on $(hostname)" \
            "(torch_npu cannot be imported with '$PYTHON' or it sees no device)." >&2
        echo "       Run it on an Ascend training node. To only dry-run it here, set" \
            "VERL_ASCEND_RECIPE_DEVICE_CHECK=0 DRY_RUN=1." >&2
        exit 3
    fi
}

# "$@": the user's extra Hydra overrides. Preflight: `verl-ascend recipe check` composes the overrides
# against the installed verl and compares the installed packages with manifest.toml (it exits non-zero,
# stopping the script, on a blocking finding). Then the launch, through `env` so that the command
# DRY_RUN=1 prints carries what the script exports and is the whole launch.
recipe_launch() {
    "$VERL_ASCEND" recipe check "$RECIPE" "${CHECK_ARGS[@]}" -- "$@" >&2
    local cmd=(env "${LAUNCH_ENV[@]}" "$PYTHON" -m "$ENTRY" --config-name="$CONFIG_NAME" "${OVERRIDES[@]}" "$@")
    if [ "${DRY_RUN:-0}" = 1 ]; then
        printf '%q ' "${cmd[@]}"
        printf '\n'
        exit 0
    fi
    exec "${cmd[@]}"
}

# The steps above in order; "$@": the user's extra Hydra overrides. With the device check on, a recipe for
# NPUs only (RECIPE_NPU_ONLY=1) probes for one here; the others leave the device to the preflight.
recipe_main() {
    recipe_emit_overrides
    CHECK_ARGS=(--script "$SCRIPT_PATH" "${CHECK_ARGS[@]}")
    case "${VERL_ASCEND_RECIPE_SELFTEST:-1}" in
        1 | true | yes | on) ;;
        0 | false | no | off) CHECK_ARGS+=(--skip-selftest) ;;
        *)
            echo "error: VERL_ASCEND_RECIPE_SELFTEST='${VERL_ASCEND_RECIPE_SELFTEST}' is not 1 or 0." >&2
            exit 2
            ;;
    esac
    if recipe_device_check_on; then
        if [ "$RECIPE_NPU_ONLY" = 1 ]; then
            recipe_require_npu
        fi
    else
        CHECK_ARGS+=(--no-device)
    fi
    recipe_launch "$@"
}
