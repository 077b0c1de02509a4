"""How a process ended (``runtime.records.process_end``) and what ``verl-ascend status`` makes of a job's ends
(``runtime.records.outcome``).

Each end is a real process that boots the plugin and then ends the way under test (an exception, ``sys.exit``, a
signal, SIGKILL); its record is read back from disk. The Ray error chain is built from Ray's own exception
classes. The outcome of whole jobs (a killed rank, a stalled rank) is asserted on real verl jobs in
``tests/engine/test_grpo.py``; here on records written by real processes and on hand-made ones.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from records import record
from subprocesses import last_json, run_command, run_python, scrubbed_env

from verl_ascend_ext.runtime.records import outcome as job_outcome
from verl_ascend_ext.runtime.records.reader import collect
from verl_ascend_ext.runtime.records.report import aggregate

CLI = str(Path(sys.executable).with_name("verl-ascend"))
BOOT = """
import os, signal, sys, time
import verl_ascend_ext
verl_ascend_ext.activate()
"""


def ended_by(tmp_path: Path, code: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    """Run ``code`` after the boot in a fresh process; its return code and its record."""
    base = tmp_path / "status"
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(BOOT) + textwrap.dedent(code)],
                          env=scrubbed_env({"VERL_ASCEND_EXT_STATUS_DIR": str(base), **(env or {})}),
                          capture_output=True, text=True, timeout=120)
    (path,) = base.rglob("*.json")
    return proc.returncode, json.loads(path.read_text())


def test_an_uncaught_exception_is_recorded_with_its_chain_and_innermost_frames(tmp_path: Path) -> None:
    rc, rec = ended_by(tmp_path, """
    def load():
        raise FileNotFoundError("no shard 3")
    try:
        load()
    except FileNotFoundError as err:
        raise RuntimeError("checkpoint incomplete") from err
    """)
    ended = rec["ended"]
    assert rc == 1 and (ended["how"], ended["code"]) == ("exception", 1), ended
    assert [(e["type"], e["message"]) for e in ended["error"]] == [
        ("RuntimeError", "checkpoint incomplete"), ("FileNotFoundError", "no shard 3")]
    assert [e["where"] for e in ended["error"]] == ["<string>:11", "<string>:7"]  # the raise lines of the -c code


def test_sys_exit_records_its_code_and_the_exception_it_was_handling(tmp_path: Path) -> None:
    """Hydra (verl's main_ppo) catches the job's exception, prints it and calls sys.exit(1)."""
    rc, rec = ended_by(tmp_path, """
    try:
        {}["actor"]
    except KeyError:
        sys.exit(3)
    """)
    ended = rec["ended"]
    assert rc == 3 and (ended["how"], ended["code"]) == ("exit", 3)
    assert [e["type"] for e in ended["error"]] == ["KeyError"]
    rc, rec = ended_by(tmp_path / "clean", "sys.exit(0)")
    assert rc == 0 and rec["ended"]["how"] == "exit" and rec["ended"]["code"] == 0 and "error" not in rec["ended"]
    rc, rec = ended_by(tmp_path / "fell-off", "x = 1")
    assert rc == 0 and rec["ended"]["how"] == "exit" and rec["ended"]["code"] is None  # no exit call seen


def test_sigterm_is_recorded_and_chained_to_the_handler_that_was_there(tmp_path: Path) -> None:
    """A process that already handles SIGTERM in Python (Ray's workers do) keeps its handler; the record says why it
    ended."""
    code = """
    seen = []
    def handler(signum, frame):
        seen.append(signum)
        sys.exit(7)
    signal.signal(signal.SIGTERM, handler)
    import verl_ascend_ext.runtime.boot as boot
    boot._loaded_by.clear()  # boot again, now that a handler is installed (as in a Ray worker)
    import verl_ascend_ext.runtime.records.process_end as end
    end._installed = False
    boot.activate("verl")
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
    """
    rc, rec = ended_by(tmp_path, code)
    assert rc == 7, rec  # the previous handler ran and ended the process as it would have
    assert rec["ended"]["how"] == "signal" and rec["ended"]["signal"] == "SIGTERM" and rec["ended"]["code"] == 7


def test_over_the_default_action_no_handler_is_installed_and_a_kill_leaves_no_word(tmp_path: Path) -> None:
    rc, rec = ended_by(tmp_path, """
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
    """)
    assert rc == -signal.SIGTERM and rec["ended"] is None  # ended by the default action, as without the plugin
    rc, rec = ended_by(tmp_path / "kill", "os.kill(os.getpid(), signal.SIGKILL)")
    assert rc == -signal.SIGKILL and rec["ended"] is None
    report = aggregate(collect(str(tmp_path / "kill" / "status"))[0])
    assert report["outcome"]["state"] == "failed" and report["exit_code"] == 1
    assert report["outcome"]["first_failure"]["how"] == "ended without a word"


def test_its_switch_off_installs_nothing_and_the_record_says_no_word(tmp_path: Path) -> None:
    """``VERL_ASCEND_EXT_PROCESS_END=0``: no hook, no wrapper, no handler; the record carries the gate's value."""
    rc, rec = ended_by(tmp_path, """
    assert not getattr(sys.excepthook, "verl_ascend_ext", False) and not getattr(sys.exit, "verl_ascend_ext", False)
    sys.exit(3)
    """, {"VERL_ASCEND_EXT_PROCESS_END": "0"})
    assert rc == 3 and rec["ended"] is None, rec["ended"]
    assert rec["gates"]["VERL_ASCEND_EXT_PROCESS_END"] is False
    proc = subprocess.run([sys.executable, "-c", "import verl_ascend_ext; verl_ascend_ext.activate()"],
                          env=scrubbed_env({"VERL_ASCEND_EXT_PROCESS_END": "maybe"}), capture_output=True, text=True)
    assert proc.returncode != 0 and "VERL_ASCEND_EXT_PROCESS_END='maybe'" in proc.stderr, proc.stderr


def test_a_forked_child_does_not_write_its_parents_record(tmp_path: Path) -> None:
    rc, rec = ended_by(tmp_path, """
    pid = os.fork()
    if pid == 0:
        try:
            raise ValueError("child")
        except ValueError:
            sys.exit(5)  # the child's exit: not the parent's record to write
    os.waitpid(pid, 0)
    """)
    assert rc == 0 and rec["ended"]["how"] == "exit" and rec["ended"].get("error") is None, rec["ended"]


def test_rays_task_error_chain_names_the_process_that_raised_each_cause() -> None:
    out = last_json(run_python("""
    import json
    from ray.exceptions import ActorDiedError, RayTaskError
    from verl_ascend_ext.features.weight_sync.barrier import WeightSyncBarrierTimeout
    from verl_ascend_ext.runtime.records.process_end import describe
    def remote(cause, title, pid):
        try:
            raise cause
        except Exception as err:
            import traceback
            return RayTaskError("update_weights", traceback.format_exc(), err, proctitle=title, pid=pid,
                                ip="10.0.0.2").as_instanceof_cause()
    inner = remote(WeightSyncBarrierTimeout("rank 1 (host b, pid 42) of 2 did not reach the barrier"),
                   "ray::WorkerDict.update_weights", 4242)
    outer = remote(inner, "ray::TaskRunnerV1.run", 777)
    died = remote(ActorDiedError(), "ray::TaskRunnerV1.run", 778)
    print(json.dumps({"stall": describe(outer), "kill": describe(died)}))
    """, {}).stdout)
    stall = out["stall"]
    assert [(e["type"], e.get("pid"), e.get("ip")) for e in stall] == [
        ("RayTaskError", 777, "10.0.0.2"),  # Ray makes no dual class of a RayTaskError cause
        ("RayTaskError(WeightSyncBarrierTimeout)", 4242, "10.0.0.2"),
        ("WeightSyncBarrierTimeout", None, None)], stall
    assert "pid 42" in stall[-1]["message"]
    assert [e["type"] for e in out["kill"]] == ["RayTaskError(ActorDiedError)", "ActorDiedError"]


# ---- the outcome, from records ------------------------------------------------------------------------------

def rec(pid: int, role: str, *, actor: str | None = None, rank: int | None = None, alive: bool = False,
        ended: dict | None = None, errors: list | None = None, updated: float = 100.0) -> dict:
    return record(pid, "n1", role, actor_class=actor, alive=alive, started=1.0,
                  ranks={} if rank is None else {"rank": rank, "world_size": 2}, ended=ended, errors=errors or [],
                  updated=updated, patches={})


RAY_TEARDOWN = {"how": "signal", "signal": "SIGTERM", "code": 1, "at": 300.0}


def test_a_killed_rank_reported_by_rays_actor_death_failed_first() -> None:
    died = ("The actor died unexpectedly before finishing this task.\n\tclass_name: WorkerDict\n"
            "\tactor_id: 0b1c2d3e4f5a6b7c8d9e0f1a01000000\n\tnamespace: x\n\tip: 10.0.0.1")  # no pid: Ray knew none
    records = [
        rec(1, "driver", ended={"how": "exception", "code": 1, "at": 200.0, "error": [
            {"type": "RayTaskError(ActorDiedError)", "pid": 5,
             "message": "failed in ray::TaskRunnerV1.run() (pid=5, ip=10.0.0.1)"},
            {"type": "ActorDiedError", "message": died}]}),
        rec(5, "ray-worker", actor="TaskRunnerV1", ended=RAY_TEARDOWN),
        rec(11, "ray-worker", actor="WorkerDict", rank=0, ended=RAY_TEARDOWN),
        {**rec(12, "ray-worker", actor="WorkerDict", rank=1, updated=150.0),  # SIGKILL: nothing written
         "actor_id": "0b1c2d3e4f5a6b7c8d9e0f1a01000000"},
        rec(13, "engine-core"),  # followed its parent: no word either
    ]
    out = job_outcome.outcome(records)
    assert out["state"] == "failed"
    first = out["first_failure"]
    assert (first["role"], first["pid"], first["how"]) == ("ray-worker WorkerDict rank 1", 12, "ended without a word")
    assert out["root_cause"].startswith("ray-worker WorkerDict rank 1 (host n1, pid 12) ended without a word")
    assert "ActorDiedError: The actor died unexpectedly" in out["root_cause"]
    assert out["rest"] == {"engine-core: ended without a word": 1, "ray-worker TaskRunnerV1: SIGTERM": 1,
                           "ray-worker WorkerDict rank 0: SIGTERM": 1}


def test_a_stalled_rank_named_by_the_barrier_error_raised_first() -> None:
    barrier = {"at": 150.0, "by": "weight-sync-kv-barrier", "type": "WeightSyncBarrierTimeout",
               "message": "verl-ascend-ext weight-sync-kv-barrier: rank 1 (host n1, pid 12) of 2 did not reach the "
                          "barrier before the KV-cache resume within 20 s (seen from rank 0).",
               "where": "/x/barrier.py:77"}
    records = [
        rec(1, "driver", ended={"how": "exit", "code": 1, "at": 200.0, "error": [
            {"type": "RayTaskError(WeightSyncBarrierTimeout)", "message": "failed in ...", "pid": 11},
            {"type": "WeightSyncBarrierTimeout", "message": barrier["message"]}]}),
        rec(11, "ray-worker", actor="WorkerDict", rank=0, errors=[barrier], ended=RAY_TEARDOWN),
        rec(12, "ray-worker", actor="WorkerDict", rank=1),  # stalled, then killed in the teardown
    ]
    out = job_outcome.outcome(records)
    first = out["first_failure"]
    assert (first["role"], first["pid"], first["at"], first["where"]) == (
        "ray-worker WorkerDict rank 0", 11, 150.0, "/x/barrier.py:77")
    assert first["how"] == "raised WeightSyncBarrierTimeout (weight-sync-kv-barrier)"
    assert out["root_cause"] == f"WeightSyncBarrierTimeout: {barrier['message']}"
    assert [(n["role"], n["pid"], n["ended"].split(" (")[0]) for n in out["named"]] == [
        ("ray-worker WorkerDict rank 1", 12, "ended without a word")]
    text = "\n".join(job_outcome.format_outcome(out))
    assert text.startswith("Job: FAILED\n  failed first: ray-worker WorkerDict rank 0 (host n1, pid 11): raised")
    assert "named there: ray-worker WorkerDict rank 1 (host n1, pid 12): ended without a word" in text


def test_a_job_whose_driver_exited_0_ended_well_even_with_teardown_ends() -> None:
    records = [rec(1, "driver", ended={"how": "exit", "code": 0, "at": 200.0}),
               rec(11, "ray-worker", actor="WorkerDict", rank=0, ended=RAY_TEARDOWN), rec(13, "engine-core")]
    out = job_outcome.outcome(records)
    assert out["state"] == "ended well" and out["first_failure"] is None
    assert job_outcome.outcome([*records[1:], rec(1, "driver", alive=True)])["state"] == "running"


@pytest.mark.parametrize("how", ["kill", "exception"])
def test_status_cli_says_the_job_failed_first_and_exits_1(tmp_path: Path, how: str) -> None:
    code = "os.kill(os.getpid(), signal.SIGKILL)" if how == "kill" else "raise MemoryError('host memory')"
    ended_by(tmp_path, code)
    proc = run_command([CLI, "status", "--dir", str(tmp_path / "status")], check=False)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 1 and lines[1].startswith("  job ") and lines[3] == "Job: FAILED", proc.stdout
    assert lines[4].startswith("  failed first: driver (host ") and lines[-1] == "JOB FAILED (exit 1)", proc.stdout
    assert ("ended without a word" if how == "kill" else "exception MemoryError") in lines[4]
    report = json.loads(run_command([CLI, "status", "--json", "--dir", str(tmp_path / "status")], check=False).stdout)
    assert report["outcome"]["state"] == "failed" and report["exit_code"] == 1


def test_a_ray_worker_booted_by_the_setup_hook_records_its_actor_and_rays_sigterm(tmp_path: Path) -> None:
    """Ray's worker loop sets its SIGTERM handler after the runtime env's setup hook booted the plugin: the
    observer is chained in front of it, so the teardown's SIGTERM is recorded (real Ray, an actor importing nothing
    of verl, as fully-async's MessageQueue; the whole job: tests/engine/test_grpo.py, test_fully_async.py)."""
    status = tmp_path / "status"
    script = Path(__file__).parent / "scenarios" / "ray_worker_end.py"
    proc = run_command([sys.executable, str(script), str(status)], {"RAY_USAGE_STATS_ENABLED": "0"}, timeout=180)
    pid = last_json(proc.stdout)["pid"]
    records, _ = collect(str(status))
    (actor,) = [r for r in records if r["pid"] == pid]
    assert (actor["role"], actor["actor_class"], actor["loaded_by"]) == ("ray-worker", "Quiet", ["ray"]), actor
    assert actor["ended"]["how"] == "signal" and actor["ended"]["signal"] == "SIGTERM", actor["ended"]
