"""Replacement code of the job watch (imported only when the patch is applied: in the process that runs verl's
trainer, the TaskRunner in hybrid mode, the trainer's actor in fully-async mode).

``fit_watched`` / ``fit_watched_async`` run the trainer's ``fit`` inside the job's watch (``runtime.records.watch``),
which begins as ``fit`` does: an end the job's processes recorded before (an earlier attempt's, one while the job was
built) is the past, no loss. When ``fit`` returns or raises, the watch stops and the process records
``teardown``: deaths from then on (Ray ending the job's workers) are the teardown's, never losses. On a loss the
watch's thread records the death (``seen_dead``), says what was lost (``JobProcessLost:``, in this process's log,
which Ray forwards to the driver's) and ends this process at once with exit 1, its end recorded as an exit after
``JobProcessLost`` (``process_end.exit_now``): the driver's wait on it fails (Ray's ``ActorDiedError``) and the job
ends. It does not wait for the thread that runs ``fit``: that one is blocked on the lost process, which is the point.
The watch needs every process's recorded end: with ``VERL_ASCEND_EXT_PROCESS_END=0`` it does not start, and says so.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from verl_ascend_ext.features.job_watch.declaration import STOPPED_TIMEOUT
from verl_ascend_ext.features.job_watch.targets import WATCH_FULLY_ASYNC_ID, WATCH_ID
from verl_ascend_ext.patching.status import acted, stood_down
from verl_ascend_ext.runtime.records import process_end, recorder, store
from verl_ascend_ext.runtime.records.outcome import label
from verl_ascend_ext.runtime.records.watch import JobWatch, Loss

logger = logging.getLogger("verl_ascend_ext.features.job_watch")

PROCESS_ENDS_OFF = (f"{process_end.GATE.env}=0: no process records how it ended, so every process that exits (even "
                    "cleanly) would look lost")

EXIT_CODE = 1


class JobProcessLost(RuntimeError):
    """A process of the job was lost while the job trained (this process's end, recorded by the job watch)."""


def message(losses: list[Loss], me: str) -> str:
    first, rest = losses[0], losses[1:]
    text = (f"a process of this job was lost while it trained: {first.describe()} (noticed by {first.notice['by']}). "
            f"{me} ends the job here (exit 1): the processes waiting on it would wait for ever.")
    if rest:
        text += " Lost too: " + "; ".join(loss.describe() for loss in rest) + "."
    return text + (" Fix: read that process's log for its last lines (a SIGKILL leaves none: see the kernel's log, "
                   "e.g. the OOM killer's); `verl-ascend status` names what failed first. The last whole checkpoint "
                   "resumes.")


def end_job_on_loss(record_id: str) -> Callable[[list[Loss]], None]:
    """The watch's ``on_loss``: record each death, say what was lost, end this process (exit 1)."""

    def end_the_job(losses: list[Loss]) -> None:
        for loss in losses:
            recorder.noticed(loss.notice)
        acted(record_id)
        own = recorder.current_record()
        me = f"{label(own)} (pid {os.getpid()})" if own else f"pid {os.getpid()}"
        text = message(losses, me)
        logger.error("verl-ascend-ext: %s", text)
        print(f"JobProcessLost: {text}", file=sys.stderr, flush=True)
        process_end.exit_now(EXIT_CODE, JobProcessLost(text))

    return end_the_job


@contextmanager
def watching(record_id: str) -> Iterator[None]:
    """The job's watch while the block runs (nothing where this process is of no job: ``recorder.job_id``)."""
    job = recorder.job_id()
    if job is None:
        yield
        return
    if not process_end.GATE.read():
        stood_down(record_id, "not started: " + PROCESS_ENDS_OFF)
        logger.warning("verl-ascend-ext: the job watch did not start: %s. A lost process is not noticed in this job. "
                       "Fix: unset %s (or set %s=0 to say the watch is off on purpose).", PROCESS_ENDS_OFF,
                       process_end.GATE.env, "VERL_ASCEND_EXT_JOB_WATCH")
        yield
        return
    watch = JobWatch(job, store.base_dir(), end_job_on_loss(record_id), by=f"the job watch of pid {os.getpid()}",
                     stopped_limit=STOPPED_TIMEOUT.read()).start()
    try:
        yield
    finally:
        watch.stop()
        recorder.teardown_began()


def fit_watched(original: Any, *args: Any, **kwargs: Any) -> Any:
    """verl's v1 ``PPOTrainer.fit`` inside the job's watch."""
    with watching(WATCH_ID):
        return original(*args, **kwargs)


async def fit_watched_async(original: Any, *args: Any, **kwargs: Any) -> Any:
    """verl's ``FullyAsyncTrainer.fit`` inside the job's watch."""
    with watching(WATCH_FULLY_ASYNC_ID):
        return await original(*args, **kwargs)
