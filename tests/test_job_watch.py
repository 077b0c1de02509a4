"""The job watch (``runtime.records.watch``, issue 48) on real processes of this host: its bound on a stopped
process (one stopped with SIGSTOP for the bound's seconds on end is lost, its notice dated when it was first seen
stopped; a shorter stop, or one continued before the bound, is not; ``verl-ascend status`` then names it first with
how long it was stopped), and the order of what one look finds (a process killed outright comes before the child
that its death got ended by SIGTERM).

Real child processes (``sleep``) are stopped, continued or ended; their records are written where the watch reads
(the schema's factory, ``tests/records.py``). The watch runs in this process, as it runs in verl's trainer. In
verl's own jobs the bound ends a hybrid and a fully-async job over a stopped EngineCore, and a killed vLLM server is
named before its EngineCore's worker (``tests/engine/fault_matrix.py``'s ``stop:engine-core`` and
``actor:vLLMHttpServer`` cells); the watch ending those jobs is ``tests/engine/test_job_watch.py``.
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


def watch(tmp_path: Path, limit: float | None) -> tuple[JobWatch, list[list[Loss]], threading.Event]:
    found: list[list[Loss]] = []
    fired = threading.Event()

    def on_loss(losses: list[Loss]) -> None:
        found.append(losses)
        fired.set()

    return JobWatch(JOB, str(tmp_path), on_loss, by="the test's watch", interval=0.1, stopped_limit=limit), found, fired


def test_a_process_stopped_for_the_bound_is_lost_dated_when_first_seen_stopped(tmp_path: Path, child) -> None:
    child_record(tmp_path, child)
    job_watch, found, fired = watch(tmp_path, LIMIT)
    job_watch.start()
    try:
        time.sleep(0.5)
        assert not fired.is_set(), "a running process was lost"
        stopped_at = time.time()
        os.kill(child.pid, signal.SIGSTOP)
        assert fired.wait(LIMIT + 5), "a process stopped past the bound was never lost"
        seen = time.time()
    finally:
        job_watch.stop()
    ((loss,),) = found
    notice = loss.notice
    assert notice["pid"] == child.pid and notice["how"].startswith("stopped for "), notice
    assert "bound on a stopped process being 1.5 s" in notice["how"], notice
    assert stopped_at - 0.05 <= notice["at"] <= stopped_at + 0.5, (stopped_at, notice)  # first seen, not the end
    assert seen - stopped_at >= LIMIT, (seen, stopped_at)


def test_a_stop_continued_before_the_bound_starts_the_count_again(tmp_path: Path, child) -> None:
    """Stopped 1 s, continued, stopped 1 s again: twice under the bound of 1.5 s, never 1.5 s on end."""
    child_record(tmp_path, child)
    job_watch, _, fired = watch(tmp_path, LIMIT)
    job_watch.start()
    try:
        for _ in range(2):
            os.kill(child.pid, signal.SIGSTOP)
            time.sleep(1.0)
            os.kill(child.pid, signal.SIGCONT)
            time.sleep(0.3)
        assert not fired.is_set(), "stops shorter than the bound were added up"
    finally:
        job_watch.stop()


def test_without_a_bound_a_stopped_process_is_never_lost(tmp_path: Path, child) -> None:
    child_record(tmp_path, child)
    job_watch, _, fired = watch(tmp_path, None)
    os.kill(child.pid, signal.SIGSTOP)
    job_watch.start()
    try:
        assert not fired.wait(1.0)
    finally:
        job_watch.stop()


def test_status_names_the_stopped_process_first_alive_or_killed_since(tmp_path: Path, child) -> None:
    """The notice the watch found, in the trainer's record (as ``recorder.noticed`` writes it), with the trainer's
    exit 1 after it: the stopped EngineCore is named first, still stopped or SIGKILLed since (Ray's teardown)."""
    core = child_record(tmp_path, child)
    job_watch, found, fired = watch(tmp_path, LIMIT)
    os.kill(child.pid, signal.SIGSTOP)
    job_watch.start()
    try:
        assert fired.wait(LIMIT + 5)
    finally:
        job_watch.stop()
    notice = found[0][0].notice
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


def first_seen_and_named(tmp_path: Path, recs: list[dict]) -> tuple[int, int]:
    """The pid the watch's look finds first, and the pid `status`'s outcome names first (the trainer's record
    holding the look's notices, the records in reverse: their order is not the order of failures)."""
    losses = JobWatch(JOB, str(tmp_path), lambda _: None, by="the test's watch").look()
    runner = record(pid=200, role="ray-worker", actor_class="TaskRunnerV1", job=JOB, alive=False,
                    seen_dead=[loss.notice for loss in losses], ended={"at": time.time(), **EXIT_1})
    dead = [{**rec, "alive": False} for rec in reversed(recs)]  # as the reader finds them
    return losses[0].record["pid"], outcome([*dead, runner])["first_failure"]["pid"]


def test_an_actor_killed_outright_comes_before_the_actor_ray_ended_by_sigterm_for_it(tmp_path: Path) -> None:
    """The matrix's ``fully-async/actor:FullyAsyncRollouter`` cell as records: the rollouter SIGKILLed (no word),
    the vLLM server it owns ended by SIGTERM (Ray's fate sharing) half a second before the look that finds both.
    Not kin by ``ppid`` (both Ray workers): a signal is a request to end, a reaction, so the rollouter is named
    first. The mutant: the server ending by an error (a cause, not a reaction) instead is named first."""
    ended_at = time.time() - 0.5
    rollouter = write_dead(tmp_path, "ray-worker", actor_class="FullyAsyncRollouter")
    server = write_dead(tmp_path, "vllm-frontend", {"at": ended_at, **SIGTERM}, actor_class="vLLMHttpServer")
    assert first_seen_and_named(tmp_path, [rollouter, server]) == (rollouter["pid"],) * 2
    server["ended"] = {"at": ended_at, **EXIT_1}
    write_record(tmp_path, server)
    assert first_seen_and_named(tmp_path, [rollouter, server]) == (server["pid"],) * 2


def test_a_server_killed_outright_comes_before_its_engine_core_and_the_worker_ended_by_sigterm(
        tmp_path: Path) -> None:
    """The matrix's ``actor:vLLMHttpServer`` cells as records: the server SIGKILLed, its EngineCore dead with it (no
    word), the EngineCore's worker ended by SIGTERM. The server is named first: the two silent deaths come before
    the signal, and a parent before its child."""
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
    worker["ppid"] = None
    write_record(tmp_path, worker)
    assert first_seen_and_named(tmp_path, [core, worker]) == (core["pid"],) * 2
