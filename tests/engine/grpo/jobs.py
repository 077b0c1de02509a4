"""The engine tier's training jobs, as data: one declaration per job (``JOBS``), run once per session by ``Jobs``.

A declaration says what a job is (verl release, actor and layout, the GLM-5.2 gate, the teacher, steps and
checkpoints, the shipped recipe whose overrides it takes), what goes wrong in it on purpose (``faults``: the
probe's variables, ``grpo_probe``) and how it must then end (``planned``), and which job's checkpoint it starts
from (``resumes``). ``job.run`` turns a declaration into verl's own command line; ``Jobs`` (the session fixture
``jobs`` of ``tests/engine/conftest.py``) runs each job on first use, after the job it resumes. A new job is one
entry here; the assertions about it live in the test module of its tier.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import pytest
from grpo.job import Job, run
from grpo.paths import DATA, MEGATRON, MODELS, OVERLAY

BARRIER_TIMEOUT = 20  # seconds (VERL_ASCEND_EXT_WEIGHT_SYNC_BARRIER_TIMEOUT) before rank 0 gives up on a stalled rank
# a killed actor rank: Ray's report of it reaches the driver, or the job watch sees it first (both within seconds)
LOST = "JobProcessLost|ActorDiedError"
STUCK_FLOOR = 10  # seconds (VERL_ASCEND_EXT_JOB_STUCK_TIMEOUT): the stuck check's floor in a job that rides its cell
DROPPED = "model.layers.1.mlp.down_proj.weight"  # the tensor the export-check scenarios leave out of an export
# a node whose environment leaves the plugin out of both loaders (verl's discovery, vLLM's general plugins), as a
# node without it would: its workers run unpatched
HIDDEN = {"VERL_USE_EXTERNAL_PLUGINS": "none", "VLLM_PLUGINS": "lora_filesystem_resolver"}


def fault(kind: str, sync: int) -> Mapping[str, str]:
    """``grpo_probe``'s fault on actor rank 1 right after its ``sync``-th weight update."""
    return {"GRPO_PROBE_FAULT": kind, "GRPO_PROBE_FAULT_RANK": "1", "GRPO_PROBE_FAULT_SYNC": str(sync),
            "VERL_ASCEND_EXT_WEIGHT_SYNC_BARRIER_TIMEOUT": str(BARRIER_TIMEOUT)}


def stuck_at(sync: int) -> Mapping[str, str]:
    """``grpo_probe``'s block on actor rank 1 right after its ``sync``-th weight update (a native call holding the
    GIL, for ever), the weight-sync barrier's bound raised out of its way, the stuck check's floor lowered."""
    return {**fault("block", sync), "VERL_ASCEND_EXT_WEIGHT_SYNC_BARRIER_TIMEOUT": "3600",
            "VERL_ASCEND_EXT_JOB_STUCK_TIMEOUT": str(STUCK_FLOOR)}


def dropped(tensor: str, under: str = "") -> Mapping[str, str]:
    """``grpo_probe`` leaves ``tensor`` out of the Hugging Face export (only in files under ``under``, when given)."""
    return {"GRPO_PROBE_DROP_EXPORT_TENSOR": tensor, **({"GRPO_PROBE_DROP_EXPORT_UNDER": under} if under else {})}


@dataclass(frozen=True)
class JobSpec:
    """One training job of verl's ``main_ppo`` on the CPU (see ``grpo/job.py`` for what every job shares)."""

    name: str
    verl: str  # "0.9.0" (the overlay) or "0.9.1" (installed in the engine venv)
    mode: str = "sync"  # verl's main_ppo in hybrid mode, or "fully-async" (verl's fully_async_main)
    model: str = "qwen2"  # the tiny dense model, or "qwen3-moe" (paths.MODELS)
    actor: str = "fsdp2"  # or "megatron" (``--config-name ppo_megatron_trainer``)
    layout: Mapping[str, int] = field(default_factory=dict)  # the Megatron actor's parallel sizes
    gate: bool = True  # VERL_VLLM_ASCEND_GLM52_PATCH, set in the driver only
    teacher: bool = False  # on-policy distillation from a vLLM-served teacher in its own pool
    steps: int = 2  # trainer.total_training_steps (a resumed job counts the steps it resumes from)
    save_every: int = 2  # trainer.save_freq
    faults: Mapping[str, str] = field(default_factory=dict)  # the probe's variables (faults, a dropped tensor)
    planned: str | None = None  # the error a faulted job must end on (its log names it); None: it ends well
    resumes: str | None = None  # the job whose checkpoint this one starts from
    # that job's global step to resume from (``resume_mode=resume_path``); None: a copy of its whole checkpoint
    # directory, resumed as the recipe says (``resume_mode=auto``: the last completed checkpoint)
    resume_step: int | None = None
    recipe: str | None = None  # the shipped recipe whose overrides the job takes (``grpo/recipe_overrides.py``)
    kill: str = ""  # a fault: "trainer-rank1@saved-N" or "engine-core@saved-N", SIGKILL once step N's checkpoint is
    # complete (job.RankKiller)
    nodes: int = 1  # Ray nodes (raylets of their own on this machine, each with its own status directory, every one
    # but the head in namespaces of its own: tests/nsnode.py): the ranks spread over them by verl's placement
    # (trainer.nnodes); fully-async: the trainer's ranks on the head, the rollout replica on node 1 (trainer nodes and
    # rollout nodes, as the recipe's 16 + 16)
    second_node: Mapping[str, str] = field(default_factory=dict)  # what the second node's raylet environment adds

    def __post_init__(self) -> None:
        object.__setattr__(self, "layout", MappingProxyType(dict(self.layout)))
        object.__setattr__(self, "faults", MappingProxyType(dict(self.faults)))
        object.__setattr__(self, "second_node", MappingProxyType(dict(self.second_node)))

    @property
    def ranks(self) -> int:
        return 2


PP2 = {"pipeline_model_parallel_size": 2}
EP2 = {"expert_model_parallel_size": 2}
TP2 = {"tensor_model_parallel_size": 2}  # fully-async with PP=2 exports a tied embedding twice (docs/grpo-cpu.md)
EXPERT = "model.layers.1.mlp.experts.3.down_proj.weight"  # expert 3 lives on EP rank 1: gathered to rank 0 to export

JOBS: dict[str, JobSpec] = {spec.name: spec for spec in (
    # FSDP2 actor (tests/engine/test_grpo.py). Weight syncs: at start, then at each step's end; the 4th is step 3's,
    # after its save: rank 1 is killed there
    JobSpec("on", verl="0.9.0", teacher=True, steps=3, save_every=3, faults=fault("kill", sync=4),
            planned=LOST),
    # no teacher (test_gate_off_gives_the_same_first_step_rollout_tokens_and_metrics); actor rank 1 held in a native
    # call that keeps the GIL right after its 3rd weight update (step 2's end, after its save), the weight-sync
    # barrier's bound raised out of the way: nothing dies, rank 0 waits in the barrier's collective, and the job
    # watch's stuck check (its floor lowered to STUCK_FLOOR) ends the job naming rank 1 apart (the fault matrix's
    # stuck/block-rank1 riding this job; its old fault, a tensor lost from the step-2 export, stays the megatron and
    # moe-resumed jobs')
    JobSpec("off", verl="0.9.0", gate=False, steps=3, faults=stuck_at(sync=3), planned="JobStuck"),
    # weight syncs: at start, at step 4's end, at step 5's end (the 3rd, after the save): rank 1 stalls there
    JobSpec("resumed", verl="0.9.1", teacher=True, steps=5, save_every=5, resumes="on", resume_step=3,
            faults=fault("stall", sync=3), planned="WeightSyncBarrierTimeout"),
    # Megatron actor (tests/engine/test_megatron.py), the GLM-5.2 recipe's overrides; the step-2 export loses a
    # tensor held by pipeline stage 2: that save stops, after step 1's checkpoint completed
    JobSpec("megatron", verl="0.9.0", actor="megatron", layout=PP2, save_every=1, recipe="glm5_2_megatron",
            faults=dropped(DROPPED, under="global_step_2"), planned="ExportCheckError"),
    # the recipes' own path (tests/engine/test_moe.py): a MoE with expert parallel 2, routing replay R3 and the
    # offloads, the GLM-5.2 recipe's MoE keys taken. Step 1 trains on vLLM's real routes; step 2's rollout returns
    # all-zero routes (verl hands the server step 1 with the weights it generates step 2 on): the route check stops
    # the job, after step 1's checkpoint completed
    JobSpec("moe", verl="0.9.0", model="qwen3-moe", actor="megatron", layout=EP2, save_every=1,
            recipe="glm5_2_megatron", faults={"GRPO_PROBE_CORRUPT_ROUTES": "zeros@1"}, planned="RouteCheckError"),
    # resumed on verl 0.9.1 (the recipe's resume_mode=auto) from step 1's checkpoint: trains steps 2 and 3; step 3's
    # export loses an expert of EP rank 1: that save stops
    JobSpec("moe-resumed", verl="0.9.1", model="qwen3-moe", actor="megatron", layout=EP2, steps=3, save_every=1,
            recipe="glm5_2_megatron", resumes="moe", faults=dropped(EXPERT, under="global_step_3"),
            planned="ExportCheckError"),
    # verl's fully-async mode (tests/engine/test_fully_async.py): the fully-async recipe's overrides, the trainer on
    # 2 ranks (Megatron TP=2) and one vLLM replica in its own pool; 3 steps, a weight sync before training and after
    # each step, a checkpoint each step; the resume on verl 0.9.1 (where each sync wakes the rollout up in two parts)
    # the rollout's EngineCore is SIGKILLed once step 3's checkpoint is complete, while step 4 runs (before the job
    # watch: exit 0, "ended well", or the driver blamed, by timing): the job ends within seconds, the EngineCore named
    # first. (A job of its own, `fully-async-engine-lost`, killed it after step 1 and was folded in here: ~120 s of
    # CI; a killed trainer rank, an actor Ray itself reports, stays `on`'s fault in hybrid mode and a matrix cell.)
    JobSpec("fully-async", verl="0.9.0", mode="fully-async", actor="megatron", layout=TP2, steps=4, save_every=1,
            recipe="glm5_2_megatron_fully_async", kill="engine-core@saved-3", planned="JobProcessLost"),
    # resumed from step 3's checkpoint; two steps at least (the trainer prints a step's metrics at the next step's
    # line, and verl's fully-async resume counts its first step one further than the checkpoint's: docs/grpo-cpu.md)
    JobSpec("fully-async-resumed", verl="0.9.1", mode="fully-async", actor="megatron", layout=TP2, steps=6,
            save_every=1, recipe="glm5_2_megatron_fully_async", resumes="fully-async"),
    # two Ray nodes (tests/engine/test_two_nodes.py): verl places one actor rank (and its rollout replica) on each;
    # each node records in its own status directory. The vLLM EngineCore on the node the TaskRunner is not on is
    # SIGKILLed once step 2's checkpoint is complete (before the watch on every node: a hang, issue 60): the job ends
    # within seconds (the far node's watch, or vLLM's EngineDeadError reaching the TaskRunner first when a call to that
    # server was in flight: by timing), that EngineCore named first, by `status --ray` and by `status --dir` on the
    # trainer's host alone
    # (step 2, not 1: step 1's metrics line, printed after its save, then stands before the fault; the watch can end
    # the job before the faulted step's line is printed)
    JobSpec("two-nodes", verl="0.9.0", nodes=2, steps=3, save_every=1, kill="engine-core-far@saved-2",
            planned="JobProcessLost|EngineDeadError"),
    # the second node's environment leaves the plugin out: the cluster check stops the job before training
    JobSpec("two-nodes-hidden", verl="0.9.0", nodes=2, second_node=HIDDEN, steps=1, save_every=1,
            planned="ClusterCheckError"),
)}


class Jobs:
    """The session's jobs: each runs once, on first use, after the job it resumes (which must have run as planned)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.done: dict[str, Job] = {}

    def __getitem__(self, name: str) -> Job:
        if name not in self.done:
            spec = JOBS[name]
            before = self[spec.resumes].as_planned() if spec.resumes else None
            self.done[name] = run(spec, self.root / name, before)
        return self.done[name]


def require_job_inputs() -> None:
    """Fail (not skip) naming the fix when what every job needs is missing."""
    for path, what in ((MODELS["qwen2"], "the tiny model"), (MODELS["qwen3-moe"], "the tiny MoE model"),
                       (DATA, "the GRPO data set"), (OVERLAY["0.9.0"], "the verl 0.9.0 overlay"),
                       (MEGATRON, "the megatron-core/mbridge overlay")):
        if not path.exists():
            pytest.fail(f"{what} is missing at {path}: run scripts/setup_vllm_engine.sh", pytrace=False)
