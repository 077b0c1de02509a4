"""`verl-ascend recipe check`: the CANN toolkit and NNAL pinned in a recipe's ``[cann]`` table, on NPU nodes.

Installed versions come from fake Ascend trees (``ascend_trees``, files only, selected by the variables
CANN's ``set_env.sh`` exports), read exactly as the doctor reads them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ascend_trees import ARCH, full_node

from verl_ascend_ext.runtime.findings import ERROR, NOT_CHECKED, OK, WARN
from verl_ascend_ext.tooling.recipes import get_recipe
from verl_ascend_ext.tooling.recipes.cann import cann_findings, load_cann_pin
from verl_ascend_ext.tooling.recipes.manifest import ManifestError

pytestmark = pytest.mark.anyverl
RECIPES = ("glm5_2_megatron", "qwen3_5_35b_megatron")


def statuses(manifest: Path, env: dict[str, str], device: str = "npu", no_device: bool = False) -> dict[str, tuple]:
    return {f.subject: (f.status, f.detail) for f in cann_findings(manifest, device, no_device, env)}


@pytest.mark.parametrize("name", RECIPES)
def test_recipes_pin_the_vllm_ascend_0_23_stack(name: str) -> None:
    pin = load_cann_pin(get_recipe(name).manifest)
    assert (pin.toolkit, pin.nnal) == ("9.1.0", "9.1.0")
    assert "vllm-ascend releases/v0.23.0" in pin.source and "installation.md" in pin.source


def test_matching_stack_passes_and_other_versions_block(tmp_path: Path) -> None:
    manifest = get_recipe("glm5_2_megatron").manifest
    good = statuses(manifest, full_node(tmp_path / "good"))
    assert good["CANN toolkit"][0] == OK and good["NNAL/ATB"][0] == OK
    assert f"{ARCH}-linux/ascend_toolkit_install.info" in good["CANN toolkit"][1]

    old = statuses(manifest, full_node(tmp_path / "old", cann="8.5.0"))
    assert old["CANN toolkit"][0] == ERROR and "8.5.0" in old["CANN toolkit"][1] and "is not 9.1.0" in old[
        "CANN toolkit"][1]
    assert old["NNAL/ATB"][0] == OK

    none = statuses(manifest, {"VERL_ASCEND_EXT_TEST_SYSROOT": str(tmp_path / "empty")})
    assert none["CANN toolkit"][0] == ERROR and "no CANN toolkit found" in none["CANN toolkit"][1]
    assert none["NNAL/ATB"][0] == ERROR


def test_unreadable_version_warns_and_login_nodes_and_gpus_are_not_checked(tmp_path: Path) -> None:
    manifest = get_recipe("qwen3_5_35b_megatron").manifest
    env = full_node(tmp_path / "n")
    (Path(env["ASCEND_TOOLKIT_HOME"]) / f"{ARCH}-linux" / "ascend_toolkit_install.info").write_bytes(b"\x00\x01")
    garbled = statuses(manifest, env)
    assert garbled["CANN toolkit"][0] == WARN and "unknown (" in garbled["CANN toolkit"][1]
    login = statuses(manifest, env, no_device=True)
    assert login["NNAL/ATB"][0] == NOT_CHECKED and "9.1.0 here" in login["NNAL/ATB"][1]
    assert statuses(manifest, env, device="gpu") == {}


def test_run_check_reports_the_cann_section(tmp_path: Path) -> None:
    from verl_ascend_ext.tooling.recipes.check import run_check

    env = {**full_node(tmp_path / "n", nnal_version="8.5.0"), "VERL_VLLM_ASCEND_GLM52_PATCH": "1"}
    report, code = run_check("glm5_2_megatron", no_device=False, device="npu", environ=env, validate=False)
    cann = {f["subject"]: f["status"] for f in report["findings"] if f["section"] == "cann"}
    assert cann == {"CANN toolkit": OK, "NNAL/ATB": ERROR}
    assert code == 1


def test_bad_cann_table_is_a_clear_error(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.toml"
    manifest.write_text('[recipe]\nname = "x"\ndevices = ["npu"]\n\n[cann]\ntoolkit = "9.1.0"\ndriver = "25"\n'
                        'source = "here"\n')
    with pytest.raises(ManifestError, match=r"manifest.toml: \[cann\] has unknown field\(s\) \['driver'\]"):
        load_cann_pin(manifest)
    manifest.write_text('[recipe]\nname = "x"\ndevices = ["npu"]\n\n[cann]\ntoolkit = 9.1\nsource = "here"\n')
    with pytest.raises(ManifestError, match=r"toolkit must be a version string"):
        load_cann_pin(manifest)
    manifest.write_text('[recipe]\nname = "x"\ndevices = ["npu"]\n\n[cann]\ntoolkit = "9.1.0"\n')
    with pytest.raises(ManifestError, match="needs a 'source'"):
        load_cann_pin(manifest)
