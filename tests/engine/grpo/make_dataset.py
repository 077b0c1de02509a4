"""Write the GRPO tier's tiny data set: arithmetic prompts as verl's RL dataset reads them (parquet).

    python make_dataset.py DIR

Run once by scripts/setup_vllm_engine.sh; tests never call it. Seeded: two runs write the same rows. Each row
has verl's fields (``data_source``, ``prompt`` as chat messages, ``ability``, ``reward_model.ground_truth``,
``extra_info``); ``arithmetic_reward.compute_score`` scores the answers. Writes DIR/.complete last.
"""

from __future__ import annotations

import random
import shutil
import sys
from pathlib import Path

ROWS = {"train": 32, "test": 8}


def rows(split: str, count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for index in range(count):
        a, b = rng.randint(1, 49), rng.randint(1, 49)
        out.append({
            "data_source": "arithmetic",
            "prompt": [{"role": "user", "content": f"what is {a} plus {b}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": split, "index": index},
        })
    return out


def make(target: Path) -> None:
    import pandas as pd

    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for seed, (split, count) in enumerate(ROWS.items()):
        pd.DataFrame(rows(split, count, seed)).to_parquet(partial / f"{split}.parquet")
    (partial / ".complete").write_text(f"arithmetic prompts {ROWS}\n")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: make_dataset.py DIR")
    make(Path(sys.argv[1]))
