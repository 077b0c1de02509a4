"""Feature declaration: the job watch's patch record and gate (loaded at discovery; no heavy imports).

verl's driver waits on its TaskRunner with no bound (``ray.get(runner.run.remote(config))``); inside, the trainer,
the rollout servers and their EngineCores wait on each other, mostly with no bound either. A process lost mid-job
(SIGKILL, the OOM killer, a native crash) can leave every other waiting for ever: a dead vLLM EngineCore hangs a
hybrid job. Two records run the trainer's ``fit`` (the v1 PPO trainer's in the TaskRunner, the fully-async trainer's
in its actor: the process that waits on the rest) inside the job's watch (``runtime.records.watch``): a process of
the job lost while it trains ends the job within seconds, naming it; so does one stopped (SIGSTOP, a tracer) for
``STOPPED_TIMEOUT`` seconds on end, which nothing else bounds. The job's other nodes are watched the same way, each
by a small actor the trainer hears at every look (``far_nodes``); a node that stops answering for ``NODE_TIMEOUT``
seconds is lost. (The driver itself cannot be patched for it:
``python -m verl.trainer.main_ppo`` runs ``run_ppo`` as ``__main__``.) The watch reads how each process ended from its
record (``runtime.records.process_end``): with ``VERL_ASCEND_EXT_PROCESS_END=0`` no process records its end, every
process that exits would look lost, and the watch refuses to start (``patch_code.watching``; doctor warns).
"""

from __future__ import annotations

from collections.abc import Mapping

from verl_ascend_ext.features.job_watch.targets import WATCH_FULLY_ASYNC_ID, WATCH_ID, stuck_mode
from verl_ascend_ext.patching import Fingerprint, Gate, PatchRecord
from verl_ascend_ext.patching.gates import Setting, positive_seconds
from verl_ascend_ext.runtime.findings import Finding
from verl_ascend_ext.runtime.hookspecs import hookimpl

GATE = Gate(
    "VERL_ASCEND_EXT_JOB_WATCH",
    default=True,
    doc="verl's trainer watches the job's processes on every node: one lost mid-job (killed, crashed, ended by a "
    "signal or an error) ends the job within seconds, named, instead of leaving the rest waiting on it.",
)
STOPPED_TIMEOUT = Setting(
    "VERL_ASCEND_EXT_JOB_WATCH_STOPPED_TIMEOUT",
    default=600.0,
    doc="Seconds a process of the job may stay stopped (SIGSTOP, SIGTSTP, a tracer) while the trainer runs; then the "
    "job watch ends the job, naming it (default 600: verl's own collective timeout; a debugger's shorter pause is "
    "left alone). A running process is never ended for being slow.",
    parse=positive_seconds,
    unit="s",
)
NODE_TIMEOUT = Setting(
    "VERL_ASCEND_EXT_JOB_WATCH_NODE_TIMEOUT",
    default=30.0,
    doc="Seconds the trainer's job watch goes without an answer from another node's watch before that node counts as "
    "lost and the job ends, naming it (default 30: nvidia-resiliency-ext's heartbeat timeout; Ray's own health "
    "checks mark a node dead after 5 failures 3 s apart, 15-50 s, and a watch Ray reports dead is a loss at once).",
    parse=positive_seconds,
    unit="s",
)

STUCK = Setting(
    "VERL_ASCEND_EXT_JOB_STUCK",
    default="error",
    doc="What the job watch does with a job that makes no progress (its trainer's step count unchanged) for longer "
    "than 3x its longest step so far, and never before VERL_ASCEND_EXT_JOB_STUCK_TIMEOUT: error (record every "
    "process's stacks on every node, end the job: JobStuck, naming where each waited), warn (record and say it, the "
    "job goes on) or off.",
    parse=stuck_mode,
)
STUCK_TIMEOUT = Setting(
    "VERL_ASCEND_EXT_JOB_STUCK_TIMEOUT",
    default=900.0,
    doc="Seconds without a completed step before a job can be stuck, whatever its steps take (twice that before its "
    "first step completes). Default 900: half HCCL's own 1836 s execution timeout, an eighth of the GLM-5.2 "
    "recipe's 7200 s collective timeout, above a checkpoint save or validation of the recipes' sizes.",
    parse=positive_seconds,
    unit="s",
)

LIVENESS = r"aliveness|is_alive\("  # what a fit that watches its job's processes would call
FIXED_NOTE = ("unexercised: no verl release watches the job's processes from its trainer; kept so that one that does "
              "is recognised (and the watch stands aside)")
WHY = ("verl's trainer waits on the job's other processes with no bound (the weight sync's ray.get, the rollout's "
       "utility calls, the sample queue): a process lost mid-job (a dead vLLM EngineCore in hybrid mode) leaves the "
       "job hanging, and a fully-async job may even end 'well' over it. The trainer runs inside a watch of the job's "
       "processes: a lost one ends the job within seconds, named.")
UPSTREAM = ("none (verl's start_worker_aliveness_check, which no trainer starts, watches WorkerDict actors only: an "
            "actor whose EngineCore died is still alive to it)")


def _watch_record(record_id: str, target: str, contains: tuple[str, ...], description: str, wrapper: str
                  ) -> PatchRecord:
    return PatchRecord(
        id=record_id,
        feature="job_watch",
        why=WHY,
        target=target,
        gate=GATE,
        distribution="verl",
        versions=">=0.9.0,<0.10",
        original=Fingerprint(contains=contains, description=description),
        fixed=Fingerprint(contains=(LIVENESS,), description="the trainer checks the job's processes are alive",
                          kept=((LIVENESS, FIXED_NOTE),)),
        wrapper=f"verl_ascend_ext.features.job_watch.patch_code:{wrapper}",
        upstream=UPSTREAM,
        remove_when="verl's trainer ends a job whose process was lost, naming it",
        traced=False,
        acts_when="a process of the job is lost while the trainer runs (the watch ends the job)",
    )


# the process that drives training: verl's TaskRunner (hybrid, the v1 trainer main_ppo runs by default) and the
# fully-async trainer's actor; it waits on the rest, so it is the one to end
WATCH = _watch_record(
    WATCH_ID, "verl.trainer.ppo.v1.trainer_base:PPOTrainer.fit",
    (r"self\.on_train_begin\(\)",
     r"while current_epoch < self\.config\.trainer\.total_epochs and self\.global_steps <= "
     r"self\.total_training_steps:"),
    "the v1 PPO trainer's loop of steps, with nothing watching the job's processes", "fit_watched")
WATCH_FULLY_ASYNC = _watch_record(
    WATCH_FULLY_ASYNC_ID, "verl.experimental.fully_async_policy.fully_async_trainer:FullyAsyncTrainer.fit",
    (r"await self\.fit_step\(\)", r"except TrainingStopException:"),
    "the fully-async trainer's loop of steps until the end of the data, with nothing watching the job's processes",
    "fit_watched_async")



@hookimpl
def verl_ascend_ext_gates() -> list[Gate]:
    return [GATE]


@hookimpl
def verl_ascend_ext_settings() -> list[Setting]:
    return [STOPPED_TIMEOUT, NODE_TIMEOUT, STUCK, STUCK_TIMEOUT]


@hookimpl
def verl_ascend_ext_patch_records() -> list[PatchRecord]:
    return [WATCH, WATCH_FULLY_ASYNC]


@hookimpl
def verl_ascend_ext_doctor_findings(environ: Mapping[str, str]) -> list[Finding]:
    from verl_ascend_ext.features.job_watch.checks import doctor_findings

    return doctor_findings(environ, GATE)
