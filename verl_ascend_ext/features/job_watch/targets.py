"""The job watch feature's patch ids, for its patch code: the declaration imports pluggy (through the hook specs),
which the patch code must not load."""

from __future__ import annotations

WATCH_ID = "job-watch"  # verl's v1 PPO trainer (hybrid mode, main_ppo's default)
WATCH_FULLY_ASYNC_ID = "job-watch-fully-async"  # the fully-async trainer

STUCK_MODES = ("error", "warn", "off")  # the first: the default


def stuck_mode(name: str, raw: str) -> str:
    """``VERL_ASCEND_EXT_JOB_STUCK``'s value: error, warn or off (``Setting.parse``)."""
    from verl_ascend_ext.patching.gates import one_of

    return one_of(name, raw, STUCK_MODES, "the stuck-job check",
                  "error (end a stuck job, naming where each process waited), warn (say it, with the stacks) or off")
