"""benchmarks/job_cpu.py: a process's CPU is sampled from /proc and counted under its kind (Ray's and vLLM's process
titles, known programs), only what it spent while sampled; a real child that burns a second of CPU shows it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from repo import REPO

SPEC = importlib.util.spec_from_file_location("job_cpu", REPO / "benchmarks" / "job_cpu.py")
job_cpu = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(job_cpu)


def test_kinds_come_from_ray_and_vllm_titles_and_known_programs() -> None:
    assert job_cpu.kind("ray::WorkerDict.actor_rollout_update_weights") == "ray::WorkerDict"
    assert job_cpu.kind("ray::IDLE") == "ray::IDLE"
    assert job_cpu.kind("VLLM::EngineCore") == "VLLM::EngineCore"
    assert job_cpu.kind("/venv/bin/python -m verl.trainer.main_ppo --config-name x") == "main_ppo"
    assert job_cpu.kind("/venv/lib/ray/core/src/ray/raylet/raylet --raylet_socket_name=x") == "raylet"
    assert job_cpu.kind("/usr/bin/sleep 5") == "sleep"


def test_a_child_that_burns_cpu_is_counted_with_what_it_spent_while_sampled() -> None:
    sampler = job_cpu.Sampler()
    sampler.start()
    try:
        child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                                  "while time.process_time() - t < 1.0: pass\ntime.sleep(0.6)"])
        child.wait(timeout=60)
    finally:
        sampler.done.set()
        sampler.join()
    (spent,) = [used for (pid, _), (used, _) in sampler.seen.items() if pid == child.pid]
    assert 1.0 <= spent <= 2.0, spent  # its 1.0 s of CPU, plus its start (sampled during its last 0.6 s of sleep)
    seconds, count = sampler.by_kind()
    assert seconds[job_cpu.kind(sys.executable)] >= spent and count[job_cpu.kind(sys.executable)] >= 1, seconds
