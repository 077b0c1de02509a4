"""Gate parsing for every boolean env var of the package, and the kill switch."""

from __future__ import annotations

import pytest

from verl_ascend_ext.patching.gates import DISABLE_ENV, GateValueError, disabled_patch_ids, parse_bool, parse_bool_env
from verl_ascend_ext.runtime.registry import registry

TRUE = ["1", "true", "TRUE", "True", "yes", "YES", "on", "On", " 1 ", "\ttrue\n"]
FALSE = ["0", "false", "FALSE", "no", "No", "off", "OFF", "", "   ", " 0 "]
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


@pytest.mark.parametrize("gate", registry().gates, ids=lambda g: g.env)
@pytest.mark.parametrize("raw", [*TRUE, *FALSE, *JUNK])
def test_every_declared_gate_uses_the_same_parser(gate, raw: str) -> None:
    env = {gate.env: raw}
    if raw in JUNK:
        with pytest.raises(GateValueError, match=gate.env):
            gate.read(env)
    else:
        assert gate.read(env) is (raw in TRUE)


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
