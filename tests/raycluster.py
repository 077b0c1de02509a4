"""A real multi-node Ray cluster on this machine for tests: ``ray.cluster_utils.Cluster``, loopback only.

Every node is a separate raylet (own processes, own environment) on 127.0.0.1: Ray's own switch
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` makes Ray pick the loopback address for every node, driver and
worker. Nodes are started without the variables ``subprocesses.scrubbed_env`` removes (removed from the
environment while the cluster starts), so a variable a worker sees came through Ray, not from its raylet.
No dashboard. ``namespaced_nodes`` adds worker nodes that look like other machines to the plugin (their own host
name, ``/proc`` and pids: ``nsnode.py``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import pytest
from nsnode import NamespacedNode, wait_alive
from subprocesses import scrubbed, scrubbed_env

LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
# seconds the nodes may take to show as alive in the GCS (Ray's default: 30): a loaded 2-core machine starting a raylet
# beside a training job is slow, never wrong; a node that never registers still fails the wait, named by Ray
NODES_TIMEOUT = 300.0


@contextmanager
def loopback_cluster(head_env: Mapping[str, str] | None = None) -> Iterator[object]:
    """A head node (1 CPU) on loopback, its raylet started with ``head_env`` added; add nodes with
    ``cluster.add_node(num_cpus=1, env_vars=...)``."""
    import ray._private.ray_constants as ray_constants
    from ray.cluster_utils import Cluster

    with pytest.MonkeyPatch.context() as mp:
        for key in [k for k in os.environ if scrubbed(k)]:
            mp.delenv(key)
        for key, value in {**LOOPBACK, **(head_env or {})}.items():
            mp.setenv(key, value)
        mp.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)  # this process imported ray before the switch
        # port 0: the dashboard agent's fixed default (52365) would clash with another test worker's cluster
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                               "dashboard_agent_listen_port": 0})
        try:
            yield cluster
        finally:
            cluster.shutdown()


@contextmanager
def two_nodes() -> Iterator[object]:
    """A head and one worker node (1 CPU each) on loopback; more nodes may be added."""
    with loopback_cluster() as cluster:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes(NODES_TIMEOUT)
        yield cluster


@contextmanager
def three_nodes() -> Iterator[tuple[object, set[str]]]:
    """A head and two worker nodes (1 CPU each) on loopback: the cluster and the worker nodes' ids."""
    with loopback_cluster() as cluster:
        workers = [cluster.add_node(num_cpus=1), cluster.add_node(num_cpus=1)]
        cluster.wait_for_nodes(NODES_TIMEOUT)
        yield cluster, {w.node_id for w in workers}


@contextmanager
def namespaced_nodes(cluster: object, envs: list[Mapping[str, str]]) -> Iterator[list[NamespacedNode]]:
    """Worker nodes (1 CPU each) joined to ``cluster`` (inside ``loopback_cluster``), node i in namespaces of its own
    named ``node<i>`` (from 1), its raylet's environment the cluster's with ``envs[i - 1]`` added; stopped after."""
    nodes: list[NamespacedNode] = []
    try:
        for i, env in enumerate(envs, start=1):
            nodes.append(NamespacedNode(cluster.address, f"node{i}", {**os.environ, **env},  # type: ignore[attr-defined]
                                        {"num_cpus": 1}))
            wait_alive(cluster, 1 + i, NODES_TIMEOUT)  # one at a time (nsnode.py: the session's file names)
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def driver_env(**extra: str) -> dict[str, str]:
    """Environment for a driver subprocess: the scrubbed one (``subprocesses.scrubbed_env``), on loopback, ``extra``."""
    return scrubbed_env({**LOOPBACK, **extra})
