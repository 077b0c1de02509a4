"""Ascend device hooks on verl 0.9.0 and 0.9.1, with the NPU test double (tests/npu_double) standing in for torch_npu.

Each case runs ``tests/scenarios/device_platform.py`` in a fresh interpreter, so verl's real plugin
discovery, platform auto-detection and ``set_expandable_segments`` run; only ``torch.npu`` is the double.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from repo import REPO
from subprocesses import last_json, run_command, run_python

SCENARIO = str(REPO / "tests" / "scenarios" / "device_platform.py")
DOUBLE = str(REPO / "tests" / "npu_double")
OURS = "verl_ascend_ext.features.device.platform.AscendExtPlatformNPU"
VERLS = "verl.plugin.platform.platform_npu.PlatformNPU"

pytestmark = pytest.mark.anyverl


def run_scenario(mode: str, env: dict[str, str] | None = None, extra_path: str = "") -> tuple[dict, str]:
    proc = run_command([sys.executable, SCENARIO], {"NPU_DOUBLE": mode, **(env or {})}, check=False,
                       pythonpath=os.pathsep.join(p for p in (DOUBLE, extra_path) if p))
    assert proc.returncode == 0, proc.stderr
    return last_json(proc.stdout), proc.stderr


def test_get_platform_is_our_subclass_and_allocator_reaches_device_module() -> None:
    out, _ = run_scenario("1")
    assert out["platform_created_at_discovery"] is False  # registration did not call get_platform()
    assert out["registered_huawei"] == OURS and out["platform"] == OURS
    assert out["is_verl_npu_subclass"] is True and out["is_npu_available"] is True
    assert out["torch_npu_imported"] is False
    assert out["allocator_calls"] == ["expandable_segments:False", "expandable_segments:True"] * 2
    assert out["errors"] == [] and out["allocator_warnings"] == []


def old_torch_npu_metadata(tmp_path: Path) -> str:
    """A directory holding only the metadata of an old torch_npu (no module): what importlib.metadata reads."""
    info = tmp_path / "torch_npu-2.1.0.post3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu\nVersion: 2.1.0.post3\n")
    return str(tmp_path)


@pytest.mark.parametrize("mode", ["fail", "missing"])
def test_failing_allocator_warns_exactly_once_and_never_raises(mode: str, tmp_path: Path) -> None:
    # "missing": torch_npu 2.1 has no _set_allocator_settings; "fail": the call raises, torch_npu metadata absent.
    out, stderr = run_scenario(mode, extra_path=old_torch_npu_metadata(tmp_path) if mode == "missing" else "")
    assert out["platform"] == OURS
    assert out["errors"] == []
    if mode == "fail":  # the double was called each time, and failed each time
        assert out["allocator_calls"] == ["expandable_segments:False", "expandable_segments:True"] * 2
    assert len(out["allocator_warnings"]) == 1
    warning = out["allocator_warnings"][0]
    assert "'expandable_segments:False'" in warning
    assert ("RuntimeError" if mode == "fail" else "AttributeError") in warning
    assert ("torch_npu not installed." if mode == "fail" else "torch_npu 2.1.0.post3.") in warning
    assert "upgrade torch_npu to 2.9.0 or later" in warning
    assert stderr.count("could not be applied through torch.npu.memory._set_allocator_settings") == 1


def test_rollout_env_is_verls_plus_every_set_gate() -> None:
    env = {"VERL_ASCEND_EXT_DISTILLATION_FIXES": "0", "VERL_VLLM_ASCEND_GLM52_PATCH": "1",
           "VERL_ASCEND_EXT_DISABLE": "padding-teacher-fields", "VLLM_ASCEND_TASK_QUEUE_ENABLE": "2"}
    out, _ = run_scenario("1", env)
    rollout = out["rollout_env_vars"]
    verls = {"NCCL_CUMEM_ENABLE": "0", "VLLM_ASCEND_AUTO_DETECT_QUANTIZATION": "0", "TASK_QUEUE_ENABLE": "2"}
    gates = {k: v for k, v in env.items() if k != "VLLM_ASCEND_TASK_QUEUE_ENABLE"}
    job = rollout.pop("VERL_ASCEND_EXT_JOB")  # the job's id, set by the scenario's process at boot: carried too
    assert job.endswith(".json"), job
    assert rollout == {**verls, **gates}  # unset gates (e.g. VERL_ASCEND_EXT_WEIGHT_SYNC_FIXES) are absent


def test_gate_off_leaves_verls_platform_in_place() -> None:
    out, stderr = run_scenario("fail", {"VERL_ASCEND_EXT_DEVICE_HOOKS": "0"})
    assert out["registered_huawei"] == VERLS and out["platform"] == VERLS
    assert out["allocator_warnings"] == []  # ours is off; verl's own warning is its usual text
    assert "please upgrade torch-npu to 2.9.0 or later" in stderr
    assert "VERL_ASCEND_EXT_DEVICE_HOOKS" not in out["rollout_env_vars"]  # verl's method: no gates added


def test_without_the_double_detection_is_unchanged() -> None:
    out, _ = run_scenario("")  # NPU_DOUBLE empty: no torch.npu, verl falls back to its CUDA platform
    assert out["registered_huawei"] == OURS
    assert out["platform"] == "verl.plugin.platform.platform_cuda.PlatformCUDA"


def test_late_activation_rebinds_main_ppo() -> None:
    # verl's discovery off: main_ppo binds verl's function first; activating the plugin afterwards must still
    # make run_ppo's name call the patched function (import hook on verl.trainer.main_ppo).
    proc = run_python("""
        import json
        import verl.trainer.constants_ppo as constants, verl.trainer.main_ppo as main_ppo
        before = main_ppo.get_ppo_ray_runtime_env
        import verl_ascend_ext
        verl_ascend_ext.activate()
        env = main_ppo.get_ppo_ray_runtime_env()["env_vars"]
        print(json.dumps({"rebound": main_ppo.get_ppo_ray_runtime_env is constants.get_ppo_ray_runtime_env
                          and main_ppo.get_ppo_ray_runtime_env is not before,
                          "gate": env.get("VERL_ASCEND_EXT_DISTILLATION_FIXES")}))
    """, {"VERL_USE_EXTERNAL_PLUGINS": "none", "VERL_ASCEND_EXT_DISTILLATION_FIXES": "0"})
    assert last_json(proc.stdout) == {"rebound": True, "gate": "0"}
