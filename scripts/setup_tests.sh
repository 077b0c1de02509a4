#!/usr/bin/env bash
# The test tier: what pytest needs beyond scripts/setup.sh (pytest stops at collection without it, naming this).
#
#   bash scripts/setup_tests.sh    # into the project venv (.venv, or VERL_ASCEND_EXT_VENV)
#
# vLLM 0.23.0 installed --no-deps with the modules its engine core imports, core.py of later vLLM releases,
# vLLM-Ascend 0.23.0 sources and the release artifacts `vet` and the contract suite read, all downloaded once
# into ${VERL_ASCEND_EXT_CACHE:-~/.cache/verl-ascend-ext} (later runs are cached no-ops). The real-engine tier
# (tests/engine) has its own venv: scripts/setup_vllm_engine.sh.
set -euo pipefail
source "$(dirname "$0")/env.sh"
[ -x "$PY" ] || ensure_venv  # scripts/setup.sh made it; a fresh checkout gets it here
"$ROOT/scripts/fetch_vllm_ascend.sh" "$PY"
"$ROOT/scripts/fetch_vllm.sh" "$PY"
"$ROOT/scripts/fetch_vet_artifacts.sh" "$PY"
