"""The numeric checks: for each patched target whose fix changes numbers, how to build it small, what to feed it and
what the intended maths (float64, on the CPU) gives.

A check is found for a record by the record's target (``covers``), not by its id, so a record declared later for
the same target (e.g. a newer vLLM-Ascend shape) is checked the same way; a record whose code is not in the
vLLM-Ascend at hand is refused by the engine and reported "not run". ``build`` is called twice per record: before
the record is applied (the released code) and after (the fix); what it returns are plain callables that keep the
code they were built with (layers bind ``forward_oot`` at construction, as vLLM's CustomOp does), so both can
run side by side in one compiled graph.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from verl_ascend_ext.patching.record import PatchRecord, split_target
from verl_ascend_ext.patching.replacement import MARKER
from verl_ascend_ext.tooling.selftest.stacks import HarnessError, ModuleSpec, NotRunError

Tensor = torch.Tensor
DOUBLE = "verl_ascend_ext.tooling.selftest.npu_test_double"


@dataclass
class Case:
    """One input set of a check and its expected numbers."""

    name: str
    inputs: tuple[Tensor, ...]  # on the device; the static buffers of a captured graph
    replay_inputs: tuple[Tensor, ...]  # same shapes, other values: copied in before a graph replay
    reference: Callable[[Sequence[Tensor]], list[Tensor]]  # intended maths, float64 on the CPU, from CPU inputs
    dtype: torch.dtype  # the dtype the case computes in (tolerance)
    bites: bool  # the released code is expected to give other numbers
    bug: Callable[[Sequence[Tensor]], list[Tensor]] | None = None  # the released maths, when sub-tolerance
    expected_errors: tuple[type[BaseException], ...] = ()  # exceptions that ARE the released code's bug
    calls: dict[str, Callable[..., Any]] = field(default_factory=dict)  # variant ("released"/"fixed") -> callable
    runs: dict[str, str] = field(default_factory=dict)  # variant -> what code the built object runs


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _rms64(s: Tensor, w: Tensor, eps: float) -> Tensor:
    s = s.double()
    return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def _runs(function: Any, record: PatchRecord) -> str:
    """Which code a bound callable runs: our replacement for ``record`` or another function (named)."""
    function = getattr(function, "__func__", function)
    if getattr(function, MARKER, None) == record.id:
        return f"the fix ({record.id})"
    code = getattr(function, "__code__", None)
    where = f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""
    return f"{getattr(function, '__qualname__', function)}{where}"


class Check:
    """Base: a check covers records by target; subclasses say how to build and judge."""

    target_module: str = ""
    target_suffix: str = ""  # the end of the qualname ("" matches the exact qualname only)
    title: str = ""
    traced: bool = True

    def covers(self, record: PatchRecord) -> bool:
        module, qualname = split_target(record.target)
        return module == self.target_module and qualname.endswith(self.target_suffix)

    def spec(self, stack: Any, record: PatchRecord) -> ModuleSpec:
        raise NotImplementedError

    def cases(self, stack: Any, record: PatchRecord) -> list[Case]:
        raise NotImplementedError

    def build(self, stack: Any, record: PatchRecord, variant: str, cases: list[Case]) -> None:
        raise NotImplementedError


# ------------------------------------------------------------------------------------------ RMSNorm
class RMSNormCheck(Check):
    """AscendRMSNorm built as vLLM builds it (``RMSNorm(...)`` -> the out-of-tree class, ``_forward_method`` bound at
    construction, inside vLLM's config context), called through vLLM's ``CustomOp.forward``: with and without a
    residual, with and without a (loaded) bias. Intended maths: the residual sum rounded to the activation dtype,
    then RMS-normalised, then the bias added; the released fused op normalises the unrounded sum."""

    target_module = "vllm_ascend.ops.layernorm"
    target_suffix = "AscendRMSNorm.forward_oot"
    title = "RMSNorm: add, round, then normalise (bias kept)"
    TOKENS, HIDDEN, EPS = 32, 512, 1e-6

    def spec(self, stack: Any, record: PatchRecord) -> ModuleSpec:
        return ModuleSpec(
            module=self.target_module,
            classes={"AscendRMSNorm": ["__init__", "_bias_weight_loader", "forward_oot"]},
            bases={"AscendRMSNorm": "RMSNorm"},
            prelude=f"""
                import torch
                from torch import nn
                from vllm.config import get_current_vllm_config
                from vllm.model_executor.layers.layernorm import RMSNorm
                from {DOUBLE} import enable_custom_op, get_weight_prefetch_method
            """)

    def _params(self, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        g = _gen(1)
        weight = (1 + 0.1 * torch.randn(self.HIDDEN, generator=g)).to(dtype)
        bias = (0.5 * torch.randn(self.HIDDEN, generator=g)).to(dtype)
        return weight, bias

    def cases(self, stack: Any, record: PatchRecord) -> list[Case]:
        dtype, dev = torch.bfloat16, stack.device.torch_device
        weight, bias = self._params(dtype)
        eps = self.EPS

        def tensors(seed: int, n: int) -> tuple[Tensor, ...]:
            g = _gen(seed)
            return tuple((3 * torch.randn(self.TOKENS, self.HIDDEN, generator=g)).to(dtype).to(dev) for _ in range(n))

        out = []
        for with_bias in (False, True):
            b = bias if with_bias else None

            def add(y: Tensor, b: Tensor | None = b) -> Tensor:
                return y if b is None else y + b.double()

            def with_residual(t: Sequence[Tensor], add: Callable[[Tensor], Tensor] = add) -> list[Tensor]:
                x, r = t
                s = (x + r).double()  # bf16 + bf16 is the exact sum rounded to bf16: what training normalises
                return [add(_rms64(s, weight, eps)), s]

            def fused(t: Sequence[Tensor], add: Callable[[Tensor], Tensor] = add) -> list[Tensor]:
                x, r = t
                total = x.double() + r.double()
                return [add(_rms64(total, weight, eps)), (x + r).double()]

            def plain(t: Sequence[Tensor], add: Callable[[Tensor], Tensor] = add) -> list[Tensor]:
                return [add(_rms64(t[0], weight, eps))]

            suffix = "+bias" if with_bias else ""
            out.append(Case(f"residual{suffix}", tensors(10, 2), tensors(11, 2), with_residual, dtype, bites=True,
                            bug=fused))
            out.append(Case(f"no residual{suffix}", tensors(12, 1), tensors(13, 1), plain, dtype, bites=False))
        return out

    def build(self, stack: Any, record: PatchRecord, variant: str, cases: list[Case]) -> None:
        if stack.vllm_error:
            raise HarnessError(f"vLLM is not importable here ({stack.vllm_error}); the layer is built as vLLM "
                               "builds it, through its CustomOp: install the vllm the recipe pins")
        module = stack.module(self.spec(stack, record))
        weight, bias = self._params(torch.bfloat16)
        layers = {False: self._layer(stack, module, weight, None), True: self._layer(stack, module, weight, bias)}
        for case in cases:
            layer = layers[case.name.endswith("+bias")]
            case.calls[variant] = layer  # called as vLLM calls it: Module.__call__ -> CustomOp.forward
            case.runs[variant] = f"{type(layer).__name__}._forward_method = {_runs(layer._forward_method, record)}"

    def _layer(self, stack: Any, module: Any, weight: Tensor, bias: Tensor | None) -> Any:
        from vllm.model_executor.custom_op import op_registry_oot
        from vllm.model_executor.layers.layernorm import RMSNorm

        dev = stack.device.torch_device
        with stack.vllm_context():
            if stack.double and op_registry_oot.get("RMSNorm") is not module.AscendRMSNorm:
                if "RMSNorm" in op_registry_oot:
                    raise HarnessError(f"vLLM's RMSNorm is already replaced by {op_registry_oot['RMSNorm']} in "
                                       "this process")
                from vllm.model_executor.custom_op import CustomOp

                CustomOp.register_oot(_decorated_op_cls=module.AscendRMSNorm, name="RMSNorm")  # as vLLM-Ascend does
            layer = RMSNorm(self.HIDDEN, eps=self.EPS, dtype=torch.bfloat16)
        layer = layer.to(dev)
        with torch.no_grad():
            layer.weight.data.copy_(weight.to(dev))
        if bias is not None:  # vLLM-Ascend creates the bias with anti-outlier quantisation; its loader loads it
            layer.bias = torch.nn.Parameter(torch.zeros(self.HIDDEN, dtype=torch.bfloat16, device=dev),
                                            requires_grad=False)
            loader = getattr(layer, "_bias_weight_loader", None)
            if loader is None:
                raise HarnessError(f"{type(layer).__name__} has no _bias_weight_loader to load a norm bias with")
            loader(layer.bias, bias.to(dev))
        bound = getattr(layer._forward_method, "__func__", None)
        if bound is not getattr(type(layer), "forward_oot", None):
            if not stack.double:
                raise HarnessError(f"vLLM dispatched {type(layer).__name__} to {bound and bound.__name__}, not "
                                   "forward_oot, with the recipe's config on this node")
            # vLLM's dispatch_forward returns forward_oot only on an out-of-tree platform (vLLM-Ascend's); here it
            # chose the CPU/CUDA method: bind what it binds on an NPU node.
            layer._forward_method = layer.forward_oot
        return layer


# ------------------------------------------------------------------------------------------ indexer scaling
N_HEAD, HEAD_DIM, TOKENS = 64, 128, 16


def _indexer_reference(t: Sequence[Tensor]) -> list[Tensor]:
    return [t[0].double() * (N_HEAD**-0.5) * (HEAD_DIM**-0.5)]


def _indexer_unscaled(t: Sequence[Tensor]) -> list[Tensor]:
    return [t[0].double()]


def _indexer_inputs(dev: torch.device, seed: int) -> tuple[Tensor, ...]:
    return (torch.randn(TOKENS, N_HEAD, generator=_gen(seed)).to(torch.bfloat16).to(dev),)


def _indexer_constants(dev: torch.device) -> dict[str, Any]:
    """What the kernel call also receives (the double and the probe read only the weights)."""
    g = _gen(20)
    return {
        "q_li": torch.randn(TOKENS, N_HEAD, HEAD_DIM, generator=g).to(torch.bfloat16).to(dev),
        "kv_cache": (None, None, torch.randn(4, 16, 1, HEAD_DIM, generator=g).to(torch.bfloat16).to(dev)),
        "meta": SimpleNamespace(block_table=torch.zeros(1, 4, dtype=torch.int32, device=dev)),
        "lens": torch.tensor([TOKENS], dtype=torch.int32, device=dev),
    }


class DeviceOperatorIndexerCheck(Check):
    """``<Adaptor>.indexer_select_post_process`` called as AscendSFAImpl calls it, on every adaptor the record covers
    (the double) or on the device operator of the node (NPU). Observed: the weights the lightning-indexer kernel
    is handed. Intended maths: ``weights * n_head^-0.5 * head_dim^-0.5``; the released code hands them unscaled."""

    target_module = "vllm_ascend.device.device_op"
    target_suffix = ".indexer_select_post_process"
    title = "indexer weights scaled once before the kernel"

    def spec(self, stack: Any, record: PatchRecord) -> ModuleSpec:
        return ModuleSpec(
            module=self.target_module,
            classes={"BaseDeviceAdaptor": ["indexer_select_post_process"],
                     "A5DeviceAdaptor": ["indexer_select_post_process"], "Ascend310PDeviceAdaptor": []},
            prelude="""
                from typing import Any
                import torch
                import torch_npu
            """)

    def adaptors(self, stack: Any, record: PatchRecord) -> list[type]:
        module = stack.module(self.spec(stack, record))
        owner = record.qualname.split(".")[0]
        name = record.qualname.split(".")[-1]
        classes = [c for c in vars(module).values()
                   if isinstance(c, type) and c.__module__ == module.__name__ and c.__name__.endswith("DeviceAdaptor")]
        covered = [c for c in classes if next((k.__name__ for k in c.__mro__ if name in vars(k)), None) == owner]
        if stack.double:
            return covered
        node = getattr(module, "DeviceOperator", None)
        if node not in covered:
            raise NotRunError(f"this node's device operator is {getattr(node, '__name__', node)}; {record.id} "
                              f"patches {', '.join(c.__name__ for c in covered)}")
        return [node]

    def cases(self, stack: Any, record: PatchRecord) -> list[Case]:
        dev = stack.device.torch_device
        return [Case(adaptor.__name__, _indexer_inputs(dev, 30), _indexer_inputs(dev, 31), _indexer_reference,
                     torch.bfloat16, bites=True, bug=_indexer_unscaled)
                for adaptor in self.adaptors(stack, record)]

    def build(self, stack: Any, record: PatchRecord, variant: str, cases: list[Case]) -> None:
        adaptors = {a.__name__: a for a in self.adaptors(stack, record)}
        dev = stack.device.torch_device
        const = _indexer_constants(dev)
        sfa_impl = SimpleNamespace(n_head=N_HEAD, head_dim=HEAD_DIM, use_torch_npu_lightning_indexer=True)
        for case in cases:
            function = adaptors[case.name].indexer_select_post_process  # the function in place now

            def call(weights: Tensor, function: Any = function) -> Tensor:
                return function(sfa_impl, const["q_li"], None, None, weights, const["kv_cache"], const["meta"],
                                const["lens"], const["lens"], False, True)

            case.calls[variant] = call
            case.runs[variant] = _runs(function, record)


class CPIndexerCheck(Check):
    """``AscendSFACPImpl._execute_indexer_select`` on the decode and prefill row slices of the weights, as the
    context-parallel caller calls it; same observation and maths as the device-operator check."""

    target_module = "vllm_ascend.attention.context_parallel.sfa_cp"
    target_suffix = "AscendSFACPImpl._execute_indexer_select"
    title = "context-parallel indexer weights scaled once"

    def spec(self, stack: Any, record: PatchRecord) -> ModuleSpec:
        return ModuleSpec(module=self.target_module, classes={"AscendSFACPImpl": ["_execute_indexer_select"]},
                          prelude="""
                              from typing import Any
                              import torch
                              import torch_npu
                          """)

    def cases(self, stack: Any, record: PatchRecord) -> list[Case]:
        dev = stack.device.torch_device
        return [Case("decode+prefill slices", _indexer_inputs(dev, 40), _indexer_inputs(dev, 41), _indexer_reference,
                     torch.bfloat16, bites=True, bug=_indexer_unscaled)]

    def build(self, stack: Any, record: PatchRecord, variant: str, cases: list[Case]) -> None:
        module = stack.module(self.spec(stack, record))
        cls = module.AscendSFACPImpl
        impl = object.__new__(cls)  # built small: only what _execute_indexer_select reads
        impl.n_head, impl.head_dim, impl.use_torch_npu_lightning_indexer = N_HEAD, HEAD_DIM, True
        method = impl._execute_indexer_select  # bound now: the code in place now
        const = _indexer_constants(stack.device.torch_device)
        key, table, split = const["kv_cache"][2], const["meta"].block_table, TOKENS // 4

        def call(weights: Tensor) -> Tensor:
            q = const["q_li"]
            decode = method(q[:split], key, weights[:split], const["lens"], const["lens"], table)
            prefill = method(q=q[split:], key=key, weights=weights[split:], actual_seq_lengths_query=const["lens"],
                             actual_seq_lengths_key=const["lens"], block_table=table)
            return torch.cat([decode, prefill])

        for case in cases:
            case.calls[variant] = call
            case.runs[variant] = _runs(method, record)


# ------------------------------------------------------------------------------------------ kv_b_proj
class KvBProjCheck(Check):
    """``AscendSFAImpl.process_weights_after_loading`` on a small layer, then an RL weight update (new kv_b_proj
    weights loaded into the same parameter, the method called again). Intended: W_UV / W_UK_T rebuilt from the new
    weights, kv_b_proj kept. The released code disposes kv_b_proj, so the update fails."""

    target_module = "vllm_ascend.attention.sfa_v1"
    target_suffix = "AscendSFAImpl.process_weights_after_loading"
    title = "kv_b_proj kept through weight loading (RL weight update)"
    traced = False
    LORA, HEADS, NOPE, V = 16, 2, 8, 8

    def spec(self, stack: Any, record: PatchRecord) -> ModuleSpec:
        return ModuleSpec(
            module=self.target_module, classes={"AscendSFAImpl": ["process_weights_after_loading"]},
            functions=(("vllm_ascend.utils", "dispose_tensor"), ("vllm_ascend.utils", "dispose_layer")),
            prelude=f"""
                from typing import Any
                import torch
                import torch_npu
                from {DOUBLE} import ACL_FORMAT_FRACTAL_ND, maybe_trans_nz
                try:
                    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
                except ImportError:  # vLLM absent: the class the released body checks kv_b_proj's method against
                    class UnquantizedLinearMethod:
                        pass
            """)

    def _weights(self, seed: int, dev: torch.device) -> Tensor:
        shape = (self.HEADS * (self.NOPE + self.V), self.LORA)
        return torch.randn(*shape, generator=_gen(seed)).to(torch.bfloat16).to(dev)

    def cases(self, stack: Any, record: PatchRecord) -> list[Case]:
        dev = stack.device.torch_device
        lora, heads, nope = self.LORA, self.HEADS, self.NOPE

        def reference(t: Sequence[Tensor]) -> list[Tensor]:
            new = t[1].double()
            kv = new.T.reshape(lora, heads, -1)
            return [kv[..., nope:].transpose(0, 1), kv[..., :nope].permute(1, 2, 0), new]

        inputs = (self._weights(50, dev), self._weights(51, dev))
        return [Case("load, then weight update", inputs, inputs, reference, torch.bfloat16, bites=True,
                     expected_errors=(AssertionError, RuntimeError))]

    def build(self, stack: Any, record: PatchRecord, variant: str, cases: list[Case]) -> None:
        module = stack.module(self.spec(stack, record))
        cls = module.AscendSFAImpl
        method = cls.process_weights_after_loading  # the function in place now
        linear_method = module.UnquantizedLinearMethod  # the class the method checks kv_b_proj's method against
        check = self

        class KvBProj(torch.nn.Module):
            def __init__(self, weight: Tensor) -> None:
                super().__init__()
                self.weight = torch.nn.Parameter(weight.clone(), requires_grad=False)
                self.quant_method = linear_method()

        def call(first: Tensor, update: Tensor) -> tuple[Tensor, ...]:
            impl = object.__new__(cls)  # built small: only what the method reads
            impl.kv_lora_rank, impl.local_num_heads = check.LORA, check.HEADS
            impl.qk_nope_head_dim, impl.v_head_dim = check.NOPE, check.V
            for flag in ("enable_dsa_cp", "enable_sfa_prolog_v3", "enable_mlapo", "enable_sparse_li_c8", "has_indexer"):
                setattr(impl, flag, False)
            impl.kv_b_proj = KvBProj(first)
            method(impl, torch.bfloat16)
            with torch.no_grad():
                impl.kv_b_proj.weight.data.copy_(update)  # what the weight loader of an RL update does
            method(impl, torch.bfloat16)
            return impl.W_UV, impl.W_UK_T, impl.kv_b_proj.weight

        for case in cases:
            case.calls[variant] = call
            case.runs[variant] = _runs(method, record)


CHECKS: tuple[Check, ...] = (RMSNormCheck(), DeviceOperatorIndexerCheck(), CPIndexerCheck(), KvBProjCheck())


def check_for(record: PatchRecord) -> Check | None:
    return next((c for c in CHECKS if c.covers(record)), None)
