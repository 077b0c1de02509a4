"""Checkpoint feature on real verl: export check on real safetensors files, transformer config saved whole.

Export check, through verl's real MegatronCheckpointManager method.

The Megatron-Bridge object needs CUDA packages, so the scenario (tests/scenarios/checkpoint.py) stands in
for ``bridge.save_hf_weights`` with a function that writes real safetensors files (and an index) with the
``safetensors`` package; everything after it — verl's ``_save_model_as_hf_via_bridge`` wrapped by the
plugin, reading headers, the report, the error — is the real code. Files are hashed right after the
stand-in wrote them and again after the check.

Config: verl's real ``_save_transformer_config`` saves a real Megatron ``TransformerConfig`` subclass that
carries ``Qwen2_5_VLConfig``'s vision and text sub-configs (as Megatron-Bridge's VL providers do); the
written ``transformer_config.json`` is read back and compared field by field. verl 0.9.0 and 0.9.1 share
the helper that drops them, so the patch applies on both.
"""

from __future__ import annotations

import sys

import pytest
from repo import REPO
from subprocesses import last_json, run_command

SCENARIO = str(REPO / "tests" / "scenarios" / "checkpoint.py")


def run_scenario(tmp_path_factory: pytest.TempPathFactory, env: dict[str, str] | None = None) -> dict:
    work = tmp_path_factory.mktemp("ckpt")
    proc = run_command([sys.executable, SCENARIO, str(work)], env, check=False)
    assert proc.returncode == 0, proc.stderr
    return last_json(proc.stdout)


@pytest.fixture(scope="module")
def with_plugin(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_scenario(tmp_path_factory, {"VERL_ASCEND_EXT_STATUS_DIR": str(tmp_path_factory.mktemp("status"))})


@pytest.fixture(scope="module")
def without_plugin(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_scenario(tmp_path_factory, {"VERL_USE_EXTERNAL_PLUGINS": "none"})


MTP = ["model.layers.2.eh_proj.weight", "model.layers.2.enorm.weight", "model.layers.2.hnorm.weight",
       "model.layers.2.self_attn.q_proj.weight"]


@pytest.mark.anyverl
def test_patches_applied(with_plugin: dict) -> None:
    assert with_plugin["statuses"] == {"checkpoint-export-check": "applied", "checkpoint-config-whole": "applied",
                                       "checkpoint-export-check-fsdp": "applied"}  # verl.utils.checkpoint imports it
    assert with_plugin["export_wrapped"] is True


@pytest.mark.anyverl
def test_glm_mtp_layers_missing_passes(with_plugin: dict) -> None:
    case = with_plugin["cases"]["mtp_only"]
    assert case["error"] is None
    assert case["strict_passed_to_bridge"] is False  # checkpoint.strict stays verl's and reaches the bridge
    report = case["report"]
    assert report["ok"] is True and report["missing"] == [] and report["omitted"] == MTP
    assert report["mode"] == "error" and report["model_type"] == "glm_moe_dsa"
    assert case["files_untouched"] is True
    assert "huggingface.export_check.json" not in case["export_files"]  # the report goes beside the export


@pytest.mark.anyverl
def test_vanilla_mbridge_export_is_checked_as_megatron_bridges(with_plugin: dict) -> None:
    """verl's ``vanilla_mbridge=True`` save (``bridge.save_weights``): the same check, the same declared omissions."""
    missing = with_plugin["cases"]["vanilla_missing"]
    assert missing["error"].startswith("ExportCheckError") and "model.layers.1.mlp.down_proj.weight" in missing["error"]
    assert missing["report"]["missing"] == ["model.layers.1.mlp.down_proj.weight"]
    assert missing["files_untouched"] is True and missing["exercised_after"] is True
    passed = with_plugin["cases"]["vanilla_mtp_only"]
    assert passed["error"] is None and passed["report"]["ok"] is True and passed["report"]["omitted"] == MTP


@pytest.mark.anyverl
def test_a_rank_that_does_not_write_and_a_peft_adapter_are_not_checked_nor_counted(with_plugin: dict) -> None:
    """Only rank 0 writes the export: other ranks neither check nor count as exercised (``acts_when``); a PEFT
    adapter has no reference to compare with."""
    for name in ("rank_1", "peft_adapter"):  # run before any case that checks (exercised is per process)
        case = with_plugin["cases"][name]
        assert case["error"] is None and case["report"] is None and case["status_file"] is None, (name, case)
        assert case["exercised_after"] is False, name
    assert with_plugin["cases"]["mtp_only"]["exercised_after"] is True


@pytest.mark.anyverl
def test_missing_normal_layer_is_an_error_naming_it(with_plugin: dict) -> None:
    case = with_plugin["cases"]["missing_layer"]
    assert case["error"].startswith("ExportCheckError")
    assert "model.layers.0.self_attn.q_proj.weight" in case["error"]
    assert "model.layers.1.mlp.down_proj.weight" in case["error"]
    assert "model.layers.2." not in case["error"]  # declared omissions are not reported as missing
    assert case["report"]["missing"] == ["model.layers.0.self_attn.q_proj.weight",
                                         "model.layers.1.mlp.down_proj.weight"]
    assert case["files_untouched"] is True


@pytest.mark.anyverl
def test_warn_and_off_modes(with_plugin: dict) -> None:
    warn = with_plugin["cases"]["missing_layer_warn"]
    assert warn["error"] is None and warn["report"]["ok"] is False
    assert warn["report"]["missing"] == ["model.layers.1.mlp.down_proj.weight"] and warn["files_untouched"]
    off = with_plugin["cases"]["missing_layer_off"]
    assert off["error"] is None and off["report"] is None and off["files_untouched"]


@pytest.mark.anyverl
def test_extra_names_reported(with_plugin: dict) -> None:
    case = with_plugin["cases"]["extra"]
    assert case["error"] is None and case["report"]["extra"] == ["model.vision.unexpected.weight"]


@pytest.mark.anyverl
def test_reference_without_index_is_a_clear_error(with_plugin: dict) -> None:
    case = with_plugin["cases"]["no_index"]
    assert case["error"].startswith("ExportInputError")  # an ExportCheckError: the check cannot run
    assert "has no model.safetensors.index.json" in case["error"] and "VERL_ASCEND_EXT_EXPORT_CHECK" in case["error"]
    assert case["files_untouched"] is True
    assert with_plugin["cases"]["no_index_warn"]["error"] is None


@pytest.mark.anyverl
def test_shard_saved_unmerged_is_an_error_with_its_diagnosis(with_plugin: dict) -> None:
    case = with_plugin["cases"]["unmerged"]
    assert case["error"].startswith("ExportCheckError")
    assert "model.layers.0.self_attn.q_proj.weight (F32[2, 2] in the reference, F32[1, 2] exported)" in case["error"]
    assert "looks like a tensor- or expert-parallel shard saved unmerged, N=2" in case["error"]
    assert case["report"]["mismatched"][0]["why"] == ("dimension 0 is 1/2 of the reference's: looks like a tensor- "
                                                      "or expert-parallel shard saved unmerged, N=2")
    assert case["files_untouched"] is True


@pytest.mark.anyverl
def test_truncated_shard_is_an_error_naming_it(with_plugin: dict) -> None:
    case = with_plugin["cases"]["truncated"]
    assert case["error"].startswith("ExportCheckError")
    assert ("huggingface/model-00002-of-00002.safetensors is not a valid safetensors file: it is truncated"
            in case["error"])
    assert case["report"]["integrity"] and case["report"]["unreadable"] and case["report"]["missing"] == []
    assert case["files_untouched"] is True


def test_without_plugin_verl_checks_nothing(without_plugin: dict) -> None:
    assert without_plugin["export_wrapped"] is False
    assert all(case["error"] is None and case["report"] is None for case in without_plugin["cases"].values())


def test_bad_mode_is_an_error_naming_the_variable() -> None:
    from verl_ascend_ext.features.checkpoint.export_check import export_check_mode
    from verl_ascend_ext.patching.gates import GateValueError

    with pytest.raises(GateValueError, match=r"VERL_ASCEND_EXT_EXPORT_CHECK='strict'.*error, warn, off"):
        export_check_mode({"VERL_ASCEND_EXT_EXPORT_CHECK": "strict"})
    assert export_check_mode({}) == "error" and export_check_mode({"VERL_ASCEND_EXT_EXPORT_CHECK": " Warn "}) == "warn"


def test_doctor_reports_strict_and_mode() -> None:
    from verl_ascend_ext.features.checkpoint.declaration import verl_ascend_ext_doctor_findings

    findings = {f.name: f for f in verl_ascend_ext_doctor_findings(environ={"VERL_ASCEND_EXT_EXPORT_CHECK": "x"})}
    assert findings["checkpoint.strict"].status == "ok" and "default True" in findings["checkpoint.strict"].detail
    assert findings["export check"].status == "error" and findings["export check"].blocking
    ok = {f.name: f for f in verl_ascend_ext_doctor_findings(environ={"VERL_ASCEND_EXT_EXPORT_CHECK": "warn"})}
    assert ok["export check"].detail == "VERL_ASCEND_EXT_EXPORT_CHECK=warn"

@pytest.mark.anyverl
def test_round_trip_keeps_every_field(with_plugin: dict) -> None:
    config = with_plugin["config"]
    assert config["vision_config"] == config["vision_config_expected"]
    assert config["hf_text_config"] == config["hf_text_config_expected"]
    assert set(config["fields"]) - set(config["saved_keys"]) == {"unserialisable_handle"}
    assert config["mrope_section"] == [16, 24, 24] and config["freeze_modules"] == ["projector", "vision"]
    assert config["params_dtype"] == "torch.float32"
    assert config["activation_func"].endswith("gelu")


@pytest.mark.anyverl
def test_unserialisable_value_named_with_key_path(with_plugin: dict) -> None:
    assert config_warnings(with_plugin) == [
        "verl-ascend-ext: 1 value(s) of the transformer config cannot be written to JSON and were left out: "
        "unserialisable_handle (_thread.lock)"
    ]


def config_warnings(result: dict) -> list[str]:
    return result["config"]["warnings"]


def test_verl_090_alone_drops_nested_configs(without_plugin: dict) -> None:
    config = without_plugin["config"]
    assert config["vision_config"] is None and config["hf_text_config"] is None
    assert {"vision_config", "hf_text_config", "freeze_modules"} <= set(config["fields"]) - set(config["saved_keys"])
    assert config_warnings(without_plugin) == []


def test_nested_key_paths_and_cycles() -> None:
    import logging

    from verl_ascend_ext.features.checkpoint.config_json import config_to_json_safe

    loop: dict = {}
    loop["self"] = loop
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: messages.append(r.getMessage())  # type: ignore[method-assign]
    logging.getLogger("verl_ascend_ext").addHandler(handler)
    try:
        out = config_to_json_safe({"a": {"b": [1, object()]}, "loop": loop, "nan": float("nan")})
    finally:
        logging.getLogger("verl_ascend_ext").removeHandler(handler)
    assert out == {"a": {"b": [1]}, "loop": {}, "nan": "nan"}
    assert "a.b[1] (builtins.object)" in messages[0] and "loop.self (reference cycle)" in messages[0]


def _write_safetensors(path, names: list[str]) -> None:
    import torch
    from safetensors.torch import save_file

    save_file({n: torch.zeros(1) for n in names}, str(path))


def _reference(tmp_path, names: list[str]):
    import json

    ref = tmp_path / "reference"
    ref.mkdir()
    _write_safetensors(ref / "model-00001-of-00001.safetensors", names)
    (ref / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": dict.fromkeys(names, "model-00001-of-00001.safetensors")}))
    (ref / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    return ref


def test_leftover_shard_does_not_stand_in_for_a_missing_tensor(tmp_path) -> None:
    """An export with an index counts only the files its index lists (files are real safetensors)."""
    import json

    from verl_ascend_ext.features.checkpoint.export_check import ExportCheckError, check_export

    names = ["model.layers.0.w", "model.layers.1.w"]
    ref = _reference(tmp_path, names)
    export = tmp_path / "export"
    export.mkdir()
    _write_safetensors(export / "new.safetensors", names[:1])
    _write_safetensors(export / "old-leftover.safetensors", names)  # from an earlier save into the same dir
    (export / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {names[0]: "new.safetensors"}}))
    with pytest.raises(ExportCheckError, match=r"model\.layers\.1\.w"):
        check_export(export, ref, "error")


def test_warn_mode_never_stops_training_on_an_unreadable_export(tmp_path, caplog) -> None:
    from verl_ascend_ext.features.checkpoint.export_check import ExportCheckError, check_export

    ref = _reference(tmp_path, ["model.layers.0.w"])
    export = tmp_path / "export"
    export.mkdir()
    (export / "model.safetensors").write_bytes(b"\xff" * 16)  # header length far beyond the file
    before = (export / "model.safetensors").read_bytes()
    report = check_export(export, ref, "warn")
    assert report.ok is False
    assert "not a complete safetensors file" in caplog.text
    assert (export / "model.safetensors").read_bytes() == before
    with pytest.raises(ExportCheckError, match="not a complete safetensors file"):
        check_export(export, ref, "error")


@pytest.mark.anyverl
def test_checkpoint_remembers_the_driver_record_and_job_summary(with_plugin: dict) -> None:
    """At save time the checkpoint directory and the export-check report get the driver's record and the summary."""
    case = with_plugin["cases"]["mtp_only"]
    status = case["status_file"]
    assert status is not None and status["driver"]["pid"] == with_plugin["pid"]  # no Ray: the saver is the driver
    assert status["driver"]["role"] == "driver" and status["driver"]["loaded_by"] == ["verl"]
    assert status["driver"]["patches"]["checkpoint-export-check"]["status"] == "applied"
    assert status["summary"]["checkpoint-export-check"] == {"applied": 1} and status["problems"] == []
    assert case["report"]["plugin_status"]["driver"]["pid"] == with_plugin["pid"]
    assert case["report"]["plugin_status"]["summary"] == status["summary"]
    off = with_plugin["cases"]["missing_layer_off"]
    assert off["report"] is None and off["status_file"]["driver"]["pid"] == with_plugin["pid"]  # check off: still noted
