"""TEST-ONLY instrumentation of the MoE job (loaded in every process through ``VERL_USE_EXTERNAL_MODULES``).

Does nothing unless ``MOE_PROBE_DIR=DIR`` is set; then it appends JSON lines under DIR:

- ``routes-<pid>.jsonl`` (vLLM server processes): for each rollout sample verl's ``vLLMHttpServer.generate``
  returns, the routed experts verl receives (``TokenOutput.routed_experts``, what verl's R3 replays): shape, the
  share of all-zero rows, the number of distinct experts used, the routes themselves.
- ``agreement-<pid>.jsonl`` (actor ranks): in verl's R3 replay (``RouterReplay.get_replay_topk``,
  ``verl/utils/megatron/router_replay_patch.py:113-134``, the same in 0.9.0 and 0.9.1) both the replayed routes (the
  rollout's, ``target_topk_idx``) and the actor's own router top-k (``default_compute_topk`` on the scores) exist
  for every token the replay mask covers. Per router call: the layer (the ``TopKRouter``'s ``layer_number``, set
  around verl's ``patched_routing``), the engine call it belongs to (``MegatronEngine.forward_backward_batch``:
  its number in this process, ``forward_only``, which engine object), the tokens replayed, and the share whose
  top-k expert SET equals the replayed one, the mean overlap, the share of all-zero replayed rows.
- ``offload-<pid>.jsonl`` (actor ranks): each call of verl's ``offload_megatron_model_to_cpu`` /
  ``load_megatron_model_to_gpu`` / ``offload_megatron_optimizer`` / ``load_megatron_optimizer`` (also where
  ``transformer_impl`` imported them by name): the caller, and before / after it the bytes of live storage of the
  DDP parameter and gradient buffers, the bytes of their host copies (``cpu_data``) and the optimizer state's
  tensors and devices: what really moved.
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import json
import os
import sys
import time
import types
from typing import Any

import wrapt

PROBE_DIR = os.environ.get("MOE_PROBE_DIR")
_layer: contextvars.ContextVar[Any] = contextvars.ContextVar("moe_probe_layer", default=None)
_call: contextvars.ContextVar[Any] = contextvars.ContextVar("moe_probe_call", default=None)
_calls = itertools.count(1)


def _write(kind: str, row: dict) -> None:
    with open(os.path.join(PROBE_DIR, f"{kind}-{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps({"t": time.time(), "rank": os.environ.get("RANK"), **row}) + "\n")


if PROBE_DIR:
    @wrapt.when_imported("verl.workers.rollout.vllm_rollout.vllm_async_server")
    def _record_routes(module: types.ModuleType) -> None:
        server = module.vLLMHttpServer
        generate = server.generate

        async def generate_and_record(self: Any, prompt_ids: list[int], sampling_params: dict[str, Any], *args: Any,
                                      **kwargs: Any) -> Any:
            out = await generate(self, prompt_ids, sampling_params, *args, **kwargs)
            import numpy as np

            routes = out.routed_experts
            row: dict[str, Any] = {"seed": sampling_params.get("seed"), "prompt_len": len(prompt_ids),
                                   "response_len": len(out.token_ids), "routes": None}
            if routes is not None:
                arr = np.asarray(routes)
                row.update(shape=list(arr.shape), dtype=str(arr.dtype),
                           zero_rows=float((arr == 0).all(axis=(1, 2)).mean()) if arr.size else None,
                           experts_used=sorted(int(e) for e in np.unique(arr)), routes=arr.tolist())
            _write("routes", row)
            return out

        server.generate = generate_and_record

    @wrapt.when_imported("verl.utils.megatron.router_replay_patch")
    def _measure_agreement(module: types.ModuleType) -> None:
        replay_cls = module.RouterReplay
        get_replay_topk = replay_cls.get_replay_topk
        forward_action = module.RouterReplayAction.REPLAY_FORWARD

        @functools.wraps(get_replay_topk)
        def measured(self: Any, scores: Any, topk: int, num_groups: Any = None, group_topk: Any = None,
                     default_compute_topk: Any = None) -> Any:
            out = get_replay_topk(self, scores, topk, num_groups=num_groups, group_topk=group_topk,
                                  default_compute_topk=default_compute_topk)
            target = self.target_topk_idx
            if self.router_replay_action == forward_action and target is not None and default_compute_topk:
                import torch

                with torch.no_grad():
                    _, native = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
                    target = target.to(native.device)
                    mask = self.target_replay_mask
                    mask = (torch.ones(native.shape[0], dtype=torch.bool) if mask is None
                            else mask.to(native.device).bool())
                    row: dict[str, Any] = {"layer": _layer.get(), "call": _call.get(), "tokens": int(mask.sum()),
                                           "rows": int(native.shape[0])}
                    if target.shape == native.shape and mask.numel() == native.shape[0] and int(mask.sum()):
                        a, b = native.sort(-1).values[mask], target.sort(-1).values[mask]
                        overlap = (a.unsqueeze(-1) == b.unsqueeze(-2)).any(-1).float().mean(-1)
                        row.update(same_set=float((a == b).all(-1).float().mean()),
                                   overlap=float(overlap.mean()),
                                   zero_target_rows=float((b == 0).all(-1).float().mean()))
                    elif not int(mask.sum()):
                        row["no_replay"] = True  # a sample without response tokens (verl's mini-batch padding)
                    else:
                        row["shapes"] = [list(target.shape), list(native.shape), list(mask.shape)]
                    _write("agreement", row)
            return out

        replay_cls.get_replay_topk = measured
        routing = module.patched_routing

        @functools.wraps(routing)
        def routing_with_layer(self: Any, logits: Any, *args: Any, **kwargs: Any) -> Any:
            token = _layer.set(getattr(self, "layer_number", None))
            try:
                return routing(self, logits, *args, **kwargs)
            finally:
                _layer.reset(token)

        module.patched_routing = routing_with_layer  # apply_router_replay_patch installs it on TopKRouter

    @wrapt.when_imported("verl.workers.engine.megatron.transformer_impl")
    def _number_engine_calls(module: types.ModuleType) -> None:
        engine_cls = module.MegatronEngine
        batch = engine_cls.forward_backward_batch

        @functools.wraps(batch)
        def numbered(self: Any, *args: Any, **kwargs: Any) -> Any:
            forward_only = kwargs.get("forward_only", args[2] if len(args) > 2 else None)
            token = _call.set({"n": next(_calls), "forward_only": forward_only, "engine": id(self) % 100000})
            try:
                return batch(self, *args, **kwargs)
            finally:
                _call.reset(token)

        engine_cls.forward_backward_batch = numbered
        for name in ("offload_megatron_model_to_cpu", "load_megatron_model_to_gpu", "offload_megatron_optimizer",
                     "load_megatron_optimizer"):
            utils = sys.modules["verl.utils.megatron_utils"]
            setattr(module, name, getattr(utils, name))  # the accounted versions (below)

    def _state(models: Any = None, optimizer: Any = None) -> dict:
        import torch

        out: dict[str, Any] = {}
        if models is not None:
            live = host = grad = 0
            plain = devices = None
            for chunk in models:
                if not isinstance(getattr(chunk, "buffers", None), list):  # not megatron's DDP (the reference)
                    params = list(chunk.parameters())
                    plain = (plain or 0) + sum(p.untyped_storage().nbytes() for p in params)
                    devices = sorted({str(p.device) for p in params})
                    continue
                for buffers in (chunk.buffers, getattr(chunk, "expert_parallel_buffers", [])):
                    for buffer in buffers:
                        live += buffer.param_data.untyped_storage().nbytes()
                        grad += buffer.grad_data.untyped_storage().nbytes()
                        cpu_data = getattr(buffer.param_data, "cpu_data", None)
                        host += cpu_data.untyped_storage().nbytes() if cpu_data is not None else 0
            out.update(param_live_bytes=live, grad_live_bytes=grad, param_host_copy_bytes=host)
            if plain is not None:
                out.update(plain_param_bytes=plain, plain_param_devices=devices)
        if optimizer is not None:
            opts = getattr(optimizer, "chained_optimizers", [optimizer])
            state_bytes, devices, kinds = 0, set(), set()
            for opt in opts:
                inner = getattr(opt, "optimizer", None)
                kinds.add(type(inner).__name__)
                for state in getattr(inner, "state", {}).values():
                    for value in state.values():
                        if torch.is_tensor(value):
                            state_bytes += value.untyped_storage().nbytes()
                            devices.add(str(value.device))
            out.update(optimizer_state_bytes=state_bytes, optimizer_state_devices=sorted(devices),
                       optimizer_kinds=sorted(kinds))
        return out

    def _accounted(fn: Any, kind: str) -> Any:
        @functools.wraps(fn)
        def accounted(target: Any, *args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1).f_code.co_name
            measure = (lambda: _state(models=target)) if kind == "model" else (lambda: _state(optimizer=target))
            before = measure()
            started = time.monotonic()
            try:
                return fn(target, *args, **kwargs)
            except BaseException as err:
                _write("offload", {"fn": fn.__name__, "caller": caller, "error": f"{type(err).__name__}: {err}"})
                raise
            finally:
                _write("offload", {"fn": fn.__name__, "caller": caller, "s": round(time.monotonic() - started, 4),
                                   "before": before, "after": measure()})

        return accounted

    @wrapt.when_imported("verl.utils.megatron_utils")
    def _account_offload(module: types.ModuleType) -> None:
        for name, kind in (("offload_megatron_model_to_cpu", "model"), ("load_megatron_model_to_gpu", "model"),
                           ("offload_megatron_optimizer", "optimizer"), ("load_megatron_optimizer", "optimizer")):
            setattr(module, name, _accounted(getattr(module, name), kind))
