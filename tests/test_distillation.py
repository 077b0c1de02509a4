"""The distillation patches on real verl: applied on 0.9.0 (verl's failures reproduced without them), off on 0.9.1;
the all-padding micro-batch fix on both (no release has it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from repo import REPO
from subprocesses import last_json, run_command

from verl_ascend_ext.features.distillation.declaration import EMPTY_MICRO_BATCH, GATE
from verl_ascend_ext.patching import engine
from verl_ascend_ext.patching.record import Status

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


# ---- an all-padding micro-batch (distill-empty-micro-batch; no verl release guards it) ------------------------

EMPTY_SCENARIO = str(REPO / "tests" / "scenarios" / "distillation_empty_micro_batch.py")
MEAN_METRICS = {"distillation/abs_loss", "actor/ppo_kl"}  # Metric MEANs: no value leaves a mean as it is


def run_empty(env: dict[str, str] | None = None) -> dict:
    proc = run_command([sys.executable, EMPTY_SCENARIO], env, check=False)
    assert proc.returncode == 0, proc.stderr
    return last_json(proc.stdout)


@pytest.mark.anyverl
def test_an_all_padding_micro_batch_adds_exactly_zero_to_loss_and_gradient() -> None:
    """verl's real loss over 2 real micro-batches + 1 padding one vs the 2 alone (the reference): every loss mode,
    every aggregation mode, the policy-gradient path too."""
    out = run_empty()
    assert out["status"] == "applied"
    assert out["exercised_on_real_micro_batches"] is False  # "exercised" means it acted: real batches need nothing
    assert out["exercised"] is True
    assert len(out["cases"]) == 27, sorted(out["cases"])
    for name, case in out["cases"].items():
        assert "error" not in case, (name, case)
        pad = case["pad"]
        assert pad["loss"] == 0.0 and pad["requires_grad"], (name, pad)  # zero, graph intact (backward ran)
        assert pad["grad_added_is_zero"] and pad["grad_finite"], (name, pad)
        assert case["loss_equal"] and case["grad_equal"], (name, case)  # bitwise the real samples' alone
        assert case["metric_keys_equal"] and case["metrics_finite"], (name, case)
        # min / max / sum metrics and plain means equal the real samples'; a Metric MEAN gets verl's padding 0
        assert set(case["metrics_differ"]) <= MEAN_METRICS, (name, case["metrics_differ"])
    assert out["cases"]["forward_kl_topk/token-mean"]["metrics_differ"] == []


@pytest.mark.anyverl
@pytest.mark.parametrize("env", [{"VERL_USE_EXTERNAL_PLUGINS": "none"}, {"VERL_ASCEND_EXT_DISTILLATION_FIXES": "0"}],
                         ids=["no-plugin", "gate-off"])
def test_without_the_fix_verl_crashes_on_an_all_padding_micro_batch(env: dict[str, str]) -> None:
    out = run_empty(env)
    assert out["status"] in (None, "gate-off")
    errors = {case.get("error", "").split(":")[0] for case in out["cases"].values()}
    assert errors == {"RuntimeError"}, errors  # min() over no valid token, in every mode
    assert "numel() == 0" in out["cases"]["forward_kl_topk/token-mean"]["error"]


@pytest.mark.anyverl
def test_the_diff_applies_to_the_release_and_is_recognised_as_the_fix(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """patches/verl/0001: applies to the installed release's file (0.9.0, then 0.9.1), which the record then
    reports as fixed; the released file itself is code to fix."""
    module = "verl.trainer.distillation.losses"
    released = engine.find_module_file(module)
    assert "distill-empty-micro-batch" in (REPO / "patches" / "verl" / "0001-distill-empty-micro-batch.md").read_text()
    copy = tmp_path / "verl" / "trainer" / "distillation" / "losses.py"
    copy.parent.mkdir(parents=True)
    shutil.copyfile(released, copy)
    subprocess.run(["patch", "-p1", "-s", "-d", str(tmp_path), "-i",
                    str(REPO / "patches" / "verl" / "0001-distill-empty-micro-batch.diff")], check=True)

    def predict_on(path: Path) -> engine.PatchStatus:
        monkeypatch.setattr(engine, "find_module_file", lambda name: path if name == module else real(name))
        return engine.predict(EMPTY_MICRO_BATCH, frozenset(), {GATE.env: "1"})

    real = engine.find_module_file
    assert predict_on(released).status is Status.WILL_APPLY
    assert predict_on(copy).status is Status.FIXED_UPSTREAM
