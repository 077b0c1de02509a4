"""The job watch feature's patch ids, for its patch code: the declaration imports pluggy (through the hook specs),
which the patch code must not load."""

from __future__ import annotations

WATCH_ID = "job-watch"  # verl's v1 PPO trainer (hybrid mode, main_ppo's default)
WATCH_FULLY_ASYNC_ID = "job-watch-fully-async"  # the fully-async trainer
