"""What the cluster check adds to a job's start, at 2 and at 32 Ray nodes (loopback raylets on this machine).

For each size a loopback cluster (``tests/raycluster.py``: raylets of their own, 1 CPU each) is started, then a
driver connects as verl's ``run_ppo`` does (the job's runtime env: this plugin's worker setup hook, a gate) and runs
``cluster_check.check`` twice: cold (each node starts the job's first worker: a Python process that boots the plugin,
what a job's start pays) and warm (the workers are up: the asking and comparing alone). Printed side by side per
size, with the compare step alone on the answers (``judge``). On this machine every raylet shares 2 cores, so 32
nodes' first workers start one after the other; on a real cluster each starts on its own machine, in parallel, so the
2-node cold figure is the closer estimate of a real job's cost at any size.

    .venv/bin/python benchmarks/cluster_check_cost.py [--sizes 2 32]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DRIVER = r"""
import json, sys, time, ray
from verl_ascend_ext.features.device import cluster_check, node_inventory
from verl_ascend_ext.features.device.node_ask import alive_nodes, ask_each
from verl_ascend_ext.runtime.boot import RAY_SETUP_HOOK
ray.init(address=sys.argv[1], runtime_env={"worker_process_setup_hook": RAY_SETUP_HOOK,
                                           "env_vars": {"VERL_ASCEND_EXT_DISTILLATION_FIXES": "1"}})
out = {}
for run in ("cold", "warm"):
    t = time.monotonic(); named = cluster_check.check("error", 600); out[run] = time.monotonic() - t
    assert named == [], named
nodes = alive_nodes(ray, workers_only=True)
answers = ask_each(ray, nodes, node_inventory.node_inventory, (), time.monotonic() + 600, by_value=(node_inventory,))
t = time.monotonic(); cluster_check.judge(nodes, answers); out["compare"] = time.monotonic() - t
out["nodes"] = len(nodes)
print(json.dumps(out))
"""


def measure(size: int) -> dict:
    sys.path.insert(0, str(REPO / "tests"))
    from raycluster import driver_env, loopback_cluster

    with loopback_cluster() as cluster:
        started = time.monotonic()
        for _ in range(size - 1):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        up = time.monotonic() - started
        proc = subprocess.run([sys.executable, "-c", DRIVER, cluster.address], env=driver_env(), cwd=REPO,
                              capture_output=True, text=True, timeout=1200, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"the driver at {size} nodes failed:\n{proc.stderr[-3000:]}")
        import json

        return {**json.loads(proc.stdout.strip().splitlines()[-1]), "cluster_up": up}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 32])
    args = parser.parse_args()
    rows = [measure(size) for size in args.sizes]
    print(f"{'nodes':>6} {'check, cold':>12} {'check, warm':>12} {'compare':>9} {'per node (cold)':>16}")
    for r in rows:
        print(f"{r['nodes']:>6} {r['cold']:>10.2f} s {r['warm']:>10.2f} s {r['compare'] * 1e3:>6.1f} ms "
              f"{r['cold'] / r['nodes']:>14.2f} s")
    if len(rows) > 1:
        print(f"cold ratio {rows[-1]['nodes']} / {rows[0]['nodes']} nodes: {rows[-1]['cold'] / rows[0]['cold']:.1f}x "
              f"(this machine's 2 cores start every node's first worker)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
