"""The job watch (``runtime.records.watch``, issues 48 and 62) on real processes of this host: its bound on a stopped
process (one stopped with SIGSTOP for the bound's seconds on end is lost, its notice dated when it was first seen
stopped; a shorter stop, or one continued before the bound, is not; ``verl-ascend status`` then names it first with
how long it was stopped), what is the past (an end recorded before the watch began is no loss), and the order of what
one look finds (a process killed outright comes before its kin that its death got ended, and only before its kin).

Real child processes (``sleep``) are stopped, continued or ended; their records are written where the watch reads
(the schema's factory, ``tests/records.py``). The watch's looks are driven one by one on a clock the test sets
(``JobWatch(now=...)``), so that no assertion rests on how fast a loaded machine runs a thread; one test runs the
watch's own thread, its bounds taken from the times it measured. In verl's own jobs the bound ends a hybrid and a
fully-async job over a stopped EngineCore, and a killed vLLM server is named before its EngineCore's worker
(``tests/engine/fault_matrix.py``'s ``stop:engine-core`` and ``actor:vLLMHttpServer`` cells); the watch ending those
jobs is ``tests/engine/test_job_watch.py``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from records import record, write_record

from verl_ascend_ext.runtime.records import identity
from verl_ascend_ext.runtime.records.outcome import outcome
from verl_ascend_ext.runtime.records.watch import JobWatch, Loss

JOB = "node-a-100-7.json"
LIMIT = 1.5
T0 = 1_000_000.0  # the injected clock's first reading
STATE_WAIT_S = 60.0  # how long a stopped or continued child may take to show so in /proc on a loaded machine


class Clock:
    """A clock the test sets: the watch's ``now``."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def child() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(["sleep", "120"])
    try:
        yield proc
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()


def child_record(tmp_path: Path, proc: subprocess.Popen) -> dict:
    rec = record(pid=proc.pid, host=socket.gethostname(), role="engine-core", job=JOB,
                 proc_start=identity.start_ticks(proc.pid))
    write_record(tmp_path, rec)
    return rec


def signal_and_wait(proc: subprocess.Popen, signum: int) -> None:
    """Send SIGSTOP or SIGCONT and wait until ``/proc`` shows the child stopped or running."""
    os.kill(proc.pid, signum)
    want = signum == signal.SIGSTOP
    deadline = time.monotonic() + STATE_WAIT_S
    while identity.stopped(proc.pid, None) != want:
        assert time.monotonic() < deadline, f"pid {proc.pid} not {'stopped' if want else 'running'}"
        time.sleep(0.01)


def watch(tmp_path: Path, limit: float | None, clock: Clock | None = None, began_s_ago: float = 60.0,
          owners: dict[str, str] | None = None) -> JobWatch:
    """A watch whose looks the test drives (every look reads the directory afresh: interval 0), begun
    ``began_s_ago`` seconds before the clock's time (the ends the tests write half a second before a look are of the
    job's time, not the past); ``owners``: Ray's owner links as its actor table would give them (actor -> owner)."""
    now = clock or time.time
    return JobWatch(JOB, str(tmp_path), lambda _: None, by="the test's watch", interval=0.0, stopped_limit=limit,
                    now=now, started=now() - began_s_ago, owners=lambda: dict(owners or {}))


def test_a_process_stopped_for_the_bound_is_lost_dated_when_first_seen_stopped(tmp_path: Path, child) -> None:
    child_record(tmp_path, child)
    clock = Clock()
    job_watch = watch(tmp_path, LIMIT, clock)
    assert job_watch.look() == [], "a running process was lost"
    signal_and_wait(child, signal.SIGSTOP)
    clock.t = T0 + 1.0
    assert job_watch.look() == []  # first seen stopped
    clock.t = T0 + 1.0 + LIMIT - 0.01
    assert job_watch.look() == [], "lost before the bound"
    clock.t = T0 + 1.0 + LIMIT
    (loss,) = job_watch.look()
    notice = loss.notice
    assert notice["pid"] == child.pid and notice["how"].startswith("stopped for 2 s (SIGSTOP"), notice
    assert "bound on a stopped process being 1.5 s" in notice["how"], notice
    assert notice["at"] == T0 + 1.0, notice  # first seen stopped, not the look that found it lost


def test_a_stop_continued_before_the_bound_starts_the_count_again(tmp_path: Path, child) -> None:
    """Stopped 1 s, continued, stopped 1 s again: twice under the bound of 1.5 s, never 1.5 s on end; the second stop
    is lost once it lasts the bound itself, dated when it began. The mutant: stops added up (lost at 2.4 s)."""
    child_record(tmp_path, child)
    clock = Clock()
    job_watch = watch(tmp_path, LIMIT, clock)
    signal_and_wait(child, signal.SIGSTOP)
    assert job_watch.look() == []
    clock.t = T0 + 1.0
    assert job_watch.look() == []
    signal_and_wait(child, signal.SIGCONT)
    clock.t = T0 + 1.3
    assert job_watch.look() == []
    signal_and_wait(child, signal.SIGSTOP)
    clock.t = T0 + 1.4
    assert job_watch.look() == []
    clock.t = T0 + 2.4
    assert job_watch.look() == [], "stops shorter than the bound were added up"
    clock.t = T0 + 1.4 + LIMIT
    (loss,) = job_watch.look()
    assert loss.notice["at"] == T0 + 1.4, loss.notice


def test_without_a_bound_a_stopped_process_is_never_lost(tmp_path: Path, child) -> None:
    child_record(tmp_path, child)
    clock = Clock()
    job_watch = watch(tmp_path, None, clock)
    signal_and_wait(child, signal.SIGSTOP)
    assert job_watch.look() == []
    clock.t = T0 + 10**6
    assert job_watch.look() == []


def test_the_watchs_thread_reports_a_loss_once_and_dates_it_within_what_it_measured(tmp_path: Path, child) -> None:
    """The watch's own thread on the real clock: a process stopped before the watch starts is lost once, past the
    bound; its notice lies between the watch's start and the report less the bound (bounds measured here, however
    slowly this machine runs the thread)."""
    child_record(tmp_path, child)
    signal_and_wait(child, signal.SIGSTOP)
    found: list[list[Loss]] = []
    fired = threading.Event()

    def on_loss(losses: list[Loss]) -> None:
        found.append(losses)
        fired.set()

    limit = 0.3
    began = time.time()
    job_watch = JobWatch(JOB, str(tmp_path), on_loss, by="the test's watch", interval=0.05, stopped_limit=limit)
    job_watch.start()
    try:
        assert fired.wait(STATE_WAIT_S), "a process stopped past the bound was never lost"
        reported = time.time()
        assert job_watch.thread is not None
        job_watch.thread.join(STATE_WAIT_S)
        assert not job_watch.thread.is_alive(), "the watch looked on after it reported a loss"
    finally:
        job_watch.stop()
    ((loss,),) = found
    assert began <= loss.notice["at"] <= reported - limit, (began, loss.notice, reported)


def test_status_names_the_stopped_process_first_alive_or_killed_since(tmp_path: Path, child) -> None:
    """The notice the watch found, in the trainer's record (as ``recorder.noticed`` writes it), with the trainer's
    exit 1 after it: the stopped EngineCore is named first, still stopped or SIGKILLed since (Ray's teardown)."""
    core = child_record(tmp_path, child)
    clock = Clock(time.time())
    job_watch = watch(tmp_path, LIMIT, clock)
    signal_and_wait(child, signal.SIGSTOP)
    assert job_watch.look() == []
    clock.t += LIMIT
    notice = job_watch.look()[0].notice
    runner = record(pid=200, role="ray-worker", actor_class="TaskRunner", alive=False, job=JOB,
                    seen_dead=[notice], teardown=None,
                    ended={"at": notice["at"] + LIMIT + 0.1, "how": "exit", "code": 1,
                           "error": [{"type": "JobProcessLost", "message": "lost", "where": "x.py:1"}]})
    boss = record(pid=100, role="driver", alive=False, job=JOB, namespace="local",
                  ended={"at": notice["at"] + LIMIT + 1, "how": "exit", "code": 1, "error": []})
    for alive in (True, False):
        result = outcome([boss, runner, {**core, "alive": alive}])
        first = result["first_failure"]
        assert result["state"] == "failed" and first["pid"] == child.pid, result
        assert first["how"].startswith("stopped for ") and first["how"].endswith("seen by the test's watch"), first
        assert first["at"] == notice["at"] and "first seen stopped" in result["root_cause"], result
        assert first["ended"].startswith("running, stopped for " if alive else "ended without a word, after it was "
                                         "seen stopped for "), first
    # the mutant: without the notice, a stopped process that runs is nothing, and the trainer's exit comes first
    runner["seen_dead"] = []
    assert outcome([boss, runner, core])["first_failure"]["pid"] == 200


def dead_pid() -> tuple[int, int | None]:
    proc = subprocess.Popen(["sleep", "0"])
    ticks = identity.start_ticks(proc.pid)
    proc.wait()
    return proc.pid, ticks


SIGTERM = {"how": "signal", "signal": "SIGTERM", "code": None, "error": []}
EXIT_1 = {"how": "exit", "code": 1, "error": []}


def write_dead(tmp_path: Path, role: str, ended: dict | None = None, ppid: int | None = 1, **fields) -> dict:
    """The record of a process of the job that has ended (a real pid, gone), written where the watch reads."""
    pid, ticks = dead_pid()
    rec = record(pid=pid, proc_start=ticks, host=socket.gethostname(), role=role, job=JOB, ppid=ppid, ended=ended,
                 **fields)
    write_record(tmp_path, rec)
    return rec


def first_seen_and_named(tmp_path: Path, recs: list[dict], owners: dict[str, str] | None = None) -> tuple[int, int]:
    """The pid the watch's look finds first, and the pid `status`'s outcome names first (the trainer's record
    holding the look's notices, the records in reverse: their order is not the order of failures)."""
    losses = watch(tmp_path, None, owners=owners).look()
    runner = record(pid=200, role="ray-worker", actor_class="TaskRunnerV1", job=JOB, alive=False,
                    seen_dead=[loss.notice for loss in losses], ended={"at": time.time(), **EXIT_1})
    dead = [{**rec, "alive": False} for rec in reversed(recs)]  # as the reader finds them
    return losses[0].record["pid"], outcome([*dead, runner])["first_failure"]["pid"]


def rewrite(tmp_path: Path, rec: dict, **fields) -> None:
    rec.update(fields)
    write_record(tmp_path, rec)


def test_an_actor_killed_outright_comes_before_the_actor_ray_ended_by_sigterm_for_it(tmp_path: Path) -> None:
    """The matrix's ``fully-async/actor:FullyAsyncRollouter`` cell as records: the rollouter SIGKILLed (no word),
    the vLLM server it owns (Ray's actor table: ``owners``) ended by SIGTERM (Ray's fate sharing) half a second
    before the look that finds both. Kin by ownership, the signal a request to end: the rollouter is named first. The
    mutants: the server not owned by it (no kin) is named first; so is the server ending by an error (a cause: an
    error dates only the silent deaths of the processes it started or owns)."""
    ended_at = time.time() - 0.5
    rollouter = write_dead(tmp_path, "ray-worker", actor_class="FullyAsyncRollouter", actor_id="aa" * 16)
    server = write_dead(tmp_path, "vllm-frontend", {"at": ended_at, **SIGTERM}, actor_class="vLLMHttpServer",
                        actor_id="bb" * 16)
    owned = {server["actor_id"]: rollouter["actor_id"]}
    assert first_seen_and_named(tmp_path, [rollouter, server], owned) == (rollouter["pid"],) * 2
    assert first_seen_and_named(tmp_path, [rollouter, server], {}) == (server["pid"],) * 2
    rewrite(tmp_path, server, ended={"at": ended_at, **EXIT_1})
    assert first_seen_and_named(tmp_path, [rollouter, server], owned) == (server["pid"],) * 2


def test_a_server_killed_outright_comes_before_its_engine_core_and_the_worker_ended_by_sigterm(
        tmp_path: Path) -> None:
    """The matrix's ``actor:vLLMHttpServer`` cells as records: the server SIGKILLed, its EngineCore dead with it (no
    word), the EngineCore's worker ended by SIGTERM. The server is named first: the two silent deaths come before
    the signal of their descendant, and a parent before its child."""
    ended_at = time.time() - 0.5
    server = write_dead(tmp_path, "vllm-frontend", actor_class="vLLMHttpServer")
    core = write_dead(tmp_path, "engine-core", ppid=server["pid"])
    worker = write_dead(tmp_path, "vllm-worker", {"at": ended_at, **SIGTERM}, ppid=core["pid"])
    assert first_seen_and_named(tmp_path, [server, core, worker]) == (server["pid"],) * 2


def test_a_worker_killed_outright_comes_before_its_engine_core_that_exited_on_it(tmp_path: Path) -> None:
    """The matrix's ``vllm-worker`` cells as records: the worker SIGKILLed, its EngineCore exits 1 ("Worker proc
    died unexpectedly") half a second before the look; the server lives on. The worker is named first, its parent's
    error being a reaction to it; the mutant: without the parent link (no ``ppid``) the EngineCore is."""
    ended_at = time.time() - 0.5
    core = write_dead(tmp_path, "engine-core", {"at": ended_at, **EXIT_1})
    worker = write_dead(tmp_path, "vllm-worker", ppid=core["pid"])
    assert first_seen_and_named(tmp_path, [core, worker]) == (worker["pid"],) * 2
    rewrite(tmp_path, worker, ppid=None)
    assert first_seen_and_named(tmp_path, [core, worker]) == (core["pid"],) * 2


def notices_at(tmp_path: Path, clock: Clock, owners: dict[str, str]) -> dict[int, float]:
    return {loss.record["pid"]: loss.notice["at"] for loss in watch(tmp_path, None, clock, owners=owners).look()}


def test_a_sigterm_end_dates_the_silent_death_of_its_kin_only(tmp_path: Path) -> None:
    """Issue 62: a SIGTERM in the same look re-dated every silent death of the look. Now only a forebear's (the
    process that started it, by ``ppid``; the actor that owns it): an unrelated Ray actor killed outright keeps the
    look's time, its kin gets the signal's."""
    clock = Clock()
    signalled_at = T0 - 0.5
    parent = write_dead(tmp_path, "vllm-frontend", actor_class="vLLMHttpServer")
    owner = write_dead(tmp_path, "ray-worker", actor_class="AgentLoopWorker", actor_id="cc" * 16)
    stranger = write_dead(tmp_path, "ray-worker", actor_class="WorkerDict", actor_id="dd" * 16)
    write_dead(tmp_path, "engine-core", {"at": signalled_at, **SIGTERM}, ppid=parent["pid"])
    owned = write_dead(tmp_path, "ray-worker", {"at": signalled_at, **SIGTERM}, actor_class="CheckpointEngineWorker",
                       actor_id="ab" * 16)
    at = notices_at(tmp_path, clock, {owned["actor_id"]: owner["actor_id"]})
    assert (at[parent["pid"]], at[owner["pid"]]) == (signalled_at, signalled_at), at
    assert at[stranger["pid"]] == T0, at  # the mutant (any signal dates any silent death): T0 - 0.5


def test_an_error_end_dates_the_silent_deaths_of_what_it_started_or_owns_only(tmp_path: Path) -> None:
    """An end by an error is a waiter noticing a death below it: its children and owned actors are dated by it,
    its parent (a cause of its end, not its reaction) and strangers are not."""
    clock = Clock()
    failed_at = T0 - 0.5
    parent = write_dead(tmp_path, "vllm-frontend", actor_class="vLLMHttpServer", actor_id="ee" * 16)
    waiter = write_dead(tmp_path, "engine-core", {"at": failed_at, **EXIT_1}, ppid=parent["pid"],
                        actor_id="ff" * 16)
    child = write_dead(tmp_path, "vllm-worker", ppid=waiter["pid"])
    owned = write_dead(tmp_path, "ray-worker", actor_class="RayWorkerWrapper", actor_id="ac" * 16)
    at = notices_at(tmp_path, clock, {owned["actor_id"]: waiter["actor_id"]})
    assert (at[child["pid"]], at[owned["pid"]]) == (failed_at, failed_at), at
    assert at[parent["pid"]] == T0, at


def test_an_end_recorded_before_the_watch_began_is_no_loss(tmp_path: Path) -> None:
    """Issue 62: an end recorded before the watch started counted as a loss at its first look. Now it is the past (an
    earlier attempt, a failure while the job was built); an end after the start is a loss, and so is a death without
    a word whenever its last record was written (it has no date)."""
    clock = Clock()
    write_dead(tmp_path, "ray-worker", {"at": T0 - 10, **EXIT_1}, actor_class="WorkerDict")
    job_watch = watch(tmp_path, None, clock, began_s_ago=0.0)
    assert job_watch.look() == [], "an end from before the watch began ended the job"
    late = write_dead(tmp_path, "ray-worker", {"at": T0 + 1, **EXIT_1}, actor_class="WorkerDict")
    silent = write_dead(tmp_path, "ray-worker", actor_class="WorkerDict", updated=T0 - 3600)
    clock.t = T0 + 2
    lost = {loss.record["pid"]: loss.notice["how"] for loss in job_watch.look()}
    assert lost == {late["pid"]: "ended with exit 1", silent["pid"]: "ended without a word"}, lost


def test_losses_of_two_rounds_keep_the_first_watchers_word_and_take_the_same_watchers_later_dating() -> None:
    """The trainer's look and the other nodes' next answers (``patch_code.merged``): a process the trainer's own
    watch found stays as it said (another node's watch may see it too, through a shared directory); a far process
    its node's watch reports again is taken re-dated; a new one is added; first lost first."""
    from verl_ascend_ext.features.job_watch.patch_code import merged
    from verl_ascend_ext.runtime.records.ends import NO_WORD, Failure
    from verl_ascend_ext.runtime.records.watch import Loss

    def loss(pid: int, at: float, by: str) -> Loss:
        notice = {"host": "h", "pid": pid, "proc_start": 1, "role": "r", "at": at, "how": NO_WORD, "by": by}
        return Loss({"pid": pid}, notice, Failure(NO_WORD, NO_WORD))

    here = loss(1, 10.0, "the job watch of pid 5")
    far = loss(2, 12.0, "the job watch of node n")
    out = merged([here, far], [loss(1, 9.0, "the job watch of node n"), loss(2, 8.0, "the job watch of node n"),
                               loss(3, 11.0, "the job watch of node n")])
    assert [(x.notice["pid"], x.notice["at"], x.notice["by"]) for x in out] == [
        (2, 8.0, "the job watch of node n"), (1, 10.0, "the job watch of pid 5"), (3, 11.0, "the job watch of node n")]
    assert merged([here], []) == [here]
