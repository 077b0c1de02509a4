"""Applying the whole GLM-5.2 patch set in a fresh process: with the per-file source index vs without, side by side.

    python benchmarks/glm52_apply.py [--runs 5]

Every process of a training job (API server, engine core, each worker) boots the plugin and recognises the
patch targets. What is timed, inside a fresh interpreter that has already imported vllm.v1.engine.core (its
~5 s import is vLLM's cost, not ours, and is printed for scale): booting the plugin, which applies the three
vLLM-core records to the real vLLM 0.23.0 classes, plus recognising every vLLM-Ascend 0.23.0 record on the
released sources (``predict``: the same index + fingerprint work ``apply`` does when vLLM-Ascend imports a
target on an NPU node; vLLM-Ascend itself cannot be imported on CPU). "cold": no on-disk index (every file is
parsed and unparsed and every fingerprint's regular expressions run, as without the cache); "warm": the
index and the fingerprint verdicts written by an earlier process are read (the warm process parses no file:
``parsed`` printed below). Children may write bytecode whatever ``PYTHONDONTWRITEBYTECODE`` says here: an
installed wheel has its .pyc files, so compiling the package's modules in every process is not part of the cost.
Needs the fixtures of scripts/fetch_vllm.sh and scripts/fetch_vllm_ascend.sh. Target: warm <= 20 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from verl_ascend_ext.patching.cachedir import cache_dir

CACHE = cache_dir()
ASCEND_SRC = CACHE / "vllm-ascend-src" / "0.23.0"

CHILD = """
import json, time
t0 = time.perf_counter()
import vllm.v1.engine.core
t1 = time.perf_counter()
import verl_ascend_ext
from verl_ascend_ext.runtime.registry import registry
from verl_ascend_ext.patching import engine
registry()  # feature discovery: a boot cost of every process whatever the patch set, reported separately
t_discovered = time.perf_counter()
verl_ascend_ext.activate()
statuses = {k: v.status.value for k, v in verl_ascend_ext.patch_statuses().items() if k.startswith("glm52-vllm")}
ascend = {r.id: engine.predict(r, frozenset()).status.value for r in registry().records
          if r.distribution == "vllm-ascend"}
t2 = time.perf_counter()
from verl_ascend_ext.patching import source
print(json.dumps({"apply_ms": (t2 - t_discovered) * 1e3, "discovery_ms": (t_discovered - t1) * 1e3,
                  "vllm_import_ms": (t1 - t0) * 1e3, "core": statuses,
                  "ascend": ascend, "parsed": source.counts()["parsed"]}))
"""


def run(index_home: str) -> dict:
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
           "VERL_VLLM_ASCEND_GLM52_PATCH": "1", "VERL_ASCEND_EXT_CACHE": index_home, "PYTHONPATH": str(ASCEND_SRC)}
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    assert ASCEND_SRC.is_dir(), f"{ASCEND_SRC} missing: run scripts/fetch_vllm_ascend.sh"
    home = tempfile.mkdtemp(prefix="glm52-bench-")
    cold, warm, imports, discovery, parsed = [], [], [], [], []
    try:
        for _ in range(args.runs):  # alternate, so that both see the same machine state
            shutil.rmtree(Path(home) / "source-index", ignore_errors=True)
            first = run(home)
            second = run(home)
            cold.append(first["apply_ms"])
            warm.append(second["apply_ms"])
            imports.append(first["vllm_import_ms"])
            discovery.append(second["discovery_ms"])
            parsed.append((first["parsed"], second["parsed"]))
    finally:
        shutil.rmtree(home, ignore_errors=True)
    print("statuses (last warm run):", json.dumps({**second["core"], **second["ascend"]}, indent=1))
    c, w = statistics.median(cold), statistics.median(warm)
    print(f"runs: {args.runs}; vLLM import (for scale): {statistics.median(imports):.0f} ms; feature discovery "
          f"(pluggy entry points, every process, not part of the set): {statistics.median(discovery):.1f} ms")
    print(f"apply whole GLM-5.2 set, cold (no source index): median {c:.1f} ms  {sorted(round(x, 1) for x in cold)}")
    print(f"apply whole GLM-5.2 set, warm (source index):    median {w:.1f} ms  {sorted(round(x, 1) for x in warm)}")
    print(f"files parsed (cold, warm) per run: {parsed}")
    print(f"cold / warm: {c / w:.1f}x; warm <= 20 ms: {'yes' if w <= 20 else 'NO'}")


if __name__ == "__main__":
    main()
