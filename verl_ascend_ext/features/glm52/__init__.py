"""GLM-5.2 on vLLM / vLLM-Ascend: the gated patch set (vllm/: vLLM core; ascend/: vLLM-Ascend).

What both halves share: the gate (the variable verl 0.9.1's in-tree copy reads too) and how that
in-tree copy marks what it replaced and parses the gate.
"""

from __future__ import annotations

from verl_ascend_ext.patching import Gate

GATE = Gate(
    "VERL_VLLM_ASCEND_GLM52_PATCH",
    default=False,
    doc="GLM-5.2 fixes for vLLM / vLLM-Ascend 0.23 rollout (same variable as verl 0.9.1's in-tree copy).",
)
VERL_MARKER = "_verl_vllm_ascend_glm52_patched"  # set by verl 0.9.1's in-tree copy on what it installs
VERL_CAMEM_MARKER = "_verl_camem_sleep_patched"
VERL_ENABLED = ("1", "true", "yes")  # verl's own parsing of VERL_VLLM_ASCEND_GLM52_PATCH
