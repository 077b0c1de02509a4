"""A job's watch: a process of the job lost mid-job is noticed within seconds, its death recorded, the job ended.

A training job is many processes waiting on each other (the driver on its TaskRunner, the trainer on the rollout,
a vLLM server on its EngineCore, ranks on each other's collectives). When one of them dies, the one waiting on it
may wait for ever: verl's waits are unbounded or bounded by a collective timeout of half an hour. Rather than bound
each wait (which would also fail a peer that is only slow), the job watches the liveness of its own processes: a
daemon thread in the process that drives training (verl's trainer: ``features.liveness``) reads, every
``INTERVAL`` seconds, the records of the job's processes on its host
(``records.reader``, unchanged files not parsed again) and checks each against ``/proc``. A process of the job that
is gone with no recorded end (SIGKILL, the OOM killer, a native crash), or that ended by a signal, an exception or
a non-zero exit, while the job runs, is lost: the watch records the death in its process's own record
(``seen_dead``: who, when it was seen, how), so that ``verl-ascend status`` knows when a process that left no word
died, and calls ``on_loss`` once. A process that runs is never failed, however slow it is (a slow or stalled
running process is left to the bounds that exist: the weight-sync barrier's, the collectives'). A stopped one
(``/proc`` state T: SIGSTOP, SIGTSTP, a tracer) cannot run at all until it is continued, and nothing else bounds the
wait on it: one stopped for ``stopped_limit`` seconds on end (``VERL_ASCEND_EXT_JOB_WATCH_STOPPED_TIMEOUT``, read by
the feature) is lost too, its notice saying how long it was stopped (``outcome.STOPPED``), dated when it was first
seen stopped. A process lost without a word is dated no later than a recorded end in the same look that its
death most likely caused (``date_silent_deaths``): a Ray actor killed outright has the actors it owns ended by
SIGTERM (Ray's fate sharing), a vLLM server its EngineCore's worker, and a vLLM worker killed outright has its
EngineCore exit 1, all before the look that sees the silent death; the process that died silently, not the one told
to end, failed first.

Which processes: the records that carry the job's id (``schema.JOB_ENV``, set by the driver at boot and carried to
every process it starts and every Ray worker), on this host, of the roles that do the job's work (Ray actors, vLLM
frontends, EngineCores, vLLM workers: ``outcome.works``); an idle pool worker of Ray, which never got an actor, is
Ray's to end.
Only the standard library is imported.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from verl_ascend_ext.runtime.records import identity
from verl_ascend_ext.runtime.records.outcome import (
    NO_WORD,
    STOPPED,
    ancestors,
    causal_key,
    clock,
    identity_of,
    label,
    works,
)
from verl_ascend_ext.runtime.records.reader import Cache, read_records
from verl_ascend_ext.runtime.records.schema import EXCEPTION, EXIT, SIGNAL

logger = logging.getLogger("verl_ascend_ext")

INTERVAL = 1.0  # seconds between two looks at the job's processes
RECENT = 5.0  # seconds before a look in which an end counts as part of it (a look, a record's write, a late write)


@dataclass(frozen=True)
class Loss:
    """A process of the job lost while the job ran: its record and the notice the watch recorded."""

    record: dict[str, Any]
    notice: dict[str, Any]

    def describe(self) -> str:
        rec = self.record
        return (f"{label(rec)} (host {rec.get('host')}, pid {rec.get('pid')}) {self.notice['how']}, "
                f"seen at {clock(self.notice['at'])}")


def how_lost(rec: dict[str, Any], alive: Callable[[int, int | None], bool] = identity.alive) -> str | None:
    """How a process of this host was lost, from its record and ``/proc``; None when it runs or ended well."""
    ended = rec.get("ended")
    if not ended:
        return None if alive(int(rec["pid"]), rec.get("proc_start")) else NO_WORD
    how, code = ended.get("how"), ended.get("code")
    if how == SIGNAL:
        return f"ended by {ended.get('signal')}"
    if how == EXCEPTION:
        return f"ended by exception {((ended.get('error') or [{}])[-1]).get('type')}"
    if how == EXIT and code not in (0, None):
        return f"ended with exit {code}"
    return None


def watched(rec: dict[str, Any], job: str, host: str) -> bool:
    """Whether ``rec`` is a process the watch of ``job`` on ``host`` looks after."""
    return rec.get("job") == job and rec.get("host") == host and int(rec.get("pid", 0)) != os.getpid() and works(rec)


def date_silent_deaths(losses: list[Loss], records: list[dict[str, Any]], now: float) -> None:
    """Date each silent death of one look (seen at the look's time, ``now``) no later than the recorded end it most
    likely caused. A process ended by a signal (the ends a record holds are requests to end: SIGTERM, SIGINT, SIGHUP)
    was told to end, by Ray when the owner of an actor died (fate sharing), by vLLM when a parent died: a reaction,
    so every silent death of the same look came no later than it. An ancestor's end by an error is one too (vLLM's
    EngineCore exits when a worker of it dies). A silent death is known only to lie between its last record and the
    look; the reaction, recorded in the same look, is the closer bound."""
    silent = {identity_of(loss.record): loss for loss in losses if loss.notice["how"] == NO_WORD}
    for loss in losses:
        ended = loss.record.get("ended") or {}
        if ended.get("at") is None or float(ended["at"]) < now - RECENT:
            continue
        if ended.get("how") == SIGNAL:
            caused_by = list(silent.values())
        else:
            caused_by = [silent[key] for rec in records if any(a is loss.record for a in ancestors(rec, records))
                         if (key := identity_of(rec)) in silent]
        for hit in caused_by:
            hit.notice["at"] = min(hit.notice["at"], float(ended["at"]))


class JobWatch:
    """The watch of ``job``'s processes on this host (see the module's docstring); ``on_loss`` is called once, from
    the watch's thread, with every loss found in the look that found the first, unless ``stop`` came first (the
    job's teardown began: its deaths are no losses)."""

    def __init__(self, job: str, base: str, on_loss: Callable[[list[Loss]], None], by: str,
                 interval: float = INTERVAL, stopped_limit: float | None = None) -> None:
        self.job, self.base, self.on_loss, self.by, self.interval = job, base, on_loss, by, interval
        self.stopped_limit = stopped_limit  # None: a stopped process is never lost
        self.stopped_since: dict[tuple[Any, Any], float] = {}  # (pid, start) -> when first seen stopped
        self.host = socket.gethostname()
        self.cache: Cache = {}
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def look(self) -> list[Loss]:
        """One look: the job's processes lost so far (each noticed once), first lost first."""
        records, _ = read_records(self.base, cache=self.cache)
        now = time.time()
        losses = []
        for rec in records:
            if not watched(rec, self.job, self.host):
                continue
            how = how_lost(rec)
            if how is not None:
                at = now if how == NO_WORD else float((rec.get("ended") or {}).get("at") or now)
            else:
                how, at = self._stopped_too_long(rec, now)
                if how is None:
                    continue
            notice = {"host": rec.get("host"), "pid": rec.get("pid"), "proc_start": rec.get("proc_start"),
                      "role": label(rec), "at": at, "how": how, "by": self.by}
            losses.append(Loss(rec, notice))
        job = [rec for rec in records if rec.get("job") == self.job]
        date_silent_deaths(losses, job, now)
        return sorted(losses, key=lambda loss: causal_key(loss.notice["at"], loss.record, job,
                                                          loss.notice["how"] == NO_WORD))

    def _stopped_too_long(self, rec: dict[str, Any], now: float) -> tuple[str | None, float]:
        """(how, since) for a running process stopped for ``stopped_limit`` seconds on end; (None, now) otherwise."""
        key = (rec.get("pid"), rec.get("proc_start"))
        if rec.get("ended") or not identity.stopped(int(rec["pid"]), rec.get("proc_start")):
            self.stopped_since.pop(key, None)
            return None, now
        since = self.stopped_since.setdefault(key, now)
        if self.stopped_limit is None or now - since < self.stopped_limit:
            return None, now
        return (f"{STOPPED} for {now - since:.0f} s (SIGSTOP, SIGTSTP or a tracer), the job watch's bound on a "
                f"stopped process being {self.stopped_limit:g} s"), since

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
                return
