"""`verl-ascend doctor` wall time vs `python -m torch.utils.collect_env`, medians side by side in one run.

    python benchmarks/doctor_time.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time


def wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=False, capture_output=True, env={k: v for k, v in os.environ.items()
                                                                if k != "PYTHONDONTWRITEBYTECODE"})
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    doctor = [os.path.join(os.path.dirname(sys.executable), "verl-ascend"), "doctor"]
    collect = [sys.executable, "-m", "torch.utils.collect_env"]
    wall(doctor), wall(collect)  # warm-up
    d, c = [], []
    for _ in range(args.runs):
        d.append(wall(doctor))
        c.append(wall(collect))
    md, mc = statistics.median(d), statistics.median(c)
    print(f"verl-ascend doctor: median {md:.3f} s; python -m torch.utils.collect_env: median {mc:.3f} s; "
          f"ratio {md / mc:.3f} (median of {args.runs} alternating runs)")


if __name__ == "__main__":
    main()
