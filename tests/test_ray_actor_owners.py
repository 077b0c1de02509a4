"""Ray's owner links as the job's watch reads them (``identity.ray_actor_owners``) on a real local Ray: an actor
created by another actor is owned by it, one created by the driver is owned by no actor; the links still hold once
the owner is killed (the watch asks right after a death); no Ray connected here, or a table that does not answer in
time, gives no links."""

from __future__ import annotations

import os
import signal
import time

import pytest

from verl_ascend_ext.runtime.records import identity

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)  # its own, never a running one
    try:
        yield ray
    finally:
        ray.shutdown()


@ray.remote
class Leaf:
    def pid(self) -> int:
        return os.getpid()


@ray.remote
class Owner:
    def __init__(self) -> None:
        self.leaf = Leaf.remote()

    def ids(self) -> tuple[str, str]:
        ray.get(self.leaf.pid.remote())
        return ray.get_runtime_context().get_actor_id(), self.leaf._actor_id.hex()

    def owners_seen_here(self) -> dict[str, str]:
        """What the watch in an actor (verl's trainer runs in one) reads."""
        return identity.ray_actor_owners(10.0)

    def pid(self) -> int:
        return os.getpid()


def test_an_actor_created_by_an_actor_is_owned_by_it_and_still_after_its_death(local_ray) -> None:
    owner = Owner.remote()
    owner_id, leaf_id = ray.get(owner.ids.remote())
    by_driver = Leaf.remote()
    ray.get(by_driver.pid.remote())
    seen_in_actor = ray.get(owner.owners_seen_here.remote())
    assert seen_in_actor.get(leaf_id) == owner_id, seen_in_actor
    assert by_driver._actor_id.hex() not in seen_in_actor and owner_id not in seen_in_actor
    os.kill(ray.get(owner.pid.remote()), signal.SIGKILL)
    from ray._private.state import state

    deadline = time.monotonic() + 120
    while state.actor_table(owner_id).get("State") != "DEAD":
        assert time.monotonic() < deadline, "Ray never marked the killed owner dead"
        time.sleep(0.5)
    assert identity.ray_actor_owners(10.0).get(leaf_id) == owner_id  # what the watch reads right after the death


def test_no_links_without_ray_or_past_the_bound(local_ray, monkeypatch: pytest.MonkeyPatch) -> None:
    from ray._private.state import state

    monkeypatch.setattr(state, "actor_table", lambda *_: time.sleep(5) or {})
    started = time.monotonic()
    assert identity.ray_actor_owners(0.5) == {}
    assert time.monotonic() - started < 3  # the caller never waits past the bound
    monkeypatch.setitem(__import__("sys").modules, "ray", None)
    assert identity.ray_actor_owners(0.5) == {}
