"""The sleep-memory feature's gate and settings (standard library only: the patch code in every rollout worker reads
them without loading the declaration's hook machinery). The trend rule they set is ``trend``'s; its defaults and why
are there and in docs/sleep-memory.md."""

from __future__ import annotations

from collections.abc import Mapping

from verl_ascend_ext.features.sleep_memory.trend import BOUND_MIB, MIB, MIN_WINDOW, WARMUP, WINDOW, Rule
from verl_ascend_ext.patching.gates import Gate, GateValueError, Setting, positive_mebibytes

GATE = Gate(
    "VERL_ASCEND_EXT_SLEEP_MEMORY",
    default=True,
    doc="Each rollout worker records the device memory it keeps after every sleep: verl's metrics get it each step "
    "(rollout/memory_in_use_after_sleep_gib), a rank whose figure keeps growing warns, and vLLM's bare \"Memory "
    "usage increased after sleeping.\" assert becomes an error naming the series and the fix.",
)
RETIRED = {"VERL_ASCEND_EXT_SLEEP_MEMORY_GROWTH_SLEEPS": "VERL_ASCEND_EXT_SLEEP_MEMORY_WINDOW"}  # old name -> new


def whole_sleeps(name: str, raw: str, least: int, example: int) -> int:
    """A whole number of sleeps >= ``least``; GateValueError naming ``name`` otherwise."""
    try:
        value = int(raw.strip())
    except ValueError:
        value = least - 1
    if value < least:
        raise GateValueError(f"{name}={raw!r} is not a whole number of sleeps of at least {least}. Set it to e.g. "
                             f"{example}, or unset {name} (or set it empty) for its default.")
    return value


def window_sleeps(name: str, raw: str) -> int:
    """The trend's window: a whole number of sleeps >= ``trend.MIN_WINDOW`` (``Setting.parse``)."""
    return whole_sleeps(name, raw, MIN_WINDOW, WINDOW)


def warmup_sleeps(name: str, raw: str) -> int:
    """The warm-up: a whole number of sleeps >= 1 (``Setting.parse``: the first sleep follows the first wake-up's
    allocations, never a leak's)."""
    return whole_sleeps(name, raw, 1, WARMUP)


WARMUP_SLEEPS = Setting(
    "VERL_ASCEND_EXT_SLEEP_MEMORY_WARMUP",
    default=WARMUP,
    doc="How many of a rollout worker's first sleeps the growth warning leaves out (default 2: vLLM-Ascend's own "
    "sleep/wake test skips 2 warm-up cycles before it measures growth; at least 1).",
    parse=warmup_sleeps,
    unit="sleeps",
)
WINDOW_SLEEPS = Setting(
    "VERL_ASCEND_EXT_SLEEP_MEMORY_WINDOW",
    default=WINDOW,
    doc="How many sleeps the growth warning's trend is read over (their running median of 3, a Theil-Sen slope of "
    "the window and of each half, a Spearman gate of 0.5; the same over 2 and 4 times as long for slower leaks). "
    f"Default {WINDOW}, at least {MIN_WINDOW}: no false alarm on 2000 seeded noise-only series, a 240 MB-a-cycle "
    "leak warned at sleep 16 (docs/sleep-memory.md). Replaces VERL_ASCEND_EXT_SLEEP_MEMORY_GROWTH_SLEEPS.",
    parse=window_sleeps,
    unit="sleeps",
)
GROWTH_MIB = Setting(
    "VERL_ASCEND_EXT_SLEEP_MEMORY_GROWTH_MIB",
    default=BOUND_MIB,
    doc="How much a rank's memory after sleep must grow over the window, by the trend's slope, for the warning "
    f"(default {BOUND_MIB:.0f} MiB: 6 standard deviations of that growth under 50 MiB of noise a sleep; over the "
    "long window about 1 GiB in 200 sleeps, compare's bound; vllm-ascend #9563 keeps ~240 MB more a cycle). A "
    "rank warns again only for a new leak, this much above the last one's peak.",
    parse=positive_mebibytes,
    unit="MiB",
)
SETTINGS = (WARMUP_SLEEPS, WINDOW_SLEEPS, GROWTH_MIB)


def rule(environ: Mapping[str, str] | None = None) -> Rule:
    """The trend rule the environment sets."""
    return Rule(WARMUP_SLEEPS.read(environ), WINDOW_SLEEPS.read(environ), GROWTH_MIB.read(environ) * MIB)
