"""tests/engine/grpo/cpu_isa_cap.py: under a oneDNN ceiling below AMX, torch's AMX check (what vLLM-CPU chooses its
AMX kernels by) answers False in a process that loaded it, as on a CPU without AMX; under a ceiling that keeps AMX,
or none, the CPU's own answer stands."""

from __future__ import annotations

import pytest
from repo import REPO
from subprocesses import last_json, run_python

CODE = """
import json
import torch
real = torch.cpu._is_amx_tile_supported
import cpu_isa_cap
print(json.dumps({"answer": torch.cpu._is_amx_tile_supported(), "patched": torch.cpu._is_amx_tile_supported is not real,
                  "no_amx": cpu_isa_cap.NO_AMX}))
"""
LATE = """
import json
import cpu_isa_cap
import torch
print(json.dumps({"answer": torch.cpu._is_amx_tile_supported()}))
"""


def ask(code: str, cap: str | None) -> dict:
    return last_json(run_python(code, {"ONEDNN_MAX_CPU_ISA": cap}, pythonpath=str(REPO / "tests" / "engine" / "grpo"),
                                timeout=120).stdout)


@pytest.mark.parametrize("cap", ["AVX512_CORE", "avx2", "AVX512_CORE_BF16"])
def test_a_ceiling_below_amx_answers_no_amx_whenever_torch_is_imported(cap: str) -> None:
    assert ask(CODE, cap) == {"answer": False, "patched": True, "no_amx": True}
    assert ask(LATE, cap) == {"answer": False}  # torch imported after it: the post-import hook


@pytest.mark.parametrize("cap", [None, "AVX512_CORE_AMX", "ALL"])
def test_no_ceiling_or_one_with_amx_leaves_the_cpus_answer(cap: str | None) -> None:
    got = ask(CODE, cap)
    assert got["patched"] is False and got["no_amx"] is False, got
