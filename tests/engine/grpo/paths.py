"""Where the engine tier's jobs find what ``scripts/setup_vllm_engine.sh`` made: the tiny models, the data set, the
verl 0.9.0 and megatron overlays, the ``vllm`` distribution alias."""

from __future__ import annotations

import sys
from pathlib import Path

from repo import CACHE

HERE = Path(__file__).resolve().parent
MODEL = CACHE / "tiny-qwen2-v3"  # dense: 2 layers, head_dim 64 (tests/engine/make_tiny_model.py)
MOE_MODEL = CACHE / "tiny-qwen3-moe-v1"  # 2 MoE layers, 4 experts, top-2 (tests/engine/make_tiny_moe.py)
MODELS = {"qwen2": MODEL, "qwen3-moe": MOE_MODEL}
DATA = CACHE / "grpo-arithmetic-v1"
OVERLAY = {"0.9.0": Path(sys.prefix) / "verl-0.9.0-overlay"}  # 0.9.1 is installed in the engine venv
MEGATRON = Path(sys.prefix) / "megatron-overlay"  # megatron-core 0.16.1 and mbridge 0.15.1
ALIAS = Path(sys.prefix) / "vllm-dist-alias"  # verl reads the `vllm` distribution's version
