"""Scenario: the GLM-5.2 vLLM-Ascend replacement functions against CPU references (run in a fresh interpreter).

Real: the method bodies of vLLM-Ascend 0.23.0 (``AscendRMSNorm.forward_oot``, the device adaptors'
``indexer_select_post_process``, ``AscendSFACPImpl._execute_indexer_select``,
``AscendSFAImpl.process_weights_after_loading``, ``dispose_layer``/``dispose_tensor``,
``CaMemAllocator.sleep``), read from the released wheel's files and executed here; our patch code from
verl_ascend_ext.features.glm52, installed behind the replacement functions the engine builds (``replacement.build``);
torch on CPU. (Applying through the engine itself, and under torch.compile: glm52_ascend_compiled.py.)
Simulated: only NPU calls (verl_ascend_ext/tooling/selftest/npu_test_double.py) and the few module globals those
bodies name (stubs below). ``self`` is a small object with the attributes the body reads.
Usage: glm52_ascend_maths.py <vllm-ascend source tree>; prints one JSON object.
"""

from __future__ import annotations

import gc
import json
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import torch

from verl_ascend_ext.tooling.selftest import npu_test_double as npu

torch_npu = npu.install()  # before the replacement modules: they import torch_npu, as on an NPU node

from verl_ascend_ext.features.glm52.ascend.patch_code import camem as ascend_camem  # noqa: E402
from verl_ascend_ext.features.glm52.ascend.patch_code import rmsnorm as ascend_rmsnorm  # noqa: E402
from verl_ascend_ext.features.glm52.ascend.patch_code import sfa as ascend_sfa  # noqa: E402
from verl_ascend_ext.patching.replacement import build  # noqa: E402
from verl_ascend_ext.patching.source import definitions  # noqa: E402

TREE = Path(sys.argv[1])
out: dict[str, Any] = {}


def real(rel: str, qualname: str, namespace: dict) -> Any:
    """The released definition of ``qualname`` in ``rel``, executed in ``namespace`` (raw class attribute)."""
    text = definitions(TREE / rel)[qualname][2]
    if "." not in qualname:
        exec(text, namespace)
        return namespace[qualname]
    exec("class _Holder:\n" + textwrap.indent(text, "    "), namespace)
    return vars(namespace.pop("_Holder"))[qualname.rsplit(".", 1)[1]]


def replaced(live: Any, impl: Any) -> Any:
    """What the engine installs in place of ``live`` (a function or staticmethod) for patch code ``impl``."""
    return build(impl, live, "test", (), traced=True)  # the GLM-5.2 Ascend records run traced


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


# ---------------------------------------------------------------- RMSNorm
custom_op = {"on": False}
prefetch = types.SimpleNamespace(maybe_prefetch_mlp_weight_postprocess=lambda x: None)
ns = {"torch": torch, "enable_custom_op": lambda: custom_op["on"], "get_weight_prefetch_method": lambda: prefetch}
forward_oot = real("vllm_ascend/ops/layernorm.py", "AscendRMSNorm.forward_oot", ns)


class Norm:  # the attributes AscendRMSNorm.__init__ sets
    forward_oot = forward_oot

    def __init__(self, hidden: int, bias: torch.Tensor | None) -> None:
        g = torch.Generator().manual_seed(1)
        self.weight = (1 + 0.1 * torch.randn(hidden, generator=g)).to(torch.bfloat16)
        self.bias, self.bias_loaded, self.variance_epsilon = bias, bias is not None, 1e-6


class PatchedNorm(Norm):
    forward_oot = replaced(forward_oot, ascend_rmsnorm.add_then_rms_norm)


g = torch.Generator().manual_seed(0)
x = (3 * torch.randn(64, 256, generator=g)).to(torch.bfloat16)
res = (3 * torch.randn(64, 256, generator=g)).to(torch.bfloat16)
bias = (0.5 * torch.randn(256, generator=g)).to(torch.bfloat16)
rms = {}
for with_bias in (False, True):
    b = bias if with_bias else None
    original, patched = Norm(256, b), PatchedNorm(256, b)
    rounded_sum = x + res  # what training normalises: the sum in bf16
    reference = npu.rms_norm_reference(rounded_sum, original.weight, 1e-6).to(torch.bfloat16)
    if with_bias:
        reference = reference + bias
    case = {}
    for op in ("custom", "torch_npu"):
        custom_op["on"] = op == "custom"
        y_orig, r_orig = original.forward_oot(x.clone(), res.clone())
        y_ours, r_ours = patched.forward_oot(x.clone(), res.clone())
        case[op] = {
            "ours_equals_reference": same(y_ours, reference),
            "ours_residual_is_rounded_sum": same(r_ours, rounded_sum),
            "fused_equals_reference": same(y_orig, reference),
            "fused_residual_is_rounded_sum": same(r_orig, rounded_sum),
            "max_abs_fused_minus_reference": float((y_orig.float() - reference.float()).abs().max()),
        }
    if with_bias:  # the in-tree copy's replacement (no bias) differs from ours by exactly the bias
        no_bias = npu.rms_norm_reference(rounded_sum, original.weight, 1e-6).to(torch.bfloat16)
        y_ours, _ = patched.forward_oot(x.clone(), res.clone())
        case["ours_minus_bias_free_is_bias"] = same(y_ours, no_bias + bias)
        case["bias_dropped_would_differ"] = not same(y_ours, no_bias)
    case["no_residual_unchanged"] = same(patched.forward_oot(x.clone()), Norm(256, b).forward_oot(x.clone()))
    rms["bias" if with_bias else "no_bias"] = case
out["rmsnorm"] = rms

# ---------------------------------------------------------------- indexer scaling
ns = {"torch": torch, "torch_npu": torch_npu, "Any": Any}
base_op = real("vllm_ascend/device/device_op.py", "BaseDeviceAdaptor.indexer_select_post_process", ns)
a5_op = real("vllm_ascend/device/device_op.py", "A5DeviceAdaptor.indexer_select_post_process", ns)
BaseDeviceAdaptor = type("BaseDeviceAdaptor", (), {"indexer_select_post_process": base_op})
A5DeviceAdaptor = type("A5DeviceAdaptor", (BaseDeviceAdaptor,), {"indexer_select_post_process": a5_op})
Ascend310PDeviceAdaptor = type("Ascend310PDeviceAdaptor", (BaseDeviceAdaptor,), {})
for cls in (BaseDeviceAdaptor, A5DeviceAdaptor):  # what engine.apply does with vars(cls)[name]
    cls.indexer_select_post_process = replaced(vars(cls)["indexer_select_post_process"],
                                           ascend_sfa.scale_device_operator_weights)

sfa = types.SimpleNamespace(n_head=64, head_dim=128, use_torch_npu_lightning_indexer=True)
weights = torch.randn(16, 64, generator=g).to(torch.bfloat16)
upstream = weights * (sfa.n_head**-0.5) * (sfa.head_dim**-0.5)  # the line of patches/.../0003 (vLLM-Ascend's fix)
q_li, kv_cache, meta = torch.zeros(16, 64, 128), (None, None, torch.zeros(1)), types.SimpleNamespace(block_table=None)
rest = (kv_cache, meta, torch.tensor([16]), torch.tensor([16]), False, True)


def kernel_weights(call) -> torch.Tensor:
    npu.INDEXER_WEIGHTS.clear()
    call()
    assert len(npu.INDEXER_WEIGHTS) == 1
    return npu.INDEXER_WEIGHTS[0]


indexer = {}
for name, cls in (("base", BaseDeviceAdaptor), ("a5", A5DeviceAdaptor), ("310p", Ascend310PDeviceAdaptor)):
    got = kernel_weights(lambda cls=cls: cls.indexer_select_post_process(sfa, q_li, None, None, weights, *rest))
    indexer[name] = same(got, upstream)
got = kernel_weights(lambda: BaseDeviceAdaptor().indexer_select_post_process(
    sfa_impl=sfa, q_li=q_li, q_li_scale=None, q_li_shape_ori=None, weights=weights, kv_cache=kv_cache,
    attn_metadata=meta, actual_seq_lengths_query=rest[2], actual_seq_lengths_key=rest[3],
    enable_sparse_li_c8=False, use_torch_npu_lightning_indexer=True))
indexer["keywords_via_instance"] = same(got, upstream)
# context parallel: the released _execute_indexer_select on row slices, as AscendSFACPImpl calls it
cp_exec = real("vllm_ascend/attention/context_parallel/sfa_cp.py", "AscendSFACPImpl._execute_indexer_select",
               {"torch": torch, "torch_npu": torch_npu})


class CPImpl:
    n_head, head_dim, use_torch_npu_lightning_indexer = 64, 128, True
    _execute_indexer_select = replaced(cp_exec, ascend_sfa.scale_cp_indexer_weights)


cp = CPImpl()
npu.INDEXER_WEIGHTS.clear()
cp._execute_indexer_select(q_li[:5], None, weights[:5], None, None, None)  # decode slice, positional
cp._execute_indexer_select(q=q_li[5:], key=None, weights=weights[5:], actual_seq_lengths_query=None,
                           actual_seq_lengths_key=None, block_table=None)  # prefill slice, keywords
indexer["cp_slices_equal_upstream"] = same(torch.cat(npu.INDEXER_WEIGHTS), upstream)


out["indexer"] = indexer

# ---------------------------------------------------------------- kv_b_proj kept alive
utils_ns: dict = {"torch": torch, "Any": Any}
real("vllm_ascend/utils.py", "dispose_tensor", utils_ns)
dispose_layer = real("vllm_ascend/utils.py", "dispose_layer", utils_ns)


class UnquantizedLinearMethod:
    pass


class Linear(torch.nn.Module):
    def __init__(self, out_features: int, in_features: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(out_features, in_features, generator=g), requires_grad=False)
        self.quant_method = UnquantizedLinearMethod()


sfa_ns = {"torch": torch, "torch_npu": torch_npu, "ACL_FORMAT_FRACTAL_ND": 2, "dispose_layer": dispose_layer,
          "UnquantizedLinearMethod": UnquantizedLinearMethod, "maybe_trans_nz": lambda t: t}
process = real("vllm_ascend/attention/sfa_v1.py", "AscendSFAImpl.process_weights_after_loading", sfa_ns)


def sfa_layer(cls: type) -> Any:
    layer = cls()
    layer.kv_lora_rank, layer.local_num_heads, layer.qk_nope_head_dim, layer.v_head_dim = 8, 2, 4, 4
    layer.kv_b_proj = Linear(2 * (4 + 4), 8)
    for flag in ("enable_dsa_cp", "enable_sfa_prolog_v3", "enable_mlapo", "enable_sparse_li_c8", "has_indexer"):
        setattr(layer, flag, False)
    return layer


class SFA:
    process_weights_after_loading = process


class PatchedSFA:
    process_weights_after_loading = replaced(process, ascend_sfa.keep_kv_b_proj)


def update_weights(layer: Any) -> str:
    """An RL weight update: load new kv_b_proj weights, then vLLM calls process_weights_after_loading again."""
    try:
        new = torch.randn(16, 8, generator=g)
        layer.kv_b_proj.weight.data.copy_(new)
        layer.process_weights_after_loading(torch.bfloat16)
    except (AssertionError, RuntimeError) as err:
        return f"{type(err).__name__}: {str(err)[:80]}"
    expected = new.T.view(8, 2, 8).split([4, 4], dim=-1)[1].transpose(0, 1)
    return "ok" if torch.equal(layer.W_UV, expected) else "W_UV stale"


kv = {}
for name, cls in (("original", SFA), ("patched", PatchedSFA)):
    layer = sfa_layer(cls)
    weight_object = layer.kv_b_proj.weight
    before = weight_object.detach().clone()
    layer.process_weights_after_loading(torch.bfloat16)
    kv[name] = {"shape_after_load": list(layer.kv_b_proj.weight.shape),
                "same_parameter_object": layer.kv_b_proj.weight is weight_object,
                "values_kept": layer.kv_b_proj.weight.shape == before.shape
                and torch.equal(layer.kv_b_proj.weight, before),
                "weight_update": update_weights(layer)}


class OtherLayers:  # the original also disposes other layers (fused_qkv_a_proj, q_proj on KV consumers)
    def dispose_all(self):
        dispose_layer(self.kv_b_proj)
        dispose_layer(self.q_proj)

    dispose_all = replaced(dispose_all, ascend_sfa.keep_kv_b_proj)


other = OtherLayers()
other.kv_b_proj, other.q_proj = Linear(16, 8), Linear(16, 8)
other.dispose_all()
kv["other_layers"] = {"kv_b_proj": list(other.kv_b_proj.weight.shape), "q_proj": list(other.q_proj.weight.shape)}
out["kv_b_proj"] = kv

# ---------------------------------------------------------------- CaMem sleep
unmapped: list = []


def unmap_and_release(handle: Any) -> None:
    npu.EVENTS.append("unmap")
    unmapped.append(handle)


camem_torch = types.SimpleNamespace(  # pinned host memory needs an accelerator; the rest is real torch
    empty=lambda *a, pin_memory=False, **k: torch.empty(*a, **k), uint8=torch.uint8, npu=torch.npu)
camem_ns = {"torch": camem_torch, "gc": gc, "logger": types.SimpleNamespace(info=lambda *a: None),
            "memcpy": lambda *a: npu.EVENTS.append("memcpy"), "unmap_and_release": unmap_and_release}
sleep = real("vllm_ascend/device_allocator/camem.py", "CaMemAllocator.sleep", camem_ns)


def allocator(wrap: bool) -> Any:
    cls = type("CaMemAllocator", (), {"default_tag": "default", "sleep_persistent_tag": "persistent",
                                      "sleep": replaced(sleep, ascend_camem.synchronize_before_sleep)
                                      if wrap else sleep})
    camem_ns["CaMemAllocator"] = cls
    alloc = cls()
    alloc.pointer_to_data = {
        1: types.SimpleNamespace(tag="weights", handle=(1, 64)),
        2: types.SimpleNamespace(tag="kv_cache", handle=(2, 64)),
        3: types.SimpleNamespace(tag="persistent", handle=(3, 64)),
    }
    return alloc


camem = {}
for name, wrap in (("original", False), ("patched", True)):
    npu.EVENTS.clear()
    allocator(wrap).sleep(offload_tags=("weights",))
    camem[name] = list(npu.EVENTS)
out["camem"] = camem
print(json.dumps(out))
