"""Real vLLM engine start-up to first token, with the plugin (gate on) and without it, side by side.

Each run is a fresh process of the engine venv (scripts/setup_vllm_engine.sh): import vLLM, start
``LLM(model=tiny model, enforce_eager=True)`` (front-end + spawned EngineCore), generate one greedy token.
Runs alternate with / without, after one warm-up of each (bytecode and page caches). "Without" is
VLLM_PLUGINS set to a list without ours, so vLLM loads no part of the plugin in any process.
Prints the medians and their ratio (goal: <= 1.02).

    $(scripts/setup_vllm_engine.sh | tail -1) benchmarks/engine_startup.py [--runs 5]
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


def env(plugin: bool) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "VERL_ASCEND_EXT_", "VERL_VLLM_"))}
    e[GATE] = "1"
    if not plugin:
        e["VLLM_PLUGINS"] = "no_plugin_of_this_name"
    return e


def first_token(script: Path, plugin: bool) -> float:
    t0 = time.time()
    proc = subprocess.run([sys.executable, str(script), str(MODEL)], env=env(plugin), capture_output=True, text=True)
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
    args = parser.parse_args()
    if not (MODEL / ".complete").is_file():
        raise SystemExit(f"the tiny model is missing at {MODEL}: run scripts/setup_vllm_engine.sh")
    script = Path(os.environ.get("TMPDIR", "/tmp")) / f"engine_startup_{os.getpid()}.py"
    script.write_text(FIRST_TOKEN)
    try:
        first_token(script, True), first_token(script, False)  # warm-up
        with_plugin, without = [], []
        for i in range(args.runs):
            order = (True, False) if i % 2 == 0 else (False, True)
            for plugin in order:
                (with_plugin if plugin else without).append(first_token(script, plugin))
    finally:
        script.unlink()
    a, b = statistics.median(with_plugin), statistics.median(without)
    print(f"engine start-up to first token, median of {args.runs} (s): with plugin (gate on) {a:.2f}  "
          f"without {b:.2f}  ratio {a / b:.3f}")
    print(f"  with:    {', '.join(f'{x:.2f}' for x in with_plugin)}")
    print(f"  without: {', '.join(f'{x:.2f}' for x in without)}")


if __name__ == "__main__":
    main()
