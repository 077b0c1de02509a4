"""What the plugin adds to `import verl`: whole-process wall time with and without it, plus its in-process share.

Runs `python -c "import verl"` alternately with the plugin (default discovery) and with
VERL_USE_EXTERNAL_PLUGINS=none, after warm-up runs that let Python write its bytecode caches (as a
pip install does). Prints medians and their ratio; the in-process line times only the plugin's
entry-point import inside a process that already imported verl, which is the same work without the
noise of a whole interpreter start.

    python benchmarks/import_overhead.py [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

IN_PROCESS = """
import os, time
os.environ["VERL_USE_EXTERNAL_PLUGINS"] = "none"
import verl
t0 = time.perf_counter()
from importlib.metadata import entry_points
[ep.load() for ep in entry_points(group="verl.plugins") if ep.name == "ascend_ext"]
print(time.perf_counter() - t0)
"""


def env(plugin: bool) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "VERL_USE_EXTERNAL_PLUGINS")}
    if not plugin:
        e["VERL_USE_EXTERNAL_PLUGINS"] = "none"
    return e


def wall(code: str, environ: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=environ, check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    for plugin in (True, False, True):  # warm-up: bytecode caches, page cache
        wall("import verl", env(plugin))
    with_plugin, without = [], []
    for _ in range(args.runs):
        with_plugin.append(wall("import verl", env(True)))
        without.append(wall("import verl", env(False)))
    inproc = []
    for _ in range(max(5, args.runs // 2)):
        out = subprocess.run([sys.executable, "-c", IN_PROCESS], env=env(True), check=True, capture_output=True,
                             text=True).stdout
        inproc.append(float(out.strip().splitlines()[-1]))
    a, b = statistics.median(with_plugin), statistics.median(without)
    c = statistics.median(inproc)
    print(f"import verl, median of {args.runs} alternating runs: with plugin {a:.3f} s, "
          f"VERL_USE_EXTERNAL_PLUGINS=none {b:.3f} s, ratio {a / b:.4f}")
    print(f"plugin entry-point load inside a process that imported verl: median {c * 1000:.1f} ms "
          f"= {c / b:.4f} of the plugin-free import (ratio {(b + c) / b:.4f})")


if __name__ == "__main__":
    main()
