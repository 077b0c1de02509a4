"""The sleep-memory feature's gate and settings (standard library only: the patch code in every rollout worker reads
them without loading the declaration's hook machinery)."""

from __future__ import annotations

from verl_ascend_ext.patching.gates import Gate, GateValueError, Setting, positive_mebibytes

GATE = Gate(
    "VERL_ASCEND_EXT_SLEEP_MEMORY",
    default=True,
    doc="Each rollout worker records the device memory it keeps after every sleep: verl's metrics get it each step "
    "(rollout/memory_in_use_after_sleep_gib), a rank whose figure keeps growing warns, and vLLM's bare \"Memory "
    "usage increased after sleeping.\" assert becomes an error naming the series and the fix.",
)


def sleeps_count(name: str, raw: str) -> int:
    """A whole number of sleeps >= 1 (``Setting.parse``); GateValueError naming ``name`` otherwise."""
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if value < 1:
        raise GateValueError(f"{name}={raw!r} is not a whole number of sleeps of at least 1. Set it to e.g. 3, or "
                             f"unset {name} (or set it empty) for its default.")
    return value


GROWTH_SLEEPS = Setting(
    "VERL_ASCEND_EXT_SLEEP_MEMORY_GROWTH_SLEEPS",
    default=3,
    doc="How many sleeps in a row must each keep more device memory than the one before for a rank to warn "
    "(default 3: vLLM-Ascend's sleep/wake test measures 3 cycles after 2 warm-up ones).",
    parse=sleeps_count,
    unit="sleeps",
)
GROWTH_MIB = Setting(
    "VERL_ASCEND_EXT_SLEEP_MEMORY_GROWTH_MIB",
    default=50.0,
    doc="How much those sleeps must have grown in all for the warning (default 50 MiB: vLLM-Ascend's test allows "
    "free memory to shrink by less than 0.05 GiB over its cycles; vllm-ascend #9563 keeps ~240 MB more per cycle).",
    parse=positive_mebibytes,
    unit="MiB",
)
