"""verl's fully-async mode trains with the plugin: ``fully_async_main``, the shipped ``glm5_2_megatron_fully_async``
recipe's path, on the CPU.

Two real jobs of the released, unmodified verl (declared in ``grpo/jobs.py``): the trainer on 2 gloo ranks (verl's
Megatron actor, TP=2, as the recipe) in its own pool, ONE vLLM 0.23.0 replica in another (its
``CheckpointEngineWorker``, ``vLLMHttpServer``, EngineCore and worker), the weights sent by the test-only CPU
counterpart of verl's HCCL checkpoint engine (``grpo/cpu_checkpoint_engine.py``, under the recipe's backend name
``nccl``), a weight sync before training and after every trainer step, partial rollout with responses long enough
that requests are still generating when the trainer syncs, a checkpoint each step:

- ``fully-async``: verl 0.9.0, gate on; the rollout's EngineCore is killed (SIGKILL) once step 3's checkpoint is
  complete, while step 4 runs: the job fails within seconds, and ``status`` names the EngineCore first
  (``test_job_watch.py``);
- ``fully-async-resumed``: verl 0.9.1 (where every sync puts the rollout to sleep and wakes it in two parts: the
  GLM-5.2 wake-up fix acts there), resumed from the last checkpoint with the recipe's ``resume_mode=auto``.

With the gate off, what vLLM 0.23 does at the same point of a sync (the scheduler resumed while the KV cache
sleeps) is shown on a real engine driven through the same calls, beside these jobs
(``test_engine.py::test_a_fully_async_weight_sync_...``).
"""

from __future__ import annotations

import fnmatch
import json
import math

import pytest
from grpo.jobs import Jobs
from grpo.overrides import FULLY_ASYNC_RESPONSE
from grpo.recipe_overrides import FULLY_ASYNC, left_out, parsed, recipe_overrides
from omegaconf import OmegaConf

from verl_ascend_ext.features.checkpoint.export_check import report_path_for

pytestmark = pytest.mark.verl091  # the engine venv holds verl 0.9.1 (0.9.0 comes from the overlay, per job)
WAKE_UP = "glm52-vllm-wake-up-resume-when-awake"
BARRIER = "weight-sync-kv-barrier"
NO_ROLLOUT = "no colocated rollout"
ROLES = {"ray-worker FullyAsyncTaskRunner", "ray-worker FullyAsyncTrainer", "ray-worker FullyAsyncRollouter",
         "ray-worker MessageQueue", "ray-worker CheckpointEngineWorker", "ray-worker WorkerDict",
         "vllm-frontend vLLMHttpServer", "engine-core", "vllm-worker"}


def syncs(done) -> list[dict]:
    """The trainer's weight syncs as the checkpoint engine logged them (rank 0's sends), in order."""
    rows = [json.loads(line) for f in (done.directory / "transfers").glob("*.jsonl")
            for line in f.read_text().splitlines() if line]
    return sorted((r for r in rows if r["event"] == "send" and r.get("sent")), key=lambda r: r["t"])


def trained(done) -> dict[int, dict]:
    """training step -> the trainer's metrics for it. verl's fully-async trainer prints step k's training metrics
    on its ``step:k+1`` line (``training/global_step`` says which) and the last step's never."""
    return {int(m["training/global_step"]): m for m in done.metrics.values() if "training/global_step" in m}


# ---- 1. the recipe's own overrides ----------------------------------------------------------------------------

def test_the_jobs_run_the_fully_async_recipes_overrides_but_those_left_out_for_a_reason(jobs: Jobs) -> None:
    config_name, taken, left = recipe_overrides(FULLY_ASYNC)
    assert config_name == "fully_async_ppo_megatron_trainer"
    keys = {parsed([o])[0].key_or_group for o in taken}
    for key in ("actor_rollout_ref.hybrid_engine", "actor_rollout_ref.rollout.checkpoint_engine.backend",
                "async_training.partial_rollout", "async_training.require_batches", "trainer.resume_mode"):
        assert key in keys, key
    unused = [p for p in left_out(FULLY_ASYNC, moe=False) if not any(fnmatch.fnmatchcase(k, p) for k in left)]
    assert not [p for p in unused if p.startswith(("async_training", "rollout.", "actor_rollout_ref.rollout.check"))], \
        f"left-out patterns of the fully-async recipe that it no longer sets: {unused}"
    config = OmegaConf.load(jobs["fully-async-resumed"].composed_config())
    differ = {}
    for override in parsed([o for o in taken if not o.startswith("hydra.")]):
        value = OmegaConf.select(config, override.key_or_group)
        value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
        if value != override.value():
            differ[override.key_or_group] = (override.value(), value)
    assert differ == {}, differ
    assert config.actor_rollout_ref.rollout.checkpoint_engine.backend == "nccl"  # the recipe's, the HCCL engine's name
    assert config.actor_rollout_ref.hybrid_engine is False and config.async_training.partial_rollout is True


# ---- 2. it trains: weight syncs, requests in flight, checkpoints -----------------------------------------------

def test_fully_async_trains_with_a_sync_before_training_and_after_every_step(jobs: Jobs) -> None:
    done = jobs["fully-async"].as_planned()
    sent = syncs(done)
    assert len(sent) >= 4, sent  # before training, after steps 1, 2 and 3 (then the EngineCore was killed)
    assert all(s["bytes"] > 700_000 for s in sent), sent  # the whole tiny model (26 tensors, 723 KB) each time
    steps = trained(done)
    assert sorted(steps)[:2] == [1, 2], done.explain()  # step k's metrics come on step k+1's line
    for m in steps.values():
        assert math.isfinite(m["actor/pg_loss"]) and m["actor/grad_norm"] > 0, m  # a real update, Megatron actor
    for step in (1, 2, 3):
        export = done.checkpoints / f"global_step_{step}" / "actor" / "model" / "huggingface"
        assert json.loads(report_path_for(export).read_text())["ok"] is True, step


def continued(done) -> list[tuple[dict, dict]]:
    """(aborted, continuation) pairs of generate calls: a call whose prompt is an earlier call's prompt followed by
    all that call generated (how verl's partial rollout resumes a request a sync aborted)."""
    calls = sorted(done.served(), key=lambda r: r["t"])
    pairs = []
    for i, later in enumerate(calls):
        for earlier in calls[:i]:
            if later["prompt_ids"] == earlier["prompt_ids"] + earlier["token_ids"]:
                pairs.append((earlier, later))
    return pairs


def test_requests_were_in_flight_at_a_sync_and_resumed_on_the_new_weights(jobs: Jobs) -> None:
    """Partial rollout: a sync aborts the requests still generating and resumes them after the new weights arrive:
    a generate call that stopped short, a weight sync, then a call carrying on from its last token."""
    for name in ("fully-async", "fully-async-resumed"):
        done = jobs[name]
        sent = [s["t"] for s in syncs(done)]
        across = [(a, c) for a, c in continued(done) if any(a["t"] <= t <= c["t"] for t in sent)]
        assert across, (name, [(a["t"], len(a["token_ids"]), c["t"]) for a, c in continued(done)], sent)
        assert all(len(a["token_ids"]) < FULLY_ASYNC_RESPONSE for a, _ in across)  # stopped short, not finished


# ---- 3. on verl 0.9.1 the wake-up fix acts at every sync --------------------------------------------------------

def test_on_verl_091_the_wake_up_fix_acted_in_the_rollouts_engine_core_at_every_sync(jobs: Jobs) -> None:
    done = jobs["fully-async-resumed"].ok()
    assert trained(done), done.explain()
    (core,) = [r for r in done.records() if r["role"] == "engine-core"]
    wake_up = core["patches"][WAKE_UP]
    assert (wake_up["status"], wake_up["observed"]) == ("applied", "acts"), wake_up
    assert wake_up["acts"] == len(syncs(done)) >= 2, (wake_up, syncs(done))  # one partial wake-up a sync
    report = done.status_json()
    assert report["by_role_exercised"]["engine-core"][WAKE_UP]["acts"] == len(syncs(done))
    assert report["outcome"]["state"] == "ended well"


# ---- 4. status: the roles of this mode, and where a fix stood down -----------------------------------------------

def test_status_names_this_modes_roles_each_with_its_records(jobs: Jobs) -> None:
    done = jobs["fully-async-resumed"].ok()
    roles = done.by_role()
    assert set(roles) >= ROLES, sorted(roles)
    assert len(roles["ray-worker WorkerDict"]) == 2  # the trainer's ranks
    (queue,) = roles["ray-worker MessageQueue"]  # booted by the runtime env's setup hook: it never imports verl
    assert queue["loaded_by"][0] == "ray" and queue["gates"]["VERL_VLLM_ASCEND_GLM52_PATCH"] is True, queue


def test_the_kv_barrier_stood_down_on_the_trainer_ranks_and_says_why(jobs: Jobs) -> None:
    """The trainer's ranks have no colocated rollout: ``update_weights`` calls verl's code as it is there, and the
    record says so instead of counting as exercised (both releases)."""
    for name in ("fully-async", "fully-async-resumed"):
        done = jobs[name]
        for rec in done.ranks():
            barrier = rec["patches"][BARRIER]
            assert barrier["status"] == "applied" and barrier["exercised"] is False, (name, barrier)
            assert any(path.startswith(NO_ROLLOUT) for path in barrier["stood_down"]), (name, barrier)
        text = done.status_text()
        assert "Stood down" in text and f"{BARRIER}: stood down: {NO_ROLLOUT}" in text, text


def test_the_job_a_killed_engine_core_ended_resumes_from_its_last_checkpoint(jobs: Jobs) -> None:
    """The EngineCore killed after step 3's checkpoint (its naming: test_job_watch.py): the resume on verl 0.9.1
    carries on from that checkpoint and saves its own, whole."""
    done = jobs["fully-async"].as_planned()
    assert done.status_json()["outcome"]["first_failure"]["role"].startswith("engine-core"), done.explain()
    resumed = jobs["fully-async-resumed"].ok()
    steps = trained(resumed)
    assert steps and min(steps) > 3, resumed.explain()  # it carried on from step 3's checkpoint, not from scratch
    saved = sorted(int(p.name.rsplit("_", 1)[1]) for p in resumed.checkpoints.glob("global_step_*"))
    assert 3 in saved and saved[-1] == 6, saved  # the killed job's last, then this job's own
    export = resumed.checkpoints / "global_step_6" / "actor" / "model" / "huggingface"
    assert json.loads(report_path_for(export).read_text())["ok"] is True


# ---- the stand-in's numbers ---------------------------------------------------------------------------------------

def test_the_padding_stand_in_matches_verl_091s_own_fallbacks() -> None:
    """``cpu_bert_padding`` (verl 0.9.0's trainer on the CPU) against the pure-torch fallbacks verl 0.9.1 ships."""
    import torch
    from grpo.cpu_bert_padding import pad_input, unpad_input
    from verl.utils import attention_utils as verl_091

    torch.manual_seed(0)
    mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1], [0, 0, 1, 0, 0]])
    hidden = torch.randn(3, 5, 4)
    ours, theirs = unpad_input(hidden, mask), verl_091._fallback_unpad_input(hidden, mask)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(torch.as_tensor(a), torch.as_tensor(b)), (a, b)
    tokens, indices = ours[0], ours[1]
    assert torch.equal(pad_input(tokens, indices, 3, 5), verl_091._fallback_pad_input(tokens, indices, 3, 5))
    assert torch.equal(pad_input(tokens, indices, 3, 5), hidden * mask[..., None])  # the round trip

