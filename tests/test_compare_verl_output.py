"""`verl-ascend compare` on what verl 0.9.0 itself writes: its ``Tracking`` with the ``console`` and ``file`` backends
(``LocalLogger``'s ``step:N - key:value`` lines, ``FileLogger``'s orjson lines, which write NaN and inf as ``null``),
driven with a run's metrics step by step, as ``RayPPOTrainer.fit`` drives it. A diverged run (NaN reward from step
8, NaN throughput from step 5, an inf step time) and a truncated one (stopped after 4 of 20 steps) fail, naming the
metric, the run and the step; ``--allow-missing`` lets the truncated one pass with its notes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from subprocesses import run_command

from verl_ascend_ext.tooling.compare.judge import FAIL, MISSING, OK
from verl_ascend_ext.tooling.compare.runs import read_run

CLI = str(Path(sys.executable).with_name("verl-ascend"))

# name -> how the run differs from a healthy 20-step run (a metric's value from a step on, or fewer steps)
PLAN: dict[str, dict[str, Any]] = {
    "base": {"seed": 0},
    "same": {"seed": 1},
    "reward_nan": {"seed": 1, "nan_from": ["critic/score/mean", 8]},
    "throughput_nan": {"seed": 1, "nan_from": ["perf/throughput", 5]},
    "step_time_inf": {"seed": 1, "inf_at": ["timing_s/step", 9]},
    "truncated": {"seed": 1, "steps": 4},
    "lower_reward": {"seed": 1, "reward_offset": -0.15},
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
                    "training/global_step": step}
            if "nan_from" in spec and step >= spec["nan_from"][1]:
                data[spec["nan_from"][0]] = np.float64(np.nan) if "score" in spec["nan_from"][0] else float("nan")
            if "inf_at" in spec and step == spec["inf_at"][1]:
                data[spec["inf_at"][0]] = float("inf")
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


@pytest.mark.parametrize("form", ["log", "jsonl"])
def test_a_run_whose_reward_turns_nan_from_step_8_fails_naming_the_metric_the_run_and_the_step(
        runs: Path, form: str) -> None:
    report = compare(runs / f"base.{form}", runs / f"reward_nan.{form}", check_rc=1)
    reward = by_rule(report)["reward"]
    assert report["failed"] == ["reward"] and reward["verdict"] == FAIL
    written = "np.float64(nan)" if form == "log" else "null (verl's file logger writes NaN and inf as null)"
    assert reward["note"].startswith(f"run's critic/score/mean is {written} at step 8, the first of 7 non-finite"), \
        reward["note"]
    assert reward["run"] is None and reward["steps"] == [10, 10]


@pytest.mark.parametrize("form", ["log", "jsonl"])
def test_a_run_whose_throughput_turns_nan_from_step_5_fails(runs: Path, form: str) -> None:
    report = compare(runs / f"base.{form}", runs / f"throughput_nan.{form}", check_rc=1)
    assert report["failed"] == ["throughput"]
    assert "run's perf/throughput is " in by_rule(report)["throughput"]["note"]
    assert " at step 5, the first of 10 non-finite value(s) in steps 5-14" in by_rule(report)["throughput"]["note"]


@pytest.mark.parametrize("form", ["log", "jsonl"])
def test_one_inf_step_time_fails_and_a_nan_in_the_baseline_fails_naming_the_baseline(runs: Path, form: str) -> None:
    report = compare(runs / f"base.{form}", runs / f"step_time_inf.{form}", check_rc=1)
    assert report["failed"] == ["step time"]
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
