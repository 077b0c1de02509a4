"""`verl-ascend status --ray` on a running job: verl's real ``run_ppo`` on a real 3-node loopback Ray cluster, with
workers on every node (one with a gate overridden, one killed), read back from every node.

Runs on verl 0.9.0 only: what it proves (records gathered from every node, the dead worker, the settings that
differ) does not depend on the verl release; ``test_ray_gates.py`` runs the forwarding itself on both.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from raycluster import driver_env, three_nodes
from repo import REPO
from subprocesses import run_command

from verl_ascend_ext.features.job_watch.far_nodes import GATHER_TIMEOUT
from verl_ascend_ext.features.job_watch.patch_code import LAST_LOOK_WAIT

pytestmark = pytest.mark.long_module  # a 3-node Ray cluster and a running job (~25 s)
SCENARIO = str(REPO / "tests" / "scenarios" / "ray_gates.py")
CLI = str(Path(sys.executable).with_name("verl-ascend"))
GATE = "VERL_ASCEND_EXT_DISTILLATION_FIXES"


@pytest.fixture(scope="module")
def cluster():
    with three_nodes() as found:
        yield found


STALL = 300.0  # seconds with no sign of progress (the driver's log, a record written) before a start counts as hung
CEILING = 1800.0  # seconds in all: a start that keeps moving is waited for (a loaded 2-core machine took > 240 s)
# A lost process ends a held job: the watch's own part (the death seen, dated in the records) is bounded tightly,
# SEEN (its looks and the trainer's come each second; a busy machine x3); the job's end as a test sees it (the
# driver's exit) loosely, JOB_END: the trainer's last round and gathering (the job watch's own bounds) and Ray
# ending the driver, RAY_ENDS_DRIVER: 3 s on an idle 2-core machine, 15 s on a busy one (a landing run beside a
# training job, where test_far_watch.py's silent node took 30 s in all, ~15 s idle), x3.
SEEN = 10.0
RAY_ENDS_DRIVER = 45.0
JOB_END = LAST_LOOK_WAIT + GATHER_TIMEOUT + RAY_ENDS_DRIVER


def progress(*paths: Path) -> float:
    """The newest change under ``paths`` (files' modification times): a starting job writes its log and records."""
    newest = 0.0
    for path in paths:
        for found in ([path] if path.is_file() else path.rglob("*") if path.is_dir() else []):
            with contextlib.suppress(OSError):
                newest = max(newest, found.stat().st_mtime)
    return newest


def wait_for(path: Path, proc: subprocess.Popen, *watched: Path) -> None:
    """Wait for ``path`` while the driver runs and the job shows progress (``watched`` change within ``STALL``
    seconds): a slow machine makes the wait longer, a hung or dead driver ends it, named."""
    started = time.monotonic()
    last_change, last_seen = time.monotonic(), progress(*watched)
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the driver ended early ({proc.returncode}); see its log")
        seen = progress(*watched)
        if seen != last_seen:
            last_change, last_seen = time.monotonic(), seen
        waited = time.monotonic() - started
        assert time.monotonic() - last_change < STALL and waited < CEILING, (
            f"{path} did not appear: {waited:.0f} s waited, {time.monotonic() - last_change:.0f} s without progress "
            f"in {', '.join(map(str, watched))} (bounds: {STALL:g} s without progress, {CEILING:g} s in all)")
        time.sleep(0.5)


def test_status_ray_lists_every_process_of_a_running_job(cluster, tmp_path: Path) -> None:
    """verl's run_ppo with workers on every node (one with the gate overridden to 0, one killed): `status --ray`."""
    c, workers = cluster
    status_dir, hold = tmp_path / "status", tmp_path / "hold"
    hold.mkdir()
    # the job watch off: a killed worker would end the job (the next test), and this one reads the job running
    env = driver_env(VERL_ASCEND_EXT_STATUS_DIR=str(status_dir), RAY_GATES_HOLD_DIR=str(hold),
                     VERL_ASCEND_EXT_JOB_WATCH="0")
    log = (tmp_path / "driver.log").open("w+")  # a file, not a pipe: a full pipe would block the driver
    driver = subprocess.Popen([sys.executable, SCENARIO, c.address, "hold"], env=env, stdout=log, stderr=log,
                              text=True)
    try:
        wait_for(hold / "ready.json", driver, status_dir, tmp_path / "driver.log")
        info = json.loads((hold / "ready.json").read_text())
        assert {info[f"worker{i}"]["node_id"] for i in range(3)} >= workers
        assert info["overridden"]["gate"] == "0" and info["overridden"]["node_id"] in workers
        victim = info["victim"]["pid"]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while os.path.exists(f"/proc/{victim}") and time.monotonic() < deadline:
            time.sleep(0.2)
        proc = run_command([CLI, "status", "--ray", "--address", c.address, "--dir", status_dir, "--json"],
                           driver_env(), check=False, timeout=180, cwd=REPO)
        text = run_command([CLI, "status", "--ray", "--address", c.address, "--dir", status_dir], driver_env(),
                           check=False, timeout=180, cwd=REPO)
    finally:
        (hold / "go").write_text("")
        driver.wait(timeout=240)
        log.close()
    assert driver.returncode == 0, (tmp_path / "driver.log").read_text()[-4000:]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    procs = {p["pid"]: p for p in report["processes"]}
    assert procs[driver.pid]["role"] == "driver" and procs[driver.pid]["alive"] is True
    assert procs[driver.pid]["loaded_by"] == ["verl"]
    assert procs[info["runner"]["pid"]]["role"] == "ray-worker"
    assert procs[info["runner"]["pid"]]["actor_class"] == "HoldRunner"
    for name in ("worker0", "worker1", "worker2", "overridden"):
        p = procs[info[name]["pid"]]
        assert (p["role"], p["actor_class"], p["alive"]) == ("ray-worker", "Holder", True), (name, p)
        # the runtime env's setup hook boots the worker at its start; verl's plugin discovery loads it again
        assert p["loaded_by"] == ["ray", "verl"] and p["patches"]["ray-runtime-env-gates"] in ("pending", "applied")
    assert procs[info["overridden"]["pid"]]["patches"]["distill-fsdp2-topk"] == "gate-off"
    assert procs[info["worker1"]["pid"]]["patches"]["distill-fsdp2-topk"] == "pending"
    assert procs[victim]["alive"] is False
    active = [p for p in report["processes"] if p["alive"] is not False]
    # besides the 6 processes of the job's work, idle pool workers: the cluster check's task ran in one per node
    working = [p for p in active if not p.get("idle")]
    assert len(working) == 6 and report["active"] == len(active) and report["dead"] == 1, active
    assert sum(report["summary"]["distill-fsdp2-topk"].values()) == 6  # the killed worker is not counted
    assert report["summary"]["distill-fsdp2-topk"]["gate-off"] == 1
    overridden = info["overridden"]
    expected = (f"{overridden['host']} pid {overridden['pid']} (ray-worker Holder): settings differ from driver "
                f"{procs[driver.pid]['host']} pid {driver.pid} (driver): {GATE}=off (on in the "
                "reference)")
    assert expected in report["problems"], report["problems"]
    assert len(report["problems"]) == 1, report["problems"]
    assert text.returncode == 1 and f"pid {overridden['pid']}" in text.stdout and "dead" in text.stdout
    # the job runs, one of its workers dead: status says it is lost (as the watch, off here, would), not "all well"
    result = report["outcome"]
    assert result["state"] == "running" and [w["pid"] for w in result["lost_mid_job"]] == [victim], result
    assert result["first_failure"]["pid"] == victim, result
    assert "process(es) of it LOST (exit 1)" in text.stdout, text.stdout


def test_a_worker_killed_mid_job_ends_the_job_within_seconds_named_first(cluster, tmp_path: Path) -> None:
    """The job watch (on by default; run here by the stand-in TaskRunner around its wait, as the ``job-watch`` record
    runs verl's trainer's ``fit``) on the same job: the TaskRunner waits for a ``go`` that never comes (without the
    watch the job would wait for ever); one of its workers is stopped (SIGSTOP) for 4 s, which ends nothing, then
    SIGKILLed. The TaskRunner ends with exit 1 within seconds, saying which worker was lost, so the driver's wait on
    it fails (exit 1), and `verl-ascend status` names that worker first, with the time the watch saw it dead, not
    the time of its last record."""
    c, _ = cluster
    status_dir, hold = tmp_path / "status", tmp_path / "hold"
    hold.mkdir()
    env = driver_env(VERL_ASCEND_EXT_STATUS_DIR=str(status_dir), RAY_GATES_HOLD_DIR=str(hold))
    log = (tmp_path / "driver.log").open("w+")
    driver = subprocess.Popen([sys.executable, SCENARIO, c.address, "hold"], env=env, stdout=log, stderr=log,
                              text=True)
    try:
        wait_for(hold / "ready.json", driver, status_dir, tmp_path / "driver.log")
        info = json.loads((hold / "ready.json").read_text())
        victim = info["victim"]["pid"]
        os.kill(victim, signal.SIGSTOP)  # stalled, alive: never failed for being slow (liveness, not a timeout)
        time.sleep(4)  # four looks of the watch
        stalled = driver.poll()
        os.kill(victim, signal.SIGCONT)
        assert stalled is None, (tmp_path / "driver.log").read_text()[-4000:]
        killed, killed_at = time.monotonic(), time.time()
        os.kill(victim, signal.SIGKILL)
        returncode = driver.wait(timeout=120)
        took = time.monotonic() - killed
    finally:
        (hold / "go").write_text("")  # a driver that did not end lets its runner end
        driver.wait(timeout=240)
        log.close()
    text = (tmp_path / "driver.log").read_text()
    assert returncode == 1 and took < JOB_END, (returncode, took, text[-4000:])
    lost = (f"JobProcessLost: a process of this job was lost while it trained: ray-worker Holder (host "
            f"{info['victim']['host']}, pid {victim}) ended without a word")
    assert lost in text, text[-4000:]
    proc = run_command([CLI, "status", "--dir", status_dir, "--json"], driver_env(), check=False, cwd=REPO)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    result = report["outcome"]
    first = result["first_failure"]
    assert result["state"] == "failed" and first["pid"] == victim, result
    assert first["how"] == f"ended without a word, seen dead by the job watch of pid {info['runner']['pid']}", first
    assert 0 <= first["at"] - killed_at < SEEN, (first["at"] - killed_at, first)  # the watch's own part: seconds
    (runner,) = [p for p in report["processes"] if p["pid"] == info["runner"]["pid"]]
    assert (runner["ended"]["how"], runner["ended"]["error"][0]["type"]) == ("exit", "JobProcessLost"), runner


def test_status_ray_that_reads_no_record_exits_2_naming_where_each_node_looked_json_only(cluster,
                                                                                         tmp_path: Path) -> None:
    """A ``${NAME}`` directory no node's environment names, given quoted: expanded on each node (left as written
    there), nothing read: exit 2 naming each node's directory; ``--json`` prints one JSON document on stdout."""
    c, _ = cluster
    proc = run_command([CLI, "status", "--ray", "--address", c.address, "--dir", "${NO_SUCH_VARIABLE}/status",
                        "--json"], driver_env(), check=False, timeout=180, cwd=REPO)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)  # JSON only: Ray's own lines went to stderr
    (error,) = report["notes"]
    assert "no process record on any of the 3 node(s) that answered" in error, error
    assert error.count("${NO_SUCH_VARIABLE}/status") == 3 and "Fix: pass the job's" in error, error


def test_what_ray_prints_while_status_ray_is_connected_goes_to_stderr() -> None:
    """Ray's threads print to file descriptor 1 (e.g. "node ... has been marked dead"): held off stdout."""
    code = ("import os, sys\nfrom verl_ascend_ext.tooling.cluster.status_ray import stdout_to_stderr\n"
            "with stdout_to_stderr():\n    os.write(1, b'ray says\\n')\n    print('python says')\nprint('{}')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert proc.stdout == "{}\n" and "ray says" in proc.stderr and "python says" in proc.stderr, proc
