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


@pytest.mark.parametrize(("killed", "kin_end"), [("server", "worker"), ("worker", "core")])
def test_a_process_killed_outright_comes_before_the_kin_its_death_ended(tmp_path: Path, killed: str,
                                                                        kin_end: str) -> None:
    """The matrix's ``actor:vLLMHttpServer`` and ``fully-async/vllm-worker`` cells as records. A vLLM server
    SIGKILLed: its EngineCore dead with it (no word), the EngineCore's worker ended by SIGTERM. A vLLM worker
    SIGKILLed: its EngineCore exits 1 ("Worker proc died unexpectedly"). In both the kin's end is dated half a second
    before the look that finds them all, and the look names the killed process first, dated no later than that end,
    as does `status`; without the parent links (no ``ppid``) the kin's dated end would come first."""
    host = socket.gethostname()
    pids = {name: dead_pid() for name in ("server", "core", "worker")}
    ended_at = time.time() - 0.5
    parents = {"server": 1, "core": pids["server"][0], "worker": pids["core"][0]}
    roles = {"server": "vllm-frontend", "core": "engine-core", "worker": "vllm-worker"}
    recs = {name: record(pid=pid, proc_start=ticks, host=host, role=roles[name], job=JOB, ppid=parents[name],
                         actor_class="vLLMHttpServer" if name == "server" else None,
                         ended={"at": ended_at, **(SIGTERM if kin_end == "worker" else EXIT_1)}
                         if name == kin_end else None)
            for name, (pid, ticks) in pids.items()}
    if killed == "worker":
        recs["server"]["alive"] = True  # the server lives on: it is not lost
        recs = {name: rec for name, rec in recs.items() if name != "server"} | {"server": recs["server"]}
    for rec in recs.values():
        write_record(tmp_path, rec)
    if killed == "worker":  # a live server: this process stands in for it
        recs["server"] = {**recs["server"], "pid": os.getpid(), "proc_start": identity.start_ticks()}
        write_record(tmp_path, recs["server"])
    losses = JobWatch(JOB, str(tmp_path), lambda _: None, by="the test's watch").look()
    assert losses[0].record["pid"] == pids[killed][0], [loss.notice for loss in losses]
    assert losses[0].notice["at"] == ended_at and losses[0].notice["how"] == "ended without a word"
    dead = [{**rec, "alive": rec["pid"] == os.getpid()} for rec in recs.values()]  # as the reader finds them
    runner = record(pid=200, role="ray-worker", actor_class="TaskRunnerV1", job=JOB, alive=False,
                    seen_dead=[loss.notice for loss in losses], ended={"at": ended_at + 1, **EXIT_1})
    first = outcome([*reversed(dead), runner])  # the records' order is not the order of failures
    assert first["first_failure"]["pid"] == pids[killed][0], first
    for rec in recs.values():  # the mutant: no parent links
        rec["ppid"] = None
        write_record(tmp_path, rec)
    first_seen = JobWatch(JOB, str(tmp_path), lambda _: None, by="the test's watch").look()[0]
    assert first_seen.record["pid"] == pids[kin_end][0], first_seen.notice
