"""A method of a ``@ray.remote`` class is patched where the actor runs it (``patching.engine.ray_actor_class``).

verl declares its fully-async trainer and rollouter ``@ray.remote``: the module holds Ray's ``ActorClass`` wrapper,
and a method set on it is not what the actor runs (found in a fully-async job of the engine tier: the record said
"applied" and never acted). Ray sends the class by value from the process that creates the actor. Here the driver
(which creates the actor) and the real Ray worker (its setup hook, where the plugin boots) each patch ``fit``, one
way or the other, then the actor runs it.
"""

from __future__ import annotations

import json

import pytest
from repo import REPO
from subprocesses import run_python

SCENARIOS = str(REPO / "tests" / "scenarios")
DRIVER = """
import json, sys
sys.path.insert(0, {path!r})
import ray
import remote_class
remote_class.{way}()
env = {{"worker_process_setup_hook": "remote_class.{way}", "env_vars": {{"PYTHONPATH": {path!r}}}}}
ray.init(address="local", num_cpus=1, include_dashboard=False, runtime_env=env)
print(json.dumps({{"ran": ray.get(remote_class.Trainer.remote().fit.remote())}}))
ray.shutdown()
"""


@pytest.mark.parametrize(("way", "ran"), [("apply_on_the_class_the_engine_finds", "patched fit"),
                                          ("set_on_the_wrapper", "verl's fit")])
def test_a_method_patched_by_the_engine_is_what_the_actor_runs(way: str, ran: str) -> None:
    out = json.loads(run_python(DRIVER.format(path=SCENARIOS, way=way), {}).stdout.strip().splitlines()[-1])
    assert out["ran"] == ran, out
