"""`verl-ascend status` judges a job by all its processes (issue 48 item 3): the first death is named first by the
time it was seen, a process lost mid-job fails a job whose driver exited 0, one job is read by default, and a record
that cannot be read is named (file and reason) while the rest is still read.

The records are built through the schema's factory (``tests/records.py``), as real processes write them; the real
job watch writing ``seen_dead`` is ``tests/test_job_watch.py`` and, in verl's own jobs, ``tests/engine``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from records import record, write_record
from subprocesses import run_command

from verl_ascend_ext.runtime.records.outcome import one_job, outcome

CLI = str(Path(sys.executable).with_name("verl-ascend"))
JOB = "node-a-100-7.json"


def dead(pid: int, role: str = "ray-worker", **fields) -> dict:
    return record(pid=pid, role=role, alive=False, job=JOB, **fields)


def driver(ended: dict | None, **fields) -> dict:
    return record(pid=100, role="driver", alive=False, job=JOB, namespace="local", ended=ended, **fields)


def seen(rec: dict, at: float) -> dict:
    return {"host": rec["host"], "pid": rec["pid"], "proc_start": rec["proc_start"], "role": "engine-core",
            "at": at, "how": "ended without a word", "by": "the job watch of the driver (pid 100)"}


def test_the_process_seen_dead_first_is_named_first_not_the_one_whose_last_record_is_oldest() -> None:
    """The issue's case: the driver's last record dates from its boot, the EngineCore died without a word at 200;
    the driver noticed it at 201 and ended on it at 202. Named first: the EngineCore, with the time it was seen."""
    core = dead(7, role="engine-core", updated=150.0)
    boss = driver({"at": 202.0, "how": "exit", "code": 1,
                   "error": [{"type": "JobProcessLost", "message": "lost", "where": "x.py:1"}]},
                  updated=110.0, seen_dead=[seen(core, 201.0)])
    rank = dead(8, actor_class="WorkerDict", updated=90.0)  # ended in Ray's teardown, without a word: no notice
    result = outcome([boss, core, rank])
    first = result["first_failure"]
    assert result["state"] == "failed" and first["pid"] == 7, result
    assert first["how"] == "ended without a word, seen dead by the job watch of the driver (pid 100)", first
    assert first["at"] == 201.0 and "seen dead" in result["root_cause"], result
    # the mutant: without the notice, the death has no time, and the driver's error is all that is dated
    boss["seen_dead"] = []
    assert outcome([boss, core, rank])["first_failure"]["pid"] == 100


@pytest.mark.parametrize(("lost_at", "state"), [(150.0, "failed"), (205.0, "ended well")])
def test_a_process_lost_before_the_teardown_fails_a_job_whose_driver_exited_0(lost_at: float, state: str) -> None:
    """A rank that ended by SIGTERM mid-job (before the driver's teardown at 200) fails the job, though the driver
    exited 0; the same signal in the teardown (Ray ending the job's workers) does not."""
    boss = driver({"at": 210.0, "how": "exit", "code": 0}, teardown=200.0)
    rank = dead(8, actor_class="WorkerDict", ended={"at": lost_at, "how": "signal", "signal": "SIGTERM", "code": None})
    idle_worker = dead(9, ended={"at": 150.0, "how": "signal", "signal": "SIGTERM", "code": None},
                       patches={})  # a pool worker that never got an actor: Ray's to end
    result = outcome([boss, rank, idle_worker])
    assert result["state"] == state, result
    if state == "failed":
        assert result["first_failure"]["pid"] == 8 and [w["pid"] for w in result["lost_mid_job"]] == [8], result


def test_status_reads_one_job_by_default_and_the_rest_when_asked(tmp_path: Path) -> None:
    old_job = "node-a-50-3.json"
    old = [record(pid=50, role="driver", alive=False, job=old_job, started=10.0, namespace="local",
                  ended={"at": 20.0, "how": "exception", "code": 1, "error": [{"type": "OSError", "message": "x"}]}),
           record(pid=51, alive=False, job=old_job, started=11.0)]
    new = [driver({"at": 300.0, "how": "exit", "code": 0}, started=200.0, teardown=290.0),
           record(pid=101, alive=False, job=JOB, started=201.0, actor_class="TaskRunner")]
    for rec in old + new:
        write_record(tmp_path, rec, ns=rec["namespace"])
    kept, job, text = one_job(old + new)
    assert job == JOB and {r["pid"] for r in kept} == {100, 101}, text
    assert text == f"job {JOB} (the newest driver's): 2 record(s); 2 record(s) of other jobs not shown (--all, or " \
                   "--job ID)"
    proc = run_command([CLI, "status", "--dir", str(tmp_path)], check=False)
    assert proc.returncode == 0 and "Job: ended well" in proc.stdout and text in proc.stdout, proc.stdout
    proc = run_command([CLI, "status", "--dir", str(tmp_path), "--all", "--json"], check=False)
    assert proc.returncode == 0 and len(json.loads(proc.stdout)["processes"]) == 4, proc.stdout  # judged: the newest
    proc = run_command([CLI, "status", "--dir", str(tmp_path), "--job", old_job, "--json"], check=False)
    assert proc.returncode == 1 and {p["pid"] for p in json.loads(proc.stdout)["processes"]} == {50, 51}
    proc = run_command([CLI, "status", "--dir", str(tmp_path), "--job", "nope"], check=False)
    assert proc.returncode == 2 and "no record of job nope among the 4 read" in proc.stderr, proc.stderr


def test_a_record_that_cannot_be_read_is_named_with_its_file_and_reason_and_the_rest_is_read(tmp_path: Path) -> None:
    good = driver({"at": 300.0, "how": "exit", "code": 0}, teardown=290.0)
    write_record(tmp_path, good, ns="local")
    bad_types = write_record(tmp_path, record(pid=7, job=JOB), ns="local")
    data = json.loads(bad_types.read_text())
    data["pid"] = "seven"
    bad_types.write_text(json.dumps(data))
    bad_list = write_record(tmp_path, record(pid=8, job=JOB), ns="local")
    data = json.loads(bad_list.read_text())
    data["seen_dead"] = ["not an object"]
    bad_list.write_text(json.dumps(data))
    cut = tmp_path / "local" / "node-a-9-1.json"
    cut.write_text('{"schema": 3, "host": "node-a", "pi')
    os.chmod(cut, 0o600)
    proc = run_command([CLI, "status", "--dir", str(tmp_path), "--json"], check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert [p["pid"] for p in report["processes"]] == [100], report["processes"]
    notes = "\n".join(report["notes"])
    assert f"{bad_types} ignored: not a readable record (field 'pid' is str 'seven', not int)" in notes, notes
    assert f"{bad_list} ignored: not a readable record (field 'seen_dead' holds an entry that is not an object" in \
        notes, notes
    assert f"{cut} ignored: not JSON (" in notes and notes.count("Fix: remove it") == 3, notes
