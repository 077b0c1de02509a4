"""Every metric at every step: a metric the run logs non-finite where the baseline never does fails, whatever the rules.

A rule reads its window (steps 5-14 by default): a run whose loss turns NaN at step 150 would pass them all. So
``compare`` also reads every metric the run logs, at every step it has it: a NaN, +-inf or a file logger's ``null``
(``runs.NULL``) is ``FAIL`` naming the metric, the value as written and the first such step, whether or not a rule
names the metric. It is not failed (a finding, with its note) when

- the baseline logs the metric non-finite somewhere itself (``baseline too``: a metric that is so in a healthy run,
  or a baseline that diverged as well; a rule reading such a value in its window still fails it), or
- ``--allow-nonfinite METRIC`` names it (``allowed``: a metric known to be so).

A metric the baseline does not log at all fails: nothing says it may be non-finite. A baseline file keeps only the
rules' metrics, so it also keeps which metrics its run logged non-finite (``baseline.write``, its ``nonfinite:``
line); a baseline file written before that says nothing of the others, and the note says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from verl_ascend_ext.tooling.compare.runs import NULL, Run, RunError, number

FAIL, ALLOWED, BASELINE_TOO = "FAIL", "allowed", "baseline too"


@dataclass(frozen=True)
class First:
    """Where a metric is first non-finite in one run: the step, the value as written there, and how many such steps
    among the ``logged`` steps holding the metric."""

    step: int
    written: str
    count: int
    logged: int

    def as_dict(self) -> dict[str, Any]:
        return {"step": self.step, "value": self.written, "count": self.count, "logged": self.logged}


@dataclass(frozen=True)
class Finding:
    """A metric the run logs non-finite, and what the check makes of it (``note`` says why)."""

    metric: str
    verdict: str  # FAIL, ALLOWED, BASELINE_TOO
    run: First
    baseline: First | None  # where the baseline is first non-finite, when it is
    baseline_side: str  # the baseline's side in a word or two: "nan at step 40", "finite (160 steps)", "not logged"
    note: str

    @property
    def name(self) -> str:
        """The name ``FAILED:`` lists it under, beside the rules' names."""
        return f"non-finite {self.metric}"

    @property
    def failed(self) -> bool:
        return self.verdict == FAIL

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.name, "metric": self.metric, "verdict": self.verdict, "run": self.run.as_dict(),
                "baseline": None if self.baseline is None else self.baseline.as_dict(),
                "baseline_side": self.baseline_side, "note": self.note}


def _non_finite(value: str | float) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    # a finite number as verl prints it (repr, pprint, numpy) holds neither word: most values skip the parse
    lowered = value.lower()
    if value != NULL and "nan" not in lowered and "inf" not in lowered:
        return False
    parsed = number(value)
    return parsed is not None and not math.isfinite(parsed)


def scan(run: Run) -> dict[str, First]:
    """metric -> where ``run`` first logs it non-finite, over every step it has (and, for a baseline file, what it
    kept of its own run's)."""
    bad: dict[str, list[int]] = {}
    logged: dict[str, int] = {}
    for step in sorted(run.raw):
        for metric, value in run.raw[step].items():
            logged[metric] = logged.get(metric, 0) + 1
            if _non_finite(value):
                bad.setdefault(metric, []).append(step)
    found = {metric: First(steps[0], str(run.raw[steps[0]][metric]), len(steps), logged[metric])
             for metric, steps in bad.items()}
    for metric, kept in (run.nonfinite or {}).items():
        found[metric] = First(int(kept["step"]), str(kept["value"]), int(kept["count"]), int(kept["logged"]))
    return found


def _baseline_side(baseline: Run, metric: str, base_first: First | None) -> tuple[str, str]:
    """(the baseline's side in a word or two, in a sentence) of a metric the run logs non-finite."""
    if base_first is not None:
        return (f"{base_first.written} at step {base_first.step}",
                f"the baseline's is non-finite too ({base_first.written} at step {base_first.step}, "
                f"{base_first.count} of {base_first.logged} step(s))")
    steps = sum(metric in values for values in baseline.raw.values())
    if steps:
        return f"finite ({steps} steps)", f"the baseline's is finite at all {steps} step(s) logging it"
    if baseline.nonfinite is not None:
        return "finite (its record)", "the baseline file's run never logged it non-finite"
    if baseline.kind == "baseline":
        return "unknown", ("the baseline file does not say whether its run logged it non-finite (written before it "
                           "kept that: write it again with --write-baseline)")
    return "not logged", "the baseline does not log it"


def _note(metric: str, verdict: str, first: First, baseline: str) -> str:
    how = " (verl's file logger writes NaN and inf as null)" if first.written == NULL else ""
    seen = (f"run's {metric} is {first.written}{how} at step {first.step}, the first of {first.count} non-finite "
            f"value(s) in the {first.logged} step(s) logging it")
    if verdict == ALLOWED:
        return f"{seen}: allowed (--allow-nonfinite {metric})"
    if verdict == BASELINE_TOO:
        return f"{seen}; {baseline}: not failed by the non-finite check"
    return (f"{seen}; {baseline}: a diverged run, whatever the rules' windows (--allow-nonfinite {metric} if it is "
            "known to be so)")


def check(baseline: Run, run: Run, allowed: tuple[str, ...] = ()) -> list[Finding]:
    """A finding per metric ``run`` logs non-finite, the earliest first (see the module docstring); RunError when
    ``allowed`` names a metric neither run logged (a typo must not pass as allowed)."""
    unknown = sorted(set(allowed) - baseline.metrics() - run.metrics() - set(baseline.nonfinite or {}))
    if unknown:
        known = sorted(baseline.metrics() | run.metrics())
        raise RunError(f"--allow-nonfinite names metric(s) neither run logged: {', '.join(unknown)}. Name a metric "
                       f"the runs log; known here: {', '.join(known[:40])}{' ...' if len(known) > 40 else ''}")
    in_baseline = scan(baseline)
    findings = []
    for metric, first in scan(run).items():
        base_first = in_baseline.get(metric)
        verdict = ALLOWED if metric in allowed else BASELINE_TOO if base_first is not None else FAIL
        side, said = _baseline_side(baseline, metric, base_first)
        findings.append(Finding(metric, verdict, first, base_first, side, _note(metric, verdict, first, said)))
    return sorted(findings, key=lambda finding: (finding.run.step, finding.metric))
