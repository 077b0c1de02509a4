"""TEST-ONLY: start a Ray head node on loopback for one GRPO job, print its address, keep it until stdin closes.

    python ray_head.py NUM_GPUS [NODES_JSON]

NODES_JSON: more nodes, each a raylet of its own on this machine (``{"num_gpus": N, "env_vars": {...}}``: what its
raylet's environment adds to the cluster's), as a job on several machines has.

Run by ``job.start_ray`` with the cluster's environment (the test's infrastructure, none of this package's
variables), so the head's raylet and every worker it starts have exactly that environment. Ray's own switch
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps every address on loopback (as ``tests/raycluster.py``). The node
offers NUM_GPUS fake "GPU"s (the test platform's resource name; nothing uses a GPU) and 64 CPUs (verl's
placement groups wait forever on fewer).
"""

from __future__ import annotations

import json
import sys

from ray.cluster_utils import Cluster


def main() -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 64, "num_gpus": int(sys.argv[1]),
                                                           "include_dashboard": False})
    try:
        for node in json.loads(sys.argv[2]) if len(sys.argv) > 2 else []:
            cluster.add_node(num_cpus=64, num_gpus=node["num_gpus"], env_vars=node["env_vars"])
        cluster.wait_for_nodes(300)  # Ray's default 30 s: a loaded 2-core machine is slow, not wrong
        print(cluster.address, flush=True)
        sys.stdin.read()  # until the job ends (the test closes our stdin, or kills us)
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main()
