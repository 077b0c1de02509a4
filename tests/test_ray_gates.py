"""Gates reach every Ray node: verl's real ``run_ppo`` on a real 3-node loopback Ray cluster (verl 0.9.0 and 0.9.1).

The cluster's raylets are started without any of this package's variables; a driver subprocess sets
them (or not) and runs ``tests/scenarios/ray_gates.py``, which calls verl's ``run_ppo`` (patched
``get_ppo_ray_runtime_env`` -> OmegaConf.merge with the user's runtime env -> ``ray.init``). Probe tasks
pinned to each node report the variables their worker process sees and, read from /proc, those of
the raylet that started it. `verl-ascend status --ray` on such a job: ``test_ray_status.py``.
"""

from __future__ import annotations

import sys

import pytest
from raycluster import driver_env, three_nodes
from repo import REPO
from subprocesses import last_json, run_command

SCENARIO = str(REPO / "tests" / "scenarios" / "ray_gates.py")
GATE = "VERL_ASCEND_EXT_DISTILLATION_FIXES"
DISABLE = "VERL_ASCEND_EXT_DISABLE"

pytestmark = [pytest.mark.anyverl, pytest.mark.long_module]  # Ray clusters of 3 nodes (~60 s)


@pytest.fixture(scope="module")
def cluster():
    with three_nodes() as found:
        yield found


def run_cases(address: str, *cases: str, **env: str) -> dict:
    proc = run_command([sys.executable, SCENARIO, address, *cases], driver_env(**env), check=False, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return last_json(proc.stdout)


@pytest.fixture(scope="module")
def with_hook(cluster) -> dict:
    """One driver process runs the three cases (importing verl's trainer once)."""
    c, _ = cluster
    out = run_cases(c.address, "driver", "user", "unset")
    assert out["status"] == "applied" and out["main_ppo_bound_to_patched"] is True
    return out["cases"]


def by_node(out: dict, workers: set[str]) -> tuple[dict, list[dict]]:
    probes = {p["node_id"]: p for p in out["probes"]}
    assert len(probes) == 3 and workers <= set(probes)
    assert all(p["raylet_is_parent"] for p in probes.values())
    return probes, [probes[w] for w in workers]


def test_gate_set_only_in_the_driver_reaches_workers_on_every_node(cluster, with_hook) -> None:
    _, workers = cluster
    out = with_hook["driver"]
    assert out["default_env_vars"] == {GATE: "0", DISABLE: "padding-teacher-fields"}
    assert out["job"] == out["driver_job"] and out["job"].endswith(".json"), out  # the driver's record name
    probes, non_head = by_node(out, workers)
    for p in non_head:  # the raylet of a non-head node never had the gates...
        assert p["raylet"] == {GATE: None, DISABLE: None}
    for p in probes.values():  # ...yet every worker on every node sees the driver's values, and its job
        assert p["worker"] == {GATE: "0", DISABLE: "padding-teacher-fields"} and p["job"] == out["job"]
        assert p["booted_by"] == ["ray"]  # the runtime env's setup hook booted the plugin in a worker without verl


def test_user_runtime_env_value_wins(cluster, with_hook) -> None:
    _, workers = cluster
    out = with_hook["user"]
    assert out["default_env_vars"] == {GATE: "0", DISABLE: "padding-teacher-fields"}
    probes, _ = by_node(out, workers)
    for p in probes.values():  # ray_kwargs.ray_init.runtime_env.env_vars.<gate>='1' beats the driver's '0'
        assert p["worker"] == {GATE: "1", DISABLE: "padding-teacher-fields"}


def test_nothing_injected_when_no_gate_is_set(cluster, with_hook) -> None:
    _, workers = cluster
    out = with_hook["unset"]
    assert out["default_env_vars"] == {}
    probes, _ = by_node(out, workers)
    for p in probes.values():
        assert p["worker"] == {GATE: None, DISABLE: None}
        assert p["booted_by"] == ["ray"]  # nothing to carry, yet every worker boots the plugin


def test_without_the_hook_verl_alone_loses_the_gates_on_other_nodes(cluster) -> None:
    c, workers = cluster
    result = run_cases(c.address, "driver", VERL_ASCEND_EXT_FORWARD_ENV="0")  # the failure this feature fixes
    assert result["status"] == "gate-off"
    out = result["cases"]["driver"]
    assert out["default_env_vars"] == {}
    probes, non_head = by_node(out, workers)
    for p in non_head:
        assert p["worker"] == {GATE: None, DISABLE: None}
    assert all(p["booted_by"] == [] for p in probes.values())
