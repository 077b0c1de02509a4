"""The GLM-5.2 vLLM-Ascend replacements against CPU references (scenario: tests/scenarios/glm52_ascend_maths.py).

Real: vLLM-Ascend 0.23.0's own method bodies (read from the released wheel) wrapped by our wrappers;
CPU torch. Simulated: NPU kernels, by the test double verl_ascend_ext/tooling/selftest/npu_test_double.py (its fused
add-and-norm normalises the unrounded float32 sum, as the issue describes the NPU kernel).
"""

from __future__ import annotations

import sys

import pytest
from glm52_ascend_fixtures import released_sources
from repo import REPO
from subprocesses import last_json, run_command

SCENARIO = REPO / "tests" / "scenarios" / "glm52_ascend_maths.py"


@pytest.fixture(scope="module")
def maths() -> dict:
    proc = run_command([sys.executable, SCENARIO, released_sources()], check=False)
    assert proc.returncode == 0, proc.stderr
    return last_json(proc.stdout)


@pytest.mark.parametrize("bias", ["no_bias", "bias"])
@pytest.mark.parametrize("op", ["custom", "torch_npu"])
def test_rmsnorm_normalises_the_rounded_sum(maths: dict, bias: str, op: str) -> None:
    case = maths["rmsnorm"][bias][op]
    assert case["ours_equals_reference"] and case["ours_residual_is_rounded_sum"]
    # the released fused path really differs (else this test would prove nothing)
    assert not case["fused_equals_reference"] and case["max_abs_fused_minus_reference"] > 0


def test_rmsnorm_keeps_the_bias(maths: dict) -> None:
    case = maths["rmsnorm"]["bias"]
    assert case["ours_minus_bias_free_is_bias"] and case["bias_dropped_would_differ"]


def test_rmsnorm_without_residual_is_the_original(maths: dict) -> None:
    assert maths["rmsnorm"]["no_bias"]["no_residual_unchanged"] and maths["rmsnorm"]["bias"]["no_residual_unchanged"]


@pytest.mark.parametrize("case", ["base", "a5", "310p", "keywords_via_instance", "cp_slices_equal_upstream"])
def test_indexer_weights_reach_the_kernel_scaled_exactly_once(maths: dict, case: str) -> None:
    assert maths["indexer"][case] is True  # bitwise equal to vLLM-Ascend's own fix (patches/.../0003)


def test_kv_b_proj_survives_loading_and_weight_updates(maths: dict) -> None:
    kv = maths["kv_b_proj"]
    assert kv["original"]["shape_after_load"] == [0]  # the bug, reproduced on the released code
    assert kv["original"]["weight_update"].startswith("RuntimeError")
    assert kv["patched"] == {"shape_after_load": [16, 8], "same_parameter_object": True, "values_kept": True,
                             "weight_update": "ok"}
    assert kv["other_layers"] == {"kv_b_proj": [16, 8], "q_proj": [0]}


def test_camem_sleep_synchronises_before_unmapping(maths: dict) -> None:
    assert "synchronize" not in maths["camem"]["original"]
    assert maths["camem"]["patched"] == ["synchronize", *maths["camem"]["original"]]
