"""Training across two Ray nodes: verl's own ``main_ppo`` with ``trainer.nnodes=2`` on a loopback cluster of two
raylets, each recording in its own status directory (as two machines do), the plugin's gates set in the driver only.

- ``two-nodes``: verl places one actor rank (with its rollout replica) on each node; the cluster check at the job's
  start finds both alike; both nodes' records show the patches applied and acting; the rank on the second node is
  SIGKILLed once step 1's checkpoint is complete, and ``verl-ascend status --ray``, run while the cluster still runs,
  gathers both nodes' records into one post-mortem that names that rank first.
- ``two-nodes-hidden``: the second node's raylet environment leaves the plugin out (verl's and vLLM's plugin lists):
  the cluster check stops the job before training, naming that node.
- ``two-nodes-hidden-warn``: the same with ``VERL_ASCEND_EXT_CLUSTER_CHECK=warn``: the job trains, and ``status --ray``
  names the second node's actors as having run without the plugin.
"""

from __future__ import annotations

import pytest
from grpo.jobs import Jobs

pytestmark = pytest.mark.verl091  # the engine venv holds verl 0.9.1 (0.9.0 comes from the overlay, per job)


def rank(records: list[dict]) -> dict:
    (found,) = [r for r in records if r.get("actor_class") == "WorkerDict"]
    return found


def test_a_job_on_two_nodes_records_on_both_and_status_ray_names_the_rank_lost_on_the_second(jobs: Jobs) -> None:
    done = jobs["two-nodes"].as_planned()
    assert "cluster check: the 2 node(s) that can take the job's workers agree" in done.log, done.explain()
    head, second = rank(done.node_records(0)), rank(done.node_records(1))
    assert {head["ranks"].get("rank"), second["ranks"].get("rank")} == {0, 1}, (head["ranks"], second["ranks"])
    assert head["ip"] and second["ip"] and head["actor_id"] != second["actor_id"]
    for rec in (head, second):  # the gate reached both nodes from the driver; the fixes applied and acted on both
        assert rec["loaded_by"][0] == "ray" and rec["gates"]["VERL_VLLM_ASCEND_GLM52_PATCH"] is True, rec["gates"]
        for patch in ("weight-sync-kv-barrier", "weight-sync-light-empty-cache", "weight-sync-sender-no-full-gc"):
            assert rec["patches"][patch]["status"] == "applied", (rec["pid"], patch)
            assert rec["patches"][patch]["exercised"] is True, (rec["pid"], patch)
    # the killed process is the second node's rank; the post-mortem across both nodes names it first
    assert done.killed == second["pid"], (done.killed, second["pid"])
    report = done.post_mortem
    assert report is not None and report["exit_code"] == 1, report
    gathered = {p["pid"] for p in report["processes"]}
    assert {head["pid"], second["pid"]} <= gathered, gathered
    first = report["outcome"]["first_failure"]
    assert report["outcome"]["state"] == "failed" and first["pid"] == second["pid"], first
    assert report["without_plugin"] == [], report["without_plugin"]


def test_a_second_node_without_the_plugin_stops_the_job_before_training(jobs: Jobs) -> None:
    done = jobs["two-nodes-hidden"].as_planned()
    error = done.log[done.log.index("ClusterCheckError"):]
    assert "1 of the 2 node(s)" in error, done.explain()
    assert "the plugin does not load in this job's workers there (VERL_USE_EXTERNAL_PLUGINS" in error, error[:3000]
    assert "(node " in error and ", head" not in error.split("  node ")[1].splitlines()[0], error[:3000]
    assert "Fix: give every node the same image" in error
    assert "step:1 " not in done.log and not done.node_records(1), done.explain()  # nothing trained, nothing ran there


def test_with_the_check_set_to_warn_the_job_trains_and_status_ray_names_the_actors_without_the_plugin(
        jobs: Jobs) -> None:
    done = jobs["two-nodes-hidden-warn"].ok()
    assert "cluster check (VERL_ASCEND_EXT_CLUSTER_CHECK=warn): 1 of the 2 node(s)" in done.log, done.explain()
    assert 1 in done.metrics, done.explain()
    assert not done.node_records(1)  # the second node's workers ran without the plugin: no record there
    report = done.post_mortem
    assert report is not None and report["exit_code"] == 1, report
    unrecorded = report["without_plugin"]
    classes = {a["class_name"].rpartition(".")[2] for a in unrecorded}
    assert "WorkerDict" in classes, unrecorded  # the actor rank verl placed on that node
    assert all(a["node_id"] == unrecorded[0]["node_id"] for a in unrecorded), unrecorded  # all on that one node
    assert any("ran without the plugin" in p for p in report["problems"]), report["problems"]
