"""Gates reach every Ray node: verl's real ``run_ppo`` on a real 3-node loopback Ray cluster (verl 0.9.0 and 0.9.1).

The cluster's raylets are started without any of this package's variables; a driver subprocess sets
them (or not) and runs ``tests/scenarios/ray_gates.py``, which calls verl's ``run_ppo`` (patched
``get_ppo_ray_runtime_env`` -> OmegaConf.merge with the user's runtime env -> ``ray.init``). Probe tasks
pinned to each node report the variables their worker process sees and, read from /proc, those of
the raylet that started it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from raycluster import driver_env, loopback_cluster
from repo import REPO
from subprocesses import last_json, run_command

SCENARIO = str(REPO / "tests" / "scenarios" / "ray_gates.py")
CLI = str(Path(sys.executable).with_name("verl-ascend"))
GATE = "VERL_ASCEND_EXT_DISTILLATION_FIXES"
DISABLE = "VERL_ASCEND_EXT_DISABLE"

pytestmark = pytest.mark.anyverl


@pytest.fixture(scope="module")
def cluster():
    with loopback_cluster() as c:
        workers = [c.add_node(num_cpus=1), c.add_node(num_cpus=1)]
        c.wait_for_nodes()
        yield c, {w.node_id for w in workers}


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
    probes, non_head = by_node(out, workers)
    for p in non_head:  # the raylet of a non-head node never had the gates...
        assert p["raylet"] == {GATE: None, DISABLE: None}
    for p in probes.values():  # ...yet every worker on every node sees the driver's values
        assert p["worker"] == {GATE: "0", DISABLE: "padding-teacher-fields"}


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


def test_without_the_hook_verl_alone_loses_the_gates_on_other_nodes(cluster) -> None:
    c, workers = cluster
    result = run_cases(c.address, "driver", VERL_ASCEND_EXT_FORWARD_ENV="0")  # the failure this feature fixes
    assert result["status"] == "gate-off"
    out = result["cases"]["driver"]
    assert out["default_env_vars"] == {}
    _, non_head = by_node(out, workers)
    for p in non_head:
        assert p["worker"] == {GATE: None, DISABLE: None}


def wait_for(path: Path, proc: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the driver ended early ({proc.returncode}); see its log")
        assert time.monotonic() < deadline, f"{path} did not appear within {seconds} s"
        time.sleep(0.5)


def test_status_ray_lists_every_process_of_a_running_job(cluster, tmp_path: Path) -> None:
    """verl's run_ppo with workers on every node (one with the gate overridden to 0, one killed): `status --ray`."""
    c, workers = cluster
    status_dir, hold = tmp_path / "status", tmp_path / "hold"
    hold.mkdir()
    env = driver_env(VERL_ASCEND_EXT_STATUS_DIR=str(status_dir), RAY_GATES_HOLD_DIR=str(hold))
    log = (tmp_path / "driver.log").open("w+")  # a file, not a pipe: a full pipe would block the driver
    driver = subprocess.Popen([sys.executable, SCENARIO, c.address, "hold"], env=env, stdout=log, stderr=log,
                              text=True)
    try:
        wait_for(hold / "ready.json", driver, 240)
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
        assert p["loaded_by"] == ["verl"] and p["patches"]["ray-runtime-env-gates"] in ("pending", "applied")
    assert procs[info["overridden"]["pid"]]["patches"]["distill-fsdp2-topk"] == "gate-off"
    assert procs[info["worker1"]["pid"]]["patches"]["distill-fsdp2-topk"] == "pending"
    assert procs[victim]["alive"] is False
    active = [p for p in report["processes"] if p["alive"] is not False]
    assert len(active) == 6 and report["active"] == 6 and report["dead"] == 1
    assert sum(report["summary"]["distill-fsdp2-topk"].values()) == 6  # the killed worker is not counted
    assert report["summary"]["distill-fsdp2-topk"]["gate-off"] == 1
    overridden = info["overridden"]
    expected = (f"{overridden['host']} pid {overridden['pid']} (ray-worker Holder): settings differ from driver "
                f"{procs[driver.pid]['host']} pid {driver.pid} (driver): {GATE}=off (on in the "
                "reference)")
    assert expected in report["problems"], report["problems"]
    assert len(report["problems"]) == 1, report["problems"]
    assert text.returncode == 1 and f"pid {overridden['pid']}" in text.stdout and "dead" in text.stdout
