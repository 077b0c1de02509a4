"""What a rollout worker keeps after its sleeps: the series of one rank, its trend, the step's metrics read from the
job's records, and the messages (standard library only).

The trend: a rank whose memory in use after sleep grew at each of its last ``K`` sleeps, by more than ``bound`` bytes
over them, warns once. The defaults come from the anchors of the leak: vLLM-Ascend's own sleep/wake test allows free
memory to shrink by less than 0.05 GiB over its measured cycles (5 cycles, 2 of them warm-up: ``K`` = 3, ``bound`` =
50 MiB); vllm-ascend #9563 keeps ~240 MB more after each wake-up and warns at its third growing sleep with them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

GiB = float(1 << 30)
MiB = float(1 << 20)
ASSERT_TEXT = "Memory usage increased after sleeping."  # vLLM's and vLLM-Ascend's assert in the worker's sleep
METRIC = "rollout/memory_in_use_after_sleep_gib"  # max over the rollout ranks of what each keeps after its last sleep
GROWTH_METRIC = "rollout/memory_in_use_after_sleep_growth_gib"  # max over the ranks of (last - first sleep's)
FREED_METRIC = "rollout/memory_freed_by_sleep_gib"  # min over the ranks of what the last sleep freed
SHOWN = 8  # sleeps a message lists (the first and the newest)
CLEANUP_KEY = "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.enable_sleep_mode_extra_cleanup"
CLEANUP_OVERRIDE = f"++{CLEANUP_KEY}=True"
FIX = ("Fix: on vLLM-Ascend switch on its extra clean-up for RL, additional_config.enable_sleep_mode_extra_cleanup "
       f"(vllm-ascend #9585: 3.2 -> 0.7 GiB kept after sleep with expert parallel): {CLEANUP_OVERRIDE} (the "
       "recipes set it); keep the allocator's expandable segments on (`verl-ascend doctor` checks them); "
       "`verl-ascend status` and the step metric " + METRIC + " show the series.")


class SleepMemoryGrew(RuntimeError):
    """The device had more memory in use after the rollout worker's sleep than before it (vLLM's assert)."""


def gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


@dataclass
class Series:
    """One rank's sleeps, oldest first (``schema.SLEEP_FIELDS``), and whether its trend has warned."""

    who: str
    sleeps: list[dict[str, Any]] = field(default_factory=list)
    warned: bool = False

    def add(self, entry: Mapping[str, Any]) -> None:
        self.sleeps.append(dict(entry))

    def growth(self, k: int) -> float | None:
        """The growth over the last ``k`` sleeps when each of them kept more than the one before; else None."""
        if len(self.sleeps) <= k:
            return None
        kept = [s["in_use"] for s in self.sleeps[-(k + 1):]]
        if not all(b > a for a, b in pairwise(kept)):
            return None
        return float(kept[-1] - kept[0])

    def trend_warning(self, k: int, bound: float) -> str | None:
        """The warning, once per rank, when the last ``k`` sleeps each kept more, by more than ``bound`` bytes."""
        grown = None if self.warned else self.growth(k)
        if grown is None or grown <= bound:
            return None
        self.warned = True
        return (f"rollout {self.who} keeps more device memory after each sleep: +{gib(grown)} over its last {k} "
                f"sleeps, each more than the one before (bound {bound / MiB:.0f} MiB over {k} sleeps, "
                "VERL_ASCEND_EXT_SLEEP_MEMORY_GROWTH_MIB / _GROWTH_SLEEPS); in use after each sleep: "
                f"{self.text()}. At this rate the device runs out, or vLLM's \"{ASSERT_TEXT}\" assert ends the job "
                f"(verl #3902 died so at step 223). {FIX}")

    def grew_message(self, before_in_use: int) -> str:
        """The error replacing vLLM's bare assert: the sleep just added freed nothing (in use rose during it)."""
        last = self.sleeps[-1]
        return (f"rollout {self.who}: sleep {last['n']} (level {last['level']}) left more device memory in use "
                f"than before it ({gib(before_in_use)} -> {gib(last['in_use'])}, vLLM's \"{ASSERT_TEXT}\"); in "
                f"use after each sleep: {self.text()}. The device is not returned to the trainer. {FIX}")

    def text(self) -> str:
        shown = self.sleeps if len(self.sleeps) <= SHOWN else [self.sleeps[0], None, *self.sleeps[-(SHOWN - 2):]]
        return ", ".join("..." if s is None else f"#{s['n']} {gib(s['in_use'])}" for s in shown)


def step_metrics(records: Iterable[Mapping[str, Any]], job: str) -> dict[str, float]:
    """The step's metrics from the ``sleeps`` of the job's records (every rank that slept; none: empty)."""
    last: list[float] = []
    growth: list[float] = []
    freed: list[float] = []
    for rec in records:
        sleeps: Sequence[Mapping[str, Any]] = rec.get("sleeps") or ()
        if not sleeps or rec.get("job") != job:
            continue
        last.append(sleeps[-1]["in_use"] / GiB)
        growth.append((sleeps[-1]["in_use"] - sleeps[0]["in_use"]) / GiB)
        freed.append(sleeps[-1]["freed"] / GiB)
    if not last:
        return {}
    return {METRIC: max(last), GROWTH_METRIC: max(growth), FREED_METRIC: min(freed)}
