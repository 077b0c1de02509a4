"""`verl-ascend compare`: verdicts against bounds and the runs' own noise, the inputs it reads, the errors it gives,
the statuses side by side, the baseline file and the picture.

The runs here are logs as verl's console logger prints them (``step:N - key:value``, numpy values, a Ray prefix),
made with a seeded generator so that each verdict is the one its construction makes certain; the non-finite check
over every metric and step (``nonfinite``) on hand-made runs and logs; what verl's own loggers write (a diverged, a
truncated and a late-NaN run among them) is compared in ``tests/test_compare_verl_output.py``, the real
jobs' logs and status directories in the engine tier (``tests/engine/test_grpo.py``, ``compare`` section).
"""

from __future__ import annotations

import json
import math
import random
import struct
import sys
from pathlib import Path
from typing import Any

import pytest
from records import record, write_record
from subprocesses import run_command

from verl_ascend_ext.runtime.records.schema import new_patch
from verl_ascend_ext.tooling.compare import nonfinite
from verl_ascend_ext.tooling.compare.judge import (
    FAIL,
    MISSING,
    MOVED,
    NOISE,
    NOT_COMPARABLE,
    OK,
    RANKS_METRIC,
    judge,
    noise_of,
)
from verl_ascend_ext.tooling.compare.rules import load_rules
from verl_ascend_ext.tooling.compare.runs import NULL, Run, RunError, parse_step_line, read_run

CLI = str(Path(sys.executable).with_name("verl-ascend"))
DRIVER = 4242


def step_noise(values: list[float]) -> float | None:
    """The noise of values logged at consecutive steps."""
    return noise_of(dict(enumerate(values))).sigma

def write_log(path: Path, *, seed: int, throughput: float = 1000.0, noise: float = 1.0, steps: int = 20,
              reward_offset: float = 0.0, driver: int = DRIVER, wobble: float | None = None, loss: bool = False,
              loss_nan_from: int | None = None) -> Path:
    """A console log of ``steps`` steps: throughput around ``throughput`` with noise ``10 * noise`` per step (or,
    with ``wobble``, exactly ``throughput +- wobble`` on odd / even steps), a climbing reward, steady step time and
    memory; with ``loss`` (or ``loss_nan_from``) a falling ``actor/pg_loss``, ``nan`` from step ``loss_nan_from`` on;
    the plugin's boot line names the driver's pid."""
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
        if loss or loss_nan_from is not None:
            values["actor/pg_loss"] = "nan" if loss_nan_from is not None and step >= loss_nan_from else repr(0.5 / step)
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
    assert verdicts(report) == {"memory": OK, "actor memory": "not logged", "throughput": OK, "step time": OK,
                                "reward": OK, "rollout-actor gap": OK, "rollout-actor correlation": "not logged",
                                "distillation loss": "not logged", "rollout memory after sleep": "not logged",
                                "rollout wake-up": "not logged"}
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


def test_a_console_value_or_key_holding_a_colon_splits_at_the_pairs_colon(tmp_path: Path) -> None:
    """verl's ``step:N - key:value`` pairs: a value's colons inside brackets or quotes stay in the value (a tensor's
    device), a key's own colon stays in the key (a validation metric named ``data:metric``)."""
    line = ("step:3 - loss:tensor(0.5, device='npu:0') - val-core/gsm8k:acc:np.float64(0.75) - device:'npu:0' - "
            "perf/throughput:-1.5 - odd:(1 - 2)")
    assert parse_step_line(line.split(" - ", 1)[1]) == {
        "loss": "tensor(0.5, device='npu:0')", "val-core/gsm8k:acc": "np.float64(0.75)", "device": "'npu:0'",
        "perf/throughput": "-1.5", "odd": "(1 - 2)"}
    log = tmp_path / "run.log"
    log.write_text(f"(TaskRunner pid=1) {line}\n")
    assert read_run(log).steps == {3: {"loss": 0.5, "val-core/gsm8k:acc": 0.75, "perf/throughput": -1.5}}
    assert read_run(write_log(tmp_path / "boot.log", seed=3)).driver_pids == [DRIVER]  # not the Ray worker's pid


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


EXAMPLE = 'e.g. [[rule]] / name = "throughput" / metric = "perf/throughput" / window = [5, 14]'


@pytest.mark.parametrize(("rules", "message", "fix"), [
    ('[[rule]]\nmetric = "perf/throughput_typo"\nbound = "-5%"\n', "neither run logged: perf/throughput_typo",
     "Write in the rules file a metric the runs log; known here: critic/score/mean"),
    ('[[rule]]\nmetric = "perf/throughput"\nbound = "5 percent"\n', "rule 1: bound '5 percent'",
     "write +x, -x or ±x (+-x), x a number or a percentage (e.g. -5%"),
    ('[[rule]]\nmetric = "perf/throughput"\nbound = "-5%"\nwindow = [9, 2]\n', "rule 1: window [9, 2]",
     'first <= last), e.g. window = [5, 14], or window = "last"'),
    ('[[rule]]\nmetric = "perf/throughput"\nbound = "-5%"\nstatistic = "p99"\n', "statistic 'p99'",
     'write one of mean, median, max, min, last, e.g. statistic = "mean"'),
    ('[[rule]]\nmetric = "perf/throughput"\nbund = "-5%"\n', "unknown key(s) bund; missing bound",
     f"A rule's keys: metric and bound (needed), name, window, statistic, {EXAMPLE}"),
    ("rule = 1\n", "no [[rule]] table", f"Write one [[rule]] table per rule, {EXAMPLE}"),
    ("rule = [1]\n", "rule 1: not a table (1)", f"not a value of `rule = ...`, {EXAMPLE}"),
])
def test_bad_rules_are_an_error_naming_the_rule_and_the_fix(tmp_path: Path, rules: str, message: str,
                                                            fix: str) -> None:
    base = write_log(tmp_path / "base.log", seed=0)
    (tmp_path / "rules.toml").write_text(rules)
    text = compare(base, base, "--rules", tmp_path / "rules.toml", check_rc=2)
    assert message in text and "rules" in text and fix in text, text


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
    report = compare(base, run, "--dir", *dirs, "--json", check_rc=0)
    assert report["status"]["differences"] == [{"role": "ray-worker WorkerDict", "patch": "weight-sync-kv-barrier",
                                                "baseline": "applied:2, ran in 2 of 2", "run": "fixed-upstream:2"}]
    text = compare(base, run, "--dir", *dirs, check_rc=0)
    assert "weight-sync-kv-barrier" in text and "fixed-upstream:2" in text
    text = compare(base, run, "--dir", dirs[1], dirs[1], check_rc=2)  # the baseline's is another job's
    assert f"status directory {dirs[1]} holds another job's records" in text and str(DRIVER) in text


def test_a_baseline_file_keeps_the_run_and_its_statuses_and_compares_as_the_run(tmp_path: Path) -> None:
    run = write_log(tmp_path / "run.log", seed=1)
    baseline = tmp_path / "glm5_2.baseline"
    text = compare("--write-baseline", baseline, run, "--dir", status_dir(tmp_path / "s", DRIVER, False), check_rc=0)
    assert "20 step(s)" in text and "with the plugin's statuses" in text
    content = baseline.read_text()
    assert content.startswith("# verl-ascend-ext baseline 1\n") and "\nstep:20 - critic/score/mean:" in content
    assert "\nnonfinite: {}\n" in content  # its run logged no metric non-finite
    assert "\nstatus: {" in content
    report = compare(baseline, run, "--json", "--dir", "-", status_dir(tmp_path / "s2", DRIVER, False),
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


def test_dir_takes_two_directories_for_compare_and_one_for_write_baseline(tmp_path: Path) -> None:
    run = write_log(tmp_path / "run.log", seed=1)
    directory = status_dir(tmp_path / "s", DRIVER, False)
    text = compare(run, run, "--dir", directory, check_rc=2)
    assert "--dir takes 2 here, BASELINE_DIR RUN_DIR ('-' for a side without one); 1 given" in text
    text = compare("--dir", directory, directory, run, run, check_rc=2)  # --dir before the runs swallows them
    assert "4 given" in text and "Put --dir after the runs: verl-ascend compare BASELINE RUN --dir" in text
    text = compare("--write-baseline", tmp_path / "b.baseline", run, "--dir", directory, "-", check_rc=2)
    assert "--dir takes 1 here, the RUN's status directory; 2 given" in text
    assert not (tmp_path / "b.baseline").exists()
    text = compare("--write-baseline", tmp_path / "b.baseline", run, "--dir", "-", check_rc=0)
    assert "20 step(s)" in text and "statuses" not in text
    help_text = compare("--help", check_rc=0)
    assert "--write-baseline FILE RUN [--dir DIR]" in " ".join(help_text.split())
    assert "--status-dir" not in help_text


def series_run(path: str, values: dict[str, dict[int, float]]) -> Run:
    """A run holding ``values`` (metric -> step -> value) and nothing else."""
    raw: dict[int, dict[str, str | float]] = {}
    for metric, steps in values.items():
        for step, value in steps.items():
            raw.setdefault(step, {})[metric] = value
    return Run(path, "console log", raw)


RULES = {rule.name: rule for rule in load_rules(None)}
CALM = {step: 1000.0 + (-1) ** step for step in range(1, 21)}  # throughput +-1 around 1000


def test_a_run_that_stopped_logging_a_metric_fails_and_allow_missing_judges_the_steps_both_have() -> None:
    base = series_run("b", {"perf/throughput": CALM})
    run = series_run("r", {"perf/throughput": {s: v for s, v in CALM.items() if s <= 8}, "other": {20: 1.0}})
    verdict = judge(RULES["throughput"], base, run)
    assert (verdict.verdict, verdict.steps) == (FAIL, (10, 4)), verdict
    assert verdict.note.startswith("run has 4 of the 10 steps of steps 5-14 the baseline has: it lacks step(s) 9-14 "
                                   "(its last step of perf/throughput is 8)")
    verdict = judge(RULES["throughput"], base, run, allow_missing=True)
    assert (verdict.verdict, verdict.baseline, verdict.run) == (OK, 1000.0, 1000.0), verdict
    assert "judged on the 4 step(s) both runs have" in verdict.note


def test_a_metric_only_the_run_has_is_a_note_and_a_nan_outside_the_window_is_not_the_rules_but_fails() -> None:
    base = series_run("b", {"perf/throughput": CALM})
    run = series_run("r", {"perf/throughput": {**CALM, 20: math.nan}, "actor/distillation/loss": dict(CALM)})
    verdict = judge(RULES["distillation loss"], base, run)
    assert verdict.verdict == MISSING and not verdict.failed
    assert verdict.note == ("baseline has no value of actor/distillation/loss in steps 5-14, the run has 10: nothing "
                            "to compare against")
    assert judge(RULES["throughput"], base, run).verdict == OK  # step 20 lies outside steps 5-14
    (finding,) = nonfinite.check(base, run)  # but every step of every metric is read for a non-finite value
    assert (finding.metric, finding.verdict, finding.run.step) == ("perf/throughput", FAIL, 20)


def test_the_noise_across_gaps_uses_evenly_spaced_steps_only_and_says_so() -> None:
    assert noise_of({1: 0.0, 3: 1.0, 5: 0.0, 7: 1.0}).differences == 2  # every other step: evenly spaced
    gapped = noise_of({5: 0.0, 6: 1.0, 7: 0.0, 9: 1.0, 10: 0.0, 12: 1.0, 13: 0.0, 14: 1.0})
    assert (gapped.steps, gapped.gaps, gapped.differences) == (8, 2, 2)  # (5, 6, 7) and (12, 13, 14)
    assert gapped.sigma == pytest.approx(2.0 / (0.6745 * 6**0.5))
    holes = {s: v for s, v in CALM.items() if s not in (8, 11)}
    verdict = judge(RULES["throughput"], series_run("b", {"perf/throughput": CALM}),
                    series_run("r", {"perf/throughput": holes}), allow_missing=True)
    assert verdict.note == (
        "noise read from few or gapped steps (baseline 8 step(s) with 2 missing in between, 2 second difference(s); "
        "run 8 step(s) with 2 missing in between, 2 second difference(s); second differences over evenly spaced "
        "steps only, a triple across an uneven gap skipped): a rough estimate; run has 8 of the 10 steps of steps "
        "5-14 the baseline has: it lacks step(s) 8, 11 (its last step of perf/throughput is 20); judged on the 8 "
        "step(s) both runs have")
    sparse = {5: 1000.0, 7: 1000.0, 9: 1000.0}
    verdict = judge(RULES["throughput"], series_run("b", {"perf/throughput": sparse}),
                    series_run("r", {"perf/throughput": sparse}))
    assert verdict.verdict == OK and verdict.note == (
        "noise unknown (baseline 3 step(s) with 2 missing in between, 1 second difference(s); run 3 step(s) with 2 "
        "missing in between, 1 second difference(s); second differences over evenly spaced steps only, a triple "
        "across an uneven gap skipped; it needs 2): the bound alone decides")


def test_a_stand_down_path_compares_by_its_text_not_the_first_calls_detail(tmp_path: Path) -> None:
    """Two jobs stood down on the same path with different first micro-batch shapes (``status.DETAIL``): no
    difference; a path only one job took: one, named."""
    from verl_ascend_ext.patching.status import DETAIL
    from verl_ascend_ext.tooling.compare.status_side import differences, summary

    def job(base: Path, paths: list[str]) -> dict[str, Any]:
        check = new_patch(status="applied", target="verl.m:f", imported=True, observed="acts", exercised=True,
                          acts=4, stood_down=paths)
        write_record(base, record(7, "n1", "driver", alive=False, patches={}), ns="local")
        write_record(base, record(8, "n1", "ray-worker", actor_class="WorkerDict", alive=False,
                                  patches={"r3-route-check": check}), ns="local")
        return summary(base)

    first = job(tmp_path / "a", [f"no response mask{DETAIL}[2, 7]"])
    assert differences(first, job(tmp_path / "b", [f"no response mask{DETAIL}[4, 9]"])) == []
    (row,) = differences(first, job(tmp_path / "c", [f"no response mask{DETAIL}[4, 9]", "packed without offsets"]))
    assert row["baseline"] == "applied:1, acted in 1 of 1, stood down: no response mask"
    assert row["run"] == "applied:1, acted in 1 of 1, stood down: no response mask; packed without offsets"


LOSS = {step: 0.5 / step for step in range(1, 161)}


def test_the_non_finite_check_reads_every_step_of_every_metric_and_names_the_first() -> None:
    """A NaN at step 150 and an inf at 152 of a metric no rule names, a file logger's null at step 160 of a metric
    the baseline does not log: both fail, the earliest first, naming the value as written and the first step."""
    base = series_run("b", {"perf/throughput": CALM, "actor/pg_loss": LOSS})
    run = series_run("r", {"perf/throughput": CALM, "actor/pg_loss": {**LOSS, 150: math.nan, 152: math.inf},
                           "actor/entropy": {160: NULL, 159: 0.3}})
    loss, entropy = nonfinite.check(base, run)
    assert (loss.metric, loss.verdict, loss.failed) == ("actor/pg_loss", FAIL, True)
    assert loss.name == "non-finite actor/pg_loss"
    assert loss.run == nonfinite.First(150, "nan", 2, 160) and loss.baseline_side == "finite (160 steps)"
    assert loss.note == ("run's actor/pg_loss is nan at step 150, the first of 2 non-finite value(s) in the 160 "
                         "step(s) logging it; the baseline's is finite at all 160 step(s) logging it: a diverged run, "
                         "whatever the rules' windows (--allow-nonfinite actor/pg_loss if it is known to be so)")
    assert (entropy.metric, entropy.verdict, entropy.run.step, entropy.baseline_side) == (
        "actor/entropy", FAIL, 160, "not logged")
    assert entropy.note.startswith("run's actor/entropy is null (verl's file logger writes NaN and inf as null) at "
                                   "step 160, the first of 1 non-finite value(s) in the 2 step(s) logging it; the "
                                   "baseline does not log it: a diverged run")
    assert nonfinite.check(base, base) == [] and nonfinite.check(run, base) == []  # only the run's values fail


def test_allow_nonfinite_and_a_baseline_non_finite_too_are_not_failed_and_say_why() -> None:
    run = series_run("r", {"actor/pg_loss": {**LOSS, 150: math.nan}})
    (allowed,) = nonfinite.check(series_run("b", {"actor/pg_loss": LOSS}), run, ("actor/pg_loss",))
    assert (allowed.verdict, allowed.failed) == (nonfinite.ALLOWED, False)
    assert allowed.note.endswith("logging it: allowed (--allow-nonfinite actor/pg_loss)")
    (too,) = nonfinite.check(series_run("b", {"actor/pg_loss": {**LOSS, 3: -math.inf, 4: math.nan}}), run)
    assert (too.verdict, too.failed) == (nonfinite.BASELINE_TOO, False)
    assert too.baseline == nonfinite.First(3, "-inf", 2, 160)
    assert too.note.endswith("; the baseline's is non-finite too (-inf at step 3, 2 of 160 step(s)): not failed by the "
                             "non-finite check")
    with pytest.raises(RunError, match=r"--allow-nonfinite names metric\(s\) neither run logged: actor/pg_los\. "
                                       "Name a metric the runs log; known here: actor/pg_loss"):
        nonfinite.check(run, run, ("actor/pg_los",))


def test_a_console_log_whose_loss_turns_nan_at_step_150_fails_and_allow_nonfinite_passes_it(tmp_path: Path) -> None:
    base = write_log(tmp_path / "base.log", seed=0, steps=160, loss=True)
    run = write_log(tmp_path / "run.log", seed=1, steps=160, loss_nan_from=150)
    text = compare(base, run, check_rc=1)
    assert "Non-finite values (every metric of the run, every step)" in text
    assert "  non-finite actor/pg_loss: run's actor/pg_loss is nan at step 150, the first of 11" in text
    assert text.rstrip().endswith("FAILED: non-finite actor/pg_loss (exit 1)"), text
    report = compare(base, run, "--json", check_rc=1)
    assert [f["verdict"] for f in report["nonfinite"]] == [FAIL] and report["nonfinite"][0]["run"]["step"] == 150
    assert FAIL not in verdicts(report).values()  # no rule's window holds it
    text = compare(base, run, "--allow-nonfinite", "actor/pg_loss", check_rc=0)
    assert "allowed (--allow-nonfinite actor/pg_loss)" in text and "OK: no rule failed" in text
    text = compare(base, run, "--allow-nonfinite", "actor/pg_los", check_rc=2)
    assert "--allow-nonfinite names metric(s) neither run logged: actor/pg_los" in text
    text = compare(base, base, check_rc=0)
    assert "Non-finite values (every metric of the run, every step): none" in text


def test_a_baseline_file_without_its_runs_non_finite_record_says_so_and_fails_the_nan(tmp_path: Path) -> None:
    source = write_log(tmp_path / "source.log", seed=0, steps=160, loss_nan_from=100)
    run = write_log(tmp_path / "run.log", seed=1, steps=160, loss_nan_from=150)
    baseline = tmp_path / "b.baseline"
    compare("--write-baseline", baseline, source, check_rc=0)
    content = baseline.read_text()
    assert '\nnonfinite: {"actor/pg_loss": {"count": 61, "logged": 160, "step": 100, "value": "nan"}}\n' in content
    (finding,) = compare(baseline, run, "--json", check_rc=0)["nonfinite"]
    assert finding["verdict"] == nonfinite.BASELINE_TOO and finding["baseline"]["step"] == 100
    baseline.write_text("".join(line for line in content.splitlines(keepends=True)
                                if not line.startswith("nonfinite: ")))  # as written before the record was kept
    (finding,) = compare(baseline, run, "--json", check_rc=1)["nonfinite"]
    assert finding["baseline_side"] == "unknown" and "the baseline file does not say whether its run logged it " \
        "non-finite (written before it kept that: write it again with --write-baseline)" in finding["note"]


def test_sleep_figures_of_different_sets_of_rollout_ranks_are_not_compared_and_the_verdict_says_why() -> None:
    """The sleep-memory figure is the worst rank of the ranks it covers (every node's since the watch on every node):
    runs whose figures cover different numbers of ranks are not compared (not failed either); the same number is."""
    memory = {step: 2.0 for step in range(1, 21)}
    base = series_run("b", {"rollout/memory_in_use_after_sleep_gib": memory, RANKS_METRIC: dict.fromkeys(memory, 16)})
    one_node = series_run("r", {"rollout/memory_in_use_after_sleep_gib": {s: 1.0 for s in memory},
                                RANKS_METRIC: dict.fromkeys(memory, 8)})
    verdict = judge(RULES["rollout memory after sleep"], base, one_node)
    assert verdict.verdict == NOT_COMPARABLE and not verdict.failed, verdict
    assert "the worst of 16 rollout rank(s), the run's of 8" in verdict.note, verdict.note
    same = series_run("r", {"rollout/memory_in_use_after_sleep_gib": {s: 4.0 for s in memory},
                            RANKS_METRIC: dict.fromkeys(memory, 16)})
    assert judge(RULES["rollout memory after sleep"], base, same).verdict == FAIL  # +2 GiB over the +1 bound
    assert judge(RULES["rollout memory after sleep"], base, series_run("r", {
        "rollout/memory_in_use_after_sleep_gib": memory})).verdict == OK  # a run without the count: compared
