"""Each rule's verdict on two runs: against its bound, and against the runs' own step-to-step noise.

What must fail fails first. A non-finite value (NaN, +-inf; a ``null`` of verl's file logger) among the values a rule
reads, in either run, is FAIL naming the run and the first such step: a diverged run must not pass as noise. A
metric the baseline has in the window and the run lacks (the run ended early, or stopped logging it) is FAIL, saying
how many of the baseline's steps the run has; ``allow_missing`` (``--allow-missing``) makes that a note and judges
the steps both runs have (``missing`` when they share none). A last-step rule's run must reach the baseline's last
step. Steps the run has and the baseline lacks are a note, never a failure.

The noise of a metric in one run is read from its window: sigma = median(|x[c] - 2 x[b] + x[a]|) / (0.6745 *
sqrt 6) over the window's consecutive logged steps a < b < c, the robust standard deviation of second differences.
It fits a short RL run: its metrics trend (the reward climbs, the entropy falls), and a second difference cancels a
steady trend that a plain standard deviation (or a first difference) would count as noise; the median ignores the
odd spiking step (a batch of long responses) that a mean would take in. A triple is used only when its steps are
evenly spaced (b - a == c - b): across an uneven gap a trend no longer cancels, so it is skipped. The two windows'
statistics then differ "beyond noise" when the difference exceeds three standard errors,
``3 * sqrt(sigma_b^2 / n_b + sigma_r^2 / n_r)`` for a mean or median over n steps (``n = 1`` for a single step:
last, max, min). With fewer than ``MIN_DIFFERENCES`` usable second differences the noise cannot be told: the bound
alone decides, and the verdict says so; with fewer than ``FEW_DIFFERENCES``, or with steps missing in between, the
note says what the estimate rests on. A last-step rule reads the noise from the run's last ``LAST_STEPS`` steps.

Verdicts: ``ok`` (within the bound), ``moved`` (within the bound but beyond the noise: a real shift, not a failure),
``noise`` (beyond the bound but within the runs' noise: not failed, the bound is tighter than this metric's noise),
``FAIL`` (beyond the bound and beyond the noise, or noise unknown; a non-finite value; the run lacking steps the
baseline has), ``not logged`` (a default rule whose metric neither run logged) and ``missing`` (nothing both runs
have to compare: not failed).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from verl_ascend_ext.features.sleep_memory.series import RANKS_METRIC
from verl_ascend_ext.tooling.compare.rules import Rule
from verl_ascend_ext.tooling.compare.runs import NULL, Run

OK, MOVED, NOISE, FAIL, NOT_LOGGED, MISSING = "ok", "moved", "noise", "FAIL", "not logged", "missing"
NOT_COMPARABLE = "not comparable"  # the runs' figures are of different things (e.g. of different sets of ranks)
OF_RANKS = ("rollout/memory_in_use_after_sleep", "rollout/host_resident_memory_after_sleep", "rollout/wake_up_s")
MIN_DIFFERENCES = 2  # second differences the noise needs at all (four consecutive steps)
FEW_DIFFERENCES = 8  # fewer than this (a window under ten consecutive steps): the note calls the noise rough
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
    steps: tuple[int, int] = (0, 0)  # steps in the window holding the metric: baseline, run
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


@dataclass(frozen=True)
class Noise:
    """One run's noise estimate and what it rests on."""

    sigma: float | None  # None: too few evenly spaced steps to tell
    steps: int  # values it was read from
    gaps: int  # steps missing between the first and the last of them
    differences: int  # second differences used

    def told(self) -> str:
        gaps = f" with {self.gaps} missing in between" if self.gaps else ""
        return f"{self.steps} step(s){gaps}, {self.differences} second difference(s)"


def noise_of(series: dict[int, float]) -> Noise:
    """The robust standard deviation of one step's value around its neighbours (see the module docstring)."""
    steps = sorted(series)
    gaps = steps[-1] - steps[0] + 1 - len(steps) if steps else 0
    second = [abs(series[c] - 2 * series[b] + series[a]) for a, b, c in zip(steps, steps[1:], steps[2:], strict=False)
              if b - a == c - b]
    sigma = statistics.median(second) / (MAD_TO_SIGMA * math.sqrt(6)) if len(second) >= MIN_DIFFERENCES else None
    return Noise(sigma, len(steps), gaps, len(second))


def _noise_sample(rule: Rule, series: dict[int, float], window: dict[int, float]) -> dict[int, float]:
    """The values a run's noise is read from: the window's, or a last-step rule's last ``LAST_STEPS`` steps."""
    return window if rule.window is not None else dict(sorted(series.items())[-LAST_STEPS:])


def _threshold(rule: Rule, base: Noise, run: Noise, n_b: int, n_r: int) -> float | None:
    if base.sigma is None or run.sigma is None:
        return None
    averaged = rule.statistic in ("mean", "median") and rule.window is not None
    n_b, n_r = (n_b, n_r) if averaged else (1, 1)
    return SIGMAS * math.sqrt(base.sigma**2 / n_b + run.sigma**2 / n_r)


def _non_finite(rule: Rule, side: str, source: Run, values: dict[int, float]) -> str | None:
    """The note naming the first non-finite value among ``values``, or None."""
    bad = [step for step in sorted(values) if not math.isfinite(values[step])]
    if not bad:
        return None
    written = source.raw[bad[0]][rule.metric]
    how = " (verl's file logger writes NaN and inf as null)" if written == NULL else ""
    where = rule.window_text if rule.window else f"the last {LAST_STEPS} steps (the last one and its noise)"
    return (f"{side}'s {rule.metric} is {written}{how} at step {bad[0]}, the first of {len(bad)} non-finite "
            f"value(s) in {where}: a diverged run")


def _span(steps: set[int]) -> str:
    """``5-14`` / ``5, 7, 9-14``: the steps, runs of consecutive ones joined."""
    ordered, parts = sorted(steps), []
    for step in ordered:
        if parts and step == parts[-1][1] + 1:
            parts[-1][1] = step
        else:
            parts.append([step, step])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in parts)


def _coverage(rule: Rule, series_b: dict[int, float], series_r: dict[int, float], steps_b: set[int],
              steps_r: set[int]) -> tuple[str | None, list[str]]:
    """(what the run lacks that the baseline has, or None; notes on steps the baseline lacks)."""
    last_r = f"its last step of {rule.metric} is {max(series_r)}" if series_r else f"it never logged {rule.metric}"
    if rule.window is None:
        if not series_r or max(series_r) < max(series_b):
            return (f"run has {len(series_r)} of the baseline's {len(series_b)} steps of {rule.metric}: {last_r}, the "
                    f"baseline's is {max(series_b)}"), []
        return None, []
    lacking, extra = steps_b - steps_r, steps_r - steps_b
    notes = [f"baseline lacks {rule.metric} at step(s) {_span(extra)} that the run has"] if extra and steps_b else []
    if not lacking:
        return None, notes
    return (f"run has {len(steps_b & steps_r)} of the {len(steps_b)} steps of {rule.window_text} the baseline has: "
            f"it lacks step(s) {_span(lacking)} ({last_r})"), notes


def judge(rule: Rule, baseline: Run, run: Run, allow_missing: bool = False) -> Verdict:
    """The verdict of ``rule`` on ``run`` against ``baseline`` (see the module docstring)."""
    series_b, series_r = baseline.metric(rule.metric), run.metric(rule.metric)
    if not series_b and not series_r and rule.default:
        return Verdict(rule, NOT_LOGGED, note="neither run logged it")
    if rule.metric.startswith(OF_RANKS):
        other = _other_ranks(baseline, run)
        if other:
            return Verdict(rule, NOT_COMPARABLE, note=other)
    window_b, window_r = rule.values(series_b), rule.values(series_r)
    counts = (len(window_b), len(window_r))
    sample_b, sample_r = _noise_sample(rule, series_b, window_b), _noise_sample(rule, series_r, window_r)
    diverged = [note for note in (_non_finite(rule, "baseline", baseline, {**window_b, **sample_b}),
                                  _non_finite(rule, "run", run, {**window_r, **sample_r})) if note]
    lacking, notes = (None, []) if not series_b else _coverage(rule, series_b, series_r, set(window_b), set(window_r))
    if diverged or (lacking and not allow_missing):
        judged = "each run's last step judged" if rule.window is None else "judged on the steps both runs have"
        fix = [f"with --allow-missing a note, {judged}"] if lacking and not diverged else []
        return Verdict(rule, FAIL, _finite(rule, window_b), _finite(rule, window_r), steps=counts,
                       note="; ".join(diverged + ([lacking] if lacking else []) + fix + notes))
    if lacking:
        notes.insert(0, lacking)
    if rule.window is not None and set(window_b) != set(window_r):
        common = set(window_b) & set(window_r)
        window_b = {s: v for s, v in window_b.items() if s in common}
        window_r = {s: v for s, v in window_r.items() if s in common}
        sample_b, sample_r = window_b, window_r
        if common:
            notes.append(f"judged on the {len(common)} step(s) both runs have")
    if not window_b or not window_r:
        if not lacking:
            notes.insert(0, _nothing_shared(rule, baseline, run, counts))
        return Verdict(rule, MISSING, steps=counts, note="; ".join(notes))
    return _judged(rule, window_b, window_r, noise_of(sample_b), noise_of(sample_r), counts, notes)


def _other_ranks(baseline: Run, run: Run) -> str | None:
    """Why two runs' sleep-memory figures cannot be compared (a worst rank of different sets of ranks), or None."""
    ranks_b, ranks_r = baseline.metric(RANKS_METRIC), run.metric(RANKS_METRIC)
    if not ranks_b or not ranks_r:
        return None
    last_b, last_r = ranks_b[max(ranks_b)], ranks_r[max(ranks_r)]
    if last_b == last_r:
        return None
    return (f"cannot compare: the baseline's figure is the worst of {last_b:g} rollout rank(s), the run's of "
            f"{last_r:g} ({RANKS_METRIC}); compare runs of the same layout (an older verl-ascend-ext read one node's "
            "ranks only)")


def _nothing_shared(rule: Rule, baseline: Run, run: Run, counts: tuple[int, int]) -> str:
    if not counts[0] and not counts[1]:
        return (f"neither run has a value of {rule.metric} in {rule.window_text} (baseline {baseline.span}; run "
                f"{run.span}): nothing compared")
    if not counts[0]:
        return (f"baseline has no value of {rule.metric} in {rule.window_text}, the run has {counts[1]}: nothing to "
                "compare against")
    if not counts[1]:
        return f"run has no value of {rule.metric} in {rule.window_text}: nothing compared"
    return f"the runs share no step of {rule.window_text} holding {rule.metric}: nothing compared"


def _finite(rule: Rule, window: dict[int, float]) -> float | None:
    """The window's statistic, or None when the window is empty or holds a non-finite value."""
    if not window or not all(math.isfinite(v) for v in window.values()):
        return None
    return rule.statistic_of(window)


def _judged(rule: Rule, window_b: dict[int, float], window_r: dict[int, float], noise_b: Noise, noise_r: Noise,
            counts: tuple[int, int], notes: list[str]) -> Verdict:
    base, value = rule.statistic_of(window_b), rule.statistic_of(window_r)
    low, high = rule.bound.limits(base)
    within = (low is None or value >= low) and (high is None or value <= high)
    threshold = _threshold(rule, noise_b, noise_r, len(window_b), len(window_r))
    beyond_noise = threshold is None or abs(value - base) > threshold
    if within:
        verdict = MOVED if threshold is not None and beyond_noise and value != base else OK
    else:
        verdict = FAIL if beyond_noise else NOISE
    return Verdict(rule, verdict, base, value, (low, high), threshold, counts,
                   "; ".join(_noise_notes(verdict, noise_b, noise_r) + notes))


def _noise_notes(verdict: str, noise_b: Noise, noise_r: Noise) -> list[str]:
    """What the verdict says of the noise: unknown, rough (few or gapped steps), or how it decided."""
    sides = (("baseline", noise_b), ("run", noise_r))
    gapped = "; second differences over evenly spaced steps only, a triple across an uneven gap skipped" if any(
        noise.gaps for _, noise in sides) else ""
    said = []
    if noise_b.sigma is None or noise_r.sigma is None:
        unknown = "; ".join(f"{side} {noise.told()}" for side, noise in sides if noise.sigma is None)
        said.append(f"noise unknown ({unknown}{gapped}; it needs {MIN_DIFFERENCES}): the bound alone decides")
    else:
        rough = "; ".join(f"{side} {noise.told()}" for side, noise in sides
                          if noise.gaps or noise.differences < FEW_DIFFERENCES)
        if rough:
            said.append(f"noise read from few or gapped steps ({rough}{gapped}): a rough estimate")
    if verdict == NOISE:
        said.insert(0, "beyond the bound but within the runs' own step-to-step noise")
    elif verdict == MOVED:
        said.insert(0, "within the bound, but beyond the runs' noise: a real shift")
    return said


def judge_all(rules: tuple[Rule, ...], baseline: Run, run: Run, allow_missing: bool = False) -> list[Verdict]:
    return [judge(rule, baseline, run, allow_missing) for rule in rules]
