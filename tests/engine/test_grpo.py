"""verl trains with the plugin: verl's own GRPO trainer (``python -m verl.trainer.main_ppo``) end to end on the CPU.

Four real jobs of the released, unmodified verl (``grpo/job.py``: tiny Qwen2, arithmetic prompts, FSDP2 actor on
2 gloo ranks, vLLM 0.23.0 rollout in hybrid mode with sleep / wake-up every step, on-policy distillation from a
vLLM-served teacher with a top-k loss and one sample per micro-batch (verl pads each step: some micro-batches hold
padding only), checkpoint with the Hugging Face export), shared by the assertions below:

- ``on``: verl 0.9.0, the GLM-5.2 gate set in the driver only, 3 steps, checkpoint at step 3 (the last); then,
  its own assertions collected (steps 1-2 logged, step 3 saved), actor rank 1 is killed (SIGKILL) right after its
  weight update of step 3's end: the job fails, and ``verl-ascend status`` must name rank 1 as the process that
  failed first, without a word, and Ray's ``ActorDiedError`` as how the driver learnt it;
- ``off``: verl 0.9.0, gate off, 2 steps, checkpoint at step 2 with one tensor deliberately left out of the
  Hugging Face export (``grpo_probe``), so the export check must stop the save naming it (verl prints a
  step's metrics after that step's save: step 1's are in the log, step 2's never are);
- ``resumed``: verl 0.9.1, gate on, resumed from the ``on`` job's last checkpoint (step 3, written before the
  kill), trains steps 4 and 5 and saves step 5 (the release where verl carries its own copies of our fixes: ours
  stand down there, and a 0.9.0 checkpoint resumed by 0.9.1 is the upgrade path users take); then actor rank 1
  stalls after its weight update of step 5's end: rank 0's bounded barrier gives up after 20 s naming rank 1, the
  job fails, and ``status`` must name rank 0's barrier error as the first failure, naming rank 1;
- ``recovered``: verl 0.9.1, gate on, no teacher, resumed from the stalled job's last checkpoint (step 5): trains
  step 6, and ``status`` says the job ended well.

Everything is real (verl, Ray, vLLM's spawned processes, gloo, the checkpoint files); the accelerator is the CPU
through the test-only platform in ``grpo/``.
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from pathlib import Path

import pytest
from grpo.job import DATA, GATE, MODEL, OVERLAY, Job, run_job
from subprocesses import run_command

from verl_ascend_ext.features.checkpoint.export_check import report_path_for
from verl_ascend_ext.runtime.status_report import collect

pytestmark = pytest.mark.verl091  # the engine venv holds verl 0.9.1 (0.9.0 comes from the overlay, per job)
DROPPED = "model.layers.1.mlp.down_proj.weight"
VLLM_CORE = ("glm52-vllm-wake-up-resume-when-awake", "glm52-vllm-dp-no-dummy-forward-asleep",
             "glm52-vllm-engine-core-entry")
WEIGHT_SYNC = ("weight-sync-kv-barrier", "weight-sync-light-empty-cache", "weight-sync-sender-no-full-gc",
               "weight-sync-receiver-no-full-gc")
EXPORT_CHECK = "checkpoint-export-check-fsdp"
BARRIER_TIMEOUT = 20  # seconds (VERL_ASCEND_EXT_WEIGHT_SYNC_BARRIER_TIMEOUT) before rank 0 gives up on rank 1
EMPTY_MICRO_BATCH = "distill-empty-micro-batch"  # no verl release fixes it: applied on 0.9.0 and 0.9.1
# Metrics that measure time or memory, not the computation: they differ between any two runs.
NOT_NUMBERS = ("timing_s/", "timing_per_token_ms/", "perf/", "actor/perf/")

CLI = str(Path(sys.executable).with_name("verl-ascend"))
_jobs: dict[str, Job] = {}


@pytest.fixture(scope="module")
def jobs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    for path, what in ((MODEL, "the tiny model"), (DATA, "the GRPO data set"),
                       (OVERLAY["0.9.0"], "the verl 0.9.0 overlay")):
        if not path.exists():
            pytest.fail(f"{what} is missing at {path}: run scripts/setup_vllm_engine.sh", pytrace=False)
    return tmp_path_factory.mktemp("grpo")


def job(name: str, jobs_dir: Path) -> Job:
    """Each job runs once per session, on first use."""
    if name not in _jobs:
        if name == "on":  # weight syncs: at start, then at each step's end; the 4th is step 3's, after its save
            _jobs[name] = run_job(name, jobs_dir / name, verl="0.9.0", gate=True, steps=3, save_freq=3,
                                  env=fault("kill", sync=4))
        elif name == "off":  # no teacher: see test_gate_off_gives_the_same_first_step_rollout_tokens_and_metrics
            _jobs[name] = run_job(name, jobs_dir / name, verl="0.9.0", gate=False, distill=False, steps=2,
                                  save_freq=2, env={"GRPO_PROBE_DROP_EXPORT_TENSOR": DROPPED})
        elif name == "resumed":  # weight syncs: at start, at step 4's end, at step 5's end (the 3rd, after the save)
            first = as_planned(job("on", jobs_dir))
            _jobs[name] = run_job(name, jobs_dir / name, verl="0.9.1", gate=True, steps=5, save_freq=5,
                                  resume_from=first.checkpoints / "global_step_3", env=fault("stall", sync=3))
        elif name == "recovered":
            stalled = as_planned(job("resumed", jobs_dir))
            _jobs[name] = run_job(name, jobs_dir / name, verl="0.9.1", gate=True, distill=False, steps=6, save_freq=6,
                                  resume_from=stalled.checkpoints / "global_step_5")
    return _jobs[name]


def fault(kind: str, sync: int) -> dict[str, str]:
    """``grpo_probe``'s fault on actor rank 1 right after its ``sync``-th weight update."""
    return {"GRPO_PROBE_FAULT": kind, "GRPO_PROBE_FAULT_RANK": "1", "GRPO_PROBE_FAULT_SYNC": str(sync),
            "VERL_ASCEND_EXT_WEIGHT_SYNC_BARRIER_TIMEOUT": str(BARRIER_TIMEOUT)}


PLANNED = {"on": "ActorDiedError", "resumed": "WeightSyncBarrierTimeout"}  # how the faulted jobs end


def ok(done: Job) -> Job:
    assert done.returncode == 0, done.explain()
    return done


def as_planned(done: Job) -> Job:
    """The job ran as planned: a faulted job failed by its fault (and only after the steps it logs), another ended
    well."""
    if done.name not in PLANNED:
        return ok(done)
    assert done.returncode == 1 and PLANNED[done.name] in done.log, done.explain()
    return done


def records(done: Job) -> list[dict]:
    """Every process record of the job, with patch details (``status_report.collect``, what the CLI reads)."""
    return collect(str(done.status_dir))[0]


def by_role(done: Job) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for rec in records(done):
        key = rec["role"] + (f" {rec['actor_class']}" if rec.get("actor_class") else "")
        out.setdefault(key, []).append(rec)
    return out


def status_json(done: Job) -> dict:
    """What ``verl-ascend status --json --dir`` says about the job (exit 1 when it failed, else 0)."""
    proc = run_command([CLI, "status", "--json", "--dir", str(done.status_dir)], check=False)
    assert proc.returncode == (1 if done.returncode else 0), proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def status_of(rec: dict, patch: str) -> str:
    return rec["patches"][patch]["status"]


def teacher_and_rollout(done: Job, role: str) -> tuple[list[dict], list[dict]]:
    """The records of ``role`` (vllm-frontend / engine-core / vllm-worker) under the teacher's vLLM server and
    under the rollout's: an EngineCore's parent is its server, a worker's is its EngineCore."""
    recs = records(done)
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

def test_verl_trains_two_grpo_steps_and_saves_the_hf_export(jobs_dir: Path) -> None:
    done = as_planned(job("on", jobs_dir))
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


def test_the_export_check_passes_on_the_real_save(jobs_dir: Path) -> None:
    saved = as_planned(job("on", jobs_dir)).checkpoints / "global_step_3" / "actor"
    report = json.loads(report_path_for(saved / "huggingface").read_text())
    assert report["ok"] is True and report["reference"] == str(MODEL), report
    status = json.loads((saved / "verl_ascend_ext.status.json").read_text())  # what ran when it was saved
    saver = status["saved_by"]
    assert (saver["role"], saver["actor_class"]) == ("ray-worker", "WorkerDict")  # actor rank 0
    assert saver["patches"][EXPORT_CHECK]["status"] == "applied" and saver["patches"][EXPORT_CHECK]["exercised"]
    assert status["driver"]["gates"][GATE] is True and status["summary"][EXPORT_CHECK]["applied"] >= 2


# ---- 2. the plugin in every process -------------------------------------------------------------------------

def test_every_process_of_the_job_booted_the_plugin_with_the_gate_on(jobs_dir: Path) -> None:
    done = as_planned(job("on", jobs_dir))
    report = status_json(done)
    seen = Counter(p["role"] + (f" {p['actor_class']}" if p["actor_class"] else "") for p in report["processes"])
    want = {"driver": 1, "ray-worker TaskRunnerV1": 1, "ray-worker WorkerDict": 2,  # the 2 actor ranks
            # one rollout replica per rank, and the teacher's replica in its own pool
            "vllm-frontend vLLMHttpServer": 3, "engine-core": 3, "vllm-worker": 3,
            "ray-worker AgentLoopWorkerTQ": 1}
    assert {role: seen[role] for role in want} == want, seen  # (and vLLM's model-inspection helpers: `other`)
    assert report["problems"] == [], report["problems"]
    assert report["outcome"]["state"] == "failed"  # the kill after step 3 (test_a_killed_rank_...)
    assert report["counted"] == "ended", [(p["pid"], p["role"]) for p in report["processes"] if p["alive"]]
    for role, recs in by_role(done).items():
        if role.split()[0] in ("driver", "engine-core", "vllm-worker") or role in want:
            for rec in recs:  # set in the driver only (Ray started without it): the plugin carried it everywhere
                assert rec["gates"][GATE] is True, (role, rec["pid"], rec["gates"])
    assert all(rec["versions"].get("verl") in (None, "0.9.0") for rec in records(done))


def test_vllm_core_fixes_apply_in_every_engine_core_and_weight_sync_on_every_actor_rank(jobs_dir: Path) -> None:
    roles = by_role(as_planned(job("on", jobs_dir)))
    for rec in roles["engine-core"]:
        assert {p: status_of(rec, p) for p in VLLM_CORE} == dict.fromkeys(VLLM_CORE, "applied")
        assert rec["loaded_by"][0] == "vllm-engine-core"  # booted by our spawn entry point, before vLLM's loader
    for rec in roles["ray-worker WorkerDict"]:
        assert {p: status_of(rec, p) for p in (*WEIGHT_SYNC, EXPORT_CHECK)} == \
            dict.fromkeys((*WEIGHT_SYNC, EXPORT_CHECK), "applied")


def test_applied_fixes_were_exercised_where_they_matter(jobs_dir: Path) -> None:
    done = as_planned(job("on", jobs_dir))
    roles = by_role(done)
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
    assert status_json(done)["acts_when"][EXPORT_CHECK].startswith("rank 0 has written")
    teacher_workers, rollout_workers = teacher_and_rollout(done, "vllm-worker")
    assert (len(teacher_workers), len(rollout_workers)) == (1, 2)
    for rec in rollout_workers:  # the teacher's weights never change: only the rollout's workers receive any
        assert rec["patches"]["weight-sync-receiver-no-full-gc"]["exercised"] is True, rec["pid"]


def test_status_shows_every_role_with_applied_and_exercised_patches_after_the_job(jobs_dir: Path) -> None:
    done = as_planned(job("on", jobs_dir))
    report = status_json(done)
    alive = [(p["pid"], p["role"]) for p in report["processes"] if p["alive"]]
    assert report["counted"] == "ended" and report["active"] == 0, alive  # the job is over: its records still count
    assert report["by_role_exercised"]["ray-worker WorkerDict"]["weight-sync-kv-barrier"] == \
        {"observed": "eager", "applied": 2, "ran": 2}
    assert report["by_role_exercised"]["engine-core"]["glm52-vllm-wake-up-resume-when-awake"]["ran"] == 2
    proc = run_command([CLI, "status", "--dir", str(done.status_dir)], check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the job failed (the kill)
    assert "engine-core" in proc.stdout and "vllm-worker" in proc.stdout and "ran in 2 of 2" in proc.stdout, \
        proc.stdout


# ---- 3. same numbers with the gate off ----------------------------------------------------------------------

def test_gate_off_gives_the_same_first_step_rollout_tokens_and_metrics(jobs_dir: Path) -> None:
    """Same seeds, gate on vs off: step 1's rollout token ids and every step metric computed from them are identical.

    The gate changes only when vLLM's scheduler resumes during verl's wake-up (not before the KV cache is back)
    and whether a sleeping data-parallel engine runs dummy forwards: neither changes a number of this job. The
    ``off`` job runs without the teacher (its replica costs ~90 s a job, and the distillation tier has 3 minutes
    of CI in all), so the actor's update metrics (``actor/``: the loss includes the distillation term in ``on``)
    are not compared; the rollout, reward and advantage metrics, computed before the update, are.
    """
    on, off = as_planned(job("on", jobs_dir)), job("off", jobs_dir)
    assert sorted(off.metrics) == [1], off.explain()  # step 1 logged; step 2 stopped at its (broken) save
    samples = 8  # a step's rollout: 4 prompts x n=2; steps run in turn, so the first 8 to finish are step 1's
    assert (len(on.tokens()), len(off.tokens())) == (3 * samples, 2 * samples)  # on: 3 steps; off: 2
    step1 = lambda done: {r["seed"]: (r["prompt_ids"], r["token_ids"]) for r in done.tokens()[:samples]}  # noqa: E731
    assert len(step1(on)) == samples  # one seed per sample (grpo_probe: data row and sample number)
    assert step1(on) == step1(off)
    numbers = lambda m: {k: v for k, v in m.items() if not k.startswith((*NOT_NUMBERS, "actor/"))}  # noqa: E731
    assert len(numbers(on.metrics[1])) >= 20, sorted(on.metrics[1])  # critic/score, response_length, ...
    assert numbers(on.metrics[1]) == numbers(off.metrics[1])


def test_gate_off_runs_nothing_of_the_glm52_set(jobs_dir: Path) -> None:
    off = job("off", jobs_dir)
    for rec in records(off):
        for patch in VLLM_CORE:
            assert status_of(rec, patch) == "gate-off", (rec["role"], patch)


# ---- 4. the export check stops a save that lost a tensor ----------------------------------------------------

def test_a_tensor_missing_from_the_export_stops_the_save_naming_it(jobs_dir: Path) -> None:
    off = job("off", jobs_dir)
    assert off.returncode != 0, off.explain()
    assert "verl-ascend-ext export check" in off.log and DROPPED in off.log, off.explain()
    report = json.loads(report_path_for(off.checkpoints / "global_step_2" / "actor" / "huggingface").read_text())
    assert report["ok"] is False and DROPPED in json.dumps(report), report


# ---- 5. resumed (verl 0.9.1) --------------------------------------------------------------------------------

def test_a_resumed_job_trains_on_from_the_checkpoint(jobs_dir: Path) -> None:
    done = as_planned(job("resumed", jobs_dir))
    assert sorted(done.metrics) == [4], done.explain()  # steps 1-3 came from the checkpoint; 5's line: the stall
    assert "global_step_3" in done.log
    assert done.metrics[4]["training/global_step"] == 4 and done.metrics[4]["actor/grad_norm"] > 0
    saved = done.checkpoints / "global_step_5" / "actor"
    assert json.loads(report_path_for(saved / "huggingface").read_text())["ok"] is True


def test_on_verl_091_its_fixed_code_is_recognised_and_its_unbounded_barrier_replaced(jobs_dir: Path) -> None:
    """verl 0.9.1 carries the weight-sync fixes: ours stand down, except the barrier, whose 0.9.1 form waits
    without a bound; the bounded one replaces it (weight-sync-kv-barrier's 0.9.1 variant) and runs every step."""
    roles = by_role(as_planned(job("resumed", jobs_dir)))
    upstream = ("weight-sync-light-empty-cache", "weight-sync-sender-no-full-gc", "weight-sync-receiver-no-full-gc")
    for rec in roles["ray-worker WorkerDict"]:
        assert rec["versions"]["verl"] == "0.9.1"
        assert {p: status_of(rec, p) for p in upstream} == dict.fromkeys(upstream, "fixed-upstream")
        assert status_of(rec, "weight-sync-kv-barrier") == "applied"
        assert rec["patches"]["weight-sync-kv-barrier"]["exercised"] is True, rec["pid"]


# ---- 6. on-policy distillation (verl's own trainer, a vLLM teacher) -------------------------------------------

def test_distillation_trains_with_a_finite_loss_on_both_releases(jobs_dir: Path) -> None:
    for done, steps in ((as_planned(job("on", jobs_dir)), (1, 2)), (as_planned(job("resumed", jobs_dir)), (4,))):
        for step in steps:
            m = done.metrics[step]
            loss = m["actor/distillation/loss"]
            assert math.isfinite(loss) and loss > 0, (done.name, step, m)  # a real teacher-student divergence
            assert math.isfinite(m["actor/grad_norm"]) and m["actor/grad_norm"] > 0, (done.name, step)
            for key in ("actor/distillation/loss_min", "actor/distillation/loss_max"):
                assert math.isfinite(m[key]), (done.name, step, key, m)  # padding micro-batches left them alone


def test_distillation_fixes_exercised_where_verl_needs_them_on_090(jobs_dir: Path) -> None:
    roles = by_role(as_planned(job("on", jobs_dir)))
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


def test_on_verl_091_the_distillation_fixes_stand_down_and_the_empty_micro_batch_fix_acts(jobs_dir: Path) -> None:
    done = as_planned(job("resumed", jobs_dir))
    roles = by_role(done)
    for rec in roles["ray-worker WorkerDict"]:  # where the loss runs
        assert status_of(rec, "distill-fsdp2-topk") == "fixed-upstream"
        assert status_of(rec, EMPTY_MICRO_BATCH) == "applied"
    (runner,) = roles["ray-worker TaskRunnerV1"]  # where verl pads
    assert status_of(runner, "padding-teacher-fields") == "fixed-upstream"
    report = status_json(done)
    acted = report["by_role_exercised"]["ray-worker WorkerDict"][EMPTY_MICRO_BATCH]
    assert acted["observed"] == "acts" and acted["applied"] == 2 and acted["ran"] >= 1, acted
    assert report["acts_when"][EMPTY_MICRO_BATCH] == "a micro-batch holds no response token (padding samples only)"
    text = run_command([CLI, "status", "--dir", str(done.status_dir)], check=False).stdout
    assert f"{EMPTY_MICRO_BATCH}: acts when" in text and "acted in" in text, text


def test_every_teacher_process_booted_the_plugin_with_the_drivers_gates(jobs_dir: Path) -> None:
    """The teacher's replica (its own resource pool) is vLLM's server, EngineCore and worker like the rollout's:
    Ray started without our variables, so the gates there came through the plugin's forwarding."""
    for name in ("on", "resumed"):
        recs = records(as_planned(job(name, jobs_dir)))
        (driver,) = [r for r in recs if r["role"] == "driver"]
        vllm = [r for r in recs if r["role"] in ("vllm-frontend", "engine-core", "vllm-worker")]
        assert len(vllm) == 9, [(r["role"], r["pid"]) for r in vllm]  # 2 rollout replicas + the teacher, 3 each
        for rec in vllm:
            assert rec["gates"] == driver["gates"], (name, rec["role"], rec["pid"], rec["gates"])


# ---- 7. post-mortem: a killed rank, a stalled rank; the last checkpoint resumes -----------------------------------

def _rank(done: Job, rank: int) -> dict:
    (rec,) = [r for r in records(done) if r.get("actor_class") == "WorkerDict" and r["ranks"].get("rank") == rank]
    return rec


def _export_check(saved: Path) -> None:
    """The checkpoint's Hugging Face export passes ``verl-ascend export-check`` against the model it started from."""
    proc = run_command([CLI, "export-check", "--fsdp", "--reference", str(MODEL), str(saved / "huggingface")],
                       check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_killed_rank_is_named_as_the_first_failure_and_its_last_checkpoint_resumes(jobs_dir: Path) -> None:
    done = as_planned(job("on", jobs_dir))
    report = status_json(done)
    outcome, killed = report["outcome"], _rank(done, 1)
    assert (killed["ranks"]["rank"], killed["ranks"]["world_size"]) == (1, 2) and "local_rank" in killed["ranks"]
    first = outcome["first_failure"]
    assert outcome["state"] == "failed" and report["exit_code"] == 1, outcome
    assert (first["role"], first["pid"], first["host"]) == ("ray-worker WorkerDict rank 1", killed["pid"],
                                                             killed["host"]), first
    assert first["how"] == "ended without a word" and killed["ended"] is None, first
    assert "ActorDiedError" in outcome["root_cause"] and str(killed["pid"]) in outcome["root_cause"], outcome
    (driver,) = [p for p in report["processes"] if p["role"] == "driver"]
    assert driver["ended"]["how"] == "exception" and driver["ended"]["error"][-1]["type"] == "ActorDiedError"
    survivor = _rank(done, 0)  # Ray's teardown ended rank 0 with SIGTERM, which its handler (chained) saw
    assert survivor["ended"]["how"] == "signal" and survivor["ended"]["signal"] == "SIGTERM", survivor["ended"]
    text = run_command([CLI, "status", "--dir", str(done.status_dir)], check=False).stdout
    assert text.splitlines()[2] == "Job: FAILED" and "failed first: ray-worker WorkerDict rank 1" in text, text
    assert "JOB FAILED (exit 1)" in text
    # nothing lost: the checkpoint written before the kill is whole, and the next job trains from it
    _export_check(done.checkpoints / "global_step_3" / "actor")
    resumed = job("resumed", jobs_dir)
    assert "global_step_3" in resumed.log and sorted(resumed.metrics) == [4], resumed.explain()


def test_a_stalled_rank_is_named_by_the_barrier_that_failed_first_and_the_last_checkpoint_resumes(
        jobs_dir: Path) -> None:
    done = as_planned(job("resumed", jobs_dir))
    report = status_json(done)
    outcome, waiting, stalled = report["outcome"], _rank(done, 0), _rank(done, 1)
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
    (runner,) = by_role(done)["ray-worker TaskRunnerV1"]
    assert hop["pid"] == runner["pid"] and "/verl_ascend_ext/features/weight_sync/barrier.py:" in hop["where"], hop
    # nothing lost: the step-5 checkpoint written before the stall is whole, and the next job trains from it
    _export_check(done.checkpoints / "global_step_5" / "actor")
    recovered = ok(job("recovered", jobs_dir))
    assert sorted(recovered.metrics) == [6] and "global_step_5" in recovered.log, recovered.explain()
    assert recovered.metrics[6]["actor/grad_norm"] > 0
    after = status_json(recovered)
    assert after["outcome"]["state"] == "ended well" and after["exit_code"] == 0, after["outcome"]
    text = run_command([CLI, "status", "--dir", str(recovered.status_dir)], check=False).stdout
    assert text.splitlines()[2].startswith("Job: ended well"), text
