"""What recording costs: the plugin's boot with and without its process record, and `status` over many records.

1. Boot: each run is a fresh interpreter that imports verl with plugin discovery off, then times
   ``boot.activate`` in-process; runs alternate (order swapped every pair) between the real recorder and
   one whose ``start`` does nothing; all runs share one status directory, as the processes of a job do.
   Prints the medians and the recorder's own time inside the boot (goal: <= 1 ms added per process), and
   the time the boot spends setting up the observation of the process's end (``process_end.install``:
   goal, nothing measurable next to the boot).
2. ``verl-ascend status``: 1,000 synthetic records (alive and dead, several hosts, roles and patch
   statuses) are written to a temporary directory with the real writer, then ``records.reader.collect`` and
   ``records.report.aggregate`` run over them, as the command does (goal: <= 1 s).

    python benchmarks/status_record.py [--runs 15] [--records 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

BOOT = """
import os, sys, time
os.environ["VERL_USE_EXTERNAL_PLUGINS"] = "none"
import verl
from verl_ascend_ext.runtime import boot
from verl_ascend_ext.runtime.records import process_end, recorder
real_start, spent = recorder.start, []
def timed_start(*args, **kwargs):
    t = time.perf_counter()
    if sys.argv[1] == "on":
        real_start(*args, **kwargs)
    spent.append(time.perf_counter() - t)
recorder.start = timed_start
real_install, installing = process_end.install, []
def timed_install(on=True):
    t = time.perf_counter()
    real_install(on)
    installing.append(time.perf_counter() - t)
process_end.install = timed_install
t0 = time.perf_counter()
boot.activate("verl")
print(time.perf_counter() - t0, spent[0], installing[0])
"""


def boot_once(record: bool, status_dir: str) -> tuple[float, float, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VERL_ASCEND_EXT_", "VERL_VLLM_ASCEND_"))}
    env["VERL_ASCEND_EXT_STATUS_DIR"] = status_dir
    out = subprocess.run([sys.executable, "-c", BOOT, "on" if record else "off"], env=env, check=True,
                         capture_output=True, text=True).stdout
    total, recording, ending = out.strip().splitlines()[-1].split()
    return float(total), float(recording), float(ending)


def synthetic(n: int, base: str) -> None:
    from verl_ascend_ext.runtime.records import schema, store

    roles = [schema.RAY_WORKER, schema.VLLM_WORKER, schema.ENGINE_CORE, schema.VLLM_FRONTEND]
    statuses = ["applied", "pending", "gate-off", "fixed-upstream"]
    base_fd = store.open_base(base)
    ns_fd = store.open_dir("session_bench", dir_fd=base_fd)
    now = time.time()
    for i in range(n):
        rec = schema.new_record(
            host=f"node{i % 32:02d}", pid=100000 + i, proc_start=1000 + i, started=now - 100, updated=now,
            role=roles[i % 4] if i else schema.DRIVER, loaded_by=["verl"], namespace="session_bench",
            versions={"verl-ascend-ext": "0.1.0", "verl": "0.9.0", "vllm": "0.23.0"},
            gates={"VERL_VLLM_ASCEND_GLM52_PATCH": True, "VERL_ASCEND_EXT_DISTILLATION_FIXES": True},
            plugin_env={"VERL_USE_EXTERNAL_PLUGINS": None, "VLLM_PLUGINS": None},
            patches={f"patch-{j:02d}": schema.new_patch(status=statuses[(i + j) % 4], detail="x" * 80,
                                                        target=f"vllm.mod{j}:f") for j in range(19)},
            ranks={"rank": i % 8, "world_size": 8},
            ended=None if i % 3 == 0 else {"how": schema.SIGNAL, "signal": "SIGTERM", "code": 1, "at": now})
        store.write_atomic(ns_fd, store.record_name(rec["host"], rec["pid"], rec["proc_start"]),
                           json.dumps(rec).encode())
    os.close(ns_fd)
    os.close(base_fd)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--records", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        job_dir = os.path.join(tmp, "job")  # one directory for every process, as in a job
        for record in (True, False):  # warm-up; the first process creates the directory
            boot_once(record, job_dir)
        on, off = [], []
        for i in range(args.runs):  # alternate which goes first: a process right after another runs warmer
            for record in ((True, False) if i % 2 == 0 else (False, True)):
                (on if record else off).append(boot_once(record, job_dir))
        a, b = statistics.median(t for t, _, _ in on), statistics.median(t for t, _, _ in off)
        r = statistics.median(r for _, r, _ in on)
        e = statistics.median(e for _, _, e in on)
        print(f"boot.activate in-process, median of {args.runs} alternating fresh processes: with record "
              f"{a * 1000:.2f} ms, without {b * 1000:.2f} ms (ratio {a / b:.3f}); the recorder's own time inside "
              f"the boot (recorder.start): median {r * 1000:.3f} ms (goal <= 1 ms); setting up the "
              f"observation of the process's end (process_end.install): median {e * 1000:.3f} ms")

        from verl_ascend_ext.runtime.records.reader import collect
        from verl_ascend_ext.runtime.records.report import aggregate

        base = os.path.join(tmp, "many")
        synthetic(args.records, base)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            records, notes = collect(base)
            report = aggregate(records, notes)
            times.append(time.perf_counter() - t0)
        assert len(report["processes"]) == args.records, len(report["processes"])
        print(f"status over {args.records} synthetic records (read + aggregate), median of 5: "
              f"{statistics.median(times):.3f} s (goal <= 1 s); {len(report['problems'])} problem line(s)")


if __name__ == "__main__":
    main()
