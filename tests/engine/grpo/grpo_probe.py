"""TEST-ONLY instrumentation of the GRPO tier, loaded in every process of the job (``VERL_USE_EXTERNAL_MODULES``).

Does nothing unless its variables are set:

- ``GRPO_PROBE_TOKENS=DIR``: each rollout sample verl's vLLM server generates (``vLLMHttpServer.generate``, the
  token-in-token-out call of verl's agent loop) is appended to ``DIR/<pid>.jsonl`` as
  ``{"t": wall time, "seed": ..., "prompt_ids": [...], "token_ids": [...]}`` after it returned.
- ``GRPO_PROBE_SEED_PER_SAMPLE=BASE``: each rollout request is sampled with its own seed,
  ``BASE + 16 * index + session_id`` (the data set row's ``index`` and the sample's number within its group,
  both of which verl's agent loop hands ``SingleTurnAgentLoop.run``), set as ``seed`` in the sampling
  parameters it passes on, which verl's vLLM server keeps. Without it vLLM draws every
  request of an engine from that engine's one generator in arrival order, and which replica a request reaches
  and what it is batched with are decided by the load balancer's timing: two runs of the same job sample
  different tokens (measured: 4 of 5 runs differed, gate on or off alike). verl's own ``full_determinism``
  seeds per replica, not per sample (two samples of one prompt on one replica come out identical), and turns on
  CUDA-only batch-invariant kernels; so the test seeds per sample itself.
- ``GRPO_PROBE_ORDERED_BATCH=1``: the training batch in data order. verl's v1 trainer names each prompt with
  ``uuid.uuid4()`` and assembles the step's batch in the order samples finished (the replay buffer's dict), and
  which samples share a rank or micro-batch follows from that order; with bf16 activations that changes the
  step's numbers in the 3rd-4th digit (measured: two runs with identical rollouts gave grad_norm 14.2952 vs
  14.2897). So the trainer's ``uuid`` is replaced by a counter (``UUID(int=n)``, in data order) and the batch's
  keys (``<uid>_<session>...``) are sorted: the same samples, in an order that no longer depends on timing.
- ``GRPO_PROBE_DROP_EXPORT_TENSOR=NAME``: the deliberate fault of the export-check scenario. When transformers
  writes a safetensors shard (``save_pretrained`` -> ``transformers.modeling_utils.safe_save_file``) holding
  ``NAME``, the tensor is left out of that shard: a Hugging Face export missing one weight, written by verl's
  own save path. The same for mbridge's writer (``mbridge.core.safetensor_io.save_file``: vanilla mbridge's
  export of the Megatron actor). With ``GRPO_PROBE_DROP_EXPORT_UNDER=TEXT`` only in files whose path holds
  ``TEXT`` (e.g. ``global_step_3``: that save alone).
- ``GRPO_PROBE_CORRUPT_ROUTES=zeros@N``: the corrupted-routes scenario of the MoE tier. From the rollout
  server's global step ``N`` on (verl hands each vLLM server the trainer's step with the weights,
  ``vLLMHttpServer.set_global_steps``), every generated sample's routed experts (R3) come back as zeros: what a
  capture that never fills its buffer returns (vllm#49184), after a healthy start. ``one@N``: only the first
  sample each rollout server generates from step ``N`` on (the route check then fires on the one actor rank that
  trains it: the fault matrix's one-rank cell).
- ``GRPO_PROBE_FAULT=stall|kill|block`` with ``GRPO_PROBE_FAULT_RANK=R`` and ``GRPO_PROBE_FAULT_SYNC=N``: the faults of
  the post-mortem scenarios. On actor rank R (verl's ``RANK``), right after its N-th weight update of the rollout
  (``ServerAdapter.update_weights`` returned, the N-th weight sync of that process: before the KV-cache resume and
  its barrier), ``stall`` blocks the rank (the thread sleeps, as a hung transfer would hold it), ``block`` holds
  it in a native call that keeps the GIL (libc's ``sleep`` through ``ctypes.PyDLL``: a rank stuck in C) and
  ``kill`` ends the process with SIGKILL (as the OOM killer would: nothing runs after it). Nothing is written
  anywhere: what the job's records say about it is what the plugin saw.
- ``GRPO_PROBE_BLOCK_ENGINE_WAKE=N``: the rollout engine that never answers (alive, not stopped): the first vLLM
  worker process to reach its N-th ``wake_up`` (verl wakes each replica once or twice a step, before its weight
  update and its KV cache's resume) holds there in a native call that keeps the GIL, for ever; its EngineCore waits
  on it, the server on the EngineCore, the trainer on the server. One worker only (the first to create
  ``GRPO_PROBE_TOKENS/engine-blocked``).
- ``GRPO_PROBE_BLOCK_ROLLOUTER=K``: the fully-async trainer starved of samples: verl's ``FullyAsyncRollouter`` holds
  in a native call that keeps the GIL, for ever, as it starts its first sample (``_process_single_sample_streaming``)
  once the job's checkpoint of step K is whole (its tracker file in ``trainer.default_local_dir`` says K or later):
  no sample reaches the message queue after it, the trainer waits for them (or for the rollouter's part of its
  next save); step K's checkpoint stays the last whole one.
- ``GRPO_PROBE_TIME_ROUTE_CHECK=DIR``: each call of the plugin's R3 route check
  (``routing.patch_code.check_routes_before_replay``, once per micro-batch on each actor rank) appends to
  ``DIR/<pid>.jsonl`` ``{"added": seconds}``: the call's time less verl's
  ``prepare_model_inputs`` inside it, i.e. what the check adds to the step (``benchmarks/route_check_step_time.py``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import json
import os
import signal
import time
import uuid
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import wrapt

TOKENS = os.environ.get("GRPO_PROBE_TOKENS")
SEED = os.environ.get("GRPO_PROBE_SEED_PER_SAMPLE")
ORDERED = os.environ.get("GRPO_PROBE_ORDERED_BATCH") == "1"
DROP = os.environ.get("GRPO_PROBE_DROP_EXPORT_TENSOR")
DROP_UNDER = os.environ.get("GRPO_PROBE_DROP_EXPORT_UNDER", "")
CORRUPT = os.environ.get("GRPO_PROBE_CORRUPT_ROUTES")
TIME_CHECK = os.environ.get("GRPO_PROBE_TIME_ROUTE_CHECK")
FAULT = os.environ.get("GRPO_PROBE_FAULT")
BLOCK_ENGINE_WAKE = os.environ.get("GRPO_PROBE_BLOCK_ENGINE_WAKE")
BLOCK_ROLLOUTER = os.environ.get("GRPO_PROBE_BLOCK_ROLLOUTER")
for _name, _value in (("GRPO_PROBE_BLOCK_ENGINE_WAKE", BLOCK_ENGINE_WAKE),
                      ("GRPO_PROBE_BLOCK_ROLLOUTER", BLOCK_ROLLOUTER)):
    if _value is not None and not _value.isdigit():
        raise ValueError(f"{_name}={_value!r}: expected a count (1, 2, ...)")
if BLOCK_ENGINE_WAKE and not TOKENS:
    raise ValueError("GRPO_PROBE_BLOCK_ENGINE_WAKE needs GRPO_PROBE_TOKENS (where the one blocked worker marks itself)")
FAULTS = ("stall", "kill", "block")
if FAULT is not None and FAULT not in FAULTS:
    raise ValueError(f"GRPO_PROBE_FAULT={FAULT!r}: expected one of {FAULTS}")
if CORRUPT is not None and not (CORRUPT.partition("@")[0] in ("zeros", "one") and CORRUPT.partition("@")[2].isdigit()):
    raise ValueError(f"GRPO_PROBE_CORRUPT_ROUTES={CORRUPT!r}: expected zeros@<global step> or one@<global step>")


if SEED:
    @wrapt.when_imported("verl.experimental.agent_loop.single_turn_agent_loop")
    def _seed_per_sample(module: ModuleType) -> None:
        loop = module.SingleTurnAgentLoop
        run = loop.run

        async def run_seeded(self: Any, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
            seed = int(SEED) + 16 * int(kwargs["index"]) + int(kwargs["session_id"])
            return await run(self, {**sampling_params, "seed": seed}, **kwargs)

        loop.run = run_seeded


if ORDERED:
    @wrapt.when_imported("verl.trainer.ppo.v1.trainer_base")
    def _counted_uids(module: ModuleType) -> None:
        counter = itertools.count(1)
        module.uuid = SimpleNamespace(uuid4=lambda: uuid.UUID(int=next(counter)))

    @wrapt.when_imported("verl.trainer.ppo.v1.replay_buffer")
    def _batch_in_data_order(module: ModuleType) -> None:
        buffer = module.ReplayBuffer
        materialize = buffer._materialize_batch

        def materialize_sorted(self: Any, *args: Any, **kwargs: Any) -> Any:
            batch = materialize(self, *args, **kwargs)
            order = sorted(range(len(batch.keys)), key=lambda i: batch.keys[i])
            return dataclasses.replace(batch, keys=[batch.keys[i] for i in order], tags=[batch.tags[i] for i in order])

        buffer._materialize_batch = materialize_sorted


if CORRUPT:
    @wrapt.when_imported("verl.workers.rollout.vllm_rollout.vllm_async_server")
    def _corrupt_routes(module: ModuleType) -> None:
        server = module.vLLMHttpServer
        generate = server.generate
        which, _, from_step = CORRUPT.partition("@")
        left = itertools.count(0) if which == "zeros" else iter(range(1))  # samples still to corrupt

        async def generate_corrupted(self: Any, *args: Any, **kwargs: Any) -> Any:
            out = await generate(self, *args, **kwargs)
            if out.routed_experts is not None and (self.global_steps or 0) >= int(from_step) and \
                    next(left, None) is not None:
                out.routed_experts = out.routed_experts * 0
            return out

        server.generate = generate_corrupted


if TOKENS:
    @wrapt.when_imported("verl.workers.rollout.vllm_rollout.vllm_async_server")
    def _record_tokens(module: ModuleType) -> None:
        server = module.vLLMHttpServer
        generate = server.generate

        async def generate_and_record(self: Any, prompt_ids: list[int], sampling_params: dict[str, Any], *args: Any,
                                      **kwargs: Any) -> Any:
            out = await generate(self, prompt_ids, sampling_params, *args, **kwargs)
            line = json.dumps({"t": time.time(), "seed": sampling_params.get("seed"), "prompt_ids": list(prompt_ids),
                               "token_ids": list(out.token_ids), "global_steps": self.global_steps,
                               "routes": None if out.routed_experts is None else
                               [int(out.routed_experts.shape[0]), int((out.routed_experts != 0).sum())]})
            with open(os.path.join(TOKENS, f"{os.getpid()}.jsonl"), "a") as f:
                f.write(line + "\n")
            return out

        server.generate = generate_and_record


def _without_dropped(save_file: Any) -> Any:
    def save_without(tensors: dict[str, Any], filename: str, *args: Any, **kwargs: Any) -> Any:
        if DROP in tensors and DROP_UNDER in str(filename):
            tensors = {name: t for name, t in tensors.items() if name != DROP}
        return save_file(tensors, filename, *args, **kwargs)

    return save_without


if DROP:
    @wrapt.when_imported("transformers.modeling_utils")
    def _drop_from_export(module: ModuleType) -> None:
        module.safe_save_file = _without_dropped(module.safe_save_file)

    @wrapt.when_imported("mbridge.core.safetensor_io")
    def _drop_from_mbridge_export(module: ModuleType) -> None:
        module.save_file = _without_dropped(module.save_file)


if FAULT:
    @wrapt.when_imported("verl.workers.rollout.vllm_rollout.vllm_rollout")
    def _fault_after_weight_update(module: ModuleType) -> None:
        adapter = module.ServerAdapter
        update = adapter.update_weights
        calls = itertools.count(1)
        rank, at = os.environ["GRPO_PROBE_FAULT_RANK"], int(os.environ["GRPO_PROBE_FAULT_SYNC"])

        async def update_then_fault(self: Any, *args: Any, **kwargs: Any) -> Any:
            out = await update(self, *args, **kwargs)
            if kwargs.get("base_sync_done", True) and os.environ.get("RANK") == rank and next(calls) == at:
                if FAULT == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if FAULT == "block":
                    hold_in_native_code()
                time.sleep(3600)  # stall: until the job is torn down
            return out

        adapter.update_weights = update_then_fault


def hold_in_native_code() -> None:
    """For ever in native code that keeps the GIL, as a process stuck in C would be (libc's ``sleep`` through
    ``ctypes.PyDLL``, which does not release the GIL)."""
    while True:  # libc's sleep returns early when a signal comes (the stacks' request)
        ctypes.PyDLL(None).sleep(3600)


if BLOCK_ENGINE_WAKE:
    @wrapt.when_imported("vllm.v1.worker.cpu_worker")
    def _block_engine_at_wake_up(module: ModuleType) -> None:
        worker = module.CPUWorker
        wake_up = worker.wake_up
        calls = itertools.count(1)

        def wake_up_then_block(self: Any, *args: Any, **kwargs: Any) -> Any:
            out = wake_up(self, *args, **kwargs)
            if next(calls) == int(BLOCK_ENGINE_WAKE):
                try:  # the first worker there, and no other
                    os.close(os.open(os.path.join(str(TOKENS), "engine-blocked"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                except FileExistsError:
                    return out
                hold_in_native_code()
            return out

        worker.wake_up = wake_up_then_block


if BLOCK_ROLLOUTER:
    @wrapt.when_imported("verl.experimental.fully_async_policy.fully_async_rollouter")
    def _block_rollouter(module: ModuleType) -> None:
        # a Ray actor class (``@ray.remote``): the class Ray made of verl's, which holds its own copy of each method
        # (what Ray pickles for the actor's process)
        rollouter = module.FullyAsyncRollouter.__ray_metadata__.modified_class
        process = rollouter._process_single_sample_streaming

        async def block_at_sample(self: Any, *args: Any, **kwargs: Any) -> Any:
            tracker = Path(self.config.trainer.default_local_dir) / "latest_checkpointed_iteration.txt"
            saved = tracker.read_text().strip() if tracker.exists() else ""
            if saved.isdigit() and int(saved) >= int(BLOCK_ROLLOUTER):
                hold_in_native_code()
            return await process(self, *args, **kwargs)

        rollouter._process_single_sample_streaming = block_at_sample


if TIME_CHECK:
    @wrapt.when_imported("verl_ascend_ext.features.routing.patch_code")
    def _time_route_check(module: ModuleType) -> None:
        check = module.check_routes_before_replay

        def timed_check(original: Any, *args: Any, **kwargs: Any) -> Any:
            inside = 0.0

            def timed_original(*a: Any, **k: Any) -> Any:
                nonlocal inside
                started = time.perf_counter()
                try:
                    return original(*a, **k)
                finally:
                    inside += time.perf_counter() - started

            started = time.perf_counter()
            try:
                return check(timed_original, *args, **kwargs)
            finally:
                added = time.perf_counter() - started - inside
                with open(os.path.join(TIME_CHECK, f"{os.getpid()}.jsonl"), "a") as f:
                    f.write(json.dumps({"added": added}) + "\n")

        module.check_routes_before_replay = timed_check
