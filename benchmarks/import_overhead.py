"""What the plugin adds to `import verl`: whole-process wall time with and without it, plus its in-process share.

Runs `python -c "import verl"` alternately with the plugin (default discovery) and with
VERL_USE_EXTERNAL_PLUGINS=none, after warm-up runs that let Python write its bytecode caches (as a
pip install does). Prints medians and their ratio; the in-process lines time, inside a process that already
imported verl, the plugin's load (importing its entry point: the boot) and, apart, the scan of the
``verl.plugins`` entry points that verl's discovery does on every import whether or not a plugin is installed:
the same work as the whole-process ratio without the noise of an interpreter start.

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
from importlib.metadata import entry_points
t0 = time.perf_counter()
(ep,) = [ep for ep in entry_points(group="verl.plugins") if ep.name == "ascend_ext"]
t1 = time.perf_counter()
ep.load()
print(time.perf_counter() - t1, t1 - t0)
"""


PROCESS_END = "VERL_ASCEND_EXT_PROCESS_END"  # the process-end observer's switch (runtime/records/process_end.py)


def env(plugin: bool, process_end: bool = True) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items()
         if k not in ("PYTHONDONTWRITEBYTECODE", "VERL_USE_EXTERNAL_PLUGINS", PROCESS_END)}
    if not plugin:
        e["VERL_USE_EXTERNAL_PLUGINS"] = "none"
    if not process_end:
        e[PROCESS_END] = "0"
    return e


def in_process(environ: dict[str, str]) -> tuple[float, float]:
    out = subprocess.run([sys.executable, "-c", IN_PROCESS], env=environ, check=True, capture_output=True,
                         text=True).stdout
    load, scan = (float(x) for x in out.strip().splitlines()[-1].split())
    return load, scan


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
    loads, scans, unobserved = [], [], []
    for _ in range(max(5, args.runs // 2)):
        load, scan = in_process(env(True))
        loads.append(load)
        scans.append(scan)
        unobserved.append(in_process(env(True, process_end=False))[0])
    a, b = statistics.median(with_plugin), statistics.median(without)
    c, d, e = statistics.median(loads), statistics.median(scans), statistics.median(unobserved)
    print(f"import verl, median of {args.runs} alternating runs: with plugin {a:.3f} s, "
          f"VERL_USE_EXTERNAL_PLUGINS=none {b:.3f} s, ratio {a / b:.4f}")
    print(f"plugin load (its entry point imported: the boot) inside a process that imported verl: median "
          f"{c * 1000:.1f} ms = {c / b:.4f} of the plugin-free import (ratio {(b + c) / b:.4f})")
    print(f"of which the process-end observer (the same load with {PROCESS_END}=0, alternating: median "
          f"{e * 1000:.1f} ms): {(c - e) * 1000:.1f} ms")
    print(f"verl's own scan of the verl.plugins entry points (paid with or without the plugin): median "
          f"{d * 1000:.1f} ms")


if __name__ == "__main__":
    main()
