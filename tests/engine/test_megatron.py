"""verl's Megatron actor trains with the plugin: ``main_ppo --config-name ppo_megatron_trainer``, the recipes' path.

A real job of the released, unmodified verl (``grpo/jobs.py``, as the FSDP tier's: tiny Qwen2, arithmetic
prompts, vLLM 0.23.0 rollout in hybrid mode with sleep / wake-up every step), with the actor (and the reference
model the recipe's KL loss needs) on verl's Megatron engine: megatron-core 0.16.1, vanilla mbridge 0.15.1,
pipeline parallel 2 over 2 gloo ranks (each rank holds one of the 2 layers: the cheaper of the two splits the
probe measured, TP=2 ~25 % slower). Every override of the shipped GLM-5.2 recipe is in the job but those that name
the NPU, sizes or the model (``grpo/recipe_overrides.py``, read from its run.sh): GRPO with its KL loss, clip
ratios, rollout correction, ``checkpoint.strict=False``, ``load_format=dummy`` (the rollout's weights come from
the actor's first sync), ``resume_mode=auto``, ...

- ``megatron``: verl 0.9.0, gate on, 2 steps, a checkpoint (with ``hf_model``) after each; the step-2 save loses
  one tensor (``grpo_probe``, in mbridge's writer: the path where mbridge users report missing weights), so the
  export check must stop that save naming it: the job fails there, after step 1's checkpoint was completed;
The Megatron resume on verl 0.9.1 (the recipe's ``resume_mode=auto``) rides on the MoE jobs (``test_moe.py``).

The accelerator is the CPU through test-only stand-ins in ``grpo/``: the verl platform ``cpu-test`` and
``transfer_to_cpu`` (the CPU counterpart of torch_npu's ``transfer_to_npu`` for megatron-core and mbridge).
"""

from __future__ import annotations

import fnmatch
import json
import math
import sys
from pathlib import Path

import pytest
from grpo.jobs import DROPPED, Jobs
from grpo.paths import MEGATRON, MODEL, OVERLAY
from grpo.recipe_overrides import RECIPE, key_of, left_out, parsed, recipe_overrides
from omegaconf import OmegaConf
from subprocesses import run_command, run_python

from verl_ascend_ext.features.checkpoint.export_check import report_path_for

pytestmark = pytest.mark.verl091  # the engine venv holds verl 0.9.1 (0.9.0 comes from the overlay, per job)
EXPORT_CHECK = "checkpoint-export-check"
CONFIG_WHOLE = "checkpoint-config-whole"
WEIGHT_SYNC = ("weight-sync-kv-barrier", "weight-sync-light-empty-cache", "weight-sync-sender-no-full-gc")


# ---- 0. the stand-in computes what transformers computes ------------------------------------------------------

def test_the_cpu_stand_in_gives_megatron_the_reference_models_numbers() -> None:
    """mbridge's Megatron model (local spec, fp32) on the CPU through ``transfer_to_cpu``, fed verl's bshd form
    with a padded row: its logits equal transformers' Qwen2 on every valid position (``grpo/megatron_forward.py``).
    """
    grpo = Path(__file__).resolve().parent / "grpo"
    proc = run_command([sys.executable, str(grpo / "megatron_forward.py"), str(MODEL)], pythonpath=f"{MEGATRON}:{grpo}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["shape"] == [2, 12, 512] and result["scale"] > 1, result
    # fp32 (2 layers, logits of a few units): measured 0.0 on an AMX CPU; another kernel's order of
    # accumulation moves a logit by ~1e-6, a wrong mapping / rotary base / mask by > 1e-1
    assert max(result["max_abs_diff"]) < 1e-4, result


# ---- 1. the recipe's own overrides --------------------------------------------------------------------------

def test_the_job_runs_the_recipes_overrides_but_those_left_out_for_a_reason(jobs: Jobs) -> None:
    _, taken, left = recipe_overrides()
    keys = {key_of(o) for o in taken}
    for key in ("algorithm.adv_estimator", "actor_rollout_ref.actor.use_kl_loss",
                "actor_rollout_ref.actor.kl_loss_type", "actor_rollout_ref.actor.clip_ratio_high",
                "actor_rollout_ref.actor.checkpoint.strict", "algorithm.rollout_correction.rollout_is",
                "actor_rollout_ref.rollout.load_format", "actor_rollout_ref.rollout.temperature",
                "trainer.resume_mode"):
        assert key in keys, key
    assert left["actor_rollout_ref.actor.megatron.router_replay.mode"].startswith("routing replay (R3)")
    unused = [p for p in left_out(RECIPE, moe=False) if not any(fnmatch.fnmatchcase(k, p) for k in left)]
    assert unused == [], f"LEFT_OUT names keys the recipe no longer sets: {unused}"
    # what Hydra composed for the job holds every override taken from the recipe, at the recipe's value (also
    # where the job's own overrides set the same key) ...
    config = OmegaConf.load(jobs["megatron"].composed_config())
    differ = {}
    for override in parsed(taken):
        value = OmegaConf.select(config, override.key_or_group)
        value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
        if value != override.value():
            differ[override.key_or_group] = (override.value(), value)
    assert differ == {}, differ
    # ... and the recipe's values are not verl's defaults there (0.9.0: false, 0.001, 0.2, null, true, true)
    actor = config.actor_rollout_ref.actor
    assert (actor.use_kl_loss, actor.kl_loss_coef, actor.clip_ratio_high) == (True, 0.002, 0.28)
    assert config.algorithm.rollout_correction.rollout_is == "token"
    assert actor.checkpoint.strict is False and config.trainer.balance_batch is False


# ---- 2. it trains and checkpoints, split over 2 pipeline stages ----------------------------------------------

def test_megatron_actor_trains_a_grpo_step_and_completes_its_checkpoint_with_the_hf_export(jobs: Jobs) -> None:
    done = jobs["megatron"]
    assert 1 in done.metrics, done.explain()
    m = done.metrics[1]
    assert m["training/global_step"] == 1
    assert math.isfinite(m["actor/pg_loss"]) and m["actor/grad_norm"] > 0, m  # a real update
    assert math.isfinite(m["actor/kl_loss"]), m  # the recipe's KL loss against the Megatron reference model
    assert m["critic/score/max"] > m["critic/score/min"], m
    # the actor's forward is the rollout's model: log-probs of vLLM and Megatron agree (a broken mask or layer
    # split gives a correlation near 0)
    assert m["training/rollout_actor_probs_pearson_corr"] > 0.8, m
    saved = done.checkpoints / "global_step_1" / "actor"
    contents = json.loads((saved / "ckpt_contents.json").read_text())
    assert contents["contents"]["hf_model"]["path"] == "model/huggingface", contents
    assert (saved / "model" / "huggingface" / "model.safetensors").is_file()
    assert (done.checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
    assert "mbridge" in json.dumps(contents["contents"]["model"])


def test_the_export_check_passes_on_mbridges_real_export(jobs: Jobs) -> None:
    export = jobs["megatron"].checkpoints / "global_step_1" / "actor" / "model" / "huggingface"
    report = json.loads(report_path_for(export).read_text())
    assert report["ok"] is True and report["reference"] == str(MODEL), report
    status = json.loads((export.parent / "verl_ascend_ext.status.json").read_text())
    saver = status["saved_by"]
    assert saver["actor_class"] == "WorkerDict"  # rank 0
    assert saver["patches"][EXPORT_CHECK]["status"] == "applied" and saver["patches"][EXPORT_CHECK]["exercised"]


def test_a_tensor_missing_from_mbridges_export_stops_the_save_naming_it(jobs: Jobs) -> None:
    done = jobs["megatron"]
    assert done.returncode != 0 and sorted(done.metrics) == [1], done.explain()  # step 2 stopped at its save
    assert "verl-ascend-ext export check" in done.log and DROPPED in done.log, done.explain()
    export = done.checkpoints / "global_step_2" / "actor" / "model" / "huggingface"
    report = json.loads(report_path_for(export).read_text())
    assert report["ok"] is False and DROPPED in json.dumps(report), report


def test_the_saved_transformer_config_keeps_what_verl_drops(jobs: Jobs) -> None:
    """verl 0.9.0 writes ``transformer_config.json`` with its own JSON-safe helper, which drops every value it
    does not know: the init methods (``functools.partial``) among them. With the plugin they are in the file."""
    saved = json.loads((jobs["megatron"].checkpoints / "global_step_1" / "actor" /
                        "transformer_config.json").read_text())
    assert saved["pipeline_model_parallel_size"] == 2
    init = saved["init_method"]
    assert init["partial"] == "torch.nn.init.normal_" and init["keywords"]["std"] > 0, init
    code = ("import functools, json, torch\n"
            "from verl.utils.checkpoint.megatron_checkpoint_manager import _to_json_safe_config_dict\n"
            "print(json.dumps(_to_json_safe_config_dict({'init_method': functools.partial(torch.nn.init.normal_, "
            "mean=0.0, std=0.02), 'pipeline_model_parallel_size': 2})))")
    without = run_python(code, {"VERL_USE_EXTERNAL_PLUGINS": "none"},  # verl 0.9.0 without the plugin
                         pythonpath=f"{OVERLAY['0.9.0']}:{MEGATRON}")
    assert json.loads(without.stdout.strip().splitlines()[-1]) == {"pipeline_model_parallel_size": 2}


# ---- 3. status: the Megatron checkpoint records and weight sync exercised ------------------------------------

def test_status_shows_the_checkpoint_records_exercised_where_the_save_runs(jobs: Jobs) -> None:
    done = jobs["megatron"]
    export = done.checkpoints / "global_step_1" / "actor" / "model" / "huggingface"
    saver = json.loads((export.parent / "verl_ascend_ext.status.json").read_text())["saved_by"]["pid"]
    for rec in done.ranks():
        for patch in (EXPORT_CHECK, CONFIG_WHOLE):
            assert rec["patches"][patch]["status"] == "applied", (rec["pid"], patch)
        # rank 0 writes the export, checks it and writes transformer_config.json: there the fixes acted
        assert rec["patches"][EXPORT_CHECK]["exercised"] is (rec["pid"] == saver), rec["pid"]
        assert rec["patches"][CONFIG_WHOLE]["exercised"] is (rec["pid"] == saver), rec["pid"]
    report = done.status_json()
    assert report["by_role_exercised"]["ray-worker WorkerDict"][EXPORT_CHECK] == \
        {"observed": "acts", "applied": 2, "ran": 1, "acts": 2, "stood_down": []}  # step 1's save and step 2's
    assert report["acts_when"][EXPORT_CHECK].startswith("rank 0 has written full Hugging Face weights")
    text = done.status_text()
    assert f"{EXPORT_CHECK}: acts when" in text, text
    # the job failed at step 2's save: status names the rank whose export check raised, and why
    first = report["outcome"]["first_failure"]
    assert report["outcome"]["state"] == "failed" and first["pid"] == saver, report["outcome"]
    assert (first["role"], first["how"]) == ("ray-worker WorkerDict rank 0",
                                             f"raised ExportCheckError ({EXPORT_CHECK})")
    assert DROPPED in report["outcome"]["root_cause"], report["outcome"]


def test_weight_sync_fixes_exercised_on_every_megatron_rank(jobs: Jobs) -> None:
    """Each pipeline stage streams its parameters to vLLM (verl's Megatron engine exports per tensor)."""
    for rec in jobs["megatron"].ranks():
        for patch in WEIGHT_SYNC:
            assert rec["patches"][patch]["status"] == "applied", (rec["pid"], patch)
            assert rec["patches"][patch]["exercised"] is True, (rec["pid"], patch)
