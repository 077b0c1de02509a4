"""What reporting an act costs on the hot path: ``acted()`` counted in memory vs the record rewritten per act.

An ``acts_when`` record's patch code reports ``acted`` where its fix acts: the R3 route check once per micro-batch,
hundreds of times per step on one rank. Each run is a fresh interpreter that boots the plugin (a private status
directory) and, side by side in that process:

1. times ``--calls`` ``acted("r3-route-check")`` calls as the plugin makes them (counted in memory; the flusher
   thread, started by the first call, writes the record later), ``--repeat`` passes, the best kept (the first,
   which starts the thread, printed too): goal < 10 ms for 10,000 calls in all; and counts the record writes made
   on the calling thread (goal: none);
2. times the flush that catches the record up with them (one write, made off the caller's thread in a job);
3. times ``--old-calls`` calls the way they were made before (every act rewrote the record under the status lock:
   the recorder's writer as the count listener), and scales that to ``--calls``.

Prints the medians over ``--runs`` processes.

    python benchmarks/acts_cost.py [--runs 5] [--calls 10000] [--repeat 5] [--old-calls 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

RUN = """
import json, sys, threading, time
import verl_ascend_ext
from verl_ascend_ext.patching import status
from verl_ascend_ext.runtime.records import recorder, store
verl_ascend_ext.activate()
calls, old_calls, repeat = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
recorder.FLUSH_EVERY = 3600.0  # the flusher stays asleep while this process measures
writers = []
write_atomic = store.write_atomic
store.write_atomic = lambda *a: (writers.append(threading.current_thread().name), write_atomic(*a))[1]
acted = status.acted
passes = []
for _ in range(repeat):  # the first pass starts the flusher thread
    t0 = time.perf_counter()
    for _ in range(calls):
        acted("r3-route-check")
    passes.append(time.perf_counter() - t0)
on_caller = len(writers)
t0 = time.perf_counter()
recorder.flush()
flush = time.perf_counter() - t0
status.on_count(recorder.changed)  # as before: each act rewrites the record, on the caller's thread
before = len(writers)
t0 = time.perf_counter()
for _ in range(old_calls):
    acted("r3-route-check")
old = time.perf_counter() - t0
print(json.dumps({"first": passes[0], "new": min(passes), "on_caller": on_caller, "flush": flush, "old": old,
                  "old_writes": len(writers) - before, "acts": status.acts_of("r3-route-check") - repeat * calls}))
"""


def run_once(calls: int, old_calls: int, repeat: int, status_dir: str) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VERL_ASCEND_EXT_", "VERL_VLLM_ASCEND_"))}
    env["VERL_ASCEND_EXT_STATUS_DIR"] = status_dir
    out = subprocess.run([sys.executable, "-c", RUN, str(calls), str(old_calls), str(repeat)], env=env, check=True,
                         capture_output=True, text=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["acts"] == old_calls and result["old_writes"] == old_calls, result
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--old-calls", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [run_once(args.calls, args.old_calls, args.repeat, tmp) for _ in range(args.runs)]
    new = statistics.median(r["new"] for r in runs)
    first = statistics.median(r["first"] for r in runs)
    flush = statistics.median(r["flush"] for r in runs)
    old_each = statistics.median(r["old"] for r in runs) / args.old_calls
    on_caller = max(r["on_caller"] for r in runs)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPU(s)")
    print(f"{args.calls:,} acted() calls in a booted process, median of {args.runs} fresh processes (each the best "
          f"of {args.repeat} passes): {new * 1000:.2f} ms in all ({new / args.calls * 1e6:.2f} us each; goal < 10 ms "
          f"in all); the first pass, which starts the flusher thread: {first * 1000:.2f} ms; "
          f"{on_caller} record write(s) on the calling thread (goal: none)")
    print(f"the flush that writes them (off the caller's thread in a job, at most every few seconds): "
          f"{flush * 1000:.2f} ms")
    print(f"as before (the record rewritten per act, on the caller's thread): {old_each * 1e6:.0f} us each over "
          f"{args.old_calls:,} calls, {old_each * args.calls:.2f} s for {args.calls:,} "
          f"(ratio old / new: {old_each * args.calls / new:.0f}x)")


if __name__ == "__main__":
    main()
