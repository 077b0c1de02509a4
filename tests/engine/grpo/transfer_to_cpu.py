"""TEST-ONLY: the CPU counterpart of torch_npu's ``transfer_to_npu``, for verl's Megatron actor (never shipped).

On Ascend, ``torch_npu.contrib.transfer_to_npu`` makes code written for CUDA run on the NPU by answering its
``torch.cuda`` calls. megatron-core 0.16.1 and mbridge 0.15.1 are such code; this module answers the same calls
with the CPU so that verl's ``ppo_megatron_trainer`` runs in the GRPO tier. It is loaded in every process of the
job through verl's ``VERL_USE_EXTERNAL_MODULES`` (as ``verl_cpu_test_platform``) and does nothing until
``megatron.core`` is imported (a post-import hook): the TaskRunner, the actor ranks, the agent-loop worker; never
vLLM's processes. No installed file is edited. What it reaches past (paths in the installed packages):

- ``torch.cuda`` answered by the CPU (the device, memory and stream calls by ``verl_cpu_test_platform.cpu_device``,
  the module that answers verl's): ``current_device`` "cpu" (megatron passes it to torch as a device; it is
  called inside backward too, ``tensor_parallel/mappings.py:181``, where no function mode is active),
  ``device_count``, ``set_device``, ``synchronize``, memory counters, ``empty_cache``,
  streams and events (``torch.cpu``'s: ``transformer/moe/token_dispatcher.py:445`` makes a side stream),
  ``is_current_stream_capturing`` False (``torch/optim/optimizer.py:474`` -> ``torch/cuda/graphs.py:50``), the
  RNG (``get_rng_state`` / ``set_rng_state`` / ``manual_seed``: ``tensor_parallel/random.py:235-238,422``) on the
  CPU generator, and megatron's own ``_get_cuda_rng_state`` / ``_set_cuda_rng_state`` (``random.py:41-111``:
  CUDA generators, ``_lazy_call``) on the CPU generator;
- ``torch.nn.Module.cuda`` a no-op (mbridge ``core/util.py:151`` moves every model chunk to the GPU);
- a ``TorchFunctionMode`` (``CudaOnCPU``) on the thread that imported megatron: ``device='cuda'`` in any torch call
  becomes the CPU (``optimizer/optimizer.py``, ``optimizer/clip_grads.py``, ``pipeline_parallel/schedules.py``,
  ``distributed/param_and_grad_buffer.py``), ``Tensor.cuda()`` returns the tensor, and ``Tensor.type()`` names
  the CUDA type (``optimizer/distrib_optimizer.py:361,420,582``, ``optimizer/optimizer.py:671-699``,
  ``optimizer/clip_grads.py:167`` compare with ``'torch.cuda.FloatTensor'``);
- dynamo off in those processes (verl ``utils/megatron/tensor_parallel.py:112`` is ``@torch.compile``d; under
  dynamo the function mode's CUDA calls reach the CUDA runtime: "Found no NVIDIA driver");
- mbridge without TransformerEngine: ``core/llm_bridge.py:150`` asks megatron for the TE layer spec (no TE here:
  ``NameError: TENorm`` at ``models/gpt/gpt_layer_specs.py:642``), so the spec is megatron's local one
  (``use_transformer_engine=False``); its norms have their own names (``input_layernorm``, ``pre_mlp_layernorm``)
  where TE fuses them into the next linear layer (``linear_qkv.layer_norm_weight``,
  ``linear_fc1.layer_norm_weight``), the only names mbridge maps for dense layers (``core/bridge.py:649-671``), so
  a local name mbridge does not know is mapped to its TE name; ``core/llm_bridge.py:124`` reads
  ``hf_config.rope_theta``, which transformers 5 keeps in ``rope_parameters`` (verl's own
  ``get_hf_rope_theta`` reads both), so it is set from there;
- megatron's distributed optimizer without Apex or TransformerEngine (it falls back to torch's Adam, as here; with
  either, this branch is not taken) takes the step count from the torch optimizer's state when it builds its state dict
  (``optimizer/distrib_optimizer.py:640-642``, ``assert len(steps) == 1``); before the first step that state is
  empty, so loading a checkpoint fails there. Before a load into an empty state, the stand-in fills it with
  megatron's own dummy-value initialiser (``_init_optimizer_states_with_dummy_values``, :1137, what megatron
  runs itself before its ``fsdp_dtensor`` loads, :1355-1357); the load then replaces every value;
- verl's bshd keep-mask ([b, s], TransformerEngine's form; verl ``models/mcore/util.py:705-757``) turned into the
  [b, 1, s, s] masked-out form megatron's local attention takes, as verl itself does for Ascend
  (``util.py:649 _build_npu_attn_mask``: padding and causal).

The job runs with ``sequence_parallel=False`` (torch's norm rejects it) and ``attention_backend=local``.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import torch
import wrapt
from torch.overrides import TorchFunctionMode


def _is_cuda(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, str) and device.split(":")[0] == "cuda"


class CudaOnCPU(TorchFunctionMode):
    """``device='cuda'`` -> the CPU; ``Tensor.cuda()`` -> the tensor; ``Tensor.type()`` -> its CUDA type name."""

    def __torch_function__(self, func: Any, types_: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            return func(*args).replace("torch.", "torch.cuda.", 1)
        if func is torch.Tensor.cuda:
            return args[0]
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


def _cpu_rng_state(*_args: Any, **_kwargs: Any) -> torch.Tensor:
    return torch.get_rng_state()


def _set_cpu_rng_state(new_state: torch.Tensor, *_args: Any, **_kwargs: Any) -> None:
    torch.set_rng_state(new_state)


def _seed_cpu(seed: int) -> None:
    torch.default_generator.manual_seed(int(seed))


def _torch_cuda_on_cpu() -> None:
    from verl_cpu_test_platform import cpu_device  # the platform's answers to what verl asks its device module

    cuda = torch.cuda
    for name in ("current_device", "device_count", "set_device", "synchronize", "empty_cache", "memory_allocated",
                 "memory_reserved", "max_memory_allocated", "max_memory_reserved",
                 "Stream", "Event", "current_stream", "stream"):  # megatron's MoE dispatcher makes a side stream
        setattr(cuda, name, getattr(cpu_device, name))
    cuda.is_current_stream_capturing = lambda: False
    # megatron passes device=... to these (the platform's take positional arguments only)
    cuda.get_rng_state = cuda.random.get_rng_state = _cpu_rng_state
    cuda.set_rng_state = cuda.random.set_rng_state = _set_cpu_rng_state
    # the CPU generator itself: torch.manual_seed seeds torch.cuda too, which would come back here
    cuda.manual_seed = cuda.random.manual_seed = _seed_cpu
    cuda.manual_seed_all = cuda.random.manual_seed_all = _seed_cpu
    torch.nn.Module.cuda = lambda self, *_a, **_k: self


def _megatron_rng_on_cpu() -> None:
    from megatron.core.tensor_parallel import random as mp_random

    mp_random._get_cuda_rng_state = _cpu_rng_state
    mp_random._set_cuda_rng_state = _set_cpu_rng_state


def _local_attention_takes_verl_mask() -> None:
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    forward = DotProductAttention.forward

    @functools.wraps(forward)
    def with_square_mask(self: Any, query: Any, key: Any, value: Any, attention_mask: Any, *args: Any,
                         **kwargs: Any) -> Any:
        if attention_mask is not None and attention_mask.dim() == 2:  # [b, s] keep -> [b, 1, s, s] masked out
            seq = attention_mask.shape[1]
            causal = torch.tril(torch.ones(seq, seq, dtype=torch.bool, device=attention_mask.device))
            keep = attention_mask.unsqueeze(-1) & attention_mask.unsqueeze(-2) & causal
            attention_mask = (~keep).unsqueeze(1).contiguous()
        return forward(self, query, key, value, attention_mask, *args, **kwargs)

    DotProductAttention.forward = with_square_mask


@wrapt.when_imported("megatron.core.optimizer.distrib_optimizer")
def _on_distrib_optimizer(module: types.ModuleType) -> None:
    if module.HAVE_APEX_OR_TE or getattr(module, "_transfer_to_cpu", False):
        return
    module._transfer_to_cpu = True
    optimizer_cls = module.DistributedOptimizer
    sharded = optimizer_cls.sharded_state_dict

    @functools.wraps(sharded)
    def with_state_to_load_into(self: Any, *args: Any, **kwargs: Any) -> Any:
        is_loading = kwargs.get("is_loading", args[1] if len(args) > 1 else False)
        if is_loading and not self.optimizer.state:
            self._init_optimizer_states_with_dummy_values()  # replaced in place by what is loaded
        return sharded(self, *args, **kwargs)

    optimizer_cls.sharded_state_dict = with_state_to_load_into


@wrapt.when_imported("megatron.core")
def _on_megatron(module: types.ModuleType) -> None:
    if getattr(module, "_transfer_to_cpu", False):
        return
    module._transfer_to_cpu = True
    import torch._dynamo

    torch._dynamo.config.disable = True
    _torch_cuda_on_cpu()
    _megatron_rng_on_cpu()
    _local_attention_takes_verl_mask()
    CudaOnCPU().__enter__()  # on this thread for the rest of the process, as transfer_to_npu's patches are


_TE_NAMES = ((".input_layernorm.weight", ".self_attention.linear_qkv.layer_norm_weight"),
             (".pre_mlp_layernorm.weight", ".mlp.linear_fc1.layer_norm_weight"))


@wrapt.when_imported("mbridge.core.llm_bridge")
def _on_mbridge(module: types.ModuleType) -> None:
    if getattr(module, "_transfer_to_cpu", False):
        return
    module._transfer_to_cpu = True
    block_spec = module.get_gpt_decoder_block_spec

    @functools.wraps(block_spec)
    def local_block_spec(config: Any, use_transformer_engine: bool, *args: Any, **kwargs: Any) -> Any:
        return block_spec(config, False, *args, **kwargs)

    module.get_gpt_decoder_block_spec = local_block_spec

    bridge_cls = module.LLMBridge
    build = bridge_cls._build_base_config

    @functools.wraps(build)
    def with_rope_theta(self: Any, *args: Any, **kwargs: Any) -> Any:
        params = getattr(self.hf_config, "rope_parameters", None) or {}
        if getattr(self.hf_config, "rope_theta", None) is None and "rope_theta" in params:
            self.hf_config.rope_theta = params["rope_theta"]
        return build(self, *args, **kwargs)

    bridge_cls._build_base_config = with_rope_theta

    to_hf = bridge_cls._weight_name_mapping_mcore_to_hf

    @functools.wraps(to_hf)
    def or_te_name(self: Any, name: str) -> list[str]:
        try:
            return to_hf(self, name)
        except NotImplementedError:  # a local norm where TE fuses it (a MoE layer's pre-MLP norm is its own)
            for local, te in _TE_NAMES:
                if name.endswith(local):
                    return to_hf(self, name[: -len(local)] + te)
            raise

    bridge_cls._weight_name_mapping_mcore_to_hf = or_te_name
