"""Make the real-engine tier's tiny model: Qwen2 architecture, random weights, a trained byte-level BPE tokenizer
with a minimal chat template (verl's RL data set applies the model's chat template to every prompt).

    python tests/engine/make_tiny_model.py DIR

Run once by scripts/setup_vllm_engine.sh with the engine venv's python (transformers, tokenizers, torch);
tests never call it. Seeded, so two runs make the same weights. head_dim is 64: vLLM's CPU attention
kernel rejects smaller heads. Writes DIR/.complete last, so a half-made model is never used.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

TEXT = ("the engine wakes up after sleep and the scheduler resumes when the weights and the cache are back "
        "a tiny model serves greedy tokens on the cpu while the plugin patches the core once per process")
WORDS = TEXT.split()
CHAT_TEMPLATE = ("{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def corpus() -> list[str]:
    lines = []
    for i in range(2000):
        lines.append(" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(12 + i % 9)))
    return lines


def make(target: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>"]
    tokenizer.train_from_iterator(corpus(), trainers.BpeTrainer(vocab_size=512, special_tokens=special,
                                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=1024,
                         eos_token_id=fast.eos_token_id, bos_token_id=fast.eos_token_id, tie_word_embeddings=True,
                         initializer_range=0.4, torch_dtype="bfloat16")
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    save_whole(model, fast, target, "tiny qwen2, head_dim 64, seed 0, initializer_range 0.4, chat template")


def save_whole(model, tokenizer, target: Path, note: str) -> None:
    """Write the model and tokenizer beside ``target``, mark it ``.complete`` (``note``), then move it in place: a
    directory at ``target`` is always whole."""
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    (partial / ".complete").write_text(note + "\n")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: make_tiny_model.py DIR")
    make(Path(sys.argv[1]))
