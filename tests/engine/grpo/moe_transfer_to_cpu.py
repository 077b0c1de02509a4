"""TEST-ONLY: what ``transfer_to_cpu`` needs beside it for a MoE with expert parallel on the CPU (never shipped).

Loaded after ``transfer_to_cpu`` through verl's ``VERL_USE_EXTERNAL_MODULES`` (post-import hooks: nothing happens
until megatron-core or mbridge is imported). megatron-core 0.16.1 and mbridge 0.15.1 without TransformerEngine, as
the dense job runs them; the MoE adds (paths in the installed packages):

- **the alltoall token dispatcher's device-to-host copy** (``transformer/moe/token_dispatcher.py:866-899``): the
  split sizes are copied on a side stream (``torch.cuda.Stream()``, :445; the CPU's ``torch.cpu.Stream`` here through
  ``transfer_to_cpu``) and waited for with ``self.cuda_dtoh_stream.record_event().synchronize()`` (:895, :899);
  ``torch.cpu.Stream.record_event`` returns None (``torch/cpu/__init__.py:147``). The stand-in returns a
  ``torch.cpu.Event`` (whose ``synchronize`` is a no-op: CPU work is done when the call returns).
- **the split sizes gloo takes**: ``maybe_move_tensor_to_cpu(..., as_numpy=True)`` (``moe_utils.py:1080-1100``)
  converts only CUDA tensors (``tensor.is_cuda``, :1093); on the CPU the splits stay tensors and
  ``torch.distributed.all_to_all_single`` (``tensor_parallel/mappings.py`` ``_AllToAll``) rejects tensor split
  sizes on gloo. The stand-in converts CPU tensors too when ``as_numpy`` is asked (in ``moe_utils`` and in
  ``token_dispatcher``, which imported the function by name, :31). gloo has ``all_to_all_single``.
- **the router's gating GEMM without TransformerEngine**: ``RouterGatingLinearFunction.forward`` / ``backward``
  (``transformer/moe/moe_utils.py:1192``, :1226) test ``te_general_gemm is not None``, a name ``moe_utils`` binds only
  when TransformerEngine imports (:22-39; megatron's own fallback value is None,
  ``extensions/transformer_engine.py:2485``): ``NameError: name 'te_general_gemm' is not defined`` at the first MoE
  forward. The stand-in binds it to None, which selects megatron's torch ``mm`` branch.
- **mbridge's expert names**: mbridge 0.15.1 maps only TransformerEngine's grouped experts
  (``models/qwen2moe.py:52-58``: ``mlp.experts.linear_fc1.weight<id>``, which Qwen3-MoE inherits); its
  expert-parallel renumbering (``core/bridge.py:505-520``) and export gather (:363-405) match only that form.
  Megatron's local spec without ``moe_grouped_gemm`` (no ``grouped_gemm`` package: ``GroupedMLP`` asserts,
  ``transformer/moe/experts.py:81``) builds ``SequentialMLP``: ``mlp.experts.local_experts.<i>.linear_fc1.weight``,
  which mbridge refuses ("Unsupported parameter name"). The stand-in maps each local expert name to the grouped
  name in ``_weight_name_mapping_mcore_local_to_global`` (:472-522), numbered as mbridge numbers grouped experts:
  ``i + experts_per_rank * ep_rank`` when ``consider_ep`` (loading), ``i`` otherwise (the export, whose EP
  gather renumbers, :374-383). ``MOE_PROBE_EP_RENUMBER_FAULT=1`` (test switch) makes the export name every EP
  rank's experts as rank 0's (``export_weights`` renames expert ``g`` to ``g % experts_per_rank``): an export in
  which EP rank 1's experts are missing (overwritten by rank 0's under the same names), the fault the export
  check must name.

- **pinned host memory** (the recipes' ``param_offload=True``): verl's offload allocates its host copy with
  ``torch.empty(..., pin_memory=True)`` (verl ``utils/megatron_utils.py:744-749``; megatron's CPU-offload optimizer
  pins too, ``optimizer/cpu_offloading/hybrid_optimizer.py``); this CUDA build of torch raises "Found no NVIDIA
  driver on your system" for any pinned allocation without a driver. On the CPU, host memory is the only memory:
  a ``TorchFunctionMode`` (``PinnedIsHost``, entered with ``transfer_to_cpu``'s on the thread that imported
  megatron) drops ``pin_memory=True`` from factory calls and makes ``Tensor.pin_memory()`` return the tensor.

- **TransformerEngine's version when there is none** (the recipes' megatron CPU-offload optimizer,
  ``use_precision_aware_optimizer=True``): ``OptimizerConfig.__post_init__`` asks ``is_te_min_version("2.1.0")``
  (``optimizer/optimizer_config.py:383``; also ``optimizer/__init__.py:386``), which compares
  ``get_te_version()`` -- None without TransformerEngine (``utils.py:312-337``) -- with a version:
  ``TypeError: '>=' not supported between instances of 'NoneType' and 'Version'`` (``utils.py:348``). The stand-in
  answers False there when no TransformerEngine is installed (no version is at least 2.1.0), in the two modules
  that imported the function by name.

- **megatron's CPU-offload optimizer on the CPU** (``optimizer_cpu_offload=True``, ``optimizer_offload_fraction=1``:
  ``HybridDeviceOptimizer``, ``optimizer/cpu_offloading/hybrid_optimizer.py``): it offloads "GPU" parameters, the
  ones with ``param.is_cuda`` (:251-292), by giving each a host copy the CPU Adam steps
  (``cpu_copys_map_gpu_param``); a parameter that already is on the host goes to the CPU Adam as itself, with no
  entry in that map, and ``_set_sub_optimizer_grads`` fails on it (``KeyError: tensor(...)``, :101). On the CPU
  every parameter is on the host: the stand-in maps each such parameter to itself (its host copy is itself), so
  torch's fused CPU AdamW steps the parameters in place and the copy-back hook (:119-126) copies each onto itself.

Not stand-ins but the job's overrides (``+actor_rollout_ref.actor.megatron.override_transformer_config.<key>``,
which mbridge applies last, ``core/llm_bridge.py:97-98``): ``persist_layer_norm=False`` (mbridge's
``models/qwen3moe.py:24`` sets True; megatron's torch norm asserts it off, ``transformer/torch_norm.py:30``) and
``moe_grouped_gemm=False`` (:21 sets True). The allgather dispatcher is no way out: it rejects mbridge's
``variable_seq_lengths=True`` (``transformer_config.py:1827-1832``).

``FINGERPRINTS``: sha256 of each target's source (``fingerprint``, as in ``moe_vllm_cpu``); a changed target
raises at hook time naming it.
"""

from __future__ import annotations

import functools
import os
import re
import types
from typing import Any

import fingerprints
import torch
import wrapt
from torch.overrides import TorchFunctionMode

EP_FAULT = os.environ.get("MOE_PROBE_EP_RENUMBER_FAULT") == "1"
# test switch: parts left out, to show each wall (record_event, splits, te_gemm, pinned, te_version, hybrid, names)
DISABLED = set(filter(None, os.environ.get("MOE_PROBE_DISABLE", "").split(",")))
MOE = "megatron.core.transformer.moe"
HDO = "megatron.core.optimizer.cpu_offloading.hybrid_optimizer:HybridDeviceOptimizer"
FINGERPRINTS = {
    f"{MOE}.token_dispatcher:MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize": "ee32bca273aa648a",
    f"{MOE}.moe_utils:maybe_move_tensor_to_cpu": "87df839f44426041",
    "torch.cpu:Stream.record_event": "8f7754829cb5e053",
    f"{MOE}.moe_utils:RouterGatingLinearFunction.forward": "93da34ca70d6501d",
    f"{MOE}.moe_utils:RouterGatingLinearFunction.backward": "641d2ca8fc1d0871",
    "megatron.core.utils:is_te_min_version": "8c1dd68bd3d4eee7",
    f"{HDO}._get_sub_optimizer_param_groups": "7a7066f67324df59",
    f"{HDO}._set_sub_optimizer_grads": "f931bb186457bfe4",
    f"{HDO}._init_sub_optimizers": "3755e06a75d16bfe",
    "mbridge.core.bridge:Bridge._weight_name_mapping_mcore_local_to_global": "a22e49f527669898",
    "mbridge.core.bridge:Bridge.export_weights": "7780cf1e829dfcdf",
    "mbridge.models.qwen2moe:Qwen2MoEBridge._weight_name_mapping_mlp": "b564123d680e1d6d",
}
_LOCAL_EXPERT = re.compile(r"\.mlp\.experts\.local_experts\.(\d+)\.linear_fc([12])\.weight$")


def _check(prefix: str) -> None:
    changed = fingerprints.changed(FINGERPRINTS, prefix)
    if changed and os.environ.get("MOE_PROBE_IGNORE_FINGERPRINTS") != "1":
        raise RuntimeError(f"moe_transfer_to_cpu: code changed under the stand-in (target -> fingerprint now): "
                           f"{changed}; re-read the targets and update FINGERPRINTS")


class PinnedIsHost(TorchFunctionMode):
    """``pin_memory=True`` dropped, ``Tensor.pin_memory()`` the tensor itself: host memory is all the CPU has."""

    def __torch_function__(self, func: Any, types_: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.pin_memory:
            return args[0]
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        return func(*args, **kwargs)


@wrapt.when_imported("megatron.core")
def _on_megatron(module: types.ModuleType) -> None:
    if getattr(module, "_moe_transfer_to_cpu", False):
        return
    module._moe_transfer_to_cpu = True
    if "pinned" not in DISABLED:
        PinnedIsHost().__enter__()  # for the rest of the process on this thread, as transfer_to_cpu's CudaOnCPU


def _record_event(self: Any, event: Any = None) -> Any:
    return event if event is not None else torch.cpu.Event()


def _to_cpu_too(move: Any) -> Any:
    @functools.wraps(move)
    def move_cpu_too(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
        if as_numpy and torch.is_tensor(tensor) and not tensor.is_cuda:
            return tensor.numpy()
        return move(tensor, as_numpy=as_numpy, record_stream=record_stream)

    move_cpu_too._moe_transfer_to_cpu = True
    return move_cpu_too


@wrapt.when_imported(f"{MOE}.token_dispatcher")
def _on_token_dispatcher(module: types.ModuleType) -> None:
    if getattr(module, "_moe_transfer_to_cpu", False):
        return
    module._moe_transfer_to_cpu = True
    _check(MOE)
    _check("torch.cpu")
    from megatron.core.transformer.moe import moe_utils as utils

    # bound only when TransformerEngine imports (moe_utils.py:22-39)
    if not hasattr(utils, "te_general_gemm") and "te_gemm" not in DISABLED:
        utils.te_general_gemm = None
    if "record_event" not in DISABLED:
        torch.cpu.Stream.record_event = _record_event
    from megatron.core.transformer.moe import moe_utils

    if "splits" in DISABLED:
        return
    if not getattr(moe_utils.maybe_move_tensor_to_cpu, "_moe_transfer_to_cpu", False):
        moe_utils.maybe_move_tensor_to_cpu = _to_cpu_too(moe_utils.maybe_move_tensor_to_cpu)
    module.maybe_move_tensor_to_cpu = moe_utils.maybe_move_tensor_to_cpu


def grouped_name(global_name: str, ep_rank: int, experts_per_rank: int) -> str:
    """``...local_experts.<i>.linear_fc<n>.weight`` -> ``...linear_fc<n>.weight<i + experts_per_rank * ep_rank>``."""
    match = _LOCAL_EXPERT.search(global_name)
    if match is None:
        return global_name
    expert = int(match.group(1)) + experts_per_rank * ep_rank
    return global_name[: match.start()] + f".mlp.experts.linear_fc{match.group(2)}.weight{expert}"


def _te_min_version_or_false(is_te_min_version: Any) -> Any:
    @functools.wraps(is_te_min_version)
    def or_false(*args: Any, **kwargs: Any) -> bool:
        from megatron.core.utils import get_te_version

        return False if get_te_version() is None else is_te_min_version(*args, **kwargs)

    or_false._moe_transfer_to_cpu = True
    return or_false


@wrapt.when_imported("megatron.core.optimizer.optimizer_config")
def _on_optimizer_config(module: types.ModuleType) -> None:
    _check("megatron.core.utils")
    if "te_version" not in DISABLED and not getattr(module.is_te_min_version, "_moe_transfer_to_cpu", False):
        module.is_te_min_version = _te_min_version_or_false(module.is_te_min_version)


@wrapt.when_imported("megatron.core.optimizer")
def _on_optimizer(module: types.ModuleType) -> None:
    if "te_version" not in DISABLED and not getattr(module.is_te_min_version, "_moe_transfer_to_cpu", False):
        module.is_te_min_version = _te_min_version_or_false(module.is_te_min_version)


@wrapt.when_imported("megatron.core.optimizer.cpu_offloading.hybrid_optimizer")
def _on_hybrid_optimizer(module: types.ModuleType) -> None:
    if getattr(module, "_moe_transfer_to_cpu", False):
        return
    module._moe_transfer_to_cpu = True
    _check("megatron.core.optimizer.cpu_offloading")
    if "hybrid" in DISABLED:
        return
    optimizer_cls = module.HybridDeviceOptimizer
    init = optimizer_cls._init_sub_optimizers

    @functools.wraps(init)
    def host_params_are_their_own_copy(self: Any) -> None:
        init(self)
        for group in self.cpu_param_groups:
            for param in group["params"]:
                if param not in self.cpu_copys_map_gpu_param:  # already on the host (param.is_cuda False)
                    self.cpu_copys_map_gpu_param[param] = param

    optimizer_cls._init_sub_optimizers = host_params_are_their_own_copy


@wrapt.when_imported("mbridge.core.bridge")
def _on_mbridge_bridge(module: types.ModuleType) -> None:
    if getattr(module, "_moe_transfer_to_cpu", False):
        return
    module._moe_transfer_to_cpu = True
    _check("mbridge.core.bridge")
    if "names" in DISABLED:
        return
    bridge_cls = module.Bridge
    local_to_global = bridge_cls._weight_name_mapping_mcore_local_to_global

    @functools.wraps(local_to_global)
    def with_local_experts(self: Any, model: Any, consider_ep: bool = True) -> dict[str, str]:
        names = local_to_global(self, model, consider_ep=consider_ep)
        renumber = consider_ep and self.mpu.ep_size > 1
        ep_rank = self.mpu.ep_rank if renumber else 0
        per_rank = self.config.num_moe_experts // self.mpu.ep_size if renumber else 0
        return {local: grouped_name(name, ep_rank, per_rank) for local, name in names.items()}

    bridge_cls._weight_name_mapping_mcore_local_to_global = with_local_experts

    if EP_FAULT:
        export = bridge_cls.export_weights
        hf_expert = re.compile(r"(\.mlp\.experts\.)(\d+)(\.)")

        @functools.wraps(export)
        def export_as_rank0(self: Any, models: Any) -> Any:
            per_rank = self.config.num_moe_experts // self.mpu.ep_size
            for name, tensor in export(self, models):
                yield hf_expert.sub(lambda m: f"{m.group(1)}{int(m.group(2)) % per_rank}{m.group(3)}", name), tensor

        bridge_cls.export_weights = export_as_rank0


@wrapt.when_imported("mbridge.models.qwen2moe")
def _on_mbridge_qwen2moe(_module: types.ModuleType) -> None:
    _check("mbridge.models.qwen2moe")
