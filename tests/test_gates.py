"""Gate parsing for every boolean env var of the package, the declared settings, and the kill switch.

One rule for every variable: unset or set but empty (spaces only) means the declared default, as
``${VAR:-default}`` does; it is tested over every gate and setting the registry holds, through the parser,
doctor and a real boot.
"""

from __future__ import annotations

import pytest

from verl_ascend_ext.patching.gates import DISABLE_ENV, GateValueError, disabled_patch_ids, parse_bool, parse_bool_env
from verl_ascend_ext.runtime.boot import RUNTIME_GATES
from verl_ascend_ext.runtime.registry import registry

TRUE = ["1", "true", "TRUE", "True", "yes", "YES", "on", "On", " 1 ", "\ttrue\n"]
FALSE = ["0", "false", "FALSE", "no", "No", "off", "OFF", " 0 "]
EMPTY = ["", "   ", "\t", " \n"]
JUNK = ["2", "enable", "enabled", "y", "n", "t", "f", "1.0", "tru", "of", "-1", "none", "null", "yes please"]


@pytest.mark.parametrize("raw", TRUE)
def test_true_spellings(raw: str) -> None:
    assert parse_bool("X", raw) is True


@pytest.mark.parametrize("raw", FALSE)
def test_false_spellings(raw: str) -> None:
    assert parse_bool("X", raw) is False


@pytest.mark.parametrize("raw", JUNK)
def test_junk_is_a_clear_error(raw: str) -> None:
    with pytest.raises(GateValueError) as err:
        parse_bool("VERL_VLLM_ASCEND_GLM52_PATCH", raw)
    message = str(err.value)
    assert "VERL_VLLM_ASCEND_GLM52_PATCH" in message
    assert repr(raw) in message
    for accepted in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        assert accepted in message


def test_unset_means_default() -> None:
    assert parse_bool_env("X", True, {}) is True
    assert parse_bool_env("X", False, {}) is False
    assert parse_bool_env("X", True, {"X": "off"}) is False


@pytest.mark.parametrize("raw", EMPTY)
def test_empty_means_default(raw: str) -> None:
    assert parse_bool_env("X", True, {"X": raw}) is True
    assert parse_bool_env("X", False, {"X": raw}) is False


@pytest.mark.parametrize("gate", registry().gates, ids=lambda g: g.env)
@pytest.mark.parametrize("raw", [*TRUE, *FALSE, *EMPTY, *JUNK])
def test_every_declared_gate_uses_the_same_parser(gate, raw: str) -> None:
    env = {gate.env: raw}
    if raw in JUNK:
        with pytest.raises(GateValueError, match=gate.env):
            gate.read(env)
    elif raw in EMPTY:
        assert gate.read(env) is gate.default
    else:
        assert gate.read(env) is (raw in TRUE)


def test_the_registry_declares_settings() -> None:
    assert registry().settings, "no setting declared: the setting tests below would test nothing"


@pytest.mark.parametrize("setting", registry().settings, ids=lambda s: s.env)
@pytest.mark.parametrize("raw", EMPTY)
def test_every_declared_setting_is_its_default_when_empty(setting, raw: str) -> None:
    assert setting.read({setting.env: raw}) == setting.default
    assert setting.read({}) == setting.default


@pytest.mark.parametrize("setting", registry().settings, ids=lambda s: s.env)
@pytest.mark.parametrize("raw", ["junk", "-1", "0", "nan", "inf", "1e999", "10s"])
def test_every_declared_setting_rejects_junk_naming_itself(setting, raw: str) -> None:
    with pytest.raises(GateValueError) as err:
        setting.read({setting.env: raw})
    assert f"{setting.env}={raw!r}" in str(err.value) and "unset" in str(err.value)


def _every_variable_empty() -> dict[str, str]:
    from verl_ascend_ext.features.checkpoint.mode import MODE_ENV

    reg = registry()
    return {**{v.env: "" for v in (*reg.gates, *RUNTIME_GATES, *reg.settings)}, DISABLE_ENV: "", MODE_ENV: " "}


def test_doctor_says_the_default_was_used_for_every_empty_variable() -> None:
    from verl_ascend_ext.tooling import doctor

    env = _every_variable_empty()
    report, code = doctor.build_report(env)
    assert code == 0 and report["errors"] == [], report["errors"]
    rows = [*report["gates"], *report["settings"]]
    assert {row["env"] for row in rows} == {v.env for v in (*registry().gates, *RUNTIME_GATES, *registry().settings)}
    for row in rows:
        assert row["default_used"] == "empty" and row["value"] == row["default"] and row["error"] is None, row
    assert {p["status"] for p in report["patches"]}.isdisjoint({"disabled", "unknown"})
    text = doctor.format_report(report)
    assert text.count("(empty: default used)") == len(rows)
    assert f"kill switch {DISABLE_ENV}: '' (empty: default used, nothing disabled)" in text
    mode = next(f for f in report["findings"] if f["name"] == "export check")
    assert mode["detail"] == "VERL_ASCEND_EXT_EXPORT_CHECK=error (default: VERL_ASCEND_EXT_EXPORT_CHECK is set but " \
        "empty, ' ')"


def test_a_booted_process_reads_every_empty_variable_as_its_default() -> None:
    """The real boot in a fresh interpreter: every gate on its default (a default-on feature stays on)."""
    from subprocesses import last_json, run_python

    out = last_json(run_python("""
        import json, verl_ascend_ext
        from verl_ascend_ext.runtime.records import recorder
        from verl_ascend_ext.runtime.registry import registry
        from verl_ascend_ext.features.checkpoint.mode import export_check_mode
        verl_ascend_ext.activate()
        reg = registry()
        print(json.dumps({"gates": {g.env: g.read() for g in reg.gates},
                          "defaults": {g.env: g.default for g in reg.gates},
                          "settings": {s.env: [s.read(), s.default] for s in reg.settings},
                          "mode": export_check_mode(), "record_defaults": {r.id: r.gate.default for r in reg.records},
                          "statuses": {k: v.status.value for k, v in verl_ascend_ext.patch_statuses().items()}}))
    """, _every_variable_empty()).stdout)
    assert out["gates"] == out["defaults"]
    assert all(value == default for value, default in out["settings"].values())
    assert out["mode"] == "error"
    assert out["statuses"] and set(out["statuses"]) == set(out["record_defaults"])
    for patch_id, status in out["statuses"].items():  # gate-off exactly where the gate's default is off
        assert (status == "gate-off") is (not out["record_defaults"][patch_id]), (patch_id, status)
        assert status != "disabled", (patch_id, status)


def test_disable_per_id_and_star() -> None:
    ids = ["a", "b", "c"]
    assert disabled_patch_ids(ids, {}) == frozenset()
    assert disabled_patch_ids(ids, {DISABLE_ENV: "b"}) == {"b"}
    assert disabled_patch_ids(ids, {DISABLE_ENV: " a , c ,"}) == {"a", "c"}
    assert disabled_patch_ids(ids, {DISABLE_ENV: "*"}) == set(ids)


def test_disable_unknown_id_names_it_and_the_known_ones() -> None:
    with pytest.raises(GateValueError) as err:
        disabled_patch_ids(["distill-fsdp2-topk"], {DISABLE_ENV: "distill-fsdp2-topc"})
    assert "distill-fsdp2-topc" in str(err.value) and "distill-fsdp2-topk" in str(err.value)
    assert DISABLE_ENV in str(err.value)


def test_bad_value_stops_import_verl_with_the_message() -> None:
    """verl swallows plugin exceptions at DEBUG; a bad gate must still stop the process, loudly."""
    from subprocesses import run_python

    proc = run_python("import verl\nprint('survived')", {"VERL_VLLM_ASCEND_GLM52_PATCH": "sometimes"}, check=False)
    assert proc.returncode != 0
    assert "survived" not in proc.stdout
    assert "VERL_VLLM_ASCEND_GLM52_PATCH='sometimes'" in proc.stderr


def test_bad_setting_stops_boot_and_doctor_naming_it() -> None:
    """A declared setting's invalid value is treated like a gate's: boot raises, doctor exits 2, both name it."""
    from subprocesses import run_python

    from verl_ascend_ext.tooling import doctor

    for setting in registry().settings:
        env = {setting.env: "soon"}
        report, code = doctor.build_report(env)
        assert code == 2 and any(f"{setting.env}='soon'" in e for e in report["errors"]), report["errors"]
        assert "INVALID" in doctor.format_report(report)
        proc = run_python("import verl_ascend_ext; verl_ascend_ext.activate(); print('survived')", env, check=False)
        assert proc.returncode != 0 and "survived" not in proc.stdout
        assert f"{setting.env}='soon'" in proc.stderr
