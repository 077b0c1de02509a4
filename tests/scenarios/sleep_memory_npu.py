"""Scenario: vLLM-Ascend 0.23.0's released ``NPUWorker.sleep``, measured by the ``sleep-memory-ascend`` record (run in
a fresh interpreter).

Real: the released ``NPUWorker.sleep`` (its definition compiled from the cached wheel's ``worker.py`` by the stand-in
finder, ``verl_ascend_ext.testing.standin``, as the contract suite runs vLLM-Ascend), the plugin's boot, the engine
applying the record when the module is imported, and the record's patch code.
Simulated, TEST DOUBLES only (below): ``torch.npu.mem_get_info``, a 64 GiB device whose use is scripted per mode;
``CaMemAllocator`` (its ``sleep`` drops the device's use to what the script keeps); ``get_ascend_config`` (the
extra clean-up off); vLLM's ``logger`` (its lines kept, to compare the record's figures with vLLM-Ascend's own).
Modes, each cycle a wake-up (40 GiB of weights and KV cache back on top of what is kept) then ``sleep(level=1)``:
- ``leak``: vllm-ascend #9563, 240 MB (decimal) more kept after each cycle, from 0.70 GiB;
- ``flat``: 0.70 GiB kept after every sleep;
- ``creep``: 5 MiB more after each sleep, under the default bound (256 MiB of growth over the 12-sleep window);
- ``assert``: as ``leak``, but the third sleep releases nothing and 240 MB more is taken during it (vLLM's assert).
Usage: sleep_memory_npu.py <vllm-ascend source tree> <mode> <cycles>; prints one JSON object.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
import types
from typing import Any

import torch

TREE, MODE, CYCLES = sys.argv[1], sys.argv[2], int(sys.argv[3])
GIB = 1 << 30
TOTAL = 64 * GIB
AWAKE = 40 * GIB
STEP = {"leak": 240_000_000, "assert": 240_000_000, "flat": 0, "creep": 5 << 20}[MODE]
BASE = int(0.70 * GIB)


class DeviceDouble:
    """TEST DOUBLE of one NPU's memory: ``mem_get_info`` -> (free, total), the use set by the script below."""

    def __init__(self) -> None:
        self.in_use = 0

    def mem_get_info(self) -> tuple[int, int]:
        return TOTAL - self.in_use, TOTAL


DEVICE = DeviceDouble()
if hasattr(torch, "npu"):
    raise RuntimeError("torch.npu is already there: this scenario's device double refuses to shadow it")
torch.npu = types.SimpleNamespace(mem_get_info=DEVICE.mem_get_info)  # type: ignore[attr-defined]


def kept(cycle: int) -> int:
    return BASE + (cycle - 1) * STEP


class AllocatorDouble:
    """TEST DOUBLE of vLLM-Ascend's ``CaMemAllocator``: ``sleep`` releases all but what the script keeps."""

    cycle = 0

    @classmethod
    def get_instance(cls) -> AllocatorDouble:
        return cls()

    def sleep(self, offload_tags: tuple[str, ...] = ()) -> None:
        if MODE == "assert" and AllocatorDouble.cycle == 3:
            DEVICE.in_use += STEP  # nothing released, and more taken meanwhile
        else:
            DEVICE.in_use = kept(AllocatorDouble.cycle)


class LoggerDouble:
    """TEST DOUBLE of vLLM's logger: keeps the released code's lines."""

    lines: list[str] = []

    def info(self, fmt: str, *args: Any) -> None:
        self.lines.append(fmt % args)


warnings: list[dict[str, Any]] = []


class Kept(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        warnings.append({"cycle": AllocatorDouble.cycle, "text": record.getMessage()})


logging.getLogger("verl_ascend_ext.features.sleep_memory").addHandler(Kept(logging.WARNING))

sys.path.insert(0, TREE)  # the wheel's METADATA: the version the engine reads
importlib.invalidate_caches()
from verl_ascend_ext.testing.standin import install  # noqa: E402

install(TREE, ["vllm_ascend"])
from verl_ascend_ext.runtime.boot import activate  # noqa: E402

activate("api")
worker_module = importlib.import_module("vllm_ascend.worker.worker")  # the engine applies the record here
worker_module.torch = torch
worker_module.CaMemAllocator = AllocatorDouble
worker_module.get_ascend_config = importlib.import_module("vllm_ascend.ascend_config").get_ascend_config = (
    lambda: types.SimpleNamespace(enable_sleep_mode_extra_cleanup=False))
worker_module.logger = LoggerDouble()
worker_module.GiB_bytes = GIB

from verl_ascend_ext.features.sleep_memory import patch_code  # noqa: E402
from verl_ascend_ext.patching.status import acts_of, statuses  # noqa: E402

worker = object.__new__(worker_module.NPUWorker)
worker.rank, worker.local_rank = 0, 0
out: dict[str, Any] = {"status": statuses()["sleep-memory-ascend"].status.value,
                       "released_file": worker_module.NPUWorker.sleep.__code__.co_filename
                       if hasattr(worker_module.NPUWorker.sleep, "__code__") else None,
                       "error": None}
for cycle in range(1, CYCLES + 1):
    AllocatorDouble.cycle = cycle
    DEVICE.in_use = kept(cycle) + AWAKE if MODE != "assert" or cycle != 3 else kept(cycle - 1) + AWAKE
    try:
        worker.sleep(level=1)
    except Exception as err:  # the scenario reports what ended the cycle: the test asserts on it
        cause = err.__cause__
        out["error"] = {"cycle": cycle, "type": type(err).__name__, "message": str(err),
                        "cause": None if cause is None else f"{type(cause).__name__}: {cause}"}
        break
series = patch_code._series.get(0)
out["series"] = [] if series is None else series.sleeps
out["vllm_lines"] = LoggerDouble.lines
out["warnings"] = warnings
out["acts"] = acts_of("sleep-memory-ascend")
print(json.dumps(out))
