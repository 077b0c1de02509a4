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
On a job of several Ray nodes the trainer also hears a watch on each other node (``far_nodes``): what it finds
there ends the job the same way, and each node's records of the job are gathered here when the job ends or a loss
ends it. The watch needs every process's recorded end: with ``VERL_ASCEND_EXT_PROCESS_END=0`` it does not start,
and says so.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any

from verl_ascend_ext.features.job_watch.declaration import NODE_TIMEOUT, STOPPED_TIMEOUT, STUCK, STUCK_TIMEOUT
from verl_ascend_ext.features.job_watch.stuck_check import StuckCheck
from verl_ascend_ext.features.job_watch.targets import WATCH_FULLY_ASYNC_ID, WATCH_ID
from verl_ascend_ext.patching.status import acted, stood_down
from verl_ascend_ext.runtime.records import process_end, recorder, store
from verl_ascend_ext.runtime.records.ends import NO_WORD
from verl_ascend_ext.runtime.records.outcome import label
from verl_ascend_ext.runtime.records.watch import OWNERS_TIMEOUT, JobWatch, Loss

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


def end_job_on_loss(record_id: str, far: Any = None) -> Callable[[list[Loss]], None]:
    """The watch's ``on_loss``: record each death, gather the other nodes' records (``far``, a ``FarWatches``), say
    what was lost, end this process (exit 1)."""

    def end_the_job(losses: list[Loss]) -> None:
        if far is not None:  # the nodes' next look: what died with the first loss, dated by kinship
            losses = merged(losses, far.last(NEXT_LOOK_WAIT))
        for loss in losses:
            recorder.noticed(loss.notice)
        if far is not None:
            gather(far)
        acted(record_id)
        own = recorder.current_record()
        me = f"{label(own)} (pid {os.getpid()})" if own else f"pid {os.getpid()}"
        text = message(losses, me)
        logger.error("verl-ascend-ext: %s", text)
        print(f"JobProcessLost: {text}", file=sys.stderr, flush=True)
        process_end.exit_now(EXIT_CODE, JobProcessLost(text))

    return end_the_job


@contextmanager
def watching(record_id: str, progress: Callable[[], Hashable] = lambda: None) -> Iterator[None]:
    """The job's watch while the block runs (nothing where this process is of no job: ``recorder.job_id``);
    ``progress`` reads the trainer's step count (the stuck check: ``stuck_check``)."""
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
    started, stopped_limit, mode = time.time(), STOPPED_TIMEOUT.read(), STUCK.read()
    far = other_nodes(job, started, stopped_limit)
    check = None if mode == "off" else StuckCheck(record_id, mode, STUCK_TIMEOUT.read(), progress, job, started, far)
    watch = JobWatch(job, store.base_dir(), end_job_on_loss(record_id, far), by=f"the job watch of pid {os.getpid()}",
                     stopped_limit=stopped_limit, started=started, far=None if far is None else far.hear,
                     each_look=None if check is None else check.look).start()
    try:
        yield
    except BaseException:
        note_last_losses(watch, far)
        raise
    finally:
        watch.stop()
        recorder.teardown_began()
        if far is not None:
            gather(far, stop=True)


LAST_LOOK_WAIT = 2.0  # s the last look waits for the other nodes' answers when fit raises
NEXT_LOOK_WAIT = 1.5  # s a loss waits for the other nodes' next answers (their watches look every second)


def merged(first: list[Loss], later: list[Loss]) -> list[Loss]:
    """Losses of two rounds, one a process, first lost first: a process the same watch reported again is taken as
    the later round has it (dated again with more known); one another watch reported first stays as that one said
    (nodes sharing one status directory see each other's processes)."""
    def key(loss: Loss) -> tuple[Any, Any, Any]:
        return loss.notice["host"], loss.notice["pid"], loss.notice["proc_start"]

    if not later:
        return first
    out = {key(loss): loss for loss in first}
    out.update((key(loss), loss) for loss in later
               if key(loss) not in out or out[key(loss)].notice["by"] == loss.notice["by"])
    return sorted(out.values(), key=lambda loss: (loss.notice["at"], loss.failure.kind != NO_WORD))


def note_last_losses(watch: JobWatch, far: Any) -> None:
    """``fit`` is ending by an exception, which a lost process often causes before the watch's next look (vLLM's
    EngineCore fails its server's call when its worker dies): one last look, here and on every node, records each
    death found (``seen_dead``: ``status`` dates it and names it first) and says it; the exception goes on."""
    watch.stop()  # its thread's look in progress ends first: one looker at a time
    if watch.thread is not None:
        watch.thread.join(timeout=LAST_LOOK_WAIT + OWNERS_TIMEOUT)
    try:
        losses = merged(watch.look(), [] if far is None else far.last(LAST_LOOK_WAIT))
    except Exception as err:  # the last look is a courtesy to the post-mortem: fit's own exception is the news
        logger.warning("verl-ascend-ext: the job watch's last look failed: %s: %s", type(err).__name__, err)
        return
    for loss in losses:
        recorder.noticed(loss.notice)
    if losses:
        logger.error("verl-ascend-ext: the trainer's fit ends by an exception; lost before it: %s",
                     "; ".join(loss.describe() for loss in losses))


def gather(far: Any, stop: bool = False) -> None:
    """The other nodes' records of the job into this process's status directory (then their watches ended, with
    ``stop``); a failure is said at WARNING, never raised: it must not hide how ``fit`` ended, nor keep a loss from
    ending the job."""
    try:
        far.gather(store.base_dir())
        if stop:
            far.stop()
    except Exception as err:
        logger.warning("verl-ascend-ext: the other nodes' records were not gathered into %s: %s: %s. Read them on "
                       "each node (`verl-ascend status --ray` while the cluster runs).", store.base_dir(),
                       type(err).__name__, err)


def other_nodes(job: str, started: float, stopped_limit: float | None) -> Any:
    """The watches of the job's other nodes (``far_nodes.FarWatches``), where this process is connected to Ray and
    the cluster has other nodes that can take the job's workers; else None (said at WARNING when they could not
    start: the job trains, its other nodes unwatched)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    from verl_ascend_ext.features.job_watch.far_nodes import FarWatches

    try:
        far = FarWatches(ray, job, started, stopped_limit, NODE_TIMEOUT.read())
    except Exception as err:  # Ray's API refused: the trainer's own host is still watched
        logger.warning("verl-ascend-ext: the job watch on the other nodes did not start (%s: %s): a process lost "
                       "on another node is not noticed in this job. Fix: `verl-ascend doctor --ray`; report it with "
                       "this line.", type(err).__name__, err)
        return None
    return far if far.handles else None


def steps_of(trainer: Any) -> Callable[[], Hashable]:
    """The trainer's step count (``global_steps``: verl's v1 PPO trainer and the fully-async trainer keep it)."""
    return lambda: getattr(trainer, "global_steps", None)


def fit_watched(original: Any, *args: Any, **kwargs: Any) -> Any:
    """verl's v1 ``PPOTrainer.fit`` inside the job's watch."""
    with watching(WATCH_ID, steps_of(args[0] if args else None)):
        return original(*args, **kwargs)


async def fit_watched_async(original: Any, *args: Any, **kwargs: Any) -> Any:
    """verl's ``FullyAsyncTrainer.fit`` inside the job's watch."""
    with watching(WATCH_FULLY_ASYNC_ID, steps_of(args[0] if args else None)):
        return await original(*args, **kwargs)
