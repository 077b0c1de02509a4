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

from verl_ascend_ext.runtime.records.outcome import format_outcome, one_job, outcome

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


def running_driver(**fields) -> dict:
    return record(pid=100, role="driver", alive=True, job=JOB, namespace="local", **fields)


def test_a_running_job_with_a_process_dead_mid_job_is_lost_not_all_well_and_a_slow_one_is_not() -> None:
    """The watch off (or a node it did not cover): the driver runs, an EngineCore died without a word. status says
    the job lost it (exit 1 through ``lost_mid_job``), named first; a live process, however old its record, and an
    end after the trainer's teardown began, are not losses; a running job with nothing dead has none."""
    core = dead(7, role="engine-core", updated=150.0)
    slow = record(pid=8, role="vllm-worker", alive=True, job=JOB, updated=10.0)
    result = outcome([running_driver(), core, slow])
    assert result["state"] == "running" and [w["pid"] for w in result["lost_mid_job"]] == [7], result
    assert result["first_failure"]["pid"] == 7 and result["first_failure"]["how"] == "ended without a word", result
    assert outcome([running_driver(), slow])["lost_mid_job"] == []
    after = dead(9, actor_class="WorkerDict", ended={"at": 260.0, "how": "signal", "signal": "SIGTERM", "code": None})
    quiet = outcome([running_driver(teardown=250.0), after, slow])
    assert quiet["lost_mid_job"] == [] and quiet["first_failure"]["pid"] == 9, quiet  # a failure recorded, no loss
    text = "\n".join(format_outcome(result))
    assert "Job: running, 1 process(es) of it LOST (exit 1)" in text and "lost while it runs: engine-core" in text


def test_a_death_noticed_of_a_process_or_node_with_no_record_here_is_named_first() -> None:
    """Another node's process whose record never reached this directory (its node lost), and a lost node itself, as
    the trainer's watch noticed them: the notice alone names them, with how they were lost."""
    node = {"host": "node-b", "pid": 55, "proc_start": 9, "role": "ray-node 10.0.0.2 node 57772a4b", "at": 180.0,
            "how": "lost: silent for 31 s: its job watch stopped answering (the bound is 30 s); last heard 10:00:00",
            "by": "the job watch of the trainer's process"}
    boss = driver({"at": 202.0, "how": "exit", "code": 1,
                   "error": [{"type": "ActorDiedError", "message": "lost", "where": "x.py:1"}]}, seen_dead=[node])
    result = outcome([boss])
    first = result["first_failure"]
    assert result["state"] == "failed" and first["role"] == node["role"] and first["at"] == 180.0, result
    assert first["how"].startswith("lost: silent for 31 s") and "ray-node 10.0.0.2" in result["root_cause"], result
    assert [w["role"] for w in result["lost_mid_job"]] == [node["role"]], result


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


def test_records_gathered_from_another_node_are_read_with_the_rest_and_a_process_counts_once(tmp_path: Path) -> None:
    """The trainer's watch writes another node's records under its own directory (``gathered-<node>``): status reads
    them there; where a directory also holds the process's own record (nodes sharing one directory), the newest copy
    counts, once."""
    from verl_ascend_ext.runtime.records import gathered
    from verl_ascend_ext.runtime.records.reader import collect

    base = tmp_path / "status"
    own = record(pid=7, host="node-b", role="engine-core", job=JOB, updated=300.0)
    write_record(base, own)
    far = record(pid=8, host="node-b", role="vllm-worker", job=JOB, updated=250.0)
    assert gathered.write(str(base), "57772a4bfa67bba7aa", [{**own, "updated": 200.0, "file": "/x/y/z.json"}, far]) == 2
    assert sorted(p.name for p in (base / "gathered-57772a4bfa67bba7").iterdir()) == ["node-b-8-1.json", "z.json"]
    records, notes = collect(str(base))
    assert notes == [] and sorted((r["pid"], r["updated"]) for r in records) == [(7, 300.0), (8, 250.0)], records
    assert all(r["alive"] is None for r in records)  # another host's: not judged from this /proc
