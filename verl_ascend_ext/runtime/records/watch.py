"""A job's watch: a process of the job lost mid-job is noticed within seconds, its death recorded, the job ended.

A training job is many processes waiting on each other (the driver on its TaskRunner, the trainer on the rollout,
a vLLM server on its EngineCore, ranks on each other's collectives). When one of them dies, the one waiting on it
may wait for ever: verl's waits are unbounded or bounded by a collective timeout of half an hour. Rather than bound
each wait (which would also fail a peer that is only slow), the job watches the liveness of its own processes: a
daemon thread in the process that drives training (verl's trainer: ``features.job_watch``) reads, every
``INTERVAL`` seconds, the records of the job's processes on its host (``reader.read_shared``: the process's one read
of the directory, unchanged files not parsed again) and checks each against ``/proc``.

What is lost: a process of the job that failed (``ends.how_failed``: gone with no recorded end, as after SIGKILL, the
OOM killer or a native crash, or ended by a signal, an exception or a non-zero exit) while the job runs. Its death is
recorded in the watch's process's own record (``seen_dead``: who, when it was seen, how), so that ``verl-ascend
status`` knows when a process that left no word died, and ``on_loss`` is called once. A process that runs is never
failed, however slow it is (a slow or stalled running process is left to the bounds that exist: the weight-sync
barrier's, the collectives'). A stopped one (``/proc`` state T: SIGSTOP, SIGTSTP, a tracer) cannot run at all until
it is continued, and nothing else bounds the wait on it: one stopped for ``stopped_limit`` seconds on end
(``VERL_ASCEND_EXT_JOB_WATCH_STOPPED_TIMEOUT``, read by the feature) is lost too, its notice saying how long it was
stopped (``ends.STOPPED``), dated when it was first seen stopped.

What is the past: an end the job recorded before this watch began (``started``, the trainer's ``fit`` starting) is
no loss: a process that ended then, even by an error, is of an attempt before this one, or failed while the job was
being built, which the trainer's own calls to it have already met. A process gone without a word has no date (its
record may be as old as its boot): it is a loss whenever the watch finds it, the job being unable to go on without
it.

Dating along kinship (``date_silent_deaths``): a silent death is known only to lie between its last record and the
look that found it; a recorded end of a kin of it (``kinship``) in the same look that reacts to it is the closer
bound. An end by a signal is a request to end: Ray ends the actors an actor owned when it dies (fate sharing), vLLM
the children of a dead parent; so it dates the silent deaths of its forebears (parents and owners). An end by an
error is a waiter noticing: vLLM's EngineCore exits 1 when its worker dies, an owner's call on its dead actor fails;
so it dates the silent deaths of its descendants. The end of a process that is not kin dates nothing.

Which processes: the records that carry the job's id (``schema.JOB_ENV``, set by the driver at boot and carried to
every process it starts and every Ray worker), on this host, of the roles that do the job's work (Ray actors, vLLM
frontends, EngineCores, vLLM workers: ``outcome.does_job_work``); an idle pool worker of Ray, which never got an
actor, is Ray's to end. The other nodes of the job: a watch like this one on each, heard at every look (``far``:
``features.job_watch.far_nodes``). Only the standard library is imported.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from verl_ascend_ext.runtime.records import identity
from verl_ascend_ext.runtime.records.ends import NO_WORD, STOPPED, Failure, how_failed
from verl_ascend_ext.runtime.records.kinship import Kinship
from verl_ascend_ext.runtime.records.outcome import causal_key, does_job_work, format_time, label
from verl_ascend_ext.runtime.records.reader import read_shared
from verl_ascend_ext.runtime.records.schema import EXIT, SIGNAL

logger = logging.getLogger("verl_ascend_ext")

INTERVAL = 1.0  # seconds between two looks at the job's processes
OWNERS_TIMEOUT = 2.0  # seconds a look waits for Ray's actor table (the owners of actors) before dating without it
END_IN_LOOK_S = 5.0  # s before a look in which a recorded end counts as part of it (a look, a record's write, a delay)


@dataclass(frozen=True)
class Loss:
    """A process of the job lost while the job ran: its record, how it failed, and the notice the watch recorded."""

    record: dict[str, Any]
    notice: dict[str, Any]
    failure: Failure

    def describe(self) -> str:
        rec = self.record
        return (f"{label(rec)} (host {rec.get('host')}, pid {rec.get('pid')}) {self.notice['how']}, "
                f"seen at {format_time(self.notice['at'])}")


def loss_words(failure: Failure) -> str:
    """How the watch words a loss in its notice: ``ended by SIGTERM``, ``ended by exception ValueError``, ``ended
    with exit 1``, ``ended without a word``, or how long the process was stopped."""
    if failure.kind == EXIT:
        return f"ended with {failure.what}"
    return f"ended by {failure.what}" if failure.recorded else failure.what


def is_watched(rec: dict[str, Any], job: str, host: str) -> bool:
    """Whether ``rec`` is a process the watch of ``job`` on ``host`` looks after."""
    return (rec.get("job") == job and rec.get("host") == host and int(rec.get("pid", 0)) != os.getpid()
            and does_job_work(rec))


def date_silent_deaths(losses: list[Loss], records: list[dict[str, Any]], now: float,
                       owners: Callable[[], Mapping[str, str]] = dict) -> None:
    """Date each silent death of one look (seen at the look's time, ``now``) no later than a recorded end of the same
    look that reacts to it: an end by a signal of a process it started or owned (a forebear's death ends its
    children and owned actors), an end by an error of a process that started or owns it (a waiter noticing). Never
    by the end of a process that is not its kin (see the module's docstring). ``owners`` gives Ray's owner links
    (actor id -> owner's actor id), asked only when the look holds both a silent death and a recorded end."""
    silent = [loss for loss in losses if loss.failure.kind == NO_WORD]
    ends = [loss for loss in losses
            if loss.failure.recorded and loss.failure.at is not None and float(loss.failure.at) >= now - END_IN_LOOK_S]
    if not silent or not ends:
        return
    kin = Kinship(records, owners())
    for loss in ends:
        end = loss.failure
        if end.kind == SIGNAL:
            reacted_to = [hit for hit in silent if kin.descends(loss.record, hit.record)]
        else:
            reacted_to = [hit for hit in silent if kin.descends(hit.record, loss.record)]
        for hit in reacted_to:
            hit.notice["at"] = min(hit.notice["at"], float(end.at))


class JobWatch:
    """The watch of ``job``'s processes on this host (see the module's docstring); ``on_loss`` is called once, from
    the watch's thread, with every loss found in the look that found the first, unless ``stop`` came first (the
    job's teardown began: its deaths are no losses). ``now``: the clock of the looks and of the notices' times;
    ``started``: when the watch began (default: now), the end of the past; ``owners``: Ray's owner links, actor id ->
    owner's actor id (default: Ray's actor table, read only when a look needs it, ``OWNERS_TIMEOUT``); ``far``: what
    the watches of the job's other nodes found, asked at each look (None: this host only); ``each_look``: called with
    the time after each look that found no loss (the stuck check)."""

    def __init__(self, job: str, base: str, on_loss: Callable[[list[Loss]], None], by: str,
                 interval: float = INTERVAL, stopped_limit: float | None = None,
                 now: Callable[[], float] = time.time, started: float | None = None,
                 owners: Callable[[], Mapping[str, str]] | None = None,
                 far: Callable[[], list[Loss]] | None = None,
                 each_look: Callable[[float], None] | None = None, keep_looking: bool = False) -> None:
        self.job, self.base, self.on_loss, self.by, self.interval = job, base, on_loss, by, interval
        self.far = far  # the losses the watches of the job's other nodes found (``features.job_watch.far_nodes``)
        self.each_look = each_look  # called after each look that found no loss, with its time (the stuck check)
        self.keep_looking = keep_looking  # after a loss: look on (a node's watch), on_loss getting each look's all
        self.first_seen: dict[tuple[Any, Any, Any], float] = {}  # a silent death -> when a look first found it
        self.stopped_limit = stopped_limit  # None: a stopped process is never lost
        self.stopped_since: dict[tuple[Any, Any], float] = {}  # (pid, start) -> when first seen stopped
        self.now = now
        self.started = now() if started is None else started
        self.owners = owners or (lambda: identity.ray_actor_owners(OWNERS_TIMEOUT))
        self.host = socket.gethostname()
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def look(self) -> list[Loss]:
        """One look: the job's processes lost so far, first lost first (a silent death dated by the look that first
        found it, or the closer bound its kin's end gives: ``date_silent_deaths``)."""
        records, _ = read_shared(self.base, max_age=self.interval)
        now = self.now()
        losses = []
        for rec in records:
            if not is_watched(rec, self.job, self.host):
                continue
            failure = self._failure(rec, now)
            if failure is None:
                continue
            key = (rec.get("host"), rec.get("pid"), rec.get("proc_start"))
            at = self.first_seen.setdefault(key, now) if failure.at is None else float(failure.at)
            notice = {"host": rec.get("host"), "pid": rec.get("pid"), "proc_start": rec.get("proc_start"),
                      "role": label(rec), "at": at, "how": loss_words(failure), "by": self.by}
            losses.append(Loss(rec, notice, failure))
        job = [rec for rec in records if rec.get("job") == self.job]
        date_silent_deaths(losses, job, now, self.owners)
        if self.far is not None:
            here = {(loss.notice["host"], loss.notice["pid"], loss.notice["proc_start"]) for loss in losses}
            losses += [loss for loss in self.far()
                       if (loss.notice["host"], loss.notice["pid"], loss.notice["proc_start"]) not in here]
        return sorted(losses, key=lambda loss: causal_key(loss.notice["at"], loss.record, job,
                                                          loss.failure.kind == NO_WORD))

    def _failure(self, rec: dict[str, Any], now: float) -> Failure | None:
        """How ``rec``'s process is lost at this look (``ends.how_failed``, or stopped too long), or None: it runs,
        ended well, or ended before the watch began."""
        alive = None if rec.get("ended") else identity.alive(int(rec["pid"]), rec.get("proc_start"))
        failure = how_failed(rec, alive)
        if failure is None:
            return self._stopped_too_long(rec, now)
        if failure.recorded and failure.at is not None and float(failure.at) < self.started:
            return None
        return failure

    def _stopped_too_long(self, rec: dict[str, Any], now: float) -> Failure | None:
        """A running process stopped for ``stopped_limit`` seconds on end, dated when first seen stopped; else None."""
        key = (rec.get("pid"), rec.get("proc_start"))
        if rec.get("ended") or not identity.stopped(int(rec["pid"]), rec.get("proc_start")):
            self.stopped_since.pop(key, None)
            return None
        since = self.stopped_since.setdefault(key, now)
        if self.stopped_limit is None or now - since < self.stopped_limit:
            return None
        return Failure(STOPPED, f"{STOPPED} for {now - since:.0f} s (SIGSTOP, SIGTSTP or a tracer), the job watch's "
                                f"bound on a stopped process being {self.stopped_limit:g} s", since)

    def start(self) -> JobWatch:
        self.thread = threading.Thread(target=self._run, name="verl-ascend-ext-job-watch", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()

    def _run(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                losses = self.look()
            except OSError as err:  # the status directory went away or turned unreadable: nothing left to watch
                logger.warning("verl-ascend-ext: the job watch stopped: %s: %s", type(err).__name__, err)
                return
            if self.stopped.is_set():  # after the look: what it found was lost before the job's end began
                return
            if losses:
                self.on_loss(losses)
                if not self.keep_looking:
                    return
                continue
            if self.each_look is not None:
                self.each_look(self.now())
