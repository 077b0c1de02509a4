"""The boot manifest: current, what the boot reads when only this package declares features, and a stale one stops
the first import of a target instead of patching from wrong data.

Real processes: ``import verl`` (verl's own plugin discovery) boots the plugin as in a job.
"""

from __future__ import annotations

import json

import pytest
from subprocesses import last_json, run_python

from verl_ascend_ext.runtime import boot_manifest, boot_plan
from verl_ascend_ext.runtime.registry import registry
from verl_ascend_ext.tooling import boot_manifest as generator
from verl_ascend_ext.tooling.cli import main as cli

BOOTED = """
import json, sys, verl
from verl_ascend_ext.runtime import boot_plan
from verl_ascend_ext import patch_statuses
print(json.dumps({"manifest": boot_plan.booted_from_manifest(),
                  "loaded": sorted(m for m in sys.modules if m.startswith(("pluggy", "verl_ascend_ext.features"))),
                  "statuses": {k: v.status.value for k, v in patch_statuses().items()}}))
"""


def test_the_committed_manifest_is_the_generated_one() -> None:
    assert boot_plan.stale(registry()) == []
    assert generator.path().read_text(encoding="utf-8") == generator.render()
    assert cli(["boot-manifest", "--check"]) == 0


def test_the_manifest_holds_every_record_gate_setting_and_hook_of_the_registry() -> None:
    reg = registry()
    assert [r[0] for r in boot_manifest.RECORDS] == [r.id for r in reg.records]
    assert {g[0] for g in boot_manifest.GATES} == {g.env for g in reg.gates}
    assert [s[0] for s in boot_manifest.SETTINGS] == [s.env for s in reg.settings]
    assert [h[0] for h in boot_manifest.IMPORT_HOOKS] == [m for m, _ in reg.import_hooks]


def test_verls_start_up_boots_from_the_manifest_without_pluggy_or_feature_declarations() -> None:
    out = last_json(run_python(BOOTED, {"VERL_VLLM_ASCEND_GLM52_PATCH": "1"}).stdout)
    assert out["manifest"] is True
    # the platform hook runs at boot (verl imported its module first): its light modules only
    assert not [m for m in out["loaded"] if m.startswith("pluggy") or m.endswith(".declaration")], out["loaded"]
    assert out["statuses"]["glm52-vllm-wake-up-resume-when-awake"] == "pending"
    assert out["statuses"]["weight-sync-kv-barrier"] == "pending"
    gate_off = last_json(run_python(BOOTED, {"VERL_VLLM_ASCEND_GLM52_PATCH": "0"}).stdout)["statuses"]
    assert {k: v for k, v in gate_off.items() if k.startswith("glm52-")} == \
        {k: "gate-off" for k in out["statuses"] if k.startswith("glm52-")}
    assert {k: v for k, v in gate_off.items() if not k.startswith("glm52-")} == \
        {k: v for k, v in out["statuses"].items() if not k.startswith("glm52-")}


def test_a_bad_setting_value_stops_the_boot_from_the_manifest_naming_it() -> None:
    proc = run_python("import verl", {"VERL_ASCEND_EXT_WEIGHT_SYNC_BARRIER_TIMEOUT": "-3"}, check=False)
    assert proc.returncode != 0
    assert "VERL_ASCEND_EXT_WEIGHT_SYNC_BARRIER_TIMEOUT='-3' is not a number of seconds" in proc.stderr


STALE = """
import json
from verl_ascend_ext.runtime import boot_manifest
# as if a declaration had been edited after the manifest was generated: a record observed differently
boot_manifest.RECORDS = tuple((i, t, g, "eager" if i == "weight-sync-light-empty-cache" else o)
                              for i, t, g, o in boot_manifest.RECORDS)
import verl
from verl_ascend_ext import patch_statuses
try:
    import verl.utils.memory_utils
    raised = None
except Exception as err:
    raised = f"{type(err).__name__}: {err}"
status = patch_statuses()["weight-sync-light-empty-cache"]
print(json.dumps({"raised": raised, "status": status.status.value, "detail": status.detail}))
"""


def test_a_stale_manifest_stops_the_first_import_of_a_target_naming_the_fix() -> None:
    out = last_json(run_python(STALE).stdout)
    assert out["raised"] is not None and out["raised"].startswith("FeatureDeclarationError")
    for text in ("boot_manifest.py", "RECORDS", "verl-ascend boot-manifest --write"):
        assert text in out["raised"], out
    assert out["status"] == "refused" and "FeatureDeclarationError" in out["detail"]


def test_only_module_level_functions_can_be_named_in_the_manifest() -> None:
    assert boot_plan.import_path(json.dumps) == "json:dumps"
    with pytest.raises(ValueError, match="make it a module-level function"):
        boot_plan.import_path(lambda module: None)


def test_doctor_names_a_stale_manifest(monkeypatch: pytest.MonkeyPatch) -> None:
    from verl_ascend_ext.tooling.doctor import stale_boot_manifest

    assert stale_boot_manifest() == []
    monkeypatch.setattr(boot_manifest, "GATES", boot_manifest.GATES[1:])
    (problem,) = stale_boot_manifest()
    assert "boot_manifest.py is stale (GATES:" in problem and "verl-ascend boot-manifest --write" in problem
