"""The trend rule of what a rank keeps after its sleeps: is it leaking? (standard library only: it runs in every vLLM
worker process, where numpy or scipy must not be loaded for it.)

A rank's first ``warmup`` sleeps are left out. Its window is its newest ``window`` points, each the running median of
3 readings (one sleep's spike is gone), and the rule fires when
- the Theil-Sen slope of the window (the median of the slopes between every two of its points: robust to outliers)
  gives a growth over the window of at least ``bound`` bytes,
- the Theil-Sen slope of each half of the window alone gives as much (the growth goes on through the window: a
  warm-up that has levelled off, a single allocation that stays, are one jump, not a leak), and
- the Spearman rank correlation of the points with their order is at least ``MIN_RHO`` (most of the window rises).
The same rule reads windows 2 and 4 times as long (``SCALES``: each point the running median of 6 readings, every
2nd sleep; of 12, every 4th), so slower leaks and stairs further apart warn too, later (by default from ~6 MiB a
sleep: 256 MiB over 44 sleeps). A leak that grows on average fires whether or not it grows at every sleep (+300/-50
MiB alternating, +240 MB every other sleep, stairs); noise around a flat level, spikes and a warm-up that levels off
do not. ``Watch`` makes that one warning a leak.

The anchors: LF Edge EVE's memory-leak watcher (median-filtered samples, a Theil-Sen slope, a fit gate of Spearman
>= 0.50 or R^2 >= 0.40) and vLLM-Ascend's own sleep/wake test (2 warm-up cycles skipped before it measures).
docs/sleep-memory.md gives the defaults' reasons and the measured false-alarm and miss rates
(tests/test_sleep_trend.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from statistics import median

MIB = float(1 << 20)
WARMUP = 2  # sleeps skipped, as vLLM-Ascend's test_no_npu_memory_growth_over_5_cycles skips 2 warm-up cycles
WINDOW = 12  # smoothed sleeps the slope is read over
MIN_WINDOW = 6  # fewer points give each half's slope and the rank correlation too little to read
BOUND_MIB = 256.0  # the least growth over the window, by the slope, that warns
MIN_RHO = 0.5  # EVE's Spearman gate
SCALES = (1, 2, 4)  # readings a point of the window stands for: the longer windows read slower leaks


def smoothed(values: Sequence[float], scale: int = 1) -> list[float]:
    """The running median of ``3 * scale`` readings, a point every ``scale`` readings, the newest point ending at the
    newest reading (``scale`` 1: the median of each reading and its two neighbours)."""
    span = 3 * scale
    ends = range(len(values), span - 1, -scale)
    return [median(values[end - span:end]) for end in reversed(ends)]


def theil_sen(values: Sequence[float]) -> float:
    """The median of the slopes between every two points (x = 0, 1, 2...): change per step."""
    n = len(values)
    return median([(values[j] - values[i]) / (j - i) for i in range(n) for j in range(i + 1, n)])


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing the mean of their ranks."""
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for i in order[start:end + 1]:
            out[i] = (start + end) / 2 + 1
        start = end + 1
    return out


def spearman(values: Sequence[float]) -> float:
    """The rank correlation of ``values`` with their order (0 when they are all equal)."""
    ry = ranks(values)
    n = len(ry)
    mean = (n + 1) / 2
    sxy = sum((x + 1 - mean) * (y - mean) for x, y in enumerate(ry))
    sxx = sum((x + 1 - mean) ** 2 for x in range(n))
    syy = sum((y - mean) ** 2 for y in ry)
    return 0.0 if syy == 0 else sxy / (sxx * syy) ** 0.5


@dataclass(frozen=True)
class Trend:
    """The rule's reading of one window: its scale (readings a point stands for), its points, the growth over it by
    its Theil-Sen slope, and whether the rule fires."""

    scale: int
    points: tuple[float, ...]
    growth: float
    fires: bool

    @property
    def slope(self) -> float:
        """Bytes a sleep."""
        return self.growth / (len(self.points) - 1) / self.scale

    @property
    def rho(self) -> float:
        return spearman(self.points)


@dataclass(frozen=True)
class Rule:
    """The trend rule's parameters (``settings``: the environment's)."""

    warmup: int = WARMUP
    window: int = WINDOW
    bound: float = BOUND_MIB * MIB  # bytes

    def needs(self, scale: int = 1) -> int:
        """Readings after the warm-up the window of ``scale`` is smoothed from."""
        return scale * (self.window + 2)

    def assess(self, readings: Sequence[float], scale: int = 1) -> Trend | None:
        """The trend of the newest window of ``readings`` (a rank's, after its warm-up, oldest first) at ``scale``;
        None until there are enough of them."""
        if len(readings) < self.needs(scale):
            return None
        points = smoothed(readings[-self.needs(scale):], scale)
        span, half = len(points) - 1, len(points) // 2
        growth = theil_sen(points) * span
        fires = (growth >= self.bound
                 and min(theil_sen(points[:half]), theil_sen(points[half:])) * span >= self.bound
                 and spearman(points) >= MIN_RHO)
        return Trend(scale, tuple(points), growth, fires)


@dataclass
class Watch:
    """One rank's warnings: one a leak. A leak is over once the rule has not fired for a whole window; after that,
    the rank warns again when the rule fires at a level at least ``bound`` above the highest the last leak reached
    while the rule saw it (so a cache that grows to its cap, is emptied and grows again is no new leak)."""

    rule: Rule
    peak: float | None = None  # the highest level the rule fired at since the last warning (None: never warned)
    ended: bool = False  # the last leak is over
    quiet: int = 0  # sleeps in a row where the rule did not fire

    def check(self, readings: Sequence[float]) -> Trend | None:
        """The trend when it warns now (``readings``: the rank's after its warm-up, oldest first); else None."""
        trend = next((t for t in map(partial(self.rule.assess, readings), SCALES) if t is not None and t.fires), None)
        if trend is None:
            self.quiet += 1
            self.ended = self.ended or (self.peak is not None and self.quiet >= self.rule.window)
            return None
        self.quiet = 0
        level = median(readings[-3:])
        if self.peak is not None and not (self.ended and level >= self.peak + self.rule.bound):
            self.peak = max(self.peak, level)
            return None
        self.peak, self.ended = level, False
        return trend
