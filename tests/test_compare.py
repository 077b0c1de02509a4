"""`verl-ascend compare`: verdicts against bounds and the runs' own noise, the inputs it reads, the errors it gives,
the statuses side by side, the baseline file and the picture.

The runs here are logs as verl's console logger prints them (``step:N - key:value``, numpy values, a Ray prefix),
made with a seeded generator so that each verdict is the one its construction makes certain; the real jobs' logs
and status directories are compared in the engine tier (``tests/engine/test_grpo.py``, ``compare`` section).
"""

from __future__ import annotations

import json
import random
import struct
import sys
from pathlib import Path
from typing import Any

import pytest
from records import record, write_record
from subprocesses import run_command

from verl_ascend_ext.runtime.records.schema import new_patch
from verl_ascend_ext.tooling.compare.judge import FAIL, MOVED, NOISE, OK, step_noise

CLI = str(Path(sys.executable).with_name("verl-ascend"))
DRIVER = 4242


def write_log(path: Path, *, seed: int, throughput: float = 1000.0, noise: float = 1.0, steps: int = 20,
              reward_offset: float = 0.0, driver: int = DRIVER, wobble: float | None = None) -> Path:
    """A console log of ``steps`` steps: throughput around ``throughput`` with noise ``10 * noise`` per step (or,
    with ``wobble``, exactly ``throughput +- wobble`` on odd / even steps), a climbing reward, steady step time and
    memory; the plugin's boot line names the driver's pid."""
    rng = random.Random(seed)
    lines = [f"WARNING:2026-12-03 10:00:00,000:verl-ascend-ext (pid {driver}, loaded by verl) on import of "
             "verl.trainer.constants_ppo: ray-runtime-env-gates: applied",
             "(TaskRunner pid=99) WARNING verl-ascend-ext (pid 777, loaded by verl) on import of x: y: applied"]
    for step in range(1, steps + 1):
        values = {"critic/score/mean": f"np.float64({0.2 + 0.01 * step + reward_offset + rng.gauss(0, 0.005)!r})",
                  "perf/throughput": repr(throughput + (rng.gauss(0, 10 * noise) if wobble is None
                                                        else wobble * (-1) ** step)),
                  "timing_s/step": repr(30 + rng.gauss(0, 0.2)),
                  "perf/max_memory_allocated_gb": repr(40 + rng.random() * 0.05),
                  "training/rollout_probs_diff_mean": repr(0.01 + rng.gauss(0, 0.0001))}
        lines.append(f"(TaskRunner pid=99) step:{step} - " + " - ".join(f"{k}:{v}" for k, v in values.items()))
    path.write_text("\n".join(lines) + "\n")
    return path


def compare(*args: str | Path, check_rc: int) -> Any:
    """What ``verl-ascend compare ARGS`` printed (parsed with ``--json``), after checking its exit code."""
    proc = run_command([CLI, "compare", *map(str, args)], check=False)
    assert proc.returncode == check_rc, proc.stdout + proc.stderr
    if "--json" in args and proc.returncode != 2:
        return json.loads(proc.stdout)
    return proc.stdout + proc.stderr


def verdicts(report: dict) -> dict[str, str]:
    return {v["rule"]: v["verdict"] for v in report["verdicts"]}


def test_two_runs_of_the_same_code_agree_and_a_shifted_metric_fails_naming_it(tmp_path: Path) -> None:
    base = write_log(tmp_path / "base.log", seed=0)
    same = write_log(tmp_path / "same.log", seed=1)
    slow = write_log(tmp_path / "slow.log", seed=2, throughput=900.0)  # -10 %, noise ~1 %
    report = compare(base, same, "--json", check_rc=0)
    assert verdicts(report) == {"memory": OK, "throughput": OK, "step time": OK, "reward": OK,
                                "rollout-actor gap": OK, "rollout-actor correlation": "not logged",
                                "distillation loss": "not logged"}
    report = compare(base, slow, "--json", check_rc=1)
    assert report["failed"] == ["throughput"] and verdicts(report)["throughput"] == FAIL
    (throughput,) = [v for v in report["verdicts"] if v["rule"] == "throughput"]
    assert throughput["window"] == "steps 5-14" and throughput["steps"] == [10, 10]
    assert throughput["difference"] == pytest.approx(-100, abs=15) and throughput["noise"] < 30
    text = compare(base, slow, check_rc=1)
    assert "FAILED: throughput (exit 1)" in text


def test_a_shift_within_the_runs_noise_is_not_failed_and_the_output_says_noise(tmp_path: Path) -> None:
    """Throughput swinging +-300 a step (second differences 1200: sigma 726, three standard errors over 10 steps
    974): a run 7 % lower is beyond the -5 % bound but within the runs' noise (noise, not a failure). Swinging +-1
    (three standard errors 3.3), a run 2 % lower is within the bound but far beyond the noise (moved)."""
    base = write_log(tmp_path / "base.log", seed=0, wobble=300.0)
    noisy = write_log(tmp_path / "noisy.log", seed=5, wobble=300.0, throughput=930.0)
    (verdict,) = [v for v in compare(base, noisy, "--json", check_rc=0)["verdicts"] if v["rule"] == "throughput"]
    assert (verdict["verdict"], verdict["difference"], round(verdict["noise"])) == (NOISE, -70.0, 974), verdict
    assert verdict["note"] == "beyond the bound but within the runs' own step-to-step noise"
    calm_base = write_log(tmp_path / "calm.log", seed=0, wobble=1.0)
    calm_moved = write_log(tmp_path / "moved.log", seed=6, wobble=1.0, throughput=980.0)  # -2 %: within -5 %
    (verdict,) = [v for v in compare(calm_base, calm_moved, "--json", check_rc=0)["verdicts"]
                  if v["rule"] == "throughput"]
    assert (verdict["verdict"], verdict["difference"]) == (MOVED, -20.0), verdict


def test_the_noise_statistic_ignores_a_trend_and_an_outlier_step() -> None:
    trend = [0.01 * i for i in range(10)]  # a climbing reward, no noise at all
    assert step_noise(trend) == pytest.approx(0.0)  # neither the trend's spread nor its step counts as noise
    spiked = [1.0, 1.1, 1.0, 1.1, 50.0, 1.0, 1.1, 1.0, 1.1, 1.0]  # alternating +-0.05 around 1.05, one spike
    assert step_noise(spiked) == pytest.approx(0.2 / (0.6745 * 6**0.5))
    rng = random.Random(7)
    noisy = [rng.gauss(0, 1.0) for _ in range(4000)]
    assert step_noise(noisy) == pytest.approx(1.0, rel=0.05)  # white noise of sigma 1 reads as 1
    assert step_noise([1.0, 2.0, 3.0]) is None


def test_verls_file_logger_output_reads_as_its_console_log(tmp_path: Path) -> None:
    console = write_log(tmp_path / "run.log", seed=3)
    from verl_ascend_ext.tooling.compare.runs import read_run

    steps = read_run(console).steps
    jsonl = tmp_path / "run.jsonl"
    jsonl.write_text("".join(json.dumps({"step": s, "data": {**v, "note": "text"}}) + "\n" for s, v in steps.items()))
    assert read_run(jsonl).steps == steps and read_run(jsonl).kind == "file logger"
    assert read_run(console).driver_pids == [DRIVER]  # the driver's own boot line, not a Ray worker's
    report = compare(console, jsonl, "--json", check_rc=0)
    assert all(v["difference"] in (0, None) for v in report["verdicts"])


def test_a_rules_file_overrides_a_default_and_adds_a_rule(tmp_path: Path) -> None:
    base = write_log(tmp_path / "base.log", seed=0)
    run = write_log(tmp_path / "run.log", seed=1, reward_offset=0.02)
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\nname = "reward"\nmetric = "critic/score/mean"\nwindow = [1, 10]\nbound = "+-0.001"\n'
                     '[[rule]]\nname = "gap at step 1"\nmetric = "training/rollout_probs_diff_mean"\nwindow = [1, 1]\n'
                     'statistic = "last"\nbound = "±50%"\n')
    report = compare(base, run, "--rules", rules, "--json", check_rc=1)
    by_name = {v["rule"]: v for v in report["verdicts"]}
    assert by_name["reward"]["window"] == "steps 1-10" and by_name["reward"]["verdict"] == FAIL
    assert "noise unknown" not in by_name["reward"]["note"]
    assert by_name["gap at step 1"]["verdict"] == OK and by_name["gap at step 1"]["bound"] == "±50%"
    assert report["failed"] == ["reward"]


@pytest.mark.parametrize(("rules", "message"), [
    ('[[rule]]\nmetric = "perf/throughput_typo"\nbound = "-5%"\n', "neither run logged: perf/throughput_typo"),
    ('[[rule]]\nmetric = "perf/throughput"\nbound = "5 percent"\n', "rule 1: bound '5 percent'"),
    ('[[rule]]\nmetric = "perf/throughput"\nbound = "-5%"\nwindow = [9, 2]\n', "rule 1: window [9, 2]"),
    ('[[rule]]\nmetric = "perf/throughput"\nbound = "-5%"\nstatistic = "p99"\n', "statistic 'p99'"),
    ('[[rule]]\nmetric = "perf/throughput"\nbund = "-5%"\n', "unknown key(s) bund; missing bound"),
    ("rule = 1\n", "no [[rule]] table"),
])
def test_bad_rules_are_an_error_naming_the_rule_and_the_fix(tmp_path: Path, rules: str, message: str) -> None:
    base = write_log(tmp_path / "base.log", seed=0)
    (tmp_path / "rules.toml").write_text(rules)
    text = compare(base, base, "--rules", tmp_path / "rules.toml", check_rc=2)
    assert message in text and "rules" in text, text


def test_bad_runs_are_an_error_naming_the_file(tmp_path: Path) -> None:
    base = write_log(tmp_path / "base.log", seed=0, steps=10)
    (tmp_path / "empty.log").write_text("Ray started\nno steps at all\n")
    text = compare(base, tmp_path / "empty.log", check_rc=2)
    assert f"{tmp_path / 'empty.log'}: no step found" in text
    later = tmp_path / "later.log"
    later.write_text("\n".join(f"step:{s} - perf/throughput:1000.0" for s in range(50, 60)) + "\n")
    text = compare(base, later, check_rc=2)
    assert "share no step" in text and "steps 1-10" in text and "steps 50-59" in text
    text = compare(base, tmp_path / "missing.log", check_rc=2)
    assert "missing.log: cannot be read" in text


def status_dir(base: Path, driver: int, fixed_upstream: bool) -> Path:
    """A job's status directory: its driver and two actor ranks, the KV barrier applied and acting (0.9.0) or found
    fixed upstream (0.9.1), the export check acting on rank 0 only."""
    barrier = new_patch(status="fixed-upstream" if fixed_upstream else "applied", target="verl.w:W.u", imported=True,
                        exercised=not fixed_upstream)
    for pid, role, actor, rank in ((driver, "driver", None, None), (driver + 1, "ray-worker", "WorkerDict", 0),
                                   (driver + 2, "ray-worker", "WorkerDict", 1)):
        check = new_patch(status="applied", target="verl.c:M.s", imported=True, observed="acts",
                          exercised=rank == 0)
        patches = {"weight-sync-kv-barrier": barrier, "checkpoint-export-check": check} if actor else {}
        write_record(base, record(pid, "n1", role, actor_class=actor, patches=patches, alive=False,
                                  ranks={} if rank is None else {"rank": rank}), ns="local")
    return base


def test_statuses_side_by_side_show_what_an_upgrade_turned_into_fixed_upstream(tmp_path: Path) -> None:
    base, run = write_log(tmp_path / "b.log", seed=0), write_log(tmp_path / "r.log", seed=1, driver=5000)
    dirs = [status_dir(tmp_path / "sb", DRIVER, False), status_dir(tmp_path / "sr", 5000, True)]
    report = compare(base, run, "--status-dir", *dirs, "--json", check_rc=0)
    assert report["status"]["differences"] == [{"role": "ray-worker WorkerDict", "patch": "weight-sync-kv-barrier",
                                                "baseline": "applied:2, ran in 2 of 2", "run": "fixed-upstream:2"}]
    text = compare(base, run, "--status-dir", *dirs, check_rc=0)
    assert "weight-sync-kv-barrier" in text and "fixed-upstream:2" in text
    text = compare(base, run, "--status-dir", dirs[1], dirs[1], check_rc=2)  # the baseline's is another job's
    assert f"status directory {dirs[1]} holds another job's records" in text and str(DRIVER) in text


def test_a_baseline_file_keeps_the_run_and_its_statuses_and_compares_as_the_run(tmp_path: Path) -> None:
    run = write_log(tmp_path / "run.log", seed=1)
    baseline = tmp_path / "glm5_2.baseline"
    text = compare("--write-baseline", baseline, run, "--status-dir", status_dir(tmp_path / "s", DRIVER, False),
                       "-", check_rc=0)
    assert "20 step(s)" in text and "with the plugin's statuses" in text
    content = baseline.read_text()
    assert content.startswith("# verl-ascend-ext baseline 1\n") and "\nstep:20 - critic/score/mean:" in content
    assert "\nstatus: {" in content
    report = compare(baseline, run, "--json", "--status-dir", "-", status_dir(tmp_path / "s2", DRIVER, False),
                         check_rc=0)
    assert all(v["difference"] in (0, None) for v in report["verdicts"])
    assert report["status"]["differences"] == []


def test_the_picture_draws_every_judged_metric_into_a_png(tmp_path: Path) -> None:
    base = write_log(tmp_path / "base.log", seed=0)
    slow = write_log(tmp_path / "slow.log", seed=2, throughput=900.0)
    png = tmp_path / "compare.png"
    text = compare(base, slow, "--plot", png, check_rc=1)
    assert f"Picture: {png}" in text
    header = png.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    assert width > 1000 and height > 800  # five panels in two columns
