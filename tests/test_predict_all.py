"""One prediction and one findings model: doctor, recipe check, vet and doctor --ray's node check all read
``patching.prediction.predict_all``, on the installed verl (0.9.0 or 0.9.1) and its real source files.

The calls are observed with a pass-through spy (the real function runs and its answer is compared with what
each consumer reports), and an invalid gate value must come out as ``Status.UNDECIDED`` everywhere.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

import verl_ascend_ext.patching.prediction as prediction
from verl_ascend_ext.patching.record import ACTIVE, DONE, NEEDS_ATTENTION, OFF, Status
from verl_ascend_ext.patching.source import find_module_file
from verl_ascend_ext.runtime.findings import ERROR, OK, Finding, Severity
from verl_ascend_ext.runtime.registry import registry
from verl_ascend_ext.tooling import doctor, vet
from verl_ascend_ext.tooling.cluster.doctor_ray import problems
from verl_ascend_ext.tooling.recipes import get_recipe
from verl_ascend_ext.tooling.recipes.check import expected_patch_findings
from verl_ascend_ext.tooling.recipes.manifest import load_manifest

CHECKPOINT_GATE = "VERL_ASCEND_EXT_CHECKPOINT_FIXES"
EXPORT_CHECK = "checkpoint-export-check"
pytestmark = pytest.mark.anyverl


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[prediction.Predictions]:
    """Every ``predict_all`` answer, whoever asked (doctor and vet import it by name, recipe check lazily)."""
    real = prediction.predict_all
    seen: list[prediction.Predictions] = []

    def spy(*args, **kwargs) -> prediction.Predictions:
        seen.append(real(*args, **kwargs))
        return seen[-1]

    for module in (prediction, doctor, vet):
        monkeypatch.setattr(module, "predict_all", spy)
    return seen


def recipe_manifest():
    manifest = load_manifest(get_recipe("glm5_2_megatron").manifest)
    assert EXPORT_CHECK in manifest.expects_patches
    return manifest


@pytest.mark.parametrize("environ", [{}, {"VERL_ASCEND_EXT_DISABLE": EXPORT_CHECK}, {CHECKPOINT_GATE: "0"}])
def test_doctor_and_recipe_check_report_what_predict_all_predicts(calls: list, environ: dict) -> None:
    report, _ = doctor.build_report(environ)
    assert len(calls) == 1
    assert [{k: v for k, v in p.items() if k != "declared_by"} for p in report["patches"]] == \
        [s.as_dict() for s in calls[0].statuses]
    assert {p["declared_by"] for p in report["patches"]} == {"verl-ascend-ext"}
    assert calls[0].statuses == prediction.predict_all(registry().records, environ).statuses  # nothing cached

    findings = expected_patch_findings(recipe_manifest(), environ)
    assert len(calls) == 3  # doctor's, the comparison above, then the recipe check's own call
    expected = calls[2].of(EXPORT_CHECK)
    (finding,) = [f for f in findings if f.subject == EXPORT_CHECK]
    assert f"predicted {expected.status}" in finding.detail
    assert finding.status is (ERROR if expected.status in OFF | NEEDS_ATTENTION else OK)
    assert (finding.status is ERROR) == bool(environ)


def test_vet_reports_what_predict_all_predicts_in_the_artifact(calls: list) -> None:
    verl_folder = find_module_file("verl").parent  # the installed verl, vetted as a package folder
    report, code = vet.vet([str(verl_folder)])
    assert code == 0 and len(calls) == 1
    predicted = calls[0]
    assert [p["status"] for p in report["patches"]] == [s.status.value for s in predicted.statuses]
    assert predicted.errors == []
    verl_ids = {r.id for r in registry().records if r.distribution == "verl"}
    # vet turns every gate on and reads versions from the artifact: the verl patches are as doctor says with all
    # gates on; the vLLM ones are not installed there (no vLLM among the artifacts)
    doctor_statuses = {p["id"]: p["status"] for p in doctor.build_report(dict.fromkeys(report["gates"], "1"))[0]
                       ["patches"]}
    for status in predicted.statuses:
        if status.id in verl_ids:
            assert status.status.value == doctor_statuses[status.id]
        else:
            assert status.status is Status.NOT_INSTALLED


def test_invalid_gate_value_is_undecided_in_doctor_recipe_check_and_doctor_ray() -> None:
    environ = {CHECKPOINT_GATE: "maybe"}
    predicted = prediction.predict_all(registry().records, environ)
    gated = [r.id for r in registry().records if r.gate.env == CHECKPOINT_GATE]
    assert EXPORT_CHECK in gated
    for patch_id in gated:
        assert predicted.of(patch_id).status is Status.UNDECIDED
    assert [s.id for s in predicted.statuses if s.status is Status.UNDECIDED] == gated
    assert list(predicted.gate_errors) == [CHECKPOINT_GATE] and "'maybe'" in predicted.errors[0]

    report, code = doctor.build_report(environ)
    assert code == 2 and report["errors"] == predicted.errors
    rows = {p["id"]: p for p in report["patches"]}
    assert {rows[i]["status"] for i in gated} == {"unknown"}
    assert f"{CHECKPOINT_GATE} has an invalid value" in doctor.format_report(report)

    # Before predict_all, recipe check crashed here (GateValueError from the gate read inside predict).
    (finding,) = [f for f in expected_patch_findings(recipe_manifest(), environ) if f.subject == EXPORT_CHECK]
    assert finding.status is ERROR and "predicted unknown" in finding.detail

    answer = {"installed": True, "report": json.loads(json.dumps(report))}  # as a Ray node sends it
    assert f"patch {EXPORT_CHECK} unknown: {CHECKPOINT_GATE} has an invalid value" in problems(answer)


def test_unknown_kill_switch_id_is_reported_once_and_switches_nothing_off() -> None:
    environ = {"VERL_ASCEND_EXT_DISABLE": f"{EXPORT_CHECK},no-such-patch"}
    predicted = prediction.predict_all(registry().records, environ)
    assert predicted.disable_error is not None and "no-such-patch" in predicted.disable_error
    assert predicted.errors == [predicted.disable_error]
    assert Status.DISABLED not in {s.status for s in predicted.statuses}
    (finding,) = expected_patch_findings(recipe_manifest(), environ)
    assert finding.status is ERROR and finding.subject == "VERL_ASCEND_EXT_DISABLE"
    report, code = doctor.build_report(environ)
    assert code == 2 and report["errors"] == predicted.errors


def test_status_groups_match_raw_strings_from_json() -> None:
    """Reports travel as JSON (Ray nodes, process records): a raw status string must be found in a group."""
    assert "refused" in NEEDS_ATTENTION and "unknown" in NEEDS_ATTENTION and "will-apply" not in NEEDS_ATTENTION
    assert {"gate-off", "disabled"} <= OFF and {"applied", "fixed-upstream", "already-applied"} <= DONE
    assert "pending" in ACTIVE and "fixed-upstream" not in ACTIVE
    assert Status("unknown") is Status.UNDECIDED and str(Status.UNDECIDED) == "unknown"


def test_one_finding_type_for_doctor_and_recipe_check() -> None:
    from verl_ascend_ext.runtime.findings import Finding as RecipeFinding

    assert RecipeFinding is Finding
    check = Finding.check("npu-platform", Severity.WARN, "why")
    assert check.as_check() == {"name": "npu-platform", "status": "warn", "detail": "why"}
    assert json.loads(json.dumps(check.as_dict())) == {"section": "checks", "subject": "npu-platform",
                                                       "status": "warn", "detail": "why", "override": None,
                                                       "source": None}
    assert not check.blocking and Finding.check("x", ERROR, "").blocking
    assert Finding("gates", "G", "error", "d").status is ERROR  # a plain string is read as its Severity
    with pytest.raises(ValueError, match="'G': status 'bad' is not one of 'ok', 'info', 'warn', 'error'"):
        Finding("gates", "G", "bad", "d")
    with pytest.raises(dataclasses.FrozenInstanceError):
        check.status = ERROR  # type: ignore[misc]


def test_doctor_rejects_a_hook_finding_that_is_not_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    from verl_ascend_ext.runtime.hookspecs import hookimpl

    class OldStyle:
        @hookimpl
        def verl_ascend_ext_doctor_findings(self, environ):
            return [{"name": "x", "status": "ok", "detail": ""}]

    pm = doctor.plugin_manager()
    pm.register(OldStyle(), name="old-style-test-feature")
    try:
        with pytest.raises(TypeError, match=r"return verl_ascend_ext\.runtime\.findings\.Finding objects"):
            doctor.feature_findings({})
    finally:
        pm.unregister(name="old-style-test-feature")
    assert all(isinstance(f, Finding) for f in doctor.feature_findings({}))


def test_hook_findings_reach_doctor_json_as_name_status_detail() -> None:
    report, _ = doctor.build_report({"VERL_ASCEND_EXT_EXPORT_CHECK": "x"})
    checks = {f["name"]: f for f in report["findings"]}
    assert all(set(f) == {"name", "status", "detail"} for f in report["findings"])
    assert checks["export check"]["status"] == "error" and report["exit_code"] == 1
    assert checks["npu-platform"]["status"] in ("ok", "warn")
