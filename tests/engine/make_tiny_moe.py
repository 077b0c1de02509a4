"""Make the MoE probe's tiny model: Qwen3-MoE architecture, random weights, the tokenizer and chat template of the
engine tier's tiny Qwen2 (copied from its directory, so prompts tokenize the same); vocabulary 512 rows, as that model.

    python tests/engine/make_tiny_moe.py TOKENIZER_DIR DIR

2 layers, both MoE: 4 experts, top 2, ``norm_topk_prob`` (the top-k weights renormalised: what megatron's
``moe_router_pre_softmax=False`` softmax over the top-k logits computes, so transformers, vLLM and Megatron route and
weight alike), no shared expert (Qwen3-MoE has none). Sizes are multiples of 32 (hidden 128, expert FFN 64) so that
vLLM-CPU's grouped-GEMM MoE kernel takes the model on a CPU with AMX (``cpu_fused_moe.py`` ``check_grouped_gemm``);
head_dim 64 (vLLM's CPU attention rejects smaller heads). Seeded; writes DIR/.complete last.
"""

from __future__ import annotations

import sys
from pathlib import Path

from make_tiny_model import save_whole

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def make(tokenizer_dir: Path, target: Path) -> None:
    import torch
    from transformers import AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
        num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        router_aux_loss_coef=0.0, output_router_logits=False, max_position_embeddings=1024,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True,
        initializer_range=0.4, torch_dtype="bfloat16",
    )
    model = Qwen3MoeForCausalLM(config).to(torch.bfloat16)
    save_whole(model, tokenizer, target, "tiny qwen3-moe, 2 layers, 4 experts top 2, seed 0, tiny-qwen2 tokenizer")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: make_tiny_moe.py TOKENIZER_DIR DIR")
    make(Path(sys.argv[1]), Path(sys.argv[2]))
