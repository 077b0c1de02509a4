"""Drive verl's real ``run_ppo`` against a running multi-node Ray cluster and report what each node's worker saw.

Usage: ``ray_gates.py ADDRESS CASE...``, each CASE one of ``driver`` (gates set in this driver only),
``user`` (same, plus the user's Hydra override of one gate in ``ray_kwargs.ray_init.runtime_env.env_vars``)
or ``unset`` (no gate set), run one after the other (``ray.shutdown()`` in between). verl's own
``ppo_trainer`` config is composed with Hydra; ``run_ppo`` calls the (patched) ``get_ppo_ray_runtime_env``,
merges the user's runtime env with OmegaConf and calls ``ray.init(address=..., runtime_env=...)`` itself.
The task runner passed to ``run_ppo`` stands in for verl's (no training): it runs one probe task pinned
to every alive node. Prints one JSON line: ``{case: result}``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import ray
import verl
from hydra import compose, initialize_config_dir
from verl.trainer import main_ppo

GATE = "VERL_ASCEND_EXT_DISTILLATION_FIXES"
DISABLE = "VERL_ASCEND_EXT_DISABLE"
ADDRESS, CASES = sys.argv[1], sys.argv[2:]
RESULT = os.path.join(tempfile.mkdtemp(prefix="ray-gates-"), "probes.json")
CONFIG_DIR = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")


@ray.remote(num_cpus=0)
def probe() -> dict:
    raylet_env = {}
    with open(f"/proc/{os.getppid()}/environ", "rb") as f:  # this worker's parent is its node's raylet
        for item in f.read().split(b"\0"):
            key, _, value = item.decode(errors="replace").partition("=")
            raylet_env[key] = value
    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "worker": {k: os.environ.get(k) for k in (GATE, DISABLE)},
        "raylet": {k: raylet_env.get(k) for k in (GATE, DISABLE)},
        "raylet_is_parent": "raylet" in open(f"/proc/{os.getppid()}/cmdline", "rb").read().decode(errors="replace"),
    }


@ray.remote(num_cpus=0)
class ProbeRunner:
    """Stands in for verl's TaskRunner: same ``run(config)`` call, probes every node instead of training."""

    def run(self, config) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = [n for n in ray.nodes() if n["Alive"]]
        refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False))
                .remote() for n in nodes]
        with open(RESULT, "w") as f:
            json.dump(ray.get(refs), f)


def run_case(case: str) -> dict:
    overrides = [f"+ray_kwargs.ray_init.address={ADDRESS}"]
    os.environ.pop(GATE, None)
    os.environ.pop(DISABLE, None)
    if case in ("driver", "user"):
        os.environ[GATE] = "0"
        os.environ[DISABLE] = "padding-teacher-fields"
    if case == "user":
        overrides.append(f"+ray_kwargs.ray_init.runtime_env.env_vars.{GATE}='1'")
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    default_runtime_env = main_ppo.get_ppo_ray_runtime_env(config)  # what run_ppo merges the user's env into
    main_ppo.run_ppo(config, task_runner_class=ProbeRunner)
    with open(RESULT) as f:
        probes = json.load(f)
    ray.shutdown()
    return {
        "default_env_vars": {k: v for k, v in default_runtime_env["env_vars"].items() if k.startswith("VERL_ASCEND")},
        "probes": probes,
    }


results = {case: run_case(case) for case in CASES}

from verl_ascend_ext import patch_statuses  # noqa: E402

print(json.dumps({
    "verl": verl.__version__,
    "status": patch_statuses()["ray-runtime-env-gates"].status.value,
    "main_ppo_bound_to_patched": main_ppo.get_ppo_ray_runtime_env is sys.modules["verl.trainer.constants_ppo"]
    .get_ppo_ray_runtime_env,
    "cases": results,
}))
