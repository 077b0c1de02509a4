"""TEST-ONLY: start a Ray head node on loopback for one GRPO job, print its address, keep it until stdin closes.

    python ray_head.py NUM_GPUS [NODES_JSON]

NODES_JSON: more nodes, each a raylet of its own on this machine (``{"num_gpus": N, "env_vars": {...}}``: what its
raylet's environment adds to the cluster's), as a job on several machines has: each in PID, UTS and mount
namespaces of its own (``tests/nsnode.py``: host name ``node<i>``, its own ``/proc`` and pids), so that the plugin
on it sees another machine.

Run by ``job.start_ray`` with the cluster's environment (the test's infrastructure, none of this package's
variables), so the head's raylet and every worker it starts have exactly that environment. Ray's own switch
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps every address on loopback (as ``tests/raycluster.py``). The node
offers NUM_GPUS fake "GPU"s (the test platform's resource name; nothing uses a GPU) and 64 CPUs (verl's
placement groups wait forever on fewer).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ray.cluster_utils import Cluster

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: nsnode
from nsnode import NamespacedNode, wait_alive

NODES_TIMEOUT = 300  # Ray's default 30 s: a loaded 2-core machine is slow, not wrong


def main() -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 64, "num_gpus": int(sys.argv[1]),
                                                           "include_dashboard": False})
    nodes: list[NamespacedNode] = []
    try:
        for i, node in enumerate(json.loads(sys.argv[2]) if len(sys.argv) > 2 else [], start=1):
            nodes.append(NamespacedNode(cluster.address, f"node{i}", {**os.environ, **node["env_vars"]},
                                        {"num_cpus": 64, "num_gpus": node["num_gpus"]}, sys.stderr))
            wait_alive(cluster, 1 + i, NODES_TIMEOUT)  # one at a time (nsnode.py: the session's file names)
        print(cluster.address, flush=True)
        sys.stdin.read()  # until the job ends (the test closes our stdin, or kills us)
    finally:
        for node in nodes:
            node.stop()
        cluster.shutdown()


if __name__ == "__main__":
    main()
