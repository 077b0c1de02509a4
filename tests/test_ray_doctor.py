"""``verl-ascend doctor --ray`` against a real loopback Ray cluster (``ray.cluster_utils.Cluster``), run as the CLI.

First all nodes share one environment (exit 0); then nodes are added whose raylets run with plugin
discovery disabled, with a gate set differently, and with the package shadowed by a broken copy
(what a node without a working install looks like): each is reported, the exit code is 1. Bad
addresses end with a clear error and exit 2 within a bounded time.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

import pytest
from raycluster import NODES_TIMEOUT, driver_env, two_nodes
from repo import REPO
from subprocesses import run_command

CLI = str(Path(sys.executable).with_name("verl-ascend"))
GATE = "VERL_ASCEND_EXT_DISTILLATION_FIXES"

# a Ray cluster; verl 0.9.0 only: the nodes' comparison reads no code that differs between verl releases (doctor's
# per-release report: test_doctor.py), and a raylet started beside a training job (the verl 0.9.1 phase of
# scripts/test.sh) can miss Ray's fixed 30 s registration wait on a loaded 2-core machine
pytestmark = pytest.mark.long_module


@pytest.fixture(scope="module")
def cluster():
    with two_nodes() as c:
        yield c


def doctor_ray(*args: str, timeout: float = 180) -> tuple[int, str, str, float]:
    # Run from the repository root: Ray puts the driver's directory on workers' sys.path, and the doctor must
    # still report what each node has installed, not this checkout.
    start = time.monotonic()
    proc = run_command([CLI, "doctor", "--ray", *args], driver_env(), check=False, timeout=timeout, cwd=REPO)
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start


def test_all_nodes_equal_exit_zero(cluster) -> None:
    code, out, err, _ = doctor_ray("--address", cluster.address, "--json")
    assert code == 0, out + err
    report = json.loads(out)
    assert len(report["nodes"]) == 2 and sum(n["is_head"] for n in report["nodes"]) == 1
    assert all(n["answered"] and n["problems"] == [] for n in report["nodes"])
    assert all(n["facts"]["verl loads the plugin"] is True for n in report["nodes"])
    assert report["differences"] == []
    code, text, err, _ = doctor_ray("--address", cluster.address)
    assert code == 0 and "OK: all 2 node(s) agree" in text, text + err


def test_nodes_started_with_a_different_environment_are_reported(cluster, tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "verl_ascend_ext"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('test: verl-ascend-ext broken on this node')\n")
    no_discovery = cluster.add_node(num_cpus=1, env_vars={"VERL_USE_EXTERNAL_PLUGINS": "none"})
    gate_off = cluster.add_node(num_cpus=1, env_vars={GATE: "0"})
    broken = cluster.add_node(num_cpus=1, env_vars={"PYTHONPATH": str(shadow.parent)})
    cluster.wait_for_nodes(NODES_TIMEOUT)

    code, out, err, _ = doctor_ray("--address", cluster.address, "--json")
    assert code == 1, out + err
    report = json.loads(out)
    assert len(report["nodes"]) == 5
    diffs = {d["key"]: d for d in report["differences"]}
    assert sorted(diffs["verl loads the plugin"]["differing"]) == sorted([no_discovery.node_id, broken.node_id])
    assert diffs["verl loads the plugin"]["reference"] is True
    assert diffs[f"gate {GATE}"]["differing"] == [gate_off.node_id]
    assert diffs[f"gate {GATE}"]["values"][gate_off.node_id] == "off"
    assert diffs["patch distill-fsdp2-topk"]["values"][gate_off.node_id] == "gate-off"
    assert diffs["plugin installed"]["differing"] == [broken.node_id]
    assert all(d["behaviour_changing"] for d in diffs.values() if not d["key"].endswith("(raw)"))
    problems = {n["node_id"]: n["problems"] for n in report["nodes"]}
    assert any("VERL_USE_EXTERNAL_PLUGINS='none' excludes this plugin" in p for p in problems[no_discovery.node_id])
    assert any("not importable" in p and "broken on this node" in p for p in problems[broken.node_id])
    assert problems[gate_off.node_id] == []  # a valid setting, but not the one the other nodes run with

    code, text, err, _ = doctor_ray("--address", cluster.address)
    assert code == 1 and "PROBLEMS FOUND (exit 1)" in text, text + err
    assert f"gate {GATE}" in text and no_discovery.node_id[:8] in text and broken.node_id[:8] in text


def test_unreachable_address_fails_fast_with_a_clear_error() -> None:
    with socket.socket() as s:  # a free loopback port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, _, err, seconds = doctor_ray("--address", f"127.0.0.1:{port}", timeout=60)
    assert code == 2 and seconds < 30
    assert f"cannot reach a Ray cluster at 127.0.0.1:{port}" in err and "ray start --head" in err


def test_silent_endpoint_is_bounded_by_the_timeout() -> None:
    with socket.socket() as listener:  # accepts TCP but never speaks Ray: ray.init alone would retry for minutes
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        code, _, err, seconds = doctor_ray("--address", f"127.0.0.1:{port}", "--timeout", "8", timeout=60)
    assert code == 2 and seconds < 30
    assert f"no result from the Ray cluster at 127.0.0.1:{port} within 8 s" in err


def test_malformed_address() -> None:
    code, _, err, _ = doctor_ray("--address", "head-node-without-port")
    assert code == 2 and "is not HOST:PORT" in err
