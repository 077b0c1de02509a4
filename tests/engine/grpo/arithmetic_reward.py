"""TEST-ONLY reward of the GRPO tier (verl's ``reward.custom_reward_function``): a rule on arithmetic answers.

The tiny model has random weights, so it never writes the right sum and verl's stock gsm8k rule would give
every sample 0: GRPO's advantages (reward minus the group mean) would all be 0 and the update a no-op. So
the score is shaped: 1.0 when the correct sum appears in the response, else half the share of the response's
characters that are spaces or digits of the answer, which differs from sample to sample of one prompt.
"""

from __future__ import annotations

from typing import Any


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None,
                  **_kwargs: Any) -> float:
    if ground_truth in solution_str.split():
        return 1.0
    if not solution_str:
        return 0.0
    wanted = set(ground_truth) | {" "}
    return 0.5 * sum(ch in wanted for ch in solution_str) / len(solution_str)
