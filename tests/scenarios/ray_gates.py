"""Drive verl's real ``run_ppo`` against a running multi-node Ray cluster and report what each node's worker saw.

Usage: ``ray_gates.py ADDRESS CASE...``, each CASE one of ``driver`` (gates set in this driver only),
``user`` (same, plus the user's Hydra override of one gate in ``ray_kwargs.ray_init.runtime_env.env_vars``),
``unset`` (no gate set) or ``hold`` (no gate set; the job's workers stay up until the test says ``go``, for
``verl-ascend status --ray``), run one after the other (``ray.shutdown()`` in between). verl's own
``ppo_trainer`` config is composed with Hydra; ``run_ppo`` calls the (patched) ``get_ppo_ray_runtime_env``,
merges the user's runtime env with OmegaConf and calls ``ray.init(address=..., runtime_env=...)`` itself.
The task runner passed to ``run_ppo`` stands in for verl's (no training): it runs one probe task pinned
to every alive node. Prints one JSON line: ``{case: result}``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

import ray
import verl
from hydra import compose, initialize_config_dir
from verl.trainer import main_ppo

GATE = "VERL_ASCEND_EXT_DISTILLATION_FIXES"
DISABLE = "VERL_ASCEND_EXT_DISABLE"
JOB = "VERL_ASCEND_EXT_JOB"  # the job id the driver sets at boot (runtime.records.schema.JOB_ENV)
ADDRESS, CASES = sys.argv[1], sys.argv[2:]
RESULT = os.path.join(tempfile.mkdtemp(prefix="ray-gates-"), "probes.json")
CONFIG_DIR = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")


@ray.remote(num_cpus=0)
def probe() -> dict:
    raylet_env = {}
    with open(f"/proc/{os.getppid()}/environ", "rb") as f:  # this worker's parent is its node's raylet
        for item in f.read().split(b"\0"):
            key, _, value = item.decode(errors="replace").partition("=")
            raylet_env[key] = value
    boot = sys.modules.get("verl_ascend_ext.runtime.boot")  # this task never imports verl: only a setup hook boots it
    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "booted_by": list(boot.loaded_by()) if boot is not None else [],
        "worker": {k: os.environ.get(k) for k in (GATE, DISABLE)},
        "raylet": {k: raylet_env.get(k) for k in (GATE, DISABLE)},
        "job": os.environ.get(JOB),
        "raylet_is_parent": "raylet" in open(f"/proc/{os.getppid()}/cmdline", "rb").read().decode(errors="replace"),
    }


@ray.remote(num_cpus=0)
class ProbeRunner:
    """Stands in for verl's TaskRunner: same ``run(config)`` call, probes every node instead of training."""

    def run(self, config) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = [n for n in ray.nodes() if n["Alive"]]
        refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False))
                .remote() for n in nodes]
        with open(RESULT, "w") as f:
            json.dump(ray.get(refs), f)


HOLD_DIR = os.environ.get("RAY_GATES_HOLD_DIR", "")  # case "hold": where ready.json / go are exchanged with the test
BLOCK = os.environ.get("RAY_GATES_BLOCK", "") == "1"  # case "hold": the victim waits for ever in a native call
VICTIM = os.environ.get("RAY_GATES_VICTIM", "")  # case "hold": "far": the victim on a node the runner is not on
# case "hold": the runner holds a TCP connection to the victim while it waits and fails when the victim's end
# closes, as a trainer's gloo collective fails on a lost peer ("Connection closed by peer")
PEER = os.environ.get("RAY_GATES_PEER", "") == "1"
HEAD = "node:__internal_head__"


@ray.remote(num_cpus=0, max_restarts=0)
class Holder:
    """A job worker that boots the plugin as verl's workers do (``import verl``) and stays until the job ends."""

    def __init__(self) -> None:
        import socket

        import verl  # noqa: F401  (plugin discovery boots verl-ascend-ext in this worker)

        node_id = ray.get_runtime_context().get_node_id()
        self.info = {"pid": os.getpid(), "host": socket.gethostname(), "node_id": node_id, "gate": os.environ.get(GATE)}

    def describe(self) -> dict:
        return self.info

    def listen(self) -> int:
        """The port of a socket whose one connection this actor holds open while it lives (a collective's peer)."""
        import socket
        import threading

        server = socket.create_server(("127.0.0.1", 0))
        self.peers = []
        threading.Thread(target=lambda: self.peers.append(server.accept()), daemon=True).start()
        return server.getsockname()[1]

    def block(self) -> None:
        """Wait for ever in a native call that holds the GIL (as a rank stuck in C would)."""
        import ctypes

        while True:  # libc's sleep returns early when a signal comes
            ctypes.PyDLL(None).sleep(600)


@ray.remote(num_cpus=0)
class HoldRunner:
    """Stands in for verl's TaskRunner: starts a Holder on every node (one with the gate overridden to 0, one to be
    killed by the test on the head node), writes their pids to ready.json and waits for the test's ``go`` file."""

    def run(self, config) -> None:
        import select
        import socket
        import time

        import verl  # noqa: F401  (like verl's TaskRunner, this worker boots the plugin)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = sorted((n for n in ray.nodes() if n["Alive"]), key=lambda n: (HEAD not in n["Resources"], n["NodeID"]))
        pin = [NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False) for n in nodes]
        holders = {f"worker{i}": Holder.options(scheduling_strategy=s).remote() for i, s in enumerate(pin)}
        holders["overridden"] = Holder.options(scheduling_strategy=pin[1],
                                               runtime_env={"env_vars": {GATE: "0"}}).remote()
        own = ray.get_runtime_context().get_node_id()
        # the victim on the head node, or (RAY_GATES_VICTIM=far) on the first worker node (not the head) this runner
        # is not on
        victim = pin[0] if VICTIM != "far" else next(
            p for p, n in zip(pin, nodes, strict=True) if n["NodeID"] != own and HEAD not in n["Resources"])
        holders["victim"] = Holder.options(scheduling_strategy=victim).remote()
        info = {name: ray.get(h.describe.remote()) for name, h in holders.items()}
        info["runner"] = {"pid": os.getpid(), "host": socket.gethostname(), "node_id": own}
        if BLOCK:
            holders["victim"].block.remote()
        with open(os.path.join(HOLD_DIR, "ready.json.tmp"), "w") as f:
            json.dump(info, f)
        os.replace(os.path.join(HOLD_DIR, "ready.json.tmp"), os.path.join(HOLD_DIR, "ready.json"))
        # waits as verl's trainer does, inside the job watch the job-watch record runs its fit in (engine tier: the
        # record itself, in verl's trainer)
        from contextlib import nullcontext

        from verl_ascend_ext.features.job_watch.declaration import GATE as WATCH_GATE
        from verl_ascend_ext.features.job_watch.patch_code import watching
        from verl_ascend_ext.features.job_watch.targets import WATCH_ID

        peer = socket.create_connection(("127.0.0.1", ray.get(holders["victim"].listen.remote()))) if PEER else None
        deadline = time.monotonic() + 300
        with watching(WATCH_ID) if WATCH_GATE.read() else nullcontext():
            while not os.path.exists(os.path.join(HOLD_DIR, "go")) and time.monotonic() < deadline:
                if peer is not None and select.select([peer], [], [], 0)[0] and not peer.recv(1):
                    raise ConnectionError("Connection closed by peer (the victim's end of the runner's connection), "
                                          "as gloo's collective on a lost peer")
                time.sleep(0.2)
        with open(RESULT, "w") as f:
            json.dump([{"holders": info}], f)


def run_case(case: str) -> dict:
    overrides = [f"+ray_kwargs.ray_init.address={ADDRESS}"]
    os.environ.pop(GATE, None)
    os.environ.pop(DISABLE, None)
    if case in ("driver", "user"):
        os.environ[GATE] = "0"
        os.environ[DISABLE] = "padding-teacher-fields"
    if case == "user":
        overrides.append(f"+ray_kwargs.ray_init.runtime_env.env_vars.{GATE}='1'")
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    default_runtime_env = main_ppo.get_ppo_ray_runtime_env(config)  # what run_ppo merges the user's env into
    main_ppo.run_ppo(config, task_runner_class=HoldRunner if case == "hold" else ProbeRunner)
    with open(RESULT) as f:
        probes = json.load(f)
    ray.shutdown()
    return {
        "default_env_vars": {k: v for k, v in default_runtime_env["env_vars"].items()
                             if k.startswith("VERL_ASCEND") and k != JOB},
        "job": default_runtime_env["env_vars"].get(JOB),  # the driver's job id, carried as the gates are
        "driver_job": os.environ.get(JOB),
        "probes": probes,
    }


results = {case: run_case(case) for case in CASES}
shutil.rmtree(os.path.dirname(RESULT))

from verl_ascend_ext import patch_statuses  # noqa: E402

print(json.dumps({
    "verl": verl.__version__,
    "status": patch_statuses()["ray-runtime-env-gates"].status.value,
    "main_ppo_bound_to_patched": main_ppo.get_ppo_ray_runtime_env is sys.modules["verl.trainer.constants_ppo"]
    .get_ppo_ray_runtime_env,
    "cases": results,
}))
