"""What `verl-ascend compare` costs on long runs: two 1000-step console logs (100 metrics a step, as verl prints them)
read, judged by every default rule and formatted, in one process, median of 5 (goal < 1 s); the picture apart (it
imports matplotlib), and the whole command as a user runs it (a fresh interpreter), side by side.

    python benchmarks/compare_time.py [--steps 1000] [--runs 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from verl_ascend_ext.tooling.compare.cli import compare, format_report
from verl_ascend_ext.tooling.compare.rules import DEFAULT_RULES, load_rules

METRICS = [rule.metric for rule in DEFAULT_RULES]


def write_log(path: Path, steps: int, seed: int) -> None:
    rng = random.Random(seed)
    others = [f"actor/extra_{i:02d}" for i in range(100 - len(METRICS))]
    with open(path, "w") as out:
        for step in range(1, steps + 1):
            values = {name: 1.0 + rng.gauss(0, 0.01) for name in [*METRICS, *others]}
            out.write(f"(TaskRunner pid=9) step:{step} - " + " - ".join(f"{k}:np.float64({v!r})"
                                                                       for k, v in values.items()) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base, run = Path(tmp, "base.log"), Path(tmp, "run.log")
        write_log(base, args.steps, 0)
        write_log(run, args.steps, 1)
        rules = load_rules(None)
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            format_report(compare(str(base), str(run), rules))
            times.append(time.perf_counter() - t0)
        from verl_ascend_ext.tooling.compare.picture import draw

        report = compare(str(base), str(run), rules)
        t0 = time.perf_counter()
        draw(Path(tmp, "p.png"), report["verdicts"], *report["_runs"])
        picture = time.perf_counter() - t0
        cli = str(Path(sys.executable).with_name("verl-ascend"))
        commands = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            subprocess.run([cli, "compare", str(base), str(run)], capture_output=True, check=False)
            commands.append(time.perf_counter() - t0)
    print(f"compare of two {args.steps}-step logs ({len(METRICS)} rules, 100 metrics a step), in-process "
          f"median of {args.runs}: {statistics.median(times):.3f} s (goal < 1 s)")
    print(f"the picture (matplotlib, first draw in the process, import included): {picture:.3f} s")
    print(f"the whole command (fresh interpreter, no picture), median of {args.runs}: "
          f"{statistics.median(commands):.3f} s")


if __name__ == "__main__":
    main()
