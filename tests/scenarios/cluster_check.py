"""Drive verl's real ``run_ppo`` against a running loopback Ray cluster: the cluster check runs right after its
``ray.init``, before the task runner.

Usage: ``cluster_check.py ADDRESS OUT``. verl's own ``ppo_trainer`` config is composed with Hydra; ``run_ppo`` calls
the patched ``get_ppo_ray_runtime_env`` (which arms the check), merges the runtime env and calls
``ray.init(address=...)``. The task runner passed to ``run_ppo`` stands in for verl's (no training): it starts one
actor pinned to every alive node, as a job's worker groups do, and writes to OUT what each saw (whether the plugin
booted in it), so the test knows whether the job got past the check. A ``ClusterCheckError`` ends this driver as it
ends verl's (the traceback, exit 1).
"""

from __future__ import annotations

import json
import os
import sys

import ray
import verl
from hydra import compose, initialize_config_dir
from verl.trainer import main_ppo

ADDRESS, OUT = sys.argv[1], sys.argv[2]
CONFIG_DIR = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
HEAD = "node:__internal_head__"


@ray.remote(num_cpus=0, max_restarts=0)
class Worker:
    """One of the job's workers on a node: says whether the plugin booted in its process (the job's setup hook)."""

    def describe(self) -> dict:
        boot = sys.modules.get("verl_ascend_ext.runtime.boot")
        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "actor_id": ray.get_runtime_context().get_actor_id(),
                "booted_by": list(boot.loaded_by()) if boot is not None else []}


@ray.remote(num_cpus=0)
class Runner:
    """Stands in for verl's TaskRunner: same ``run(config)`` call; one Worker per alive node instead of training."""

    def run(self, config) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = sorted((n for n in ray.nodes() if n["Alive"]), key=lambda n: (HEAD not in n["Resources"], n["NodeID"]))
        workers = [Worker.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False))
                   .remote() for n in nodes]
        runner = {"node_id": ray.get_runtime_context().get_node_id(),
                  "actor_id": ray.get_runtime_context().get_actor_id()}
        with open(OUT, "w") as f:
            json.dump({"workers": ray.get([w.describe.remote() for w in workers]), "runner": runner}, f)


with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
    config = compose(config_name="ppo_trainer", overrides=[f"+ray_kwargs.ray_init.address={ADDRESS}"])
main_ppo.run_ppo(config, task_runner_class=Runner)
ray.shutdown()
