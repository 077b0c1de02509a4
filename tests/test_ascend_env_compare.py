"""`doctor --ray`'s comparison of the Ascend environment and of gate spellings, without a cluster.

Each "node" answer is the real inventory (``node_inventory.plugin_view``) and doctor report (``build_report``) of an
environment built from fake Ascend trees (``ascend_trees``), shaped as ``probe.node_report`` returns it; ``compare`` and
``format_report`` are the functions the CLI runs on the answers Ray brings back. The same path through
a real multi-node Ray cluster is tested in ``test_ray_ascend_env.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ascend_trees import full_node, shadow_install

from verl_ascend_ext.features.device.node_differences import HEAD_RESOURCE
from verl_ascend_ext.features.device.node_inventory import plugin_view, versions
from verl_ascend_ext.tooling.cluster.doctor_ray import compare, format_report
from verl_ascend_ext.tooling.doctor import build_report

pytestmark = pytest.mark.anyverl
GLM_GATE = "VERL_VLLM_ASCEND_GLM52_PATCH"


def answer(environ: dict[str, str]) -> dict:
    """Shaped as ``probe.node_report`` returns it: the inventory of ``environ`` and its doctor report."""
    report, code = build_report(environ)
    return {"hostname": "test", "pid": 0, "python": "", "plugin_version": "0.1.0", "installed": True,
            "versions": versions(), "environ": {}, "plugin": plugin_view(environ), "report": report, "exit_code": code}


def nodes(count: int) -> list[dict]:
    return [{"NodeID": f"{i:02d}" + "ab" * 27, "NodeManagerAddress": f"10.0.0.{i + 1}",
             "Resources": {HEAD_RESOURCE: 1.0} if i == 0 else {}} for i in range(count)]


def test_cann_nnal_driver_firmware_differences_change_behaviour_and_name_the_node(tmp_path: Path) -> None:
    same = full_node(tmp_path / "a")
    other = full_node(tmp_path / "c", cann="8.5.0", nnal_version="8.5.0", driver="25.3.rc1", firmware="7.7.0.1.231")
    other["HCCL_IF_IP"] = "10.0.0.3"  # node-specific by nature: informational
    ns = nodes(3)
    report = compare(ns, [answer(same), answer(full_node(tmp_path / "b")), answer(other)], "test:6379")
    diffs = {d["key"]: d for d in report["differences"]}
    odd = ns[2]["NodeID"]
    for key, ref, value in (("CANN toolkit", "9.1.0", "8.5.0"), ("NNAL/ATB", "9.1.0", "8.5.0"),
                            ("driver", "25.5.0", "25.3.rc1"), ("firmware", "7.8.0.2.212", "7.7.0.1.231")):
        assert diffs[key]["behaviour_changing"] is True and diffs[key]["note"] is None, key
        assert diffs[key]["reference"] == ref and diffs[key]["differing"] == [odd]
        assert diffs[key]["values"][odd] == value
    assert diffs["variable HCCL_IF_IP"]["behaviour_changing"] is False
    assert diffs["variable HCCL_IF_IP"]["note"] == "informational"
    assert diffs["CANN toolkit home"]["note"] == "informational"  # other paths, shown but not a failure by itself
    assert "check ascend sysroot" not in diffs  # the same marker everywhere; never a behaviour change anyway
    assert report["exit_code"] == 1
    text = format_report(report)
    row = next(line for line in text.splitlines() if line.startswith("CANN toolkit "))
    assert "9.1.0" in row and f"{odd[:8]} (10.0.0.3): 8.5.0" in row
    assert "variable HCCL_IF_IP [informational]" in text and "PROBLEMS FOUND (exit 1)" in text


def test_equal_ascend_environments_agree(tmp_path: Path) -> None:
    report = compare(nodes(2), [answer(full_node(tmp_path / "a")), answer(full_node(tmp_path / "b"))], "t:1")
    assert [d["key"] for d in report["differences"] if d["behaviour_changing"]] == []
    assert report["exit_code"] == 0


def test_a_missing_toolkit_on_one_node_is_a_difference(tmp_path: Path) -> None:
    bare = {"VERL_ASCEND_EXT_TEST_SYSROOT": str(tmp_path / "empty")}
    ns = nodes(2)
    report = compare(ns, [answer(full_node(tmp_path / "a")), answer(bare)], "t:1")
    diffs = {d["key"]: d for d in report["differences"]}
    assert diffs["CANN toolkit"]["values"] == {ns[0]["NodeID"]: "9.1.0", ns[1]["NodeID"]: "not installed"}
    assert diffs["driver"]["behaviour_changing"] and report["exit_code"] == 1


def test_raw_gate_row_is_same_meaning_only_when_parsed_values_agree(tmp_path: Path) -> None:
    # What a real two-node cluster showed: head without the gate, a worker raylet started with it on.
    bare = {"VERL_ASCEND_EXT_TEST_SYSROOT": str(tmp_path)}
    ns = nodes(2)
    report = compare(ns, [answer(bare), answer({**bare, GLM_GATE: "1"})], "t:1")
    diffs = {d["key"]: d for d in report["differences"]}
    assert diffs[f"gate {GLM_GATE}"]["values"] == {ns[0]["NodeID"]: "off", ns[1]["NodeID"]: "on"}
    raw = diffs[f"gate {GLM_GATE} (raw)"]
    assert raw["values"] == {ns[0]["NodeID"]: "unset", ns[1]["NodeID"]: "1"} and raw["note"] is None
    text = format_report(report)
    assert "[same meaning]" not in text
    assert f"gate {GLM_GATE} (raw) " in text and report["exit_code"] == 1

    report = compare(ns, [answer({**bare, GLM_GATE: "1"}), answer({**bare, GLM_GATE: " True "})], "t:1")
    diffs = {d["key"]: d for d in report["differences"]}
    assert f"gate {GLM_GATE}" not in diffs
    assert diffs[f"gate {GLM_GATE} (raw)"]["note"] == "same meaning"
    assert f"gate {GLM_GATE} (raw) [same meaning]" in format_report(report)
    assert report["exit_code"] == 0


def test_duplicate_install_on_one_node_changes_behaviour(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bare = {"VERL_ASCEND_EXT_TEST_SYSROOT": str(tmp_path)}
    clean = answer(bare)
    monkeypatch.syspath_prepend(str(shadow_install(tmp_path, "0.0.9", with_code=False)))
    dup = answer(bare)  # the same doctor, now with a stale second dist-info of verl-ascend-ext first on sys.path
    ns = nodes(2)
    report = compare(ns, [clean, dup], "t:1")
    diffs = {d["key"]: d for d in report["differences"]}
    d = diffs["duplicate install verl-ascend-ext"]
    assert d["behaviour_changing"] and d["differing"] == [ns[1]["NodeID"]]
    assert d["values"][ns[1]["NodeID"]] == "0.0.9, 0.1.0 (editable)" and d["values"][ns[0]["NodeID"]] is None
    assert report["exit_code"] == 1
