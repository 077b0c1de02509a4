"""TEST-ONLY instrumentation of the GRPO tier, loaded in every process of the job (``VERL_USE_EXTERNAL_MODULES``).

Does nothing unless its variables are set:

- ``GRPO_PROBE_TOKENS=DIR``: each rollout sample verl's vLLM server generates (``vLLMHttpServer.generate``, the
  token-in-token-out call of verl's agent loop) is appended to ``DIR/<pid>.jsonl`` as
  ``{"t": wall time, "prompt_ids": [...], "token_ids": [...]}`` after it returned. Observes only.
- ``GRPO_PROBE_DROP_EXPORT_TENSOR=NAME``: the deliberate fault of the export-check scenario. When transformers
  writes a safetensors shard (``save_pretrained`` -> ``transformers.modeling_utils.safe_save_file``) holding
  ``NAME``, the tensor is left out of that shard: a Hugging Face export missing one weight, written by verl's
  own save path.
"""

from __future__ import annotations

import json
import os
import time
from types import ModuleType
from typing import Any

import wrapt

TOKENS = os.environ.get("GRPO_PROBE_TOKENS")
DROP = os.environ.get("GRPO_PROBE_DROP_EXPORT_TENSOR")


if TOKENS:
    @wrapt.when_imported("verl.workers.rollout.vllm_rollout.vllm_async_server")
    def _record_tokens(module: ModuleType) -> None:
        server = module.vLLMHttpServer
        generate = server.generate

        async def generate_and_record(self: Any, prompt_ids: list[int], *args: Any, **kwargs: Any) -> Any:
            out = await generate(self, prompt_ids, *args, **kwargs)
            line = json.dumps({"t": time.time(), "prompt_ids": list(prompt_ids), "token_ids": list(out.token_ids)})
            with open(os.path.join(TOKENS, f"{os.getpid()}.jsonl"), "a") as f:
                f.write(line + "\n")
            return out

        server.generate = generate_and_record


if DROP:
    @wrapt.when_imported("transformers.modeling_utils")
    def _drop_from_export(module: ModuleType) -> None:
        save_file = module.safe_save_file

        def save_without(tensors: dict[str, Any], filename: str, *args: Any, **kwargs: Any) -> Any:
            if DROP in tensors:
                tensors = {name: t for name, t in tensors.items() if name != DROP}
            return save_file(tensors, filename, *args, **kwargs)

        module.safe_save_file = save_without
