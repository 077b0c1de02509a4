"""What a rollout worker keeps after its sleeps: the series of one rank, its warnings, the step's metrics read from
the job's records, and the messages (standard library only).

A rank keeps in memory only what its trend and its messages read: its first sleep and its newest ones (``Series``,
bounded); the long history is the process's record's (``recorder.slept``: the first and the newest 255). The trend
rule, its defaults and why are ``trend``'s. A host meter's readings (vLLM-CPU) are named host resident memory, in the
warnings and in metrics of their own, never device memory.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_ascend_ext.features.sleep_memory.meters import DEVICE_MEMORY, HOST_MEMORY, is_host, measures
from verl_ascend_ext.features.sleep_memory.trend import SCALES, Rule, Trend, Watch

GiB = float(1 << 30)
MiB = float(1 << 20)
ASSERT_TEXT = "Memory usage increased after sleeping."  # vLLM's and vLLM-Ascend's assert in the worker's sleep
METRIC = "rollout/memory_in_use_after_sleep_gib"  # max over the rollout ranks of what each keeps after its last sleep
GROWTH_METRIC = "rollout/memory_in_use_after_sleep_growth_gib"  # max over the ranks of (last - first sleep's)
FREED_METRIC = "rollout/memory_freed_by_sleep_gib"  # min over the ranks of what the last sleep freed
HOST_METRIC = "rollout/host_resident_memory_after_sleep_gib"  # the same three of the host meter's ranks (vLLM-CPU)
HOST_GROWTH_METRIC = "rollout/host_resident_memory_after_sleep_growth_gib"
HOST_FREED_METRIC = "rollout/host_resident_memory_freed_by_sleep_gib"
RANKS_METRIC = "rollout/sleep_memory_ranks"  # how many rollout ranks the step's figures cover (every node's)
WAKE_METRIC = "rollout/wake_up_s"  # max over the ranks of the seconds the wake-ups before their last sleep took
METRICS = {DEVICE_MEMORY: (METRIC, GROWTH_METRIC, FREED_METRIC),
           HOST_MEMORY: (HOST_METRIC, HOST_GROWTH_METRIC, HOST_FREED_METRIC)}
SHOWN = 8  # sleeps a message lists (the first and the newest)
CLEANUP_KEY = "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.enable_sleep_mode_extra_cleanup"
CLEANUP_OVERRIDE = f"++{CLEANUP_KEY}=True"
FIX = ("Fix: on vLLM-Ascend switch on its extra clean-up for RL, additional_config.enable_sleep_mode_extra_cleanup "
       f"(vllm-ascend #9585: 3.2 -> 0.7 GiB kept after sleep with expert parallel): {CLEANUP_OVERRIDE} (the "
       "recipes set it); keep the allocator's expandable segments on (`verl-ascend doctor` checks them); "
       "`verl-ascend status` and the step metric " + METRIC + " show the series.")
HOST_NOTE = ("This is the worker process's resident memory on the host (vLLM-CPU: its sleep does nothing), not an "
             f"accelerator's; `verl-ascend status` and the step metric {HOST_METRIC} show the series.")
SETTINGS_NOTE = "VERL_ASCEND_EXT_SLEEP_MEMORY_GROWTH_MIB / _WINDOW / _WARMUP"


class SleepMemoryGrew(RuntimeError):
    """The device had more memory in use after the rollout worker's sleep than before it (vLLM's assert)."""


def gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


@dataclass
class Series:
    """One rank's sleeps (``schema.SLEEP_FIELDS``): how many, the first and the newest (what the trend and the
    messages read), and its warnings."""

    who: str
    rule: Rule = field(default_factory=Rule)
    count: int = 0
    first: dict[str, Any] | None = None
    newest: deque[dict[str, Any]] = field(init=False)
    watch: Watch = field(init=False)

    def __post_init__(self) -> None:
        self.newest = deque(maxlen=max(SHOWN, self.rule.warmup + max(SCALES) * self.rule.needs()))
        self.watch = Watch(self.rule)

    def add(self, entry: Mapping[str, Any]) -> None:
        kept = dict(entry)
        self.count += 1
        if self.first is None:
            self.first = kept
        self.newest.append(kept)

    @property
    def sleeps(self) -> list[dict[str, Any]]:
        """The sleeps kept, oldest first: the first, then the newest."""
        newest = list(self.newest)
        return newest if not newest or newest[0] is self.first else [self.first, *newest]

    @property
    def what(self) -> str:
        """What the readings are: device memory, or (a host meter's) host resident memory."""
        return measures(self.newest[-1]["meter"]) if self.newest else DEVICE_MEMORY

    def trend(self) -> Trend | None:
        """The trend when the rule warns at the newest sleep (``trend.Watch``: one warning a leak); else None."""
        readings = [s["in_use"] for s in self.newest if s["n"] > self.rule.warmup]
        return self.watch.check(readings)

    def trend_warning(self) -> str | None:
        """The warning when the rule warns at the newest sleep; else None."""
        trend = self.trend()
        if trend is None:
            return None
        rule, what = self.rule, self.what
        span = trend.scale * (rule.window + 2)
        tail = HOST_NOTE if what == HOST_MEMORY else (
            f"At this rate the device runs out, or vLLM's \"{ASSERT_TEXT}\" assert ends the job (verl #3902 died so "
            f"at step 223). {FIX}")
        return (f"rollout {self.who} keeps more {what} after its sleeps: +{trend.slope / MiB:.0f} MiB a sleep over "
                f"its last {span} sleeps after {rule.warmup} warm-up ones (Theil-Sen slope of their running median, "
                f"rank correlation {trend.rho:.2f}): +{gib(trend.growth)} in {trend.scale * (rule.window - 1)} sleeps "
                f"(the warning's bound: +{rule.bound / MiB:.0f} MiB; {SETTINGS_NOTE}); {what} in use after each sleep: "
                f"{self.text()}. {tail}")

    def grew_message(self, before_in_use: int) -> str:
        """The error replacing vLLM's bare assert: the sleep just added freed nothing (in use rose during it)."""
        last = self.newest[-1]
        return (f"rollout {self.who}: sleep {last['n']} (level {last['level']}) left more {self.what} in use "
                f"than before it ({gib(before_in_use)} -> {gib(last['in_use'])}, vLLM's \"{ASSERT_TEXT}\"); in "
                f"use after each sleep: {self.text()}. The device is not returned to the trainer. {FIX}")

    def text(self) -> str:
        sleeps = self.sleeps
        shown = sleeps if len(sleeps) <= SHOWN else [sleeps[0], None, *sleeps[-(SHOWN - 2):]]
        return ", ".join("..." if s is None else f"#{s['n']} {gib(s['in_use'])}" for s in shown)


def step_metrics(records: Iterable[Mapping[str, Any]], job: str) -> dict[str, float]:
    """The step's metrics from the ``sleeps`` of the job's records (every rank that slept; none: empty): ``METRIC``
    and the rest of device meters, ``HOST_METRIC`` and the rest of host meters; ``RANKS_METRIC``: how many ranks they
    cover; ``WAKE_METRIC`` of every meter (time,
    not memory): the slowest rank's wake-ups before its last sleep (ranks whose last sleep has no ``woke_s`` left
    out; none: absent)."""
    ranks: dict[str, list[Sequence[Mapping[str, Any]]]] = {DEVICE_MEMORY: [], HOST_MEMORY: []}
    for rec in records:
        sleeps: Sequence[Mapping[str, Any]] = rec.get("sleeps") or ()
        if sleeps and rec.get("job") == job:
            ranks[HOST_MEMORY if is_host(sleeps[-1]["meter"]) else DEVICE_MEMORY].append(sleeps)
    out = {}
    for what, kept in ranks.items():
        if kept:
            last, growth, freed = METRICS[what]
            out[last] = max(s[-1]["in_use"] / GiB for s in kept)
            out[growth] = max((s[-1]["in_use"] - s[0]["in_use"]) / GiB for s in kept)
            out[freed] = min(s[-1]["freed"] / GiB for s in kept)
    if any(ranks.values()):
        out[RANKS_METRIC] = float(sum(len(kept) for kept in ranks.values()))
    woke = [s[-1].get("woke_s") for kept in ranks.values() for s in kept]
    timed = [float(w) for w in woke if w is not None]
    if timed:
        out[WAKE_METRIC] = max(timed)
    return out
