"""A Ray worker booted by the PPO runtime env's setup hook, ended by SIGTERM as Ray's teardown ends it.

    python ray_worker_end.py STATUS_DIR    (prints one JSON line: the actor's pid)

A local Ray instance whose runtime env runs ``verl_ascend_ext.runtime.boot.ray_worker_setup`` in every worker (what
``ray-runtime-env-gates`` sets in a PPO job); an actor that imports nothing of verl (as fully-async's MessageQueue)
reports its pid, then gets SIGTERM. Ray's worker loop installs its SIGTERM handler after the setup hook.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import ray


@ray.remote
class Quiet:
    def pid(self) -> int:
        return os.getpid()


def main() -> None:
    status_dir = sys.argv[1]
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False,
             runtime_env={"worker_process_setup_hook": "verl_ascend_ext.runtime.boot.ray_worker_setup",
                          "env_vars": {"VERL_ASCEND_EXT_STATUS_DIR": status_dir}})
    actor = Quiet.remote()  # held: an actor whose handle is dropped is ended by Ray
    pid = ray.get(actor.pid.remote())
    time.sleep(1.0)  # the record names its actor (actor_watch polls every 0.5 s)
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    print(json.dumps({"pid": pid, "actor": str(actor)}))
    ray.shutdown()


if __name__ == "__main__":
    main()
