"""A class declared ``@ray.remote`` in an importable module, as verl declares its fully-async trainer and rollouter,
and a patch record for its ``fit`` (``tests/test_ray_actor_patch.py``). The engine applies it in each process where
the module is imported, as the plugin does: in the process that creates the actor and in the actor's process."""

from __future__ import annotations

from typing import Any

import ray

from verl_ascend_ext.patching.gates import Gate
from verl_ascend_ext.patching.record import Fingerprint, PatchRecord


@ray.remote(num_cpus=0)
class Trainer:
    def fit(self) -> str:
        return "verl's fit"


def patched_fit(original: Any, self: object) -> str:
    return "patched fit"


RECORD = PatchRecord(
    id="test-remote-class-fit", feature="test", why="a method of a @ray.remote class",
    target="remote_class:Trainer.fit", gate=Gate("TEST_REMOTE_CLASS_FIT", True, "test only"), distribution="ray",
    versions=">=2", original=Fingerprint(contains=(r"return \"verl's fit\"",), description="verl's fit"),
    fixed=Fingerprint.never_matching("test only"), wrapper="remote_class:patched_fit", upstream="none",
    remove_when="never", traced=False)


def apply_on_the_class_the_engine_finds() -> None:
    from verl_ascend_ext.patching import engine

    engine.apply(RECORD)


def set_on_the_wrapper() -> None:
    """What the engine did before ``ray_actor_class``: set the method on the ``ActorClass`` wrapper."""
    Trainer.fit = lambda self: "patched fit"
