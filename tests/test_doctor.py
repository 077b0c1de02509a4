"""`verl-ascend doctor`: static prediction without importing torch or verl, JSON shape, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from repo import REPO
from subprocesses import last_json, run_command, run_python

NO_HEAVY_IMPORTS = """
import json, sys
from verl_ascend_ext.tooling.cli import main
code = main(["doctor", "--json"])
heavy = sorted(m for m in ("torch", "verl", "vllm", "vllm_ascend", "torch_npu", "megatron", "ray", "transformers")
               if m in sys.modules)
print(json.dumps({"code": code, "heavy": heavy}))
"""


def doctor(env: dict[str, str] | None = None, *args: str) -> subprocess.CompletedProcess[str]:
    return run_command([sys.executable, "-m", "verl_ascend_ext.tooling.cli", "doctor", *args], env, check=False,
                       timeout=120, cwd=REPO)


def test_doctor_imports_neither_torch_nor_verl() -> None:
    out = last_json(run_python(NO_HEAVY_IMPORTS).stdout)
    assert out["heavy"] == []


def test_json_shape_and_predictions_on_verl_090() -> None:
    proc = doctor({}, "--json")
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stdout
    assert {"versions", "plugin", "patches", "gates"} <= set(report)
    assert report["versions"]["verl"] == "0.9.0"
    assert report["versions"]["torch_npu"] == "not installed"
    assert set(report["versions"]) >= {"verl", "vllm", "vllm-ascend", "torch", "torch_npu", "megatron-core",
                                       "transformers"}
    assert report["plugin"]["verl_will_load"] is True
    patches = {p["id"]: p for p in report["patches"]}
    for p in patches.values():
        assert {"id", "target", "status", "detail"} <= set(p)
    assert patches["distill-fsdp2-topk"]["status"] == "will-apply"
    assert patches["padding-teacher-fields"]["status"] == "will-apply"


@pytest.mark.verl091
def test_predicts_fixed_upstream_on_verl_091() -> None:
    report = json.loads(doctor({}, "--json").stdout)
    patches = {p["id"]: p["status"] for p in report["patches"]}
    assert patches["distill-fsdp2-topk"] == "fixed-upstream"
    assert patches["padding-teacher-fields"] == "fixed-upstream"


def test_prediction_agrees_with_the_real_process() -> None:
    """Whatever verl is installed, doctor's prediction equals what a real `import verl` process ends with."""
    predicted = {p["id"]: p["status"] for p in json.loads(doctor({}, "--json").stdout)["patches"]
                 if p["id"] in ("distill-fsdp2-topk", "padding-teacher-fields")}
    live = last_json(run_python("""
        import json, verl, verl_ascend_ext
        import verl.trainer.distillation.losses, verl.trainer.ppo.padding_utils
        print(json.dumps({k: v.status.value for k, v in verl_ascend_ext.patch_statuses().items()}))
    """).stdout)
    assert set(predicted) == {"distill-fsdp2-topk", "padding-teacher-fields"}
    expected = {k: ("applied" if v == "will-apply" else v) for k, v in predicted.items()}
    assert {k: live[k] for k in expected} == expected


def test_plugin_switched_off_in_verl_is_exit_1() -> None:
    proc = doctor({"VERL_USE_EXTERNAL_PLUGINS": "none"})
    assert proc.returncode == 1
    assert "VERL_USE_EXTERNAL_PLUGINS='none' excludes this plugin" in proc.stdout


def test_plugin_allowlist_naming_it_is_fine() -> None:
    report = json.loads(doctor({"VERL_USE_EXTERNAL_PLUGINS": "other,ascend_ext"}, "--json").stdout)
    assert report["plugin"]["verl_will_load"] is True


def test_bad_gate_value_is_exit_2_naming_the_variable() -> None:
    proc = doctor({"VERL_ASCEND_EXT_DISTILLATION_FIXES": "perhaps"})
    assert proc.returncode == 2
    assert "VERL_ASCEND_EXT_DISTILLATION_FIXES='perhaps'" in proc.stdout


def test_gate_off_and_disabled_are_reported() -> None:
    report = json.loads(doctor({"VERL_ASCEND_EXT_DISTILLATION_FIXES": "off",
                                "VERL_ASCEND_EXT_DISABLE": "padding-teacher-fields"}, "--json").stdout)
    patches = {p["id"]: p["status"] for p in report["patches"]}
    assert patches["padding-teacher-fields"] == "disabled"
    assert patches["distill-fsdp2-topk"] == "gate-off"


def test_human_output_is_a_table() -> None:
    proc = doctor()
    lines = proc.stdout.splitlines()
    assert "Patches (predicted for a process started with this environment)" in lines
    header = lines[lines.index("Patches (predicted for a process started with this environment)") + 1]
    assert header.split() == ["id", "status", "target", "declared", "by"]
