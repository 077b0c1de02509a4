"""Where a training job's CPU goes: one job of ``tests/engine`` (``tests/engine/grpo/jobs.py``: ``on``, ``moe``,
``fully-async``, ...) run alone while every process on the machine is sampled from ``/proc`` twice a second; prints
the core-seconds each kind of process used (by its title: Ray's ``ray::ClassName``, vLLM's ``VLLM::EngineCore`` and
``VLLM::Worker``, the driver ``main_ppo``, Ray's own daemons, ...), how many there were, and the machine's busy
time against its cores over the job's wall time (``/proc/stat``). What CI's engine tier pays per job and per kind
of process: a cut of a job's start-up shows here as core-seconds gone, whatever else the machine runs.

A process that lived less than a sample apart is missed, and each one loses up to half a second of its last CPU:
the sum over processes is a lower bound of the machine's busy time, which the last line compares.

    $ENGINE_PY benchmarks/job_cpu.py on [--workdir DIR]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests" / "engine"), str(REPO / "tests")]
TICK = os.sysconf("SC_CLK_TCK")
KINDS = ("main_ppo", "fully_async_main", "ray_head.py", "nsnode.py", "raylet", "gcs_server", "dashboard",
         "runtime_env", "log_monitor")


def processes() -> dict[tuple[int, int], tuple[float, str]]:
    """Every process now: (pid, start tick) -> (CPU seconds used, its title)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # ended between the listing and the read
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        found[(int(pid), int(fields[19]))] = ((int(fields[11]) + int(fields[12])) / TICK, title.strip() or comm)
    return found


def kind(title: str) -> str:
    """A process's kind: Ray's or vLLM's title up to its method, else a known program's name, else the title's
    first word."""
    named = re.match(r"((?:ray|VLLM)::[A-Za-z_]+)", title)
    if named:
        return named[1]
    return next((k for k in KINDS if k in title), os.path.basename(title.split()[0]) if title else "?")


def busy() -> float:
    """The machine's CPU seconds spent busy so far (all cores; idle and iowait left out)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / TICK


class Sampler(threading.Thread):
    """Samples every process twice a second until stopped; keeps each one's last CPU time."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.before = processes()
        self.seen: dict[tuple[int, int], tuple[float, str]] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.seen.update(processes())
            self.done.wait(0.5)

    def by_kind(self) -> tuple[collections.Counter, collections.Counter]:
        seconds: collections.Counter = collections.Counter()
        count: collections.Counter = collections.Counter()
        for key, (used, title) in self.seen.items():
            spent = used - self.before.get(key, (0.0, ""))[0]
            if spent > 0.05:
                seconds[kind(title)] += spent
                count[kind(title)] += 1
        return seconds, count


def main(argv: list[str] | None = None) -> int:
    from grpo.job import run
    from grpo.jobs import JOBS

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("job", choices=sorted(JOBS), help="a job of tests/engine/grpo/jobs.py")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the job here (default: a temporary dir)")
    args = parser.parse_args(argv)
    spec = JOBS[args.job]
    if spec.resumes:
        parser.error(f"{args.job} resumes {spec.resumes}: run a job that starts from scratch")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="job-cpu-"))
    sampler = Sampler()
    started, busy_before = time.monotonic(), busy()
    sampler.start()
    try:
        job = run(spec, work / spec.name)
    finally:
        sampler.done.set()
        sampler.join()
    wall, machine = time.monotonic() - started, busy() - busy_before
    seconds, count = sampler.by_kind()
    cores = os.cpu_count() or 1
    print(f"job {spec.name}: exit {job.returncode}, wall {wall:.1f} s; the machine busy {machine:.1f} core-s "
          f"({machine / wall / cores:.0%} of {cores} cores), {sum(seconds.values()):.1f} of them seen by process")
    for name, spent in seconds.most_common():
        print(f"  {spent:8.1f} core-s {spent / machine:6.1%}  {count[name]:3d} process(es)  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
