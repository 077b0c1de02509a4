"""The vLLM-Ascend patch code, one module per target area."""
