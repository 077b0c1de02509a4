"""The sleep-memory feature's patch ids, for its patch code: the declaration imports pluggy (through the hook specs),
which the patch code must not load."""

from __future__ import annotations

ASCEND_ID = "sleep-memory-ascend"  # vLLM-Ascend's NPUWorker.sleep
CUDA_ID = "sleep-memory-cuda"  # vLLM's GPU worker's sleep
CPU_ID = "sleep-memory-cpu"  # vLLM-CPU's worker: its sleep is a no-op; the host-side figure is read
METRIC_ID = "sleep-memory-metric"  # verl's Tracking.log: the figures into the step's metrics
