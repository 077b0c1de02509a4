"""benchmarks/job_time_breakdown.py: from a job directory of tests/engine (job.log in the formats its processes write,
the plugin's records, the files' times) it tells each phase of the job's wall time, and names the phases a job that
failed never reached."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import pytest
from records import record, write_record
from repo import REPO

SPEC = importlib.util.spec_from_file_location("job_time_breakdown", REPO / "benchmarks" / "job_time_breakdown.py")
bench = sys.modules[SPEC.name] = importlib.util.module_from_spec(SPEC)  # its dataclasses look themselves up
SPEC.loader.exec_module(bench)

T0 = time.mktime((2026, 12, 6, 11, 54, 10, 0, 0, -1)) + 0.25  # the job's start (local time, as the job writes it)
SESSION = "session_2026-12-06_11-54-10_750000_31856"  # the Ray head began 0.5 s after it


def at(offset: float, vllm: bool = False) -> str:
    """The stamp of a line ``offset`` seconds into the job: logging's / Ray's (ms), or vLLM's (whole seconds)."""
    t = T0 + offset
    if vllm:
        return time.strftime("%m-%d %H:%M:%S", time.localtime(t))
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f",{round((t % 1) * 1000):03d}"


def touch(path: Path, offset: float, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if text or not path.is_dir():
        path.write_text(text)
    os.utime(path, (T0 + offset, T0 + offset))


def job_dir(tmp_path: Path, log: list[str], driver_end: float, code: int) -> Path:
    """A job's directory as job.py leaves it: job.log, argv.json, the records (the driver's, a rank's, a vLLM
    server's), ``transfers/`` made at the start."""
    d = tmp_path / "on"
    (d / "transfers").mkdir(parents=True)
    touch(d / "transfers", 0.0)
    touch(d / "argv.json", 4.0, json.dumps(["python", "-m", "verl.trainer.main_ppo", "trainer.total_training_steps=3"]))
    touch(d / "job.log", driver_end, "\n".join(log) + "\n")
    status = d / "status"
    ended = {"at": T0 + driver_end, "how": "exception" if code else "exit", "code": code, "signal": None,
             "error": [{"type": "RayTaskError(ActorDiedError)", "message": "", "where": None}] if code else None}
    write_record(status, record(100, "vm", "driver", started=T0 + 8.0, updated=T0 + driver_end, ended=ended,
                                namespace="local"), ns="local")
    write_record(status, record(400, "vm", "ray-worker", actor_class="WorkerDict", started=T0 + 26.0,
                                updated=T0 + 60.0, namespace=SESSION), ns=SESSION)
    write_record(status, record(500, "vm", "vllm-frontend", actor_class="vLLMHttpServer", started=T0 + 45.0,
                                updated=T0 + 100.0, namespace=SESSION), ns=SESSION)
    return d


START = [  # the driver's lines, then the task runner's, a rank's, the vLLM server's (Ray's prefixes, colours)
    f"INFO:{at(8.0)}:PlatformRegistry: overriding huawei (PlatformNPU -> AscendExtPlatformNPU)",
    f"{at(10.0)}\tINFO worker.py:1841 -- Connecting to existing Ray cluster at address: 127.0.0.1:34117...",
    f"{at(10.5)}\tINFO worker.py:2038 -- Connected to Ray cluster.",
    f"[{at(12.0)}][verl_ascend_ext.features.device][WARNING] - verl-ascend-ext: cluster check: the 1 node(s) that "
    "can take the job's workers agree (1.0 s)",
    f"\x1b[36m(TaskRunnerV1 pid=300)\x1b[0m INFO:{at(25.0)}:create worker group dict_keys(['actor_rollout'])",
    f"\x1b[36m(pid=400)\x1b[0m WARNING:{at(30.0)}:verl-ascend-ext (pid 400, loaded by ray) on import of "
    "verl.utils.tracking: sleep-memory-metric: applied",
    f"\x1b[36m(WorkerDict pid=400)\x1b[0m INFO:{at(35.0)}:Platform override from VERL_PLATFORM: cpu-test",
    "\x1b[36m(WorkerDict pid=400)\x1b[0m Loading weights: 100%|##########| 26/26 [00:00<00:00, 18190.48it/s]",
    f"\x1b[36m(TaskRunnerV1 pid=300)\x1b[0m INFO:{at(40.0)}:actor and ref model engine initialized",
    f"\x1b[36m(vLLMHttpServer pid=500)\x1b[0m (EngineCore pid=501) W1206 {at(60.0)[11:].replace(',', '.')}000 501 "
    "torch/utils/cpp_extension.py:140] No CUDA runtime is found",
    f"\x1b[36m(vLLMHttpServer pid=500)\x1b[0m WARNING {at(89.75, vllm=True)} [api_router.py:30] LoRA dynamic loading "
    "& unloading is enabled in the API server.",
    f"\x1b[36m(TaskRunnerV1 pid=300)\x1b[0m INFO:{at(92.0)}:all initialize finished, ready to fit",
]


def test_a_job_that_failed_in_its_third_step(tmp_path: Path) -> None:
    log = [*START,
           "\x1b[36m(TaskRunnerV1 pid=300)\x1b[0m step:1 - actor/entropy:1.77 - timing_s/gen:6.0 - "
           "timing_s/update_weights:0.5 - timing_s/step:20.0",
           "\x1b[36m(TaskRunnerV1 pid=300)\x1b[0m step:2 - timing_s/gen:2.0 - timing_s/step:6.0",
           f"\x1b[36m(TaskRunnerV1 pid=300)\x1b[0m INFO:{at(127.0)}:Saving checkpoint to /x/ckpt/global_step_3",
           "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task."]
    d = job_dir(tmp_path, log, driver_end=130.0, code=1)
    touch(d / "rollouts" / "1.jsonl", 115.0, "{}\n")  # verl dumps a step's generations at its end
    touch(d / "rollouts" / "2.jsonl", 121.0, "{}\n")
    touch(d / "ckpt" / "latest_checkpointed_iteration.txt", 128.0, "3")

    b = bench.breakdown(d, wall_s=134.0)

    rows = {r.name: r for r in b.rows}

    def seconds(name: str) -> float:
        row = rows[name]
        return row.seconds if row.seconds is not None else row.end - row.start

    assert (b.start, b.wall) == (pytest.approx(T0), 134.0)
    assert b.outcome == "exception (exit 1): RayTaskError(ActorDiedError)"
    expected = {  # phase -> (start offset, seconds)
        "Ray up: ray_head.py starts, imports Ray": (0.0, 0.5),
        "Ray up: head node and raylet start, address printed": (0.5, 3.5),
        "driver start-up: python, imports, Hydra config, ray.init": (4.0, 6.5),
        "cluster check (the plugin's, after ray.init)": (10.5, 1.5),
        "task runner: actor up, verl imports, config, data set": (12.0, 13.0),
        "worker group init: 1 WorkerDict processes up, imports": (25.0, 10.0),
        "model load: the ranks' init_model": (35.0, 5.0),
        "other actors until the first vLLM server starts": (40.0, 5.0),
        "vLLM servers up to ready (1)": (45.0, 44.75),  # vLLM's stamp: whole seconds
        "trainer ready: first weight sync, managers": (89.75, 2.25),
        "fit set-up before step 1's generation": (92.0, 3.0),
        "step 1": (95.0, 20.0),
        "step 2": (115.0, 6.0),
        "step 3 (not finished: the job failed in it)": (121.0, 9.0),
        "teardown: the driver's shutdown, Ray ends the job's processes, job.py kills the rest": (130.0, 4.0),
    }
    got = {r.name: (pytest.approx(r.start - T0, abs=0.01), pytest.approx(seconds(r.name), abs=0.01))
           for r in b.rows if r.level == 0}
    assert got == expected
    assert [r.status for r in b.rows if r.level == 0] == ["ok"] * 13 + ["not finished", "ok"]
    assert seconds("the check itself (the seconds its line says)") == 1.0
    assert seconds("Ray starts the WorkerDict processes") == pytest.approx(1.0, abs=0.01)  # to the rank's record
    assert seconds("vLLM server pid 500: up to ready") == pytest.approx(44.75, abs=0.01)
    assert [seconds(f"generation of step {k} (timing_s/gen)") for k in (1, 2)] == [6.0, 2.0]
    assert seconds("of which step 1's start-up (its time over the later steps' median)") == 14.0
    assert seconds("checkpoint save of step 3") == pytest.approx(1.0, abs=0.01)  # the line to verl's tracker
    assert b.start_up == pytest.approx(95.0, abs=0.01)
    assert sum(seconds(n) for n in expected) == pytest.approx(b.wall, abs=0.01)  # the phases partition the wall
    out = bench.table(b)
    assert "start-up (before step 1's generation) 95 s of 134 s (71%); and about 14 s more inside step 1" in out


def test_a_job_stopped_by_the_cluster_check_reached_nothing_after_it(tmp_path: Path) -> None:
    log = [*START[:3], "Traceback (most recent call last):",  # the driver's traceback: no time on its lines
           "verl_ascend_ext.features.device.cluster_check.ClusterCheckError: verl-ascend-ext: cluster check "
           "(VERL_ASCEND_EXT_CLUSTER_CHECK=error): 1 of the 2 node(s) that can take this job's workers would run it "
           "differently or without this plugin (asked in the job's runtime env in 1.2 s, before the first worker "
           "group):"]
    d = job_dir(tmp_path, log, driver_end=12.5, code=1)
    for path in (d / "status" / SESSION).glob("*.json"):  # no worker group, no server got that far
        path.unlink()

    b = bench.breakdown(d)

    rows = {r.name: r for r in b.rows}
    check = rows["cluster check (the plugin's, after ray.init)"]
    assert (check.status, check.end - T0) == ("ok", pytest.approx(12.5, abs=0.01))  # its error: the driver's end
    assert rows["the check itself (the seconds its line says)"].seconds == 1.2
    after = [r for r in b.rows if r.level == 0 and r.start is None]
    assert [r.name for r in after] == [
        "task runner: actor up, verl imports, config, data set",
        "worker group init: 0 WorkerDict processes up, imports", "model load: the ranks' init_model",
        "vLLM servers up to ready (0)", "trainer ready: first weight sync, managers", "step 1", "step 2", "step 3"]
    assert {r.status for r in after} == {"not reached"}
    assert b.wall == pytest.approx(12.5, abs=0.01)  # no phase table: to the job's last trace
    assert b.start_up is None
    out = bench.table(b)
    assert "start-up (before step 1's generation): not observable (no step finished)" in out
    assert out.count("not reached") == 8
    rows_json = json.loads(json.dumps(bench.as_json(b)))["rows"]
    assert rows_json[0]["share"] == pytest.approx(0.5 / 12.5, abs=1e-3)


def test_fully_async_steps_run_from_one_request_for_samples_to_the_next(tmp_path: Path) -> None:
    trainer = "\x1b[36m(FullyAsyncTrainer pid=600)\x1b[0m "
    rank = "\x1b[36m(WorkerDict pid=400)\x1b[0m "
    log = [*START,
           f"{rank}INFO:{at(95.0)}:[Rank 0] Wrote checkpoint contents manifest",
           f"{trainer}[FullyAsyncTrainer] Requesting 2 samples from queue",  # untimed: placed after the line above
           f"{trainer}[FullyAsyncTrainer] global_steps: 1 local_trigger_step: 1 trigger_parameter_sync_step: 1 "
           "11:56:00.000",
           f"{trainer}step:1 - fully_async/rollouter/active_time:14.3",  # the rollouter's numbers
           f"{rank}INFO:{at(110.0)}:[Rank 0] Checkpoint save completed for /x/ckpt/global_step_1/actor",
           f"{trainer}[FullyAsyncTrainer] Requesting 2 samples from queue",
           f"{trainer}[FullyAsyncTrainer] global_steps: 2 local_trigger_step: 1 trigger_parameter_sync_step: 1 "
           "11:56:08.000",
           # the trainer's numbers of step 1, printed with the next step's
           f"{trainer}step:2 - training/global_step:1.0 - timing_s/gen:10.9 - timing_s/step:14.3 - "
           "timing_s/save_checkpoint:6.7",
           f"{rank}INFO:{at(118.0)}:[Rank 0] Checkpoint save completed for /x/ckpt/global_step_2/actor",
           f"{trainer}[FullyAsyncTrainer] Requesting 2 samples from queue",
           "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task."]
    d = job_dir(tmp_path, log, driver_end=120.0, code=1)

    b = bench.breakdown(d, wall_s=124.0)

    got = {r.name: (round(r.start - T0, 2), round(r.end - r.start, 2)) for r in b.rows
           if r.level == 0 and r.start is not None and (r.name.startswith(("step", "fit")))}
    assert got == {"fit set-up before step 1's generation": (92.0, 3.0), "step 1": (95.0, 15.0),
                   "step 2": (110.0, 8.0), "step 3 (not finished: the job failed in it)": (118.0, 2.0)}
    parts = {r.name: r.seconds for r in b.rows if r.level == 1 and r.seconds is not None}
    assert parts["generation of step 1 (timing_s/gen)"] == 10.9  # the metrics of training/global_step 1
    assert parts["checkpoint save of step 1 (timing_s/save_checkpoint)"] == 6.7
    assert not any("of step 2" in name for name in parts)  # step 2's numbers never came
    assert b.start_up == pytest.approx(95.0, abs=0.01)
