#!/usr/bin/env bash
# Main job on a fresh machine: install into .venv, then show what the plugin will do here
# (`verl-ascend doctor`) and check the GLM-5.2 recipe against the installed verl.
set -euo pipefail
source "$(dirname "$0")/env.sh"
ensure_venv
"$VENV/bin/verl-ascend" doctor
"$VENV/bin/verl-ascend" recipe check glm5_2_megatron --no-device
