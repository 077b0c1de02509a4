"""Not a speed figure: how far vLLM-CPU's MoE routes and greedy tokens stray from transformers' on this CPU, per oneDNN
kernel ceiling, measured side by side in one run against the bound ``tests/engine/test_moe_routes.py`` asserts.

Runs the engine tier's probe (``tests/engine/grpo/moe_vllm_routes.py``: one real vLLM 0.23.0 engine, the tiny
Qwen3-MoE, the torch MoE fallback, the routed-experts capture on) once per ``ONEDNN_MAX_CPU_ISA`` value (unset: the
CPU's best; ``AVX512_CORE_BF16``: the AVX-512 BF16 kernels a CPU without AMX takes; ``AVX2``: no bf16 kernel in
oneDNN, torch's own), and prints the CPU's model and flags, then per setting the kernel torch's bf16 matmul took
(from ``ONEDNN_VERBOSE``) and each layer's route and the greedy tokens' differences with the widest gap in bf16
ulps (``tests/engine/bf16_ties.py``).

    ENGINE_PY=$(bash scripts/setup_vllm_engine.sh | tail -1)
    $ENGINE_PY benchmarks/moe_route_ties.py [ISA ...]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENGINE = REPO / "tests" / "engine"
sys.path[:0] = [str(REPO / "scripts"), str(ENGINE), str(REPO / "tests")]

import bf16_ties  # noqa: E402
import numpy as np  # noqa: E402
import phases  # noqa: E402  (the CPU line of CI's phase table)
from enginetier import ALIAS  # noqa: E402
from grpo.paths import MOE_MODEL  # noqa: E402
from subprocesses import last_json, run_command  # noqa: E402

MATMUL = ("import torch; a = torch.ones(16, 64, dtype=torch.bfloat16); "
          "torch.nn.functional.linear(a, torch.ones(32, 64, dtype=torch.bfloat16))")


def matmul_kernel(isa: str) -> str:
    env = {**os.environ, "ONEDNN_VERBOSE": "1", "ONEDNN_MAX_CPU_ISA": isa}
    out = subprocess.run([sys.executable, "-c", MATMUL], env=env, capture_output=True, text=True, check=True).stdout
    kernels = [line.split(",")[6] for line in out.splitlines() if ",primitive,exec,cpu,matmul," in line]
    return kernels[0] if kernels else "torch's own (oneDNN took no bf16 matmul)"


def measure(isa: str) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        env = {"MOE_PROBE_DIR": tmp, "MOE_PROBE_FORCE_TORCH_MOE": "1", "TOKENIZERS_PARALLELISM": "false",
               "ONEDNN_MAX_CPU_ISA": isa}
        proc = run_command([sys.executable, str(ENGINE / "grpo" / "moe_vllm_routes.py"), str(MOE_MODEL)], env,
                           pythonpath=f"{ENGINE / 'grpo'}:{ALIAS}", timeout=600)
        found = last_json(proc.stdout)
        with np.load(found["data"]) as data:
            found_differences = [*bf16_ties.by_layer(data["routes"], data["router_logits"]), bf16_ties.greedy(data)]
    lines = [f"ONEDNN_MAX_CPU_ISA={isa or '(unset)'}: bf16 matmul kernel {matmul_kernel(isa)}; "
             f"vLLM MoE path {found['moe_paths']}"]
    for d in found_differences:
        lines.append(f"  {d.summary()}  {'within the bound' if not d.problems() else '; '.join(d.problems())}")
    return lines


def main(argv: list[str]) -> int:
    print(phases.machine())
    print(f"bound: a difference is a near-tie within {bf16_ties.TIE_ULPS:g} bf16 ulps; at most "
          f"{bf16_ties.TIE_SHARE:.0%} may differ")
    for isa in argv or ["", "AVX512_CORE_BF16", "AVX2"]:
        print("\n".join(measure(isa)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
