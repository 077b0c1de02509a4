"""What ``compare`` judges: rules of the field's usual form (metric, window, statistic, bound), defaults and a file.

The defaults are the anchors of verl's nightly Ascend CI (verl-ascend-recipe's ``baseline/check_npu.py``): the last
step's peak memory may grow by 1 GB; over steps 5-14, throughput may drop by 5 %, step time grow by 5 %, the reward
mean move by 0.05 either way, the rollout-vs-actor log-probability gap by 5 % either way. The plugin adds its own:
the same memory bound on the name verl 0.9's v1 trainer (``trainer.use_v1``, its default) logs the peak under
(``actor/perf/max_memory_allocated_gb``; the nightly's name is the legacy workers'), the rollout-vs-actor probability
correlation (a fix that stopped acting on the rollout shows there first), the distillation loss where the run
distils, and the rollout's memory after sleep and its wake-up time (the sleep-memory records). A default rule
whose metric neither run logged is reported as not logged.

A rules file (TOML) overrides a default of the same name or adds one::

    [[rule]]
    name = "throughput"          # a default's name replaces it; a new name adds a rule
    metric = "perf/throughput"
    window = [5, 14]             # steps, both included; or "last" (each run's last step)
    statistic = "mean"           # mean | median | max | min | last
    bound = "-5%"                # how far RUN may be from BASELINE: +x may grow by x, -x may drop by x, ±x either
                                 # way (also written +-x); x a number, or a percentage of the baseline's value

A metric the rules file names that neither run logged is an error (a typo must not pass as "not logged").
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path

STATISTICS = ("mean", "median", "max", "min", "last")
EXAMPLE = ('[[rule]] / name = "throughput" / metric = "perf/throughput" / window = [5, 14] / statistic = "mean" / '
           'bound = "-5%" (one key per line)')
BOUND = re.compile(r"^\s*(?P<sign>\+-|±|\+|-)\s*(?P<value>\d+(?:\.\d*)?|\.\d+)\s*(?P<percent>%?)\s*$")


class RulesError(ValueError):
    """A rules file that cannot be used (the message names the file, the rule and the fix)."""


@dataclass(frozen=True)
class Bound:
    """How far the run may be from the baseline: ``up`` / ``down`` allowed, absolute or a fraction of the baseline."""

    up: float | None  # None: no limit that way
    down: float | None
    relative: bool
    text: str

    @classmethod
    def parse(cls, text: str) -> Bound:
        found = BOUND.match(text)
        if found is None:
            raise ValueError(f"bound {text!r}: write +x, -x or ±x (+-x), x a number or a percentage (e.g. -5%, +1, "
                             "±0.05)")
        value = float(found["value"]) / (100 if found["percent"] else 1)
        sign = found["sign"]
        return cls(value if sign != "-" else None, value if sign != "+" else None, bool(found["percent"]),
                   text.strip().replace("+-", "±"))

    def limits(self, base: float) -> tuple[float | None, float | None]:
        """(lowest, highest) value allowed for the run when the baseline is ``base``."""
        scale = abs(base) if self.relative else 1.0
        return (None if self.down is None else base - self.down * scale,
                None if self.up is None else base + self.up * scale)


@dataclass(frozen=True)
class Rule:
    name: str
    metric: str
    window: tuple[int, int] | None  # None: each run's last step
    statistic: str
    bound: Bound
    default: bool = False  # a default rule: a metric neither run logged is "not logged", not an error

    @property
    def window_text(self) -> str:
        return "last step" if self.window is None else f"steps {self.window[0]}-{self.window[1]}"

    def values(self, series: dict[int, float]) -> dict[int, float]:
        """The run's values inside the window (the last step alone for a last-step rule)."""
        if not series:
            return {}
        if self.window is None:
            last = max(series)
            return {last: series[last]}
        return {s: v for s, v in series.items() if self.window[0] <= s <= self.window[1]}

    def statistic_of(self, values: dict[int, float]) -> float:
        ordered = [values[s] for s in sorted(values)]
        return {"mean": statistics.fmean, "median": statistics.median, "max": max, "min": min,
                "last": lambda v: v[-1]}[self.statistic](ordered)


def _rule(name: str, metric: str, window: tuple[int, int] | None, stat: str, bound: str) -> Rule:
    return Rule(name, metric, window, stat, Bound.parse(bound), default=True)


STEADY = (5, 14)  # check_npu.py: steps 5-14, after the warm-up steps
DEFAULT_RULES: tuple[Rule, ...] = (
    _rule("memory", "perf/max_memory_allocated_gb", None, "last", "+1"),
    _rule("actor memory", "actor/perf/max_memory_allocated_gb", None, "last", "+1"),
    _rule("throughput", "perf/throughput", STEADY, "mean", "-5%"),
    _rule("step time", "timing_s/step", STEADY, "mean", "+5%"),
    _rule("reward", "critic/score/mean", STEADY, "mean", "±0.05"),
    _rule("rollout-actor gap", "training/rollout_probs_diff_mean", STEADY, "mean", "±5%"),
    _rule("rollout-actor correlation", "training/rollout_actor_probs_pearson_corr", STEADY, "mean", "-0.05"),
    _rule("distillation loss", "actor/distillation/loss", STEADY, "mean", "±10%"),
    # what the rollout keeps on its device after sleep (the sleep-memory records): the same +1 GB as memory above
    _rule("rollout memory after sleep", "rollout/memory_in_use_after_sleep_gib", None, "last", "+1"),
    # what the rollout's wake-up takes (the wake-up-time records): a first bound, not yet measured on a device
    _rule("rollout wake-up", "rollout/wake_up_s", STEADY, "mean", "+20%"),
)


def load_rules(path: str | Path | None) -> tuple[Rule, ...]:
    """The default rules, overridden and extended by the rules file ``path`` (when given)."""
    rules = {rule.name: rule for rule in DEFAULT_RULES}
    if path is None:
        return tuple(rules.values())
    import tomllib

    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise RulesError(f"rules file {path}: {err}. Write it as TOML with one [[rule]] table per rule (see "
                         "`verl-ascend compare --help`).") from err
    entries = data.get("rule")
    if not isinstance(entries, list) or not entries:
        raise RulesError(f"rules file {path}: no [[rule]] table in it. Write one [[rule]] table per rule, e.g. "
                         f"{EXAMPLE}")
    for index, entry in enumerate(entries, 1):
        rule = _from_table(path, index, entry)
        rules[rule.name] = rule
    return tuple(rules.values())


def _from_table(path: str | Path, index: int, entry: object) -> Rule:
    where = f"rules file {path}, rule {index}"
    if not isinstance(entry, dict):
        raise RulesError(f"{where}: not a table ({entry!r}). Write each rule as a [[rule]] table of keys, not a "
                         f"value of `rule = ...`, e.g. {EXAMPLE}")
    unknown = sorted(set(entry) - {"name", "metric", "window", "statistic", "bound"})
    missing = sorted({"metric", "bound"} - set(entry))
    problems = []
    if unknown:
        problems.append(f"unknown key(s) {', '.join(unknown)}")
    if missing:
        problems.append(f"missing {', '.join(missing)}")
    if problems:
        raise RulesError(f"{where}: {'; '.join(problems)}. A rule's keys: metric and bound (needed), name, window, "
                         f"statistic, e.g. {EXAMPLE}")
    window = entry.get("window", list(STEADY))
    if window == "last":
        window = None
    elif (not isinstance(window, list) or len(window) != 2 or not all(isinstance(w, int) for w in window)
          or window[0] > window[1]):
        raise RulesError(f"{where}: window {window!r}: write [first, last] (steps, both included, first <= last), "
                         'e.g. window = [5, 14], or window = "last"')
    statistic = entry.get("statistic", "last" if window is None else "mean")
    if statistic not in STATISTICS:
        raise RulesError(f"{where}: statistic {statistic!r}: write one of {', '.join(STATISTICS)}, e.g. "
                         'statistic = "mean"')
    try:
        bound = Bound.parse(str(entry["bound"]))
    except ValueError as err:
        raise RulesError(f"{where}: {err}") from err
    metric = str(entry["metric"])
    return Rule(str(entry.get("name", metric)), metric, None if window is None else (window[0], window[1]), statistic,
                bound)
