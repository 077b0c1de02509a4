"""GLM-5.2 fixes for vLLM-Ascend (entry point ``glm52_ascend``)."""
