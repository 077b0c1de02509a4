"""Each rule's verdict on two runs: against its bound, and against the runs' own step-to-step noise.

The noise of a metric in one run is read from its window: sigma = median(|x[i+1] - 2 x[i] + x[i-1]|) / (0.6745 *
sqrt 6), the robust standard deviation of second differences. It fits a short RL run: its metrics trend (the
reward climbs, the entropy falls), and a second difference cancels a steady trend that a plain standard deviation
(or a first difference) would count as noise; the median ignores the odd spiking step (a batch of long responses)
that a mean would take in. The two windows' statistics then differ "beyond noise" when the difference exceeds three
standard errors, ``3 * sqrt(sigma_b^2 / n_b + sigma_r^2 / n_r)`` for a mean or median over n steps (``n = 1`` for a
single step: last, max, min). With fewer than four steps in a window the noise cannot be told: the bound alone
decides, and the verdict says so. A last-step rule reads the noise from the run's last ``LAST_STEPS`` steps.

Verdicts: ``ok`` (within the bound), ``moved`` (within the bound but beyond the noise: a real shift, not a failure),
``noise`` (beyond the bound but within the runs' noise: not failed, the bound is tighter than this metric's noise),
``FAIL`` (beyond the bound and beyond the noise, or noise unknown), ``not logged`` (a default rule whose metric
neither run logged) and ``missing`` (a run lacks the metric or the window's steps).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from verl_ascend_ext.tooling.compare.rules import Rule
from verl_ascend_ext.tooling.compare.runs import Run

OK, MOVED, NOISE, FAIL, NOT_LOGGED, MISSING = "ok", "moved", "noise", "FAIL", "not logged", "missing"
MIN_FOR_NOISE = 4  # steps a window needs for two second differences
SIGMAS = 3.0
MAD_TO_SIGMA = 0.6745
LAST_STEPS = 10  # the steps a last-step rule's noise is read from


@dataclass
class Verdict:
    rule: Rule
    verdict: str
    baseline: float | None = None
    run: float | None = None
    allowed: tuple[float | None, float | None] = (None, None)
    noise: float | None = None  # the threshold a difference must pass to be beyond noise (3 standard errors)
    steps: tuple[int, int] = (0, 0)  # steps in the window: baseline, run
    note: str = ""

    @property
    def failed(self) -> bool:
        return self.verdict == FAIL

    def as_dict(self) -> dict:
        return {"rule": self.rule.name, "metric": self.rule.metric, "window": self.rule.window_text,
                "statistic": self.rule.statistic, "bound": self.rule.bound.text, "verdict": self.verdict,
                "baseline": self.baseline, "run": self.run, "allowed": list(self.allowed), "noise": self.noise,
                "difference": None if self.baseline is None or self.run is None else self.run - self.baseline,
                "steps": list(self.steps), "note": self.note}


def step_noise(values: list[float]) -> float | None:
    """The robust standard deviation of one step's value around its neighbours (see the module docstring)."""
    if len(values) < MIN_FOR_NOISE:
        return None
    second = [abs(values[i + 1] - 2 * values[i] + values[i - 1]) for i in range(1, len(values) - 1)]
    return statistics.median(second) / (MAD_TO_SIGMA * math.sqrt(6))


def _noise_sample(rule: Rule, series: dict[int, float], window: dict[int, float]) -> list[float]:
    """The values a run's noise is read from: the window's, or a last-step rule's last ``LAST_STEPS`` steps."""
    chosen = window if rule.window is not None else dict(list(sorted(series.items()))[-LAST_STEPS:])
    return [chosen[s] for s in sorted(chosen)]


def _threshold(rule: Rule, base: list[float], run: list[float]) -> float | None:
    sigma_b, sigma_r = step_noise(base), step_noise(run)
    if sigma_b is None or sigma_r is None:
        return None
    averaged = rule.statistic in ("mean", "median") and rule.window is not None
    n_b, n_r = (len(base), len(run)) if averaged else (1, 1)
    return SIGMAS * math.sqrt(sigma_b**2 / n_b + sigma_r**2 / n_r)


def judge(rule: Rule, baseline: Run, run: Run) -> Verdict:
    series_b, series_r = baseline.metric(rule.metric), run.metric(rule.metric)
    if not series_b and not series_r and rule.default:
        return Verdict(rule, NOT_LOGGED, note="neither run logged it")
    window_b, window_r = rule.values(series_b), rule.values(series_r)
    if not window_b or not window_r:
        lacking = [name for name, window in (("baseline", window_b), ("run", window_r)) if not window]
        return Verdict(rule, MISSING, note=f"{' and '.join(lacking)} {'has' if len(lacking) == 1 else 'have'} no "
                       f"value in {rule.window_text} ({'baseline ' + baseline.span if not window_b else ''}"
                       f"{'; ' if len(lacking) == 2 else ''}{'run ' + run.span if not window_r else ''})")
    base, value = rule.statistic_of(window_b), rule.statistic_of(window_r)
    low, high = rule.bound.limits(base)
    within = (low is None or value >= low) and (high is None or value <= high)
    threshold = _threshold(rule, _noise_sample(rule, series_b, window_b), _noise_sample(rule, series_r, window_r))
    beyond_noise = threshold is None or abs(value - base) > threshold
    if within:
        verdict = MOVED if threshold is not None and beyond_noise and value != base else OK
    else:
        verdict = FAIL if beyond_noise else NOISE
    note = ""
    if threshold is None:
        note = f"noise unknown (fewer than {MIN_FOR_NOISE} steps in a window): the bound alone decides"
    elif verdict == NOISE:
        note = "beyond the bound but within the runs' own step-to-step noise"
    elif verdict == MOVED:
        note = "within the bound, but beyond the runs' noise: a real shift"
    return Verdict(rule, verdict, base, value, (low, high), threshold, (len(window_b), len(window_r)), note)


def judge_all(rules: tuple[Rule, ...], baseline: Run, run: Run) -> list[Verdict]:
    return [judge(rule, baseline, run) for rule in rules]
