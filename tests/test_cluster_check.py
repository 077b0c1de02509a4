"""The cluster check at a job's start, on a real loopback Ray cluster with verl's real ``run_ppo``.

A driver subprocess runs ``tests/scenarios/cluster_check.py``: verl's ``run_ppo`` (the patched
``get_ppo_ray_runtime_env`` arms the check; ``ray.init`` runs it), then a stand-in task runner that starts one actor
pinned to every alive node and writes what each saw. The cluster's raylets start without any of this package's
variables; nodes are added whose raylet's environment differs: one that leaves the plugin out
(``VERL_USE_EXTERNAL_PLUGINS=none``: its workers run without it), one with a gate set differently, one with a broken
copy of the package (what a node without a working install looks like: the job's workers die at their setup hook).
Default (``error``): the job stops before its task runner, the message naming the node, what differs (both values)
and the fix. ``warn``: the job runs; ``verl-ascend status --ray`` names its actor on the node without the plugin.
``off``: nothing is asked. The check's cost on 2 and 32 nodes: ``benchmarks/cluster_check_cost.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from raycluster import NODES_TIMEOUT, driver_env, two_nodes
from repo import REPO
from subprocesses import run_command

SCENARIO = str(REPO / "tests" / "scenarios" / "cluster_check.py")
CLI = str(Path(sys.executable).with_name("verl-ascend"))
GATE = "VERL_ASCEND_EXT_DISTILLATION_FIXES"
MODE = "VERL_ASCEND_EXT_CLUSTER_CHECK"

pytestmark = pytest.mark.long_module  # a Ray cluster, verl's run_ppo (verl 0.9.0: 0.9.1's is alike)


@pytest.fixture(scope="module")
def cluster():
    with two_nodes() as c:
        yield c


def job(cluster, tmp_path: Path, **env: str) -> tuple[int, str, dict | None]:
    """Run the scenario's driver: (exit code, its output, what the task runner wrote or None when it never ran)."""
    out = tmp_path / "runner.json"
    proc = run_command([sys.executable, SCENARIO, cluster.address, str(out)],
                       driver_env(VERL_ASCEND_EXT_STATUS_DIR=str(tmp_path / "status"), **env), check=False,
                       timeout=300, cwd=REPO)
    return proc.returncode, proc.stdout + proc.stderr, json.loads(out.read_text()) if out.exists() else None


def added(cluster, **env: str):
    node = cluster.add_node(num_cpus=1, env_vars=env)
    cluster.wait_for_nodes(NODES_TIMEOUT)
    return node


def test_nodes_that_agree_pass_and_the_job_runs(cluster, tmp_path: Path) -> None:
    code, log, ran = job(cluster, tmp_path)
    assert code == 0, log[-4000:]
    assert "cluster check: the 2 node(s) that can take the job's workers agree" in log
    assert ran is not None and len(ran["workers"]) == 2
    assert all(w["booted_by"] == ["ray"] for w in ran["workers"])


def test_a_node_that_leaves_the_plugin_out_stops_the_job_before_its_task_runner(cluster, tmp_path: Path) -> None:
    hidden = added(cluster, VERL_USE_EXTERNAL_PLUGINS="none")
    try:
        code, log, ran = job(cluster, tmp_path)
        assert code == 1 and ran is None, log[-4000:]  # the task runner never started
        assert "ClusterCheckError" in log and "1 of the 3 node(s)" in log, log[-4000:]
        named = log[log.index("ClusterCheckError"):]
        assert f"node {hidden.node_ip_address} (node {hidden.node_id[:8]}" in named
        assert "the plugin does not load in this job's workers there (VERL_USE_EXTERNAL_PLUGINS" in named
        assert "Fix: give every node the same image" in named and f"{MODE}=warn" in named

        # warn: the job trains, its worker on that node without the plugin; status --ray names that actor
        code, log, ran = job(cluster, tmp_path, **{MODE: "warn"})
        assert code == 0, log[-4000:]
        assert "cluster check (VERL_ASCEND_EXT_CLUSTER_CHECK=warn): 1 of the 3 node(s)" in log
        workers = {w["node_id"]: w for w in ran["workers"]}
        assert workers[hidden.node_id]["booted_by"] == []
        assert all(w["booted_by"] == ["ray"] for n, w in workers.items() if n != hidden.node_id)
        proc = run_command([CLI, "status", "--ray", "--address", cluster.address, "--json", "--dir",
                            str(tmp_path / "status")], driver_env(), check=False, timeout=180, cwd=REPO)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        report = json.loads(proc.stdout)
        unrecorded = report["without_plugin"]
        on_hidden = {workers[hidden.node_id]["actor_id"]}  # and the task runner, when Ray placed it there
        on_hidden |= {ran["runner"]["actor_id"]} if ran["runner"]["node_id"] == hidden.node_id else set()
        assert {a["actor_id"] for a in unrecorded} == on_hidden, unrecorded
        assert any("ray actor Worker" in p and "ran without the plugin" in p for p in report["problems"])

        # off: nothing asked, nothing said
        code, log, ran = job(cluster, tmp_path, **{MODE: "off"})
        assert code == 0 and ran is not None and "cluster check" not in log, log[-4000:]
    finally:
        cluster.remove_node(hidden)


def test_a_gate_set_differently_and_a_copy_that_does_not_import_are_each_named(cluster, tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "verl_ascend_ext"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('test: verl-ascend-ext broken on this node')\n")
    odd = added(cluster, **{GATE: "0"})  # the driver does not set it: each node's raylet decides
    broken = added(cluster, PYTHONPATH=str(shadow.parent))
    try:
        code, log, ran = job(cluster, tmp_path)
        assert code == 1 and ran is None, log[-4000:]
        named = log[log.index("ClusterCheckError"):]
        assert "2 of the 4 node(s)" in named, named[:3000]
        odd_part = named[named.index(f"(node {odd.node_id[:8]}"):]
        assert odd_part.splitlines()[1].strip() == f"- gate {GATE}: off here, on on 2 other node(s)", named[:3000]
        broken_part = named[named.index(f"(node {broken.node_id[:8]}"):]
        assert "no worker of this job could answer there" in broken_part.splitlines()[1], named[:3000]
    finally:
        cluster.remove_node(odd)
        cluster.remove_node(broken)


def test_an_unknown_mode_stops_the_driver_naming_the_variable(cluster, tmp_path: Path) -> None:
    code, log, ran = job(cluster, tmp_path, **{MODE: "sometimes"})
    assert code != 0 and ran is None
    assert f"{MODE}='sometimes' is not a mode of the cluster check" in log, log[-4000:]


def test_an_actor_whose_record_predates_it_still_ties_its_ray_job_to_the_records() -> None:
    """A record written before its process became an actor (no actor id in it: a short-lived actor killed by Ray
    within the flusher's delay, seen in CI under load) still names its Ray job, by its address and pid: the actor of
    that job that left no record is named; an actor of another job, or one that never got a process, is not."""
    from verl_ascend_ext.tooling.cluster.status_ray import without_record

    def actor(actor_id: str, job: str, pid: int, ip: str = "10.0.0.1") -> dict:
        return {"actor_id": actor_id, "job_id": job, "pid": pid, "ip": ip}

    actors = [actor("runner", "job-a", 11), actor("hidden", "job-a", 12, "10.0.0.2"), actor("never", "job-a", 0),
              actor("other", "job-b", 13, "10.0.0.2")]
    early = [{"ip": "10.0.0.1", "pid": 11, "actor_id": None}]  # the runner's record, written at its boot
    assert [a["actor_id"] for a in without_record(actors, early)] == ["hidden"]
    assert without_record(actors, [{"ip": "10.0.0.9", "pid": 11, "actor_id": None}]) == []  # no actor of it: no job
    named = [{"ip": "10.0.0.3", "pid": 99, "actor_id": "runner"}]  # its actor id, as before
    assert [a["actor_id"] for a in without_record(actors, named)] == ["hidden"]
