"""`verl-ascend compare` on what verl 0.9.0 itself writes: its ``Tracking`` with the ``console`` and ``file`` backends
(``LocalLogger``'s ``step:N - key:value`` lines, ``FileLogger``'s orjson lines, which write NaN and inf as ``null``),
driven with a run's metrics step by step, as ``RayPPOTrainer.fit`` drives it. A diverged run (NaN reward from step
8, NaN throughput from step 5, an inf step time) and a truncated one (stopped after 4 of 20 steps) fail, naming the
metric, the run and the step; ``--allow-missing`` lets the truncated one pass with its notes. A 160-step run whose
loss turns NaN at step 150 (outside every rule's window) fails naming the metric and the step, against the log and
against a baseline file; ``--allow-nonfinite`` passes it, and a baseline logging the loss NaN too does not fail it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from subprocesses import run_command

from verl_ascend_ext.tooling.compare.judge import FAIL, MISSING, OK
from verl_ascend_ext.tooling.compare.nonfinite import ALLOWED, BASELINE_TOO
from verl_ascend_ext.tooling.compare.runs import read_run

CLI = str(Path(sys.executable).with_name("verl-ascend"))

# name -> how the run differs from a healthy 20-step run (a metric NaN from a step on or at one step, inf at one step,
# fewer or more steps)
PLAN: dict[str, dict[str, Any]] = {
    "base": {"seed": 0},
    "same": {"seed": 1},
    "reward_nan": {"seed": 1, "nan_from": {"critic/score/mean": 8}},
    "throughput_nan": {"seed": 1, "nan_from": {"perf/throughput": 5}},
    "step_time_inf": {"seed": 1, "inf_at": {"timing_s/step": 9}},
    "truncated": {"seed": 1, "steps": 4},
    "lower_reward": {"seed": 1, "reward_offset": -0.15},
    "long": {"seed": 0, "steps": 160},
    "late_nan": {"seed": 1, "steps": 160, "nan_from": {"actor/pg_loss": 150, "critic/score/mean": 155}},
    "long_loss_nan": {"seed": 0, "steps": 160, "nan_at": {"actor/pg_loss": 40}},
}

# Runs in a fresh interpreter: verl's own loggers, each run's stdout (the console logger) kept as its log.
WRITER = """
import contextlib, json, os, random, sys
import numpy as np
from verl.utils.tracking import Tracking

plan, out = json.loads(sys.argv[1]), sys.argv[2]
for name, spec in plan.items():
    rng = random.Random(spec["seed"])
    os.environ["VERL_FILE_LOGGER_PATH"] = os.path.join(out, name + ".jsonl")
    with open(os.path.join(out, name + ".log"), "w") as log, contextlib.redirect_stdout(log):
        tracker = Tracking(project_name="compare", experiment_name=name, default_backend=["console", "file"])
        for step in range(1, spec.get("steps", 20) + 1):
            data = {"critic/score/mean": np.float64(0.2 + 0.01 * step + spec.get("reward_offset", 0.0)
                                                    + rng.gauss(0, 0.005)),
                    "perf/throughput": 1000.0 + rng.gauss(0, 10),
                    "timing_s/step": 30 + rng.gauss(0, 0.2),
                    "perf/max_memory_allocated_gb": 40 + rng.random() * 0.05,
                    "training/rollout_probs_diff_mean": np.float32(0.01 + rng.gauss(0, 0.0001)),
                    "actor/pg_loss": 0.5 / step,
                    "training/global_step": step}
            for metric, first in spec.get("nan_from", {}).items():
                if step >= first:
                    data[metric] = np.float64(np.nan) if "score" in metric else float("nan")
            for metric, at in spec.get("nan_at", {}).items():
                if step == at:
                    data[metric] = float("nan")
            for metric, at in spec.get("inf_at", {}).items():
                if step == at:
                    data[metric] = float("inf")
            tracker.log(data=data, step=step)
        tracker.finish()
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory holding ``NAME.log`` (console) and ``NAME.jsonl`` (file logger) of every run in ``PLAN``."""
    out = tmp_path_factory.mktemp("verl_runs")
    run_command([sys.executable, "-c", WRITER, json.dumps(PLAN), str(out)],
                {"VERL_ASCEND_EXT_STATUS_DIR": str(out / "status")})
    return out


def compare(*args: str | Path, check_rc: int) -> dict[str, Any]:
    """``verl-ascend compare ARGS --json``'s report, after checking its exit code."""
    proc = run_command([CLI, "compare", *map(str, args), "--json"], check=False)
    assert proc.returncode == check_rc, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def by_rule(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["rule"]: v for v in report["verdicts"]}


def test_verls_console_log_and_file_logger_of_one_run_read_as_the_same_steps(runs: Path) -> None:
    console, jsonl = read_run(runs / "base.log"), read_run(runs / "base.jsonl")
    assert (console.kind, jsonl.kind) == ("console log", "file logger")
    assert console.steps == jsonl.steps and sorted(console.steps) == list(range(1, 21))
    assert console.steps[3]["training/global_step"] == 3.0
    report = compare(runs / "base.log", runs / "base.jsonl", check_rc=0)
    assert all(v["difference"] in (0, None) for v in report["verdicts"]), report["verdicts"]
    healthy = compare(runs / "base.jsonl", runs / "same.jsonl", check_rc=0)  # another seed of the same run passes
    assert {v["verdict"] for v in healthy["verdicts"]} <= {OK, "moved", "not logged"}, healthy["verdicts"]
    assert healthy["nonfinite"] == []


@pytest.mark.parametrize("form", ["log", "jsonl"])
def test_a_run_whose_reward_turns_nan_from_step_8_fails_naming_the_metric_the_run_and_the_step(
        runs: Path, form: str) -> None:
    report = compare(runs / f"base.{form}", runs / f"reward_nan.{form}", check_rc=1)
    reward = by_rule(report)["reward"]
    assert report["failed"] == ["reward", "non-finite critic/score/mean"] and reward["verdict"] == FAIL
    written = "np.float64(nan)" if form == "log" else "null (verl's file logger writes NaN and inf as null)"
    assert reward["note"].startswith(f"run's critic/score/mean is {written} at step 8, the first of 7 non-finite"), \
        reward["note"]
    assert reward["run"] is None and reward["steps"] == [10, 10]


@pytest.mark.parametrize("form", ["log", "jsonl"])
def test_a_run_whose_throughput_turns_nan_from_step_5_fails(runs: Path, form: str) -> None:
    report = compare(runs / f"base.{form}", runs / f"throughput_nan.{form}", check_rc=1)
    assert report["failed"] == ["throughput", "non-finite perf/throughput"]
    assert "run's perf/throughput is " in by_rule(report)["throughput"]["note"]
    assert " at step 5, the first of 10 non-finite value(s) in steps 5-14" in by_rule(report)["throughput"]["note"]


@pytest.mark.parametrize("form", ["log", "jsonl"])
def test_one_inf_step_time_fails_and_a_nan_in_the_baseline_fails_naming_the_baseline(runs: Path, form: str) -> None:
    report = compare(runs / f"base.{form}", runs / f"step_time_inf.{form}", check_rc=1)
    assert report["failed"] == ["step time", "non-finite timing_s/step"]
    assert "run's timing_s/step is " + ("inf" if form == "log" else "null") in by_rule(report)["step time"]["note"]
    report = compare(runs / f"reward_nan.{form}", runs / f"same.{form}", check_rc=1)  # the baseline diverged
    assert by_rule(report)["reward"]["note"].startswith("baseline's critic/score/mean is ")


@pytest.mark.parametrize("form", ["log", "jsonl"])
def test_a_run_that_stopped_after_4_of_20_steps_fails_unless_allow_missing(runs: Path, form: str) -> None:
    report = compare(runs / f"base.{form}", runs / f"truncated.{form}", check_rc=1)
    verdicts = by_rule(report)
    assert report["failed"] == ["memory", "throughput", "step time", "reward", "rollout-actor gap"]
    assert verdicts["throughput"]["steps"] == [10, 0]
    assert verdicts["throughput"]["note"].startswith(
        "run has 0 of the 10 steps of steps 5-14 the baseline has: it lacks step(s) 5-14 (its last step of "
        "perf/throughput is 4)")
    assert verdicts["memory"]["note"].startswith("run has 4 of the baseline's 20 steps of perf/max_memory_allocated_gb")
    allowed = compare(runs / f"base.{form}", runs / f"truncated.{form}", "--allow-missing", check_rc=0)
    verdicts = by_rule(allowed)
    assert allowed["failed"] == [] and verdicts["throughput"]["verdict"] == MISSING
    assert verdicts["throughput"]["note"].startswith("run has 0 of the 10 steps of steps 5-14")
    assert verdicts["memory"]["verdict"] == OK and "run has 4 of the baseline's 20 steps" in verdicts["memory"]["note"]
    text = run_command([CLI, "compare", runs / f"base.{form}", runs / f"truncated.{form}"], check=False).stdout
    assert "throughput: run has 0 of the 10 steps" in text and "FAILED: memory, throughput" in text


def test_a_reward_015_lower_still_fails(runs: Path) -> None:
    report = compare(runs / "base.jsonl", runs / "lower_reward.jsonl", check_rc=1)
    assert report["failed"] == ["reward"]
    assert by_rule(report)["reward"]["difference"] == pytest.approx(-0.15, abs=0.01)


def nonfinite(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["metric"]: f for f in report["nonfinite"]}


@pytest.mark.parametrize("form", ["log", "jsonl"])
def test_a_run_whose_loss_turns_nan_at_step_150_of_160_fails_outside_every_window_naming_metric_and_step(
        runs: Path, form: str) -> None:
    report = compare(runs / f"long.{form}", runs / f"late_nan.{form}", check_rc=1)
    assert report["failed"] == ["non-finite actor/pg_loss", "non-finite critic/score/mean"]
    assert FAIL not in {v["verdict"] for v in report["verdicts"]}, report["verdicts"]  # every window is finite
    found = nonfinite(report)
    loss, reward = found["actor/pg_loss"], found["critic/score/mean"]
    written = "nan" if form == "log" else "null"
    assert (loss["verdict"], loss["run"]) == (FAIL, {"step": 150, "value": written, "count": 11, "logged": 160})
    assert loss["note"].startswith(f"run's actor/pg_loss is {written}")
    assert " at step 150, the first of 11 non-finite value(s) in the 160 step(s) logging it; the baseline's is " \
        "finite at all 160 step(s) logging it: a diverged run" in loss["note"], loss["note"]
    assert (reward["verdict"], reward["run"]["step"]) == (FAIL, 155)
    assert reward["run"]["value"] == ("np.float64(nan)" if form == "log" else "null")
    text = run_command([CLI, "compare", runs / f"long.{form}", runs / f"late_nan.{form}"], check=False).stdout
    assert "FAILED: non-finite actor/pg_loss, non-finite critic/score/mean (exit 1)" in text, text
    assert f"  non-finite actor/pg_loss: run's actor/pg_loss is {written}" in text


@pytest.mark.parametrize("form", ["log", "jsonl"])
def test_allow_nonfinite_passes_the_late_nan_and_a_baseline_nan_too_is_not_failed(runs: Path, form: str) -> None:
    allowed = compare(runs / f"long.{form}", runs / f"late_nan.{form}", "--allow-nonfinite", "actor/pg_loss",
                      "--allow-nonfinite", "critic/score/mean", check_rc=0)
    assert allowed["failed"] == [] and {f["verdict"] for f in allowed["nonfinite"]} == {ALLOWED}
    assert nonfinite(allowed)["actor/pg_loss"]["note"].endswith(": allowed (--allow-nonfinite actor/pg_loss)")
    report = compare(runs / f"long_loss_nan.{form}", runs / f"late_nan.{form}", check_rc=1)  # its loss NaN at 40
    assert report["failed"] == ["non-finite critic/score/mean"]
    loss = nonfinite(report)["actor/pg_loss"]
    written = "nan" if form == "log" else "null"
    assert loss["verdict"] == BASELINE_TOO
    assert loss["baseline"] == {"step": 40, "value": written, "count": 1, "logged": 160}
    assert loss["note"].endswith(f"; the baseline's is non-finite too ({written} at step 40, 1 of 160 step(s)): not "
                                 "failed by the non-finite check")


def test_a_baseline_file_keeps_which_metrics_its_run_logged_non_finite(runs: Path, tmp_path: Path) -> None:
    """A baseline file holds the rules' metrics only; its ``nonfinite:`` line keeps the loss its run logged NaN."""
    for name in ("long", "long_loss_nan"):
        proc = run_command([CLI, "compare", "--write-baseline", tmp_path / f"{name}.baseline", runs / f"{name}.log"],
                           check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "actor/pg_loss:" not in (tmp_path / "long.baseline").read_text()
    report = compare(tmp_path / "long_loss_nan.baseline", runs / "late_nan.log", check_rc=1)
    assert report["failed"] == ["non-finite critic/score/mean"]
    assert nonfinite(report)["actor/pg_loss"]["verdict"] == BASELINE_TOO
    report = compare(tmp_path / "long.baseline", runs / "late_nan.log", check_rc=1)
    assert report["failed"] == ["non-finite actor/pg_loss", "non-finite critic/score/mean"]
    assert "the baseline file's run never logged it non-finite: a diverged run" in \
        nonfinite(report)["actor/pg_loss"]["note"]
