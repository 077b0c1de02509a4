"""TEST-ONLY: the Megatron model that ``transfer_to_cpu`` lets mbridge build computes what transformers computes.

    python megatron_forward.py MODEL_DIR      (megatron-core and mbridge on PYTHONPATH; prints one JSON line)

One process, one gloo rank: mbridge builds the tiny model with megatron's local layer spec in fp32 and loads its
Hugging Face weights; a batch in verl's bshd form (valid tokens first, a [b, s] keep-mask: one row padded at the
end) goes through the Megatron model and through transformers' own Qwen2 (eager attention, fp32, the same mask).
Printed: the largest logit difference over valid positions, row by row, and the logits' scale. The reference is
transformers' implementation, so a wrong weight-name mapping, rotary base, norm or attention mask shows here.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import transfer_to_cpu  # noqa: F401  (before megatron: its post-import hooks)


def main() -> None:
    model_dir = sys.argv[1]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "0")
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    from mbridge import AutoBridge
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from transformers import AutoModelForCausalLM

    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(1)
    bridge = AutoBridge.from_pretrained(model_dir)
    bridge.set_extra_args(attention_backend="local", sequence_parallel=False, params_dtype=torch.float32,
                          pipeline_dtype=torch.float32, bf16=False)
    (megatron,) = bridge.get_model(bf16=False)
    bridge.load_weights([megatron], model_dir)
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, reference.config.vocab_size, (2, 12), generator=generator)
    keep = torch.ones(2, 12, dtype=torch.bool)
    keep[1, 8:] = False  # row 1: 8 tokens, then padding
    positions = torch.arange(12).expand(2, 12)
    with torch.no_grad():
        ours = megatron(input_ids=ids, position_ids=positions, attention_mask=keep)
        theirs = reference(input_ids=ids, attention_mask=keep.long()).logits
    diffs = [(ours[row, keep[row]] - theirs[row, keep[row]]).abs().max().item() for row in range(2)]
    print(json.dumps({"max_abs_diff": diffs, "scale": theirs.abs().max().item(), "shape": list(ours.shape)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
