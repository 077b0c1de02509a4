"""What the job watch on every node costs, at 2 and at 32 Ray nodes (loopback raylets on this machine).

For each size a loopback cluster (``tests/raycluster.py``: raylets of their own, 1 CPU each) is started, then a
driver connects as a job does (the plugin's worker setup hook, a job id, one status directory) and starts the watch
on every other node as the trainer's ``fit`` does (``features.job_watch.far_nodes.FarWatches``). After the watches
answer, it hears them once a second (the trainer's watch's interval) for ``--seconds`` seconds and prints, side by
side: the CPU time each node's watch process used over that time (percent of one core: median and worst over the
nodes; ``/proc/<pid>/stat``), and what the trainer's side paid per round to hear every node (the thread's CPU time
and the wall time of ``hear``, which never waits on a node). On this machine every raylet shares 2 cores: the
figures at 32 nodes are an upper bound of what one node pays on a cluster.

    .venv/bin/python benchmarks/job_watch_cost.py [--sizes 2 32] [--seconds 30]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DRIVER = r"""
import json, os, statistics, sys, time, ray
from verl_ascend_ext.features.job_watch.far_nodes import FarWatches
from verl_ascend_ext.runtime.boot import RAY_SETUP_HOOK
seconds = float(sys.argv[2])
ray.init(address=sys.argv[1], runtime_env={"worker_process_setup_hook": RAY_SETUP_HOOK, "env_vars": {
    k: v for k, v in os.environ.items() if k.startswith("VERL_ASCEND_EXT_")}})
far = FarWatches(ray, os.environ["VERL_ASCEND_EXT_JOB"], time.time(), None, 600.0)
deadline = time.monotonic() + 600
while len(far.heard) < len(far.handles) and time.monotonic() < deadline:
    assert far.hear() == [], "a loss in an idle cluster"
    time.sleep(0.2)
pids = {nid: answer["pid"] for nid, (_, _, answer) in far.heard.items()}
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
@ray.remote(num_cpus=0)
class Idle:  # a bare actor on each node: what any Ray worker process costs doing nothing
    def pid(self):
        return os.getpid()
idlers = {nid: Idle.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=nid, soft=False)).remote()
          for nid in pids}
bare = {nid: ray.get(a.pid.remote()) for nid, a in idlers.items()}
def cpu(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
def window(heard, pids=pids):
    before = {nid: cpu(pid) for nid, pid in pids.items()}
    rounds_cpu, rounds_wall = [], []
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        c, w = time.thread_time(), time.perf_counter()
        if heard:
            assert far.hear() == [], "a loss in an idle cluster"
        rounds_cpu.append(time.thread_time() - c); rounds_wall.append(time.perf_counter() - w)
        time.sleep(max(0.0, 1.0 - (time.perf_counter() - w)))
    took = time.monotonic() - started
    use = sorted(100 * (cpu(pid) - before[nid]) / took for nid, pid in pids.items())
    return use, rounds_cpu, rounds_wall
idle, _, _ = window(False)  # the watches look every second, nobody asks them
bare_use, _, _ = window(False, bare)  # a bare actor, asked nothing
use, rounds_cpu, rounds_wall = window(True)
far.stop()
print(json.dumps({"nodes": len(pids) + 1, "watch_core_pct_median": statistics.median(use),
                  "watch_core_pct_worst": use[-1], "unheard_core_pct_median": statistics.median(idle),
                  "bare_core_pct_median": statistics.median(bare_use),
                  "hear_cpu_ms": 1000 * statistics.fmean(rounds_cpu),
                  "hear_wall_ms": 1000 * statistics.fmean(rounds_wall), "rounds": len(rounds_cpu)}))
"""


def measure(size: int, seconds: float) -> dict:
    sys.path.insert(0, str(REPO / "tests"))
    from raycluster import NODES_TIMEOUT, driver_env, loopback_cluster

    with loopback_cluster() as cluster, tempfile.TemporaryDirectory() as status:
        for _ in range(size - 1):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes(NODES_TIMEOUT)
        env = driver_env(VERL_ASCEND_EXT_STATUS_DIR=status, VERL_ASCEND_EXT_JOB=f"bench-{os.getpid()}")
        proc = subprocess.run([sys.executable, "-c", DRIVER, cluster.address, str(seconds)], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=1800, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"the driver at {size} nodes failed:\n{proc.stderr[-3000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 32])
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    print(f"{'nodes':>5} | {'watch % core (median)':>21} | {'worst':>6} | {'not asked':>9} | {'bare actor':>10} | "
          f"{'trainer: hear CPU ms/s':>22} | {'hear wall ms':>12}")
    for size in args.sizes:
        m = measure(size, args.seconds)
        print(f"{m['nodes']:>5} | {m['watch_core_pct_median']:>21.2f} | {m['watch_core_pct_worst']:>6.2f} | "
              f"{m['unheard_core_pct_median']:>9.2f} | {m['bare_core_pct_median']:>10.2f} | "
              f"{m['hear_cpu_ms']:>22.2f} | {m['hear_wall_ms']:>12.2f}",
              flush=True)
    print("(percent of one core over the timed seconds, each node's watch process: heard by the trainer once a "
          "second, and not asked at all; a bare Ray actor on each node doing nothing, for scale; the trainer's side "
          "once a second, the watch's interval)")


if __name__ == "__main__":
    main()
