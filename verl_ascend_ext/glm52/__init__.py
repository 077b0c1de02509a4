"""GLM-5.2 on vLLM / vLLM-Ascend: the gated patch set (core_feature: vLLM core; ascend_feature: vLLM-Ascend)."""
