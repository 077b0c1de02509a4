"""Judging a run's numbers: against a CPU float64 reference of the intended maths, with a tolerance per dtype.

Tolerance (``within``): every element must satisfy ``|out - ref| <= rtol * (|ref| + rms(ref))``, where ``rtol`` is
torch.testing.assert_close's default relative tolerance for the dtype the case computes in (bfloat16 1.6e-2,
float16 1e-3, float32 1.3e-6, float64 1e-7) and ``rms(ref)`` is the root mean square of that reference
output. The ``rms`` term is the absolute part: a value that cancels to near zero (a bias added after a norm)
is judged at the scale of its tensor, not of itself.

Some bugs are smaller than any honest tolerance: the fused add-and-norm normalises the float32 sum instead
of the sum rounded to bfloat16, which moves each output by less than one bfloat16 step. For those a case
also gives the maths of the released (buggy) code, in float64 as well, and an output then has to be closer
to the intended reference than to the bug's, by mean absolute error over all its elements
(``closer_to_intended``). On the selftest's RMSNorm inputs (residual case, both outputs) the fixed code's mean
error is 0.00057 to the intended maths and 0.00078 to the bug's; the released code's is 0.00078 and 0.00056.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

RTOL = {torch.bfloat16: 1.6e-2, torch.float16: 1e-3, torch.float32: 1.3e-6, torch.float64: 1e-7}


def rtol(dtype: torch.dtype) -> float:
    if dtype not in RTOL:
        raise ValueError(f"no documented tolerance for {dtype}; use one of {', '.join(map(str, RTOL))}")
    return RTOL[dtype]


@dataclass
class Judgement:
    """One output of one case against its reference (and the released maths, when the case gives it)."""

    within: bool  # every element inside the tolerance
    max_error: float
    where: str  # "output N, element (i, j)" of the largest error relative to its allowance
    mean_error: float
    mean_error_to_bug: float | None  # None when the case has no separate bug maths
    problem: str = ""  # shape / dtype mismatch, NaN, or the exception the run raised

    @property
    def closer_to_intended(self) -> bool:
        return self.mean_error_to_bug is None or self.mean_error < self.mean_error_to_bug

    @property
    def matches(self) -> bool:
        return not self.problem and self.within and self.closer_to_intended

    def as_dict(self) -> dict[str, Any]:
        return {"matches": self.matches, "within_tolerance": self.within, "max_error": self.max_error,
                "where": self.where, "mean_error": self.mean_error, "mean_error_to_bug": self.mean_error_to_bug,
                "problem": self.problem}


def flatten(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for item in out for t in flatten(item)]
    raise TypeError(f"a case returned {type(out).__name__}, not tensors")


def _index(flat_index: int, shape: torch.Size) -> tuple[int, ...]:
    idx = []
    for size in reversed(shape):
        idx.append(flat_index % size)
        flat_index //= size
    return tuple(reversed(idx))


def judge(outputs: Any, reference: list[torch.Tensor], bug: list[torch.Tensor] | None, dtype: torch.dtype
          ) -> Judgement:
    """``outputs`` (device tensors) against float64 ``reference`` (and ``bug``), every output tensor together."""
    got = [t.detach().to("cpu", torch.float64) for t in flatten(outputs)]
    if len(got) != len(reference):
        return Judgement(False, float("inf"), "", float("inf"), None,
                         f"{len(got)} output tensor(s), the reference has {len(reference)}")
    tol = rtol(dtype)
    worst, where, max_error, total, total_bug, count = -1.0, "", 0.0, 0.0, 0.0, 0
    within = True
    for i, (out, ref) in enumerate(zip(got, reference, strict=True)):
        if out.shape != ref.shape:
            return Judgement(False, float("inf"), f"output {i}", float("inf"), None,
                             f"output {i} has shape {tuple(out.shape)}, the reference {tuple(ref.shape)}")
        if not torch.isfinite(out).all():
            bad = int(torch.nonzero(~torch.isfinite(out).flatten())[0])
            return Judgement(False, float("inf"), f"output {i}, element {_index(bad, out.shape)}", float("inf"), None,
                             "not finite")
        err = (out - ref).abs()
        scale = ref.pow(2).mean().sqrt() if ref.numel() else torch.tensor(0.0, dtype=torch.float64)
        allowance = tol * (ref.abs() + scale)
        ratio = err / allowance.clamp_min(torch.finfo(torch.float64).tiny)
        flat = int(ratio.flatten().argmax()) if ratio.numel() else 0
        if ratio.numel() and float(ratio.flatten()[flat]) > worst:
            worst = float(ratio.flatten()[flat])
            where = f"output {i}, element {_index(flat, out.shape)}"
        within = within and bool((err <= allowance).all())
        max_error = max(max_error, float(err.max()) if err.numel() else 0.0)
        total += float(err.sum())
        count += err.numel()
        if bug is not None:
            total_bug += float((out - bug[i]).abs().sum())
    mean = total / max(count, 1)
    mean_bug = total_bug / max(count, 1) if bug is not None else None
    return Judgement(within, max_error, where, mean, mean_bug)


def failed_run(problem: str) -> Judgement:
    """The judgement of a run that produced no numbers (it raised)."""
    return Judgement(False, float("inf"), "", float("inf"), None, problem)
