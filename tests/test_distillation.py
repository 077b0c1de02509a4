"""The distillation patches on real verl: applied on 0.9.0 (verl's failures reproduced without them), off on 0.9.1."""

from __future__ import annotations

import sys

import pytest
from repo import REPO
from subprocesses import last_json, run_command

SCENARIO = str(REPO / "tests" / "scenarios" / "distillation.py")
DISTILLATION_IDS = ("distill-fsdp2-topk", "padding-teacher-fields")


def run_scenario(env: dict[str, str] | None = None) -> dict:
    proc = run_command([sys.executable, SCENARIO], env, check=False)
    assert proc.returncode == 0, proc.stderr
    out = last_json(proc.stdout)
    out["statuses"] = {k: v for k, v in out["statuses"].items() if k in DISTILLATION_IDS}
    return out


def test_verl_090_with_plugin_both_fixes_applied() -> None:
    out = run_scenario()
    assert out["plugin_loaded"] is True
    assert out["statuses"] == {"distill-fsdp2-topk": "applied", "padding-teacher-fields": "applied"}
    assert out["topk_wrapped"] and out["padding_wrapped"]
    assert out["fsdp2_equals_fsdp"] is True  # bitwise equal outputs of verl's own FSDP loss code
    pad = out["padding"]
    assert pad["teacher_ids_shape"] == [pad["seq_len"], 4]
    assert pad["teacher_logprobs_shape"] == [pad["seq_len"], 4]
    assert pad["teacher_ids_dtype"] == "torch.int32" and pad["teacher_logprobs_dtype"] == "torch.bfloat16"
    assert pad["teacher_ids_all_eos"] and pad["teacher_logprobs_all_zero"]
    assert pad["teacher_offsets_match_tokens"] is True


def test_verl_090_without_plugin_reproduces_the_failures() -> None:
    out = run_scenario({"VERL_USE_EXTERNAL_PLUGINS": "none"})
    assert out["plugin_loaded"] is False
    assert out["fsdp2_equals_fsdp"].startswith("NotImplementedError")
    pad = out["padding"]
    assert pad["teacher_ids_shape"][0] != pad["seq_len"]
    assert pad["teacher_offsets_match_tokens"] is False


def test_gate_off_leaves_verl_untouched() -> None:
    out = run_scenario({"VERL_ASCEND_EXT_DISTILLATION_FIXES": "0"})
    assert out["statuses"] == {"distill-fsdp2-topk": "gate-off", "padding-teacher-fields": "gate-off"}
    assert not out["topk_wrapped"] and not out["padding_wrapped"]
    assert out["fsdp2_equals_fsdp"].startswith("NotImplementedError")


@pytest.mark.parametrize("value", ["distill-fsdp2-topk", "*"])
def test_kill_switch(value: str) -> None:
    out = run_scenario({"VERL_ASCEND_EXT_DISABLE": value})
    assert out["statuses"]["distill-fsdp2-topk"] == "disabled"
    assert not out["topk_wrapped"]
    assert out["statuses"]["padding-teacher-fields"] == ("disabled" if value == "*" else "applied")


@pytest.mark.verl091
def test_verl_091_fixed_upstream_nothing_wrapped() -> None:
    out = run_scenario()
    assert out["plugin_loaded"] is True
    assert out["statuses"] == {"distill-fsdp2-topk": "fixed-upstream", "padding-teacher-fields": "fixed-upstream"}
    assert not out["topk_wrapped"] and not out["padding_wrapped"]
    assert out["fsdp2_equals_fsdp"] is True
    pad = out["padding"]
    assert pad["teacher_ids_shape"] == [pad["seq_len"], 4] and pad["teacher_offsets_match_tokens"]
