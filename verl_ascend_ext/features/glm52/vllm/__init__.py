"""GLM-5.2 fixes for vLLM core (entry point ``glm52_vllm``)."""
